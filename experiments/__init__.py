"""Experiment programs, one module per study: ``python -m experiments.<name> --config=...``.

A study module declares its pages with ``forms(rows)`` (a list of ``decodelab.report.Form``):
``experiments.report`` renders a workdir's rows with the forms of the module named by the rows'
experiment (``study_forms``), or with ``decodelab.report.generic_report`` when the study has none.
(A study not yet in the page form defines ``report(rows, out_dir)`` instead: ``study_report``.)
The lookup lives here, with the programs, because the library never imports them.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any


def _study_attribute(name: str, attribute: str, package: str) -> Any:
    try:
        spec = importlib.util.find_spec(f"{package}.{name}")
    except ModuleNotFoundError:
        return None
    if spec is None:
        return None
    return getattr(importlib.import_module(f"{package}.{name}"), attribute, None)


def study_forms(name: str, package: str = "experiments") -> Callable[[list[dict]], list] | None:
    """``forms(rows)`` of module ``<package>.<name>`` if it defines one, else None. An existing
    module that fails to import raises (its error is not hidden)."""
    return _study_attribute(name, "forms", package)


def study_report(name: str, package: str = "experiments"
                 ) -> Callable[[list[dict], pathlib.Path], Any] | None:
    """``report(rows, out_dir)`` of a study not yet in the page form, else None."""
    return _study_attribute(name, "report", package)
