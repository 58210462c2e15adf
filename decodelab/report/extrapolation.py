"""The length-extrapolation page from its rows: claim quantities (callable dataclasses, so a
study declares its claims as data), the tables, the plot and the computed caveats.

A row's metrics are ``measure.extrapolation.length_metrics`` plus its ``encoding``; its training
seed is ``config.train.seed``. The tables and the plot are the first (lowest) seed's; a claim is
judged on each seed's rows (``seeded.SeededClaim``), so its quantity reads one seed's rows.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.measure import extrapolation
from decodelab.measure.stats import Interval
from decodelab.report.claims import Judged, verdict
from decodelab.report.plots import Axes, line_plot
from decodelab.report.tables import Table, format_number, format_value, pivot_table, with_metrics

Rows = Sequence[Mapping[str, Any]]

NO_WINDOWS = ("the rows keep no per-window values (written by an earlier version of the study); "
              "rerun it for intervals")


def seed_of(row: Mapping[str, Any]) -> int:
    return row["config"]["train"]["seed"]


def first_seed(rows: Rows) -> int:
    return min(seed_of(row) for row in rows)


def by_encoding(rows: Rows) -> dict[str, dict[int, dict]]:
    """encoding -> factor -> metrics, of one seed's rows."""
    by: dict[str, dict[int, dict]] = {}
    for row in rows:
        m = row["metrics"]
        by.setdefault(m["encoding"], {})[m["factor"]] = m
    return by


def windows_kept(rows: Rows) -> bool:
    return all(extrapolation.window_columns(r["metrics"]) is not None for r in rows
               if r["metrics"]["tail_perplexity"] is not None)


# --- Claim quantities, each of one seed's rows ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Growth:
    """The tail perplexity of ``encoding`` at ``factor`` L over that at L
    (``extrapolation.growth``); None where either length has no value."""

    encoding: str
    factor: int

    def __call__(self, rows: Rows) -> Interval | float | None:
        at = by_encoding(rows).get(self.encoding, {})
        if 1 not in at or self.factor not in at:
            return None
        return extrapolation.growth(at[1], at[self.factor])


@dataclasses.dataclass(frozen=True)
class Difference:
    """Tail perplexity of encoding ``a`` minus that of ``b`` at ``factor`` L, paired window by
    window (``extrapolation.difference``); positive: ``a`` is worse."""

    a: str
    b: str
    factor: int

    def __call__(self, rows: Rows) -> Interval | float | None:
        at = by_encoding(rows)
        a, b = at.get(self.a, {}).get(self.factor), at.get(self.b, {}).get(self.factor)
        return None if a is None or b is None else extrapolation.difference(a, b)


@dataclasses.dataclass(frozen=True)
class Lowest:
    """How far the runner-up sits above ``encoding`` at ``factor`` L: the lowest tail perplexity
    of the other encodings without scaling minus ``encoding``'s, paired window by window;
    positive: ``encoding`` has the lowest."""

    encoding: str
    factor: int

    def __call__(self, rows: Rows) -> Interval | float | None:
        at = by_encoding(rows)
        mine = at.get(self.encoding, {}).get(self.factor)
        others = sorted((m[self.factor]["tail_perplexity"], label) for label, m in at.items()
                        if "+" not in label and label != self.encoding and self.factor in m
                        and m[self.factor]["tail_perplexity"] is not None)
        if mine is None or mine["tail_perplexity"] is None or not others:
            return None
        return extrapolation.difference(at[others[0][1]][self.factor], mine)


# --- Tables and the plot --------------------------------------------------------------------------


def with_intervals(row: Mapping[str, Any]) -> dict:
    """The row with ``perplexity`` and ``tail_perplexity`` as Intervals over its windows (left as
    numbers where the row keeps no windows)."""
    changed = {metric: extrapolation.interval(row["metrics"], metric)
               for metric in extrapolation.METRICS}
    return with_metrics(row, **{k: v for k, v in changed.items() if v is not None})


def shown(rows: Rows) -> list[dict]:
    """The first seed's rows, with their intervals: what the tables and the plot show."""
    first = first_seed(rows)
    return [with_intervals(r) for r in rows if seed_of(r) == first]


def length_table(rows: Rows, metric: str = "tail_perplexity") -> Table:
    """Encoding x context length: the first seed's ``metric`` with its window interval."""
    return pivot_table(shown(rows), index="metrics.encoding", columns="metrics.context_len",
                       values=f"metrics.{metric}")


def growth_table(rows: Rows, factor: int) -> Table:
    """Per encoding evaluated at L and seed: the tail perplexity at L and at ``factor`` L, their
    ratio (with its interval) and that seed's verdict on "it degrades"."""
    by = {seed: by_encoding([r for r in rows if seed_of(r) == seed])
          for seed in sorted({seed_of(r) for r in rows})}
    body = []
    for label in by[first_seed(rows)]:
        for seed, at in by.items():
            if 1 not in at.get(label, {}):
                continue
            ratio = Growth(label, factor)([r for r in rows if seed_of(r) == seed])
            judged = (verdict(ratio if isinstance(ratio, Interval) else None, threshold=1.0,
                              above="degrades", below="improves", units="windows per length",
                              missing=NO_WINDOWS).text if ratio is not None else "n/a")
            body.append([label, seed, at[label][1]["tail_perplexity"],
                         at[label].get(factor, {}).get("tail_perplexity"), ratio, judged])
    return Table(["encoding", "seed", "at L", f"at {factor}L", "ratio", "verdict"], body)


