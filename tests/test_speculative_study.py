"""The speculative-decoding study's configs and pages: the default sweep is `medium` (the
quantization study's model) with a `small` row set, the pretrained-target config sweeps prompt
lookup and a draft trained on the target's tokenizer, each target's rows render on a page of its
own in the one page form, and the pages show intervals and judge their claims by them where the
rows keep per-unit values. The rows are synthetic, built as the point function
(``measure.speculation.point_row``) writes them; no model is trained and nothing is timed."""

from __future__ import annotations

import copy
import re
import types

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment, report
from decodelab.experiment import presets
from decodelab.measure import speculation as measure
from decodelab.measure import stats
from decodelab.report import speculation as spec
from decodelab.report import speculation_page as prose
from decodelab.speculative import SpeculativeStats
from experiments import speculative as study

spec_config = config_module("speculative")


def quantization_config():
    return config_module("quantization").get_config()


def test_the_default_sweep_is_medium_with_a_small_row_set():
    points = experiment.expand(spec_config.get_config(), spec_config.get_sweep())
    medium = [p.config for p in points if p.config.target.model.d_model == 512]
    small = [p.config for p in points if p.config.target.model.d_model == 128]
    reseeded = [c for c in medium if c.draft.train.seed or c.distill_train.seed]
    medium = [c for c in medium if c not in reseeded]
    assert (len(points), len(medium), len(reseeded), len(small)) == (116, 72, 8, 36)
    assert {(c.drafter, c.batch_size, c.temperature, c.gamma) for c in medium} == {
        (d, b, t, g) for d in ("draft", "distilled", "ngram") for b in (1, 8) for t in (0.0, 0.7)
        for g in (1, 2, 3, 4, 6, 8)}
    # The second seed: of the drafter's own model only, at batch 1.
    assert {(c.drafter, c.batch_size, c.temperature, c.gamma, c.draft.train.seed,
             c.distill_train.seed) for c in reseeded} == {
        (d, 1, t, g, int(d == "draft"), int(d == "distilled")) for d in ("draft", "distilled")
        for t in (0.0, 0.7) for g in (2, 4)}
    assert [spec.draft_seed({"config": c.to_dict()}) for c in reseeded] == [1] * 8
    assert {(c.drafter, c.batch_size, c.temperature, c.gamma) for c in small} == {
        (d, 1, t, g) for d in ("draft", "distilled", "ngram") for t in (0.0, 0.7)
        for g in (1, 2, 3, 4, 6, 8)}
    vocab = medium[0].tokenizer.vocab_size
    assert presets.build_model_config(medium[0].target.model, vocab).num_params() == 27_271_680
    assert presets.build_model_config(small[0].target.model, vocab).num_params() == 1_377_408
    assert presets.build_model_config(medium[0].draft.model, vocab).num_params() == 368_960
    assert small[0].target.model.to_dict() == presets.model_section("small").to_dict()
    assert (medium[0].distill_train.steps, small[0].distill_train.steps) == (300, 800)
    assert (small[0].target.train.steps, small[0].draft.train.steps) == (800, 800)


def test_the_medium_target_is_the_quantization_studys_model():
    """Same tokenizer, model and training sections: the same cache key in a workdir, so the
    model trained for the quantization study is reused (the config's docstring says how)."""
    medium, quantization = spec_config.get_config(), quantization_config()
    assert medium.tokenizer.to_dict() == quantization.tokenizer.to_dict()
    assert medium.target.model.to_dict() == quantization.model.to_dict()
    assert medium.target.train.to_dict() == quantization.train.to_dict()


def test_a_config_argument_that_is_no_pretrained_model_is_refused():
    with pytest.raises(ValueError, match=r"the config argument must be empty or a pretrained "
                                         r"model, one of \['smollm2-135m'\]; got 'gpt-9'"):
        spec_config.get_config("gpt-9")


