"""The prefix cache of paged KV memory: full pages found and recorded by chained keys.

Conventions (every caller relies on them):

- A page is *full* once all ``page_size`` of its cache slots hold keys and values; only full
  pages are recorded, and a page someone records is never written again (its owner writes past
  it), so every request that shares it reads what its own prefill would have written.
- The key of logical page ``j`` of a sequence is ``(parent, tokens)``: ``tokens`` the page's
  token ids, ``parent`` the id of the entry that holds page ``j - 1`` of the same sequence (0 for
  the first page). A key therefore names the whole prefix up to the end of its page (the chain of
  block hashes of vLLM's automatic prefix caching), and being a dict key that compares its tokens
  it is exact: two prefixes never collide. Entry ids are never reused, so when a page is evicted,
  the keys built on it name nothing again.
- A request shares at most ``len(sequence) - 1`` tokens: its last token is always computed (its
  logits are the first sample's). After the recorded pages of its leading full pages it also
  shares the recorded page (a child of the last one found) whose tokens agree longest with its
  next tokens, if any agree: it reads that page only in part and copies it before its first
  write (copy-on-write, ``pages.PagePool.copy``), so a prefix that ends mid-page is shared up
  to its last token. No recorded page is ever written, which is what makes the outputs exact.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from decodelab.serving.pages import PagePool


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class PrefixCache:
    """Looks up and records the full pages of each owner's sequence in ``pool``'s key index
    (module docstring); ``pool`` keeps the pages no one reads in its idle queue until it needs
    them."""

    def __init__(self, pool: PagePool):
        self.pool = pool
        self._chains: dict[Hashable, tuple[int, int]] = {}  # owner -> (pages recorded, last id)
        # entry id -> the token blocks recorded after it (pruned as their pages are evicted)
        self._children: dict[int, dict[tuple[int, ...], None]] = {}

    def lookup(self, tokens: Sequence[int]) -> tuple[list[int], int, int]:
        """The recorded pages holding the longest prefix of ``tokens[:-1]`` found: the leading
        full pages, stopping at the first miss, then at most one page that holds only the start
        of the rest (module docstring); the tokens they hold; and the id of the last full page's
        entry (0: none)."""
        size, usable = self.pool.page_size, len(tokens) - 1
        pages, parent = [], 0
        for j in range(usable // size):
            found = self.pool.find((parent, tuple(tokens[j * size:(j + 1) * size])))
            if found is None:
                break
            page, parent = found
            pages.append(page)
        start = len(pages) * size
        rest = tuple(tokens[start:min(start + size, usable)])
        best, agree = None, 0
        for block in list(self._children.get(parent, ())) if rest else ():
            found = self.pool.find((parent, block))
            if found is None:  # evicted
                del self._children[parent][block]
                continue
            count = common_length(block, rest)
            if count > agree:
                best, agree = found[0], count
        return pages + ([best] if agree else []), start + agree, parent

    def share(self, owner: Hashable, tokens: Sequence[int]) -> int:
        """Give ``owner`` (holding no page) the recorded pages of ``tokens``' prefix (the last
        copied before its first write if it holds only part of it); returns how many tokens
        they hold (the prefill starts there)."""
        if self.pool.pages(owner):
            raise ValueError(f"{owner!r} already holds pages; a prefix is shared on admission")
        pages, held, parent = self.lookup(tokens)
        full = held // self.pool.page_size
        self.pool.share(owner, pages, copy_last=len(pages) > full)
        self._chains[owner] = (full, parent)
        return held

    def remember(self, owner: Hashable, tokens: Sequence[int], filled: int) -> None:
        """Record ``owner``'s full pages among its first ``filled`` cache slots, which hold the
        keys and values of ``tokens[:filled]``."""
        size = self.pool.page_size
        count, parent = self._chains.get(owner, (0, 0))
        held = self.pool.pages(owner)
        full = min(filled // size, len(held))
        for j in range(count, full):
            block = tuple(tokens[j * size:(j + 1) * size])
            self._children.setdefault(parent, {})[block] = None
            parent = self.pool.keep(held[j], (parent, block))
        self._chains[owner] = (max(count, full), parent)

    def forget(self, owner: Hashable) -> None:
        """``owner`` released its pages: its chain starts afresh."""
        self._chains.pop(owner, None)
