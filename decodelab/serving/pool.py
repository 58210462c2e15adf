"""The host side of paged KV memory: the page pool's accounting and the engine's paging policy.

Conventions (every caller relies on them):

- ``PagePool`` keeps the free list and each owner's pages in order, with exact accounting
  (``check`` verifies that every page is free or owned by exactly one owner). Pages are handed
  out lowest first, so a run is deterministic.
- ``PagedMemory`` is a ``SlotEngine``'s paged memory: the pool, the host's copy of the block
  table (one row per slot, ``paged.PagedKVCache.table``'s layout) and the policy. The engine
  tells it which slots hold a request (``admit``, ``release``) and how many cache slots each
  will hold after the next call (the *demand*); the policy answers how many waiting requests
  fit (``room``), gives every slot its pages and preempts the most recently admitted requests
  while they do not fit (``provide``: vLLM's recompute preemption order), and frees the pages of
  a slot that is emptied. The engine uploads the table (``changed_table``) before each call
  that reads or writes the cache, so a page freed on the host is never written through a stale
  entry.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Mapping

import numpy as np

from decodelab.cache import bucket_rows
from decodelab.checks import is_int
from decodelab.model.attention import BLOCKING
from decodelab.serving.paged import check_page_size, pages_for


class PagePool:
    """The host's record of which pages are free and which owner holds which pages, in order.

    ``allocate(owner, n)`` gives ``owner`` ``n`` more pages (all or none), ``release(owner)``
    returns all of its pages; pages are handed out lowest first from the free list, so a run is
    deterministic. ``check()`` raises if any page is lost, double-owned or both free and owned.
    """

    def __init__(self, num_pages: int, page_size: int):
        if not is_int(num_pages) or num_pages < 1:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        if not is_int(page_size) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self._free = collections.deque(range(self.num_pages))
        self._owned: dict[Hashable, list[int]] = {}

    @property
    def free(self) -> int:
        """Pages on the free list."""
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_pages - len(self._free)

    def pages(self, owner: Hashable) -> list[int]:
        """``owner``'s pages in logical order (a copy)."""
        return list(self._owned.get(owner, ()))

    @property
    def owners(self) -> list[Hashable]:
        return list(self._owned)

    def allocate(self, owner: Hashable, n: int) -> list[int]:
        """Give ``owner`` ``n`` more pages and return them; raises ValueError (and gives none)
        when fewer than ``n`` are free."""
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} pages to {owner!r}: only {len(self._free)} "
                             f"of {self.num_pages} are free")
        new = [self._free.popleft() for _ in range(n)]
        self._owned.setdefault(owner, []).extend(new)
        return new

    def grow(self, owner: Hashable, tokens: int) -> list[int]:
        """Allocate what ``owner`` lacks to hold ``tokens`` slots (all or none)."""
        return self.allocate(owner, self.lacks(owner, tokens))

    def lacks(self, owner: Hashable, tokens: int) -> int:
        """Pages ``owner`` would need beyond its own to hold ``tokens`` slots."""
        return max(pages_for(tokens, self.page_size) - len(self._owned.get(owner, ())), 0)

    def release(self, owner: Hashable) -> int:
        """Return every page of ``owner`` to the free list; returns how many."""
        pages = self._owned.pop(owner, [])
        self._free.extend(sorted(pages))
        return len(pages)

    def check(self) -> None:
        """Raise AssertionError unless every page is either free or owned by exactly one owner."""
        seen = collections.Counter(self._free)
        for pages in self._owned.values():
            seen.update(pages)
        bad = {p: c for p, c in seen.items() if c != 1}
        missing = set(range(self.num_pages)) - set(seen)
        extra = set(seen) - set(range(self.num_pages))
        if bad or missing or extra:
            raise AssertionError(f"page pool accounting broken: counts {bad}, lost {missing}, "
                                 f"unknown {extra}")

    def table_row(self, owner: Hashable, max_pages: int) -> np.ndarray:
        """``[max_pages]`` int32: ``owner``'s pages, then ``num_pages`` (no page)."""
        row = np.full((max_pages,), self.num_pages, np.int32)
        pages = self._owned.get(owner, [])
        row[:len(pages)] = pages
        return row


class PagedMemory:
    """The paged memory of ``num_slots`` slots of ``max_len`` cache slots: ``kv_tokens`` tokens
    of keys and values in pages of ``page_size`` (a power of two dividing the blocked
    attention's block, and ``max_len`` a multiple of it), each slot's block-table row, and the
    policy that decides which pages a slot takes and which request gives its pages back
    (module docstring). The slots are the pool's owners. A call decodes a number of slots that
    is a multiple of ``row_multiple`` (a mesh's ``data`` axis)."""

    def __init__(self, kv_tokens: int, page_size: int, num_slots: int, max_len: int,
                 row_multiple: int = 1):
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
        """``slot`` is emptied (its request retired or preempted): its pages go back."""
        self._admitted.remove(slot)
        if self.pool.release(slot):
            self.table[slot] = self.num_pages
            self._changed = True

    def room(self, demand: Mapping[int, int], waiting: Iterable[int]) -> int:
        """How many of ``waiting`` (cache slots each would hold after its first call, head of the
        queue first) fit in the pages left once every admitted slot has its ``demand``: first
        come, first served, the count stops at the first that does not fit."""
        free = self.pool.free - self._lacking(demand)
        count = 0
        for tokens in waiting:
            free -= pages_for(tokens, self.page_size)
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
            if self.pool.grow(slot, demand[slot]):
                self.table[slot] = self.pool.table_row(slot, self.table.shape[1])
                self._changed = True
        return preempted

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
