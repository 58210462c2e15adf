"""Tables (markdown, CSV) and plots (PNG) rendered from result rows alone, never typed by hand.

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

Every markdown page starts with where its numbers come from, read from the rows: the commands that
produced the rows and the one that rendered the page, the git commit (and whether the tree was dirty)
and the machine (backend, device kind, CPU count), and how busy other processes kept its cores
during the points (``other_cores``). Plots use Matplotlib's object API with the Agg
canvas, so rendering needs no display and leaves pyplot's global state alone.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, ScalarFormatter

from decodelab.experiment import current_command, merge_rows, read_rows
from decodelab.stats import Interval, units_needed

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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_plottable(value: Any) -> bool:
    return _is_number(value) or isinstance(value, Interval)


def with_metrics(row: Mapping[str, Any], **metrics: Any) -> dict:
    """A copy of ``row`` whose metrics are updated with ``metrics`` (e.g. a metric replaced by its
    ``Interval``, or None where the row cannot give one); the row itself is left unchanged."""
    return {**row, "metrics": {**row.get("metrics", {}), **metrics}}


def _ordered(values: list) -> list:
    """Distinct values: numbers ascending, anything else in order of first appearance."""
    distinct = list(dict.fromkeys(_hashable(v) for v in values))
    if distinct and all(map(_is_number, distinct)):
        return sorted(distinct)
    return distinct


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def format_value(value: Any, number_format: str = "{:.4g}") -> str:
    """A cell: None -> ``n/a``; floats with ``number_format``; an Interval as ``value [low, high]``
    (each with ``number_format``); anything else as ``str``."""
    if value is None:
        return MISSING
    if isinstance(value, Interval):
        return (f"{number_format.format(value.value)} [{number_format.format(value.low)}, "
                f"{number_format.format(value.high)}]")
    if isinstance(value, float):
        return number_format.format(value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class Table:
    """A rectangular table of raw values (None = missing); rendering formats them."""

    columns: list[str]
    rows: list[list[Any]]

    def to_markdown(self, number_format: str = "{:.4g}") -> str:
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
    for row in chosen:
        at = (_hashable(row_value(row, index)), _hashable(row_value(row, columns)))
        value = row_value(row, values)
        if at in cells and cells[at] != value:
            raise ValueError(f"two rows give {values!r} at {index}={at[0]!r}, {columns}={at[1]!r} "
                             f"({cells[at]!r} and {value!r}); filter the rows with `where`")
        cells[at] = value
    row_keys = _ordered([row_value(r, index) for r in chosen])
    col_keys = _ordered([row_value(r, columns) for r in chosen])
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


def line_plot(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, x: str, y: str,
              group: str | Sequence[str] | None = None, where: Where = None, logx: bool = False,
              logy: bool = False, title: str | None = None) -> pathlib.Path:
    """A PNG of ``y`` against ``x``, one line per value of ``group`` (a key, or several keys whose
    values together label a line); points whose ``y`` is missing are left out (the table shows them
    as ``n/a``); a ``y`` that is an Interval is drawn with an error bar from its low to its high.
    Numeric ``x`` is sorted; with ``logx`` the ticks are the x values themselves."""
    chosen = select(rows, where)
    if not chosen:
        raise ValueError(f"rows must not be empty after the filter, got none (where={where!r})")
    group_keys = [group] if isinstance(group, str) else list(group or [])

    def line_of(row: Mapping[str, Any]) -> Any:
        if len(group_keys) == 1:
            return _hashable(row_value(row, group_keys[0]))
        return ", ".join(f"{k}={format_value(row_value(row, k))}" for k in group_keys) or y

    lines: dict[Any, dict[Any, float | Interval]] = collections.defaultdict(dict)
    for row in chosen:
        label = line_of(row)
        at, value = _hashable(row_value(row, x)), row_value(row, y)
        if value is None:
            continue
        if not _is_plottable(value):
            raise ValueError(f"y must name a numeric value, got {y}={value!r}")
        if lines[label].get(at, value) != value:
            raise ValueError(f"two rows give {y!r} at {x}={at!r} in line {label!r}; filter the "
                             "rows with `where`")
        lines[label][at] = value
    xs = _ordered([row_value(r, x) for r in chosen])
    numeric_x = all(map(_is_number, xs))
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    for label in _ordered([line_of(r) for r in chosen]):
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
    if logx:
        if not numeric_x:
            raise ValueError(f"logx needs numeric x values, got {xs}")
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x.removeprefix("config."))
    ax.set_ylabel(y.removeprefix("metrics."))
    ax.grid(True, which="both", alpha=0.3)
    if group_keys:
        ax.legend(title=", ".join(group_keys) if len(group_keys) == 1 else None)
    if title:
        ax.set_title(title)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A claim's outcome: ``side`` +1 (the interval lies above the threshold), -1 (below), 0 (it
    contains the threshold, or there is no interval); ``text`` is what the page says."""

    side: int
    text: str

    def __str__(self) -> str:
        return self.text


