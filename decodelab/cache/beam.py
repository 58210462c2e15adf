"""The beam view: a cache whose rows are reordered without copying keys and values, so beam search
gives each surviving beam its parent's history at the cost of a ``[B, S]`` table
(``decode/beam.py``).

``store`` holds, per physical row, the tokens that row wrote (and the rows' lengths); ``source[b,
j]`` is the physical row whose slot j holds row b's token at position j. A write puts row b's block
into physical row b at its length and points those slots at b; ``take_rows`` reorders ``source``
and the lengths only. A row's write overwrites slots of its physical row from its length on, so
rows that share history must not write below a slot another row still reads: beams of one prompt
always have the same length, and the lengths only grow. The store must let rows read each other's
slots (``Cache.gather``: a float or an int8 cache, whose scale per token reads the same from
whichever row holds it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from decodelab.cache.base import Cache, CacheWrapper, nbytes_of


@struct.dataclass(kw_only=True)
class BeamCache(CacheWrapper):
    """Rows that share history through a slot table over a store of physical rows (module
    docstring); the store holds the lengths (``rewind`` moves them: rewinding a row below a slot
    another row reads from its physical row breaks the sharing rule)."""

    store: Cache  # a KVCache (or a QuantizedKVCache) of the physical rows; lengths per logical row
    source: jax.Array  # [B, S] int32, physical row of each slot of each row

    @classmethod
    def from_prompts(cls, prompts: Cache, width: int) -> BeamCache:
        """``width`` beams per row of ``prompts`` (rows ``b * width + w``; any cache with
        ``gather``); every beam's row starts as a copy of its prompt's row and reads itself."""
        B, S = prompts.batch_size, prompts.max_len
        store = prompts.take_rows(jnp.repeat(jnp.arange(B, dtype=jnp.int32), width))
        source = jnp.broadcast_to(jnp.arange(B * width, dtype=jnp.int32)[:, None], (B * width, S))
        return cls(store=store, source=source)

    @property
    def inner(self) -> Cache:
        return self.store

    def with_inner(self, inner: Cache) -> BeamCache:
        return self.replace(store=inner)

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> BeamCache:
        """``KVCache.write`` into each row's own physical row, whose new slots it now owns."""
        B, T = k.shape[:2]
        rows = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, T))
        source = self.source.at[rows, self.positions(T)].set(rows, mode="drop")
        return self.replace(store=self.store.write(layer, k, v), source=source)

    def read(self, layer: int, start: jax.Array | int, size: int) -> tuple[jax.Array, jax.Array]:
        """``KVCache.read``: slots ``[start, start + size)`` (start clamped into range), each
        gathered from the physical row that holds it."""
        first = jnp.clip(start, 0, self.max_len - size)
        rows = jax.lax.dynamic_slice_in_dim(self.source, first, size, axis=1)  # [B, size]
        slots = (first + jnp.arange(size, dtype=jnp.int32))[None, :]  # [1, size]
        return self.store.gather(layer, rows, slots)  # [B, K, size, H] each

    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``KVCache.gather`` of logical rows: each slot from the physical row that holds it for
        row ``rows[b, j]``."""
        return self.store.gather(layer, self.source[rows, slots], slots)

    def take_rows(self, rows: jax.Array) -> BeamCache:
        """Row ``i`` reads as row ``rows[i]`` did (``rows: [B]``, the same number of rows); only
        the ``[B, S]`` slot table and the lengths move (rows are only taken among beams of one
        prompt, which have the same length, so ``rewind`` never raises a length)."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(store=self.store.rewind(self.lengths[rows]), source=self.source[rows])

    def nbytes(self) -> int:
        """Bytes of the store and the slot table."""
        return self.store.nbytes() + nbytes_of(self.source)
