"""The ``Cache`` protocol: what attention, the decode loops, speculative rollback, beam search and
the serving engine need of a KV cache, so that every variant works wherever another one does.

Conventions (every cache keeps them; ``dense.KVCache`` is the reference):

- A cache holds ``batch_size`` rows of ``max_len`` slots; slot ``j`` of a row holds the token at
  position ``j`` of that row, and ``lengths[b]`` counts row ``b``'s valid slots. Slots at or past
  a row's length hold stale values that attention never lets a query see (it masks by position).
- ``write(layer, k, v)`` puts a block ``[B, T, K, H]`` at slots ``lengths[b] ..`` of each row and
  leaves the lengths; ``advance(num_valid)`` moves them once every layer has written (the rest of
  the block is padding, overwritten by the next write). ``rewind`` moves them back.
- ``read(layer, start, size)`` returns slots ``[start, start + size)`` of every row as float
  ``[B, K, size, H]`` (``start`` clamped to ``[0, max_len - size]``): what a query at the row's
  newest position sees there. ``gather`` reads given slots of given rows, so rows can share
  history (beam search).
- A cache that keeps its newest slots in float beside quantized ones (``kivi.KiviKVCache``) returns
  a ``FloatTail`` from ``float_tail(layer, q_pos)``: each query reads the stored slots below its
  ``tail.below`` (``read_stored``) and the tail's float slots from there up to its own position.
  Every other cache has no tail (``None``) and ``read_stored`` is ``read``.
- A cache is a pytree (a ``flax.struct`` dataclass): methods return a new cache and leave this one
  as it is, so the compiled programs donate and update its buffers in place.

``CacheWrapper`` is a cache built around another one that holds its rows' lengths (an int8 cache
around its int8 values, the beam view around its physical rows): the sizes, the lengths,
``advance`` and ``rewind`` are the inner cache's, written once here.
"""

from __future__ import annotations

import abc
from typing import Protocol, Self, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def is_concrete(x) -> bool:
    """Whether ``x`` has values here (outside a trace), so a check can read them."""
    return not isinstance(x, jax.core.Tracer)


def check_int_array(name: str, value, shape: tuple[int, ...]) -> jax.Array:
    """``value`` as an int32 array broadcast to ``shape``; ValueError naming ``name`` for anything
    that is not integers of a compatible shape (floats are not truncated, strings not parsed)."""
    try:
        array = value if isinstance(value, jax.Array) else np.asarray(value)
    except (TypeError, ValueError):
        array = None
    if array is None or array.dtype == bool or not jnp.issubdtype(array.dtype, jnp.integer):
        raise ValueError(f"{name} must be an int or one int per row ({shape[0]} rows), got "
                         f"{value!r}")
    if array.ndim > 1 or (array.ndim == 1 and array.shape != shape):
        raise ValueError(f"{name} must be an int or one int per row, shape {shape}; got shape "
                         f"{array.shape} ({value!r})")
    if is_concrete(array):
        info = np.iinfo(np.int32)
        host = np.asarray(array)
        if host.size and (host.min() < info.min or host.max() > info.max):
            raise ValueError(f"{name} must fit in int32, got {value!r}")
    return jnp.broadcast_to(jnp.asarray(array, jnp.int32), shape)


def rewound_lengths(lengths, current: jax.Array) -> jax.Array:
    """``lengths`` (an int or ``[B]`` ints) checked as a rewind of ``current: [B]``: in ``[0,
    current length]`` per row when both are concrete (inside a trace the caller bounds them)."""
    lengths = check_int_array("lengths", lengths, current.shape)
    if is_concrete(lengths) and is_concrete(current):
        new, old = np.asarray(lengths), np.asarray(current)
        if (new < 0).any() or (new > old).any():
            raise ValueError(f"rewind lengths must be in [0, current length] per row, got "
                             f"{new.tolist()} for current lengths {old.tolist()}")
    return lengths