def verdict(interval: Interval | None, *, above: str, below: str, threshold: float = 0.0,
            units: str = "units", missing: str = "no interval") -> Verdict:
    """The one rule for a generated claim about ``interval`` (a difference, a ratio, or an estimate
    compared with a target ``threshold``): ``above`` when the whole interval lies above the
    threshold, ``below`` when it lies below, and otherwise "not distinguishable at this sample size
    (about N units would be needed)", N from ``stats.units_needed`` (past 100 times the interval's
    units, only that). ``interval`` None (a row without per-unit values) gives "not judged
    (``missing``)"."""
    if interval is None:
        return Verdict(0, f"not judged ({missing})")
    if not isinstance(interval, Interval):
        raise ValueError(f"interval must be an Interval or None, got {type(interval).__name__}")
    if interval.low > threshold:
        return Verdict(1, above)
    if interval.high < threshold:
        return Verdict(-1, below)
    needed = units_needed(interval, threshold)
    if needed is None:
        return Verdict(0, "not distinguishable at this sample size (the estimate sits on "
                          f"{threshold:g}; no number of {units} would separate them)")
    if needed > 100 * interval.units:
        return Verdict(0, f"not distinguishable at this sample size (over 100 times these "
                          f"{interval.units:,} {units} would be needed)")
    return Verdict(0, f"not distinguishable at this sample size (about {needed:,} {units} would "
                      "be needed)")


def _seed_list(seeds: list) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def across_seeds(verdicts: Mapping[Any, Verdict]) -> Verdict:
    """One claim judged separately on each training seed (``verdicts``: seed -> its verdict) as
    one verdict: called (``side`` +1 or -1) only when every seed calls it, with the same text,
    "... on every seed (seeds 0, 1, 2)"; otherwise side 0, "seeds disagree: ...", each outcome
    with its seeds in seed order ("not distinguishable ... on every seed" when none calls it). An
    uncalled seed counts as disagreeing: a seed that cannot separate the two is evidence for
    neither. One seed gives its own verdict unchanged."""
    if not verdicts:
        raise ValueError("verdicts must hold at least one seed's verdict, got none")
    if len(verdicts) == 1:
        return next(iter(verdicts.values()))
    groups: dict[str, tuple[int, list]] = {}
    for seed in sorted(verdicts):
        judged = verdicts[seed]
        label = judged.text if judged.side else judged.text.split(" (")[0]
        groups.setdefault(label, (judged.side, []))[1].append(seed)
    if len(groups) == 1:
        (label, (side, seeds)), = groups.items()
        return Verdict(side, f"{label} on every seed ({_seed_list(seeds)})")
    return Verdict(0, "seeds disagree: " + "; ".join(
        f"{label} ({_seed_list(seeds)})" for label, (_, seeds) in groups.items()))


def _tally(values: list) -> str:
    counts = collections.Counter(values)
    if len(counts) == 1:
        return str(next(iter(counts)))
    return "mixed: " + ", ".join(f"{value} ({n} rows)" for value, n in counts.most_common())


def provenance_lines(rows: Sequence[Mapping[str, Any]], command: str | None = None) -> list[str]:
    """Markdown lines saying where the rows come from: the commands that produced them and the
    one rendering them (this process's unless given), the commit and the machine."""
    if not rows:
        raise ValueError("rows must not be empty, got none")
    prov = [row.get("provenance", {}) for row in rows]
    produced = list(dict.fromkeys(p.get("command", "unknown") for p in prov))
    commits = [p.get("git_commit", "unknown")[:12]
               + (" (dirty)" if p.get("git_dirty") else "") for p in prov]
    machines = [f"{p.get('backend')} backend, device {p.get('device_kind')!r}, "
                f"{p.get('cpu_count')} CPUs" for p in prov]
    software = [f"jax {p.get('jax_version')}, jaxlib {p.get('jaxlib_version')}, "
                f"flax {p.get('flax_version')}, Python {p.get('python_version')}" for p in prov]
    starts = sorted(row["start_time"] for row in rows)
    wall = sum(row.get("wall_time_s", 0.0) for row in rows)
    return [
        "Regenerate: " + " and ".join(f"`{c}`" for c in produced)
        + f" (rows), then `{current_command() if command is None else command}` (this page).",
        f"Commit: {_tally(commits)}. Machine: {_tally(machines)}. Software: {_tally(software)}.",
        f"{len(rows)} points run {starts[0]} to {starts[-1]}, "
        f"{_duration(wall)} of point wall time{_sharing(rows)}.",
    ]