def seeds_table(rows: Rows) -> Table:
    """Per encoding and length with several seeds: each seed's tail perplexity, their mean and
    range, beside the width of the first seed's window interval."""
    first = first_seed(rows)
    cells: dict[tuple, dict[int, dict]] = {}
    for row in rows:
        m = row["metrics"]
        cells.setdefault((m["encoding"], m["context_len"]), {})[seed_of(row)] = m
    body = []
    for (label, context), by_seed in cells.items():
        values = [by_seed[s]["tail_perplexity"] for s in sorted(by_seed)]
        if len(values) < 2 or None in values:
            continue
        window = extrapolation.interval(by_seed[first]) if first in by_seed else None
        body.append([label, context, ", ".join(str(s) for s in sorted(by_seed)),
                     float(np.mean(values)), min(values), max(values), max(values) - min(values),
                     None if window is None else window.high - window.low])
    return Table(["encoding", "context_len", "seeds", "mean", "min", "max", "seed range",
                  f"seed {first} window 95% width"], body)


def tail_plot(rows: Rows, path: str | os.PathLike) -> pathlib.Path:
    """Tail perplexity against context length, one line per encoding (the first seed's)."""
    return line_plot(shown(rows), path, x="metrics.context_len", y="metrics.tail_perplexity",
                     group="metrics.encoding", axes=Axes(
                         logx=True, logy=True,
                         title=f"tail perplexity vs context length, seed {first_seed(rows)}"
                         + (" (95% over windows)" if windows_kept(rows) else "")))


# --- The answer and the caveats, from the judged claims and the rows ------------------------------


def _names(labels: Sequence[str]) -> str:
    return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else "".join(labels)


def answer(judged: Sequence[Judged], tally: str) -> str:
    """Which encodings hold their tail perplexity to the longest length (their growth claim
    undecided on every seed that measured it), which degrade (met on every seed), and the
    claims' tally."""
    growth = [(j.claim.quantity, j.verdict) for j in judged if isinstance(j.claim.quantity, Growth)]
    holds = [g.encoding for g, v in growth
             if v.side == 0 and not v.text.startswith(("seeds disagree", "not measured"))]
    degrades = [g.encoding for g, v in growth if v.side > 0]
    top = max((g.factor for g, _ in growth), default=1)
    parts = []
    if holds:
        parts.append(f"only {_names(holds)} {'holds its' if len(holds) == 1 else 'hold their'} "
                     f"tail perplexity from L to {top}L (no growth the windows can see, on every "
                     "seed)")
    if degrades:
        parts.append(f"{_names(degrades)} degrade{'s' if len(degrades) == 1 else ''}")
    return ("Past the training length L, " + "; ".join(parts or ["no encoding is judged"])
            + f": {tally}.")


def caveats(rows: Rows, factor: int) -> list[str]:
    """What the intervals and the claims do not cover, with the numbers from the rows (the
    seeds' spread at ``factor`` L, the first seed's undecided growths)."""
    first = first_seed(rows)
    top = max(r["metrics"]["context_len"] for r in rows)
    spread = seeds_table(rows).rows
    at_top = [r for r in spread if r[1] == top]
    lines = []
    if at_top and windows_kept(rows):
        lines.append("The window intervals measure what other text of the same plays could "
                     f"move, not what another training seed could: at {factor}L, the seeds' "
                     f"range of tail perplexity against seed {first}'s window interval width is "
                     + "; ".join(f"{r[0]} {format_number(r[6])} against {format_number(r[7])}"
                                 for r in at_top)
                     + " (`extrapolation_seeds.csv`). Where the range is wider, the interval "
                     "understates what a rerun moves.")
    one_seed = sorted({r["metrics"]["encoding"] for r in rows} - {r[0] for r in spread})
    if one_seed:
        lines.append(f"{_names(one_seed)}: trained with seed {first} only, so their claims rest "
                     "on it alone.")
    missing = sorted({r["metrics"]["note"].removeprefix("n/a: ") for r in rows
                      if r["metrics"].get("note", "").startswith("n/a")})
    if missing:
        lines.append(f"`n/a`: a learned position table has no row past its length "
                     f"({'; '.join(missing)}): no number, rather than a meaningless one.")
    first_rows = [r for r in rows if seed_of(r) == first]
    for label in by_encoding(first_rows):
        ratio = Growth(label, factor)(first_rows)
        if isinstance(ratio, Interval) and not ratio.excludes(1.0):
            lines.append(f"An undecided growth is no change this sample can see, not an "
                         f"improvement: {label}'s {factor}L / L on seed {first} is "
                         f"{format_value(ratio)}, " + verdict(
                             ratio, threshold=1.0, above="", below="",
                             units="windows per length").text + ".")
    scaled = [r for r in at_top if r[0] == "rope" or r[0].startswith("rope+")]
    if scaled:
        lines.append("The RoPE scalings are applied at inference time without fine-tuning "
                     "(linear interpolation is meant to be followed by it); at "
                     f"{factor}L the seeds' tail perplexity spans "
                     + "; ".join(f"{r[0]} {format_number(r[4])} to {format_number(r[5])}"
                                 for r in scaled) + ".")
    lines.append("Neighbouring windows of one text are not independent: a window interval is, "
                 "if anything, too narrow.")
    return lines
