"""Pages: markdown built section by section from result rows, headed by where the numbers come
from (the commands that produced the rows and the one that rendered the page, the git commit and
whether the tree was dirty, the machine, and how busy other processes kept its cores during the
points: ``other_cores``)."""

from __future__ import annotations

import collections
import os
import pathlib
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.report.plots import Axes, line_plot
from decodelab.report.tables import (NumberFormat, Table, format_number, is_number, ordered,
                                     points_table, row_value, swept_keys)


def current_command() -> str:
    """The command line of this process as one would type it (``python -m pkg.mod args``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = (["python", "-m", spec.name] if spec is not None and spec.name != "__main__"
               else ["python", sys.argv[0]])
    return shlex.join(program + sys.argv[1:])


def _tally(values: list) -> str:
    counts = collections.Counter(values)
    if len(counts) == 1:
        return str(next(iter(counts)))
    return "mixed: " + ", ".join(f"{value} ({n} rows)" for value, n in counts.most_common())


def backend(rows: Sequence[Mapping[str, Any]]) -> str:
    """The one JAX backend (``"cpu"``, ``"gpu"``, ``"tpu"``) every row was measured on, from its
    provenance (``"cpu"`` for rows that predate the field); rows of several backends are refused:
    a page's ratios compare one machine's measurements."""
    found = {row.get("provenance", {}).get("backend") or "cpu" for row in rows}
    if len(found) != 1:
        raise ValueError(f"rows must come from one backend, got {sorted(found)}: keep each "
                         f"backend's rows in their own workdir and page")
    return found.pop()


def xla_flags_text(prov: Mapping[str, Any]) -> str:
    """``", XLA_FLAGS=..."`` or ``", no XLA_FLAGS"`` for a row that recorded its flags; nothing
    for rows written before the field."""
    if "xla_flags" not in prov:
        return ""
    return f", XLA_FLAGS={prov['xla_flags']}" if prov["xla_flags"] else ", no XLA_FLAGS"


def provenance_lines(rows: Sequence[Mapping[str, Any]], command: str | None = None) -> list[str]:
    """Markdown lines saying where the rows come from: the commands that produced them and the
    one rendering them (this process's unless given), the commit, the machine and the software
    (with the XLA flags where the rows recorded them)."""
    if not rows:
        raise ValueError("rows must not be empty, got none")
    prov = [row.get("provenance", {}) for row in rows]
    produced = list(dict.fromkeys(p.get("command", "unknown") for p in prov))
    commits = [p.get("git_commit", "unknown")[:12]
               + (" (dirty)" if p.get("git_dirty") else "") for p in prov]
    machines = [f"{p.get('backend')} backend, device {p.get('device_kind')!r}, "
                f"{p.get('cpu_count')} CPUs" for p in prov]
    software = [f"jax {p.get('jax_version')}, jaxlib {p.get('jaxlib_version')}, "
                f"flax {p.get('flax_version')}, Python {p.get('python_version')}"
                + xla_flags_text(p) for p in prov]
    starts = sorted(row["start_time"] for row in rows)
    wall = sum(row.get("wall_time_s", 0.0) for row in rows)
    return [
        "Regenerate: " + " and ".join(f"`{c}`" for c in produced)
        + f" (rows), then `{current_command() if command is None else command}` (this page).",
        f"Commit: {_tally(commits)}. Machine: {_tally(machines)}. Software: {_tally(software)}.",
        f"{len(rows)} points run {starts[0]} to {starts[-1]}, "
        f"{_duration(wall)} of point wall time{_sharing(rows)}.",
    ]


# Points shorter than this say nothing about other processes: ``/proc/stat`` counts 10 ms ticks,
# so over a point of a millisecond (one computed, not measured) one tick reads as 10 busy cores.
MIN_WALL_S = 0.5


def other_cores(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per row that records it (``other_cpu_s``, see ``experiment.cpu_seconds``) and ran at least
    ``MIN_WALL_S``: the cores other processes kept busy on average during the point,
    ``other_cpu_s / wall_time_s``."""
    return [row["other_cpu_s"] / row["wall_time_s"] for row in rows
            if row.get("other_cpu_s") is not None and row.get("wall_time_s", 0) >= MIN_WALL_S]


def _sharing(rows: Sequence[Mapping[str, Any]]) -> str:
    shares = other_cores(rows)
    if not shares:
        return ""
    counted = "" if len(shares) == len(rows) else (f" of the {len(shares)} that recorded it over "
                                                  f"{MIN_WALL_S:g} s or more")
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
              caption: str | None = None, number_format: NumberFormat = format_number) -> Page:
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
    numeric = [k for k in keys if len(set(ordered([row_value(r, k) for r in rows]))) > 1
               and all(is_number(row_value(r, k)) for r in rows)]
    if numeric:
        x = numeric[0]
        others = [k for k in keys if k != x]
        metrics = dict.fromkeys(m for r in rows for m, v in r["metrics"].items() if is_number(v))
        for metric in metrics:
            path = line_plot(rows, out_dir / f"{name}_{metric}.png", x=x, y=f"metrics.{metric}",
                             group=others or None, axes=Axes(title=f"{name}: {metric}"))
            page.image(path, f"{metric} against {x}")
            written.append(path)
    return [page.write(out_dir / f"{name}.md"), *written]
