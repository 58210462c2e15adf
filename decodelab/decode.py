"""Greedy decoding over the KV cache: one ragged prefill, then a ``lax.fori_loop`` of single-token
steps, compiled once per (prompt bucket, budget, batch size).

Prompts of different lengths share one padded prefill block; each row's cache length advances by
its own prompt length only (``num_valid``), so its first generated token is written at its own
position and padding is never attended.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.cache import KVCache
from decodelab.model import Transformer


def bucket_length(n: int, minimum: int = 16) -> int:
    """The power of two >= max(n, minimum): prompt blocks are padded to it so new prompt lengths
    reuse a compiled program."""
    return max(minimum, 1 << (int(n) - 1).bit_length())


@functools.partial(jax.jit, static_argnums=(0, 3))
def _greedy_program(graphdef, params, prompt_block, max_new_tokens, prompt_lengths, cache):
    model = nnx.merge(graphdef, params)
    logits, cache = model(prompt_block, cache=cache, num_valid=prompt_lengths)  # [B, T, V]
    B = prompt_block.shape[0]
    last = jnp.take_along_axis(logits, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
    first = jnp.argmax(last, axis=-1).astype(jnp.int32)  # [B]
    out = jnp.zeros((B, max_new_tokens), jnp.int32).at[:, 0].set(first)

    def step(i, carry):
        out, cache = carry
        previous = jax.lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1)  # [B, 1]
        logits, cache = model(previous, cache=cache)
        return out.at[:, i].set(jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)), cache

    out, _ = jax.lax.fori_loop(1, max_new_tokens, step, (out, cache))
    return out


def greedy(model: Transformer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The ``max_new_tokens`` argmax continuation of each prompt (no stop condition)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of non-empty id lists, got {prompts!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    vocab = model.config.vocab_size
    for row, ids in enumerate(prompts):
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompts[{row}] must hold ids in [0, {vocab}), got {ids!r}")
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    T = bucket_length(int(lengths.max()))
    block = np.zeros((len(prompts), T), np.int32)
    for row, ids in enumerate(prompts):
        block[row, :len(ids)] = ids
    cache = KVCache.init(model.config, len(prompts), T + max_new_tokens)
    graphdef, params = nnx.split(model)
    out = _greedy_program(graphdef, params, block, max_new_tokens, lengths, cache)
    return np.asarray(out).tolist()
