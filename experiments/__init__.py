"""Experiment programs, one module per study: ``python -m experiments.<name> --config=...``.

A study module may define ``report(rows, out_dir)``: ``experiments.report`` renders a workdir's
rows with the ``report`` of the module named by the rows' experiment (``study_report``), or with
``decodelab.report.tables.generic_report`` when the study has none. The lookup lives here, with the
programs, because the library never imports them.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any


def study_report(name: str, package: str = "experiments"
                 ) -> Callable[[list[dict], pathlib.Path], Any] | None:
    """``report(rows, out_dir)`` of module ``<package>.<name>`` if it defines one, else None. An
    existing module that fails to import raises (its error is not hidden)."""
    try:
        spec = importlib.util.find_spec(f"{package}.{name}")
    except ModuleNotFoundError:
        return None
    if spec is None:
        return None
    return getattr(importlib.import_module(f"{package}.{name}"), "report", None)
