"""The decode-speed page's sampling study: its sweeps, its transformers arguments, its claims."""

from __future__ import annotations

import numpy as np
import pytest
from study_config import config_module

from decodelab import experiment
from decodelab.measure import peers, sampling_cost
from decodelab.report import speed, speed_tables, speed_targets
from decodelab.sampling.params import SamplingParams


def test_the_sampling_sweep_times_every_setting_at_three_presets_and_batch_sizes():
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config("sampling"), module.get_sweep("sampling"))
    assert [(p.config.preset, p.config.batch_size) for p in points] == [
        (p, b) for p in ("tiny", "small", "medium") for b in (1, 8, 32)]
    config = points[0].config
    assert (config.study, config.new_tokens, config.peer.enabled) == ("sampling", 128, True)


def test_a_pretrained_sampling_sweep_runs_batch_1_8_and_32_without_the_peer(smollm2_installed):
    module = config_module("bench_decode")
    arg = "sampling:smollm2-135m"
    points = experiment.expand(module.get_config(arg), module.get_sweep(arg))
    assert [p.config.batch_size for p in points] == [1, 8, 32]
    assert {(p.config.preset, p.config.study, p.config.peer.enabled) for p in points} == {
        ("smollm2-135m", "sampling", False)}


@pytest.mark.parametrize("arg", ["max_len:smollm2-135m", "sampling:tiny", "samplers:small"])
def test_only_the_sampling_constrained_weights_and_samplers_studies_take_a_pretrained_preset(arg):
    with pytest.raises(ValueError, match="only sampling, constrained, weights, samplers take a "
                                         "pretrained"):
        config_module("bench_decode").get_config(arg)


@pytest.mark.parametrize("arg, preset, tokens", [("samplers", "small", 128),
                                                 ("samplers:smollm2-135m", "smollm2-135m", 64)])
def test_the_samplers_sweep_times_small_and_smollm2_at_batch_1_and_8(arg, preset, tokens,
                                                                     smollm2_installed):
    module = config_module("bench_decode")
    points = experiment.expand(module.get_config(arg), module.get_sweep(arg))
    assert [(p.config.preset, p.config.batch_size) for p in points] == [(preset, 1), (preset, 8)]
    config = points[0].config
    assert (config.study, config.new_tokens, config.peer.enabled) == ("samplers", tokens, False)


def test_every_sampler_setting_is_valid_sampled_and_labelled():
    for name, fields in sampling_cost.SAMPLERS.items():
        params = SamplingParams(**fields)  # validated when built
        assert params.temperature == 1.0 and name in sampling_cost.LABELS
        assert params.breakers(1, 8).shape == (1, 8)  # DRY's breakers need no tokenizer
    assert "contrastive" in sampling_cost.LABELS


def test_time_samplers_times_greedy_each_sampler_and_contrastive_search_on_the_same_rows(
        tiny_config):
    from flax import nnx

    from decodelab.model import Transformer

    model = Transformer(tiny_config, rngs=nnx.Rngs(0))
    prompts = np.arange(1, 9, dtype=np.int32).reshape(2, 4)
    found = sampling_cost.time_samplers(model, prompts, 4, 1, 0)
    for name in ["", *sampling_cost.SAMPLERS, "contrastive"]:
        prefix = f"{name}_" if name else ""
        (seconds,) = found[f"{prefix}generate_reps_s"]
        assert seconds > 0
    assert found["contrastive_top_k"] == sampling_cost.CONTRASTIVE["top_k"]


def test_every_setting_is_valid_and_the_history_one_is_greedy():
    for name, fields in sampling_cost.SETTINGS.items():
        SamplingParams(**fields)  # validated when built
        assert name in sampling_cost.LABELS
    assert sampling_cost.SETTINGS["history"]["temperature"] == 0.0
    assert sampling_cost.PEER_SETTING in sampling_cost.SETTINGS


def test_transformers_gets_the_same_processors_and_top_k_off_where_decodelab_has_none():
    got = peers.hf_sampling(SamplingParams(**sampling_cost.SETTINGS["all"]))
    assert got == {"do_sample": True, "temperature": 1.0, "top_k": 50, "top_p": 0.95,
                   "min_p": 0.05, "typical_p": 1.0, "repetition_penalty": 1.0}
    assert peers.hf_sampling(SamplingParams(top_p=0.9))["top_k"] == 0  # transformers' is 50
    assert peers.hf_sampling(SamplingParams(temperature=0.0, repetition_penalty=1.2)) == {
        "do_sample": False, "repetition_penalty": 1.2}
    with pytest.raises(ValueError, match="eta"):
        peers.hf_sampling(SamplingParams(eta=0.01))
    with pytest.raises(ValueError, match="a logit bias, banned tokens or a constraint"):
        peers.hf_sampling(SamplingParams(regex=r"\d+"))  # transformers would ignore it


