"""Render the tables and plots of an experiment from its rows.jsonl alone.

    python -m experiments.report --workdir=runs/extrapolation [--workdir=DIR2 ...] [--out=results]

Several --workdir (e.g. one per sweep shard) are merged by config hash. If `experiments.<experiment>`
defines `report(rows, out_dir)` (found by `experiments.study_report`), that renders the study's page;
otherwise a generic table of every point (swept keys and metrics) is written to
`<out>/<experiment>.md` and `.csv`.

The rows rendered are also written to `<out>/rows/<first workdir's name>/rows.jsonl` (`--keep_rows`),
so a clean checkout holds what each committed page was rendered from: render it again with
`--workdir=results/rows/<name>`, or resume its sweep after copying that file into the sweep's workdir
(`mkdir -p runs/<name> && cp results/rows/<name>/rows.jsonl runs/<name>/`).
"""

from __future__ import annotations

import pathlib

from absl import app, flags

from decodelab import experiment
from decodelab import report as results
from experiments import study_report

_WORKDIR = flags.DEFINE_multi_string("workdir", None, "Folder holding rows.jsonl; repeat to merge "
                                     "shards.", required=True)
_OUT = flags.DEFINE_string("out", None, "Output folder; default <first workdir>/report.")
_KEEP_ROWS = flags.DEFINE_bool("keep_rows", True, "Also write the rows rendered to "
                               "<out>/rows/<first workdir's name>/rows.jsonl.")


def main(argv) -> None:
    experiment.check_no_arguments(argv)
    rows = results.load_rows(*_WORKDIR.value)
    out_dir = pathlib.Path(_OUT.value or pathlib.Path(_WORKDIR.value[0]) / "report")
    name = rows[0]["experiment"]
    study = study_report(name)
    written = list((study(rows, out_dir) if study else results.generic_report(rows, out_dir))
                   or [])
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
    app.run(main)
