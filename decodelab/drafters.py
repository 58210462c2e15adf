"""Drafters for speculative decoding: what proposes the tokens a target model then verifies.

A drafter proposes up to ``gamma`` tokens per row and the distributions ``q`` they were drawn
from (``Proposal``); ``speculative`` verifies them against the target. ``ModelDrafter`` samples
from a draft Transformer with the target's sampling parameters; ``NgramDrafter`` looks the
continuation up in the row's own context (model-free, one-hot ``q``).

Randomness: the draw for position ``pos`` of a request uses ``fold_in(fold_in(request key, pos),
stream)`` with one stream each for the draft sample, the acceptance test and the target's sample
(``stream_keys``), so the draws of a round never share a key.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from decodelab import kvquant, sampling
from decodelab.cache import KVCache
from decodelab.checks import check_size

if TYPE_CHECKING:
    from decodelab.speculative import SpecState

# Random streams: the key of a draw is fold_in(row key at the position, stream).
DRAFT_STREAM, ACCEPT_STREAM, TARGET_STREAM = 0, 1, 2


def stream_keys(keys: jax.Array, positions: jax.Array, stream: int) -> jax.Array:
    """``[B]`` keys for the draws of ``stream`` at ``positions: [B]`` of the requests whose key
    data is ``keys: [B, ...]``."""
    row = sampling.row_keys(keys, positions)
    return jax.vmap(lambda k: jax.random.fold_in(k, stream))(row)


def draw(logprobs: jax.Array, greedy: jax.Array, keys) -> jax.Array:
    """``[B]`` tokens from ``logprobs: [B, V]``; when every row is greedy (every distribution is
    one-hot) the argmax, without generating random numbers. ``keys()`` gives the ``[B]`` keys."""
    return jax.lax.cond(greedy, lambda: sampling.argmax(logprobs),
                        lambda: sampling.sample_tokens(logprobs, keys()))


def usable(logits: jax.Array, logprobs: jax.Array) -> jax.Array:
    """``[...]`` bool: finite logits that leave at least one allowed token."""
    return ~jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1) & jnp.any(
        logprobs > -jnp.inf, axis=-1)


@struct.dataclass(kw_only=True)
class Proposal:
    """What a drafter proposes for each row in one round."""

    tokens: jax.Array  # [B, gamma] int32, for positions L .. L+gamma-1
    logq: jax.Array  # [B, gamma, V] float32, the distribution each was drawn from
    count: jax.Array  # [B] int32 in [0, gamma]: only the first `count` are proposals
    buffer: jax.Array  # [B, S] int32, the state's tokens with the proposals at L .. L+gamma-1


# --- Drafters -------------------------------------------------------------------------------------


class Drafter(abc.ABC):
    """Proposes up to ``gamma`` tokens per row, with the distributions they were drawn from.

    A drafter is a hashable frozen dataclass (it is a static argument of the compiled loop); what
    it learns (weights) comes in as the traced ``weights`` pytree.
    """

    @abc.abstractmethod
    def prefill(self, weights: Any, block: jax.Array, num_valid: jax.Array,
                max_len: int) -> KVCache | None:
        """The drafter's cache after the prompt block ``[B, T]`` (``num_valid[b]`` real tokens)."""

    @abc.abstractmethod
    def propose(self, weights: Any, state: SpecState, greedy: jax.Array
                ) -> tuple[Proposal, KVCache | None]:
        """``state.gamma`` proposals per running row and the drafter's cache after them."""

    def rewind(self, cache: KVCache | None, lengths: jax.Array) -> KVCache | None:
        return None if cache is None else cache.rewind(lengths)


