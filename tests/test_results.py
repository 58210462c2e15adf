"""Results: tables and plots come from rows alone, missing values read n/a, ambiguous cells are
refused, and every page states the commands, commit and machine behind it."""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from ml_collections import config_dict

import experiments
from decodelab import experiment, report
from decodelab.report import plots
from decodelab.measure.stats import Interval

REPO = pathlib.Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def measure(config, ctx):
    """Pretend perplexity: learned positions have no value past length 16."""
    if config.model.position == "learned" and config.eval.length > 16:
        return {"perplexity": None, "note": "past the table"}
    return {"perplexity": 10.0 * len(config.model.position) + config.eval.length, "note": "ok"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rows")
    config = config_dict.ConfigDict(dict(experiment="toy", seed=0, model=dict(position="rope"),
                                         eval=dict(length=16)))
    sweep = experiment.product({"model.position": ["rope", "learned", "alibi"],
                                "eval.length": [64, 16, 32]})
    experiment.run(config, sweep, measure, workdir, progress=False,
                   command="python -m experiments.toy --workdir=runs/toy")
    return workdir


@pytest.fixture(scope="module")
def rows(workdir):
    return report.load_rows(workdir)


def test_pivot_puts_one_key_down_another_across_and_missing_as_n_a(rows):
    table = report.pivot_table(rows, index="model.position", columns="eval.length",
                                values="perplexity")
    assert table.columns == ["model.position \\ eval.length", "16", "32", "64"]
    assert table.rows == [["rope", 56.0, 72.0, 104.0],
                          ["learned", 86.0, None, None],
                          ["alibi", 66.0, 82.0, 114.0]]
    assert table.to_markdown().splitlines()[3] == "| learned | 86.0 | n/a | n/a |"


def test_pivot_fills_absent_cells_with_n_a(rows):
    table = report.pivot_table(rows, index="model.position", columns="eval.length",
                                values="perplexity",
                                where=lambda r: r["overrides"] != {"model.position": "alibi",
                                                                   "eval.length": 16})
    assert table.rows[2] == ["alibi", None, 82.0, 114.0]


def test_pivot_refuses_two_values_for_one_cell(rows):
    with pytest.raises(ValueError, match="two rows give 'perplexity' at model.position='rope'"):
        report.pivot_table(rows, index="model.position", columns="seed", values="perplexity")


def test_where_filters_by_key_values(rows):
    table = report.pivot_table(rows, index="model.position", columns="eval.length",
                                values="perplexity", where={"model.position": "alibi"})
    assert table.rows == [["alibi", 66.0, 82.0, 114.0]]


def test_csv_keeps_full_precision_and_leaves_missing_cells_empty():
    table = report.Table(["a", "b"], [[1 / 3, None], ["x,y", 2]])
    assert table.to_csv() == 'a,b\n0.3333333333333333,\n"x,y",2\n'
    assert table.to_markdown() == "| a | b |\n|---|---|\n| 0.333 | n/a |\n| x,y | 2 |\n"


def test_an_interval_cell_reads_value_and_bounds_and_its_csv_gives_bounds_columns():
    table = report.Table(["encoding", "ppl"], [["rope", Interval(56.12, 54.98, 57.31, units=64)],
                                                ["alibi", 58.7], ["nope", None]])
    assert table.to_markdown("{:.1f}").splitlines()[2:] == [
        "| rope | 56.1 [55.0, 57.3] |", "| alibi | 58.7 |", "| nope | n/a |"]
    assert table.to_csv() == ("encoding,ppl,ppl_low,ppl_high\nrope,56.12,54.98,57.31\n"
                              "alibi,58.7,,\nnope,,,\n")


def test_a_verdict_is_called_only_when_the_interval_excludes_the_threshold():
    def judge(interval, **kwargs):
        return report.verdict(interval, above="better", below="worse", units="prompts",
                               **kwargs)
    assert judge(Interval(0.3, 0.1, 0.5, units=40)).text == "better"
    assert judge(Interval(-0.3, -0.5, -0.1, units=40)).side == -1
    straddles = judge(Interval(0.1, -0.1, 0.3, units=100))
    assert (straddles.side, straddles.text) == (0, "not distinguishable at this sample size "
                                                   "(about 400 prompts would be needed)")
    assert str(judge(Interval(0.95, 0.85, 0.99, units=50), threshold=0.9)) == (
        "not distinguishable at this sample size (about 200 prompts would be needed)")
    assert judge(Interval(1e-6, -0.1, 0.1, units=20)).text == (
        "not distinguishable at this sample size (over 100 times these 20 prompts would be "
        "needed)")
    assert judge(None, missing="the rows carry no per-prompt values").text == (
        "not judged (the rows carry no per-prompt values)")
    with pytest.raises(ValueError, match="interval must be an Interval or None, got float"):
        judge(0.3)


def test_a_claim_over_seeds_is_called_only_when_every_seed_calls_it_the_same_way():
    def judge(low, high):
        return report.verdict(Interval((low + high) / 2, low, high, units=40), above="worse",
                               below="better", units="windows")
    agree = report.across_seeds({2: judge(-3, -1), 0: judge(-5, -2), 1: judge(-4, -0.5)})
    assert (agree.side, agree.text) == (-1, "better on every seed (seeds 0, 1, 2)")
    split = report.across_seeds({0: judge(-5, -2), 1: judge(-1, 2), 2: judge(1, 3)})
    assert split.side == 0
    assert split.text == ("seeds disagree: better (seed 0); not distinguishable at this sample "
                          "size (seed 1); worse (seed 2)")
    # An uncalled seed keeps the claim from being called, even when the others agree.
    assert report.across_seeds({0: judge(1, 3), 1: judge(-0.1, 2)}).side == 0
    none = report.across_seeds({0: judge(-1, 2), 1: judge(-2, 0.5)})
    assert (none.side, none.text) == (0, "not distinguishable at this sample size on every seed "
                                         "(seeds 0, 1)")
    # Called on every seed, but not the same claim (another encoding best on seed 1).
    best = [report.verdict(Interval(2.0, 1.0, 3.0, units=40), above=f"{name} is the best",
                            below="-") for name in ("alibi", "rope")]
    assert report.across_seeds(dict(enumerate(best))).text == (
        "seeds disagree: alibi is the best (seed 0); rope is the best (seed 1)")
    # One seed: its own verdict, with its units-needed sentence.
    one = judge(-1, 2)
    assert report.across_seeds({0: one}) is one
    with pytest.raises(ValueError, match="verdicts must hold at least one seed's verdict"):
        report.across_seeds({})


def test_points_table_leaves_out_per_unit_lists():
    row = {"overrides": {"x": 1}, "config": {"x": 1}, "metrics": {
        "ppl": 3.0, "window_nll": [1.0], "per_prompt": {"tokens": [4.0]}}, "wall_time_s": 2.0}
    assert report.points_table([row]).columns == ["x", "ppl", "wall_time_s"]


def test_keys_resolve_to_config_metrics_then_row_fields():
    row = {"config": {"model": {"position": "rope"}, "loss": 1}, "metrics": {"loss": 2.0, "ppl": 3},
           "wall_time_s": 4.0}
    assert report.row_value(row, "model.position") == "rope"
    assert report.row_value(row, "ppl") == 3
    assert report.row_value(row, "wall_time_s") == 4.0
    assert report.row_value(row, "absent") is None
    assert report.row_value(row, "metrics.loss") == 2.0
    assert report.row_value(row, "config.loss") == 1
    with pytest.raises(ValueError, match="key 'loss' is both a config key and a metric"):
        report.row_value(row, "loss")


def test_points_table_lists_swept_keys_and_metrics_in_sweep_order(rows):
    table = report.points_table(rows)
    assert table.columns == ["model.position", "eval.length", "perplexity", "note", "wall_time_s"]
    assert [r[:4] for r in table.rows[:4]] == [["rope", 64, 104.0, "ok"], ["rope", 16, 56.0, "ok"],
                                              ["rope", 32, 72.0, "ok"],
                                              ["learned", 64, None, "past the table"]]


def test_line_plot_writes_a_png(rows, tmp_path):
    path = report.line_plot(rows, tmp_path / "ppl.png", x="eval.length", y="perplexity",
                             group="model.position",
                             axes=report.Axes(logx=True, logy=True, title="toy"))
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_line_plot_draws_an_interval_as_an_error_bar(rows, tmp_path, monkeypatch):
    figures = []

    class Recorded(plots.Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            figures.append(self)

    monkeypatch.setattr(plots, "Figure", Recorded)
    carried = [report.with_metrics(row, perplexity=Interval(row["metrics"]["perplexity"],
                                                             row["metrics"]["perplexity"] - 1.0,
                                                             row["metrics"]["perplexity"] + 2.0,
                                                             units=8))
               for row in rows if row["metrics"]["perplexity"] is not None]
    path = report.line_plot(carried, tmp_path / "ppl.png", x="eval.length", y="perplexity",
                             group="model.position", where={"model.position": "rope"})
    assert path.read_bytes().startswith(PNG_MAGIC)
    (ax,) = figures[0].axes
    (bars,) = ax.collections
    assert [tuple(segment[:, 1]) for segment in bars.get_segments()] == [
        (55.0, 58.0), (71.0, 74.0), (103.0, 106.0)]
    assert rows[0]["metrics"]["perplexity"] == 104.0  # with_metrics copies


def test_line_plot_refuses_a_non_numeric_y(rows, tmp_path):
    with pytest.raises(ValueError, match="y must name a numeric value, got note='ok'"):
        report.line_plot(rows, tmp_path / "x.png", x="eval.length", y="note")


def test_provenance_lines_name_the_commands_commit_and_machine(rows):
    prov = rows[0]["provenance"]
    lines = report.provenance_lines(rows, command="python -m experiments.report --workdir=w")
    assert lines[0] == ("Regenerate: `python -m experiments.toy --workdir=runs/toy` (rows), then "
                        "`python -m experiments.report --workdir=w` (this page).")
    assert prov["git_commit"][:12] in lines[1]
    assert f"{prov['backend']} backend, device {prov['device_kind']!r}, {prov['cpu_count']} CPUs" \
        in lines[1]
    assert lines[2].startswith("9 points run ")
    # The rows were written under the tests' XLA flags (conftest) and say so.
    assert f", XLA_FLAGS={prov['xla_flags']}." in lines[1] and prov["xla_flags"]


def test_provenance_lines_say_no_xla_flags_and_nothing_for_rows_before_the_field(rows):
    unset = [dict(r, provenance=dict(r["provenance"], xla_flags="")) for r in rows]
    assert report.provenance_lines(unset, command="c")[1].endswith(", no XLA_FLAGS.")
    before = [dict(r, provenance={k: v for k, v in r["provenance"].items() if k != "xla_flags"})
              for r in rows]
    assert "XLA_FLAGS" not in report.provenance_lines(before, command="c")[1]


def test_provenance_lines_tally_rows_from_different_commits(rows):
    other = [dict(r, provenance=dict(r["provenance"], git_commit="f" * 40, git_dirty=False))
             for r in rows[:2]]
    lines = report.provenance_lines(list(rows[2:]) + other, command="c")
    assert "Commit: mixed: " in lines[1] and "ffffffffffff (2 rows)" in lines[1]


def test_backend_is_the_one_backend_of_the_rows_and_mixed_backends_are_refused(rows):
    assert report.backend(rows) == rows[0]["provenance"]["backend"] == "cpu"
    assert report.backend([{"metrics": {}}]) == "cpu"  # rows from before the field
    gpu = [dict(r, provenance=dict(r["provenance"], backend="gpu")) for r in rows[:2]]
    assert report.backend(gpu) == "gpu"
    with pytest.raises(ValueError, match=r"one backend, got \['cpu', 'gpu'\]"):
        report.backend(list(rows[2:]) + gpu)


def test_the_report_renders_from_rows_alone(workdir, tmp_path):
    fresh = tmp_path / "copy"
    fresh.mkdir()
    shutil.copy(workdir / "rows.jsonl", fresh / "rows.jsonl")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "experiments.report", f"--workdir={fresh}", f"--out={out}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stderr
    page = (out / "toy.md").read_text()
    assert f"`python -m experiments.report --workdir={fresh} --out={out}` (this page)" in page
    assert "`python -m experiments.toy --workdir=runs/toy` (rows)" in page
    assert "| learned | 64 | n/a | past the table |" in page
    assert (out / "toy.csv").read_text().splitlines()[0] == \
        "model.position,eval.length,perplexity,note,wall_time_s"
    assert (out / "toy_perplexity.png").read_bytes().startswith(PNG_MAGIC)
    assert "![perplexity against eval.length](toy_perplexity.png)" in page
    # The rows rendered are kept beside the page, under the workdir's name, and render it again.
    kept = out / "rows" / "copy"
    assert experiment.read_rows(kept) == experiment.read_rows(fresh)
    assert str(kept / "rows.jsonl") in done.stdout.splitlines()
    again = subprocess.run([sys.executable, "-m", "experiments.report", f"--workdir={kept}",
                            f"--out={tmp_path / 'again'}", "--nokeep_rows"], cwd=REPO,
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "toy.csv").read_text() == (out / "toy.csv").read_text()
    assert not (tmp_path / "again" / "rows").exists()


def test_the_report_merges_shards_given_as_several_workdirs(workdir, tmp_path):
    rows = experiment.read_rows(workdir)
    experiment.add_rows(tmp_path / "a", rows[:4])
    experiment.add_rows(tmp_path / "b", rows[3:])
    assert report.load_rows(tmp_path / "a", tmp_path / "b") == rows


def test_load_rows_refuses_a_folder_without_rows(tmp_path):
    with pytest.raises(ValueError, match="workdirs must each hold a rows.jsonl"):
        report.load_rows(tmp_path)


def test_the_library_never_imports_the_experiment_programs():
    for path in (REPO / "decodelab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "experiments" for n in names), path


def test_a_study_module_forms_function_is_found(tmp_path, monkeypatch):
    package = tmp_path / "studies"
    package.mkdir()
    (package / "with_forms.py").write_text("def forms(rows):\n    return ['done']\n")
    (package / "without_forms.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert experiments.study_forms("with_forms", package="studies")([]) == ["done"]
    assert experiments.study_forms("without_forms", package="studies") is None
    assert experiments.study_forms("absent", package="studies") is None
    assert experiments.study_forms("absent", package="no_such_package") is None


def test_a_page_holds_text_tables_and_images_under_its_provenance(rows, tmp_path):
    table = report.pivot_table(rows, index="model.position", columns="eval.length",
                                values="perplexity")
    plot = report.line_plot(rows, tmp_path / "ppl.png", x="eval.length", y="perplexity",
                             group="model.position")
    page = (report.Page("Toy study", rows, command="python -m experiments.report")
            .text("What the numbers show.")
            .table(table, tmp_path / "ppl.csv", caption="Perplexity by length.")
            .image(plot, "perplexity against length")
            .write(tmp_path / "toy.md")).read_text()
    assert page.startswith("# Toy study\n\n- Regenerate: ")
    assert page.index("Regenerate") < page.index("What the numbers") < page.index("| rope |")
    assert "CSV: [ppl.csv](ppl.csv)" in page and "![perplexity against length](ppl.png)" in page
    assert (tmp_path / "ppl.csv").exists()


@pytest.mark.parametrize("fields, message", [
    (dict(logx="yes"), "logx must be a bool, got 'yes'"),
    (dict(logy=1), "logy must be a bool, got 1"),
    (dict(title=3), "title must be None or a str, got 3"),
])
def test_plot_axes_reject_bad_fields_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        report.Axes(**fields)


def test_line_plot_refuses_axes_that_are_not_axes(rows, tmp_path):
    with pytest.raises(ValueError, match=r"axes must be a report.Axes, got \{'logx': True\}"):
        report.line_plot(rows, tmp_path / "x.png", x="eval.length", y="perplexity",
                         axes={"logx": True})
