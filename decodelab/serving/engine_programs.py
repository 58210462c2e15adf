"""The serving engine's compiled programs and state helpers, and the host's reading of what they
hand back (``engine`` module docstring)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab import sampling
from decodelab.cache import init_cache
from decodelab.decode import generation as decode
from decodelab.decode.generation import DecodeState
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.request import LENGTH, RUNNING, OutputSpec
from decodelab.sampling.params import SamplingParams
from decodelab.serving import paged, slot_prefill
from decodelab.serving.options import EngineOptions
from decodelab.serving.requests import Completion
from decodelab.serving.slots import Slot


def empty_state(config, num_slots: int, max_len: int, options: EngineOptions,
                eos_mask: np.ndarray, kv_cache: str | None = None,
                pages: tuple[int, int] | None = None) -> DecodeState:
    """The engine's state of ``num_slots`` free slots of ``max_len`` cache slots each, with room
    for ``options``' stop sequences; a paged cache of ``pages = (count, page size)`` if given."""
    B, S, V = num_slots, max_len, config.vocab_size
    # A free slot's parameters: any (a free slot never advances).
    free = SamplingParams.greedy()
    state = DecodeState(
        step=jnp.zeros((), jnp.int32),
        tokens=jnp.zeros((B, S), jnp.int32),
        prompt_lengths=jnp.zeros((B,), jnp.int32),
        lengths=jnp.zeros((B,), jnp.int32),
        finish=jnp.full((B,), LENGTH, jnp.int32),  # not running: a free slot never advances
        cache=(init_cache(config, B, S, kv_cache) if pages is None else
               paged.PagedKVCache.init(config, B, pages[0], pages[1], S // pages[1])),
        logits=jnp.zeros((B, V), jnp.float32),
        keys=sampling.seed_keys(np.zeros((B,), np.uint32)),
        params=free.per_row(B, V),
        eos_mask=jnp.asarray(eos_mask),
        stop_ids=jnp.full((B, options.max_stop_sequences, options.max_stop_width), -1,
                          jnp.int32),
        budgets=jnp.zeros((B,), jnp.int32),
        **OutputSpec(S).buffers(B),
    )
    return state.counted()


@functools.partial(jax.jit, static_argnames=("n",))
def harvest(state: DecodeState, starts: jax.Array, rounds: jax.Array, *, n: int) -> jax.Array:
    """What an engine call hands to the host, packed into one ``[B, 4 + 2n]`` int32 array (one
    transfer): per slot its finish code, its length, the rounds run, its Mirostat ``mu`` (float32
    bits: what a preempted request resumes from), then the ``n`` tokens from position
    ``starts[b]`` and their log-probabilities (float32 bits)."""
    S = state.tokens.shape[1]
    N = state.max_new_tokens
    B = starts.shape[0]
    window = starts[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]  # [B, n]
    tokens = jnp.take_along_axis(state.tokens, jnp.clip(window, 0, S - 1), axis=1)
    out = jnp.clip(window - state.prompt_lengths[:, None], 0, N - 1)
    logprobs = jax.lax.bitcast_convert_type(jnp.take_along_axis(state.logprobs, out, axis=1),
                                            jnp.int32)
    mu = jax.lax.bitcast_convert_type(state.mirostat_mu, jnp.int32)
    head = jnp.stack([state.finish, state.lengths, jnp.broadcast_to(rounds, (B,)), mu], axis=1)
    return jnp.concatenate([head.astype(jnp.int32), tokens, logprobs], axis=1)


def collect(packed: np.ndarray, slots: Sequence[Slot | None], starts: np.ndarray, n: int
            ) -> tuple[dict[int | str, int], dict[int | str, list[int]], dict[int, Completion]]:
    """Hand each running slot its new tokens and log-probs from ``packed`` (``harvest``'s array
    for windows of ``n`` from ``starts``); returns, by sample key (``Slot.key``), the output
    tokens so far and this call's tokens (none for a slot still prefilling), and the completion
    of each request that finished, by slot."""
    finish, lengths = packed[:, 0], packed[:, 1]
    generated, tokens, finished = {}, {}, {}
    for slot, held in enumerate(slots):
        if held is None:
            continue
        new = []
        if not held.prefilling:  # running: the tokens this call appended
            count, window = int(lengths[slot]) - int(starts[slot]), packed[slot, 4:]
            new = window[:count].tolist()
            held.receive(new, window[n:n + count].view(np.float32).tolist(),
                         packed[slot, 3:4].view(np.float32)[0])
            if finish[slot] != RUNNING:
                finished[slot] = held.completion(slot, int(finish[slot]))
        tokens[held.key], generated[held.key] = new, len(held.tokens)
    return generated, tokens, finished


def _advance_body(operands, carry: tuple[jax.Array, DecodeState], *, graphdef
                  ) -> tuple[jax.Array, DecodeState]:
    weights, _ = operands
    i, state = carry
    return i + 1, decode.step(nnx.merge(graphdef, weights), state)


def _advance_running(operands, carry: tuple[jax.Array, DecodeState]) -> jax.Array:
    _, rounds = operands
    i, state = carry
    return (i < rounds) & jnp.any(~state.done)


# Up to `rounds` decode rounds over every slot, stopping once none runs; the carry counts them.
ADVANCE = CompiledLoop("_advance", _advance_body, _advance_running, static_argnames=("graphdef",))


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("state",))
def advance_rows(weights, state: DecodeState, rows: jax.Array, rounds: jax.Array, *,
                  graphdef) -> tuple[jax.Array, DecodeState]:
    """``ADVANCE`` over the slots ``rows`` only (``[R]``, distinct), on paged memory: their
    per-row fields and block-table rows are taken out as an ``R``-row state sharing the page
    pool, decoded up to ``rounds`` rounds, and put back. A decode step then costs what ``R``
    rows cost, not ``num_slots``; the pool is never copied (a padded cache would be)."""

    def take(x):
        return x[rows]

    def put(big, small):
        return big.at[rows].set(small)

    fields = {name: getattr(state, name) for name in slot_prefill.ROW_FIELDS
              if getattr(state, name) is not None}
    cache = state.cache
    sub = state.replace(**jax.tree.map(take, fields),
                        cache=cache.replace(table=cache.table[rows], lengths=cache.lengths[rows]))
    operands = (weights, rounds)
    count, sub = jax.lax.while_loop(
        lambda carry: _advance_running(operands, carry),
        lambda carry: _advance_body(operands, carry, graphdef=graphdef),
        (jnp.zeros((), jnp.int32), sub))
    merged = {name: jax.tree.map(put, fields[name], getattr(sub, name)) for name in fields}
    cache = cache.replace(k=sub.cache.k, v=sub.cache.v,
                          lengths=cache.lengths.at[rows].set(sub.cache.lengths))
    return count, state.replace(step=sub.step, cache=cache, **merged)


@functools.partial(jax.jit, donate_argnames=("state",))
def copy_pages(state: DecodeState, shared: np.ndarray, own: np.ndarray) -> DecodeState:
    """The state with the paged cache's pages ``shared`` (``[C]`` int32) copied to pages
    ``own`` (``[C]``, distinct; ``num_pages``: none, dropped): copy-on-write of partly read
    pages, in place (donated)."""
    cache = state.cache
    k = cache.k.at[:, own].set(cache.k[:, shared], mode="drop")  # [L, C, K, page_size, H]
    v = cache.v.at[:, own].set(cache.v[:, shared], mode="drop")
    return state.replace(cache=cache.replace(k=k, v=v))