@dataclasses.dataclass(frozen=True)
class ModelDrafter(Drafter):
    """A draft Transformer sampling autoregressively on its own cache with the target's
    sampling parameters (``speculative_generate`` builds it from a draft model)."""

    graphdef: Any
    kv_cache: str | None = None  # the draft cache's kind (kvquant)

    def prefill(self, weights, block, num_valid, max_len):
        model = nnx.merge(self.graphdef, weights)
        cache = kvquant.init_cache(model.config, block.shape[0], max_len, self.kv_cache)
        _, cache = model(block, cache=cache, num_valid=num_valid)
        return cache

    def propose(self, weights, state, greedy):
        model = nnx.merge(self.graphdef, weights)
        B, S = state.tokens.shape
        L, running = state.lengths, ~state.done
        rows = jnp.arange(B)
        # Catch up: feed the one or two tokens the cache lacks, ending with the last token (a
        # block of one unless some row is two behind: a one-token pass is cheaper).
        behind = jnp.where(running, L - state.draft_cache.lengths, 0)  # [B] in {0, 1, 2}

        def catch_up(width):
            def run(cache):
                index = jnp.clip(cache.lengths[:, None] + jnp.arange(width, dtype=jnp.int32)[None],
                                 0, S - 1)
                logits, cache = model(jnp.take_along_axis(state.tokens, index, axis=1),
                                      cache=cache, num_valid=behind)  # [B, width, V]
                last = jnp.clip(behind - 1, 0, width - 1)[:, None, None]
                return jnp.take_along_axis(logits, last, axis=1)[:, 0], cache  # [B, V]
            return run

        logits, cache = jax.lax.cond(jnp.any(behind == 2), catch_up(2), catch_up(1),
                                     state.draft_cache)
        gamma, V = state.gamma, logits.shape[-1]

        def sample(j, carry):
            logits, buffer = carry["logits"], carry["buffer"]
            logq = sampling.processed_logprobs(logits, state.params,
                                               state.history(buffer, L + j))  # [B, V]
            token = draw(logq, greedy, lambda: stream_keys(state.keys, L + j, DRAFT_STREAM))
            return token, dict(carry, buffer=buffer.at[rows, L + j].set(token, mode="drop"),
                               tokens=carry["tokens"].at[:, j].set(token),
                               logq=carry["logq"].at[:, j].set(logq),
                               usable=carry["usable"].at[:, j].set(usable(logits, logq)))

        def step(j, carry):  # sample d_j and feed it for the next logits
            token, carry = sample(j, carry)
            logits, cache = model(token[:, None], cache=carry["cache"],
                                  num_valid=running.astype(jnp.int32))
            return dict(carry, logits=logits[:, 0], cache=cache)

        # A loop rather than unrolled steps: the program (and its compile time) does not grow
        # with gamma. The last proposal is not fed (the next round's first block does that).
        carry = dict(logits=logits, cache=cache, buffer=state.tokens,
                     tokens=jnp.zeros((B, gamma), jnp.int32),
                     logq=jnp.zeros((B, gamma, V), jnp.float32), usable=jnp.zeros((B, gamma), bool))
        carry = jax.lax.fori_loop(0, gamma - 1, step, carry)
        _, carry = sample(gamma - 1, carry)
        count = jnp.sum(jnp.cumprod(carry["usable"], axis=1), axis=1)
        return Proposal(tokens=carry["tokens"], logq=carry["logq"], count=count.astype(jnp.int32),
                        buffer=carry["buffer"]), carry["cache"]


@dataclasses.dataclass(frozen=True)
class NgramDrafter(Drafter):
    """Prompt lookup (model-free): find the most recent earlier occurrence of the row's last n
    tokens in its own context (prompt and output), longest n first from ``max_ngram`` down to
    ``min_ngram``, and propose the ``gamma`` tokens that followed it (none without a match), as
    Hugging Face's prompt lookup and vLLM's n-gram proposer do; except that a continuation
    shorter than ``gamma`` (a match close to the end) is repeated: the tokens since the match are
    one period of a repeat, so a row caught in a loop gets ``gamma`` proposals. Each proposal's
    ``q`` is one-hot."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        for name in ("min_ngram", "max_ngram"):
            value = getattr(self, name)
            check_size(name, value, 1)
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram must be <= max_ngram={self.max_ngram}, "
                             f"got {self.min_ngram}")

    def prefill(self, weights, block, num_valid, max_len):
        return None

    def propose(self, weights, state, greedy):
        del weights, greedy
        tokens, L = state.tokens, state.lengths
        B, S = tokens.shape
        V, gamma = state.eos_mask.shape[0], state.gamma
        slot = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]: where an earlier n-gram ends
        found, end = jnp.zeros((B,), bool), jnp.zeros((B,), jnp.int32)
        # An n-gram and an earlier match need n + 1 slots: longer n cannot match in S slots.
        for n in range(min(self.max_ngram, S - 1), self.min_ngram - 1, -1):
            match = (slot >= n - 1) & (slot < L[:, None] - 1)  # [B, S]
            for k in range(n):  # the k-th token before slot j equals the k-th before the end
                before = jnp.take_along_axis(tokens, jnp.broadcast_to(jnp.maximum(slot - k, 0),
                                                                      (B, S)), axis=1)
                last = jnp.take_along_axis(tokens, jnp.maximum(L - 1 - k, 0)[:, None], axis=1)
                match = match & (before == last)
            latest = jnp.max(jnp.where(match, slot, -1), axis=1)  # [B]
            use = ~found & (latest >= 0)
            end, found = jnp.where(use, latest, end), found | use
        # The continuation end+1 .. L-1 is one period of a repeat; past L-1 it repeats again.
        period = jnp.maximum(L - 1 - end, 1)[:, None]  # [B, 1]
        offsets = jnp.arange(gamma, dtype=jnp.int32)[None, :]  # [1, gamma]
        proposed = jnp.take_along_axis(
            tokens, jnp.clip(end[:, None] + 1 + offsets % period, 0, S - 1), axis=1)  # [B, gamma]
        count = jnp.where(found & ~state.done, gamma, 0)
        logq = jnp.where(jax.nn.one_hot(proposed, V, dtype=bool), 0.0, -jnp.inf)  # [B, gamma, V]
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, gamma))
        buffer = tokens.at[rows, L[:, None] + offsets].set(proposed, mode="drop")
        return Proposal(tokens=proposed, logq=logq, count=count.astype(jnp.int32),
                        buffer=buffer), None
