"""The slot engine's prefill: one compiled call runs the next chunk of the prompts of ``R`` slots
through the model, writing keys and values straight into those slots' rows of the engine's cache
(a float cache through a ``cache.RowView``: no fresh cache and no copy of a row; a quantized cache
copies the rows it prefills), and rewrites every per-row field of the slots (``engine`` module
docstring). ``next_chunk`` builds that chunk on the host from the slots waiting."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from decodelab import sampling
from decodelab.cache import bucket_rows
from decodelab.cache.dense import KVCache, RowView
from decodelab.decode.generation import DecodeState
from decodelab.decode.request import LENGTH, RUNNING, bucket_length
from decodelab.sampling import mirostat
from decodelab.serving.paged import PagedKVCache
from decodelab.serving.slots import Slot

# Fields of DecodeState with a leading slot axis (the cache's k and v have it second).
ROW_FIELDS = ("tokens", "prompt_lengths", "lengths", "finish", "logits", "keys", "params",
              "stop_ids", "budgets", "logprobs", "top_logprobs", "top_ids", "entropy",
              "output_counts", "seen", "ngram_suffixes", "dry_suffixes",
              "constraint_states", "mirostat_mu")


@struct.dataclass(kw_only=True)
class PrefillChunk:
    """The next chunk of the prompts of ``R`` slots, and each slot's request fields.

    Row ``i`` holds prompt tokens ``offsets[i] .. offsets[i] + counts[i] - 1`` of the request in
    slot ``rows[i]``, left-aligned in ``block``; ``rows`` increase, and a padding row (there to
    round ``R`` up to ``cache.bucket_rows``) has a row index past the state's rows of its own and
    writes nothing."""

    block: jax.Array  # [R, T] int32, padded with 0
    rows: jax.Array  # [R] int32
    offsets: jax.Array  # [R] int32, prompt tokens already in the slot's cache
    counts: jax.Array  # [R] int32, tokens of this chunk (<= T)
    prompt_lengths: jax.Array  # [R] int32
    ends: jax.Array  # [R] int32, tokens the slot prefills in all: the prompt, then the tokens a
    # preempted request had generated (paged memory's recompute); the prompt length otherwise
    keys: jax.Array  # [R, ...] uint32, each slot's sample key data (indexed_sample_keys)
    params: tuple[sampling.RowParams, ...]  # R one-row values
    stop_ids: jax.Array  # [R, M, W] int32
    budgets: jax.Array  # [R] int32
    constraint_states: jax.Array  # [R] int32, each slot's automaton state after its sequence
    # [R] float32, each slot's Mirostat mu after its sequence: a preempted request's, NaN for a
    # request that starts (mu = 2 tau)
    mirostat_mu: jax.Array
    # [R, S] int32: each slot's sequence, when a row starts after a shared prefix (its tokens
    # are not in the slot's row yet); None: the tokens before ``offsets`` are the slot's own
    known: jax.Array | None = None


def next_chunk(waiting: Sequence[tuple[int, Slot]], *, num_slots: int,
               max_len: int, prefill_chunk: int | None, stop_shape: tuple[int, int],
               row_multiple: int = 1) -> tuple[PrefillChunk, int]:
    """The next chunk of the ``waiting`` slots (``(slot, Slot)`` pairs, slots increasing): at
    most ``prefill_chunk`` tokens of each one's sequence (None: the rest), in a block of ``R``
    rows (the count rounded up by ``cache.bucket_rows`` to a multiple of ``row_multiple``, a
    mesh's ``data`` axis; padding rows repeat the first request's fields and write nothing) and
    ``T`` columns (the longest count rounded up, at most ``prefill_chunk`` and ``max_len``),
    with each request's fields; and the chunk's ``reach`` (``prefill_rows``). ``num_slots``:
    the rows of the engine's state; ``stop_shape``: ``(M, W)``, the engine's room for stop
    sequences."""
    R = bucket_rows(len(waiting), row_multiple)
    limit = prefill_chunk
    counts = [min(len(s.sequence) - s.prefilled, limit or len(s.sequence)) for _, s in waiting]
    T = min(bucket_length(max(counts)), limit or max_len, max_len)
    offsets = [s.prefilled for _, s in waiting]
    # A chunk from slot 0 attends to itself only; a later one to the slot's whole row.
    reach = T if not any(offsets) else max_len
    pad = R - len(waiting)
    block = np.zeros((R, T), np.int32)
    for r, ((_, s), offset, count) in enumerate(zip(waiting, offsets, counts)):
        block[r, :count] = s.sequence[offset:offset + count]
    slots = [s for _, s in waiting] + [waiting[0][1]] * pad
    requests = [s.request for s in slots]
    M, W = stop_shape
    stops = np.full((R, M, W), -1, np.int32)
    for r, request in enumerate(requests):
        for m, s in enumerate(request.stop_sequences):
            stops[r, m, W - len(s):] = s
    rows = [i for i, _ in waiting] + list(range(num_slots, num_slots + pad))
    known = None
    if any(s.cached and s.prefilled == s.cached for _, s in waiting):
        known = np.zeros((R, max_len), np.int32)
        for r, (_, s) in enumerate(waiting):
            known[r, :len(s.sequence)] = s.sequence
    return PrefillChunk(
        block=block, rows=np.asarray(rows, np.int32),
        offsets=np.asarray(offsets + [0] * pad, np.int32),
        counts=np.asarray(counts + [0] * pad, np.int32),
        prompt_lengths=np.asarray([len(r.prompt) for r in requests], np.int32),
        ends=np.asarray([len(s.sequence) for _, s in waiting] + [1] * pad, np.int32),
        keys=sampling.indexed_sample_keys(
            sampling.seed_keys(np.asarray([r.seed for r in requests], np.uint32)),
            np.asarray([s.sample for s in slots], np.uint32)),
        params=tuple(s.params for s in slots), stop_ids=stops,
        budgets=np.asarray([r.max_new_tokens for r in requests], np.int32),
        constraint_states=np.asarray([s.constraint_start for s in slots], np.int32),
        mirostat_mu=np.asarray([np.nan if s.mirostat_mu is None else s.mirostat_mu
                                for s in slots], np.float32),
        known=known), reach


def rows_of(cache, rows: jax.Array, offsets: jax.Array, reach: int):
    """The slots ``rows`` of ``cache`` as a cache of ``R`` rows at lengths ``offsets``: a float
    cache as a ``RowView`` (no copy), a paged one as its pool with those rows' tables; another
    kind as a copy of those rows, emptied where the
    offset is 0 (a quantized cache's scales and float tail start afresh with a prompt)."""
    if isinstance(cache, KVCache):
        return RowView.of(cache, rows, offsets, reach)
    if isinstance(cache, PagedKVCache):  # the same pool through those rows' tables
        return cache.rows_view(rows, offsets, reach)
    copy = cache.take_rows(jnp.minimum(rows, cache.batch_size - 1))
    fresh = offsets == 0  # [R]

    def empty(x):
        if x.ndim == 1:
            return x
        return jnp.where(fresh.reshape((1, -1) + (1,) * (x.ndim - 2)), jnp.zeros_like(x), x)

    return jax.tree.map(empty, copy).rewind(offsets)


def merge_rows(cache, rows_cache, rows: jax.Array):
    """``cache`` with ``rows_cache`` (from ``rows_of``) written back into slots ``rows``."""
    if isinstance(rows_cache, RowView):
        return rows_cache.merged_into(cache)
    if isinstance(rows_cache, PagedKVCache):
        return cache.merge_view(rows_cache, rows)
    # lengths [B] have the slot axis first; keys, values (and a quantized cache's scales) second
    return jax.tree.map(lambda big, part: big.at[(slice(None),) * (big.ndim > 1) + (rows,)].set(
        part.astype(big.dtype), mode="drop"), cache, rows_cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "reach"), donate_argnames=("state",))