def test_the_smollm2_config_targets_the_real_model_with_a_draft_on_its_tokenizer(
        smollm2_installed):
    points = experiment.expand(spec_config.get_config("smollm2-135m"),
                               spec_config.get_sweep("smollm2-135m"))
    assert len(points) == 16
    config = points[0].config
    assert config.tokenizer.to_dict() == {"pretrained": "smollm2-135m"}
    assert config.target.model.pretrained == "smollm2-135m"
    assert not presets.is_pretrained(config.draft.model)
    assert {(p.config.drafter, p.config.batch_size) for p in points} == {("draft", 1),
                                                                        ("ngram", 1)}


def fake_row(config: dict, drafter: str, gamma: int, temperature: float, batch: int) -> dict:
    """A row as the runner writes one, with made-up but consistent metrics."""
    config = copy.deepcopy(config)
    config.update(drafter=drafter, gamma=gamma, temperature=temperature, batch_size=batch)
    alpha = 0.5 if drafter == "ngram" else 0.7
    metrics = {
        "drafter": drafter, "alpha": alpha, "tokens_per_call": 1.5,
        "expected_tokens_per_call": 1.6, "acceptance_by_position": "0.700", "c": 0.1,
        "target_step_ms": 10.0, "draft_step_ms": 1.0, "predicted_speedup": 1.3,
        "speedup": 1.2 + 0.01 * gamma, "target_tokens_per_s": 100.0,
        "speculative_tokens_per_s": 120.0, "target_s": 1.0, "speculative_s": 0.8,
        "round_ms": 5.0, "round_cost": 1.1, "compile_s": 1.0, "target_params": 2_000_000,
        "draft_params": 0 if drafter == "ngram" else 500_000, "load_1min": 1.0,
        "prediction_error": (1.2 + 0.01 * gamma) / 1.3 - 1.0, "verify_cost": 1.5,
        "propose_cost": 0.1 * gamma, "isolated_round_cost": 1.7 + 0.1 * gamma, "overhead": 0.2,
        "predicted_speedup_measured_costs": 1.5 / (1.7 + 0.1 * gamma),
        "prediction_error_measured_costs": (1.2 + 0.01 * gamma) * (1.7 + 0.1 * gamma) / 1.5 - 1,
    }
    return {"experiment": "speculative", "config": config, "config_hash": "x", "metrics": metrics,
            "start_time": "2026-12-01T00:00:00", "wall_time_s": 1.0,
            "provenance": {"cpu_count": 2, "command": "test"}}


def with_units(row: dict, accepted: list[int], target_s: list[float],
               speculative_s: list[float]) -> dict:
    """``row`` keeping per-unit values as the study writes them: ``accepted`` of 10 tested
    proposals per prompt (120 tokens in 80 target calls each), and each batch's seconds, the same
    in each of 3 repetitions; its alpha, tokens per call and speed-up recomputed from them."""
    m, n = row["metrics"], len(accepted)
    m.update(accepted_per_prompt=list(accepted), tested_per_prompt=[10] * n,
             generated_per_prompt=[120] * n, rounds_per_prompt=[80] * n,
             target_seconds_per_batch={f"r{i}": list(target_s) for i in range(3)},
             speculative_seconds_per_batch={f"r{i}": list(speculative_s) for i in range(3)},
             alpha=sum(accepted) / (10 * n), tokens_per_call=1.5,
             speedup=sum(target_s) / sum(speculative_s))
    m["prediction_error"] = m["speedup"] / m["predicted_speedup"] - 1
    m["prediction_error_measured_costs"] = (m["speedup"] / m["predicted_speedup_measured_costs"]
                                            - 1)
    return row


# Batch 1 seconds of each prompt (target, speculative): a speed-up of 2.22 whose interval lies
# above 2; one of 1.6 whose interval straddles 1.5; a constant 1.25.
ABOVE = [1.0] * 8, [0.4, 0.5] * 4
STRADDLING = [0.96] * 8, [0.4, 0.8] * 4
CONSTANT = [1.0] * 8, [0.8] * 8


def paired_speedup(seconds) -> stats.Interval:
    """The speed-up's interval written another way: with equal repetitions, the median of the
    totals is the total, so it is the ratio of mean seconds over the same batches, paired."""
    return stats.bootstrap_ratio(stats.mean, *map(np.asarray, seconds), paired=True)


def scaled(interval: stats.Interval, factor: float) -> stats.Interval:
    return stats.Interval(interval.value * factor, interval.low * factor,
                          interval.high * factor, interval.units)


