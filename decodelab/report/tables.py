"""Tables (markdown, CSV) rendered from result rows alone, never typed by hand.

Rows are those of ``decodelab.experiment`` (``rows.jsonl``). A *key* names a value of a row:

- a config key, dotted (``model.position``), looked up in ``row["config"]``;
- a metric name (``perplexity``), looked up in ``row["metrics"]``;
- a row field (``wall_time_s``, ``seed``, ``config_hash``).

A key found both as a config key and as a metric is ambiguous: prefix it, ``config.x`` or
``metrics.x``. A value that is absent, or a metric that is None (not applicable), shows as ``n/a``.

A value may be a ``stats.Interval`` (a report puts one in a copy of a row, ``with_metrics``): a
table shows it as ``value [low, high]`` and its CSV gives the bounds their own columns
(``<column>_low``, ``<column>_high``); a line plot draws it as an error bar. A claim about an
interval is judged by ``verdict``, the one rule every page uses: a difference (or a comparison with
a target) is called only when its interval excludes zero (or the target).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from decodelab.measure.stats import Interval
from decodelab.report.rows import config_differences, merge_rows, read_rows

MISSING = "n/a"
_ABSENT = object()

Where = Mapping[str, Any] | Callable[[Mapping[str, Any]], bool] | None


def load_rows(*workdirs: str | os.PathLike) -> list[dict]:
    """The rows of one or more workdirs (e.g. one per shard), merged by config hash."""
    if not workdirs:
        raise ValueError("workdirs must name at least one folder, got none")
    missing = [str(w) for w in workdirs if not (pathlib.Path(w) / "rows.jsonl").is_file()]
    if missing:
        raise ValueError(f"workdirs must each hold a rows.jsonl, got none in {missing}")
    return merge_rows(*(read_rows(w) for w in workdirs))


def _lookup(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def row_value(row: Mapping[str, Any], key: str) -> Any:
    """The value ``key`` names in ``row`` (see the module docstring); None if absent."""
    for prefix, section in (("config.", "config"), ("metrics.", "metrics")):
        if key.startswith(prefix):
            value = _lookup(row.get(section, {}), key[len(prefix):])
            return None if value is _ABSENT else value
    in_config = _lookup(row.get("config", {}), key)
    in_metrics = row.get("metrics", {}).get(key, _ABSENT)
    if in_config is not _ABSENT and in_metrics is not _ABSENT:
        raise ValueError(f"key {key!r} is both a config key and a metric; write config.{key} or "
                         f"metrics.{key}")
    for value in (in_config, in_metrics, row.get(key, _ABSENT)):
        if value is not _ABSENT:
            return value
    return None


def select(rows: Sequence[Mapping[str, Any]], where: Where = None) -> list[Mapping[str, Any]]:
    """The rows matching ``where`` ({key: value} all equal, or a predicate), in sweep order."""
    if where is None:
        chosen = list(rows)
    elif callable(where):
        chosen = [row for row in rows if where(row)]
    else:
        chosen = [row for row in rows
                  if all(row_value(row, key) == value for key, value in where.items())]
    return sorted(chosen, key=lambda row: row.get("sweep_index", 0))


def parse_where(texts: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` texts (``experiments.report --where``) as a ``where`` mapping for ``select``:
    each value read as JSON where it parses (``32``, ``0.5``, ``true``, ``null``), else taken as
    text (``rope``, ``bench_decode.py:sampling``)."""
    where = {}
    for text in texts:
        key, equals, value = str(text).partition("=")
        if not equals or not key:
            raise ValueError(f"where must be KEY=VALUE (e.g. model.position=rope), got {text!r}")
        try:
            where[key] = json.loads(value)
        except json.JSONDecodeError:
            where[key] = value
    return where


def select_where(rows: Sequence[Mapping[str, Any]], texts: Sequence[str]) -> list[Mapping]:
    """The rows matching every ``KEY=VALUE`` of ``texts`` (``parse_where``), in sweep order;
    raises ValueError naming the values the rows hold when none matches."""
    where = parse_where(texts)
    chosen = select(rows, where)
    if rows and not chosen:
        held = {key: ordered([row_value(row, key) for row in rows]) for key in where}
        raise ValueError(f"where {list(texts)} matches none of the {len(rows)} rows; they hold "
                         + "; ".join(f"{key}: {values}" for key, values in held.items()))
    return chosen


