"""The extrapolation study's sweep (three seeds for the encodings the claims rest on) and its page:
intervals over windows, claims judged by them, the seed spread, and rows of an earlier version
(no per-window values) still rendered. Synthetic rows; no model is trained."""

import csv
import math
import pathlib

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment, report

ROOT = pathlib.Path(__file__).resolve().parents[1]

WINDOWS = 40
L = 128
# Tail perplexity per encoding at factors 1, 2, 4, 8 (None: no value), for seed 0.
TAIL = {"learned": (70.0, None, None, None), "sinusoidal": (64.0, 120.0, 133.0, 126.5),
        "t5": (61.0, 65.0, 81.0, 99.0), "alibi": (58.7, 57.2, 57.6, 60.0),
        "rope": (56.0, 66.0, 98.0, 126.0), "nope": (75.0, 81.0, 90.0, 97.0),
        "rope+linear": (None, 83.0, 110.0, 128.0), "rope+ntk": (None, 58.0, 82.0, 129.0),
        "rope+yarn": (None, 60.0, 66.0, 70.0)}
# Where another seed's model differs from seed 0's by more than one point: NTK at 2L hurts seed 2.
OTHER_SEED = {(2, "rope+ntk", 2): 75.0}


def _windows(ppl: float, factor: int, label: str, seed: int) -> list[float]:
    """Per-window NLL sums whose pooled perplexity is exactly ``ppl``: a difficulty per window
    shared by every encoding at this factor (so pairing cancels it) plus a little of its own."""
    shared = np.random.default_rng(factor).normal(0.0, 20.0, WINDOWS)
    own = np.random.default_rng([factor, seed, len(label), ord(label[-1])]).normal(0.0, 2.0,
                                                                                  WINDOWS)
    nll = shared + own
    return (nll - nll.mean() + L * math.log(ppl)).tolist()


def _metrics(label: str, factor: int, seed: int, windows: bool) -> dict:
    ppl = TAIL[label][[1, 2, 4, 8].index(factor)]
    ppl = None if ppl is None else ppl + seed  # other seeds: one point higher per seed
    ppl = OTHER_SEED.get((seed, label, factor), ppl)
    m = dict(encoding=label, factor=factor, context_len=L * factor, tokens=WINDOWS * L,
             perplexity=ppl, tail_perplexity=ppl, bits_per_char=None, tail_tokens=WINDOWS * L,
             note="" if ppl else "n/a")
    if windows and ppl is not None:
        m.update(window_nll=_windows(ppl, factor, label, seed), window_tokens=L,
                 tail_window_nll=_windows(ppl, factor, label, seed), tail_window_tokens=L)
    return m


def _rows(windows: bool = True) -> list[dict]:
    module = config_module("extrapolation")
    points = experiment.expand(module.get_config(), module.get_sweep())
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    rows = []
    for p in points:
        scaling = p.config.eval.rope_scaling
        label = p.config.model.position + ("" if scaling == "none" else f"+{scaling}")
        rows.append(dict(experiment="extrapolation", config_hash=p.config_hash,
                         seed=p.config.seed, sweep_index=p.index, overrides=p.overrides,
                         config=p.config.to_dict(),
                         metrics=_metrics(label, p.config.eval.factor, p.config.train.seed,
                                          windows),
                         start_time="2026-01-01T00:00:00+00:00", wall_time_s=1.0,
                         provenance=provenance))
    return rows


@pytest.fixture(scope="module")
def study():
    from experiments import extrapolation

    return extrapolation


def render(study, rows, out):
    """The study's one page of ``rows`` (``forms``), written to ``out``: (written paths, text)."""
    (form,) = study.forms(rows)
    done = report.render(form, rows, out)
    return done.written, done.page.read_text()


@pytest.fixture(scope="module")
def page(study, tmp_path_factory):
    out = tmp_path_factory.mktemp("extrapolation")
    written, text = render(study, _rows(), out)
    return out, written, text


