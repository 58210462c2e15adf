"""The page form: claims as data judged against intervals, 3 significant figures in plain notation,
a page in the one form, and the index of every claim."""

import pathlib

import pytest

from decodelab import report
from decodelab.measure.stats import Interval

ROWS = [
    {"experiment": "toy", "config": {"model": {"preset": preset}}, "config_hash": preset,
     "overrides": {"model.preset": preset}, "start_time": "2026-12-03T10:00:00+00:00",
     "wall_time_s": 2.0, "provenance": {"command": "python -m experiments.toy"},
     "metrics": {"speedup": speedup, "low": low, "high": high}}
    for preset, speedup, low, high in (("tiny", 2.0, 1.8, 2.2), ("small", 1.2, 0.9, 1.6))
]


def interval(row):
    m = row["metrics"]
    return Interval(m["speedup"], m["low"], m["high"], units=5)


@pytest.mark.parametrize("x, text", [(10300.0, "10,300"), (1.03e4, "10,300"), (123456.0, "123,000"),
                                     (0.000123, "0.000123"), (0.0123, "0.0123"), (12.345, "12.3"),
                                     (999.6, "1,000"), (0.5, "0.500"), (-2.5e5, "-250,000"),
                                     (0.0, "0"), (float("nan"), "nan")])
def test_numbers_carry_3_significant_figures_in_plain_notation(x, text):
    assert report.format_number(x) == text
    assert "e" not in report.format_value(x).replace("nan", "")


def test_a_claim_is_met_only_when_its_whole_interval_is_on_the_claimed_side():
    at_least = report.Claim("tiny >= 1.5x", report.on_row(interval, model__preset="tiny"), 1.5,
                            units="repetitions", unit="x")
    undecided = report.Claim("small >= 1.5x", report.on_row(interval, model__preset="small"), 1.5,
                             units="repetitions")
    at_most = report.Claim("tiny <= 1.5x", report.on_row(interval, model__preset="tiny"), 1.5,
                           at_least=False)
    missing = report.Claim("medium >= 1x", report.on_row(interval, model__preset="medium"), 1.0)
    judged = [c.judge(ROWS) for c in (at_least, undecided, at_most, missing)]
    assert [j.verdict.side for j in judged] == [1, 0, -1, 0]
    assert [j.verdict.text.split(" (")[0] for j in judged] == ["met", "undecided", "not met",
                                                               "not measured"]
    assert judged[0].measured == Interval(2.0, 1.8, 2.2, units=5)


def test_a_point_estimate_is_judged_and_says_it_has_no_interval():
    claim = report.Claim("tiny >= 3x", lambda rows: 2.0, 3.0)
    assert claim.judge(ROWS).verdict == report.Verdict(-1, "not met (point estimate, no interval)")


@pytest.mark.parametrize("kwargs, message", [
    (dict(text=""), "text must say"), (dict(quantity=3), "quantity must be a function"),
    (dict(threshold="1"), "threshold must be a number")])
def test_a_bad_claim_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        report.Claim(**{"text": "x", "quantity": lambda rows: 1.0, "threshold": 1.0, **kwargs})


def form(**changes):
    fields = dict(
        name="toy", question="How much faster is the toy?",
        claims=[report.Claim(f"{p} >= 1.5x", report.on_row(interval, model__preset=p), 1.5,
                             units="repetitions", unit="x") for p in ("tiny", "small")],
        answer=lambda judged, rows: f"Faster where it can be told: {report.tally(judged)}.",
        table=lambda rows: report.Table(["preset", "speed-up"],
                                        [[r["config"]["model"]["preset"], interval(r)]
                                         for r in rows]),
        method=["Speed-ups are medians over 5 repetitions."],
        caveats=["Random weights."], command="python -m experiments.report --all",
        csvs={"all": report.points_table})
    return report.Form(**{**fields, **changes})


def test_a_page_follows_the_form(tmp_path):
    done = report.render(form(), ROWS, tmp_path)
    text = done.page.read_text()
    lines = text.splitlines()
    assert lines[0] == "# How much faster is the toy?"
    assert lines[2] == "Faster where it can be told: 1 of 2 claims met, 1 undecided or not measured."
    assert lines[4] == "| claim | measured [interval] | threshold | verdict |"
    assert "| tiny >= 1.5x | 2.00x [1.80, 2.20] | >= 1.50x | met |" in text
    assert "| tiny | 2.00 [1.80, 2.20] |" in text
    assert text.index("## Method") < text.index("## Caveats") < text.index("## Provenance")
    assert "`python -m experiments.report --all` (this page)" in text
    assert sorted(p.name for p in done.written) == ["toy.csv", "toy.md", "toy_all.csv"]
    assert (tmp_path / "toy.csv").read_text().startswith("preset,speed-up,speed-up_low")


def test_a_page_s_provenance_counts_its_own_rows_only(tmp_path):
    """Two pages rendered from one workdir: each names its own points and wall time, not the
    workdir's (the claims and tables still see every row)."""
    text = report.render(form(), ROWS, tmp_path).page.read_text()
    assert "2 points run" in text and "4.0 s of point wall time" in text
    tiny = form(own_rows=lambda rows: [r for r in rows if r["config_hash"] == "tiny"])
    text = report.render(tiny, ROWS, tmp_path).page.read_text()
    assert "1 points run" in text and "2.0 s of point wall time" in text
    assert "| small | 1.20 [0.900, 1.60] |" in text
    with pytest.raises(ValueError, match="own_rows of 'toy' must select some of the 2 rows"):
        report.render(form(own_rows=lambda rows: []), ROWS, tmp_path)


def test_a_page_refuses_a_main_table_of_more_than_7_columns_and_a_long_method(tmp_path):
    wide = form(table=lambda rows: report.Table([f"c{i}" for i in range(8)], [list(range(8))]))
    with pytest.raises(ValueError, match="at most 7 columns, got 8"):
        report.render(wide, ROWS, tmp_path)
    with pytest.raises(ValueError, match="method must be at most 8 lines, got 9"):
        form(method=["a line"] * 9)
    with pytest.raises(ValueError, match="question must be a question"):
        form(question="Toy speed")


def test_the_index_lists_every_claim_with_its_verdict_and_a_link(tmp_path):
    done = report.render(form(), ROWS, tmp_path)
    index = report.write_index([done], tmp_path, command="python -m experiments.report --all",
                               pending=[("old.md", "its rows are not kept")])
    text = index.read_text()
    assert "## [How much faster is the toy?](toy.md)" in text
    assert "| small >= 1.5x | 1.20x [0.900, 1.60] | >= 1.50x | undecided" in text
    assert "- [old.md](old.md): its rows are not kept" in text
    assert pathlib.Path(index).name == "README.md"
