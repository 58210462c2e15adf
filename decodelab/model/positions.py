"""Position encodings: one small class each, behind one interface, chosen by ``ModelConfig.position``.

Every encoding sees explicit per-row positions (``[B, T]`` int32, the absolute position of each
query token in its row) and may act at up to three places:

- ``embed(x, positions)``: change the token embeddings ``[B, T, D]`` (learned, sinusoidal);
- ``rotate(x, positions)``: transform queries ``[B, T, N, H]`` and keys ``[B, T, K, H]`` before the
  keys enter the cache (RoPE and its context-extension scalings);
- ``bias(q_pos, k_pos)``: an additive attention bias ``[B, N, T, S]`` computed once per forward pass
  and shared by all layers (T5 relative buckets, ALiBi).

The defaults are the identity (and no bias), so ``nope`` is the base class itself. ``max_positions``
is the number of positions an encoding can represent (``None``: unbounded); the model checks it
against the longest position a call can reach before anything is computed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.config import ModelConfig


class PositionEncoding(nnx.Module):
    """No position information (NoPE): the causal mask alone orders the tokens."""

    max_positions: int | None = None

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del cfg, rngs

    def embed(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        return x

    def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        return x

    def bias(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array | None:
        return None


class Learned(PositionEncoding):
    """A trained table of ``max_seq_len`` absolute position vectors added to the embeddings."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.max_positions = cfg.max_seq_len
        self.table = nnx.Embed(
            cfg.max_seq_len, cfg.d_model, dtype=jnp.dtype(cfg.dtype),
            embedding_init=nnx.initializers.normal(cfg.d_model**-0.5), rngs=rngs,
        )

    def embed(self, x, positions):
        # The model bounds every real position by the table; only block padding can lie past it,
        # and clipping keeps its (ignored) logits finite where an out-of-range take gives NaN.
        return x + self.table(jnp.minimum(positions, self.max_positions - 1))


def sinusoid(positions: jax.Array, width: int, base: float = 10000.0) -> jax.Array:
    """Vaswani et al. (2017): dims 2i and 2i+1 are sin and cos of ``pos / base^(2i/width)``.

    ``positions: [...]`` -> ``[..., width]`` float32, defined for any position.
    """
    inv_freq = base ** (-np.arange(0, width, 2, dtype=np.float64) / width)  # [width/2]
    inv_freq = inv_freq.astype(np.float32).reshape((1,) * positions.ndim + (-1,))  # [1.., width/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., width/2]
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, width)


