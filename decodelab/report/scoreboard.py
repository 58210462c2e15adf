"""The compression studies' (quantization, pruning) page cells and verdicts, from a row's
per-window and per-run values.

Rows hold ``metrics`` with the scoreboard of ``dl.compare`` (``kl_per_window``,
``same_top_per_window``, ...) and, per batch size B, ``reference_reps_s_b<B>`` /
``reps_s_b<B>`` (each timed run's seconds, in run order; ``measure.interleaved.timed_pair``)
and ``speedup_b<B>``. Intervals are bootstraps over windows (the scoreboard) and over timed runs
(the speed-ups); a row without those values gives the plain number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from decodelab.measure import stats
from decodelab.report.claims import verdict

Row = Mapping[str, Any]


def _m(row: Row, name: str) -> Any:
    return row["metrics"].get(name)


def window_interval(row: Row, name: str) -> stats.Interval | None:
    """The bootstrap interval over windows of the row's ``name`` (``kl_mean`` or ``same_top``),
    from its per-window values; None for a row without them."""
    per_window = _m(row, {"kl_mean": "kl_per_window", "same_top": "same_top_per_window"}[name])
    if not per_window or len(per_window) < 2:
        return None
    return stats.bootstrap(stats.mean, np.asarray(per_window, np.float64))


def cell(row: Row, name: str):
    """The table's cell of a scoreboard column: its interval over windows where the row has
    per-window values, else the plain value."""
    return window_interval(row, name) or _m(row, name)


def speedup(row: Row, B: int) -> stats.Interval | None:
    """The speed-up at batch ``B`` (median over median) with its bootstrap interval, the
    repetitions resampled in pairs (run i of the reference and of the candidate ran back to back,
    so load that drifts between runs cancels); None for a row with fewer than 2 runs kept."""
    ref, cand = _m(row, f"reference_reps_s_b{B}"), _m(row, f"reps_s_b{B}")
    if not ref or not cand or len(ref) < 2:
        return None
    return stats.bootstrap_ratio(stats.median, np.asarray(ref, np.float64),
                                 np.asarray(cand, np.float64), paired=True)


def speed_cell(row: Row, B: int):
    return speedup(row, B) or _m(row, f"speedup_b{B}")


def judged(row: Row, name: str, threshold: float, at_most: bool) -> str:
    """``met`` / ``not met`` / not distinguishable, by the interval over windows of ``name``
    against ``threshold`` (``at_most``: the target is ``<= threshold``)."""
    interval = window_interval(row, name)
    good, bad = ("met", "not met")
    return verdict(interval, above=bad if at_most else good, below=good if at_most else bad,
                   threshold=threshold, units="windows",
                   missing="the row keeps no per-window values").text


def times(ratio) -> str:
    """``2.00x`` or, with its interval, ``2.00x [1.90, 2.10]``."""
    if isinstance(ratio, stats.Interval):
        return f"{ratio.value:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"
    return f"{ratio:.2f}x"


def speed_judged(row: Row, threshold: float, B: int = 1) -> str:
    """A speed-up target (``>= threshold`` at batch ``B``) by the interval over timed runs, or on
    the median alone for a row that keeps no runs' seconds."""
    interval = speedup(row, B)
    if interval is None:
        return (("met" if _m(row, f"speedup_b{B}") >= threshold else "not met")
                + " (median of the runs)")
    return verdict(interval, above="met", below="not met", threshold=threshold,
                   units="timed runs").text
