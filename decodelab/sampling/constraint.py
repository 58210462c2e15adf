"""Constraints as device arrays: the token-level automata of a batch's constraints (regex, JSON
schema) in one table that the compiled loops read, one state per row.

A table holds ``Q`` states over the model's ``V`` token ids:

- ``allowed[q]``: the tokens a row in state q may take next, bit-packed (bit ``t % 32`` of word
  ``t // 32``), ``[Q, ceil(V / 32)]`` uint32. End-of-sequence ids are allowed exactly in
  accepting states (the builder sets them), padded vocabulary ids never.
- the next state per (state, token), only read for allowed tokens, in one of two forms:
  - dense while it fits ``MAX_DENSE_BYTES``: ``next_state[q, t]``, ``[Q, V]`` int32 (the
    tokens a state does not allow hold 0); ``edge_keys`` and ``edge_targets`` are empty;
  - sparse past it: the transitions sorted by ``q * V + t`` in ``edge_keys [E]`` int32 with
    their states in ``edge_targets [E]`` (E padded to a power of two with ``INT32_MAX`` keys),
    found by binary search; ``next_state`` is then ``[0, V]``.
  Which form a table has is its shape, known at trace time: each form is its own program.
- ``accepting[q]``: whether the output so far is a complete match.

State 0 is free text: every token allowed, itself next, accepting. A row without a constraint
sits in it for good, so constrained and free rows share one program; the sparse form stores no
transition out of it (a missing key reads as state 0). ``Q`` is padded to a power of two
(``cache.buckets.bucket_length``) so that a new pattern of similar size reuses the compiled
program; padding states are unreachable and allow nothing. A table over ``MAX_TABLE_BYTES`` is
refused before it is built, naming its bytes.

Building a table from patterns (outlines-core, on the host) lives in ``sampling.automaton``;
this module is what the loops need: the table type, the mask of a row's state and the step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.cache.buckets import bucket_length
from decodelab.checks import format_bytes

FREE = 0  # the state of a row without a constraint
# The dense next states [Q, V] int32 are kept while they take at most this many bytes (256
# states of SmolLM2's 49,152 tokens: 48 MiB); larger tables hold their transitions sparse.
MAX_DENSE_BYTES = 64 * 2**20
# What one batch's table may take on the device, in either form.
MAX_TABLE_BYTES = 256 * 2**20
_NO_EDGE = np.iinfo(np.int32).max  # the key of a padding edge, after every real one


def table_bytes(num_states: int, vocab_size: int, num_edges: int) -> tuple[int, bool]:
    """The device bytes of a table of ``num_states`` states over ``vocab_size`` ids with
    ``num_edges`` transitions out of the states past the free one (both padded to powers of
    two), and whether its next states are dense; a ValueError naming the bytes past
    ``MAX_TABLE_BYTES`` or keys past int32."""
    Q, E = bucket_length(num_states, minimum=1), bucket_length(num_edges, minimum=1)
    masks = Q * -(-vocab_size // 32) * 4 + Q
    dense = Q * vocab_size * 4
    if dense <= MAX_DENSE_BYTES:
        return masks + dense, True
    if Q * vocab_size >= _NO_EDGE:
        raise ValueError(f"a sparse constraint table keys a transition by state x vocab_size + "
                         f"token as int32: {num_states} states ({Q} padded) x {vocab_size} ids "
                         f"do not fit; constrain a batch with fewer distinct or smaller patterns")
    nbytes = masks + E * 8
    if nbytes > MAX_TABLE_BYTES:
        raise ValueError(f"a constraint table of {num_states} states ({Q} padded) and "
                         f"{num_edges} transitions ({E} padded) over {vocab_size} ids takes "
                         f"{format_bytes(nbytes)}, more than the {format_bytes(MAX_TABLE_BYTES)} "
                         f"a batch's table may take; constrain a batch with fewer distinct or "
                         f"smaller patterns")
    return nbytes, False


@struct.dataclass
class ConstraintTable:
    allowed: jax.Array  # [Q, W] uint32, W = ceil(V / 32)
    next_state: jax.Array  # [Q, V] int32 dense, [0, V] sparse
    accepting: jax.Array  # [Q] bool
    edge_keys: jax.Array  # [E] int32, sorted: q * V + t; [0] dense
    edge_targets: jax.Array  # [E] int32; [0] dense

    @property
    def num_states(self) -> int:
        return self.accepting.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.next_state.shape[1]

    @property
    def nbytes(self) -> int:
        """The table's device bytes."""
        return self.allowed.nbytes + self.next_state.nbytes + self.accepting.nbytes

    @property
    def sparse(self) -> bool:
        return self.edge_keys.shape[0] > 0

    @property
    def nbytes(self) -> int:
        """The table's device bytes."""
        return sum(x.nbytes for x in (self.allowed, self.next_state, self.accepting,
                                      self.edge_keys, self.edge_targets))

    @classmethod
    def free(cls, vocab_size: int, min_states: int = 1) -> ConstraintTable:
        """A table with only the free state (padded to ``min_states``): no row constrained."""
        empty = np.zeros((0,), np.int32)
        return cls.from_edges(np.ones((1,), bool), vocab_size, empty, empty, empty,
                              min_states=min_states)

    @classmethod
    def from_dense(cls, allowed: np.ndarray, next_state: np.ndarray, accepting: np.ndarray, *,
                   min_states: int = 1) -> ConstraintTable:
        """A table from host arrays ``allowed [Q, V] bool``, ``next_state [Q, V] int``,
        ``accepting [Q] bool`` whose state 0 is the free state (``from_edges``)."""
        allowed = np.asarray(allowed, bool)
        next_state = np.asarray(next_state)
        if not (allowed[FREE].all() and accepting[FREE] and not next_state[FREE].any()):
            raise ValueError("state 0 of a constraint table must be the free state (every token "
                             "allowed, itself next, accepting)")
        source, token = np.nonzero(allowed[1:])
        return cls.from_edges(accepting, allowed.shape[1], source + 1, token,
                              next_state[source + 1, token], min_states=min_states)

    @classmethod
    def from_edges(cls, accepting: np.ndarray, vocab_size: int, source: np.ndarray,
                   token: np.ndarray, target: np.ndarray, *, min_states: int = 1
                   ) -> ConstraintTable:
        """A table of ``Q = len(accepting)`` states over ``vocab_size`` ids whose state 0 is the
        free state and whose other states allow exactly the transitions ``source [E] ->
        target [E]`` on ``token [E]`` (each state and token at most once); the states are
        padded to a power of two (at least ``min_states``) with states that allow nothing, the
        next states dense or sparse by ``table_bytes``."""
        Q, V = len(accepting), vocab_size
        source, token, target = (np.asarray(x, np.int64) for x in (source, token, target))
        if (source == FREE).any():
            raise ValueError("state 0 of a constraint table must be the free state: its "
                             "transitions are implied, got some listed")
        _, dense = table_bytes(max(Q, min_states), V, len(source))
        padded = bucket_length(max(Q, min_states), minimum=1)
        W = -(-V // 32)
        bits = np.zeros((padded, W * 32), bool)
        bits[FREE, :V] = True
        bits[source, token] = True
        # bit t % 32 of word t // 32: bytes little-endian, bits within a byte little-endian
        packed = np.packbits(bits, axis=-1, bitorder="little").view("<u4").astype(np.uint32)
        acc = np.zeros((padded,), bool)
        acc[:Q] = accepting
        if dense:
            nxt = np.zeros((padded, V), np.int32)
            nxt[source, token] = target
            keys = targets = np.zeros((0,), np.int32)
        else:
            nxt = np.zeros((0, V), np.int32)
            order = np.argsort(source * V + token)
            E = bucket_length(len(order), minimum=1)
            keys = np.full((E,), _NO_EDGE, np.int32)
            targets = np.zeros((E,), np.int32)
            keys[:len(order)] = (source * V + token)[order]
            targets[:len(order)] = target[order]
        return cls(allowed=jnp.asarray(packed), next_state=jnp.asarray(nxt),
                   accepting=jnp.asarray(acc), edge_keys=jnp.asarray(keys),
                   edge_targets=jnp.asarray(targets))

    def allowed_mask(self, states: jax.Array) -> jax.Array:
        """``[B, V]`` bool: the tokens each row may take in its state ``states [B]``."""
        words = self.allowed[states]  # [B, W]
        V = self.vocab_size
        ids = jnp.arange(V, dtype=jnp.uint32)
        return ((words[:, ids // 32] >> (ids % 32)[None, :]) & 1).astype(bool)

    def advance(self, states: jax.Array, tokens: jax.Array) -> jax.Array:
        """``[B]`` the state after each row takes ``tokens [B]`` in ``states [B]`` (a token the
        state does not allow gives 0)."""
        if not self.sparse:
            return self.next_state[states, tokens]
        keys = states * self.vocab_size + tokens  # [B]
        at = jnp.minimum(jnp.searchsorted(self.edge_keys, keys), self.edge_keys.shape[0] - 1)
        return jnp.where(self.edge_keys[at] == keys, self.edge_targets[at], FREE)

    def mask_logits(self, logits: jax.Array, states: jax.Array) -> jax.Array:
        """``logits [B, V]`` with the tokens a row's state forbids at -inf."""
        return jnp.where(self.allowed_mask(states), logits, -jnp.inf)