def test_the_point_row_is_computed_from_the_counts_costs_and_timings():
    """``point_row``'s metrics: acceptance from the per-position counts of every batch, the
    predictions from the measured costs, speeds from the median seconds; the synthetic rows of
    these tests hold exactly its keys."""
    outputs = [types.SimpleNamespace(stats=SpeculativeStats(
        gamma=2, rounds=np.array([rounds]), generated=np.array([generated]),
        tested_by_position=np.array([tested]), accepted_by_position=np.array([accepted]),
        accepted_per_round=np.zeros((1, 4), int)))
        for rounds, generated, tested, accepted in ((5, 10, [4, 2], [3, 1]), (6, 6, [4, 0],
                                                                             [1, 0]))]
    costs = {"c": 0.1, "target_step": 0.01, "draft_step": 0.001, "verify_cost": 1.5,
             "propose_cost": 0.2, "isolated_round_cost": 1.9, "overhead": 0.2}
    timed = measure.Timed(target_s=2.0, speculative_s=1.0, first_s=3.0,
                          target_times=[[1.0, 1.0]], speculative_times=[[0.5, 0.5]])
    row = measure.point_row(outputs, costs, timed, 2, name="draft", params=(1000, 100),
                            load_1min=1.5)
    assert row["alpha"] == 5 / 10 and row["tokens_per_call"] == 16 / 11
    assert row["acceptance_by_position"] == "0.500 0.500"
    assert row["expected_tokens_per_call"] == pytest.approx(1 + 0.5 + 0.25, abs=1e-12)
    assert row["predicted_speedup"] == pytest.approx(1.75 / 1.2, abs=1e-12)
    assert row["predicted_speedup_measured_costs"] == pytest.approx(16 / 11 / 1.9, abs=1e-12)
    assert (row["speedup"], row["target_tokens_per_s"], row["compile_s"]) == (2.0, 8.0, 2.0)
    # Loop rounds are each batch's slowest row's: 5 + 6; a round is charged g c + 1 steps.
    assert row["round_ms"] == pytest.approx(1e3 / 11, abs=1e-9)
    assert row["round_cost"] == pytest.approx(1 / 11 / (1.2 * 0.01), abs=1e-9)
    assert (row["accepted_per_prompt"], row["tested_per_prompt"], row["rounds_per_prompt"]) == (
        [4, 1], [6, 4], [5, 6])
    assert row["speculative_seconds_per_batch"] == {"r0": [0.5, 0.5]}
    assert row["prediction_error"] == pytest.approx(2.0 / row["predicted_speedup"] - 1, abs=1e-12)
    synthetic = with_units(fake_row(spec_config.get_config().to_dict(), "draft", 1, 0.0, 1),
                           [7] * 8, *CONSTANT)
    assert set(synthetic["metrics"]) == set(row)


def render_all(rows, out_dir) -> dict[str, str]:
    """Every form of ``rows`` rendered into ``out_dir``: page name -> its markdown."""
    return {form.name: report.render(form, rows, out_dir).page.read_text()
            for form in study.forms(rows)}


def verdict_row(page: str, claim: str) -> str:
    """The verdict table's line of ``claim`` on ``page``."""
    lines = [line for line in page.splitlines() if line.startswith(f"| {claim} |")]
    assert len(lines) == 1, (claim, lines)
    return lines[0]


