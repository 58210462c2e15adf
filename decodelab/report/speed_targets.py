"""The decode-speed page's targets, as data: what is measured, on which rows, the threshold and
the comparison (``speed.Target``). The thresholds are the open issues' (decode step at the
roofline, capacity that costs nothing, ahead of llama.cpp; sampling at the cost of greedy;
llama.cpp's samplers and contrastive search; constrained steps; 16-bit weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.measure import constrained, stats, weight_cost
from decodelab.measure.stats import Interval
from decodelab.report import speed


def roofline_threshold(m: Mapping[str, Any]) -> float:
    """A pretrained model at batch 1: 0.85 of its roofline; batch 8 and 32: 0.5; a random
    preset at batch 1: 0.75 (small: 0.5, its step is too short for the fixed costs)."""
    if m["batch_size"] == 1:
        return 0.85 if m.get("weights") == "pretrained" else 0.5 if m["preset"] == "small" else 0.75
    return 0.5


def max_len_whole_ratio(metrics: Sequence[Mapping[str, Any]]) -> Interval | None:
    """The whole ``generate`` call (prefill and cache set-up included) at the largest cache over
    the call at the smallest (the same live tokens; ``speed.at_largest_cache``): the ratio of
    their median calls, resampled by round where one row timed both in the same rounds, else each
    program's repetitions on their own."""
    pair = speed.at_largest_cache(metrics)
    if pair is None:
        return None
    reps = [speed.repetitions(pair[0], "generate_reps_s"),
            speed.repetitions(pair[1], f"{pair[2]}generate_reps_s")]
    if any(r is None for r in reps):
        return None
    paired = pair[1] is pair[0] and len(reps[0]) == len(reps[1])
    return stats.bootstrap_ratio(stats.median, (reps[0],), (reps[1],), paired=paired)


def storage_over_float32(name: str):
    """A weights-study row's step with the weights stored as ``name`` over its float32 step
    (timed in the same rounds)."""
    return lambda m: speed.interleaved_step_ratio(m, f"{name}_")


TARGETS = (
    speed.Target("at the roofline target", "decodelab / roofline", speed.roofline_interval, 0.5,
                 covers=lambda m: m["preset"] != "tiny" or m["batch_size"] > 1, unit="",
                 row_threshold=roofline_threshold),
    speed.Target("faster than transformers", "decodelab / transformers",
                 lambda m: speed.speed_ratio(m, "hf_generate_reps_s"), 1.0),
    speed.Target(">= 2x transformers (1.5x at batch 32) for tiny and small",
                 "decodelab / transformers, the 2x target (1.5x at batch 32)",
                 lambda m: speed.speed_ratio(m, "hf_generate_reps_s"), 2.0,
                 covers=lambda m: m["preset"] in ("tiny", "small"),
                 row_threshold=lambda m: 1.5 if m["batch_size"] >= 32 else 2.0),
    speed.Target(">= 1.5x transformers at batch 32 on every preset",
                 "decodelab / transformers at batch 32",
                 lambda m: speed.speed_ratio(m, "hf_generate_reps_s"), 1.5,
                 covers=lambda m: m["batch_size"] == 32),
    speed.Target(">= 1.0x llama.cpp on the same float32 weights",
                 "decodelab / llama.cpp on float32 weights (pretrained, batch 1)",
                 lambda m: speed.speed_ratio(m, "llama_f32_generate_reps_s", m["batch_size"]), 1.0,
                 covers=lambda m: m.get("llama_version", "not run") != "not run"),
    speed.Target("step at the largest max_len within 10% of the smallest",
                 "step at the largest max_len / at the smallest (the same live tokens)",
                 speed.max_len_step_ratio, 1.10, at_least=False, study="max_len", per_row=False),
    speed.Target("whole call at the largest max_len within 10% of the smallest",
                 "whole generate call at the largest max_len / at the smallest (prefill and "
                 "cache set-up included)", max_len_whole_ratio, 1.10, at_least=False,
                 study="max_len", per_row=False),
    speed.Target("KV cache >= 10x recompute", "KV cache speed-up over recompute, the lowest row",
                 speed.lowest_cache_speedup, 10.0, per_row=False),
    speed.Target("constrained step within 15% of a free one",
                 "constrained step / free step (regex, greedy)", constrained.step_ratio, 1.15,
                 at_least=False, study="constrained"),
) + speed.sampling_targets() + speed.sampler_targets() + tuple(
    speed.Target(f"{name} weights no slower than float32",
                 f"step with {name} weights / with float32 weights (greedy)",
                 storage_over_float32(name), 1.0, at_least=False, study="weights")
    for name in weight_cost.STORAGES)
