"""The sharding page: decode-step traffic planned for real chips, and measured on fake CPU devices.

    python -m experiments.sharding --out=results/sharding.md

Part 1 computes, from the model configs and the published bandwidths in ``CHIPS``, the bytes one
decode step moves per layer (weights, KV cache, tensor-parallel all-reduces) and the batch below
which tensor parallel (TP) decoding beats data parallel (DP) on 8 chips. Part 2 decodes one small
model on 8 fake CPU devices of this machine under each mesh, against one device: it shows
correctness and the cost of partitioning on one host, not a speed-up (the 8 "devices" share the
same cores).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import time

import jax
import numpy as np
from absl import app, flags
from flax import nnx

import decodelab as dl
from decodelab import sharding
from decodelab.config import ModelConfig
from decodelab.experiment import presets

_OUT = flags.DEFINE_string("out", None, "Write the page here (markdown); print it otherwise.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed generate calls per mesh (median reported).")


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published figures of one accelerator of an 8-chip machine."""

    name: str
    hbm_bytes_per_s: float  # memory bandwidth per chip
    link_bytes_per_s: float  # chip-to-chip bandwidth per chip, one direction (what a ring uses)
    hbm_bytes: float  # memory per chip
    source: str


CHIPS = (
    Chip("8 x H100 SXM (NVLink 4)", 3.35e12, 450e9, 80e9,
         "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 3.35 TB/s HBM3, 80 GB; NVLink 900 GB/s "
         "per GPU (both directions; 450 GB/s used one way)"),
    Chip("TPU v5e-8 (ICI)", 819e9, 100e9, 16e9,
         "Google Cloud TPU v5e documentation: 819 GB/s HBM2, 16 GB per chip; inter-chip "
         "interconnect 1,600 Gbps = 200 GB/s per chip (100 GB/s used one way)"),
)
# Fixed cost of one all-reduce (launch and synchronisation). An assumption, not a published
# figure: a few microseconds is typical of small-message all-reduces on both fabrics.
ALLREDUCE_LATENCY_S = 5e-6
DEVICES = 8  # chips of each machine
ITEMSIZE = 2  # bf16 weights and KV cache on accelerators
CONTEXT = 2048  # tokens each row attends to in the plan

LLAMA3_8B = ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                        d_ff=14336, max_seq_len=8192, position="rope", norm="rms", mlp="swiglu",
                        tie_embeddings=False)


def plan_models() -> dict[str, ModelConfig]:
    """The configs the plan covers: ``medium`` (vocab 4096), SmolLM2-135M as its GGUF file
    declares it (when installed), a Llama-3-8B-shaped config."""
    models = {"medium": presets.build_model_config(presets.model_section("medium"), 4096)}
    try:
        from decodelab.convert.from_gguf import gguf_model_config

        models["SmolLM2-135M"] = gguf_model_config(presets.pretrained_path("smollm2-135m"))
    except (ImportError, ValueError):
        pass
    models["Llama-3-8B shape"] = LLAMA3_8B
    return models


def layer_params(cfg: ModelConfig) -> int:
    """Parameters of one block (attention and MLP matrices; norms and biases ignored)."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    mlp = (3 if cfg.mlp == "swiglu" else 2) * D * F
    return D * N * H * 2 + D * K * H * 2 + mlp


@dataclasses.dataclass(frozen=True)
class LayerStep:
    """One layer of one decode step of ``batch`` rows on a mesh of ``model`` TP devices."""

    weight_bytes: int  # the layer's weights (all devices together)
    kv_bytes: int  # keys and values the batch attends to (all devices together)
    allreduce_bytes: int  # payload of the two TP all-reduces: 2 x B x D
    link_bytes: int  # what each device sends for them (ring: 2 (M - 1) / M of the payload each)
    kv_split: bool  # whether the KV heads split over the model axis (else each device reads all)


def layer_step(cfg: ModelConfig, batch: int, context: int, model: int) -> LayerStep:
    K, H, D = cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    payload = 2 * batch * D * ITEMSIZE
    return LayerStep(weight_bytes=layer_params(cfg) * ITEMSIZE,
                     kv_bytes=2 * batch * context * K * H * ITEMSIZE,
                     allreduce_bytes=payload,
                     link_bytes=round(2 * (model - 1) / model * payload),
                     kv_split=K % model == 0)


def tp_seconds(cfg: ModelConfig, chip: Chip, batch: int, context: int, model: int) -> float | None:
    """Per-layer step time, one replica over ``model`` devices (None: heads do not split)."""
    if cfg.n_heads % model:
        return None
    step = layer_step(cfg, batch, context, model)
    kv = step.kv_bytes / (model if step.kv_split else 1)
    memory = (step.weight_bytes / model + kv) / chip.hbm_bytes_per_s
    comm = 2 * ALLREDUCE_LATENCY_S + step.link_bytes / chip.link_bytes_per_s if model > 1 else 0.0
    return memory + comm


def dp_seconds(cfg: ModelConfig, chip: Chip, batch: int, context: int) -> float:
    """Per-layer step time, ``DEVICES`` replicas with ``batch / DEVICES`` rows each."""
    step = layer_step(cfg, batch, context, 1)
    return (step.weight_bytes + step.kv_bytes / DEVICES) / chip.hbm_bytes_per_s


def break_even_batch(cfg: ModelConfig, chip: Chip, context: int) -> float | None:
    """The total batch below which TP over all ``DEVICES`` beats DP at equal batch (0: TP never
    pays; None: the heads do not split over ``DEVICES``). Both sides' times are linear in B."""
    if cfg.n_heads % DEVICES:
        return None
    t_tp0, t_dp0 = tp_seconds(cfg, chip, 1, context, DEVICES), dp_seconds(cfg, chip, 1, context)
    t_tp1, t_dp1 = tp_seconds(cfg, chip, 2, context, DEVICES), dp_seconds(cfg, chip, 2, context)
    slope = (t_tp1 - t_tp0) - (t_dp1 - t_dp0)  # d(TP - DP)/dB
    gap = (t_tp0 - (t_tp1 - t_tp0)) - (t_dp0 - (t_dp1 - t_dp0))  # (TP - DP) at B = 0
    if gap >= 0:  # DP has no communication, so the slope is >= 0 too
        return 0.0
    return float("inf") if slope <= 0 else -gap / slope


