"""The one page form every ``results/*.md`` follows, and the index of every claim on every page.

A page, top to bottom:

1. a title that is the question the study asks;
2. a first line that answers it in one sentence (``Form.answer``, from the judged claims);
3. the verdict table: claim | measured, with its interval | threshold | verdict;
4. one main table of at most ``MAX_COLUMNS`` columns (``Form.table``), its CSV linked, and one
   plot (``Form.plot``);
5. the method in at most ``MAX_METHOD_LINES`` lines, then the caveats;
6. links to the CSVs that hold every column (``Form.csvs``);
7. where the rows come from and the one command that regenerates the page from its kept rows.

Every number goes through ``tables.format_value``: 3 significant figures in plain notation.
``render`` writes a page from rows alone (nothing is measured), so a clean checkout re-renders a
committed page from ``results/rows/<name>/rows.jsonl``; ``write_index`` writes
``results/README.md``, each page's claims with their verdicts and a link.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from decodelab.measure.stats import Interval
from decodelab.report.claims import Claim, Judged
from decodelab.report.pages import provenance_lines
from decodelab.report.tables import Table, format_value

MAX_COLUMNS = 7
MAX_METHOD_LINES = 8

Rows = Sequence[Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class Form:
    """What a study's page says, as data and functions of its rows.

    ``name``: the page's file stem (``<name>.md``, ``<name>.csv``, ``<name>.png``); ``question``:
    the title; ``claims``: what the page judges; ``answer``: the judged claims (and the rows) ->
    the one-sentence answer under the title; ``table``: the rows -> the main table;
    ``plot``: (rows, path) -> writes the one PNG there (None: no plot); ``method`` and
    ``caveats``: lines of markdown; ``csvs``: further tables written as ``<name>_<key>.csv`` so
    that every column is somewhere; ``command``: the command that regenerates the page;
    ``own_rows``: the rows -> the rows this page reports, whose points, commit, machine, wall
    time and load its provenance lines count (None: every row rendered). Several pages rendered
    from one workdir each give theirs, so a page does not claim its neighbours' points.
    """

    name: str
    question: str
    claims: Sequence[Claim]
    answer: Callable[[Sequence[Judged], Rows], str]
    table: Callable[[Rows], Table]
    method: Sequence[str]
    command: str
    caveats: Sequence[str] = ()
    plot: Callable[[Rows, pathlib.Path], Any] | None = None
    plot_caption: str = ""
    csvs: Mapping[str, Callable[[Rows], Table]] = dataclasses.field(default_factory=dict)
    own_rows: Callable[[Rows], Rows] | None = None

    def __post_init__(self):
        if not self.name or "/" in self.name:
            raise ValueError(f"name must be a file stem, got {self.name!r}")
        if not self.question.endswith("?"):
            raise ValueError(f"question must be a question (end with '?'), got {self.question!r}")
        if len(self.method) > MAX_METHOD_LINES:
            raise ValueError(f"method must be at most {MAX_METHOD_LINES} lines, got "
                             f"{len(self.method)}")


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A written page: its path, its question and its judged claims (for the index)."""

    page: pathlib.Path
    question: str
    judged: tuple[Judged, ...]
    written: tuple[pathlib.Path, ...]


def measured_text(judged: Judged) -> str:
    return value_text(judged.measured, judged.claim.unit)


def value_text(value: Interval | float | None, unit: str = "") -> str:
    """A measured value (an ``Interval`` or a number) with its ``unit``, as pages print it;
    "n/a" for None."""
    if value is None:
        return "n/a"
    if isinstance(value, Interval):
        return (f"{format_value(value.value)}{unit} [{format_value(value.low)}, "
                f"{format_value(value.high)}]")
    return f"{format_value(float(value))}{unit}"


def verdict_table(judged: Sequence[Judged]) -> Table:
    return Table(["claim", "measured [interval]", "threshold", "verdict"],
                 [[j.claim.text, measured_text(j),
                   f"{j.claim.comparison} {format_value(float(j.claim.threshold))}{j.claim.unit}",
                   j.verdict.text] for j in judged])


