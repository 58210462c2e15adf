"""``importorskip`` that fails in CI: the test extra installs every optional package the suite
uses, so where the environment variable ``CI`` is set a missing one is a broken install to
report, not a test to skip."""

import importlib
import os
from types import ModuleType

import pytest


def importorskip(module: str, reason: str) -> ModuleType:
    """``module``, imported; if it is missing, skip the test (``reason`` says why it needs it),
    or fail when ``CI`` is set."""
    if not os.environ.get("CI"):
        return pytest.importorskip(module, reason=reason)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is missing although CI is set ({e}); the test extra installs it "
                    f"(pip install -e '.[test]'): {reason}", pytrace=False)
