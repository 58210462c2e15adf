"""Render a study's pages from its rows alone; or every page kept in results/ and the index.

    python -m experiments.report --workdir=runs/extrapolation [--workdir=DIR2 ...] [--out=results]
        [--where=KEY=VALUE ...]   # only the rows where every KEY has its VALUE
    python -m experiments.report --all        # every results/rows/<name>/ -> its pages + README.md

Several --workdir (e.g. one per sweep shard) are merged by config hash. A study module
`experiments.<experiment>` declares its pages with `forms(rows)` (a list of `report.Form`, rendered
by `report.render`; found by `experiments.study_forms`); a study without one gets a generic table of
every point (swept keys and metrics) in `<out>/<experiment>.md` and `.csv`.

The rows rendered are also written to `<out>/rows/<first workdir's name>/rows.jsonl` (`--keep_rows`),
so a clean checkout holds what each committed page was rendered from: `--all` renders them again, or
resume a sweep after copying that file into the sweep's workdir
(`mkdir -p runs/<name> && cp results/rows/<name>/rows.jsonl runs/<name>/`).
"""

from __future__ import annotations

import pathlib

from absl import app, flags

from decodelab import experiment, report
from experiments import study_forms

_WORKDIR = flags.DEFINE_multi_string("workdir", None, "Folder holding rows.jsonl; repeat to merge "
                                     "shards.")
_OUT = flags.DEFINE_string("out", None, "Output folder; default <first workdir>/report, or "
                           "results with --all.")
_KEEP_ROWS = flags.DEFINE_bool("keep_rows", True, "Also write the rows rendered to "
                               "<out>/rows/<first workdir's name>/rows.jsonl.")
_WHERE = flags.DEFINE_multi_string("where", None, "Render only the rows whose KEY has VALUE "
                                   "(KEY=VALUE: a config key, metric or row field such as sweep; "
                                   "repeat: every one must hold).")
_ALL = flags.DEFINE_bool("all", False, "Render every page whose rows are kept in <out>/rows/ and "
                         "write the index <out>/README.md.")
ALL_COMMAND = "python -m experiments.report --all"


def render_rows(rows: list[dict], out_dir: pathlib.Path) -> tuple[list[report.Rendered], list]:
    """The study's pages of ``rows`` (its ``forms``), or the generic table: (rendered, paths)."""
    forms = study_forms(rows[0]["experiment"])
    if forms is None:
        return [], report.generic_report(rows, out_dir)
    rendered = [report.render(form, rows, out_dir) for form in forms(rows)]
    return rendered, [path for done in rendered for path in done.written]


def render_all(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Every kept rows folder's pages and the index of their claims; the pages in ``out_dir``
    that no kept rows rendered are listed in the index as pending."""
    kept = sorted((out_dir / "rows").glob("*/rows.jsonl"))
    if not kept:
        raise ValueError(f"--all needs kept rows in {out_dir / 'rows'}/<name>/rows.jsonl, got none")
    rendered, written = [], []
    for path in kept:
        done, paths = render_rows(report.load_rows(path.parent), out_dir)
        rendered += done
        written += paths
    pages = {done.page.name for done in rendered}
    pending = [(page.name, "its rows are not kept in results/rows/; rerun its sweep and render it")
               for page in sorted(out_dir.glob("*.md"))
               if page.name not in pages and page.name != "README.md"]
    return [*written, report.write_index(rendered, out_dir, command=ALL_COMMAND, pending=pending)]


def main(argv) -> None:
    if _ALL.value:
        if _WORKDIR.value or _WHERE.value:
            raise app.UsageError("--all renders the kept rows as they are; give no --workdir "
                                 "or --where with it")
        written = render_all(pathlib.Path(_OUT.value or "results"))
    else:
        if not _WORKDIR.value:
            raise app.UsageError("give --workdir=DIR (repeat to merge shards), or --all")
        rows = report.load_rows(*_WORKDIR.value)
        rows = report.select_where(rows, _WHERE.value) if _WHERE.value else rows
        out_dir = pathlib.Path(_OUT.value or pathlib.Path(_WORKDIR.value[0]) / "report")
        _, written = render_rows(rows, out_dir)
        if _KEEP_ROWS.value:
            written.append(keep_rows(rows, out_dir, _WORKDIR.value[0]))
    for path in written:
        print(path)


def keep_rows(rows: list[dict], out_dir: pathlib.Path, workdir: str) -> pathlib.Path:
    """Write ``rows`` as ``<out_dir>/rows/<workdir's name>/rows.jsonl`` (replacing what was there)
    and return its path (when ``workdir`` is that folder, the same rows are written again)."""
    name = pathlib.Path(workdir).resolve().name
    return experiment.write_rows(out_dir / "rows" / name, rows)


if __name__ == "__main__":
    experiment.run_program(main)