def test_each_targets_rows_render_on_a_page_of_its_own_in_the_page_form(tmp_path):
    default = spec_config.get_config().to_dict()
    small = copy.deepcopy(default)
    small["target"]["model"] = presets.model_section("small").to_dict()
    pretrained = copy.deepcopy(default)
    pretrained["tokenizer"] = {"pretrained": "smollm2-135m"}
    pretrained["target"]["model"]["pretrained"] = "smollm2-135m"
    rows = [fake_row(default, d, g, t, b) for d in ("draft", "distilled", "ngram")
            for g in (1, 2) for t in (0.0, 0.7) for b in (1, 8)]
    rows += [fake_row(small, d, g, t, 1) for d in ("draft", "distilled", "ngram")
             for g in (1, 2) for t in (0.0, 0.7)]
    rows += [fake_row(pretrained, d, g, t, 1) for d in ("draft", "ngram")
             for g in (1, 2) for t in (0.0, 0.7)]
    pages = render_all(rows, tmp_path)
    assert set(pages) == {"speculative", "speculative_small", "speculative_smollm2-135m"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{name}{suffix}" for name in pages for suffix in (".md", ".csv", ".png", "_best.csv",
                                                            "_points.csv")]
        + ["speculative_against_small.csv"])
    main, comparison, real = (pages[n] for n in ("speculative", "speculative_small",
                                                 "speculative_smollm2-135m"))
    assert main.startswith("# What speed-up do a trained draft, a distilled draft and prompt "
                           "lookup give the `medium` target, and does it follow the theory?\n")
    assert "- Target: `medium` (2,000,000 parameters, 1000 training steps)." in main
    # Rows without per-unit values: plain numbers, judged as point estimates, and the
    # distillation claim (a difference of means) not judged.
    assert "- No intervals: the rows keep no per-prompt values" in main
    # Rows that do not record other processes' CPU time: the load average alone, as shared.
    assert "the timed runs shared the machine with whatever else ran" in main
    quiet = [dict(r, other_cpu_s=0.01) for r in rows]
    assert ("- No other process shared the cores (up to 0.01 cores busy during a point, under "
            "the 0.25 that counts as sharing;") in render_all(quiet, tmp_path / "q")["speculative"]
    assert "_low" not in (tmp_path / "speculative_best.csv").read_text()
    # The fake rows: speed-up 1.2 + 0.01 gamma, so 1.22 at the best gamma (2) of every group.
    assert verdict_row(main, "speed-up >= 2x with draft (distilled), batch 1, temperature 0") \
        .endswith("| 1.22x | >= 2.00x | not met (point estimate, no interval) |")
    assert verdict_row(main, "speed-up >= 1.5x with prompt lookup, batch 1, temperature 0") \
        .endswith("| 1.22x | >= 1.50x | not met (point estimate, no interval) |")
    # measured / predicted with measured costs at gamma 2: 1.22 * 1.9 / 1.5 = 1.545.
    assert verdict_row(main, "measured / predicted (measured costs) >= 0.85 at the best gamma of "
                             "every drafter, batch and temperature (the lowest)") \
        .endswith("| 1.55 | >= 0.850 | met (point estimate, no interval) |")
    assert "- 12 of 12 best points reach 0.85 measured / predicted with measured costs (range " \
           "1.55 to 1.55)" in main
    assert verdict_row(main, "batch 8, temperature 0: faster than `generate` with the best "
                             "drafter").endswith("| 1.22x | >= 1.00x | met (point estimate, no "
                                                 "interval) |")
    assert verdict_row(main, "distillation raises acceptance (distilled minus trained draft's "
                             "alpha), batch 1, temperature 0").endswith("| n/a | >= 0 | not "
                                                                        "measured |")
    assert ("- Distillation at temperature 0, batch 1, mean over gamma 1, 2: alpha 0.700 with the "
            "trained draft, 0.700 with the distilled one; distilled minus trained 0.") in main
    assert ("The verify pass over gamma + 1 tokens, in target decode steps (median over the "
            "points; the theory charges 1): at batch 1, 1.50 at gamma 1, 1.50 at gamma 2; at "
            "batch 8, 1.50 at gamma 1, 1.50 at gamma 2.") in main
    assert "the same preset distilled from the target for 300 steps" in main
    assert "at batch 1 the prompts run one after another, at batch 8 together" in main
    # The fake rows' theory is nearer the speed-ups than the prediction with measured costs: the
    # medians over gamma 1 and 2 of |log(speed-up / prediction)|.
    theory = np.mean([abs(np.log((1.2 + 0.01 * g) / 1.3)) for g in (1, 2)])
    costs = np.mean([abs(np.log((1.2 + 0.01 * g) * (1.7 + 0.1 * g) / 1.5)) for g in (1, 2)])
    assert report.format_number(theory - costs) == "-0.336"
    assert verdict_row(main, "the speed-ups follow the prediction with measured costs more "
                             "closely than the theory's (median \\|log(measured / predicted)\\|, "
                             "the theory's minus the measured costs')").endswith(
        "| -0.336 | >= 0 | not met (point estimate, no interval) |")
    assert main.splitlines()[2] == ("At best speculative decoding runs 1.22x as fast as "
                                    "target-only decoding (draft (trained), batch 1, temperature "
                                    "0, gamma 2); 2 of 8 claims met, 4 not met, 2 undecided or not "
                                    "measured.")
    assert comparison.startswith("# What speed-up do the same drafters give the `small` target "
                                 "(comparison rows)?\n")
    assert "- Target: `small`" in comparison and "speed-up >= " not in comparison
    # The default page sets each drafter's best batch-1 point beside the `small` target's (not
    # the pretrained target's, which has its own tokenizer and sweep).
    assert ("- Against the `small` target (its page: [speculative_small.md]"
            "(speculative_small.md); the same drafters and sweep), the best batch-1 speed-up here "
            "against there: draft (trained) at temperature 0: 1.22x (gamma 2, c = 0.100) against "
            "1.22x (gamma 2, c = 0.100); ") in main
    assert main.count(" against 1.22x (gamma 2, c = 0.100)") == 6
    against = (tmp_path / "speculative_against_small.csv").read_text().splitlines()
    assert against[0] == ("drafter,temperature,speed-up here,gamma here,c here,speed-up there,"
                          "gamma there,c there") and len(against) == 1 + 6
    assert "smollm2" not in main and "Against the" not in comparison + real
    assert "- Target: the pretrained `smollm2-135m`" in real
    assert "speed-up >= " not in real and "distilled" not in real
    assert "trained on the corpus in the target's tokens" in real
    assert "plain text in the target's tokens" in real
    assert (tmp_path / "speculative_smollm2-135m_points.csv").read_text().count("\n") == 1 + 8
    for page in pages.values():
        assert "`python -m experiments.report --all` (this page)" in page
        assert page.index("## Method") < page.index("## Caveats") < page.index("## Provenance")


