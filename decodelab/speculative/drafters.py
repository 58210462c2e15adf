"""Drafters for speculative decoding: what proposes the tokens a target model then verifies.

A drafter proposes up to ``gamma`` tokens per row and, for each, the probability ``q`` it was
drawn with (``Proposal``); ``speculative`` verifies them against the target. Only when a sampled
row rejects a proposal does the rule need a whole distribution, the ``q`` row at that position:
the drafter gives it then (``rejected_logq``), so a round never holds a ``[B, gamma, V]`` block.
``ModelDrafter`` samples from a draft Transformer with the target's sampling parameters;
``NgramDrafter`` looks the continuation up in the row's own context (model-free, one-hot ``q``).

Randomness: each draw has its own stream (``state.stream_keys``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab import sampling
from decodelab.cache import init_cache
from decodelab.cache.dense import KVCache
from decodelab.checks import check_size
from decodelab.sampling import mirostat
from decodelab.speculative.state import DRAFT_STREAM, Proposal, SpecState, stream_keys

# --- Drafters -------------------------------------------------------------------------------------


class Drafter(abc.ABC):
    """Proposes up to ``gamma`` tokens per row, with the probability each was drawn with.

    A drafter is a hashable frozen dataclass (it is a static argument of the compiled loop); what
    it learns (weights) comes in as the traced ``weights`` pytree. When every running row is
    greedy (``sampling.all_greedy``, at run time) every proposal is an argmax (``logq`` 0).
    """

    @abc.abstractmethod
    def prefill(self, weights: Any, block: jax.Array, num_valid: jax.Array,
                max_len: int) -> KVCache | None:
        """The drafter's cache after the prompt block ``[B, T]`` (``num_valid[b]`` real tokens)."""

    @abc.abstractmethod
    def propose(self, weights: Any, state: SpecState) -> tuple[Proposal, KVCache | None]:
        """``state.gamma`` proposals per running row and the drafter's cache after them."""

    def rejected_logq(self, weights: Any, state: SpecState, proposal: Proposal,
                      cache: KVCache | None, n: jax.Array, rejected: jax.Array
                      ) -> tuple[jax.Array, KVCache | None]:
        """``[B, V]`` log q_n, the distribution proposal ``n[b]`` was drawn from, for the rows in
        ``rejected`` (``[B]`` bool; other rows' values are ignored), and the cache after it.
        Called only in a round with a sampled row, after the target rejected proposal ``n``. The default is a
        one-hot ``q`` at the proposal (a model-free drafter's)."""
        del weights
        V = state.eos_mask.shape[0]
        token = jnp.take_along_axis(proposal.tokens, jnp.minimum(n, proposal.tokens.shape[1] - 1)
                                    [:, None], axis=1)  # [B, 1]
        vocab = jnp.arange(V, dtype=jnp.int32)[None, :]  # [1, V]
        return jnp.where((vocab == token) & rejected[:, None], 0.0, -jnp.inf), cache

    def rewind(self, cache: KVCache | None, lengths: jax.Array) -> KVCache | None:
        return None if cache is None else cache.rewind(lengths)


