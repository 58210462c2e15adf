"""KVCache: an explicit, static-shape key/value cache with one length per row.

Conventions (every caller relies on them):

- ``k`` and ``v`` are ``[L, B, S, K, H]``; slot ``j`` of row ``b`` holds the token at position ``j``
  of that row. ``lengths[b]`` counts the valid slots of row ``b``; slots at or beyond it hold stale
  values that are never attended (attention masks by position, see ``model/attention.py``).
- Rows are independent: ragged prompts, slots of a serving engine at different positions and
  speculative rollback are all "each row has its own length".
- Writing a block of ``T`` tokens puts them at slots ``lengths[b] .. lengths[b] + T - 1`` and then
  advances ``lengths[b]`` by the row's count of valid tokens (the rest of the block is padding).
  Writing past ``S`` is an error when lengths are concrete; inside a trace, out-of-range writes are
  dropped (never wrapped onto earlier slots), and the decode loop stops a row before its cache is full.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.config import ModelConfig


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


@struct.dataclass(kw_only=True)
class KVCache:
    """Per-layer keys and values for a batch of rows, plus each row's length."""

    k: jax.Array  # [L, B, S, K, H]
    v: jax.Array  # [L, B, S, K, H]
    lengths: jax.Array  # [B] int32, valid slots per row

    @classmethod
    def init(cls, cfg: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
        """An empty cache of ``max_len`` slots per row (all lengths 0)."""
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        dtype = jnp.dtype(dtype or cfg.dtype)
        shape = (cfg.n_layers, batch_size, max_len, cfg.n_kv_heads, cfg.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            lengths=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def positions(self, block_len: int) -> jax.Array:
        """Positions ``[B, T]`` a block of ``block_len`` tokens written now would occupy."""
        return self.lengths[:, None] + jnp.arange(block_len, dtype=jnp.int32)[None, :]

    def check_room(self, num_valid: jax.Array) -> None:
        """Raise if appending ``num_valid[b]`` tokens to row b would pass ``max_len``.

        Only possible when lengths and counts are concrete (outside ``jit``); traced callers bound
        lengths themselves.
        """
        if not (_is_concrete(self.lengths) and _is_concrete(num_valid)):
            return
        end = np.asarray(self.lengths) + np.asarray(num_valid)
        if (end > self.max_len).any():
            row = int(np.argmax(end > self.max_len))
            raise ValueError(
                f"cache is full: row {row} has length {int(self.lengths[row])} and the block adds "
                f"{int(np.asarray(num_valid)[row])} tokens, but max_len is {self.max_len}"
            )

    def write(self, layer: int, k: jax.Array, v: jax.Array) -> KVCache:
        """Store ``k, v: [B, T, K, H]`` for ``layer`` at each row's current length.

        Lengths do not move (all layers of one forward pass write at the same offsets); call
        ``advance`` once after the last layer.
        """
        B, T = k.shape[:2]
        slots = self.positions(T)  # [B, T]
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
        new_k = self.k.at[layer, rows, slots].set(k.astype(self.k.dtype), mode="drop")
        new_v = self.v.at[layer, rows, slots].set(v.astype(self.v.dtype), mode="drop")
        return self.replace(k=new_k, v=new_v)

    def advance(self, num_valid: jax.Array) -> KVCache:
        """Move each row's length forward by ``num_valid: [B]`` tokens."""
        return self.replace(lengths=self.lengths + num_valid.astype(jnp.int32))

    def take_rows(self, rows: jax.Array) -> KVCache:
        """The cache whose row ``i`` is a copy of this cache's row ``rows[i]`` (``rows: [B']`` int,
        in ``[0, B)``, repeats allowed). Beam search uses it to copy a prompt's row to each of its
        beams and, every step, to give each surviving beam its parent's keys, values and length."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(k=self.k[:, rows], v=self.v[:, rows], lengths=self.lengths[rows])

    def rewind(self, lengths) -> KVCache:
        """Set each row's length back to ``lengths`` (scalar or ``[B]``); later slots become stale.

        This is how speculative decoding drops rejected draft tokens and how a serving slot is freed:
        nothing is erased, the next write overwrites.
        """
        lengths = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), self.lengths.shape)
        if _is_concrete(lengths) and _is_concrete(self.lengths):
            new, old = np.asarray(lengths), np.asarray(self.lengths)
            if (new < 0).any() or (new > old).any():
                raise ValueError(
                    f"rewind lengths must be in [0, current length] per row, got {new.tolist()} "
                    f"for current lengths {old.tolist()}"
                )
        return self.replace(lengths=lengths)
