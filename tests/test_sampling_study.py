"""The sampling study's page: rendered from rows alone (table, CSV, plot), with each claim's verdict
and numbers read from the rows. Synthetic rows; no model is trained."""

import csv
import math
import pathlib

import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment, report
from decodelab.report import quality

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _metrics(name: str, **changes) -> dict:
    human = name == "human"
    greedy = name.startswith(("greedy", "beam"))
    m = dict(strategy=name, samples=24 if human else 96, prompts=24, mean_length=64.0,
             eos_rate=0.0, ppl_generator=60.0, ppl_scorer=50.0, distinct_1=0.7, distinct_2=0.9,
             distinct_3=0.95, repetition_4=0.4 if greedy else 0.02,
             self_bleu=None if human else 100.0 if greedy else 5.0,
             identical_samples=None if human else 1.0 if greedy else 0.0, zipf=1.0,
             top1_rate=1.0 if greedy else 0.5, improbable_rate=0.3,
             candidates_p10=None if human or name.startswith("beam") else 10.0,
             candidates_median=None if human or name.startswith("beam") else 100.0,
             candidates_p90=None if human or name.startswith("beam") else 1000.0,
             candidates_mean=None, decode_s=1.0, generator_val_ppl=74.0, scorer_val_ppl=62.0,
             generator_params=1, scorer_params=2, example_prompt="To be", example="or not")
    for metric in ("compiles_generate_prefill", "compiles_generate_loop", "compiles_beam_prefill",
                   "compiles_beam_loop", "compiles_scoring", "compiles_token_stats"):
        m[metric] = 0
    m.update(changes)
    m["per_prompt"] = _per_prompt(m)
    return m


def _per_prompt(m: dict, prompts: int = 24) -> dict:
    """Per-prompt sums (quality.quality_row) whose ratios are exactly the row's metrics, each
    prompt off by a little zero-sum jitter (so intervals have a width)."""
    jitter = np.random.default_rng(len(m["strategy"])).normal(size=prompts)
    jitter = (jitter - jitter.mean()) / np.abs(jitter - jitter.mean()).max()  # in [-1, 1]
    samples = m["samples"] / prompts
    tokens = samples * m["mean_length"]

    def around(rate: float, size: float) -> list[float]:  # sums of a rate in [0, 1] over size
        return (size * (rate + 0.5 * min(rate, 1 - rate) * jitter)).tolist()

    per = {"samples": [samples] * prompts, "tokens": [tokens] * prompts,
           "eos": [m["eos_rate"] * samples] * prompts,
           "nll_generator": (tokens * (math.log(m["ppl_generator"]) + 0.1 * jitter)).tolist(),
           "nll_scorer": (tokens * (math.log(m["ppl_scorer"]) + 0.1 * jitter)).tolist(),
           "top1": around(m["top1_rate"], tokens),
           "improbable": around(m["improbable_rate"], tokens)}
    for n in (1, 2, 3, 4):
        distinct = 1 - m["repetition_4"] if n == 4 else m[f"distinct_{n}"]
        per[f"distinct_{n}"] = around(distinct, samples)
        per[f"ngram_samples_{n}"] = [samples] * prompts
    if m["self_bleu"] is not None:
        per["self_bleu"] = (100 * np.asarray(around(m["self_bleu"] / 100, 1.0))).tolist()
        per["identical"] = [m["identical_samples"]] * prompts
    return per


def _rows(changes: dict[str, dict]) -> list[dict]:
    module = config_module("sampling")
    points = experiment.expand(module.get_config(), module.get_sweep())
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    return [dict(experiment="sampling", config_hash=p.config_hash, seed=0, sweep_index=p.index,
                 overrides=p.overrides, config=p.config.to_dict(),
                 metrics=_metrics(p.config.decode.name, **changes.get(p.config.decode.name, {})),
                 start_time="2026-01-01T00:00:00+00:00", wall_time_s=1.0, provenance=provenance)
            for p in points]


@pytest.fixture(scope="module")
def study():
    from experiments import sampling

    return sampling


def render(study, rows, out):
    """The study's one page of ``rows`` (``forms``), written to ``out``: (written paths, text)."""
    (form,) = study.forms(rows)
    done = report.render(form, rows, out)
    return done.written, done.page.read_text()


def sides(study, rows) -> dict[str, int]:
    """Each claim's verdict (+1 met, -1 not met, 0 undecided or not measured), by its text."""
    return {claim.text: claim.judge(rows).verdict.side for claim in study.CLAIMS}