# Every column of the CSVs the pages wrote before the page form (results/speculative.csv,
# _best.csv and _seeds.csv, committed): each is still in some CSV of the page.
POINT_COLUMNS = ["drafter", "batch", "temperature", "gamma", "alpha", "tokens/call",
                 "expected tokens/call", "c", "v", "overhead", "speed-up", "predicted",
                 "measured / predicted", "predicted (measured costs)",
                 "measured / predicted (measured costs)", "round cost", "acceptance by position"]
BEST_COLUMNS = ["drafter", "batch", "temperature", "best gamma", "alpha", "c", "v", "overhead",
                "tokens/call", "speed-up", "predicted", "measured / predicted",
                "predicted (measured costs)", "measured / predicted (measured costs)"]


def interval_rows(default):
    def row(drafter, temperature, batch):
        accepted = [5] * 8 if drafter == "ngram" else [7] * 8
        seconds = ([8.0], [6.4]) if batch == 8 else (
            ABOVE if (drafter, temperature) == ("distilled", 0.0) else
            STRADDLING if (drafter, temperature) == ("distilled", 0.7) else CONSTANT)
        return with_units(fake_row(default, drafter, 1, temperature, batch), accepted, *seconds)

    return [row(d, t, b) for d in ("draft", "distilled", "ngram") for t in (0.0, 0.7)
            for b in (1, 8)]