@dataclasses.dataclass(frozen=True)
class ModelDrafter(Drafter):
    """A draft Transformer sampling autoregressively on its own cache with the target's
    sampling parameters (``speculative_generate`` builds it from a draft model).

    The ``q`` row of a rejected proposal is computed again when it is needed (one draft step of
    one token, from the cache the proposals left) rather than kept for every proposal: a round
    that rejects pays one more draft step instead of holding ``[B, gamma, V]`` float32."""

    graphdef: Any
    kv_cache: str | None = None  # the draft cache's kind (cache.init_cache)

    def prefill(self, weights, block, num_valid, max_len):
        model = nnx.merge(self.graphdef, weights)
        cache = init_cache(model.config, block.shape[0], max_len, self.kv_cache)
        _, cache = model(block, cache=cache, num_valid=num_valid, reach=block.shape[1])
        return cache

    def propose(self, weights, state):
        model = nnx.merge(self.graphdef, weights)
        B = state.tokens.shape[0]
        L, running = state.lengths, ~state.done
        rows = jnp.arange(B)
        logits, cache = self._catch_up(model, state)
        gamma = state.gamma

        def sample(j, carry):  # d_j and log q_j(d_j) from the logits for position L + j
            history = carry["history"]  # the carried one, with d_0 .. d_{j-1}
            # Under a constraint, masked by the state advanced along the draft so far.
            logits = state.constrained(carry["logits"], carry.get("constraint_states"))

            scored = sampling.score(logits, state.params, history)  # once for both paths

            def greedy():
                token, bad, none = sampling.greedy_choice(logits, state.params, history, scored)
                return token, jnp.zeros((B,), jnp.float32), ~bad & ~none

            def sampled():
                scores = sampling.process_scores(scored, state.params, history)
                token, normaliser = sampling.draw_with_total(  # [B], [B]
                    scores, stream_keys(state.keys, L + j, DRAFT_STREAM))
                logq = jnp.take_along_axis(scores, token[:, None], axis=1)[:, 0] - normaliser
                return token, logq, scored.usable(normaliser)

            token, logq, ok = jax.lax.cond(sampling.all_greedy(state.params, skip=state.done),
                                           greedy, sampled)
            if state.constraint is not None:
                carry = dict(carry, constraint_states=state.constraint.advance(
                    carry["constraint_states"], token))
            buffer = carry["buffer"].at[rows, L + j].set(token, mode="drop")
            mu = history.mirostat_mu  # the draft's own, moved by its draws
            history = history.replace(tokens=buffer).extended(
                token[:, None], jnp.ones((B,), jnp.int32), state.params
            ).replace(mirostat_mu=mirostat.advanced_mu(mu, logq, state.params, ok))
            return token, dict(carry, buffer=buffer, history=history,
                               tokens=carry["tokens"].at[:, j].set(token),
                               logq=carry["logq"].at[:, j].set(logq),
                               usable=carry["usable"].at[:, j].set(ok),
                               mu=carry["mu"].at[:, j].set(mu))

        def step(j, carry):  # sample d_j and feed it for the next logits
            token, carry = sample(j, carry)
            logits, cache = model(token[:, None], cache=carry["cache"],
                                  num_valid=running.astype(jnp.int32))
            return dict(carry, logits=logits[:, 0], cache=cache)

        # A loop rather than unrolled steps: the program (and its compile time) does not grow
        # with gamma. The last proposal is not fed (the next round's first block does that).
        carry = dict(logits=logits, cache=cache, buffer=state.tokens, history=state.history,
                     tokens=jnp.zeros((B, gamma), jnp.int32),
                     logq=jnp.zeros((B, gamma), jnp.float32), usable=jnp.zeros((B, gamma), bool),
                     mu=jnp.zeros((B, gamma), jnp.float32))
        if state.constraint is not None:
            carry["constraint_states"] = state.constraint_states
        carry = jax.lax.fori_loop(0, gamma - 1, step, carry)
        _, carry = sample(gamma - 1, carry)
        count = jnp.sum(jnp.cumprod(carry["usable"], axis=1), axis=1)
        return Proposal(tokens=carry["tokens"], logq=carry["logq"], count=count.astype(jnp.int32),
                        buffer=carry["buffer"], mirostat_mu=carry["mu"]), carry["cache"]

    @staticmethod
    def _catch_up(model, state) -> tuple[jax.Array, KVCache]:
        """Feed the one or two tokens the draft cache lacks, ending with the row's last token:
        ``[B, V]`` logits for position L and the cache (a block of one unless some row is two
        behind: a one-token pass is cheaper)."""
        S = state.tokens.shape[1]
        behind = jnp.where(~state.done, state.lengths - state.draft_cache.lengths, 0)  # {0, 1, 2}

        def catch_up(width):
            def run(cache):
                index = jnp.clip(cache.lengths[:, None] + jnp.arange(width, dtype=jnp.int32)[None],
                                 0, S - 1)
                logits, cache = model(jnp.take_along_axis(state.tokens, index, axis=1),
                                      cache=cache, num_valid=behind)  # [B, width, V]
                last = jnp.clip(behind - 1, 0, width - 1)[:, None, None]
                return jnp.take_along_axis(logits, last, axis=1)[:, 0], cache  # [B, V]
            return run

        return jax.lax.cond(jnp.any(behind == 2), catch_up(2), catch_up(1), state.draft_cache)

    def rejected_logq(self, weights, state, proposal, cache, n, rejected):
        # The proposals left the cache at L + gamma - 1; a rejected row goes back to L + n - 1
        # and feeds the token there again, which leaves it where the round's rewind wants it.
        model = nnx.merge(self.graphdef, weights)
        L = state.lengths
        before = jnp.take_along_axis(proposal.buffer, (L + n - 1)[:, None], axis=1)  # [B, 1]

        def recompute(cache):
            cache = cache.rewind(jnp.where(rejected, L + n - 1, cache.lengths))
            logits, cache = model(before, cache=cache, num_valid=rejected.astype(jnp.int32))
            if state.constraint is not None:  # masked as when d_n was drawn
                at_n = jnp.take_along_axis(proposal.constraint_states, n[:, None], axis=1)[:, 0]
                logits = state.constrained(logits, at_n)
            history = state.history_after(proposal.buffer, proposal.tokens, n).replace(
                mirostat_mu=jnp.take_along_axis(  # the draft's mu when it drew d_n
                    proposal.mirostat_mu, jnp.minimum(n, state.gamma - 1)[:, None], axis=1)[:, 0])
            return sampling.processed_logprobs(logits[:, 0], state.params, history), cache

        def nothing(cache):
            return jnp.full((L.shape[0], state.eos_mask.shape[0]), -jnp.inf), cache

        return jax.lax.cond(jnp.any(rejected), recompute, nothing, cache)


@dataclasses.dataclass(frozen=True)
class NgramDrafter(Drafter):
    """Prompt lookup (model-free): find the most recent earlier occurrence of the row's last n
    tokens in its own context (prompt and output), longest n first from ``max_ngram`` down to
    ``min_ngram``, and propose the ``gamma`` tokens that followed it (none without a match), as
    Hugging Face's prompt lookup and vLLM's n-gram proposer do; except that a continuation
    shorter than ``gamma`` (a match close to the end) is repeated: the tokens since the match are
    one period of a repeat, so a row caught in a loop gets ``gamma`` proposals. Each proposal's
    ``q`` is one-hot (``logq`` 0), and so is the ``q`` row of a rejected one."""

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

    def propose(self, weights, state):
        del weights
        tokens, L = state.tokens, state.lengths
        B, S = tokens.shape
        gamma = state.gamma
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
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, gamma))
        buffer = tokens.at[rows, L[:, None] + offsets].set(proposed, mode="drop")
        return Proposal(tokens=proposed, logq=jnp.zeros((B, gamma), jnp.float32),
                        count=count.astype(jnp.int32), buffer=buffer), None