def prefill_rows(weights, state: DecodeState, chunk: PrefillChunk, *, graphdef,
                  reach: int) -> DecodeState:
    """Run one chunk of ``R`` slots' prompts through the model, writing keys and values straight
    into those slots' rows of the state's cache, and (re)write every per-row field of the slots.
    A slot whose prompt this chunk completes is running, with the logits of its last prompt
    token; a slot with prompt left stays not running (finish "length"), its cache holding the
    prompt so far. ``reach``: the cache slots the chunk's attention spans: the block width when
    every chunk starts at slot 0 (a prompt sees only itself), else the whole row (``max_len``)."""
    model = nnx.merge(graphdef, weights)
    R, T = chunk.block.shape
    S = state.tokens.shape[1]
    rows = chunk.rows
    part = rows_of(state.cache, rows, chunk.offsets, reach)
    logits, part = model(chunk.block, cache=part, num_valid=chunk.counts)  # [R, T, V]
    last = jnp.take_along_axis(logits, jnp.maximum(chunk.counts - 1, 0)[:, None, None],
                               axis=1)[:, 0]  # [R, V]
    # The slot's tokens: the prompt before this chunk kept, this chunk written, the rest zero.
    slot = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]
    kept = (state.tokens[jnp.minimum(rows, state.tokens.shape[0] - 1)]
            if chunk.known is None else chunk.known)  # [R, S]
    tokens = jnp.where(slot < chunk.offsets[:, None], kept, 0)
    j = jnp.arange(T, dtype=jnp.int32)[None, :]  # [1, T]
    at = jnp.where(j < chunk.counts[:, None], chunk.offsets[:, None] + j, S)  # [R, T]
    tokens = tokens.at[jnp.arange(R)[:, None], at].set(chunk.block, mode="drop")
    filled = chunk.offsets + chunk.counts  # [R]
    final = filled >= chunk.ends
    lengths = jnp.where(final, chunk.ends, filled)
    N = state.max_new_tokens
    params = jax.tree.map(lambda *rows: jnp.concatenate(rows), *chunk.params)  # [R] per field
    fields = dict(
        tokens=tokens, prompt_lengths=chunk.prompt_lengths, lengths=lengths,
        finish=jnp.where(final, RUNNING, LENGTH).astype(jnp.int32), logits=last,
        keys=chunk.keys, params=params, stop_ids=chunk.stop_ids, budgets=chunk.budgets,
        logprobs=jnp.full((R, N), jnp.nan, jnp.float32),
        top_logprobs=jnp.zeros((R,) + state.top_logprobs.shape[1:], jnp.float32),
        top_ids=jnp.zeros((R,) + state.top_ids.shape[1:], jnp.int32),
        entropy=jnp.zeros((R,) + state.entropy.shape[1:], jnp.float32),
        constraint_states=None if state.constraint is None else chunk.constraint_states,
        mirostat_mu=jnp.where(jnp.isnan(chunk.mirostat_mu), mirostat.start_mu(params),
                              chunk.mirostat_mu))  # afresh, or where a preempted one was
    history = sampling.History(tokens=tokens, prompt_lengths=chunk.prompt_lengths,
                               lengths=lengths, eos_mask=state.eos_mask)
    fields.update(history.carried(params).carried_fields)
    put = lambda big, one: big.at[rows].set(one.astype(big.dtype), mode="drop")  # noqa: E731
    updated = {name: jax.tree.map(put, getattr(state, name), fields[name])
               for name in ROW_FIELDS if fields.get(name) is not None}
    return state.replace(cache=merge_rows(state.cache, part, rows), **updated)
