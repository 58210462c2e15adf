"""Transformer: token ids -> logits, a decoder-only stack of pre-norm blocks.

``model(tokens)`` runs a full causal forward pass at positions ``0 .. T-1`` and returns logits.
``model(tokens, cache=cache)`` appends the block at each row's own cache length (positions
``lengths[b] .. lengths[b] + T - 1``) and returns ``(logits, cache)``; ``num_valid[b]`` (default
``T``) says how many leading tokens of row b are real, the rest being padding that is written but
not counted, so the next block overwrites it (padding sits at the row's last real position).
``blocking`` (an ``attention.Blocking``, static) says how attention over the cache is split.
Logits are float32 whatever the compute dtype. A position whose activations overflow (a non-finite value, or one whose square overflows, which a
norm would silently turn into zeros) gets NaN logits, so decoding reports it as an error.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab import sharding
from decodelab.cache import Cache
from decodelab.checks import is_int
from decodelab.config import ModelConfig
from decodelab.model.attention import BLOCKING, Attention, Blocked, Blocking
from decodelab.model.layers import MLPS, NORMS, projection
from decodelab.model.positions import POSITION_ENCODINGS, PositionEncoding


class Block(nnx.Module):
    """``x + attn(norm(x))`` then ``h + mlp(norm(h))``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_norm = NORMS[cfg.norm](cfg, rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = NORMS[cfg.norm](cfg, rngs)
        self.mlp = MLPS[cfg.mlp](cfg, rngs=rngs)

    def __call__(self, x, positions: PositionEncoding, q_pos, k_pos, bias, cache, layer,
                 blocked=None):
        attn_out, cache = self.attn(self.attn_norm(x), positions, q_pos, k_pos, bias, cache, layer,
                                    blocked)
        h = x + attn_out
        return h + self.mlp(self.mlp_norm(h)), cache


def _as_tokens(tokens, vocab_size: int) -> jax.Array:
    """``tokens`` as a checked ``[B, T]`` integer array of ids in ``[0, vocab_size)``."""
    if isinstance(tokens, (str, bytes)):
        raise ValueError(f"tokens must be an int array [B, T] of token ids, got a "
                         f"{type(tokens).__name__} ({tokens[:20]!r}); encode text with the "
                         "tokenizer first")
    try:
        tokens = jnp.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise ValueError(f"tokens must be an int array [B, T] of token ids, got "
                         f"{type(tokens).__name__} that is not one ({e})") from None
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape [B, T], got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if 0 in tokens.shape:
        raise ValueError(f"tokens must hold at least one row of at least one token, got shape "
                         f"{tokens.shape}")
    if isinstance(tokens, jax.core.Tracer):
        return tokens
    ids = np.asarray(tokens)
    if ids.min() < 0 or ids.max() >= vocab_size:
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        raise ValueError(f"tokens must be ids in [0, {vocab_size}), got {int(bad)}")
    return tokens


def _norm_is_finite(x: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T]
    """Whether a norm can normalise each position of ``x``: its mean square must be finite."""
    return jnp.isfinite(jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1))


def _check_taps(taps, n_layers: int) -> tuple[int, ...]:
    if (not isinstance(taps, tuple) or not all(is_int(i) and 0 <= i <= n_layers for i in taps)
            or len(set(taps)) != len(taps)):
        raise ValueError(f"taps must be a tuple of distinct layer indices in [0, {n_layers}], "
                         f"got {taps!r}")
    return tuple(int(i) for i in taps)


def _check_num_valid(num_valid, B: int, T: int) -> jax.Array:
    """``num_valid`` as ``[B]`` int32 (default ``T`` per row); ValueError naming it for non-integer
    values (never truncated), a wrong shape or counts outside ``[0, T]``."""
    if num_valid is None:
        return jnp.full((B,), T, jnp.int32)
    array = num_valid if isinstance(num_valid, jax.Array) else np.asarray(num_valid)
    if array.dtype == bool or not jnp.issubdtype(array.dtype, jnp.integer):
        raise ValueError(f"num_valid must be {B} ints in [0, T={T}], got {num_valid!r}")
    if array.shape != (B,):
        raise ValueError(f"num_valid must have shape ({B},), got {array.shape}")
    if not isinstance(array, jax.core.Tracer):
        counts = np.asarray(array)
        if (counts < 0).any() or (counts > T).any():
            raise ValueError(f"num_valid must be in [0, T={T}] per row, got {counts.tolist()}")
    return jnp.asarray(array, jnp.int32)