def other_cores(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per row that records it (``other_cpu_s``, see ``experiment.cpu_seconds``): the cores other
    processes kept busy on average during the point, ``other_cpu_s / wall_time_s``."""
    return [row["other_cpu_s"] / row["wall_time_s"] for row in rows
            if row.get("other_cpu_s") is not None and row.get("wall_time_s")]


def _sharing(rows: Sequence[Mapping[str, Any]]) -> str:
    shares = other_cores(rows)
    if not shares:
        return ""
    counted = "" if len(shares) == len(rows) else f" of the {len(shares)} that recorded it"
    return (f"; other processes kept {sum(shares) / len(shares):.2f} cores busy on average during "
            f"a point{counted} (at most {max(shares):.2f})")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


class Page:
    """A markdown page built section by section; ``write`` puts the provenance lines under the
    title, so they head every table and plot on the page."""

    def __init__(self, title: str, rows: Sequence[Mapping[str, Any]], *,
                 command: str | None = None):
        self.title = title
        self.rows = list(rows)
        self.command = command
        self._parts: list[str] = []

    def text(self, markdown: str) -> Page:
        self._parts.append(markdown.strip() + "\n")
        return self

    def table(self, table: Table, csv_path: str | os.PathLike | None = None, *,
              caption: str | None = None, number_format: str = "{:.4g}") -> Page:
        """Add ``table`` (and write it as CSV to ``csv_path``, linked from the page)."""
        part = (f"{caption}\n\n" if caption else "") + table.to_markdown(number_format)
        if csv_path is not None:
            csv_path = pathlib.Path(csv_path)
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            csv_path.write_text(table.to_csv(), encoding="utf-8")
            part += f"\nCSV: [{csv_path.name}]({csv_path.name})\n"
        self._parts.append(part)
        return self

    def image(self, path: str | os.PathLike, alt: str) -> Page:
        self._parts.append(f"![{alt}]({pathlib.Path(path).name})\n")
        return self

    def write(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the page; its CSVs and images must be in the same folder (links are relative)."""
        header = [f"# {self.title}", ""] + [f"- {line}" for line in
                                              provenance_lines(self.rows, self.command)]
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(header) + "\n\n" + "\n".join(self._parts), encoding="utf-8")
        return path


def generic_report(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike, *,
                   command: str | None = None) -> list[pathlib.Path]:
    """``<experiment>.md`` and ``<experiment>.csv`` in ``out_dir``: every point's swept keys and
    metrics; and if a swept key takes several numeric values, ``<experiment>_<metric>.png`` for each
    numeric metric against it, one line per combination of the other swept keys. Returns the paths
    written."""
    if not rows:
        raise ValueError("rows must not be empty, got none")
    name = rows[0]["experiment"]
    out_dir = pathlib.Path(out_dir)
    csv_path = out_dir / f"{name}.csv"
    page = Page(f"{name}: all points", rows, command=command).table(points_table(rows), csv_path)
    written = [csv_path]
    keys = swept_keys(rows)
    numeric = [k for k in keys if len(set(_ordered([row_value(r, k) for r in rows]))) > 1
               and all(_is_number(row_value(r, k)) for r in rows)]
    if numeric:
        x = numeric[0]
        others = [k for k in keys if k != x]
        metrics = dict.fromkeys(m for r in rows for m, v in r["metrics"].items() if _is_number(v))
        for metric in metrics:
            path = line_plot(rows, out_dir / f"{name}_{metric}.png", x=x, y=f"metrics.{metric}",
                             group=others or None, title=f"{name}: {metric}")
            page.image(path, f"{metric} against {x}")
            written.append(path)
    return [page.write(out_dir / f"{name}.md"), *written]
