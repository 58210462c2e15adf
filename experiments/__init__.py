"""Experiment programs, one module per study: ``python -m experiments.<name> --config=...``.

A study module declares its pages with ``forms(rows)`` (a list of ``decodelab.report.Form``):
``experiments.report`` renders a workdir's rows with the forms of the module named by the rows'
experiment (``study_forms``), or with ``decodelab.report.generic_report`` when the study has none.
The lookup lives here, with the programs, because the library never imports them.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable


def study_forms(name: str, package: str = "experiments") -> Callable[[list[dict]], list] | None:
    """``forms(rows)`` of module ``<package>.<name>`` if it defines one, else None. An existing
    module that fails to import raises (its error is not hidden)."""
    try:
        spec = importlib.util.find_spec(f"{package}.{name}")
    except ModuleNotFoundError:
        return None
    if spec is None:
        return None
    return getattr(importlib.import_module(f"{package}.{name}"), "forms", None)
