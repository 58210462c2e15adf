"""A study's config file (``configs/<name>.py``) loaded as a module, as the runner loads it."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def config_module(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_config", ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_row(experiment_name: str, point, metrics: dict) -> dict:
    """A row as the runner writes it for sweep ``point`` (an ``experiment.Point``), holding
    ``metrics`` and placeholder provenance: for pages rendered from known values."""
    from decodelab import experiment

    return dict(experiment=experiment_name, config_hash=point.config_hash, seed=0,
                sweep_index=point.index, overrides=point.overrides,
                config=point.config.to_dict(), metrics=metrics,
                start_time="2026-01-01T00:00:00+00:00", wall_time_s=1.0,
                provenance=dict.fromkeys(experiment.PROVENANCE_FIELDS, "x"))