class Sinusoidal(PositionEncoding):
    """Fixed sinusoids added to embeddings scaled by sqrt(D), as in the original Transformer."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.width = cfg.d_model

    def embed(self, x, positions):
        return x * math.sqrt(self.width) + sinusoid(positions, self.width).astype(x.dtype)


# --- RoPE ---------------------------------------------------------------------------------------
# A scaling rule maps the config and each token's extent (the number of positions its row reaches
# at that token: position + 1, any shape [...] int32) to inverse frequencies and an attention
# factor (the cos/sin multiplier). Position interpolation, NTK-aware, YaRN and Llama 3 ignore the
# extent and give [H/2] constants; dynamic NTK depends on it and gives [..., H/2]. All act only
# through these two values, so they are one mechanism.


def _rope_base_frequencies(cfg: ModelConfig, theta: float) -> np.ndarray:
    return theta ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)


def _rope_none(cfg: ModelConfig, extent: jax.Array | None) -> tuple[np.ndarray, float]:
    return _rope_base_frequencies(cfg, cfg.rope_theta), 1.0


def _rope_linear(cfg: ModelConfig, extent: jax.Array | None) -> tuple[np.ndarray, float]:
    # Position interpolation (Chen et al. 2023): position p is rotated as p / s.
    return _rope_base_frequencies(cfg, cfg.rope_theta) / cfg.rope_scaling_factor, 1.0


def _rope_ntk(cfg: ModelConfig, extent: jax.Array | None) -> tuple[np.ndarray, float]:
    # NTK-aware: raise the base so the lowest frequency is interpolated by s and the highest kept.
    H, s = cfg.head_dim, cfg.rope_scaling_factor
    exponent = H / (H - 2) if H > 2 else 1.0
    return _rope_base_frequencies(cfg, cfg.rope_theta * s**exponent), 1.0


def _rope_yarn(cfg: ModelConfig, extent: jax.Array | None) -> tuple[np.ndarray, float]:
    # YaRN (Peng et al. 2023): dimensions with many rotations over the original context keep their
    # frequency, those with few are interpolated by s, a linear ramp between; logits get sqrt(t)
    # with sqrt(t) = 0.1 ln s + 1, applied here to both cos and sin (so q.k scales by its square).
    H, s, base = cfg.head_dim, cfg.rope_scaling_factor, cfg.rope_theta
    original = cfg.rope_original_max_len

    def dim_for_rotations(rotations: float) -> float:
        return H * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_for_rotations(cfg.yarn_beta_fast)), 0)
    high = min(math.ceil(dim_for_rotations(cfg.yarn_beta_slow)), H - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(H // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1: extrapolate (keep frequency), 0: interpolate by s
    base_freq = _rope_base_frequencies(cfg, base)
    inv_freq = base_freq / s * (1.0 - keep) + base_freq * keep
    return inv_freq, 0.1 * math.log(s) + 1.0


def _rope_llama3(cfg: ModelConfig, extent: jax.Array | None) -> tuple[np.ndarray, float]:
    # Llama 3.1: wavelengths longer than original / low_freq_factor are interpolated by s, those
    # shorter than original / high_freq_factor kept, and those between blended by how many times
    # they fit into the original context.
    s, original = cfg.rope_scaling_factor, cfg.rope_original_max_len
    low, high = cfg.llama3_low_freq_factor, cfg.llama3_high_freq_factor
    base_freq = _rope_base_frequencies(cfg, cfg.rope_theta)
    wavelength = 2 * math.pi / base_freq
    smooth = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)  # 0: interpolate
    return base_freq / s * (1.0 - smooth) + base_freq * smooth, 1.0


def _rope_dynamic(cfg: ModelConfig, extent: jax.Array | None) -> tuple[jax.Array, float]:
    """Dynamic NTK, per position: the token at position p is rotated with the base
    ``theta * (s * E / original - (s - 1)) ** (H / (H - 2))``, ``E = max(p + 1, original)``.

    Hugging Face's "dynamic" rope computes one base per forward pass from the longest sequence in
    it (``E`` = the pass's largest position + 1, shared by every token and row of the pass). That
    depends on how the sequence is cut into passes: a full forward over L tokens rotates position
    p with extent L, token-by-token decoding with extent p + 1, and a chunk or a speculative
    verify block with the extent of its last position; cached keys keep the rotation of the pass
    that wrote them. Here the extent is each token's own (``extent = positions + 1``), so a
    token's rotation depends only on its position: a full forward, a prefill then step-by-step
    decoding, a chunked prefill and a verify block of ``gamma + 1`` tokens give the same logits,
    and speculative decoding stays exact. Up to the original context both definitions are the
    unscaled RoPE; past it they agree with each other on the last token of each Hugging Face pass
    (so they agree exactly in token-by-token decoding). Without an extent the frequencies are the
    unscaled ones."""
    base_freq = _rope_base_frequencies(cfg, cfg.rope_theta)
    if extent is None:
        return base_freq, 1.0
    H, s, original = cfg.head_dim, cfg.rope_scaling_factor, cfg.rope_original_max_len
    length = jnp.maximum(extent, original).astype(jnp.float32)  # [...]
    growth = (s * length / original - (s - 1.0)) ** (H / (H - 2))  # [...]: base multiplier
    exponents = jnp.asarray(np.arange(0, H, 2) / H, jnp.float32)  # [H/2]
    exponents = exponents.reshape((1,) * growth.ndim + (-1,))  # [1.., H/2]
    return (cfg.rope_theta * growth[..., None]) ** -exponents, 1.0  # [..., H/2]


ROPE_SCALING_RULES = {"none": _rope_none, "linear": _rope_linear, "ntk": _rope_ntk,
                      "yarn": _rope_yarn, "dynamic": _rope_dynamic, "llama3": _rope_llama3}


def rope_frequencies(cfg: ModelConfig, extent: jax.Array | None = None
                     ) -> tuple[np.ndarray | jax.Array, float]:
    """Inverse frequencies and the cos/sin multiplier for ``cfg``'s RoPE scaling: ``[H/2]``, or
    ``[..., H/2]`` for a rule that depends on the ``extent: [...]`` (dynamic NTK)."""
    return ROPE_SCALING_RULES[cfg.rope_scaling](cfg, extent)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray | jax.Array,
               factor: float) -> jax.Array:
    """Rotate ``x: [B, T, heads, H]`` by ``positions: [B, T]`` at ``inv_freq: [H/2]`` (or one row
    of frequencies per batch row, ``[B, H/2]``, or per token, ``[B, T, H/2]``).

    Pairs are (i, i + H/2) ("rotate half", the GPT-NeoX / Llama layout used by Hugging Face
    checkpoints), rotated counter-clockwise by ``position * inv_freq[i]`` as in RoFormer.
    """
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    if inv_freq.ndim < 3:
        rows = inv_freq.shape[0] if inv_freq.ndim == 2 else 1
        inv_freq = inv_freq.reshape(rows, 1, inv_freq.shape[-1])  # [B or 1, 1, H/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
    cos = (jnp.cos(angles) * factor)[:, :, None, :]  # [B, T, 1, H/2]
    sin = (jnp.sin(angles) * factor)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


class Rope(PositionEncoding):
    """Rotary position embedding (Su et al.), with the context-extension scaling of the config."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg

    def rotate(self, x, positions):
        # Each token's extent is its own position + 1 (see _rope_dynamic: cache-consistent).
        # Rules that ignore it make constants.
        inv_freq, factor = rope_frequencies(self.config, positions + 1)
        return apply_rope(x, positions, inv_freq, factor)


# --- Attention biases ---------------------------------------------------------------------------


def t5_relative_bucket(
    relative_position: jax.Array, num_buckets: int = 32, max_distance: int = 128
) -> jax.Array:
    """T5's unidirectional (``bidirectional=False``) relative position bucket.

    ``relative_position = key_pos - query_pos`` (<= 0 for keys a causal query sees). Distances
    ``n = -relative_position`` below ``num_buckets // 2`` get a bucket each; larger ones share
    logarithmically wider buckets up to ``max_distance``, beyond which all use the last bucket.
    """
    n = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(n, max_exact).astype(jnp.float32) / max_exact)
    large = max_exact + (
        log_ratio / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return jnp.where(n < max_exact, n, large)


class T5Bias(PositionEncoding):
    """T5 relative attention: a learned scalar per (bucket, head), shared across layers."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.num_buckets = cfg.t5_num_buckets
        self.max_distance = cfg.t5_max_distance
        self.table = nnx.Embed(
            cfg.t5_num_buckets, cfg.n_heads, embedding_init=nnx.initializers.normal(0.5),
            rngs=rngs,
        )

    def bias(self, q_pos, k_pos):
        relative = k_pos[:, None, :] - q_pos[:, :, None]  # [B, T, S]
        buckets = t5_relative_bucket(relative, self.num_buckets, self.max_distance)
        return jnp.transpose(self.table(buckets), (0, 3, 1, 2)).astype(jnp.float32)  # [B, N, T, S]


def alibi_slopes(n_heads: int) -> np.ndarray:
    """Press et al. (2022): the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a power of two;
    otherwise the slopes of the nearest lower power of two followed by every other slope of the
    next power of two."""

    def power_of_two(n: int) -> list[float]:
        # 2^(-8(i+1)/n) directly, not start**(i+1): repeated rounding of start drifts by ulps.
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(closest)
    if closest != n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return np.asarray(slopes, dtype=np.float64)


class ALiBi(PositionEncoding):
    """Attention with linear biases: head h subtracts ``slope[h] * (q_pos - k_pos)``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.slopes = tuple(float(s) for s in alibi_slopes(cfg.n_heads))

    def bias(self, q_pos, k_pos):
        distance = (q_pos[:, :, None] - k_pos[:, None, :]).astype(jnp.float32)  # [B, T, S]
        slopes = jnp.asarray(self.slopes, jnp.float32)[None, :, None, None]  # [1, N, 1, 1]
        return -slopes * distance[:, None, :, :]  # [B, N, T, S]


POSITION_ENCODINGS: dict[str, type[PositionEncoding]] = {
    "learned": Learned,
    "sinusoidal": Sinusoidal,
    "t5": T5Bias,
    "alibi": ALiBi,
    "rope": Rope,
    "nope": PositionEncoding,
}
