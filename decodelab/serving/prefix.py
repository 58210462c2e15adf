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
- A request shares at most ``(len(sequence) - 1) // page_size`` pages: its last token is always
  computed (its logits are the first sample's), and the page it writes into is its own. A prefix
  that ends mid-page is therefore shared up to its last full page and the rest recomputed
  (instead of a copy-on-write of the partly filled page): no page that two requests read is ever
  written, which is what makes the outputs exact, at the cost of recomputing fewer than
  ``page_size`` tokens per request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from decodelab.serving.pages import PagePool


class PrefixCache:
    """Looks up and records the full pages of each owner's sequence in ``pool``'s key index
    (module docstring); ``pool`` keeps the pages no one reads in its idle queue until it needs
    them."""

    def __init__(self, pool: PagePool):
        self.pool = pool
        self._chains: dict[Hashable, tuple[int, int]] = {}  # owner -> (pages recorded, last id)

    def lookup(self, tokens: Sequence[int]) -> tuple[list[int], int]:
        """The recorded pages holding the leading full pages of ``tokens``, in order, stopping
        at the first miss and before the page of the last token; and the id of the last entry
        found (0: none)."""
        size = self.pool.page_size
        pages, parent = [], 0
        for j in range((len(tokens) - 1) // size):
            found = self.pool.find((parent, tuple(tokens[j * size:(j + 1) * size])))
            if found is None:
                break
            page, parent = found
            pages.append(page)
        return pages, parent

    def share(self, owner: Hashable, tokens: Sequence[int]) -> int:
        """Give ``owner`` (holding no page) the recorded pages of ``tokens``' prefix; returns how
        many tokens they hold (the prefill starts there)."""
        if self.pool.pages(owner):
            raise ValueError(f"{owner!r} already holds pages; a prefix is shared on admission")
        pages, parent = self.lookup(tokens)
        self.pool.share(owner, pages)
        self._chains[owner] = (len(pages), parent)
        return len(pages) * self.pool.page_size

    def remember(self, owner: Hashable, tokens: Sequence[int], filled: int) -> None:
        """Record ``owner``'s full pages among its first ``filled`` cache slots, which hold the
        keys and values of ``tokens[:filled]``."""
        size = self.pool.page_size
        count, parent = self._chains.get(owner, (0, 0))
        held = self.pool.pages(owner)
        full = min(filled // size, len(held))
        for j in range(count, full):
            parent = self.pool.keep(held[j], (parent, tuple(tokens[j * size:(j + 1) * size])))
        self._chains[owner] = (max(count, full), parent)

    def forget(self, owner: Hashable) -> None:
        """``owner`` released its pages: its chain starts afresh."""
        self._chains.pop(owner, None)
