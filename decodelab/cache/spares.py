"""A spare cache: the KV cache a finished ``generate`` call leaves behind, kept for the next call of
the same layout to write over instead of allocating its own.

Why. A new cache is ``max_len`` slots per row that XLA fills with zeros before the prefill writes
the prompt. On CPU that fill runs at about 3 GB/s: 40 ms for the two 67 MB arrays of ``small`` at
batch 8 and ``max_len`` 4096, several times the prefill itself, so a whole call grew with the
capacity even where a step does not. Nothing needs the zeros: by the cache protocol (``base``)
slots at or past a row's length are stale and attention never lets a query see them (masked
scores give probabilities of exactly 0, and 0 times a finite stale value is 0). A cache rewound to
length 0 is as good as a new one, and writing over it touches only the slots the call fills.

Rules.

- One spare at a time, the newest call's, so at most one cache's memory is held between calls. A
  call that needs another layout drops it (``take``) before it allocates its own, so a call's
  peak memory is what it was without spares.
- A spare is taken by one call only and donated to its prefill, which updates the buffers in
  place.
- A call keeps its final cache as the spare only if every row's logits stayed finite: a row whose
  logits held NaN or inf may have written non-finite keys or values, which a probability of 0
  does not cancel.
- ``release()`` drops the spare (its memory is freed when nothing else holds it).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from decodelab.cache.base import Cache


class Spares:
    """Holds at most one cache, under the layout key its caller gives (``decode`` keys by model
    config, rows, slots, cache kind and mesh); thread-safe, so two calls never share one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[Hashable, Cache] | None = None

    def take(self, key: Hashable) -> Cache | None:
        """The held cache if it was kept under ``key``, else None; either way nothing is held
        afterwards (a cache of another layout is dropped)."""
        with self._lock:
            held, self._held = self._held, None
        return held[1] if held is not None and held[0] == key else None

    def keep(self, key: Hashable, cache: Cache) -> None:
        """Hold ``cache`` (stale contents, any lengths) for the next ``take(key)``."""
        with self._lock:
            self._held = (key, cache)

    def release(self) -> None:
        """Hold nothing."""
        with self._lock:
            self._held = None

    @property
    def held_bytes(self) -> int:
        """Bytes of the held cache's keys and values (0 when none is held)."""
        with self._lock:
            return 0 if self._held is None else self._held[1].nbytes()


SPARES = Spares()  # generate's spare cache