def tally(judged: Sequence[Judged]) -> str:
    """``"2 of 5 claims met, 1 not met, 2 undecided"``: the verdict table in a few words."""
    met = sum(j.verdict.side > 0 for j in judged)
    missed = sum(j.verdict.side < 0 for j in judged)
    parts = [f"{met} of {len(judged)} claims met"]
    if missed:
        parts.append(f"{missed} not met")
    if len(judged) - met - missed:
        parts.append(f"{len(judged) - met - missed} undecided or not measured")
    return ", ".join(parts)


def render(form: Form, rows: Rows, out_dir: str | os.PathLike) -> Rendered:
    """Write ``<out_dir>/<form.name>.md`` with its CSVs and plot, from ``rows`` alone."""
    if not rows:
        raise ValueError(f"rows must not be empty to render {form.name!r}, got none")
    own = rows if form.own_rows is None else form.own_rows(rows)
    if not own:
        raise ValueError(f"own_rows of {form.name!r} must select some of the {len(rows)} rows, "
                         f"got none")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    judged = tuple(claim.judge(rows) for claim in form.claims)
    table = form.table(rows)
    if len(table.columns) > MAX_COLUMNS:
        raise ValueError(f"the main table of {form.name!r} must have at most {MAX_COLUMNS} "
                         f"columns, got {len(table.columns)}: {table.columns}")
    written = []

    def csv(path: pathlib.Path, t: Table) -> str:
        path.write_text(t.to_csv(), encoding="utf-8")
        written.append(path)
        return f"[{path.name}]({path.name})"

    answer = form.answer(judged, rows).strip()
    parts = [f"# {form.question}", "", answer, ""]
    if judged:
        parts += [verdict_table(judged).to_markdown(), ""]
    parts += [table.to_markdown(), f"CSV: {csv(out_dir / f'{form.name}.csv', table)}", ""]
    if form.plot is not None:
        plot_path = out_dir / f"{form.name}.png"
        form.plot(rows, plot_path)
        written.append(plot_path)
        parts += [f"![{form.plot_caption or form.question}]({plot_path.name})", ""]
    parts += ["## Method", "", *[f"- {line}" for line in form.method], ""]
    if form.caveats:
        parts += ["## Caveats", "", *[f"- {line}" for line in form.caveats], ""]
    if form.csvs:
        links = [f"{csv(out_dir / f'{form.name}_{key}.csv', make(rows))} ({key})"
                 for key, make in form.csvs.items()]
        parts += ["Every column: " + ", ".join(links) + ".", ""]
    parts += ["## Provenance", "", *[f"- {line}" for line in
                                     provenance_lines(own, form.command)], ""]
    page = out_dir / f"{form.name}.md"
    page.write_text("\n".join(parts), encoding="utf-8")
    return Rendered(page, form.question, judged, (page, *written))


def write_index(rendered: Sequence[Rendered], out_dir: str | os.PathLike, *, command: str,
                pending: Sequence[tuple[str, str]] = ()) -> pathlib.Path:
    """``<out_dir>/README.md``: for every rendered page its question (linked) and each claim with
    what was measured and its verdict; ``pending``: (page file, why) for pages not rendered from
    kept rows."""
    out_dir = pathlib.Path(out_dir)
    lines = ["# Results: every claim on every page", "",
             f"Regenerated from the kept rows (`results/rows/`) by `{command}`; nothing is "
             "measured. A claim is met when its whole interval lies on the claimed side of the "
             "threshold, not met when it lies on the other, undecided when it holds the "
             "threshold.", ""]
    for done in sorted(rendered, key=lambda r: r.page.name):
        link = os.path.relpath(done.page, out_dir)
        lines += [f"## [{done.question}]({link})", "", tally(done.judged) + ".", ""]
        if done.judged:
            lines += [verdict_table(done.judged).to_markdown(), ""]
    if pending:
        lines += ["## Pages not yet rendered from kept rows", ""]
        lines += [f"- [{page}]({page}): {why}" for page, why in pending]
        lines.append("")
    path = out_dir / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
