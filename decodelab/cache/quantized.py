"""The int8 KV cache: keys and values ``[L, B, K, S, H]`` int8 with one symmetric float32 scale
``max |x| / 127`` per token and kv head, behind the ``base.Cache`` protocol, so attention,
decoding, speculative rollback, beam search and the serving engine use it unchanged
(``kv_cache="int8"``, ``kinds.init_cache``). ``read`` dequantizes on the fly; every element is
within half its scale of the value written (round to nearest). A scale per token means a slot
reads the same from whichever row holds it, so beams can share it (``gather``).

The int4 cache in KIVI's layout is ``kivi.KiviKVCache``; the quantization study
(``experiments/quantization.py``) measures each kind's KL divergence against the float32 cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from decodelab.cache.base import Cache, CacheWrapper, nbytes_of
from decodelab.cache.dense import KVCache
from decodelab.config import ModelConfig

QMAX = {"int8": 127}  # symmetric kinds of QuantizedKVCache -> largest magnitude stored


def quantize_block(x: jax.Array, kind: str) -> tuple[jax.Array, jax.Array]:
    """``x [..., H]`` -> ``(values [..., H] int8, scales [..., 1] float32)``, symmetric."""
    qmax = QMAX[kind]
    x = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / qmax  # [..., 1]
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(x / scale), -qmax, qmax).astype(jnp.int8), scale


def dequantize_block(q: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    """``values [..., H]`` with ``scales [..., 1]`` -> float ``[..., H]``."""
    return (q.astype(jnp.float32) * scale).astype(dtype)


@struct.dataclass(kw_only=True)
class QuantizedKVCache(CacheWrapper):
    """Keys and values stored as int8 with one scale per token and kv head (module docstring);
    the int8 values are a ``KVCache``, which holds the lengths."""

    values: KVCache  # k, v: [L, B, K, S, H] int8; the lengths
    k_scale: jax.Array  # [L, B, K, S, 1] float32
    v_scale: jax.Array  # [L, B, K, S, 1] float32
    kind: str = struct.field(pytree_node=False)
    dtype: str = struct.field(pytree_node=False)  # what ``read`` returns

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, max_len: int,
             kind: str = "int8") -> QuantizedKVCache:
        """An empty cache of ``max_len`` slots per row (all lengths 0) storing ``kind``."""
        if kind not in QMAX:
            raise ValueError(f"kind must be one of {tuple(QMAX)} for a QuantizedKVCache, got "
                             f"{kind!r} (KVCache for float, KiviKVCache for int4)")
        template = KVCache.init(cfg, batch_size, max_len)  # validates the sizes
        L, B, K, S, H = template.k.shape
        values = KVCache(k=jnp.zeros((L, B, K, S, H), jnp.int8),
                         v=jnp.zeros((L, B, K, S, H), jnp.int8), lengths=template.lengths)
        return cls(values=values, k_scale=jnp.zeros((L, B, K, S, 1), jnp.float32),
                   v_scale=jnp.zeros((L, B, K, S, 1), jnp.float32), kind=kind,
                   dtype=str(jnp.dtype(cfg.dtype)))

    @property
    def inner(self) -> KVCache:
        return self.values

    def with_inner(self, inner: Cache) -> QuantizedKVCache:
        return self.replace(values=inner)

    @property
    def _scales(self) -> KVCache:
        """The scales as a KVCache at the values' lengths (to write and read them alike)."""
        return KVCache(k=self.k_scale, v=self.v_scale, lengths=self.values.lengths)

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> QuantizedKVCache:
        """``KVCache.write`` of ``k, v: [B, T, K, H]``, quantized per token."""
        qk, sk = quantize_block(k, self.kind)
        qv, sv = quantize_block(v, self.kind)
        scales = self._scales.write(layer, sk, sv)
        return self.replace(values=self.values.write(layer, qk, qv), k_scale=scales.k,
                            v_scale=scales.v)

    def read(self, layer: int, start, size: int) -> tuple[jax.Array, jax.Array]:
        """``KVCache.read``: slots ``[start, start + size)`` dequantized, ``[B, K, size, H]``."""
        qk, qv = self.values.read(layer, start, size)
        sk, sv = self._scales.read(layer, start, size)
        return (dequantize_block(qk, sk, self.dtype), dequantize_block(qv, sv, self.dtype))

    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``KVCache.gather``, dequantized."""
        qk, qv = self.values.gather(layer, rows, slots)
        sk, sv = self._scales.gather(layer, rows, slots)
        return (dequantize_block(qk, sk, self.dtype), dequantize_block(qv, sv, self.dtype))

    def take_rows(self, rows: jax.Array) -> QuantizedKVCache:
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(values=self.values.take_rows(rows), k_scale=self.k_scale[:, rows],
                            v_scale=self.v_scale[:, rows])

    def nbytes(self) -> int:
        """Bytes of the stored keys, values and scales."""
        return nbytes_of(self.values.k, self.values.v, self.k_scale, self.v_scale)