def test_the_page_shows_intervals_and_judges_the_targets_by_them(tmp_path):
    rows = interval_rows(spec_config.get_config().to_dict())
    main = render_all(rows, tmp_path)["speculative"]
    above, straddling = paired_speedup(ABOVE), paired_speedup(STRADDLING)
    assert (above.low > 2.0, straddling.low < 1.5 < straddling.high) == (True, True)
    assert verdict_row(main, "speed-up >= 2x with draft (distilled), batch 1, temperature 0") == (
        f"| speed-up >= 2x with draft (distilled), batch 1, temperature 0 | "
        f"{prose.times(above)} | >= 2.00x | met |")
    undecided = report.Claim("x", lambda rows: straddling, 1.5, units="prompts").judge(rows)
    assert re.fullmatch(r"undecided \(about \d+ prompts would be needed\)", undecided.verdict.text)
    assert verdict_row(main, "speed-up >= 1.5x with draft (distilled), batch 1, temperature 0.7") \
        .endswith(f"| {prose.times(straddling)} | >= 1.50x | {undecided.verdict.text} |")
    assert verdict_row(main, "speed-up >= 1.5x with prompt lookup, batch 1, temperature 0") \
        .endswith("| 1.25x [1.25, 1.25] | >= 1.50x | not met |")
    # measured / predicted with measured costs at gamma 1: speed-up * 1.8 / 1.5, from 1.50 to
    # 2.67; batch 8 has one batch, so no interval: the lowest counts at its value, 1.50.
    assert verdict_row(main, "measured / predicted (measured costs) >= 0.85 at the best gamma of "
                             "every drafter, batch and temperature (the lowest)") \
        .endswith("| 1.50 [1.50, 1.50] | >= 0.850 | met |")
    assert "12 of 12 best points reach 0.85 measured / predicted with measured costs (range " \
           "1.50 to 2.67)" in main
    assert verdict_row(main, "batch 8, temperature 0: faster than `generate` with the best "
                             "drafter").endswith("| 1.25x | >= 1.00x | met (point estimate, no "
                                                 "interval) |")
    assert "At batch 8 the 8 prompts run as one batch: its speed-ups have no interval." in main
    # The main table: measured / predicted is the speed-up's interval over the prediction (1.5 /
    # 1.8 with measured costs).
    assert (f"| draft (distilled) | 1 | 0 | 1 | 0.700 [0.700, 0.700] | "
            f"{report.format_value(above)} | "
            f"{report.format_value(scaled(above, 1.8 / 1.5))} |") in main
    assert "| draft (trained) | 8 | 0 | 1 | 0.700 [0.700, 0.700] | 1.25 | 1.50 |" in main
    best = (tmp_path / "speculative_best.csv").read_text().splitlines()
    assert "speed-up,speed-up_low,speed-up_high" in best[0]
    assert f",{scaled(above, 1 / 1.3).value!r},{scaled(above, 1 / 1.3).low!r}," in "\n".join(best)


def test_the_pages_keep_every_column_of_the_csvs_they_wrote_before(tmp_path):
    default = spec_config.get_config().to_dict()
    rows = interval_rows(default)
    seed1 = copy.deepcopy(rows[0])
    seed1["config"]["draft"]["train"]["seed"] = 1
    render_all(rows + [seed1], tmp_path)
    columns = set()
    for path in tmp_path.glob("speculative*.csv"):
        columns |= set(path.read_text().splitlines()[0].split(","))
    split = {c for c in POINT_COLUMNS + BEST_COLUMNS if "," in c}
    assert not split and set(POINT_COLUMNS + BEST_COLUMNS) <= columns
    assert (tmp_path / "speculative_seeds.csv").read_text().splitlines()[0] == \
        (tmp_path / "speculative_points.csv").read_text().splitlines()[0]
    assert len((tmp_path / "speculative.csv").read_text().splitlines()[0].split(",")) <= 7 + 6