def row(preset: str, batch: int, greedy_s: float, factors: dict[str, float],
        study: str = "sampling") -> dict:
    """A sampling-study (or samplers-study) row whose settings' whole calls take ``factor`` x
    greedy's decoding time on top of the same prefill (5 repetitions each, jittered by 1%)."""
    jitter = 1 + 0.01 * np.linspace(-1, 1, 5)
    prefill = 0.01
    metrics = {"preset": preset, "batch_size": batch, "step_ms": 1e3 * greedy_s / 127,
               "generate_reps_s": list(prefill + greedy_s * jitter),
               "prefill_reps_s": list(prefill * jitter)}
    names = (sampling_cost.SETTINGS if study == "sampling"
             else [*sampling_cost.SAMPLERS, "contrastive"])
    for name in names:
        whole = prefill + greedy_s * factors.get(name, 1.0)
        metrics[f"{name}_generate_reps_s"] = list(whole * jitter[::-1])
        metrics[f"{name}_prefill_reps_s"] = list(prefill * jitter)
    if study == "sampling":
        metrics["hf_all_generate_reps_s"] = list(3 * (prefill + greedy_s * 1.1) * jitter)
    return {"config": {"study": study, "prompt_len": 32, "new_tokens": 128},
            "metrics": metrics}


def test_the_sampling_claims_judge_each_row_against_its_own_greedy_step():
    rows = [row("small", 8, 1.0, {"top_p": 1.1, "all": 2.0}),
            row("smollm2-135m", 8, 1.0, {"history": 1.5})]
    targets = speed.sampling_targets()
    claims = {c.text: c for t in targets for c in t.claims(rows)}
    judged = {text: c.judge(rows) for text, c in claims.items()}
    top_p = judged["small batch 8: top-p 0.95 step / greedy step"]
    assert top_p.measured.value == pytest.approx(1.1, rel=0.02) and top_p.verdict.side > 0
    assert judged["small batch 8: all four together step / greedy step"].verdict.side < 0
    history = judged["smollm2-135m batch 8: repetition 1.2 + frequency 0.5 (greedy) step / "
                     "greedy step"]
    assert history.measured.value == pytest.approx(1.5, rel=0.02) and history.verdict.side < 0
    peer = [j for text, j in judged.items() if "transformers" in text]
    # transformers' whole call over decodelab's on "all" (2x greedy's decoding there)
    expected = 3 * (0.01 + 1.1) / (0.01 + 2.0)
    assert len(peer) == 1 and peer[0].measured.value == pytest.approx(expected, rel=0.02)
    table = speed_tables.settings_table(rows)
    assert len(table.rows) == 2 and len(table.columns) == 3 + len(sampling_cost.SETTINGS) + 1


def test_the_samplers_claims_hold_each_sampler_to_25_percent_and_contrastive_to_its_k():
    k = sampling_cost.CONTRASTIVE["top_k"]
    rows = [row("small", 8, 1.0, {"xtc": 1.1, "dry": 1.6, "contrastive": k - 1.0}, "samplers")]
    judged = {c.text: c.judge(rows) for t in speed.sampler_targets() for c in t.claims(rows)}
    assert len(judged) == len(sampling_cost.SAMPLERS) + 1
    xtc, dry = (judged[f"small batch 8: {sampling_cost.LABELS[n]} step / greedy step"]
                for n in ("xtc", "dry"))
    assert xtc.verdict.side > 0 and dry.verdict.side < 0
    contrastive = judged[f"small batch 8: {sampling_cost.LABELS['contrastive']} step / greedy "
                         "step"]
    assert contrastive.measured.value == pytest.approx(k - 1.0, rel=0.02)
    assert contrastive.claim.threshold == k and contrastive.verdict.side > 0
    table = speed_tables.settings_table(rows, "samplers")
    assert len(table.rows) == 1 and len(table.columns) == 3 + len(sampling_cost.SAMPLERS) + 1


def test_the_page_holds_the_sampling_targets():
    texts = [t.text for t in speed_targets.TARGETS if t.study == "sampling"]
    assert len(texts) == len(sampling_cost.SETTINGS) + 1  # five settings, history, the peer