def side(judged: dict[str, int], start: str) -> int:
    (only,) = [value for text, value in judged.items() if text.startswith(start)]
    return only


def test_the_page_has_one_row_per_strategy_plus_human_a_csv_and_a_plot(study, tmp_path):
    rows = _rows({"greedy": dict(compiles_generate_loop=1), "beam 4": dict(compiles_beam_loop=1)})
    written, page = render(study, rows, tmp_path)
    assert {p.name for p in written} == {"sampling.md", "sampling.csv", "sampling.png",
                                         "sampling_all.csv", "sampling_points.csv"}
    lines = page.splitlines()
    assert lines[0] == "# What do the sampling strategies do to text, against human text?"
    assert lines[2].startswith("On the `small` model, ")
    # The main table: a strategy and six metrics with their intervals (the verdict table has 4).
    table = [line for line in lines if line.count("|") == 8 and "[" in line]
    assert len(table) == len(rows) == len(config_module("sampling").STRATEGIES)
    assert table[0].startswith("| human |")
    for name in ("sampling.csv", "sampling_all.csv", "sampling_points.csv"):
        with open(tmp_path / name) as f:
            assert len(list(csv.reader(f))) == len(rows) + 1
    assert "decode loop 1 for 25 sampling strategies" in page
    assert "loop 1 for 2" in page
    # The plot's legend-free encoding (report.quality.diversity_plot): strategies are blue
    # points, human text a crimson star; both must be drawn.
    pixels = matplotlib.image.imread(tmp_path / "sampling.png")[..., :3]
    for colour in ("tab:blue", "crimson"):
        rgb = np.asarray(matplotlib.colors.to_rgb(colour))
        assert (np.abs(pixels - rgb).max(axis=-1) < 0.02).any(), colour


def test_claim_verdicts_follow_the_numbers(study):
    holds = sides(study, _rows({"top-k 40": dict(candidates_p90=40.0)}))
    assert side(holds, "Greedy is deterministic") == 1
    assert side(holds, "Greedy is repetitive") == 1  # rep-4 0.40 against human's 0.02
    assert side(holds, "Low temperature is almost greedy") == -1  # top-1 0.5
    # The same numbers at temperatures 1.0 and 1.5, prompt by prompt: nothing to call.
    assert [value for text, value in holds.items()
            if text.startswith("High temperature is more random")] == [0, 0]
    assert side(holds, "Top-k keeps only the k most probable tokens") == 1
    assert side(holds, "Top-p is adaptive") == 1  # 1000 / 10 kept tokens
    changed = sides(study, _rows({"greedy": dict(repetition_4=0.03),
                                  "temperature 0.3": dict(top1_rate=0.95),
                                  "temperature 1.5": dict(self_bleu=9.0),
                                  "top-k 40": dict(improbable_rate=0.1),
                                  "top-p 0.95": dict(candidates_p10=50.0, candidates_p90=60.0)}))
    assert side(changed, "Greedy is deterministic") == 1
    assert side(changed, "Greedy is repetitive") == -1  # deterministic only
    assert side(changed, "Low temperature is almost greedy") == 1
    assert side(changed, "High temperature is more random: self-BLEU") == -1
    assert side(changed, "Top-k keeps only the k most probable tokens") == -1  # 1000 kept
    assert side(changed, "Top-k avoids improbable words") == 1  # 0.1 against 0.3
    assert side(changed, "Top-p is adaptive") == -1


def test_a_claim_whose_strategy_has_no_row_is_not_measured(study):
    rows = [r for r in _rows({}) if r["metrics"]["strategy"] != "temperature 1.5"]
    judged = [claim.judge(rows) for claim in study.CLAIMS]
    assert [j.verdict.text for j in judged if "1.5" in j.claim.text] == ["not measured"] * 2


def test_the_table_shows_intervals_over_prompts_and_the_csv_their_bounds(study, tmp_path):
    _, page = render(study, _rows({}), tmp_path)
    greedy = next(line for line in page.splitlines() if line.startswith("| greedy |"))
    assert "| 0.400 [0.37" in greedy  # rep-4 with its interval
    assert "Brackets: 95% percentile bootstrap intervals over the 24 prompts" in page
    with open(tmp_path / "sampling_all.csv") as f:
        header = next(csv.reader(f))
    assert header[header.index("repetition_4"):header.index("repetition_4") + 3] == [
        "repetition_4", "repetition_4_low", "repetition_4_high"]


