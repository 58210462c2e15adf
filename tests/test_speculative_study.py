"""The speculative-decoding study's configs and page: the default sweep is the one the committed
page was rendered from, the pretrained-target config sweeps prompt lookup and a draft trained on the target's
tokenizer, and the page renders each target's rows on a page of its own."""

from __future__ import annotations

import copy
import csv
import importlib.util
import pathlib

import pytest

from decodelab import experiment, presets
from experiments import speculative as study

CONFIG_FILE = pathlib.Path(__file__).parents[1] / "configs" / "speculative.py"
RESULTS = pathlib.Path(__file__).parents[1] / "results"


def config_module():
    spec = importlib.util.spec_from_file_location("speculative_config", CONFIG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


spec_config = config_module()


def test_the_default_sweep_is_the_one_the_committed_page_was_rendered_from():
    points = experiment.expand(spec_config.get_config(), spec_config.get_sweep())
    with open(RESULTS / "speculative.csv", newline="") as f:
        committed = [(r["drafter"], int(r["batch"]), float(r["temperature"]), int(r["gamma"]))
                     for r in csv.DictReader(f)]
    swept = [(study.DRAFTER_LABELS[p.config.drafter], p.config.batch_size, p.config.temperature,
              p.config.gamma) for p in points]
    assert len(swept) == len(committed) == 144
    assert set(swept) == set(committed)
    # What the committed page states about every point: "Target: `small` (1,377,408 parameters,
    # 800 training steps) ... the `draft` preset (368,960 parameters) trained on the corpus for
    # 800 steps ... 8 prompts of 32 tokens ..., 128 new tokens each".
    base = points[0].config
    vocab = base.tokenizer.vocab_size
    assert presets.build_model_config(base.target.model, vocab).num_params() == 1_377_408
    assert presets.build_model_config(base.draft.model, vocab).num_params() == 368_960
    assert (base.target.train.steps, base.draft.train.steps) == (800, 800)
    assert (base.num_prompts, base.prompt_tokens, base.new_tokens) == (8, 32, 128)


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
        "prediction_error": (1.2 + 0.01 * gamma) / 1.3 - 1.0,
    }
    return {"experiment": "speculative", "config": config, "config_hash": "x", "metrics": metrics,
            "start_time": "2026-12-01T00:00:00", "wall_time_s": 1.0,
            "provenance": {"cpu_count": 2, "command": "test"}}


def test_the_page_renders_each_targets_rows_on_its_own_page(tmp_path):
    default = spec_config.get_config().to_dict()
    pretrained = copy.deepcopy(default)
    pretrained["tokenizer"] = {"pretrained": "smollm2-135m"}
    pretrained["target"]["model"]["pretrained"] = "smollm2-135m"
    rows = [fake_row(default, d, g, t, b) for d in ("draft", "distilled", "ngram")
            for g in (1, 2) for t in (0.0, 0.7) for b in (1, 8)]
    rows += [fake_row(pretrained, d, g, t, 1) for d in ("draft", "ngram")
             for g in (1, 2) for t in (0.0, 0.7)]
    written = study.report(rows, tmp_path)
    assert {p.name for p in written} == {
        f"{name}{suffix}" for name in ("speculative", "speculative_smollm2-135m")
        for suffix in (".md", ".csv", "_best.csv", "_speedup.png", "_tokens_per_call.png")}
    main = (tmp_path / "speculative.md").read_text()
    real = (tmp_path / "speculative_smollm2-135m.md").read_text()
    assert main.startswith("# Speculative decoding\n") and "Target: `small`" in main
    assert "**Target 1 (>= 1.5x at batch 1, temperature 0): not met.**" in main
    assert "the same preset distilled from the target" in main
    assert "at batch 1 the prompts run one after another, at batch 8 together" in main
    assert "Target: the pretrained `smollm2-135m`" in real
    assert "Target 1" not in real and "Target 2" not in real and "distilled" not in real
    assert "trained on the corpus in the target's tokens" in real
    assert "plain text in the target's tokens" in real
    assert (tmp_path / "speculative_smollm2-135m.csv").read_text().count("\n") == 1 + 8
