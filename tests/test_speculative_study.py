"""The speculative-decoding study's configs and page: the default sweep is `medium` (the
quantization study's model) with a `small` row set, the pretrained-target config sweeps prompt
lookup and a draft trained on the target's tokenizer, and the page renders each target's rows on a
page of its own."""

from __future__ import annotations

import copy

import pytest

from decodelab import experiment, presets
from experiments import speculative as study
from study_config import config_module


spec_config = config_module("speculative")


def quantization_config():
    return config_module("quantization").get_config()


def test_the_default_sweep_is_medium_with_a_small_row_set():
    points = experiment.expand(spec_config.get_config(), spec_config.get_sweep())
    medium = [p.config for p in points if p.config.target.model.d_model == 512]
    small = [p.config for p in points if p.config.target.model.d_model == 128]
    assert (len(points), len(medium), len(small)) == (108, 72, 36)
    assert {(c.drafter, c.batch_size, c.temperature, c.gamma) for c in medium} == {
        (d, b, t, g) for d in ("draft", "distilled", "ngram") for b in (1, 8) for t in (0.0, 0.7)
        for g in (1, 2, 3, 4, 6, 8)}
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
    # The fake rows: speed-up 1.2 + 0.01 gamma, so 1.22 at the best gamma (2) of every group.
    assert ("- **>= 2x with distilled draft, batch 1, temperature 0: not met** — 1.22x at "
            "gamma 2") in main
    assert "- **>= 1.5x with prompt lookup, batch 1, temperature 0: not met**" in main
    # measured / predicted with measured costs at gamma 2: 1.22 * 1.9 / 1.5 = 1.545.
    assert ("- **measured / predicted (measured costs) >= 0.85 at the best gamma of each drafter, "
            "batch and temperature: met** — 12 of 12 best points reach 0.85 (range 1.55 to "
            "1.55).") in main
    assert ("- **batch 8, temperature 0, faster than `generate` with the best drafter: met** — "
            "draft (trained) at gamma 2: 1.22x.") in main
    assert "the same preset distilled from the target for 300 steps" in main
    assert "at batch 1 the prompts run one after another, at batch 8 together" in main
    assert comparison.startswith("# Speculative decoding of `small` (comparison rows)\n")
    assert "Target: `small`" in comparison and "**>=" not in comparison
    assert "Target: the pretrained `smollm2-135m`" in real
    assert "**>=" not in real and "distilled" not in real
    assert "trained on the corpus in the target's tokens" in real
    assert "plain text in the target's tokens" in real
    assert (tmp_path / "speculative_smollm2-135m.csv").read_text().count("\n") == 1 + 8
