"""KVCache: an explicit, static-shape key/value cache with one length per row.

Conventions (every caller relies on them):

- ``k`` and ``v`` are ``[L, B, K, S, H]``, head-major: for one layer and row, each kv head's slots
  are contiguous, the layout both attention einsums read, so no step transposes the cache. Slot
  ``j`` of row ``b`` holds the token at position ``j`` of that row. ``lengths[b]`` counts the valid
  slots of row ``b``; slots at or beyond it hold stale values that are never attended (attention
  masks by position, see ``model/attention.py``).
- Rows are independent: ragged prompts, slots of a serving engine at different positions and
  speculative rollback are all "each row has its own length".
- ``write(layer, k, v)`` takes a block of ``T`` tokens as the projections make it (``[B, T, K, H]``)
  and puts it at slots ``lengths[b] .. lengths[b] + T - 1`` with one in-place window update per row
  (no scatter of single slots); ``advance`` then moves ``lengths[b]`` by the row's count of valid
  tokens (the rest of the block is padding). Writing past ``S`` is an error when lengths are
  concrete; inside a trace, out-of-range slots are dropped (never wrapped onto earlier slots), and
  the decode loop stops a row before its cache is full.
- ``read(layer, start, size)`` returns slots ``[start, start + size)`` of every row as float
  ``[B, K, size, H]``; attention reads the cache only through it (``read_stored``, the same here),
  a block at a time. So a cache that stores something else (quantized values, beams sharing a
  prompt, pages) works wherever this one does when it implements the same ``base.Cache``
  protocol.
- ``RowView`` is some rows of a cache seen as a cache of their own, for one forward pass: the
  serving engine prefills the rows of new requests through it, writing straight into the shared
  cache's buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.cache.base import Cache, nbytes_of, rewound_lengths
from decodelab.config import ModelConfig


def _write_rows(cache: jax.Array, layer: int, block: jax.Array, at: jax.Array,
                shift: jax.Array, rows: jax.Array | None = None) -> jax.Array:
    """``cache: [L, B, K, S, H]`` with ``block: [B', T, K, H]`` written into layer ``layer`` of
    row ``rows[b]`` (default: row b) at window ``[at[b], at[b] + T)`` (in range), the window's first
    ``shift[b]`` slots keeping their values and token j landing in window slot ``j + shift[b]``.
    A row index out of range (``B``) writes nothing.

    One window update per row, ``[K, T, H]`` at ``(layer, rows[b], :, at[b], :)``, in the cache's
    own layout, so XLA updates the (donated) buffer in place.
    """
    _, _, K, _, H = cache.shape
    B, T = block.shape[:2]
    block = jnp.swapaxes(block, 1, 2).astype(cache.dtype)  # [B', K, T, H]
    if rows is None:
        rows, mode = jnp.arange(B, dtype=jnp.int32), jax.lax.GatherScatterMode.CLIP
    else:
        rows, mode = rows.astype(jnp.int32), jax.lax.GatherScatterMode.FILL_OR_DROP
    index = jnp.stack([jnp.full((B,), layer, jnp.int32), rows,
                       at.astype(jnp.int32)], axis=1)  # [B', 3]: (layer, row, first slot)
    windows = dict(offset_dims=(1, 2, 3), collapsed_slice_dims=(0, 1), start_index_map=(0, 1, 3))
    old = jax.lax.gather(cache, index, jax.lax.GatherDimensionNumbers(**windows),
                         slice_sizes=(1, 1, K, T, H), indices_are_sorted=True,
                         mode=mode)  # [B', K, T, H]
    window = jnp.arange(T, dtype=jnp.int32)[None, :]  # [1, T]
    source = jnp.clip(window - shift[:, None], 0, T - 1)  # [B, T]: token landing in window slot
    moved = jnp.take_along_axis(block, source[:, None, :, None], axis=2)  # [B, K, T, H]
    new = jnp.where((window >= shift[:, None])[:, None, :, None], moved, old)
    numbers = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(1, 2, 3), inserted_window_dims=(0, 1),
        scatter_dims_to_operand_dims=(0, 1, 3))
    return jax.lax.scatter(cache, index, new, numbers, indices_are_sorted=True,
                           unique_indices=True, mode=mode)


def cache_dtype(cfg: ModelConfig, dtype=None) -> jnp.dtype:
    """The dtype a cache of ``cfg`` stores keys and values in: ``dtype``, or the config's when it
    is None; a ValueError unless it is a float dtype."""
    allowed = "a float dtype such as float32, bfloat16 or float16"
    try:
        resolved = jnp.dtype(cfg.dtype if dtype is None else dtype)
    except TypeError:
        raise ValueError(f"dtype must be {allowed}, got {dtype!r}") from None
    if not jnp.issubdtype(resolved, jnp.floating):
        raise ValueError(f"dtype must be {allowed}, got {dtype!r}")
    return resolved


@struct.dataclass(kw_only=True)
class KVCache(Cache):
    """Per-layer keys and values for a batch of rows, plus each row's length."""

    k: jax.Array  # [L, B, K, S, H]
    v: jax.Array  # [L, B, K, S, H]
    lengths: jax.Array  # [B] int32, valid slots per row

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
        """An empty cache of ``max_len`` slots per row (all lengths 0), in ``dtype`` (a float
        dtype; default the config's)."""
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"cfg must be a ModelConfig, got {cfg!r}")
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        resolved = cache_dtype(cfg, dtype)
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        return cls(
            k=jnp.zeros(shape, resolved),
            v=jnp.zeros(shape, resolved),
            lengths=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> KVCache:
        """Store ``k, v: [B, T, K, H]`` for ``layer`` at each row's current length.

        Lengths do not move (all layers of one forward pass write at the same offsets); call
        ``advance`` once after the last layer. A row with fewer than ``T`` slots left keeps its
        first tokens and drops the rest: the update window is moved back into range and its
        leading slots are rewritten with their own values, so clamping never shifts tokens onto
        earlier slots.
        """
        S = self.max_len
        if k.shape[1] > S:  # only the first S tokens of a block can land in range
            k, v = k[:, :S], v[:, :S]
        T = k.shape[1]
        at = jnp.minimum(self.lengths, S - T)  # [B], the in-range window start
        shift = self.lengths - at  # [B] >= 0
        return self.replace(k=_write_rows(self.k, layer, k, at, shift),
                            v=_write_rows(self.v, layer, v, at, shift))

    def read(self, layer: int, start: jax.Array | int, size: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values of slots ``[start, start + size)`` of every row, ``[B, K, size, H]``
        each. ``size`` is static, ``start`` may be traced; like ``lax.dynamic_slice``, ``start`` is
        clamped to ``[0, max_len - size]``, so a caller reading a last partial block masks the
        slots before its nominal start."""
        _, B, K, _, H = self.k.shape
        index = (layer, 0, 0, start, 0)
        return (jax.lax.dynamic_slice(self.k, index, (1, B, K, size, H))[0],
                jax.lax.dynamic_slice(self.v, index, (1, B, K, size, H))[0])

    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys and values of row ``b``'s slot ``slots[b, j]`` taken from row ``rows[b, j]``
        (``rows: [B, size]``, ``slots: [B or 1, size]``), ``[B, K, size, H]`` each: how rows that
        share history read it (``beam.BeamCache``)."""
        k = self.k[layer, rows, :, slots, :]  # [B, size, K, H]
        v = self.v[layer, rows, :, slots, :]
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    def advance(self, num_valid: jax.Array) -> KVCache:
        """Move each row's length forward by ``num_valid: [B]`` tokens."""
        return self.replace(lengths=self.lengths + num_valid.astype(jnp.int32))

    def take_rows(self, rows: jax.Array) -> KVCache:
        """The cache whose row ``i`` is a copy of this cache's row ``rows[i]`` (``rows: [B']`` int,
        in ``[0, B)``, repeats allowed). This copies every slot of every chosen row; beam search
        reorders its beams without a copy (``beam.BeamCache``)."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(k=self.k[:, rows], v=self.v[:, rows], lengths=self.lengths[rows])

    def rewind(self, lengths) -> KVCache:
        """Set each row's length back to ``lengths`` (an int or ``[B]`` ints); later slots become
        stale.

        This is how speculative decoding drops rejected draft tokens and how a serving slot is
        freed: nothing is erased, the next write overwrites.
        """
        return self.replace(lengths=rewound_lengths(lengths, self.lengths))

    def nbytes(self) -> int:
        """Bytes of the stored keys and values."""
        return nbytes_of(self.k, self.v)


@struct.dataclass(kw_only=True)
class RowView(Cache):
    """Rows of a ``KVCache`` seen as a cache of their own: row ``i`` of the view is row
    ``rows[i]`` of the underlying keys and values, at the view's own length ``lengths[i]``.

    Writes go straight into the underlying buffers (``k``, ``v`` are the whole cache's, donated
    and updated in place by the caller's program) and reads gather only the rows and slots they
    return, so prefilling a few rows of a serving cache copies no row and allocates no cache.
    A row index at or past the cache's batch size is a padding row: it reads clamped values that
    the caller ignores and writes nothing (give each padding row its own such index).
    ``reach`` is the view's ``max_len``: the slots ``[0, reach)`` it can write and read (a prefill
    from slot 0 of a ``T``-token block needs only ``T``; a later chunk needs the whole row).
    It serves a forward pass of the model (no ``take_rows``: it is not a cache to reorder).
    """

    k: jax.Array  # [L, B, K, S, H], the whole cache's
    v: jax.Array  # [L, B, K, S, H]
    rows: jax.Array  # [R] int32, increasing: the cache row of each view row (>= B: padding)
    lengths: jax.Array  # [R] int32, valid slots per view row
    reach: int = struct.field(pytree_node=False)

    @classmethod
    def of(cls, cache: KVCache, rows: jax.Array, lengths: jax.Array, reach: int) -> RowView:
        if not 1 <= reach <= cache.max_len:
            raise ValueError(f"reach must be in [1, {cache.max_len}] (the cache's max_len), got "
                             f"{reach}")
        return cls(k=cache.k, v=cache.v, rows=jnp.asarray(rows, jnp.int32),
                   lengths=jnp.asarray(lengths, jnp.int32), reach=reach)

    def merged_into(self, cache: KVCache) -> KVCache:
        """``cache`` with this view's keys and values and, for its real rows, its lengths."""
        return cache.replace(k=self.k, v=self.v,
                             lengths=cache.lengths.at[self.rows].set(self.lengths, mode="drop"))

    @property
    def batch_size(self) -> int:
        return self.rows.shape[0]

    @property
    def max_len(self) -> int:
        return self.reach

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> RowView:
        """``KVCache.write`` into the view's rows of the underlying cache."""
        if k.shape[1] > self.reach:
            k, v = k[:, :self.reach], v[:, :self.reach]
        T = k.shape[1]
        at = jnp.minimum(self.lengths, self.reach - T)
        shift = self.lengths - at
        return self.replace(k=_write_rows(self.k, layer, k, at, shift, self.rows),
                            v=_write_rows(self.v, layer, v, at, shift, self.rows))

    def read(self, layer: int, start: jax.Array | int, size: int) -> tuple[jax.Array, jax.Array]:
        """``KVCache.read`` of the view's rows: ``[R, K, size, H]`` each, ``start`` clamped to
        ``[0, reach - size]``; one gather of exactly those slots."""
        _, _, K, _, H = self.k.shape
        R = self.batch_size
        start = jnp.clip(jnp.asarray(start, jnp.int32), 0, self.reach - size)
        index = jnp.stack([jnp.full((R,), layer, jnp.int32), self.rows,
                           jnp.broadcast_to(start, (R,))], axis=1)  # [R, 3]
        numbers = jax.lax.GatherDimensionNumbers(offset_dims=(1, 2, 3),
                                                 collapsed_slice_dims=(0, 1),
                                                 start_index_map=(0, 1, 3))

        def take(x):
            return jax.lax.gather(x, index, numbers, slice_sizes=(1, 1, K, size, H),
                                  indices_are_sorted=True, mode=jax.lax.GatherScatterMode.CLIP)

        return take(self.k), take(self.v)

    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``KVCache.gather`` of the view's rows (a padding row reads the cache's last row)."""
        cache_rows = jnp.minimum(self.rows[rows], self.k.shape[1] - 1)  # [R, size]
        k = self.k[layer, cache_rows, :, slots, :]  # [R, size, K, H]
        v = self.v[layer, cache_rows, :, slots, :]
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    def advance(self, num_valid: jax.Array) -> RowView:
        return self.replace(lengths=self.lengths + num_valid.astype(jnp.int32))

    def take_rows(self, rows: jax.Array) -> RowView:
        """Refused: the view's rows write straight into the cache it views, so a row cannot
        become a copy of another; take the rows of that cache (``KVCache.take_rows``)."""
        raise ValueError("a RowView cannot take rows: its rows write into the viewed cache's "
                         "own rows; call take_rows on that cache")

    def rewind(self, lengths) -> RowView:
        return self.replace(lengths=rewound_lengths(lengths, self.lengths))

    def nbytes(self) -> int:
        """Bytes of the viewed cache's keys and values, which the view holds."""
        return nbytes_of(self.k, self.v)