def test_rows_without_per_prompt_values_still_render_and_say_so(study, tmp_path):
    rows = _rows({})
    for row in rows:
        del row["metrics"]["per_prompt"]
    _, page = render(study, rows, tmp_path)
    assert "No intervals: the rows keep no per-prompt values" in page
    assert "[" not in next(line for line in page.splitlines() if line.startswith("| greedy |"))
    repetitive = next(line for line in page.splitlines()
                      if line.startswith("| Greedy is repetitive"))
    assert repetitive.endswith("| 20.0x | >= 2.00x | met (point estimate, no interval) |")


def test_plot_labels_are_short():
    assert quality.short_label("t 1.0 + top-k 40 + top-p 0.95") == "t1.0+k40+p0.95"
    assert quality.short_label("beam 4, no early EOS") == "beam4 no-EOS"
    assert quality.short_label("min-p 0.1") == "minp0.1"


def test_the_kept_rows_render_the_smollm2_page_with_their_numbers(study, tmp_path):
    rows = report.load_rows(ROOT / "results" / "rows" / "sampling_smollm2")
    written, page = render(study, rows, tmp_path)
    assert {p.name for p in written} == {
        "sampling_smollm2-135m.md", "sampling_smollm2-135m.csv", "sampling_smollm2-135m.png",
        "sampling_smollm2-135m_all.csv", "sampling_smollm2-135m_points.csv"}
    lines = page.splitlines()
    assert lines[2].startswith(
        "On `smollm2-135m`, 12 of 16 claims met, 3 not met, 1 undecided or not measured")
    assert ("| Greedy is repetitive: its rep-4 over human text's, paired by prompt | "
            "40.4x [15.2, 576] | >= 2.00x | met |") in lines
    assert any(line.startswith("| Low temperature is almost greedy") and
               "| 0.898 [0.883, 0.914] | >= 0.900 | undecided" in line for line in lines)
    assert any(line.startswith("| High temperature is more random: self-BLEU") and
               "| -1.56 [-2.31, -1.04] | <= 0 | met |" in line for line in lines)
    assert "| greedy | 2.09 [1.86, 2.37] | 0.522 [0.405, 0.634] | 0.442 [0.321, 0.571] |" in page
    assert "| temperature 1.5 | 8,090 [7,240, 8,930] |" in page
    assert "decode loop 14 for 25 sampling strategies" in page


def test_an_unknown_config_argument_is_refused():
    with pytest.raises(ValueError, match="config argument must be empty or a pretrained model"):
        config_module("sampling").get_config("medium")


@pytest.fixture
def pretrained_config(smollm2_installed):
    return config_module("sampling").get_config(smollm2_installed)


def test_the_pretrained_variant_generates_and_scores_with_the_real_model_from_chat_prompts(
        pretrained_config):
    config = pretrained_config
    assert config.generator.model.pretrained == config.scorer.model.pretrained == "smollm2-135m"
    assert config.generator.to_dict() == config.scorer.to_dict()
    assert config.prompts.instruction == config_module("sampling").INSTRUCTION
    assert "instruction" not in config_module("sampling").get_config().prompts


def test_the_pretrained_variants_page_names_the_model_and_its_chat_prompts(study, tmp_path,
                                                                           pretrained_config):
    config = pretrained_config
    module = config_module("sampling")
    points = experiment.expand(config, module.get_sweep())
    provenance = dict.fromkeys(experiment.PROVENANCE_FIELDS, "x")
    rows = [dict(experiment="sampling", config_hash=p.config_hash, seed=0, sweep_index=p.index,
                 overrides=p.overrides, config=p.config.to_dict(),
                 metrics=_metrics(p.config.decode.name), start_time="2026-01-01T00:00:00+00:00",
                 wall_time_s=1.0, provenance=provenance) for p in points]
    written, page = render(study, rows, tmp_path)
    # Files of its own, beside the default study's sampling.*.
    assert {p.name for p in written} == {
        "sampling_smollm2-135m.md", "sampling_smollm2-135m.csv", "sampling_smollm2-135m.png",
        "sampling_smollm2-135m_all.csv", "sampling_smollm2-135m_points.csv"}
    assert page.startswith("# What do the sampling strategies do to text, against human text, "
                           "on the pretrained `smollm2-135m`?")
    assert "[sampling_smollm2-135m.csv](sampling_smollm2-135m.csv)" in page
    assert "The pretrained instruct model `smollm2-135m`" in page
    assert module.INSTRUCTION in page
