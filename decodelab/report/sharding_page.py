"""The sharding page (``experiments/sharding.py`` writes it): part 1, the plan of
``decodelab.measure.sharding_plan`` for a few model configs on two 8-chip machines; part 2, the
timings of ``decodelab.measure.mesh_timing`` on this machine's devices."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from decodelab.config import ModelConfig
from decodelab.measure.mesh_timing import MeshTiming
from decodelab.measure.sharding_plan import (ALLREDUCE_LATENCY_S, CHIPS, CONTEXT, DEVICES,
                                             ITEMSIZE, break_even_batch, dp_seconds,
                                             fits_one_chip, layer_step, min_layer_bytes_for_tp,
                                             tp_seconds)


def megabytes(n: float) -> str:
    return f"{n / 1e6:,.3f}"


def plan_lines(models: Mapping[str, ModelConfig]) -> list[str]:
    """Part 1 of the page: the plan of ``decodelab.measure.sharding_plan`` for ``models``."""
    lines = [
        "## 1. On paper: one decode step on 8 chips",
        "",
        f"Per layer and per decode step, bf16 ({ITEMSIZE} bytes) weights and cache, each row "
        f"attending to {CONTEXT} positions. Tensor parallel (TP, Megatron, `decodelab.sharding."
        f"PARAM_RULES`) splits each layer's weights over the `model` axis and all-reduces the "
        f"`B x D` activations twice per layer (after attention and after the MLP); data parallel "
        f"(DP) keeps a whole copy per chip and gives each chip `B / 8` rows. "
        f"Weights, KV and all-reduce columns are totals in MB; 'link / device' is what each "
        f"device sends for the two all-reduces on 8 chips (ring: `2 (M-1)/M` of the payload).",
        "",
        "| model | params | heads N / KV K | B | weights / layer | KV / layer | all-reduce "
        "payload / layer | link / device / layer | KV heads split over 8 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, cfg in models.items():
        for batch in (1, 64):
            s = layer_step(cfg, batch, CONTEXT, DEVICES)
            lines.append(
                f"| {name} | {cfg.num_params() / 1e6:,.1f} M | {cfg.n_heads} / {cfg.n_kv_heads} "
                f"| {batch} | {megabytes(s.weight_bytes)} | {megabytes(s.kv_bytes)} | "
                f"{megabytes(s.allreduce_bytes)} | {megabytes(s.link_bytes)} | "
                f"{'yes' if s.kv_split else 'no (replicated)'} |")
    lines += [
        "",
        f"Time per layer and step from the published bandwidths (memory bytes / HBM bandwidth, "
        f"plus for TP {ALLREDUCE_LATENCY_S * 1e6:.0f} µs per all-reduce (assumed, see below) and "
        f"the link bytes / link bandwidth), at equal total batch B on 8 chips. 'n/a': the query "
        f"heads do not split over 8. 'DP fits': all weights plus a replica's share of the cache "
        f"fit one chip's memory.",
        "",
        "| chip | model | B | TP over 8 (µs) | DP over 8 (µs) | faster | DP fits one chip |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for chip in CHIPS:
        for name, cfg in models.items():
            for batch in (1, 8, 64, 256):
                tp = tp_seconds(cfg, chip, batch, CONTEXT, DEVICES)
                dp = dp_seconds(cfg, chip, batch, CONTEXT)
                fits = fits_one_chip(cfg, chip, batch, CONTEXT)
                faster = "TP (DP does not fit)" if not fits and tp is not None else (
                    "DP" if tp is None or dp <= tp else "TP")
                lines.append(f"| {chip.name} | {name} | {batch} | "
                             f"{'n/a' if tp is None else f'{tp * 1e6:,.2f}'} | {dp * 1e6:,.2f} | "
                             f"{faster} | {'yes' if fits else 'no'} |")
    lines += [
        "",
        "Break-even batch: below it TP over 8 chips is faster than DP at the same total batch "
        "(both step times are linear in B; 0 means TP never pays, because the all-reduce "
        "latency alone exceeds the weight-read time it saves).",
        "",
        "| chip | model | break-even total batch |",
        "|---|---|---:|",
    ]
    for chip in CHIPS:
        for name, cfg in models.items():
            b = break_even_batch(cfg, chip, CONTEXT)
            cell = ("n/a (heads do not split over 8)" if b is None else
                    "never (TP never pays)" if b == 0 else f"{b:,.0f}")
            lines.append(f"| {chip.name} | {name} | {cell} |")
    lines += [
        "",
        "Model size where TP starts to pay: the bytes of one layer's weights above which TP "
        "over 8 beats DP (KV heads split, D = 4096; the all-reduce payload grows with B x D, "
        "so larger batches need larger layers).",
        "",
        "| chip | B = 1 | B = 64 | B = 256 |",
        "|---|---:|---:|---:|",
        *[f"| {chip.name} | " + " | ".join(
            f"{min_layer_bytes_for_tp(chip, 4096, b) / 1e6:,.1f} MB" for b in (1, 64, 256)) + " |"
          for chip in CHIPS],
        "",
        "Sources of the figures used (`CHIPS` in `decodelab/measure/sharding_plan.py`):",
        "",
        *[f"- {chip.name}: {chip.source}." for chip in CHIPS],
        f"- All-reduce latency {ALLREDUCE_LATENCY_S * 1e6:.0f} µs: an assumption (no vendor "
        f"publishes one number); it decides the small-model rows, so it is a parameter at the "
        f"top of `decodelab/measure/sharding_plan.py`.",
        "",
    ]
    return lines


def measured_lines(cfg: ModelConfig, num_prompts: int, prompt_len: int, new_tokens: int,
                   repeats: int, timings: Sequence[MeshTiming], machine: str) -> list[str]:
    """Part 2 of the page: greedy ``generate`` of ``cfg`` (random weights) for ``num_prompts``
    prompts of ``prompt_len`` tokens under each mesh (``timings``, the first on one device)."""
    base = timings[0].median_s
    heads = "MHA" if cfg.n_kv_heads == cfg.n_heads else f"GQA, {cfg.n_kv_heads} KV heads"
    lines = [
        "## 2. Measured on this machine: 8 fake CPU devices",
        "",
        f"{machine}. Model: {cfg.n_layers} layers, d {cfg.d_model}, {cfg.n_heads} heads "
        f"({heads}), d_ff {cfg.d_ff}, vocab {cfg.vocab_size} ({cfg.num_params() / 1e6:.2f} M "
        f"parameters, float32), random weights; greedy `generate` of {num_prompts} prompts x "
        f"{prompt_len} tokens, {new_tokens} new tokens; median of {repeats} calls after a first "
        "(compiling) call. The 8 devices are threads of one CPU: these numbers show that the "
        "partitioned programs are correct and what partitioning costs on one host, not a "
        "speed-up.",
        "",
        "| mesh (data x model) | compile (s, first call - median) | generate (ms) | ms / token "
        "| vs one device | tokens = one device |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in timings:
        label = "one device" if t.shape is None else f"{t.shape[0]} x {t.shape[1]}"
        lines.append(f"| {label} | {t.compile_s:.1f} | {t.median_s * 1e3:,.0f} | "
                     f"{t.median_s * 1e3 / new_tokens:.1f} | {t.median_s / base:.2f}x | "
                     f"{'yes' if t.same_tokens else 'NO'} |")
    lines.append("")
    return lines


