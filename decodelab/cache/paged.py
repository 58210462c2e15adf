"""The paged view: keys and values in a pool of fixed-size pages shared by every row, each row
reading and writing its own pages through a block table (as in vLLM's PagedAttention); rows may
also list pages they only read (a shared prefix's, full, never written again). The host side that
hands pages out and counts their readers, ``serving.pages.PagePool``, is the serving engine's.

Conventions (every caller relies on them):

- ``PagedKVCache.k`` and ``.v`` are ``[L, P, K, page_size, H]``: ``P`` pages of ``page_size``
  slots, head-major inside a page (the layout of ``dense.KVCache``, one page at a time).
  ``table: [B, M]`` maps row ``b``'s logical page ``i`` (its positions ``i * page_size ..
  (i + 1) * page_size - 1``) to a page of the pool; an entry ``>= P`` (``P`` itself) means "no
  page": a write there is dropped and a read there gives zeros that the position mask never lets
  a query see (a row never touches a page that is not in its table). A row's capacity is
  ``max_len = M * page_size``.
- The cache implements the ``base.Cache`` protocol, so the model, the decode step and
  ``blocked_attention`` run on it unchanged: ``read(layer, start, size)`` gathers the row's pages
  covering ``[start, start + size)`` (``size`` and ``start`` page-aligned, which
  ``blocked_attention``'s blocks are when ``page_size`` divides the attention block's slots).
- A rows-view for a prefill (``rows_view``) is the same pool with some rows' tables: writes land
  in the shared pool (donated, updated in place), nothing is copied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from decodelab.cache.base import Cache, nbytes_of, rewound_lengths
from decodelab.cache.dense import cache_dtype
from decodelab.checks import is_int
from decodelab.config import ModelConfig


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold ``tokens`` slots."""
    return -(-int(tokens) // page_size)


@struct.dataclass(kw_only=True)
class PagedKVCache(Cache):
    """Keys and values in a shared pool of pages, each row reading and writing its own pages
    through its block table (module docstring)."""

    k: jax.Array  # [L, P, K, page_size, H]
    v: jax.Array  # [L, P, K, page_size, H]
    table: jax.Array  # [B, M] int32, page of each row's logical page (>= P: none)
    lengths: jax.Array  # [B] int32, valid slots per row

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, num_pages: int, page_size: int,
             max_pages: int, dtype=None) -> PagedKVCache:
        """An empty pool of ``num_pages`` pages and ``batch_size`` rows of ``max_pages`` table
        entries, none of them holding a page yet, in ``dtype`` (a float dtype; default the
        config's)."""
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"cfg must be a ModelConfig, got {cfg!r}")
        for name, value in (("batch_size", batch_size), ("num_pages", num_pages),
                            ("page_size", page_size), ("max_pages", max_pages)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        resolved = cache_dtype(cfg, dtype)
        shape = (cfg.n_layers, num_pages, cfg.n_kv_heads, page_size, cfg.head_dim)
        return cls(k=jnp.zeros(shape, resolved), v=jnp.zeros(shape, resolved),
                   table=jnp.full((batch_size, max_pages), num_pages, jnp.int32),
                   lengths=jnp.zeros((batch_size,), jnp.int32))

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]

    @property
    def page_size(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.table.shape[0]

    @property
    def max_len(self) -> int:
        return self.table.shape[1] * self.page_size

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> PagedKVCache:
        """Store ``k, v: [B, T, K, H]`` at each row's positions ``lengths[b] ..
        lengths[b] + T - 1``, each token in its page's slot; a token past the row's table, or on
        a logical page with no page, is dropped (lengths do not move: ``advance``)."""
        B, T = k.shape[:2]
        pos = self.positions(T)  # [B, T]
        logical = pos // self.page_size
        page = jnp.take_along_axis(self.table, jnp.minimum(logical, self.table.shape[1] - 1),
                                   axis=1)
        page = jnp.where(logical < self.table.shape[1], page, self.num_pages)  # [B, T]
        slot = pos % self.page_size

        def put(pool, x):
            return pool.at[layer, page, :, slot, :].set(x.astype(pool.dtype), mode="drop")

        return self.replace(k=put(self.k, k), v=put(self.v, v))

    def read(self, layer: int, start: jax.Array | int, size: int) -> tuple[jax.Array, jax.Array]:
        """Keys and values of slots ``[start, start + size)`` of every row, ``[B, K, size, H]``
        each, gathered page by page through the table; ``start`` is clamped to ``[0, max_len -
        size]`` as in ``KVCache.read``. ``size`` and ``start`` must be whole pages."""
        page = self.page_size
        if size % page or size > self.max_len:
            raise ValueError(f"size must be a multiple of page_size={page} and at most max_len="
                             f"{self.max_len}, got {size}")
        B, n = self.batch_size, size // page
        first = jnp.clip(jnp.asarray(start, jnp.int32), 0, self.max_len - size) // page
        pages = jax.lax.dynamic_slice(self.table, (0, first), (B, n))  # [B, n]

        def take(pool):
            # "No page" reads zeros (never another row's page); the position mask hides them.
            blocks = jnp.take(pool[layer], pages, axis=0, mode="fill", fill_value=0)
            _, _, K, _, H = blocks.shape
            return jnp.swapaxes(blocks, 1, 2).reshape(B, K, size, H)

        return take(self.k), take(self.v)

    def gather(self, layer: int, rows: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``KVCache.gather`` through the table: row ``rows[b, j]``'s slot ``slots[b, j]`` from the
        page that holds it (zeros where the row has no page)."""
        page, M = self.page_size, self.table.shape[1]
        logical = slots // page  # [B or 1, size]
        pages = self.table[rows, jnp.minimum(logical, M - 1)]  # [B, size]
        pages = jnp.where(logical < M, pages, self.num_pages)

        def take(pool):  # [B, size, K, H] -> [B, K, size, H]
            return jnp.swapaxes(pool[layer].at[pages, :, slots % page, :].get(
                mode="fill", fill_value=0), 1, 2)

        return take(self.k), take(self.v)

    def advance(self, num_valid: jax.Array) -> PagedKVCache:
        return self.replace(lengths=self.lengths + num_valid.astype(jnp.int32))

    def take_rows(self, rows: jax.Array) -> PagedKVCache:
        """Refused: each row writes into pages of its own that the host's pool handed out, so a
        row cannot become a copy of another without pages allocated for it."""
        raise ValueError("a PagedKVCache cannot take rows: each row writes into pages of its own, "
                         "which the serving engine's PagePool allocates")

    def rewind(self, lengths) -> PagedKVCache:
        """``KVCache.rewind``: lengths move back, the pages stay the row's."""
        return self.replace(lengths=rewound_lengths(lengths, self.lengths))

    def nbytes(self) -> int:
        """Bytes of the pool's keys and values and of the block table."""
        return nbytes_of(self.k, self.v, self.table)

    def rows_view(self, rows: jax.Array, lengths: jax.Array, reach: int) -> PagedKVCache:
        """Rows ``rows`` (``>= batch_size``: a padding row, which writes nothing) as a cache of
        their own at ``lengths``, sharing the pool, with the table entries covering the first
        ``reach`` slots (for a prefill; ``merge_view`` writes it back)."""
        n = min(pages_for(reach, self.page_size), self.table.shape[1])
        rows = jnp.asarray(rows, jnp.int32)
        table = jnp.where((rows < self.batch_size)[:, None],
                          self.table[jnp.minimum(rows, self.batch_size - 1), :n], self.num_pages)
        return self.replace(table=table, lengths=jnp.asarray(lengths, jnp.int32))

    def merge_view(self, view: PagedKVCache, rows: jax.Array) -> PagedKVCache:
        """This cache with ``view``'s pool and, for its real rows, its lengths."""
        return self.replace(k=view.k, v=view.v,
                            lengths=self.lengths.at[rows].set(view.lengths, mode="drop"))