class Transformer(nnx.Module):
    """Embedding -> position encoding -> L blocks -> final norm -> logits ``[B, T, V]``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        dtype = jnp.dtype(cfg.dtype)
        # Unit-variance logits at init: embeddings have std 1/sqrt(D) and the final norm's output
        # has unit RMS, so a tied projection gives logits of std ~1.
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype,
                               param_dtype=jnp.dtype(cfg.param_dtype),
                               embedding_init=nnx.initializers.normal(cfg.d_model**-0.5),
                               rngs=rngs)
        self.positions = POSITION_ENCODINGS[cfg.position](cfg, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.final_norm = NORMS[cfg.norm](cfg, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = projection(cfg, "BTD,DV->BTV", (cfg.d_model, cfg.vocab_size), None,
                                      nnx.initializers.normal(cfg.d_model**-0.5), rngs)

    def __call__(
        self,
        tokens: jax.Array,  # [B, T] int
        *,
        cache: Cache | None = None,
        num_valid: jax.Array | None = None,  # [B] int, only with a cache
        blocking: Blocking = BLOCKING,  # how attention over the cache is split (static)
        reach: int | None = None,  # static: no query of this call sees a slot at or past it
        taps: tuple[int, ...] = (),  # static: also return the residual stream at these layers
    ):
        """Logits ``[B, T, V]`` (and with a cache, the cache after the block). ``reach``, with a
        cache: the caller's promise that every row holds at most ``reach - T`` tokens before the
        call (e.g. ``T`` on a fresh cache, as a prefill has), so a block longer than
        ``blocking.short`` reads only slots ``[0, reach)`` instead of all ``max_len``: a prefill
        then attends to the prompt, not to the cache's capacity. None: ``max_len``.

        ``taps``: layer indices in ``[0, n_layers]``; the call then also returns, last, the
        residual stream ``[len(taps), B, T, D]`` entering block i (tap 0: the embeddings, tap
        ``n_layers``: the last block's output, before the final norm). ``head`` turns a tap into
        logits as the model's own exit does (contrastive search reads ``head``'s normed input,
        DoLa early-exit logits)."""
        cfg = self.config
        taps = _check_taps(taps, cfg.n_layers)
        if not isinstance(blocking, Blocking):
            raise ValueError(f"blocking must be an attention.Blocking, got {blocking!r}")
        tokens = _as_tokens(tokens, cfg.vocab_size)
        B, T = tokens.shape
        blocked = None
        if cache is None:
            if num_valid is not None:
                raise ValueError("num_valid is only meaningful with a cache, got cache=None")
            q_pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
            k_pos, reach = q_pos, T
        else:
            if cache.batch_size != B:
                raise ValueError(
                    f"tokens batch size must equal the cache's, got {B} and {cache.batch_size}")
            num_valid = _check_num_valid(num_valid, B, T)
            cache.check_room(num_valid)
            # Padding takes the row's last real position (or its first slot if it has none), so
            # what depends on how far a row reaches (a dynamic RoPE) never sees the padding.
            last = cache.lengths + jnp.maximum(num_valid, 1) - 1  # [B]
            q_pos = jnp.minimum(cache.positions(T), last[:, None])
            if reach is not None and (not is_int(reach) or reach < T):
                raise ValueError(f"reach must be an int >= the block's {T} tokens (or None), "
                                 f"got {reach!r}")
            read = cache.max_len if reach is None else min(reach, cache.max_len)
            reach = cache.max_len
            if T <= blocking.short:
                # Slots the blocked path visits: rows with no real token do not count (their
                # logits are padding, ignored), so a stopped row does not hold a step back.
                blocked = Blocked(live=jnp.max(jnp.where(num_valid > 0, last + 1, 1)),
                                  slots=blocking.slots)
                k_pos = None
            else:
                k_pos = jnp.broadcast_to(jnp.arange(read, dtype=jnp.int32), (B, read))
        limit = self.positions.max_positions
        if limit is not None and reach > limit:
            raise ValueError(
                f"position={cfg.position!r} has {limit} positions (max_seq_len) but this call can "
                f"reach position {reach - 1} ({'cache max_len' if cache else 'sequence length'} "
                f"{reach}); use a shorter input or an encoding without a table")

        tokens, cache = sharding.constrain_inputs(self, tokens, cache)  # no-op without a mesh
        x = self.embed(tokens)  # [B, T, D]
        x = self.positions.embed(x, q_pos)
        # [B, N, T, S] or None, shared by all layers; the blocked path makes its own per block.
        bias = None if blocked is not None else self.positions.bias(q_pos, k_pos)
        finite = jnp.ones((B, T), bool)
        tapped = {}
        for layer, block in enumerate(self.blocks):
            tapped[layer] = x
            finite &= _norm_is_finite(x)
            x, cache = block(x, self.positions, q_pos, k_pos, bias, cache, layer, blocked)
        tapped[cfg.n_layers] = x
        finite &= _norm_is_finite(x)
        # A norm turns an overflowing input into zeros (x * rsqrt(inf) = 0): without the finite
        # mask, an overflow anywhere would look like uniform logits instead of the failure it is.
        logits = jnp.where(finite[:, :, None], self.head(x), jnp.nan)  # [B, T, V]
        out = (logits,) if cache is None else (logits, cache.advance(num_valid))
        if taps:
            out += (jnp.stack([tapped[i] for i in taps]),)
        return out[0] if len(out) == 1 else out

    def head(self, x: jax.Array) -> jax.Array:
        """The model's exit: ``[..., D]`` residual stream -> float32 logits ``[..., V]`` (final
        norm, then the tied embedding or ``lm_head``)."""
        x = self.final_norm(x)
        logits = self.embed.attend(x) if self.config.tie_embeddings else self.lm_head(x)
        return logits.astype(jnp.float32)


def param_count(model: nnx.Module) -> int:
    return sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@functools.lru_cache(maxsize=8)
def abstract_transformer(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """``(graphdef, state)`` of a Transformer of ``cfg`` with shapes and dtypes but no values,
    built once per config in a process (``nnx.eval_shape`` takes ~1.6 s for SmolLM2's 30
    blocks). Shared between callers: read it, or ``replace`` its variables; never mutate it."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))


