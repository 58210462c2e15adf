"""What the speculative loop carries and what a drafter hands the verifier: ``SpecState``,
``Proposal`` and the random streams of a round.

Randomness: the draw for position ``pos`` of a request uses ``fold_in(fold_in(request key, pos),
stream)`` with one stream each for the draft sample, the acceptance test and the target's sample
(``stream_keys``), so the draws of a round never share a key.
"""

from __future__ import annotations

import jax
from flax import struct

from decodelab import sampling
from decodelab.cache.dense import KVCache
from decodelab.decode.state import RowState

# Random streams: the key of a draw is fold_in(row key at the position, stream).
DRAFT_STREAM, ACCEPT_STREAM, TARGET_STREAM = 0, 1, 2


def stream_keys(keys: jax.Array, positions: jax.Array, stream: int) -> jax.Array:
    """``[B]`` keys for the draws of ``stream`` at ``positions: [B]`` of the requests whose key
    data is ``keys: [B, ...]``."""
    row = sampling.row_keys(keys, positions)
    return jax.vmap(lambda k: jax.random.fold_in(k, stream))(row)


@struct.dataclass(kw_only=True)
class Proposal:
    """What a drafter proposes for each row in one round: the tokens and the probability of each
    under the distribution it was drawn from, nothing vocabulary-wide."""

    tokens: jax.Array  # [B, gamma] int32, for positions L .. L+gamma-1
    logq: jax.Array  # [B, gamma] float32, log q_j(tokens[:, j]); 0 for a one-hot draw
    count: jax.Array  # [B] int32 in [0, gamma]: only the first `count` are proposals
    buffer: jax.Array  # [B, S] int32, the state's tokens with the proposals at L .. L+gamma-1
    # [B, gamma + 1] int32: the constraint state before each proposal and after the last (the
    # round fills it in; None when no row is constrained)
    constraint_states: jax.Array | None = None
    # [B, gamma] float32: the drafter's Mirostat mu before each proposal, moved along its own
    # draws (a model drafter's; None for one-hot proposals, whose q reads no mu)
    mirostat_mu: jax.Array | None = None


@struct.dataclass(kw_only=True)
class SpecState(RowState):
    """Everything the speculative loop carries: ``decode.RowState``'s fields (its step counts
    rounds, its output fields are ``generate``'s, under the target's distribution), both caches
    and the acceptance counts."""

    target_cache: KVCache  # lengths = self.lengths - 1 for running rows
    draft_cache: KVCache | None  # lengths >= self.lengths - 2; None for a model-free drafter
    rounds: jax.Array  # [B] int32, target calls (verify passes) each row took part in
    tested: jax.Array  # [B, gamma] int32, proposals at each draft position that were tested
    accepted: jax.Array  # [B, gamma] int32, and accepted
    per_round: jax.Array  # [B, N] int32, accepted proposals in each of the row's rounds, -1 after

    @property
    def gamma(self) -> int:
        return self.tested.shape[1]