def nbytes_of(*arrays: jax.Array) -> int:
    """Bytes of ``arrays`` at each element's bit width (int4 at half a byte)."""
    def bits(dtype) -> int:
        return (jnp.iinfo(dtype).bits if jnp.issubdtype(dtype, jnp.integer)
                else jnp.finfo(dtype).bits)

    return sum(int(np.prod(a.shape)) * bits(a.dtype) // 8 for a in arrays)


@struct.dataclass(kw_only=True)
class FloatTail:
    """The float slots a block's queries read for one layer besides the stored ones (a KIVI
    cache's ring of newest slots before the block, then the block itself): ``E`` entries."""

    k: jax.Array  # [B, K, E, H]
    v: jax.Array  # [B, K, E, H]
    positions: jax.Array  # [B, E] int32; an entry never written is at a negative position
    below: jax.Array  # [B, T] int32: each query reads stored slots below this, the rest here


@runtime_checkable
class Cache(Protocol):
    """Keys and values of ``batch_size`` rows of ``max_len`` slots with one length per row
    (module docstring). Caches subclass it to share ``positions``, ``check_room`` and the
    defaults of ``read_stored`` and ``float_tail``."""

    lengths: jax.Array  # [B] int32, valid slots per row

    @property
    @abc.abstractmethod
    def batch_size(self) -> int:
        """B: rows."""

    @property
    @abc.abstractmethod
    def max_len(self) -> int:
        """S: slots per row."""

    def positions(self, block_len: int) -> jax.Array:
        """Positions ``[B, T]`` a block of ``block_len`` tokens written now would occupy."""
        return self.lengths[:, None] + jnp.arange(block_len, dtype=jnp.int32)[None, :]

    def check_room(self, num_valid: jax.Array) -> None:
        """Raise if appending ``num_valid[b]`` tokens to row b would pass ``max_len``.

        Only possible when lengths and counts are concrete (outside ``jit``); traced callers bound
        lengths themselves.
        """
        if not (is_concrete(self.lengths) and is_concrete(num_valid)):
            return
        end = np.asarray(self.lengths) + np.asarray(num_valid)
        if (end > self.max_len).any():
            row = int(np.argmax(end > self.max_len))
            raise ValueError(
                f"cache is full: row {row} has length {int(self.lengths[row])} and the block adds "
                f"{int(np.asarray(num_valid)[row])} tokens, but max_len is {self.max_len}"
            )

    @abc.abstractmethod
    def write(self, layer: int, k: jax.Array, v: jax.Array) -> Self:
        """Store ``k, v: [B, T, K, H]`` for ``layer`` at each row's current length; the lengths do
        not move (``advance``)."""

    @abc.abstractmethod
    def read(self, layer: int, start: jax.Array | int, size: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values of slots ``[start, start + size)`` of every row, ``[B, K, size, H]``
        each, as a query at the row's newest position reads them."""

    def read_stored(self, layer: int, start: jax.Array | int,
                    size: int) -> tuple[jax.Array, jax.Array]:
        """``read`` without the float tail: the slots as stored, which a query reads below its
        ``FloatTail.below``. Without a tail, ``read`` itself."""
        return self.read(layer, start, size)

    def float_tail(self, layer: int, q_pos: jax.Array) -> FloatTail | None:
        """The float slots the block's queries ``q_pos: [B, T]`` read besides the stored ones
        (after ``write``, before ``advance``); None: the cache has none."""
        return None

    @abc.abstractmethod
    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys and values of row ``b``'s slot ``slots[b, j]`` taken from row ``rows[b, j]``
        (``rows: [B, size]``, ``slots: [B or 1, size]``), ``[B, K, size, H]`` each."""

    @abc.abstractmethod
    def advance(self, num_valid: jax.Array) -> Self:
        """Move each row's length forward by ``num_valid: [B]`` tokens."""

    @abc.abstractmethod
    def take_rows(self, rows: jax.Array) -> Self:
        """The cache whose row ``i`` reads as this cache's row ``rows[i]`` does now."""

    @abc.abstractmethod
    def rewind(self, lengths) -> Self:
        """Set each row's length back to ``lengths`` (an int or ``[B]`` ints); later slots become
        stale, and the next write overwrites them."""

    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of the arrays that hold the keys and values and what reading them needs
        (scales, zero points, a float ring, a slot or page table), the lengths left out."""


class CacheWrapper(Cache):
    """A cache built around another one, ``inner``, that holds its rows' lengths (module
    docstring). A subclass says which of its fields is the inner cache (``inner``) and how to put
    a new one in its place (``with_inner``)."""

    @property
    @abc.abstractmethod
    def inner(self) -> Cache:
        """The wrapped cache, whose lengths and sizes are this one's."""

    @abc.abstractmethod
    def with_inner(self, inner: Cache) -> Self:
        """This cache with ``inner`` in place of the wrapped one."""

    @property
    def lengths(self) -> jax.Array:  # [B] int32
        return self.inner.lengths

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    @property
    def max_len(self) -> int:
        return self.inner.max_len

    def advance(self, num_valid: jax.Array) -> Self:
        return self.with_inner(self.inner.advance(num_valid))

    def rewind(self, lengths) -> Self:
        return self.with_inner(self.inner.rewind(lengths))
