"""The cache a decoding call starts from: the spare a previous call of the same layout left
(``cache.spares``: written over, never zero-filled again) or a new one laid out as the model's
mesh lays out its caches; and, at the end of the call, its cache kept as the next spare.

A prefill takes the cache as a donated argument either way, so it compiles one program per shape
whichever it gets, and a spare's buffers are updated in place."""

from __future__ import annotations

import functools
from collections.abc import Hashable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.cache import Cache, init_cache
from decodelab.cache.kinds import resolve
from decodelab.cache.spares import SPARES
from decodelab.decode.request import BAD_LOGITS
from decodelab.sharding import constrain_inputs, mesh_of


def layout_key(model: nnx.Module, batch_size: int, max_len: int, kind) -> Hashable:
    """What makes two calls' caches interchangeable: the model's config (layers, heads, dtype),
    the rows, the slots, the cache kind and the mesh."""
    return model.config, batch_size, max_len, resolve(kind), mesh_of(model)


@functools.partial(jax.jit, static_argnames=("graphdef", "batch_size", "max_len", "kind"))
def new_cache(weights, *, graphdef, batch_size: int, max_len: int, kind) -> Cache:
    """An empty cache (zero-filled: the cost a spare saves), constrained to the model's mesh as
    the model call constrains it."""
    model = nnx.merge(graphdef, weights)
    cache = init_cache(model.config, batch_size, max_len, kind)
    return constrain_inputs(model, jnp.zeros((batch_size, 1), jnp.int32), cache)[1]


def start_cache(model: nnx.Module, weights, graphdef, batch_size: int, max_len: int,
                kind) -> Cache:
    """The spare of this layout if one is held, else a new cache; the caller's prefill rewinds it
    to length 0 and donates it."""
    spare = SPARES.take(layout_key(model, batch_size, max_len, kind))
    if spare is not None:
        return spare
    return new_cache(weights, graphdef=graphdef, batch_size=batch_size, max_len=max_len,
                     kind=kind)


def keep_cache(model: nnx.Module, cache: Cache, max_len: int, kind, finish) -> None:
    """Keep a finished call's ``cache`` as the spare unless a row ended on non-finite logits
    (``finish``: the rows' finish codes; ``cache.spares`` says why)."""
    if not np.any(np.asarray(finish) == BAD_LOGITS):
        SPARES.keep(layout_key(model, cache.batch_size, max_len, kind), cache)
