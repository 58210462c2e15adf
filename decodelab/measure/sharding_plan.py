"""The sharding plan: the bytes one decode step moves per layer on a mesh of real chips (weights,
KV cache, the tensor-parallel all-reduces) and the time each layout takes from the chips' published
bandwidths (``CHIPS``), computed from a model config alone; nothing is measured.

Tensor parallel (TP, Megatron, ``decodelab.sharding.PARAM_RULES``) splits each layer's weights over
the ``model`` axis and all-reduces the ``B x D`` activations twice per layer (after attention and
after the MLP); data parallel (DP) keeps a whole copy per chip and gives each chip ``B / DEVICES``
rows. Memory time is bytes / HBM bandwidth; a TP all-reduce adds ``ALLREDUCE_LATENCY_S`` and its
link bytes / link bandwidth (a ring sends ``2 (M - 1) / M`` of the payload per device).
"""

from __future__ import annotations

import dataclasses

from decodelab.config import ModelConfig


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


def dp_bytes_per_chip(cfg: ModelConfig, batch: int, context: int) -> float:
    """What one DP replica holds: all weights plus its ``batch / DEVICES`` rows' cache."""
    weights = cfg.num_params() * ITEMSIZE
    return weights + cfg.n_layers * layer_step(cfg, batch, context, 1).kv_bytes / DEVICES


def fits_one_chip(cfg: ModelConfig, chip: Chip, batch: int, context: int) -> bool:
    """Whether DP is possible: ``dp_bytes_per_chip`` fit one chip's memory."""
    return dp_bytes_per_chip(cfg, batch, context) <= chip.hbm_bytes


def chip_named(name: str) -> Chip:
    """The chip of ``CHIPS`` called ``name``."""
    for chip in CHIPS:
        if chip.name == name:
            return chip
    raise ValueError(f"chip must be one of {[c.name for c in CHIPS]}, got {name!r}")


def plan_point(cfg: ModelConfig, chip: Chip, batch: int) -> dict:
    """Everything the plan says about ``cfg`` on 8 x ``chip`` at total batch ``batch``, with the
    published figures it used: per-layer bytes (MB, all devices together; ``link_mb`` per device),
    per-layer step times (µs; ``tp_us`` None where the heads do not split), the break-even batch
    and the layer size above which TP pays at this batch (D = 4096)."""
    step = layer_step(cfg, batch, CONTEXT, DEVICES)
    tp, dp = tp_seconds(cfg, chip, batch, CONTEXT, DEVICES), dp_seconds(cfg, chip, batch, CONTEXT)
    fits = fits_one_chip(cfg, chip, batch, CONTEXT)
    return {
        "params_m": cfg.num_params() / 1e6, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
        "weight_mb": step.weight_bytes / 1e6, "kv_mb": step.kv_bytes / 1e6,
        "allreduce_mb": step.allreduce_bytes / 1e6, "link_mb": step.link_bytes / 1e6,
        "kv_split": step.kv_split, "tp_us": None if tp is None else tp * 1e6, "dp_us": dp * 1e6,
        "faster": ("TP (DP does not fit)" if not fits and tp is not None
                   else "DP" if tp is None or dp <= tp else "TP"),
        "dp_fits": fits,
        "dp_gb_per_chip": dp_bytes_per_chip(cfg, batch, CONTEXT) / 1e9,
        "break_even_batch": break_even_batch(cfg, chip, CONTEXT),
        "tp_pays_above_layer_mb": min_layer_bytes_for_tp(chip, 4096, batch) / 1e6,
        "hbm_tb_s": chip.hbm_bytes_per_s / 1e12, "link_gb_s": chip.link_bytes_per_s / 1e9,
        "hbm_gb": chip.hbm_bytes / 1e9, "allreduce_latency_us": ALLREDUCE_LATENCY_S * 1e6,
        "context": CONTEXT, "devices": DEVICES, "itemsize": ITEMSIZE, "source": chip.source}
