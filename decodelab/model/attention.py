"""Causal attention over explicit positions, with or without a KV cache; MHA, GQA and MQA alike.

Masking is by position only: query at position p sees keys at positions <= p. With a cache, slot j
holds position j, so stale slots (at or past a row's length) are always in the future of every valid
query and are never attended. Padding at the end of a block is likewise in the future of every valid
query of that block. Masked scores use the most negative finite float, never -inf, so a fully padded
row yields finite garbage that callers ignore rather than NaN.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab.cache import KVCache
from decodelab.config import ModelConfig
from decodelab.model.layers import normal, residual_init
from decodelab.model.positions import PositionEncoding


def causal_attention(
    q: jax.Array,  # [B, T, N, H]
    k: jax.Array,  # [B, S, K, H]
    v: jax.Array,  # [B, S, K, H]
    q_pos: jax.Array,  # [B, T]
    k_pos: jax.Array,  # [B, S]
    bias: jax.Array | None,  # [B, N, T, S]
) -> jax.Array:  # [B, T, N, H]
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    q = q.reshape(B, T, K, G, H)  # query head n = k * G + g shares kv head k
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", q, k).astype(jnp.float32) / math.sqrt(H)
    if bias is not None:
        scores = scores + bias.reshape(B, K, G, T, S)
    visible = k_pos[:, None, :] <= q_pos[:, :, None]  # [B, T, S]
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v)
    return out.reshape(B, T, N, H)


class Attention(nnx.Module):
    """Projections D -> (N, H) queries and (K, H) keys/values, causal attention, (N, H) -> D;
    each projection has a bias when ``cfg.attention_bias``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        dtype = jnp.dtype(cfg.dtype)
        init = normal(D**-0.5)

        def bias(*shape: int) -> tuple[int, ...] | None:
            """A projection's bias shape (None: no bias)."""
            return shape if cfg.attention_bias else None

        self.q = nnx.Einsum("BTD,DNH->BTNH", (D, N, H), bias(N, H), dtype=dtype, kernel_init=init,
                            rngs=rngs)
        self.k = nnx.Einsum("BTD,DKH->BTKH", (D, K, H), bias(K, H), dtype=dtype, kernel_init=init,
                            rngs=rngs)
        self.v = nnx.Einsum("BTD,DKH->BTKH", (D, K, H), bias(K, H), dtype=dtype, kernel_init=init,
                            rngs=rngs)
        self.o = nnx.Einsum("BTNH,NHD->BTD", (N, H, D), bias(D), dtype=dtype,
                            kernel_init=residual_init(cfg, N * H), rngs=rngs)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: PositionEncoding,
        q_pos: jax.Array,  # [B, T]
        k_pos: jax.Array,  # [B, S]: q_pos without a cache, the slot index with one
        bias: jax.Array | None,  # [B, N, T, S]
        cache: KVCache | None,
        layer: int,
    ) -> tuple[jax.Array, KVCache | None]:
        q = positions.rotate(self.q(x), q_pos)
        k = positions.rotate(self.k(x), q_pos)
        v = self.v(x)
        if cache is not None:
            cache = cache.write(layer, k, v)
            k, v = cache.k[layer], cache.v[layer]  # [B, S, K, H]
        out = causal_attention(q, k, v, q_pos, k_pos, bias)
        return self.o(out), cache
