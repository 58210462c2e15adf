"""Causal attention over explicit positions, with or without a KV cache; MHA, GQA and MQA alike.

Masking is by position only: query at position p sees keys at positions <= p. With a cache, slot j
holds position j, so stale slots (at or past a row's length) are always in the future of every valid
query and are never attended. Padding at the end of a block is likewise in the future of every valid
query of that block. Masked scores use the most negative finite float, never -inf, so a fully padded
row yields finite garbage that callers ignore rather than NaN.

Two paths compute the same attention (float32 results agree to rounding):

- ``causal_attention``: the whole ``[T, S]`` score matrix at once; training, full forward passes
  and long blocks written to a cache (prefill).
- ``blocked_attention``: decode steps and short blocks (at most ``Blocking.short`` tokens, e.g. a
  speculative verify block) read the cache ``Blocking.slots`` slots at a time with an online
  softmax, in a ``while_loop`` that stops after the last block any counted query can see, so a
  step costs what the longest live row holds, not the cache's ``max_len`` (a cache of at most one
  block is read in one piece, without the loop). A position bias (T5, ALiBi) is computed per
  block from positions, never as a ``[B, N, T, S]`` matrix.

How a call splits its attention is a ``Blocking``, an argument of the model call (default
``BLOCKING``), so a program traced with other blocks is another program, never a patched global.

Both paths read the cache through the ``cache.Cache`` protocol: ``read_stored`` for the stored
slots and ``float_tail(layer, q_pos)`` for the float slots a cache keeps beside quantized ones
(KIVI's; None for every other cache). With a tail, each query reads the stored slots below its
``tail.below`` and the tail's float slots from there up to its own position, in both paths (one
more online-softmax step in the blocked one).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab.cache import Cache
from decodelab.checks import is_int
from decodelab.config import ModelConfig
from decodelab.model.layers import normal, projection, residual_init
from decodelab.model.positions import PositionEncoding


@dataclasses.dataclass(frozen=True)
class Blocking:
    """How attention over a cache is split (module docstring); static, so each value is its own
    compiled program."""

    slots: int = 128  # cache slots per block of blocked_attention (fewer when max_len is smaller)
    short: int = 16  # blocks of at most this many tokens use blocked_attention (0: none do)

    def __post_init__(self):
        for name, low in (("slots", 1), ("short", 0)):
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


BLOCKING = Blocking()  # what generate, beam search, speculative decoding and serving run with


@dataclasses.dataclass(frozen=True)
class Blocked:
    """One call's blocked path over the cache: no counted query sees a slot at or past ``live``,
    and ``blocked_attention`` reads the cache ``slots`` slots at a time."""

    live: jax.Array  # [] int32
    slots: int

NEG = float(jnp.finfo(jnp.float32).min)  # a masked score


def causal_attention(
    q: jax.Array,  # [B, T, N, H]
    k: jax.Array,  # [B, K, S, H]
    v: jax.Array,  # [B, K, S, H]
    q_pos: jax.Array,  # [B, T]
    k_pos: jax.Array,  # [B, S]
    bias: jax.Array | None,  # [B, N, T, S]
    visible: jax.Array | None = None,  # [B, T, S]: slots each query may read besides causality
) -> jax.Array:  # [B, T, N, H]
    B, T, N, H = q.shape
    K, S = k.shape[1], k.shape[2]
    G = N // K
    q = q.reshape(B, T, K, G, H)  # query head n = k * G + g shares kv head k
    scores = jnp.einsum("BTKGH,BKSH->BKGTS", q, k).astype(jnp.float32) / math.sqrt(H)
    if bias is not None:
        scores = scores + bias.reshape(B, K, G, T, S)
    causal = k_pos[:, None, :] <= q_pos[:, :, None]  # [B, T, S]
    if visible is not None:
        causal = causal & visible
    scores = jnp.where(causal[:, None, None], scores, NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKGTS,BKSH->BTKGH", probs, v)
    return out.reshape(B, T, N, H)


def attention_blocks(live: jax.Array, max_len: int, block_slots: int) -> jax.Array:
    """``[]`` int32: the blocks ``blocked_attention`` reads when queries see ``live`` slots."""
    size = min(block_slots, max_len)
    return (jnp.minimum(live, max_len) + size - 1) // size


def blocked_attention(
    q: jax.Array,  # [B, T, N, H]
    cache: Cache,  # already holding this block's keys and values
    layer: int,
    n_kv_heads: int,
    q_pos: jax.Array,  # [B, T]
    live: jax.Array,  # [] int32: no counted query sees a slot at or past it
    bias: Callable[[jax.Array, jax.Array], jax.Array | None],  # (q_pos, k_pos [B, S']) -> bias
    block_slots: int,
) -> jax.Array:  # [B, T, N, H]
    """Causal attention of ``q`` over the cache, ``block_slots`` slots per loop trip with an
    online softmax (running max ``m``, normaliser ``l`` and weighted sum ``acc`` per query);
    a cache with a float tail adds one step over it (module docstring)."""
    B, T, N, H = q.shape
    K, S = n_kv_heads, cache.max_len
    G = N // K
    size = min(block_slots, S)
    q = q.reshape(B, T, K, G, H)
    tail = cache.float_tail(layer, q_pos)

    def online(carry, k, v, k_pos, visible):
        """One online-softmax step over keys ``k, v: [B, K, S', H]`` at ``k_pos: [B, S']``,
        of which each query reads the ``visible: [B, T, S']`` ones at or before its position."""
        m, l, acc = carry  # [B, K, G, T], [B, K, G, T], [B, K, G, T, H]
        scores = jnp.einsum("BTKGH,BKSH->BKGTS", q, k).astype(jnp.float32) / math.sqrt(H)
        block_bias = bias(q_pos, k_pos)  # [B, N, T, S']
        if block_bias is not None:
            scores = scores + block_bias.reshape(B, K, G, T, k_pos.shape[1])
        visible = visible & (k_pos[:, None, :] <= q_pos[:, :, None])
        scores = jnp.where(visible[:, None, None], scores, NEG)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        p = jnp.exp(scores - m_new[..., None])  # [B, K, G, T, S']
        scale = jnp.exp(m - m_new)
        l = l * scale + jnp.sum(p, axis=-1)
        pv = jnp.einsum("BKGTS,BKSH->BKGTH", p.astype(v.dtype), v).astype(jnp.float32)
        return m_new, l, acc * scale[..., None] + pv

    def trip(carry):
        i, *state = carry
        start = i * size
        k, v = cache.read_stored(layer, start, size)  # [B, K, S', H], S' = size
        first = jnp.minimum(start, S - size)  # read clamps a last partial block back into range
        k_pos = jnp.broadcast_to(first + jnp.arange(size, dtype=jnp.int32), (B, size))
        visible = jnp.broadcast_to((k_pos >= start)[:, None, :], (B, T, size))  # before: done
        if tail is not None:
            visible = visible & (k_pos[:, None, :] < tail.below[:, :, None])
        return i + 1, *online(state, k, v, k_pos, visible)

    init = (jnp.zeros((), jnp.int32), jnp.full((B, K, G, T), NEG, jnp.float32),
            jnp.zeros((B, K, G, T), jnp.float32), jnp.zeros((B, K, G, T, H), jnp.float32))
    if size == S:  # one block holds the whole cache: no loop to run
        _, *state = trip(init)
    else:
        blocks = attention_blocks(live, S, block_slots)
        _, *state = jax.lax.while_loop(lambda carry: carry[0] < blocks, trip, init)
    if tail is not None:
        state = online(state, tail.k, tail.v, tail.positions,
                       tail.positions[:, None, :] >= tail.below[:, :, None])
    _, l, acc = state
    out = (acc / l[..., None]).astype(q.dtype)  # [B, K, G, T, H]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, N, H)


class Attention(nnx.Module):
    """Projections D -> (N, H) queries and (K, H) keys/values, causal attention, (N, H) -> D;
    each projection has a bias when ``cfg.attention_bias``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.n_kv_heads = K
        dtype = jnp.dtype(cfg.dtype)
        init = normal(D**-0.5)

        def bias(*shape: int) -> tuple[int, ...] | None:
            """A projection's bias shape (None: no bias)."""
            return shape if cfg.attention_bias else None

        self.q = projection(cfg, "BTD,DNH->BTNH", (D, N, H), bias(N, H), init, rngs)
        self.k = projection(cfg, "BTD,DKH->BTKH", (D, K, H), bias(K, H), init, rngs)
        self.v = projection(cfg, "BTD,DKH->BTKH", (D, K, H), bias(K, H), init, rngs)
        self.o = projection(cfg, "BTNH,NHD->BTD", (N, H, D), bias(D), residual_init(cfg, N * H),
                            rngs)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: PositionEncoding,
        q_pos: jax.Array,  # [B, T]
        k_pos: jax.Array | None,  # [B, S]: q_pos without a cache, the slot index with one
        bias: jax.Array | None,  # [B, N, T, S]
        cache: Cache | None,
        layer: int,
        blocked: Blocked | None = None,  # with a cache: take the blocked path
    ) -> tuple[jax.Array, Cache | None]:
        """Without ``blocked`` the whole score matrix over ``k_pos`` (the block itself without a
        cache, the cache's first ``S`` slots with one: all of them, or the call's ``reach``);
        with it, ``blocked_attention`` over the cache."""
        q = positions.rotate(self.q(x), q_pos)
        k = positions.rotate(self.k(x), q_pos)  # [B, T, K, H]
        v = self.v(x)
        if cache is None:
            out = causal_attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), q_pos, k_pos,
                                   bias)
            return self.o(out), cache
        cache = cache.write(layer, k, v)
        if blocked is not None:
            out = blocked_attention(q, cache, layer, self.n_kv_heads, q_pos, blocked.live,
                                    positions.bias, blocked.slots)
            return self.o(out), cache
        tail = cache.float_tail(layer, q_pos)
        k, v = cache.read_stored(layer, 0, k_pos.shape[1])  # [B, K, S, H], S <= max_len
        if tail is None:
            out = causal_attention(q, k, v, q_pos, k_pos, bias)
        else:
            visible = jnp.concatenate([k_pos[:, None, :] < tail.below[:, :, None],
                                       tail.positions[:, None, :] >= tail.below[:, :, None]],
                                      axis=2)  # [B, T, S + E]
            if bias is not None:
                bias = jnp.concatenate([bias, positions.bias(q_pos, tail.positions)], axis=-1)
            out = causal_attention(q, jnp.concatenate([k, tail.k], axis=2),
                                   jnp.concatenate([v, tail.v], axis=2), q_pos,
                                   jnp.concatenate([k_pos, tail.positions], axis=1), bias,
                                   visible)
        return self.o(out), cache
