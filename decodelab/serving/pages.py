"""The host's page accounting of paged KV memory: each page's readers (a reference count), the
free list, the index of kept pages with its idle queue (the prefix cache's, ``prefix``), and the
pages an owner must copy before it writes into them (copy-on-write). ``pool.PagedMemory`` decides
who gets which pages; this module only keeps the record exact.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Hashable, Iterable

import numpy as np

from decodelab.checks import is_int
from decodelab.serving.paged import pages_for


class PagePool:
    """The host's record of the pages: which owners read each page (its reference count), the
    pages no one reads, and the index of kept pages (the prefix cache's).

    An owner's pages are a list in logical order; a page may be in several owners' lists
    (a shared prefix), each adding one to its count. ``allocate(owner, n)`` gives ``owner`` ``n``
    pages no one reads (all or none), ``share(owner, pages)`` appends pages that others may read,
    ``release(owner)`` drops all of its pages: a page returns to the free list only when its count
    falls to 0, or, if it is *kept* (``keep``: it holds a full block of tokens under a key), to
    the end of the idle queue, where it stays findable by its key (``find``) until an allocation
    finds the free list empty and evicts the least recently released idle page (its key is
    forgotten). Pages are handed out lowest first from the free list, so a run is deterministic.
    ``check()`` raises if any count, list or key disagrees with another.

    Copy-on-write: ``share(owner, pages, copy_last=True)`` marks the last page shared as one
    ``owner`` reads only in part (a prefix ending mid-page) and will write into: before its first
    write, ``copy(owner)`` gives it a fresh page in its place (allocated while the shared one is
    still read, so it cannot be the same page) and drops its read of the shared one; the caller
    copies the page's contents on the device. Until then ``lacks`` counts that page as lacking.
    An owner writes in place only into pages it allocated (or copied); the slots of a shared
    page that a sharer reads are never written again.
    """

    def __init__(self, num_pages: int, page_size: int):
        if not is_int(num_pages) or num_pages < 1:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        if not is_int(page_size) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self._free = collections.deque(range(self.num_pages))  # count 0, no key
        self._idle: dict[int, None] = {}  # count 0, kept: least recently released first
        self._owned: dict[Hashable, list[int]] = {}
        self._refs = [0] * self.num_pages
        self._index: dict[Hashable, int] = {}  # key -> kept page
        self._keys: dict[int, Hashable] = {}  # kept page -> key
        self._ids: dict[int, int] = {}  # kept page -> its entry's id (never reused)
        self._next_id = itertools.count(1)
        self._copies: dict[Hashable, int] = {}  # owner -> index of the page it copies first
        self.evictions = 0  # idle pages taken by allocations (their keys forgotten)
        self.copies = 0  # pages given in place of a shared page to copy (``copy``)
        self.peak = 0  # the most pages read at once since creation (``used``'s high-water mark)

    @property
    def free(self) -> int:
        """Pages no one reads (free or idle): what an allocation can take."""
        return len(self._free) + len(self._idle)

    @property
    def used(self) -> int:
        """Pages some owner reads."""
        return self.num_pages - self.free

    @property
    def idle(self) -> int:
        """Kept pages no one reads (the prefix cache's, evicted when the free list runs out)."""
        return len(self._idle)

    def pages(self, owner: Hashable) -> list[int]:
        """``owner``'s pages in logical order (a copy)."""
        return list(self._owned.get(owner, ()))

    def refs(self, page: int) -> int:
        """How many owners read ``page``."""
        return self._refs[page]

    @property
    def owners(self) -> list[Hashable]:
        return list(self._owned)

    def allocate(self, owner: Hashable, n: int) -> list[int]:
        """Give ``owner`` ``n`` pages no one reads and return them: from the free list, then the
        least recently released idle pages (evicted: their keys are forgotten); raises ValueError
        (and gives none) when fewer than ``n`` are free."""
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if n > self.free:
            raise ValueError(f"cannot allocate {n} pages to {owner!r}: only {self.free} "
                             f"of {self.num_pages} are free")
        new = [self._free.popleft() for _ in range(min(n, len(self._free)))]
        while len(new) < n:
            page = next(iter(self._idle))
            del self._idle[page], self._index[self._keys.pop(page)], self._ids[page]
            new.append(page)
            self.evictions += 1
        self.share(owner, new)
        return new

    def share(self, owner: Hashable, pages: Iterable[int], copy_last: bool = False) -> None:
        """Append ``pages`` (read by others, idle, or just allocated) to ``owner``'s, each
        counting one more reader; an idle page leaves the idle queue. ``copy_last``: ``owner``
        copies the last of them before writing into it (class docstring)."""
        held = self._owned.setdefault(owner, [])
        if copy_last and owner in self._copies:
            raise ValueError(f"{owner!r} already has a page to copy")
        for page in pages:
            if page in held:
                raise ValueError(f"page {page} is already {owner!r}'s")
            self._refs[page] += 1
            self._idle.pop(page, None)
            held.append(page)
        if copy_last and held:
            self._copies[owner] = len(held) - 1
        self.peak = max(self.peak, self.used)  # only a new read (here) raises the pages read

    def to_copy(self, owner: Hashable) -> int | None:
        """The shared page ``owner`` must copy before writing into it, or None."""
        index = self._copies.get(owner)
        return None if index is None else self._owned[owner][index]

    def copy(self, owner: Hashable) -> tuple[int, int] | None:
        """Give ``owner`` its own page in place of the shared page it must copy (allocated from
        the free pages, all or none) and drop its read of the shared one; returns ``(shared,
        own)``, whose contents the caller copies on the device before ``owner`` writes, or None
        when ``owner`` has no page to copy."""
        index = self._copies.get(owner)
        if index is None:
            return None
        held = self._owned[owner]
        [own] = self.allocate(owner, 1)  # appended while the shared page is still read
        del self._copies[owner]
        self.copies += 1
        shared, held[index] = held[index], held.pop()
        self._refs[shared] -= 1
        self._unread([shared] if not self._refs[shared] else [])
        return shared, own

    def grow(self, owner: Hashable, tokens: int) -> list[int]:
        """Allocate what ``owner`` lacks to hold ``tokens`` slots (all or none)."""
        return self.allocate(owner, self.lacks(owner, tokens))

    def lacks(self, owner: Hashable, tokens: int) -> int:
        """Pages ``owner`` would need beyond its own to hold ``tokens`` slots (a page it must
        copy counts as lacking)."""
        held = len(self._owned.get(owner, ()))
        return max(pages_for(tokens, self.page_size) - held, 0) + (owner in self._copies)

    def release(self, owner: Hashable) -> int:
        """Drop every page of ``owner``: those no one else reads go back to the free list, or,
        if kept, to the idle queue (the last logical page first, so a sequence's tail is evicted
        before the head that other prompts share); returns how many pages ``owner`` held."""
        pages = self._owned.pop(owner, [])
        self._copies.pop(owner, None)
        unread = []
        for page in pages:
            self._refs[page] -= 1
            if not self._refs[page]:
                unread.append(page)
        self._unread(unread)
        return len(pages)

    def _unread(self, pages: list[int]) -> None:
        """``pages`` (logical order) lost their last reader: to the free list, or if kept to the
        idle queue, last page first."""
        self._free.extend(sorted(p for p in pages if p not in self._keys))
        self._idle.update(dict.fromkeys(reversed([p for p in pages if p in self._keys])))

    def keep(self, page: int, key: Hashable) -> int:
        """Index ``page`` (read by someone, its block of tokens written) under ``key``, unless
        ``key`` already names a page; returns the id of the entry ``key`` names (a chain's next
        key is built from it, ``prefix.PrefixCache``). Ids are never reused, so a key built on
        an evicted entry never names a page again."""
        if key not in self._index:
            if page in self._keys or not self._refs[page]:
                raise ValueError(f"page {page} cannot be kept: it is already kept or unread")
            self._index[key], self._keys[page] = page, key
            self._ids[page] = next(self._next_id)
        return self._ids[self._index[key]]

    def find(self, key: Hashable) -> tuple[int, int] | None:
        """The kept page under ``key`` and its entry's id, or None."""
        page = self._index.get(key)
        return None if page is None else (page, self._ids[page])

    def check(self) -> None:
        """Raise AssertionError unless each page's count is the number of owners that list it,
        every page no one reads is on the free list (no key) or in the idle queue (kept), exactly
        once, no page someone reads is on either, and the key index agrees with itself."""
        readers = collections.Counter(p for pages in self._owned.values() for p in pages)
        unread = collections.Counter([*self._free, *self._idle])
        problems = []
        for page in range(self.num_pages):
            if readers[page] != self._refs[page]:
                problems.append(f"page {page}: count {self._refs[page]}, {readers[page]} owners")
            if unread[page] != (self._refs[page] == 0):
                problems.append(f"page {page}: count {self._refs[page]}, {unread[page]} times "
                                f"free or idle")
        if any(len(set(pages)) != len(pages) for pages in self._owned.values()):
            problems.append("an owner lists a page twice")
        if any(i >= len(self._owned.get(o, ())) for o, i in self._copies.items()):
            problems.append("an owner copies a page it does not list")
        if set(self._free) & set(self._keys) or not set(self._idle) <= set(self._keys):
            problems.append("a free page is kept or an idle page is not")
        if {p: k for k, p in self._index.items()} != self._keys or set(self._ids) != set(
                self._keys) or set(unread) - set(range(self.num_pages)):
            problems.append("the key index disagrees with itself")
        if problems:
            raise AssertionError("page pool accounting broken: " + "; ".join(problems))

    def table_row(self, owner: Hashable, max_pages: int) -> np.ndarray:
        """``[max_pages]`` int32: ``owner``'s pages, then ``num_pages`` (no page)."""
        row = np.full((max_pages,), self.num_pages, np.int32)
        pages = self._owned.get(owner, [])
        row[:len(pages)] = pages
        return row