def test_the_distillation_claim_is_judged_by_a_paired_bootstrap_over_prompts(tmp_path):
    default = spec_config.get_config().to_dict()
    trained = [5, 6, 7, 8, 5, 6, 7, 8]
    distilled = {0.0: [a + 1 for a in trained],  # one more accepted proposal on every prompt
                 0.7: [6, 5, 8, 7, 5, 6, 7, 9]}  # noise: +1 in total over 8 prompts
    rows = [with_units(fake_row(default, d, g, t, 1),
                       trained if d == "draft" else distilled[t], *CONSTANT)
            for d in ("draft", "distilled") for g in (1, 2) for t in (0.0, 0.7)]
    main = render_all(rows, tmp_path)["speculative"]
    tested = np.full(8, 10.0)

    def alpha(accepted):  # both gammas hold the same counts: their mean is either one
        return report.format_value(
            stats.bootstrap(stats.ratio_of_sums, (np.asarray(accepted, float), tested)))

    claim = "distillation raises acceptance (distilled minus trained draft's alpha), batch 1, "
    assert verdict_row(main, claim + "temperature 0").endswith(
        "| 0.100 [0.100, 0.100] | >= 0 | met |")
    assert (f"- Distillation at temperature 0, batch 1, mean over gamma 1, 2: alpha "
            f"{alpha(trained)} with the trained draft, {alpha(distilled[0.0])} with the distilled "
            f"one; distilled minus trained 0.100 [0.100, 0.100] (paired over the 8 prompts).") \
        in main
    noise = stats.bootstrap_difference(stats.ratio_of_sums,
                                       (np.asarray(distilled[0.7], float), tested),
                                       (np.asarray(trained, float), tested))
    judged = report.Claim("x", lambda rows: noise, 0.0, units="prompts").judge(rows)
    assert re.fullmatch(r"undecided \(about \d+ prompts would be needed\)", judged.verdict.text)
    assert verdict_row(main, claim + "temperature 0.7").endswith(
        f"| {report.format_value(noise)} | >= 0 | {judged.verdict.text} |")
    assert (f"- Distillation at temperature 0.7, batch 1, mean over gamma 1, 2: alpha "
            f"{alpha(trained)} with the trained draft, {alpha(distilled[0.7])} with the distilled "
            f"one; distilled minus trained {report.format_value(noise)} (paired over the 8 "
            f"prompts).") in main


def test_a_second_drafter_seed_has_its_own_claim_and_spread_and_stays_out_of_the_grids(tmp_path):
    default = spec_config.get_config().to_dict()
    trained = [5, 6, 7, 8, 5, 6, 7, 8]

    def reseeded(row):
        field = row["config"]["draft"]["train"] if row["config"]["drafter"] == "draft" else (
            row["config"]["distill_train"])
        field["seed"] = 1
        return row

    rows = [with_units(fake_row(default, d, g, 0.0, 1),
                       trained if d == "draft" else [a + 1 for a in trained], *CONSTANT)
            for d in ("draft", "distilled", "ngram") for g in (1, 2)]
    # Seed 1: the trained draft accepts one more proposal on every prompt than at seed 0, and the
    # distilled one as many as the trained draft: no gain at this seed.
    seed1 = [reseeded(with_units(fake_row(default, d, 2, 0.0, 1), [a + 1 for a in trained],
                                 *CONSTANT)) for d in ("draft", "distilled")]
    forms = study.forms(rows + seed1)
    assert [f.name for f in forms] == ["speculative"] and "seeds" in forms[0].csvs
    main = report.render(forms[0], rows + seed1, tmp_path).page.read_text()
    claim = ("distillation raises acceptance (distilled minus trained draft's alpha), batch 1, "
             "temperature 0, drafters trained from seed ")
    assert verdict_row(main, claim + "0").endswith("| 0.100 [0.100, 0.100] | >= 0 | met |")
    assert re.search(r"\| 0 \[0, 0\] \| >= 0 \| undecided", verdict_row(main, claim + "1"))
    assert "- Distillation at temperature 0, batch 1, drafters trained from seed 1, mean over " \
           "gamma 2:" in main
    low, high = (report.format_value(stats.bootstrap(
        stats.ratio_of_sums, (np.asarray(accepted, float), np.full(8, 10.0))))
        for accepted in (trained, [a + 1 for a in trained]))
    assert (f"- Seed spread, temperature 0, batch 1: draft (trained) at gamma 2: alpha {low} "
            f"(seed 0), {high} (seed 1), seed 1 minus seed 0 0.100 [0.100, 0.100] (paired "
            f"over the 8 prompts); draft (distilled) at gamma 2: alpha {high} (seed 0), {high} "
            f"(seed 1), seed 1 minus seed 0 0 [0, 0] (paired over the 8 prompts).") in main
    # The table, plot and points CSV hold seed 0 only; the seed-1 rows have a CSV of their own.
    assert (tmp_path / "speculative_points.csv").read_text().count("\n") == 1 + 6
    assert (tmp_path / "speculative_seeds.csv").read_text().count("\n") == 1 + 2
    assert main.count("| draft (trained) | 1 | 0 |") == 1
    assert "The model drafters trained from seed 1 are kept out of the table and plot" in main