def verdict_line(text: str, claim: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {claim}"))


def read_csv(path) -> list[list[str]]:
    with open(path) as f:
        return list(csv.reader(f))


def test_the_sweep_trains_four_encodings_with_three_seeds_and_keeps_the_first_seeds_points():
    module = config_module("extrapolation")
    points = experiment.expand(module.get_config(), module.get_sweep())
    seeds: dict[str, set] = {}
    for p in points:
        seeds.setdefault(p.config.model.position, set()).add(p.config.train.seed)
    assert seeds == {"learned": {0}, "nope": {0}, "sinusoidal": {0, 1, 2}, "t5": {0, 1, 2},
                     "alibi": {0, 1, 2}, "rope": {0, 1, 2}}
    # A workdir of the seed-0 sweep resumes into this one: its points come first, same hashes.
    first = [p for p in points if p.config.train.seed == 0]
    assert [p.index for p in first] == list(range(len(first))) and len(first) == 33
    assert "train.seed" not in first[0].overrides
    # Then one model at a time: each further (seed, encoding)'s points are contiguous.
    models = [(p.config.train.seed, p.config.model.position) for p in points[len(first):]]
    assert len(set(models)) == len([m for i, m in enumerate(models) if i == 0 or m != models[i - 1]])
    assert len(points) == 83


def test_tables_show_each_value_with_its_window_interval(page):
    out, written, text = page
    assert {p.name for p in written} == {
        "extrapolation.md", "extrapolation.csv", "extrapolation.png", "extrapolation_whole.csv",
        "extrapolation_growth.csv", "extrapolation_seeds.csv", "extrapolation_claims.csv",
        "extrapolation_points.csv"}
    line = next(line for line in text.splitlines() if line.startswith("| alibi | 58.7 ["))
    assert line.count("[") == 4 and "n/a" not in line
    assert next(line for line in text.splitlines() if line.startswith("| learned |")).endswith(
        "| n/a | n/a | n/a |")
    for name in ("extrapolation.csv", "extrapolation_whole.csv"):
        header, *body = read_csv(out / name)
        assert header[:4] == ["encoding \\ context_len", "128", "128_low", "128_high"]
        alibi = next(r for r in body if r[0] == "alibi")
        assert float(alibi[1]) == pytest.approx(58.7, rel=1e-12)
        assert float(alibi[2]) < 58.7 < float(alibi[3])


def test_claims_are_called_only_when_the_interval_excludes_the_threshold(page):
    out, _, text = page
    # RoPE 56 -> 126: its ratio's interval lies far above 1, on every seed. ALiBi 58.7 -> 60.0:
    # straddles 1.
    rope = verdict_line(text, "rope's tail perplexity grows from L to 8L")
    assert "| 2.25x [" in rope and rope.endswith("| >= 1.00x | met on every seed (seeds 0, 1, 2) |")
    growth = {(r[0], r[1]): r for r in read_csv(out / "extrapolation_growth.csv")[1:]}
    assert [round(float(growth["rope", s][4]), 2) for s in "012"] == [2.25, 2.23, 2.21]
    assert growth["rope", "0"][:4] == ["rope", "0", "56.0", "126.0"]
    assert growth["learned", "0"][3:] == ["", "", "", "", "n/a"]
    assert verdict_line(text, "alibi's tail perplexity grows").endswith(
        "| undecided on every seed (seeds 0, 1, 2) |")
    assert verdict_line(text, "nope's tail perplexity grows").endswith("| met |")  # one seed
    # RoPE 126 and sinusoidal 126.5 at 8L: their paired difference straddles 0 on every seed.
    same = verdict_line(text, "RoPE degrades at least as badly as sinusoidal")
    assert "| -0.500 [" in same
    assert same.endswith("| undecided on every seed (seeds 0, 1, 2) |")
    claims = read_csv(out / "extrapolation_claims.csv")
    per_seed = [r for r in claims if r[0].startswith("RoPE degrades")]
    assert [(r[1], round(float(r[2]), 1)) for r in per_seed] == [("0", -0.5), ("1", -0.5),
                                                                ("2", -0.5)]
    assert all(r[-1].startswith("undecided (about ") for r in per_seed)
    # YaRN 70 against RoPE 126 at 8L, on the same windows: called on every seed.
    assert verdict_line(text, "YaRN recovers").endswith("| met on every seed (seeds 0, 1, 2) |")
    # NTK at 2L helps seeds 0 and 1 and hurts seed 2: the claim is not called.
    assert verdict_line(text, "NTK-aware scaling").endswith(
        "| seeds disagree: met (seeds 0, 1); not met (seed 2) |")
    best = verdict_line(text, "RoPE has the lowest tail perplexity at L")
    assert "| 2.70 [" in best and best.endswith("| met on every seed (seeds 0, 1, 2) |")
    lowest = [r for r in claims if r[0].startswith("RoPE has the lowest")]
    assert [round(float(r[2]), 1) for r in lowest] == [2.7, 2.7, 2.7]
    assert text.splitlines()[2].startswith(
        "Past the training length L, only alibi holds its tail perplexity from L to 8L")


def test_the_seed_spread_sits_beside_the_window_interval(page):
    out, _, text = page
    header, *body = read_csv(out / "extrapolation_seeds.csv")
    assert header == ["encoding", "context_len", "seeds", "mean", "min", "max", "seed range",
                      "seed 0 window 95% width"]
    rope_8l = next(r for r in body if r[:2] == ["rope", "1024"])
    assert rope_8l[2:7] == ["0, 1, 2", "127.0", "126.0", "128.0", "2.0"]
    assert float(rope_8l[7]) > 0
    assert {r[0] for r in body} == {"sinusoidal", "t5", "alibi", "rope", "rope+linear",
                                    "rope+ntk", "rope+yarn"}
    caveat = next(line for line in text.splitlines() if "(`extrapolation_seeds.csv`)" in line)
    assert "rope 2.00 against " in caveat


def test_rows_without_per_window_values_still_render_and_say_so(study, tmp_path):
    _, text = render(study, _rows(windows=False), tmp_path)
    assert "No intervals: the rows keep no per-window values" in text
    assert "| alibi | 58.7 | 57.2 | 57.6 | 60.0 |" in text
    assert verdict_line(text, "YaRN recovers").endswith(
        "| met (point estimate, no interval) on every seed (seeds 0, 1, 2) |")


def test_the_kept_rows_render_the_page_with_their_numbers(study, tmp_path):
    rows = report.load_rows(ROOT / "results" / "rows" / "extrapolation")
    _, text = render(study, rows, tmp_path)
    lines = text.splitlines()
    assert lines[2] == ("Past the training length L, only alibi holds its tail perplexity from L "
                        "to 8L (no growth the windows can see, on every seed); sinusoidal, t5, "
                        "rope and nope degrade: 10 of 12 claims met, 2 undecided or not "
                        "measured.")
    assert ("| alibi | 58.7 [56.9, 60.7] | 57.2 [55.3, 59.2] | 57.6 [55.8, 59.4] | "
            "57.7 [55.8, 59.5] |") in lines
    assert verdict_line(text, "rope's tail perplexity grows").endswith(
        "| 2.24x [2.15, 2.34] | >= 1.00x | met on every seed (seeds 0, 1, 2) |")
    assert verdict_line(text, "RoPE degrades at least as badly as sinusoidal").endswith(
        "| -18.5 [-20.3, -16.6] | >= 0 | seeds disagree: not met (seeds 0, 1); met (seed 2) |")
    assert verdict_line(text, "YaRN recovers").endswith(
        "| -55.2 [-57.0, -53.4] | <= 0 | met on every seed (seeds 0, 1, 2) |")
