"""The engine's paging policy: which slot takes which pages, whom to preempt, what fits.

Conventions (every caller relies on them):

- ``PagedMemory`` is a ``SlotEngine``'s paged memory: the pool (``pages.PagePool``: each page's
  reference count, exactly accounted), the host's copy of the block table (one row per slot,
  ``paged.PagedKVCache.table``'s layout), the prefix cache if on (``prefix.PrefixCache``) and
  the policy. The engine tells it which slots hold a request (``admit``, ``release``) and how
  many cache slots each will hold after the next call (the *demand*); the policy answers how
  many waiting requests fit (``room``), gives every slot its pages and preempts the most
  recently admitted requests while they do not fit (``provide``: vLLM's recompute preemption
  order), and drops the pages of a slot that is emptied: a page another slot still reads stays
  (its count falls by one), so neither preemption nor eviction frees a page in use. The engine
  uploads the table (``changed_table``) before each call that reads or writes the cache, so a
  page freed on the host is never written through a stale entry.
- With the prefix cache, an admitted slot first shares the recorded pages of its sequence's
  prefix (``share``: its prefill starts after them), and the engine reports after each call
  how far each slot's cache is written (``remember``), which records its full pages; a page
  whose last reader leaves stays recorded (idle) until an allocation needs it.
- A slot may share a page it reads only in part (a prefix ending mid-page, from the prefix
  cache or from another slot, ``share_from``): ``provide`` gives it a page of its own first
  (``pages.PagePool.copy``), and the engine copies the contents on the device (``take_copies``)
  before the call that writes into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from decodelab.cache import bucket_rows
from decodelab.checks import is_int
from decodelab.model.attention import BLOCKING
from decodelab.serving.pages import PagePool
from decodelab.serving.paged import check_page_size, pages_for
from decodelab.serving.prefix import PrefixCache


class PagedMemory:
    """The paged memory of ``num_slots`` slots of ``max_len`` cache slots: ``kv_tokens`` tokens
    of keys and values in pages of ``page_size`` (a power of two dividing the blocked
    attention's block, and ``max_len`` a multiple of it), each slot's block-table row, and the
    policy that decides which pages a slot takes and which request gives its pages back
    (module docstring). The slots are the pool's owners. A call decodes a number of slots that
    is a multiple of ``row_multiple`` (a mesh's ``data`` axis); ``prefix_cache`` keeps and
    shares the full pages of prefixes (``prefix``)."""

    def __init__(self, kv_tokens: int, page_size: int, num_slots: int, max_len: int,
                 row_multiple: int = 1, prefix_cache: bool = False):
        if not is_int(kv_tokens) or kv_tokens < 1:
            raise ValueError(f"kv_tokens must be None (a max_len cache per slot) or an int "
                             f">= 1 (tokens of KV memory in the pool), got {kv_tokens!r}")
        page_size = check_page_size(page_size, BLOCKING.slots)
        if kv_tokens % page_size:
            raise ValueError(f"page_size must divide kv_tokens={kv_tokens} (the pool is whole "
                             f"pages), got {page_size}")
        if max_len % page_size:
            raise ValueError(f"max_len must be a multiple of page_size={page_size} with "
                             f"paged memory, got {max_len}")
        self.pool = PagePool(int(kv_tokens) // page_size, page_size)
        self.table = np.full((num_slots, max_len // page_size), self.pool.num_pages, np.int32)
        self._admitted: list[int] = []  # slots holding a request, oldest admission first
        self._changed = False  # the table differs from the one last handed out
        self._row_multiple = row_multiple
        self.prefix = PrefixCache(self.pool) if prefix_cache else None
        self._copies: list[tuple[int, int]] = []  # (shared, own) pages to copy on the device

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    @property
    def tokens(self) -> int:
        """Cache slots in the whole pool (the engine's ``kv_tokens``)."""
        return self.num_pages * self.page_size

    def refuses(self, tokens: int) -> str | None:
        """Why a request that holds ``tokens`` cache slots at its end can never fit, or None."""
        need = pages_for(tokens, self.page_size)
        if need > self.num_pages:
            return (f"{tokens} tokens need {need} pages of {self.page_size}, more than the "
                    f"whole pool (kv_tokens={self.tokens})")
        return None

    def admit(self, slot: int) -> None:
        """``slot`` now holds a request (the newest); it takes pages in ``provide``."""
        self._admitted.append(slot)

    def release(self, slot: int) -> None:
        """``slot`` is emptied (its request retired or preempted): it drops its pages (a page
        no other slot reads goes back, or stays recorded if the prefix cache holds it)."""
        self._admitted.remove(slot)
        if self.prefix is not None:
            self.prefix.forget(slot)
        if self.pool.release(slot):
            self.table[slot] = self.num_pages
            self._changed = True

    def cached(self, sequence: Sequence[int]) -> tuple[list[int], int]:
        """The recorded pages a request prefilling ``sequence`` would share and the tokens they
        hold (none without the prefix cache; ``prefix.PrefixCache.lookup``)."""
        return ([], 0) if self.prefix is None else self.prefix.lookup(sequence)[:2]

    def share(self, slot: int, sequence: Sequence[int]) -> int:
        """Give the just admitted ``slot`` the recorded pages of ``sequence``'s prefix; returns
        the tokens they hold (0 without the prefix cache), where its prefill starts."""
        if self.prefix is None:
            return 0
        cached = self.prefix.share(slot, sequence)
        if cached:
            self._table_row(slot)
        return cached

    def share_from(self, slot: int, other: int, tokens: int) -> None:
        """Give the admitted ``slot`` (holding no page) the pages of ``other`` that hold its
        first ``tokens`` cache slots (one more reader each); a page it holds only part of is
        copied before ``slot`` writes into it."""
        if self.pool.pages(slot):
            raise ValueError(f"slot {slot} already holds pages; pages are shared on admission")
        count = pages_for(tokens, self.page_size)
        self.pool.share(slot, self.pool.pages(other)[:count],
                        copy_last=bool(tokens % self.page_size))
        self._table_row(slot)

    def remember(self, slot: int, sequence: Sequence[int], filled: int) -> None:
        """``slot``'s cache holds the keys and values of ``sequence[:filled]``: record its full
        pages in the prefix cache (if on)."""
        if self.prefix is not None:
            self.prefix.remember(slot, sequence, filled)

    def room(self, demand: Mapping[int, int], waiting: Iterable[int],
             shared: Sequence[Sequence[int]] = ()) -> int:
        """How many of ``waiting`` (cache slots each would hold after its first call, head of the
        queue first) fit in the pages left once every admitted slot has its ``demand``: first
        come, first served, the count stops at the first that does not fit. ``shared[i]``: the
        recorded pages request ``i`` would share and the tokens they hold (``cached``); a full
        one that someone reads (or an earlier waiting request takes) costs nothing, an idle one
        a free page; a page read in part costs its copy, and a free page until then if idle."""
        free = self.pool.free - self._lacking(demand)
        count, taken = 0, set()
        for i, tokens in enumerate(waiting):
            pages, held = shared[i] if i < len(shared) else ([], 0)
            full = held // self.page_size  # the rest: at most one page, read until copied
            free -= pages_for(tokens, self.page_size) - sum(
                1 for p in pages[:full] if self.pool.refs(p) or p in taken) + sum(
                1 for p in pages[full:] if not self.pool.refs(p) and p not in taken)
            taken.update(pages)
            if free < 0:
                break
            count += 1
        return count

    def provide(self, demand: Mapping[int, int]) -> list[int]:
        """Give every admitted slot the pages to hold its ``demand`` of cache slots, first
        releasing the most recently admitted slots while the demand does not fit; returns the
        released (preempted) slots, oldest admission first."""
        preempted = []
        while self._lacking(demand) > self.pool.free:
            slot = self._admitted[-1]
            preempted.insert(0, slot)
            self.release(slot)
        for slot in self._admitted:
            copied = self.pool.copy(slot)
            if copied:
                self._copies.append(copied)
            if self.pool.grow(slot, demand[slot]) or copied:
                self._table_row(slot)
        return preempted

    def take_copies(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The pages to copy on the device since the last call, ``(shared, own)`` int32 arrays
        (the contents of ``shared[i]`` go to ``own[i]``; padded to a power of two with pairs
        whose ``own`` is ``num_pages``: no page, dropped), or None; to be run before anything
        writes the pool."""
        if not self._copies:
            return None
        pairs = np.full((bucket_rows(len(self._copies)), 2), self.num_pages, np.int32)
        pairs[:len(self._copies)] = self._copies
        pairs[len(self._copies):, 0] = 0
        self._copies = []
        return pairs[:, 0], pairs[:, 1]

    def decode_rows(self) -> np.ndarray | None:
        """The slots a call decodes: the occupied ones, padded with free slots to
        ``cache.bucket_rows`` (``R``: a few compiled sizes), increasing; None to decode every
        slot (``R`` = ``num_slots``)."""
        num_slots = self.table.shape[0]
        occupied = sorted(self._admitted)
        R = bucket_rows(max(len(occupied), 1), self._row_multiple)
        if R >= num_slots:
            return None
        free = [i for i in range(num_slots) if i not in self._admitted]
        return np.asarray(sorted(occupied + free[:R - len(occupied)]), np.int32)

    def _table_row(self, slot: int) -> None:
        """``slot``'s pages changed: its row of the host's table follows."""
        self.table[slot] = self.pool.table_row(slot, self.table.shape[1])
        self._changed = True

    def changed_table(self) -> np.ndarray | None:
        """The block table ``[num_slots, max_len / page_size]`` if it changed since the last
        call (to be uploaded to the device), else None."""
        if not self._changed:
            return None
        self._changed = False
        return self.table

    def _lacking(self, demand: Mapping[int, int]) -> int:
        """Pages the admitted slots lack to hold their ``demand``."""
        return sum(self.pool.lacks(slot, demand[slot]) for slot in self._admitted)
