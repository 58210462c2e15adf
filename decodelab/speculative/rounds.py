"""One round of speculative decoding over a ``state.SpecState`` (``speculative`` module
docstring: the layout, the rule and the randomness). A round reads top to bottom: the drafter
proposes, the target verifies every proposal in one pass (``verify``), judges them, the row keeps
what its budget, an EOS or a stop sequence let it, and one pass records the kept tokens and
rewinds both caches (``speculative_round``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from decodelab import sampling
from decodelab.cache.dense import KVCache
from decodelab.decode.request import (BAD_LOGITS, EOS, INCOMPLETE, LENGTH, NO_ALLOWED_TOKEN,
                                      RUNNING, STOP)
from decodelab.sampling.processors import RowParams
from decodelab.speculative.drafters import Drafter
from decodelab.speculative.state import (ACCEPT_STREAM, TARGET_STREAM, Proposal, SpecState,
                                         stream_keys)

__all__ = ["speculative_round", "verify"]


def _accepts(u: jax.Array, p: jax.Array, q: jax.Array) -> jax.Array:
    """The rejection rule: accept a proposal x with ``p = p(x)``, ``q = q(x) > 0`` iff
    ``u * q < p`` for ``u ~ U[0, 1)``, i.e. with probability ``min(1, p / q)``. (A greedy round
    needs no test: one-hot distributions accept x iff it is the target's argmax.)"""
    return u * q < p


# --- One round ------------------------------------------------------------------------------------
#
# A round reads top to bottom: the drafter proposes (``Drafter.propose``), the target verifies the
# proposals in one pass (``verify``), judges them (``_judge_greedy`` or ``_judge_sampled``: how
# many it accepts and its own next token), the row keeps what the budget, an EOS or a stop
# sequence let it (``_keep``), and one pass records the kept tokens and rewinds both caches
# (``_commit``). When every running row is greedy (checked at run time, in the same program) a
# round compares argmaxes and forms no distribution.


@struct.dataclass(kw_only=True)
class Verdict:
    """The target's judgement of one round's proposals, per row."""

    n: jax.Array  # [B] int32, proposals accepted (the first n)
    next_token: jax.Array  # [B] int32, the token at position L + n (residual or bonus draw)
    usable: jax.Array  # [B, gamma + 1] bool, the target's distribution there can be sampled
    bad_logits: jax.Array  # [B, gamma + 1] bool, NaN / +inf logits there
    logp: jax.Array  # [B, gamma + 1] float32, log p of the token kept there (d_j; y at n)
    rows: jax.Array | None  # [B, gamma + 1, V] float32 log p, only for top logprobs or entropy


@struct.dataclass(kw_only=True)
class Kept:
    """What a row keeps of a round: ``count`` tokens of ``new``, and why it stops, if it does."""

    count: jax.Array  # [B] int32 in [0, gamma + 1]; 0 for a row that had stopped
    new: jax.Array  # [B, gamma + 1] int32: d_0 .. d_{n-1}, y, then y again (unkept)
    tokens: jax.Array  # [B, S] int32, the proposals' buffer with y at L + n
    finish: jax.Array  # [B] int32, RUNNING or a finish code
    constraint_states: jax.Array | None = None  # [B] int32, after the kept tokens


def verify(target: nnx.Module, state: SpecState, proposal: Proposal
           ) -> tuple[jax.Array, KVCache]:
    """One target pass over ``[t_{L-1}, d_0, .., d_{gamma-1}]`` of each running row: ``[B, gamma
    + 1, V]`` logits for positions ``L .. L+gamma`` and the cache with all of them written."""
    last = jnp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    block = jnp.concatenate([last, proposal.tokens], axis=1)  # [B, gamma + 1]
    return target(block, cache=state.target_cache,
                  num_valid=jnp.where(state.done, 0, state.gamma + 1))


def _per_position(state: SpecState, proposal: Proposal, T: int
                  ) -> tuple[RowParams, sampling.History]:
    """Sampling parameters and histories for the ``B * T`` positions ``L .. L+T-1`` (row-major),
    each with the history up to its position: the carried one and the proposals before it
    (``History.along``)."""
    block = jnp.pad(proposal.tokens, ((0, 0), (0, T - proposal.tokens.shape[1])))  # [B, T]
    history = state.history.replace(tokens=proposal.buffer).along(block)
    return jax.tree.map(lambda a: jnp.repeat(a, T, axis=0), state.params), history


def _count_accepted(ok: jax.Array) -> jax.Array:
    """``[B, gamma]`` accepted flags -> ``[B]`` accepted proposals: those before the first
    rejection."""
    return jnp.sum(jnp.cumprod(ok, axis=1), axis=1)


def _at(values: jax.Array, n: jax.Array) -> jax.Array:
    """``values[b, n[b]]``: ``[B, T, ...]`` -> ``[B, ...]``."""
    index = n.reshape((-1,) + (1,) * (values.ndim - 1))
    return jnp.take_along_axis(values, index, axis=1)[:, 0]


def _wants_rows(state: SpecState) -> bool:
    return bool(state.top_logprobs.shape[-1] or state.entropy.shape[-1])


def _judge_greedy(state: SpecState, proposal: Proposal, logits: jax.Array,
                  scored: sampling.Scored) -> Verdict:
    """Every row greedy: a proposal is accepted iff it is the target's argmax there (under the
    processors before temperature, ``scored``), and the next token is the argmax after the last
    accepted one. No softmax: every distribution is one token with log-probability 0."""
    B, T, V = logits.shape
    choice, bad_logits, no_token = (x.reshape(B, T) for x in scored.greedy())
    usable = ~bad_logits & ~no_token
    proposed = jnp.arange(T - 1)[None, :] < proposal.count[:, None]  # [B, gamma]
    n = _count_accepted(proposed & usable[:, :-1] & (proposal.tokens == choice[:, :-1]))
    y = _at(choice, n)
    rows = None
    if _wants_rows(state):
        kept = jnp.where(jnp.arange(T)[None, :] < n[:, None], choice, y[:, None])  # [B, T]
        rows = jnp.where(jnp.arange(V)[None, None, :] == kept[..., None], 0.0, -jnp.inf)
    return Verdict(n=n, next_token=y, usable=usable, bad_logits=bad_logits,
                   logp=jnp.zeros((B, T), jnp.float32), rows=rows)


def _judge_sampled(drafter: Drafter, draft_weights: Any, draft_cache: KVCache | None,
                   state: SpecState, proposal: Proposal, logits: jax.Array,
                   scored: sampling.Scored, positions: tuple[Any, Any]
                   ) -> tuple[Verdict, KVCache | None]:
    """The rejection rule: accept ``d_j`` iff ``u_j q_j(d_j) < p_j(d_j)`` while every earlier one
    was; then draw the next token from ``normalise(max(0, p_n - q_n))`` (``p_n`` where no
    proposal was rejected), asking the drafter for the ``q`` row of the rejected proposal.
    ``scored``: the logits through the processors before temperature; ``positions``: the
    parameters and histories of the ``B * T`` positions (``_per_position``)."""
    B, T, V = logits.shape
    gamma, L = T - 1, state.lengths
    scores = sampling.process_scores(scored, *positions).reshape(B, T, V)
    normaliser = jax.nn.logsumexp(scores, axis=-1)  # [B, T]
    bad_logits = scored.bad().reshape(B, T)  # the model's own logits hold NaN or +inf
    usable = scored.usable(normaliser.reshape(B * T)).reshape(B, T)
    # Each position's proposal (the bonus position's is a stand-in), gathered from all T rows.
    block = jnp.pad(proposal.tokens, ((0, 0), (0, 1)))  # [B, T]
    logp_block = jnp.take_along_axis(scores, block[..., None], axis=-1)[..., 0] - normaliser
    logp_proposed = logp_block[:, :gamma]  # [B, gamma]

    positions = L[:, None] + jnp.arange(gamma, dtype=jnp.int32)[None, :]  # [B, gamma]
    keys = stream_keys(jnp.repeat(state.keys, gamma, axis=0), positions.reshape(-1), ACCEPT_STREAM)
    u = jax.vmap(jax.random.uniform)(keys).reshape(B, gamma)
    proposed = jnp.arange(gamma)[None, :] < proposal.count[:, None]
    n = _count_accepted(proposed & usable[:, :gamma]
                        & _accepts(u, jnp.exp(logp_proposed), jnp.exp(proposal.logq)))

    log_p_n = _at(scores, n) - _at(normaliser, n)[:, None]  # [B, V]
    rejected = ~state.done & (n < proposal.count)
    logq_n, draft_cache = drafter.rejected_logq(draft_weights, state, proposal, draft_cache, n,
                                                rejected)
    residual = jnp.maximum(jnp.exp(log_p_n) - jnp.where(rejected[:, None], jnp.exp(logq_n), 0.0),
                           0.0)
    total = jnp.sum(residual, axis=-1, keepdims=True)
    # total = 0 only if p_n = q_n up to rounding, where a rejection has probability ~0.
    log_residual = jnp.where(total > 0, jnp.log(residual) - jnp.log(total), log_p_n)
    y = sampling.draw(log_residual, stream_keys(state.keys, L + n, TARGET_STREAM))

    at_y = jnp.take_along_axis(log_p_n, y[:, None], axis=1)  # [B, 1]
    logp = jnp.where(jnp.arange(T)[None, :] < n[:, None], logp_block, at_y)  # [B, T]
    rows = scores - normaliser[..., None] if _wants_rows(state) else None
    return Verdict(n=n, next_token=y, usable=usable, bad_logits=bad_logits, logp=logp,
                   rows=rows), draft_cache


def _keep(state: SpecState, proposal: Proposal, verdict: Verdict) -> Kept:
    """What each row keeps: ``d_0 .. d_{n-1}, y``, fewer at the budget or the cache's end, up to
    an EOS or the end of a stop sequence; nothing past a target distribution that cannot be
    sampled (the row stops with an error code)."""
    B, S = state.tokens.shape
    T = state.gamma + 1
    L, P, n, y = state.lengths, state.prompt_lengths, verdict.n, verdict.next_token
    running = ~state.done
    room = jnp.minimum(state.budgets - (L - P), S - L)  # [B]
    failed = ~_at(verdict.usable, n) & (n < room)
    count = jnp.minimum(jnp.where(failed, n, n + 1), room)
    k = jnp.arange(T, dtype=jnp.int32)[None, :]  # [1, T]
    new = jnp.where(k < n[:, None], jnp.pad(proposal.tokens, ((0, 0), (0, 1))), y[:, None])
    tokens = proposal.buffer.at[jnp.arange(B), jnp.where(failed, S, L + n)].set(y, mode="drop")
    stops = state.ends_with_stop(tokens, L[:, None] + 1 + k)  # [B, T]: up to L + i, i < T
    ends = (state.eos_mask[new] | stops) & (k < count[:, None])
    has_end, first_end = jnp.any(ends, axis=1), jnp.argmax(ends, axis=1)
    count = jnp.where(running, jnp.where(has_end, first_end + 1, count), 0)
    failed = failed & ~has_end
    lengths = L + count
    after = {}
    if state.constraint is not None:  # the state before token `count`: a proposal's, or after y
        path = proposal.constraint_states
        after = dict(constraint_states=jnp.where(
            count > n, state.constraint.advance(_at(path, n), y), _at(path, count)))
    code = jnp.select(
        [failed & _at(verdict.bad_logits, n), failed, has_end & state.eos_mask[_at(new, first_end)],
         has_end, (lengths - P >= state.budgets) | (lengths >= S)],
        [BAD_LOGITS, NO_ALLOWED_TOKEN, EOS, STOP,
         jnp.where(state.replace(**after).incomplete(), INCOMPLETE, LENGTH)],
        RUNNING,
    )
    return Kept(count=count, new=new, tokens=tokens, finish=jnp.where(running, code, state.finish),
                **after)


def _commit(state: SpecState, drafter: Drafter, proposal: Proposal, verdict: Verdict, kept: Kept,
            target_cache: KVCache, draft_cache: KVCache | None) -> SpecState:
    """Record the kept tokens (logprob, top logprobs, entropy under the target's ``p``) and the
    round's statistics, and rewind both caches to them: the target keeps every kept token but the
    last; the draft what it has of those."""
    B = state.tokens.shape[0]
    N, gamma = state.max_new_tokens, state.gamma
    L, n, running = state.lengths, verdict.n, ~state.done
    lengths = L + kept.count
    k = jnp.arange(gamma + 1, dtype=jnp.int32)[None, :]  # [1, gamma + 1]
    out = jnp.where(k < kept.count[:, None], (L - state.prompt_lengths)[:, None] + k, N)
    at = (jnp.broadcast_to(jnp.arange(B)[:, None], out.shape), out)  # [B, gamma + 1] each
    record = state.recorded(at, verdict.logp, lambda: verdict.rows)

    j = k[:, :gamma]
    tested = ((j < proposal.count[:, None]) & (j <= n[:, None]) & verdict.usable[:, :gamma]
              & running[:, None])
    accepted = (j < n[:, None]) & running[:, None]
    per_round = state.per_round.at[jnp.arange(B), jnp.where(running, state.rounds, N)].set(
        n, mode="drop")

    target_cache = target_cache.rewind(jnp.where(running, lengths - 1, state.target_cache.lengths))
    if draft_cache is not None:
        draft_cache = drafter.rewind(draft_cache, jnp.where(
            running, jnp.minimum(lengths - 1, L + gamma - 1), state.draft_cache.lengths))
    if kept.constraint_states is not None:
        record.update(constraint_states=kept.constraint_states)
    record.update(state.history_after(kept.tokens, kept.new, kept.count).carried_fields)
    record.update(state.moved(verdict.logp, kept.count))  # mu rewinds with the rejection
    return state.replace(
        step=state.step + 1, tokens=kept.tokens, lengths=lengths, finish=kept.finish,
        target_cache=target_cache, draft_cache=draft_cache,
        rounds=state.rounds + running.astype(jnp.int32),
        tested=state.tested + tested.astype(jnp.int32),
        accepted=state.accepted + accepted.astype(jnp.int32), per_round=per_round, **record)


def _under_constraint(state: SpecState, proposal: Proposal) -> Proposal:
    """The proposal cut before its first token the row's constraint forbids (a model drafter
    proposes under the constraint already; a model-free one may not), with the constraint state
    at each position ``L .. L+gamma``: the target's distributions there are masked with them,
    and the row's state after the round is read from them, so it rewinds with the cache."""
    if state.constraint is None:
        return proposal
    states, allowed = state.states_along(proposal.tokens)
    count = jnp.minimum(proposal.count, jnp.sum(jnp.cumprod(allowed, axis=1), axis=1))
    return proposal.replace(count=count.astype(jnp.int32), constraint_states=states)


def speculative_round(target: nnx.Module, drafter: Drafter, draft_weights: Any,
                      state: SpecState) -> SpecState:
    """One round of the loop: draft, verify in one target pass, judge, keep; record and rewind.
    (Public, with ``verify`` and ``Drafter.propose``, so a study can time each part alone.)"""
    proposal, draft_cache = drafter.propose(draft_weights, state)
    proposal = _under_constraint(state, proposal)
    raw, target_cache = verify(target, state, proposal)
    logits = state.constrained(raw, proposal.constraint_states)
    B, T, V = logits.shape
    # The processors before temperature once, for both judges.
    positions = _per_position(state, proposal, T)
    scored = sampling.score(logits.reshape(B * T, V), *positions)
    verdict, draft_cache = jax.lax.cond(
        sampling.all_greedy(state.params, skip=state.done),
        lambda cache: (_judge_greedy(state, proposal, logits, scored), cache),
        lambda cache: _judge_sampled(drafter, draft_weights, cache, state, proposal, logits,
                                     scored, positions),
        draft_cache)
    if state.constraint is not None:  # a NaN the mask hid is still the model's failure
        bad = sampling.bad_logits(raw)
        verdict = verdict.replace(bad_logits=verdict.bad_logits | bad, usable=verdict.usable & ~bad)
    kept = _keep(state, proposal, verdict)
    return _commit(state, drafter, proposal, verdict, kept, target_cache, draft_cache)
