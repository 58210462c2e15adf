"""The decode-speed page's weights study (16-bit storage against float32): its sweeps, its
timings' keys and the page's claims and table; and the max_len study's whole-call claim."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from study_config import config_module

from decodelab import experiment
from decodelab.measure import timing, weight_cost
from decodelab.model import Transformer
from decodelab.report import speed, speed_tables, speed_targets


def test_the_weights_sweep_times_medium_and_a_pretrained_model_at_batch_1_and_8(
        smollm2_installed):
    module = config_module("bench_decode")
    for arg, preset in (("weights", "medium"), ("weights:smollm2-135m", "smollm2-135m")):
        points = experiment.expand(module.get_config(arg), module.get_sweep(arg))
        assert [(p.config.preset, p.config.batch_size) for p in points] == [(preset, 1),
                                                                             (preset, 8)]
        config = points[0].config
        assert (config.study, config.new_tokens, config.peer.enabled, config.llama.enabled,
                config.nocache.enabled) == ("weights", 128, False, False, False)


def test_each_storage_is_timed_beside_float32_on_the_same_rows_with_its_bytes(tiny_config):
    model = Transformer(tiny_config, rngs=nnx.Rngs(0))
    prompts = np.random.default_rng(0).integers(0, tiny_config.vocab_size, (2, 5), np.int32)
    found = weight_cost.time_storages(model, prompts, 4, 2, 0)
    for prefix in ("", *(f"{name}_" for name in weight_cost.STORAGES)):
        assert len(found[f"{prefix}generate_reps_s"]) == len(found[f"{prefix}prefill_reps_s"]) == 2
        assert found[f"{prefix}step_ms"] >= 0
    for name in weight_cost.STORAGES:  # half the bytes but the float32 norms
        share = found[f"{name}_param_bytes"] / found["param_bytes"]
        assert 0.5 < share < 0.52
    assert found["param_bytes"] == weight_cost.param_bytes(model)


def weights_row(batch: int, factors: dict[str, float]) -> dict:
    """A weights-study row whose storages' decoding takes ``factor`` x float32's on top of the
    same prefill (5 repetitions, jittered by 1%)."""
    jitter = 1 + 0.01 * np.linspace(-1, 1, 5)
    metrics = {"preset": "medium", "batch_size": batch, "step_ms": 1.0, "param_bytes": 4e6,
               "generate_reps_s": list(0.01 + jitter), "prefill_reps_s": list(0.01 * jitter)}
    for name in weight_cost.STORAGES:
        metrics[f"{name}_generate_reps_s"] = list(0.01 + factors[name] * jitter[::-1])
        metrics[f"{name}_prefill_reps_s"] = list(0.01 * jitter)
        metrics[f"{name}_param_bytes"] = 2e6
    return {"config": {"study": "weights", "prompt_len": 32, "new_tokens": 128},
            "metrics": metrics}


def test_the_page_judges_each_storage_against_float32_per_row():
    rows = [weights_row(1, {"bfloat16": 1.5, "float16": 0.8}),
            weights_row(8, {"bfloat16": 1.2, "float16": 1.2})]
    targets = [t for t in speed_targets.TARGETS if t.study == "weights"]
    judged = {c.text: c.judge(rows) for t in targets for c in t.claims(rows)}
    assert len(judged) == 2 * len(weight_cost.STORAGES)
    slow = judged["medium batch 1: step with bfloat16 weights / with float32 weights (greedy)"]
    fast = judged["medium batch 1: step with float16 weights / with float32 weights (greedy)"]
    assert slow.measured.value == pytest.approx(1.5, rel=0.02) and slow.verdict.side < 0
    assert fast.measured.value == pytest.approx(0.8, rel=0.02) and fast.verdict.side > 0
    table = speed_tables.weights_table(rows)
    assert len(table.rows) == 2 and table.rows[0][3] == 4.0  # float32 MB


def max_len_row(max_len: int, whole_s: float, step_ms: float) -> dict:
    jitter = 1 + 0.01 * np.linspace(-1, 1, 5)
    return {"config": {"study": "max_len", "prompt_len": 32, "new_tokens": 256},
            "metrics": {"preset": "small", "batch_size": 8, "max_len": max_len,
                        "step_ms": step_ms, "prefill_ms": 10.0, "generate_s": whole_s,
                        "generate_reps_s": list(whole_s * jitter),
                        "prefill_reps_s": list(0.01 * jitter), "prompt_len": 32,
                        "new_tokens": 256}}


def test_the_whole_call_at_the_largest_cache_is_judged_beside_its_step():
    rows = [max_len_row(288, 1.0, 1.0), max_len_row(4096, 1.3, 1.0)]
    (target,) = [t for t in speed_targets.TARGETS if t.label.startswith("whole call")]
    (claim,) = target.claims(rows)
    judged = claim.judge(rows)
    assert judged.measured.value == pytest.approx(1.3) and judged.verdict.side < 0
    assert speed_targets.max_len_whole_ratio([rows[0]["metrics"]]) is None  # one cache size
    table = speed_tables.max_len_table(rows)
    assert table.rows[1][7] == pytest.approx(1.3)  # whole call / whole call at the smallest


def test_the_largest_cache_is_judged_against_the_smallest_timed_beside_it():
    # The 4096 row also timed the smallest cache (smallest_): its own pair is judged, not the
    # 288 row timed as another point (here twice as slow: a drift of the machine between points).
    small, large = max_len_row(288, 2.0, 2.0), max_len_row(4096, 1.05, 1.0)
    jitter = 1 + 0.01 * np.linspace(-1, 1, 5)
    large["metrics"].update({"smallest_generate_reps_s": list(1.0 * jitter),
                             "smallest_prefill_reps_s": list(0.01 * jitter),
                             "smallest_step_ms": 0.95, "smallest_generate_s": 1.0})
    rows = [small, large]
    whole = [t for t in speed_targets.TARGETS if t.label.startswith("whole call")][0]
    step = [t for t in speed_targets.TARGETS if t.label.startswith("step at the largest")][0]
    assert whole.claims(rows)[0].judge(rows).measured.value == pytest.approx(1.05)
    # (1.05 - 0.01) / (1.0 - 0.01): the two steps, up to the constant 1 / (new tokens - 1)
    assert step.claims(rows)[0].judge(rows).measured.value == pytest.approx(1.04 / 0.99)
    table = speed_tables.max_len_table(rows)
    assert table.rows[1][5] == pytest.approx(1.0 / 0.95) and table.rows[1][7] == \
        pytest.approx(1.05)


def test_programs_timed_in_the_same_rounds_are_resampled_by_round():
    # The machine slows by up to 2x over the point and both caches follow it, the larger 3% slower
    # in every round: paired by round the interval is the 3%; resampled on their own it would
    # span the drift (a row timed at another point is, and its interval is wide).
    drift = 1 + np.linspace(0, 1, 40) ** 2
    large = max_len_row(4096, 1.0, 1.0)
    large["metrics"].update({"generate_reps_s": list(1.03 * drift),
                             "prefill_reps_s": list(0.01 * 1.03 * drift),
                             "smallest_generate_reps_s": list(drift),
                             "smallest_prefill_reps_s": list(0.01 * drift)})
    rows = [max_len_row(288, 1.0, 1.0), large]
    metrics = [r["metrics"] for r in rows]
    for ratio in (speed.max_len_step_ratio(metrics), speed_targets.max_len_whole_ratio(metrics)):
        assert ratio.value == pytest.approx(1.03)
        assert ratio.high - ratio.low < 1e-6
    unpaired = speed.step_ratio(large["metrics"], large["metrics"], "", "smallest_")
    assert unpaired.value == pytest.approx(1.03) and unpaired.high - unpaired.low > 0.2
    assert speed.interleaved_step_ratio(large["metrics"], "", "smallest_") == \
        speed.max_len_step_ratio(metrics)


def test_a_capacity_point_times_the_smallest_cache_beside_its_own(tiny_config):
    model = Transformer(tiny_config, rngs=nnx.Rngs(0))
    prompts = np.random.default_rng(0).integers(0, tiny_config.vocab_size, (2, 5), np.int32)
    found = timing.time_capacity(model, prompts, 4, 2, 64)
    for prefix in ("", "smallest_"):
        assert len(found[f"{prefix}generate_reps_s"]) == len(found[f"{prefix}prefill_reps_s"]) == 2
    assert "smallest_step_ms" not in timing.time_capacity(model, prompts, 4, 2, 9)  # 5 + 4
    with pytest.raises(ValueError, match="max_len must be 0 or at least prompt"):
        timing.time_capacity(model, prompts, 4, 2, 8)