def with_config(model: Transformer, cfg: ModelConfig) -> Transformer:
    """``model``'s parameters under ``cfg``, a config that may differ only in fields that hold no
    parameters (e.g. RoPE scaling at inference time) and in ``param_dtype``. The parameters are
    shared, not copied, except those ``param_dtype`` stores in another dtype: those are cast
    (rounded to nearest even). A sharded model stays on its mesh."""
    graphdef, abstract = abstract_transformer(cfg)
    state = nnx.state(model)
    shapes = lambda tree: jax.tree.map(lambda x: x.shape, tree)  # noqa: E731
    if jax.tree.structure(abstract) != jax.tree.structure(state) or shapes(abstract) != shapes(state):
        raise ValueError(f"cfg must keep the model's parameter shapes; {cfg} does not match "
                         f"{model.config}")
    if cfg.param_dtype != model.config.param_dtype:
        state = jax.tree.map(lambda target, x: x.astype(target.dtype), abstract, state)
    dtypes = lambda tree: jax.tree.map(lambda x: x.dtype, tree)  # noqa: E731
    if dtypes(abstract) != dtypes(state):
        raise ValueError(f"cfg must keep the model's parameter dtypes; {cfg} does not match "
                         f"{model.config}")
    rebuilt = nnx.merge(graphdef, state)
    mesh = sharding.mesh_of(model)
    if mesh is not None:
        rebuilt.mesh = mesh
    return rebuilt