def how_to_pick(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """How to tell two rows that collide in a table or plot apart: the fields they differ in and
    the filter that keeps the first (e.g. two runs of one sweep with other settings)."""
    differ = config_differences({"sweep": a.get("sweep"), **a.get("config", {})},
                                {"sweep": b.get("sweep"), **b.get("config", {})})
    if not differ:
        return "filter the rows with `where`"
    key, (value, _) = next(iter(differ.items()))
    fields = ", ".join(f"{k} ({format_value(x)} and {format_value(y)})"
                       for k, (x, y) in list(differ.items())[:4])
    return (f"the rows differ in {fields}: pick one with `where` (experiments.report "
            f"--where={key}={json.dumps(value) if not isinstance(value, str) else value})")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_plottable(value: Any) -> bool:
    return is_number(value) or isinstance(value, Interval)


def with_metrics(row: Mapping[str, Any], **metrics: Any) -> dict:
    """A copy of ``row`` whose metrics are updated with ``metrics`` (e.g. a metric replaced by its
    ``Interval``, or None where the row cannot give one); the row itself is left unchanged."""
    return {**row, "metrics": {**row.get("metrics", {}), **metrics}}


def ordered(values: list) -> list:
    """Distinct values: numbers ascending, anything else in order of first appearance."""
    distinct = list(dict.fromkeys(hashable(v) for v in values))
    if distinct and all(map(is_number, distinct)):
        return sorted(distinct)
    return distinct


def hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def format_number(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures in plain notation: 10,300 (never 1.03e+04), 0.0123,
    0.5; integers past 1,000 with thousands separators; nan and inf as written."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    rounded = float(f"{x:.{digits}g}")
    if abs(rounded) >= 10 ** (digits - 1):
        return f"{rounded:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(rounded)))
    return f"{rounded:.{decimals}f}"


NumberFormat = str | Callable[[float], str]


def _number(x: float, number_format: NumberFormat) -> str:
    return number_format(x) if callable(number_format) else number_format.format(x)


def format_value(value: Any, number_format: NumberFormat = format_number) -> str:
    """A cell: None -> ``n/a``; floats with ``number_format`` (a format string or a function; by
    default 3 significant figures in plain notation, ``format_number``); an Interval as
    ``value [low, high]`` (each formatted alike); anything else as ``str``."""
    if value is None:
        return MISSING
    if isinstance(value, Interval):
        return (f"{_number(value.value, number_format)} [{_number(value.low, number_format)}, "
                f"{_number(value.high, number_format)}]")
    if isinstance(value, float):
        return _number(value, number_format)
    return str(value)


@dataclasses.dataclass(frozen=True)
class Table:
    """A rectangular table of raw values (None = missing); rendering formats them."""

    columns: list[str]
    rows: list[list[Any]]

    def to_markdown(self, number_format: NumberFormat = format_number) -> str:
        def cell(value: Any) -> str:
            return format_value(value, number_format).replace("|", r"\|").replace("\n", " ")

        lines = ["| " + " | ".join(cell(c) for c in self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        """Full precision (``repr`` of floats), missing values as empty cells. A column holding an
        Interval anywhere is followed by ``<column>_low`` and ``<column>_high``: its cells are the
        estimate and the bounds (empty bounds for a plain number)."""
        spans = [any(isinstance(row[i], Interval) for row in self.rows)
                 for i in range(len(self.columns))]

        def cells(values: Sequence[Any]) -> list:
            out = []
            for value, span in zip(values, spans):
                if isinstance(value, Interval):
                    out += [value.value, value.low, value.high]
                else:
                    out += ["" if value is None else value] + (["", ""] if span else [])
            return out

        header = []
        for column, span in zip(self.columns, spans):
            header += [column, f"{column}_low", f"{column}_high"] if span else [column]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([cells(row) for row in self.rows])
        return out.getvalue()


def _short(key: str) -> str:
    return key.removeprefix("metrics.").removeprefix("config.")


def pivot_table(rows: Sequence[Mapping[str, Any]], *, index: str, columns: str, values: str,
                where: Where = None) -> Table:
    """One table row per value of ``index``, one column per value of ``columns``, cells ``values``.

    A cell no row fills is missing (``n/a``); two rows filling one cell with different values is an
    error (filter them with ``where`` or pivot on a key that tells them apart).
    """
    chosen = select(rows, where)
    if not chosen:
        raise ValueError(f"rows must not be empty after the filter, got none (where={where!r})")
    cells: dict[tuple, Any] = {}
    first: dict[tuple, Mapping[str, Any]] = {}
    for row in chosen:
        at = (hashable(row_value(row, index)), hashable(row_value(row, columns)))
        value = row_value(row, values)
        if at in cells and cells[at] != value:
            raise ValueError(f"two rows give {values!r} at {index}={at[0]!r}, {columns}={at[1]!r} "
                             f"({cells[at]!r} and {value!r}); {how_to_pick(first[at], row)}")
        cells[at] = value
        first.setdefault(at, row)
    row_keys = ordered([row_value(r, index) for r in chosen])
    col_keys = ordered([row_value(r, columns) for r in chosen])
    header = [f"{_short(index)} \\ {_short(columns)}"] + [format_value(c) for c in col_keys]
    body = [[r] + [cells.get((r, c)) for c in col_keys] for r in row_keys]
    return Table(header, body)


def swept_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys the rows' sweep points override, in order of first appearance."""
    return list(dict.fromkeys(key for row in rows for key in row.get("overrides", {})))


def points_table(rows: Sequence[Mapping[str, Any]], *, where: Where = None) -> Table:
    """One line per point: its swept keys, every metric, and its wall time. Per-unit values (a
    metric that is a list or a dict of lists, kept for resampling) are left out."""
    chosen = select(rows, where)
    keys = swept_keys(chosen) or ["config_hash"]
    metrics = list(dict.fromkeys(name for row in chosen for name, value in
                                 row.get("metrics", {}).items()
                                 if not isinstance(value, (list, dict))))
    columns = keys + [f"metrics.{m}" if m in keys else m for m in metrics] + ["wall_time_s"]
    body = [[row_value(row, key) for key in keys]
            + [row.get("metrics", {}).get(m) for m in metrics] + [row.get("wall_time_s")]
            for row in chosen]
    return Table(columns, body)