def min_layer_bytes_for_tp(chip: Chip, d_model: int, batch: int) -> float:
    """The layer weight bytes above which TP over ``DEVICES`` beats DP at ``batch`` rows, with
    split KV heads (the KV reads are then equal on both sides): the weight-read time TP saves,
    ``W (1 - 1/M) / HBM``, must exceed its two all-reduces."""
    M = DEVICES
    comm = 2 * ALLREDUCE_LATENCY_S + 2 * (M - 1) / M * 2 * batch * d_model * ITEMSIZE / (
        chip.link_bytes_per_s)
    return comm * chip.hbm_bytes_per_s / (1 - 1 / M)


def fits_one_chip(cfg: ModelConfig, chip: Chip, batch: int, context: int) -> bool:
    """Whether DP is possible: all weights plus the replica's share of the cache on one chip."""
    weights = cfg.num_params() * ITEMSIZE
    kv = cfg.n_layers * layer_step(cfg, batch, context, 1).kv_bytes / DEVICES
    return weights + kv <= chip.hbm_bytes


def _mb(n: float) -> str:
    return f"{n / 1e6:,.3f}"


def plan_page() -> list[str]:
    models = plan_models()
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
                f"| {batch} | {_mb(s.weight_bytes)} | {_mb(s.kv_bytes)} | "
                f"{_mb(s.allreduce_bytes)} | {_mb(s.link_bytes)} | "
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
        "Sources of the figures used (`CHIPS` in `experiments/sharding.py`):",
        "",
        *[f"- {chip.name}: {chip.source}." for chip in CHIPS],
        f"- All-reduce latency {ALLREDUCE_LATENCY_S * 1e6:.0f} µs: an assumption (no vendor "
        f"publishes one number); it decides the small-model rows, so it is a parameter at the "
        f"top of the program.",
        "",
    ]
    return lines


def measure(repeats: int) -> list[str]:
    """Greedy generate of one small model on one device and on each 8-device mesh."""
    cfg = ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8,
                      d_ff=768, max_seq_len=128)
    model = dl.Transformer(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, 16).tolist() for _ in range(8)]
    new_tokens = 32
    rows, reference = [], None
    for shape in (None, (8, 1), (1, 8), (2, 4), (4, 2)):
        m = model if shape is None else sharding.shard(model, sharding.make_mesh(*shape))
        start = time.perf_counter()
        out = dl.generate(m, prompts, dl.SamplingParams.greedy(), new_tokens)
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dl.generate(m, prompts, dl.SamplingParams.greedy(), new_tokens)
            times.append(time.perf_counter() - start)
        reference = out.tokens if reference is None else reference
        median = statistics.median(times)
        rows.append((shape, first - median, median, bool((out.tokens == reference).all())))
    base = rows[0][2]
    lines = [
        "## 2. Measured on this machine: 8 fake CPU devices",
        "",
        f"`{platform.processor() or platform.machine()}`, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end: other work shared them), jax {jax.__version__}, "
        f"{datetime.date.today().isoformat()}. Model: {cfg.n_layers} "
        f"layers, d {cfg.d_model}, {cfg.n_heads} heads (MHA), d_ff {cfg.d_ff}, vocab "
        f"{cfg.vocab_size} ({cfg.num_params() / 1e6:.2f} M parameters, float32), random "
        f"weights; greedy `generate` of {len(prompts)} prompts x 16 tokens, {new_tokens} new "
        f"tokens; median of {repeats} calls after a first (compiling) call. The 8 devices are "
        f"threads of one CPU: these numbers show that the partitioned programs are correct and "
        f"what partitioning costs on one host, not a speed-up.",
        "",
        "| mesh (data x model) | compile (s, first call - median) | generate (ms) | ms / token "
        "| vs one device | tokens = one device |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for shape, compile_s, median, equal in rows:
        label = "one device" if shape is None else f"{shape[0]} x {shape[1]}"
        lines.append(f"| {label} | {compile_s:.1f} | {median * 1e3:,.0f} | "
                     f"{median * 1e3 / new_tokens:.1f} | {median / base:.2f}x | "
                     f"{'yes' if equal else 'NO'} |")
    lines.append("")
    return lines


def main(argv) -> None:
    del argv
    # Part 2 needs 8 devices: read when JAX's backend starts, which nothing before this does.
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    if jax.device_count() != 8:
        raise RuntimeError(f"part 2 needs 8 CPU devices, JAX started with {jax.device_count()}")
    page = [
        "# Sharded decoding: data and tensor parallel on a device mesh",
        "",
        "Regenerate: `python -m experiments.sharding --out=results/sharding.md` (both parts; "
        "part 2 runs on 8 fake CPU devices, which the program sets up itself).",
        "",
        "No GPU or TPU was available when this page was made: part 1 is computed from "
        "published figures, part 2 ran on CPU only.",
        "",
        *plan_page(),
        *measure(_REPEATS.value),
    ]
    text = "\n".join(page)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    app.run(main)
