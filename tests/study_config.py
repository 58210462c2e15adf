"""A study's config file (``configs/<name>.py``) loaded as a module, as the runner loads it."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def config_module(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_config", ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
