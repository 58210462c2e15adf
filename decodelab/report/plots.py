"""Line plots (PNG) of result rows: Matplotlib's object API with the Agg canvas, so rendering needs
no display and leaves pyplot's global state alone."""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, ScalarFormatter

from decodelab.checks import check_bool
from decodelab.measure.stats import Interval
from decodelab.report.tables import (Where, format_value, hashable, how_to_pick, is_number,
                                     is_plottable, ordered, row_value, select)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Axes:
    """How ``line_plot`` draws its axes (each ValueError names the field)."""

    logx: bool = False  # a log x axis ticked at the x values themselves (numeric x only)
    logy: bool = False  # a log y axis
    title: str | None = None  # above the plot

    def __post_init__(self) -> None:
        check_bool("logx", self.logx)
        check_bool("logy", self.logy)
        if self.title is not None and not isinstance(self.title, str):
            raise ValueError(f"title must be None or a str, got {self.title!r}")


def line_plot(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, x: str, y: str,
              group: str | Sequence[str] | None = None, where: Where = None,
              axes: Axes = Axes()) -> pathlib.Path:
    """A PNG of ``y`` against ``x``, one line per value of ``group`` (a key, or several keys whose
    values together label a line); points whose ``y`` is missing are left out (the table shows them
    as ``n/a``); a ``y`` that is an Interval is drawn with an error bar from its low to its high.
    Numeric ``x`` is sorted; ``axes`` sets the scales and the title."""
    if not isinstance(axes, Axes):
        raise ValueError(f"axes must be a report.Axes, got {axes!r}")
    chosen = select(rows, where)
    if not chosen:
        raise ValueError(f"rows must not be empty after the filter, got none (where={where!r})")
    group_keys = [group] if isinstance(group, str) else list(group or [])

    def line_of(row: Mapping[str, Any]) -> Any:
        if len(group_keys) == 1:
            return hashable(row_value(row, group_keys[0]))
        return ", ".join(f"{k}={format_value(row_value(row, k))}" for k in group_keys) or y

    lines: dict[Any, dict[Any, float | Interval]] = collections.defaultdict(dict)
    first: dict[tuple, Mapping[str, Any]] = {}
    for row in chosen:
        label = line_of(row)
        at, value = hashable(row_value(row, x)), row_value(row, y)
        if value is None:
            continue
        if not is_plottable(value):
            raise ValueError(f"y must name a numeric value, got {y}={value!r}")
        if lines[label].get(at, value) != value:
            raise ValueError(f"two rows give {y!r} at {x}={at!r} in line {label!r}; "
                             f"{how_to_pick(first[label, at], row)}")
        lines[label][at] = value
        first.setdefault((label, at), row)
    xs = ordered([row_value(r, x) for r in chosen])
    numeric_x = all(map(is_number, xs))
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    for label in ordered([line_of(r) for r in chosen]):
        points = lines.get(label, {})
        at = [v for v in xs if v in points]
        ys = [points[v].value if isinstance(points[v], Interval) else points[v] for v in at]
        below = [y_ - points[v].low if isinstance(points[v], Interval) else 0.0
                 for v, y_ in zip(at, ys)]
        above = [points[v].high - y_ if isinstance(points[v], Interval) else 0.0
                 for v, y_ in zip(at, ys)]
        has_bars = any(isinstance(points[v], Interval) for v in at)
        ax.errorbar(at if numeric_x else [str(v) for v in at], ys,
                    yerr=[below, above] if has_bars else None, marker="o", capsize=3,
                    label=str(label))
    if axes.logx:
        if not numeric_x:
            raise ValueError(f"logx needs numeric x values, got {xs}")
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
    if axes.logy:
        ax.set_yscale("log")
    ax.set_xlabel(x.removeprefix("config."))
    ax.set_ylabel(y.removeprefix("metrics."))
    ax.grid(True, which="both", alpha=0.3)
    if group_keys:
        ax.legend(title=", ".join(group_keys) if len(group_keys) == 1 else None)
    if axes.title:
        ax.set_title(axes.title)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
