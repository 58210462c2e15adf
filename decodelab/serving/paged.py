"""Paged KV memory, the serving side: the page-size rule, and the paged view the engine runs on.

The view, ``PagedKVCache`` (a pool of fixed-size pages shared by every row and a block table per
row, as in vLLM's PagedAttention), lives with the other caches in ``cache/paged.py`` and is
re-exported here with ``pages_for``; the host-side allocator that hands its pages out is
``pages.PagePool`` (its policy: ``pool.PagedMemory``): the serving engine owns the device table
and uploads the host's table before each call that reads or writes the cache, so a page freed on
the host is never written through a stale entry.
"""

from __future__ import annotations

from decodelab.cache.paged import PagedKVCache, pages_for
from decodelab.checks import is_int

__all__ = ["PagedKVCache", "check_page_size", "pages_for"]


def check_page_size(page_size, block_slots: int) -> int:
    """``page_size`` as an int: a power of two that divides ``block_slots`` (the blocked
    attention's block, so every block it reads is whole pages)."""
    if not is_int(page_size) or page_size < 1 or page_size & (page_size - 1) or (
            block_slots % page_size):
        raise ValueError(f"page_size must be a power of two dividing {block_slots} (the blocked "
                         f"attention's block of cache slots), got {page_size!r}")
    return int(page_size)
