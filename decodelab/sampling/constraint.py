"""Constraints as device arrays: the token-level automata of a batch's constraints (regex, JSON
schema) in one table that the compiled loops read, one state per row.

A table holds ``Q`` states over the model's ``V`` token ids:

- ``allowed[q]``: the tokens a row in state q may take next, bit-packed (bit ``t % 32`` of word
  ``t // 32``), ``[Q, ceil(V / 32)]`` uint32. End-of-sequence ids are allowed exactly in
  accepting states (the builder sets them), padded vocabulary ids never.
- ``next_state[q, t]``: the state after taking token t in state q, ``[Q, V]`` int32 (only read
  for allowed tokens; the others hold 0).
- ``accepting[q]``: whether the output so far is a complete match.

State 0 is free text: every token allowed, itself next, accepting. A row without a constraint
sits in it for good, so constrained and free rows share one program. ``Q`` is padded to a
power of two (``cache.buckets.bucket_length``) so that a new pattern of similar size reuses the
compiled program; padding states are unreachable and allow nothing.

Building a table from patterns (outlines-core, on the host) lives in ``sampling.automaton``;
this module is what the loops need: the table type, the mask of a row's state and the step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.cache.buckets import bucket_length

FREE = 0  # the state of a row without a constraint


@struct.dataclass
class ConstraintTable:
    allowed: jax.Array  # [Q, W] uint32, W = ceil(V / 32)
    next_state: jax.Array  # [Q, V] int32
    accepting: jax.Array  # [Q] bool

    @property
    def num_states(self) -> int:
        return self.accepting.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.next_state.shape[1]

    @classmethod
    def free(cls, vocab_size: int, min_states: int = 1) -> ConstraintTable:
        """A table with only the free state (padded to ``min_states``): no row constrained."""
        return cls.from_dense(np.ones((1, vocab_size), bool), np.zeros((1, vocab_size), np.int32),
                              np.ones((1,), bool), min_states=min_states)

    @classmethod
    def from_dense(cls, allowed: np.ndarray, next_state: np.ndarray, accepting: np.ndarray, *,
                   min_states: int = 1) -> ConstraintTable:
        """A table from host arrays ``allowed [Q, V] bool``, ``next_state [Q, V] int``,
        ``accepting [Q] bool`` whose state 0 is the free state; the states are padded to a
        power of two (at least ``min_states``) with states that allow nothing."""
        allowed = np.asarray(allowed, bool)
        Q, V = allowed.shape
        if not (allowed[FREE].all() and accepting[FREE] and not np.asarray(next_state)[FREE].any()):
            raise ValueError("state 0 of a constraint table must be the free state (every token "
                             "allowed, itself next, accepting)")
        padded = bucket_length(max(Q, min_states), minimum=1)
        W = -(-V // 32)
        bits = np.zeros((padded, W * 32), bool)
        bits[:Q, :V] = allowed
        weights = (np.uint32(1) << np.arange(32, dtype=np.uint32))  # [32]
        packed = (bits.reshape(padded, W, 32).astype(np.uint32) * weights).sum(
            axis=-1, dtype=np.uint32)
        nxt = np.zeros((padded, V), np.int32)
        nxt[:Q] = np.where(allowed, next_state, 0)
        acc = np.zeros((padded,), bool)
        acc[:Q] = accepting
        return cls(allowed=jnp.asarray(packed), next_state=jnp.asarray(nxt),
                   accepting=jnp.asarray(acc))

    def allowed_mask(self, states: jax.Array) -> jax.Array:
        """``[B, V]`` bool: the tokens each row may take in its state ``states [B]``."""
        words = self.allowed[states]  # [B, W]
        V = self.vocab_size
        ids = jnp.arange(V, dtype=jnp.uint32)
        return ((words[:, ids // 32] >> (ids % 32)[None, :]) & 1).astype(bool)

    def advance(self, states: jax.Array, tokens: jax.Array) -> jax.Array:
        """``[B]`` the state after each row takes ``tokens [B]`` in ``states [B]``."""
        return self.next_state[states, tokens]

    def mask_logits(self, logits: jax.Array, states: jax.Array) -> jax.Array:
        """``logits [B, V]`` with the tokens a row's state forbids at -inf."""
        return jnp.where(self.allowed_mask(states), logits, -jnp.inf)
