"""The speculative-decoding study's configs and page: the default sweep is `medium` (the
quantization study's model) with a `small` row set, the pretrained-target config sweeps prompt
lookup and a draft trained on the target's tokenizer, the page renders each target's rows on a
page of its own, and it shows intervals and judges its claims by them where the rows keep
per-unit values."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment, report
from decodelab.experiment import presets
from decodelab.measure import stats
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
    assert [study.draft_seed({"config": c.to_dict()}) for c in reseeded] == [1] * 8
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


def test_the_page_renders_each_targets_rows_on_its_own_page(tmp_path):
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
    written = study.report(rows, tmp_path)
    assert {p.name for p in written} == {
        f"{name}{suffix}" for name in ("speculative", "speculative_small",
                                       "speculative_smollm2-135m")
        for suffix in (".md", ".csv", "_best.csv", "_speedup.png", "_tokens_per_call.png")}
    main = (tmp_path / "speculative.md").read_text()
    comparison = (tmp_path / "speculative_small.md").read_text()
    real = (tmp_path / "speculative_smollm2-135m.md").read_text()
    assert main.startswith("# Speculative decoding\n") and "Target: `medium`" in main
    # Rows without per-unit values: plain numbers, targets on the medians, nothing judged.
    old = ("not judged (the row keeps no per-prompt values, written by an earlier version of "
           "the study)")
    assert "No intervals: the rows keep no per-prompt values" in main
    assert "_low" not in (tmp_path / "speculative_best.csv").read_text()
    # The fake rows: speed-up 1.2 + 0.01 gamma, so 1.22 at the best gamma (2) of every group.
    assert (f"- **>= 2x with distilled draft, batch 1, temperature 0: not met on the median "
            f"alone; {old}** — 1.22x at gamma 2") in main
    assert (f"- **>= 1.5x with prompt lookup, batch 1, temperature 0: not met on the median "
            f"alone; {old}**") in main
    # measured / predicted with measured costs at gamma 2: 1.22 * 1.9 / 1.5 = 1.545.
    assert ("- **measured / predicted (measured costs) >= 0.85 at the best gamma of each drafter, "
            "batch and temperature: met** — 12 of 12 best points reach 0.85 (range 1.55 to "
            "1.55); 12 judged on the median alone (the row keeps no per-prompt values, written by "
            "an earlier version of the study).") in main
    assert (f"- **batch 8, temperature 0, faster than `generate` with the best drafter: met on "
            f"the median alone; {old}** — draft (trained) at gamma 2: 1.22x.") in main
    assert (f"- Temperature 0, batch 1, mean over gamma 1, 2: alpha 0.700 with the trained draft, "
            f"0.700 with the distilled one; distilled minus trained +0.000: {old}.") in main
    assert ("The verify pass over gamma + 1 tokens, in target decode steps (median over the "
            "points; the theory charges 1): at batch 1, 1.50 at gamma 1, 1.50 at gamma 2; at "
            "batch 8, 1.50 at gamma 1, 1.50 at gamma 2.") in main
    assert "the same preset distilled from the target for 300 steps" in main
    assert "at batch 1 the prompts run one after another, at batch 8 together" in main
    assert comparison.startswith("# Speculative decoding of `small` (comparison rows)\n")
    assert "Target: `small`" in comparison and "**>=" not in comparison
    # The default page sets each drafter's best batch-1 point beside the `small` target's (not
    # the pretrained target's, which has its own tokenizer and sweep).
    assert ("**Against the `small` target** (its page: [speculative_small.md]"
            "(speculative_small.md); the same drafters and sweep), best speed-up at batch 1 here "
            "against there: draft (trained) at temperature 0: 1.22x (gamma 2, c = 0.100) against "
            "1.22x (gamma 2, c = 0.100); ") in main
    assert main.count(" against 1.22x (gamma 2, c = 0.100)") == 6
    assert "smollm2" not in main and "Against the" not in comparison + real
    assert "Target: the pretrained `smollm2-135m`" in real
    assert "**>=" not in real and "distilled" not in real
    assert "trained on the corpus in the target's tokens" in real
    assert "plain text in the target's tokens" in real
    assert (tmp_path / "speculative_smollm2-135m.csv").read_text().count("\n") == 1 + 8


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


def test_the_page_shows_intervals_and_judges_the_targets_by_them(tmp_path):
    default = spec_config.get_config().to_dict()

    def row(drafter, temperature, batch):
        accepted = [5] * 8 if drafter == "ngram" else [7] * 8
        seconds = ([8.0], [6.4]) if batch == 8 else (
            ABOVE if (drafter, temperature) == ("distilled", 0.0) else
            STRADDLING if (drafter, temperature) == ("distilled", 0.7) else CONSTANT)
        return with_units(fake_row(default, drafter, 1, temperature, batch), accepted, *seconds)

    rows = [row(d, t, b) for d in ("draft", "distilled", "ngram") for t in (0.0, 0.7)
            for b in (1, 8)]
    study.report(rows, tmp_path)
    main = (tmp_path / "speculative.md").read_text()
    above, straddling = paired_speedup(ABOVE), paired_speedup(STRADDLING)
    assert (above.low > 2.0, straddling.low < 1.5 < straddling.high) == (True, True)
    assert ("- **>= 2x with distilled draft, batch 1, temperature 0: met** — "
            f"{above.value:.2f}x [{above.low:.2f}, {above.high:.2f}] at gamma 1 (120 vs 100 "
            "tokens/s; alpha 0.700 [0.700, 0.700], 1.50 [1.50, 1.50] tokens per call") in main
    undecided = report.verdict(straddling, threshold=1.5, above="met", below="not met",
                                units="prompts").text
    assert re.fullmatch(r"not distinguishable at this sample size \(about \d+ prompts would be "
                        r"needed\)", undecided)
    assert (f"- **>= 1.5x with distilled draft, batch 1, temperature 0.7: {undecided}** — "
            f"{straddling.value:.2f}x [{straddling.low:.2f}, {straddling.high:.2f}]") in main
    assert ("- **>= 1.5x with prompt lookup, batch 1, temperature 0: not met** — 1.25x "
            "[1.25, 1.25] at gamma 1") in main
    # measured / predicted with measured costs at gamma 1: speed-up * 1.8 / 1.5; batch 8 has one
    # batch, so no interval.
    one_batch = "its 8 prompts ran as one batch: one timed unit, nothing to resample"
    assert ("- **measured / predicted (measured costs) >= 0.85 at the best gamma of each drafter, "
            "batch and temperature: met** — 12 of 12 best points reach 0.85 (range 1.50 to "
            f"2.67); 6 judged on the median alone ({one_batch}).") in main
    assert ("- **batch 8, temperature 0, faster than `generate` with the best drafter: met on "
            f"the median alone; not judged ({one_batch})** — draft (trained) at gamma 1: "
            "1.25x.") in main
    assert "At batch 8 the 8 prompts run as one batch: its speed-ups have no interval." in main
    # The best table: measured / predicted is the speed-up's interval over the prediction (1.3,
    # and 1.5 / 1.8 with measured costs).
    cells = [report.format_value(x, "{:.3g}")
             for x in (above, scaled(above, 1 / 1.3), scaled(above, 1.8 / 1.5))]
    assert (f"| draft (distilled) | 1 | 0 | 1 | 0.7 [0.7, 0.7] | 0.1 | 1.5 | 0.2 | 1.5 [1.5, 1.5] "
            f"| {cells[0]} | 1.3 | {cells[1]} | 0.833 | {cells[2]} |") in main
    assert ("| draft (trained) | 8 | 0 | 1 | 0.7 [0.7, 0.7] | 0.1 | 1.5 | 0.2 | 1.5 [1.5, 1.5] | "
            "1.25 | 1.3 | 0.962 | 0.833 | 1.5 |") in main
    header = (tmp_path / "speculative_best.csv").read_text().splitlines()[0]
    assert "speed-up,speed-up_low,speed-up_high" in header


def test_the_distillation_claim_is_judged_by_a_paired_bootstrap_over_prompts(tmp_path):
    default = spec_config.get_config().to_dict()
    trained = [5, 6, 7, 8, 5, 6, 7, 8]
    distilled = {0.0: [a + 1 for a in trained],  # one more accepted proposal on every prompt
                 0.7: [6, 5, 8, 7, 5, 6, 7, 9]}  # noise: +1 in total over 8 prompts
    rows = [with_units(fake_row(default, d, g, t, 1),
                       trained if d == "draft" else distilled[t], *CONSTANT)
            for d in ("draft", "distilled") for g in (1, 2) for t in (0.0, 0.7)]
    study.report(rows, tmp_path)
    main = (tmp_path / "speculative.md").read_text()
    tested = np.full(8, 10.0)

    def alpha(accepted):  # both gammas hold the same counts: their mean is either one
        return report.format_value(
            stats.bootstrap(stats.ratio_of_sums, (np.asarray(accepted, float), tested)), "{:.3f}")

    assert (f"- Temperature 0, batch 1, mean over gamma 1, 2: alpha {alpha(trained)} with the "
            f"trained draft, {alpha(distilled[0.0])} with the distilled one; distilled minus "
            f"trained +0.100 [+0.100, +0.100] (paired over the 8 prompts): distillation raises "
            f"acceptance.") in main
    noise = stats.bootstrap_difference(stats.ratio_of_sums,
                                       (np.asarray(distilled[0.7], float), tested),
                                       (np.asarray(trained, float), tested))
    judged = report.verdict(noise, above="raises", below="lowers", units="prompts").text
    assert re.fullmatch(r"not distinguishable at this sample size \(about \d+ prompts would be "
                        r"needed\)", judged)
    assert (f"- Temperature 0.7, batch 1, mean over gamma 1, 2: alpha {alpha(trained)} with the "
            f"trained draft, {alpha(distilled[0.7])} with the distilled one; distilled minus "
            f"trained {report.format_value(noise, '{:+.3f}')} (paired over the 8 prompts): "
            f"{judged}.") in main


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
    written = study.report(rows + seed1, tmp_path)
    assert tmp_path / "speculative_seeds.csv" in written
    main = (tmp_path / "speculative.md").read_text()
    assert "- Temperature 0, batch 1, drafters trained from seed 0, mean over gamma 1, 2:" in main
    assert "distilled minus trained +0.100 [+0.100, +0.100] (paired over the 8 prompts): " \
           "distillation raises acceptance." in main
    assert re.search(r"- Temperature 0, batch 1, drafters trained from seed 1, mean over gamma 2:"
                     r".* distilled minus trained \+0\.000 \[\+0\.000, \+0\.000\] \(paired "
                     r"over the 8 prompts\): not distinguishable", main)
    low, high = (report.format_value(stats.bootstrap(
        stats.ratio_of_sums, (np.asarray(accepted, float), np.full(8, 10.0))), "{:.3f}")
        for accepted in (trained, [a + 1 for a in trained]))
    assert (f"- Seed spread, temperature 0, batch 1: draft (trained) at gamma 2: alpha {low} "
            f"(seed 0), {high} (seed 1), seed 1 minus seed 0 +0.100 [+0.100, +0.100] (paired "
            f"over the 8 prompts); draft (distilled) at gamma 2: alpha {high} (seed 0), {high} "
            f"(seed 1), seed 1 minus seed 0 +0.000 [+0.000, +0.000] (paired over the 8 "
            f"prompts).") in main
    # The grids and best tables hold seed 0 only; the seed-1 rows have a table of their own.
    assert (tmp_path / "speculative.csv").read_text().count("\n") == 1 + 6
    assert (tmp_path / "speculative_seeds.csv").read_text().count("\n") == 1 + 2
    assert "**The model drafters trained from seed 1** (the points above: seed 0)" in main
