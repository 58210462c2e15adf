"""The int4 KV cache in KIVI's layout (Liu et al. 2024, "KIVI: a tuning-free asymmetric 2bit
quantization for KV cache"), behind the ``base.Cache`` protocol (``kv_cache="int4"`` or a
``Kivi`` for other sizes, ``kinds.init_cache``): keys quantized per channel over groups of ``G``
consecutive slots, values per token over groups of channels, both uint4 with an asymmetric
min-max scale and zero point, and the newest slots in float. Every quantized element is within
half its scale of the value written (round to nearest).

``KiviKVCache``, exactly:

- A query at position ``p`` reads the slots below ``below(p) = G * floor(max(p + 1 - R, 0) / G)``
  dequantized and the slots ``below(p) .. p`` in float: a key group is used quantized once it is
  complete and its last slot is at least ``R`` (``residual``) slots older than the query; the
  incomplete newest group and the ``R`` newest slots stay float. What a query reads depends only
  on the tokens at positions ``<= p``, never on how they were split into blocks, so one prefill,
  prefill then steps, a speculative verify block and a rewind all give the same logits.
- ``write`` quantizes each token's values at once, and re-quantizes every key group the block
  completes (its earlier slots come from the float ring), assuming the whole block is valid: a
  group holding padding is only read by padding queries and is quantized again, from the real
  tokens, when a later block completes it. Groups wholly below a row's length never change, so
  a rewind keeps them; a rewound group is re-quantized when it is completed again.
- Float copies live in a per-row ring of ``W = R + G - 1 + max_rewind`` slots (slot ``j`` at
  ``j mod W``), written by ``advance`` with the valid tokens only (so padding never evicts a kept
  slot). A rewind is exact when it goes back at most ``max_rewind`` slots (the ring still holds
  every float slot the new length needs) or to 0; deeper rewinds raise when the lengths are
  concrete. Speculative decoding rewinds at most ``gamma + 1`` slots.
- Between ``write`` and ``advance`` the block's float keys and values are held whole
  (``pending``, ``[L, B, T, K, H]``): attention reads them through ``float_tail``, and the
  quantized slots below each query's ``below`` through ``read_stored``.
- Bytes per token (``kinds.bytes_per_token``): ``4 + 64 / G`` bits per key channel and ``4``
  bits per value channel plus a float32 scale and zero per group of ``value_group`` channels; the
  ring adds ``W`` float slots per row, a constant.

Keys are quantized per channel because keys have outlier channels, on which a per-token scale
spends its 16 levels (KIVI's reason).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.cache.base import Cache, FloatTail, is_concrete, nbytes_of, rewound_lengths
from decodelab.cache.dense import KVCache
from decodelab.config import ModelConfig

UINT4_MAX = 15  # KiviKVCache's levels 0 .. 15


@dataclasses.dataclass(frozen=True)
class Kivi:
    """The int4 cache in KIVI's layout (module docstring); ``kv_cache="int4"`` is ``Kivi()``."""

    group_size: int = 32  # G: slots per key group (one scale and zero per channel per group)
    residual: int = 0  # R: newest slots kept in float besides the incomplete group
    value_group: int = 32  # channels per value scale (all H when H is not a larger multiple)
    max_rewind: int = 16  # deepest exact rewind (slots below the length)

    def __post_init__(self):
        for name, low in (("group_size", 1), ("residual", 0), ("value_group", 1),
                          ("max_rewind", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    @property
    def float_slots(self) -> int:
        """W: ring slots per row holding float copies of the newest tokens."""
        return max(1, self.residual + self.group_size - 1 + self.max_rewind)

    def value_groups(self, head_dim: int) -> int:
        """Value scale groups per token and kv head."""
        size = self.value_group
        return head_dim // size if head_dim % size == 0 and head_dim > size else 1

    def below(self, q_pos: jax.Array) -> jax.Array:
        """``[B, T]``: a query at ``q_pos`` reads slots below this dequantized, the rest float."""
        G = self.group_size
        return jnp.maximum(q_pos + 1 - self.residual, 0) // G * G


def quantize_minmax(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``x`` -> ``(uint4 levels, scale, zero)`` with one asymmetric scale and zero (the minimum)
    per slice along ``axis`` (kept as size 1): ``x ~ level * scale + zero``."""
    x = x.astype(jnp.float32)
    zero = jnp.min(x, axis=axis, keepdims=True)
    scale = (jnp.max(x, axis=axis, keepdims=True) - zero) / UINT4_MAX
    scale = jnp.where(scale > 0, scale, 1.0)
    levels = jnp.clip(jnp.round((x - zero) / scale), 0, UINT4_MAX).astype(jnp.uint4)
    return levels, scale, zero


@struct.dataclass(kw_only=True)
class KiviKVCache(Cache):
    """int4 keys per channel over groups of slots, values per token, the newest slots in float
    (module docstring)."""

    k: jax.Array  # [L, B, K, S, H] uint4
    k_scale: jax.Array  # [L, B, K, S/G (rounded up), H] float32, per channel per group
    k_zero: jax.Array  # [L, B, K, S/G (rounded up), H] float32
    v: jax.Array  # [L, B, K, S, H] uint4
    v_stats: jax.Array  # [L, B, K, S, 2 Gv] float32: Gv scales, then Gv zeros, per token
    ring_k: jax.Array  # [L, B, K, W, H] float: slot j at j mod W
    ring_v: jax.Array  # [L, B, K, W, H]
    lengths: jax.Array  # [B] int32
    pending_k: jax.Array | None = None  # [L, B, T, K, H]: the block between write and advance
    pending_v: jax.Array | None = None
    spec: Kivi = struct.field(pytree_node=False)

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, max_len: int,
             spec: Kivi | None = None) -> KiviKVCache:
        """An empty cache of ``max_len`` slots per row (all lengths 0)."""
        spec = Kivi() if spec is None else spec
        if not isinstance(spec, Kivi):
            raise ValueError(f"spec must be a cache.Kivi, got {spec!r}")
        template = KVCache.init(cfg, batch_size, max_len)  # validates the sizes
        L, B, K, S, H = template.k.shape
        NG = -(-S // spec.group_size)
        Gv = spec.value_groups(H)
        W = spec.float_slots
        return cls(k=jnp.zeros((L, B, K, S, H), jnp.uint4),
                   k_scale=jnp.zeros((L, B, K, NG, H), jnp.float32),
                   k_zero=jnp.zeros((L, B, K, NG, H), jnp.float32),
                   v=jnp.zeros((L, B, K, S, H), jnp.uint4),
                   v_stats=jnp.zeros((L, B, K, S, 2 * Gv), jnp.float32),
                   ring_k=jnp.zeros((L, B, K, W, H), template.k.dtype),
                   ring_v=jnp.zeros((L, B, K, W, H), template.k.dtype), lengths=template.lengths,
                   spec=spec)

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def _values(self) -> KVCache:
        """The values and their scales as a KVCache (to write them per token alike)."""
        return KVCache(k=self.v, v=self.v_stats, lengths=self.lengths)

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> KiviKVCache:
        """Store ``k, v: [B, T, K, H]`` at each row's length (``KVCache.write``): values
        quantized per token, the key groups the block completes quantized per channel, the
        block kept in float until ``advance``."""
        S = self.max_len
        if k.shape[1] > S:
            k, v = k[:, :S], v[:, :S]
        B, T, K, H = k.shape
        Gv = self.v_stats.shape[-1] // 2
        levels, scale, zero = quantize_minmax(v.reshape(B, T, K, Gv, H // Gv), axis=-1)
        stats = jnp.concatenate([scale[..., 0], zero[..., 0]], axis=-1)  # [B, T, K, 2 Gv]
        values = self._values.write(layer, levels.reshape(B, T, K, H), stats)
        shape = (self.k.shape[0], B, T, K, H)
        pending_k = jnp.zeros(shape, k.dtype) if self.pending_k is None else self.pending_k
        pending_v = jnp.zeros(shape, v.dtype) if self.pending_v is None else self.pending_v
        cache = self.replace(v=values.k, v_stats=values.v,
                             pending_k=pending_k.at[layer].set(k.astype(pending_k.dtype)),
                             pending_v=pending_v.at[layer].set(v.astype(pending_v.dtype)))
        return cache._write_key_groups(layer, k)

    def _write_key_groups(self, layer: int, k: jax.Array) -> KiviKVCache:
        """Quantize every key group that ends inside the block ``k: [B, T, K, H]`` (written at the
        lengths), per channel, from the ring's earlier slots of the group and the block."""
        B, T, K, H = k.shape
        G, W, S = self.spec.group_size, self.spec.float_slots, self.max_len
        NG = self.k_scale.shape[3]
        L0 = self.lengths  # [B]
        earlier = L0[:, None] - (G - 1) + jnp.arange(G - 1, dtype=jnp.int32)[None, :]  # [B, G-1]
        ring = jnp.take_along_axis(self.ring_k[layer], (earlier % W)[:, None, :, None], axis=2)
        block = jnp.swapaxes(k, 1, 2).astype(ring.dtype)  # [B, K, T, H]
        span = jnp.concatenate([ring, block, jnp.zeros((B, K, G, H), ring.dtype)], axis=2)
        n = (G - 1 + T) // G  # groups the block can complete
        first = L0 - L0 % G  # [B], start of the row's incomplete group
        offset = (G - 1) - L0 % G  # [B], where ``first`` sits in ``span``
        at = offset[:, None] + jnp.arange(n * G, dtype=jnp.int32)[None, :]  # [B, n G]
        groups = jnp.take_along_axis(span, at[:, None, :, None], axis=2).reshape(B, K, n, G, H)
        levels, scale, zero = quantize_minmax(groups, axis=3)  # [B, K, n, G, H], [B, K, n, 1, H]
        ends = first[:, None] + G * (jnp.arange(n, dtype=jnp.int32)[None, :] + 1)  # [B, n]
        done = (ends <= (L0 + T)[:, None]) & (ends <= S)
        group = jnp.where(done, first[:, None] // G + jnp.arange(n, dtype=jnp.int32)[None, :], NG)
        slot = jnp.where(done[:, :, None],
                         (ends - G)[:, :, None] + jnp.arange(G, dtype=jnp.int32)[None, None, :],
                         S)  # [B, n, G]
        rows = jnp.arange(B)[:, None]
        levels = jnp.moveaxis(levels.reshape(B, K, n * G, H), 2, 1)  # [B, n G, K, H]
        return self.replace(
            k=self.k.at[layer, rows, :, slot.reshape(B, n * G)].set(levels, mode="drop"),
            k_scale=self.k_scale.at[layer, rows, :, group].set(
                jnp.moveaxis(scale[:, :, :, 0], 2, 1), mode="drop"),
            k_zero=self.k_zero.at[layer, rows, :, group].set(
                jnp.moveaxis(zero[:, :, :, 0], 2, 1), mode="drop"))

    def read_stored(self, layer: int, start, size: int) -> tuple[jax.Array, jax.Array]:
        """Slots ``[start, start + size)`` (start clamped as in ``KVCache.read``) as stored,
        dequantized, ``[B, K, size, H]`` each; slots not yet quantized read as garbage."""
        _, B, K, S, H = self.k.shape
        G = self.spec.group_size
        first = jnp.clip(start, 0, S - size)
        slots = first + jnp.arange(size, dtype=jnp.int32)  # [size]
        index = (layer, 0, 0, first, 0)
        k = jax.lax.dynamic_slice(self.k, index, (1, B, K, size, H))[0].astype(jnp.float32)
        group = slots // G
        k = k * jnp.take(self.k_scale[layer], group, axis=2) + jnp.take(self.k_zero[layer], group,
                                                                        axis=2)
        Gv = self.v_stats.shape[-1] // 2
        v = jax.lax.dynamic_slice(self.v, index, (1, B, K, size, H))[0].astype(jnp.float32)
        stats = jax.lax.dynamic_slice(self.v_stats, index, (1, B, K, size, 2 * Gv))[0]
        v = v.reshape(B, K, size, Gv, H // Gv) * stats[..., :Gv, None] + stats[..., Gv:, None]
        dtype = self.ring_k.dtype
        return k.astype(dtype), v.reshape(B, K, size, H).astype(dtype)

    def float_tail(self, layer: int, q_pos: jax.Array) -> FloatTail:
        """The float slots the block's queries ``q_pos: [B, T]`` read (after ``write``, before
        ``advance``): the ring before the block and the block itself."""
        W = self.spec.float_slots
        L0 = self.lengths[:, None]  # [B, 1]
        T = self.pending_k.shape[2]
        ring = jnp.arange(W, dtype=jnp.int32)[None, :]  # [1, W]
        ring_pos = L0 - W + (ring - (L0 - W)) % W  # [B, W]: the slot in [L0 - W, L0) at each
        block_pos = L0 + jnp.arange(T, dtype=jnp.int32)[None, :]  # [B, T]
        return FloatTail(
            k=jnp.concatenate([self.ring_k[layer], jnp.swapaxes(self.pending_k[layer], 1, 2)], 2),
            v=jnp.concatenate([self.ring_v[layer], jnp.swapaxes(self.pending_v[layer], 1, 2)], 2),
            positions=jnp.concatenate([ring_pos, block_pos], axis=1),
            below=self.spec.below(q_pos))

    def read(self, layer: int, start, size: int) -> tuple[jax.Array, jax.Array]:
        """``KVCache.read``: slots ``[start, start + size)`` as a query at each row's newest
        position reads them: below ``below(length - 1)`` dequantized, from there float (the ring,
        then a written block not yet advanced); stale slots past those hold garbage."""
        k, v = self.read_stored(layer, start, size)
        W = self.spec.float_slots
        first = jnp.clip(start, 0, self.max_len - size)
        slots = (first + jnp.arange(size, dtype=jnp.int32))[None, :]  # [1, size]
        L0 = self.lengths[:, None]  # [B, 1]
        T = 0 if self.pending_k is None else self.pending_k.shape[2]
        floats = ((slots >= self.spec.below(L0 - 1)) & (slots >= L0 - W)
                  & (slots < L0 + T))  # [B, size]
        if T:
            tail = self.float_tail(layer, L0 - 1)
            tail_k, tail_v = tail.k, tail.v
        else:
            tail_k, tail_v = self.ring_k[layer], self.ring_v[layer]
        entry = jnp.where(slots < L0, slots % W, W + slots - L0)  # [B, size]
        entry = jnp.clip(entry, 0, tail_k.shape[2] - 1)[:, None, :, None]
        pick = floats[:, None, :, None]
        return (jnp.where(pick, jnp.take_along_axis(tail_k, entry, axis=2), k),
                jnp.where(pick, jnp.take_along_axis(tail_v, entry, axis=2), v))

    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Refused: a row's key groups are quantized from its own float ring, which holds only
        the slots that row wrote, so rows cannot share history (``kinds.check_kind`` refuses
        this kind where they would)."""
        raise ValueError("an int4 (KIVI) cache cannot give one row another row's slots: its key "
                         "groups and float ring follow each row's own history")

    def advance(self, num_valid: jax.Array) -> KiviKVCache:
        """Move each row's length forward by ``num_valid: [B]`` tokens, copying the newest of
        them (at most W) into the ring; the rest of the block is padding."""
        num_valid = num_valid.astype(jnp.int32)
        if self.pending_k is None:
            return self.replace(lengths=self.lengths + num_valid)
        B, T = self.pending_k.shape[1:3]
        W = self.spec.float_slots
        t = jnp.arange(T, dtype=jnp.int32)[None, :]  # [1, T]
        n = num_valid[:, None]
        keep = (t < n) & (t >= n - W)  # [B, T]: no two kept tokens share a ring slot
        slot = jnp.where(keep, (self.lengths[:, None] + t) % W, W)  # [B, T]
        rows = jnp.arange(B)[:, None]

        def put(ring, block):  # [L, B, K, W, H] <- [L, B, T, K, H]
            return ring.at[:, rows, :, slot].set(jnp.moveaxis(block, 0, 2).astype(ring.dtype),
                                                 mode="drop")

        return self.replace(ring_k=put(self.ring_k, self.pending_k),
                            ring_v=put(self.ring_v, self.pending_v),
                            lengths=self.lengths + num_valid, pending_k=None, pending_v=None)

    def take_rows(self, rows: jax.Array) -> KiviKVCache:
        """``KVCache.take_rows``: every array's row ``i`` from row ``rows[i]``."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(**{name: getattr(self, name)[:, rows] for name in
                               ("k", "k_scale", "k_zero", "v", "v_stats", "ring_k", "ring_v")},
                            lengths=self.lengths[rows])

    def rewind(self, lengths) -> KiviKVCache:
        """``KVCache.rewind``; exact down to ``max_rewind`` slots below the length, or to 0
        (module docstring)."""
        lengths = rewound_lengths(lengths, self.lengths)
        if is_concrete(lengths) and is_concrete(self.lengths):
            new, old = np.asarray(lengths), np.asarray(self.lengths)
            deep = (new > 0) & (old - new > self.spec.max_rewind)
            if deep.any():
                raise ValueError(
                    f"rewind lengths must be 0 or at most max_rewind={self.spec.max_rewind} "
                    f"slots below the current length for an int4 (KIVI) cache, got "
                    f"{new.tolist()} for current lengths {old.tolist()}")
        return self.replace(lengths=lengths)

    def nbytes(self) -> int:
        """Bytes of the stored keys, values, scales, zero points and the float ring."""
        return nbytes_of(self.k, self.k_scale, self.k_zero, self.v, self.v_stats, self.ring_k,
                         self.ring_v)
