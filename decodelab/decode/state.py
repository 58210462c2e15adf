"""The state every decode loop carries, written once.

``LoopState`` is what ``generate``'s, ``speculative_generate``'s and ``beam_search``'s loops (and
the serving engine's) have in common: the step count, each row's output budget, the EOS mask, and
the loop condition "some row runs and the step budget is not spent". ``RowState`` adds what the
two sampling loops carry per row: the token buffer (prompt then output, ``tokens[b, j]`` is
position j), the lengths, the finish codes, the request values (``request.RowInputs``) and the
output buffers (``request.OutputSpec``). ``decode.DecodeState`` and ``speculative.SpecState`` add
their caches and their own fields; ``BeamState`` adds the beams and the pool.

What both sampling loops do with those fields is here too: where a row's output ends with a stop
sequence (``ends_with_stop``) and how a kept token is recorded (its log-probability, and the top
log-probabilities and entropy of its distribution when requested: ``recorded``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from decodelab import sampling
from decodelab.decode.request import LENGTH, RUNNING, OutputSpec, RowInputs
from decodelab.sampling import mirostat
from decodelab.sampling.constraint import ConstraintTable
from decodelab.sampling.processors import RowParams


@struct.dataclass(kw_only=True)
class LoopState:
    """What every decode loop carries. A subclass has ``done: [B] bool`` (a field or a property)
    and ``max_new_tokens``, the step budget."""

    step: jax.Array  # [] int32, rounds so far
    budgets: jax.Array  # [B] int32, output tokens a row may generate (<= max_new_tokens)
    eos_mask: jax.Array  # [V] bool

    def running(self) -> jax.Array:
        """``[]`` bool: some row runs and the step budget is not spent."""
        return jnp.any(~self.done) & (self.step < self.max_new_tokens)


@struct.dataclass(kw_only=True)
class RowState(LoopState):
    """The per-row sequences and outputs of a sampling loop (``generate``'s, speculative
    decoding's, the serving engine's)."""

    tokens: jax.Array  # [B, S] int32, prompt then output; slot j = position j
    prompt_lengths: jax.Array  # [B] int32
    lengths: jax.Array  # [B] int32, prompt + output tokens so far
    finish: jax.Array  # [B] int32, RUNNING or a finish code
    keys: jax.Array  # [B, ...] uint32, each request's key data (request.request_keys)
    params: RowParams  # [B] per field
    stop_ids: jax.Array  # [M, W] or per row [B, M, W] int32, each sequence right-aligned, -1 before
    logprobs: jax.Array  # [B, N] float32, of each output token under its sampling distribution
    top_logprobs: jax.Array  # [B, N, n] float32 (n = 0 unless requested)
    top_ids: jax.Array  # [B, N, n] int32
    entropy: jax.Array  # [B, N] float32 in nats, or [B, 0] unless requested
    # Structured output: the batch's automata and each row's state (``sampling.constraint``);
    # None when no row is constrained, and then no step reads or advances a table.
    constraint: ConstraintTable | None = None
    constraint_states: jax.Array | None = None  # [B] int32, FREE for a free row
    # What the history processors read (``sampling.CARRIED``), counted once (``counted``) and
    # updated by each kept token, never recounted from ``tokens``.
    output_counts: jax.Array | None = None  # [B, V] int32, occurrences in the output
    seen: jax.Array | None = None  # [B, V] bool, occurs in the prompt or the output
    ngram_suffixes: jax.Array | None = None  # [B, S] int32 (``sampling.History.suffixes``)
    dry_suffixes: jax.Array | None = None  # [B, S] int32, the same for DRY
    # [B] float32, each row's Mirostat target surprise (``sampling.mirostat``): 2 tau at the
    # row's start (``counted``), moved by each kept token's recorded log-probability (``moved``).
    mirostat_mu: jax.Array | None = None

    @classmethod
    def start(cls, block: jax.Array, rows: RowInputs, max_len: int, outputs: OutputSpec,
              **own: Any) -> RowState:
        """The state before the first step: the prompt block ``[B, T]`` left-aligned in
        ``max_len`` slots, every row running with the whole budget, empty output buffers, and
        the subclass's ``own`` fields. A row with a budget of 0 (a padding row) is born done
        (finish ``LENGTH``): never sampled, never advanced."""
        B, T = block.shape
        budgets = (jnp.full((B,), outputs.max_new_tokens, jnp.int32) if rows.budgets is None
                   else jnp.asarray(rows.budgets, jnp.int32))
        return cls(
            step=jnp.zeros((), jnp.int32),
            budgets=budgets,
            eos_mask=rows.eos_mask,
            tokens=jnp.pad(block, ((0, 0), (0, max_len - T))),
            prompt_lengths=rows.prompt_lengths,
            lengths=rows.prompt_lengths,
            finish=jnp.where(budgets > 0, RUNNING, LENGTH).astype(jnp.int32),
            keys=rows.keys,
            params=rows.params,
            stop_ids=rows.stop_ids,
            constraint=rows.constraint,
            constraint_states=rows.constraint_states,
            **outputs.buffers(B),
            **own,
        )

    @property
    def done(self) -> jax.Array:  # [B] bool
        return self.finish != RUNNING

    @property
    def num_generated(self) -> jax.Array:  # [B] int32
        return self.lengths - self.prompt_lengths

    @property
    def max_new_tokens(self) -> int:
        return self.logprobs.shape[1]

    def constrained(self, logits: jax.Array, states: jax.Array | None = None) -> jax.Array:
        """``logits [B, ..., V]`` with the tokens each row's constraint state forbids at -inf
        (``states``: ``[B, ...]``, by default the rows' own): the first thing done to the
        model's logits, before every processor. The logits unchanged when no row is
        constrained."""
        if self.constraint is None:
            return logits
        states = self.constraint_states if states is None else states
        V = logits.shape[-1]
        masked = self.constraint.mask_logits(logits.reshape(-1, V), states.reshape(-1))
        return masked.reshape(logits.shape)

    def advanced(self, tokens: jax.Array, kept: jax.Array) -> dict[str, jax.Array]:
        """The field update that moves each row's constraint state along ``tokens [B]`` where
        ``kept [B]`` (empty when no row is constrained)."""
        if self.constraint is None:
            return {}
        moved = self.constraint.advance(self.constraint_states, tokens)
        return dict(constraint_states=jnp.where(kept, moved, self.constraint_states))

    def states_along(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(states [B, T + 1], allowed [B, T])`` for candidate tokens ``[B, T]`` that follow
        each row's output: the constraint state before each token and after the last, and
        whether each token is allowed where it stands (past a forbidden one the states mean
        nothing). Only for a constrained batch."""
        table = self.constraint

        def step(states, token):  # [B], [B]
            words = table.allowed[states, token // 32]
            ok = ((words >> (token % 32).astype(jnp.uint32)) & 1).astype(bool)
            after = table.advance(states, token)
            return after, (after, ok)

        _, (after, allowed) = jax.lax.scan(step, self.constraint_states, tokens.T)
        return jnp.concatenate([self.constraint_states[:, None], after.T], axis=1), allowed.T

    def incomplete(self, states: jax.Array | None = None) -> jax.Array:
        """``[B]`` bool: the row's constraint state (by default its own) is not accepting, so
        its output so far does not match its pattern (a constant False when none is
        constrained)."""
        if self.constraint is None:
            return jnp.zeros((), bool)
        states = self.constraint_states if states is None else states
        return ~self.constraint.accepting[states]

    @property
    def history(self) -> sampling.History:
        """The rows' history, with the fields the state carries."""
        return sampling.History(tokens=self.tokens, prompt_lengths=self.prompt_lengths,
                                lengths=self.lengths, eos_mask=self.eos_mask,
                                output_counts=self.output_counts, seen=self.seen,
                                ngram_suffixes=self.ngram_suffixes,
                                dry_suffixes=self.dry_suffixes, mirostat_mu=self.mirostat_mu)

    def counted(self) -> RowState:
        """The state with the history fields it carries counted from its tokens: the start of
        a loop (or of a row, in the serving engine)."""
        return self.replace(**self.history.carried(self.params).carried_fields,
                            mirostat_mu=mirostat.start_mu(self.params))

    def moved(self, logprobs: jax.Array, count: jax.Array) -> dict[str, jax.Array]:
        """The field update that moves each row's Mirostat ``mu`` by its first ``count[b]`` kept
        tokens, whose log-probabilities under the distributions they were drawn from are
        ``logprobs [B, T]`` (what ``recorded`` writes)."""
        return dict(mirostat_mu=mirostat.advanced_along(self.mirostat_mu, logprobs, count,
                                                        self.params))

    def history_after(self, tokens: jax.Array, block: jax.Array, count: jax.Array
                      ) -> sampling.History:
        """The rows' history, carried fields updated, once each keeps the first ``count[b]``
        tokens of ``block [B, T]``, which ``tokens [B, S]`` holds from the row's length."""
        history = self.history.replace(tokens=tokens)
        return history.extended(block, count, self.params)

    def ends_with_stop(self, tokens: jax.Array, ends: jax.Array) -> jax.Array:
        """``[B, T]`` bool: row b's output in ``tokens: [B, S]``, up to ``ends[b, i]`` tokens of
        prompt and output, ends with a stop sequence; one gather of every window."""
        M, W = self.stop_ids.shape[-2:]
        B, S = tokens.shape
        T = ends.shape[1]
        if M == 0:
            return jnp.zeros((B, T), bool)
        stop_ids = jnp.broadcast_to(self.stop_ids, (B, M, W))  # shared or per row
        index = ends[..., None] - W + jnp.arange(W, dtype=jnp.int32)[None, None, :]  # [B, T, W]
        window = jnp.take_along_axis(tokens, jnp.clip(index, 0, S - 1).reshape(B, T * W),
                                     axis=1).reshape(B, T, 1, W)
        padding = stop_ids < 0  # [B, M, W]
        equal = (window == stop_ids[:, None]) | padding[:, None]  # [B, T, M, W]
        width = jnp.sum(~padding, axis=-1)[:, None, :]  # [B, 1, M]; 0: an unused row of a block
        generated = (ends - self.prompt_lengths[:, None])[..., None]  # [B, T, 1]
        return jnp.any(jnp.all(equal, axis=-1) & (width > 0) & (width <= generated), axis=-1)

    def recorded(self, at: tuple[jax.Array, jax.Array], logprob: jax.Array,
                 distribution: Callable[[], jax.Array]) -> dict[str, jax.Array]:
        """The output buffers with ``logprob`` (each kept token's log-probability) written at
        ``at`` (row and output column indices; a column out of range is dropped) and, when the
        buffers have room for them, the top log-probabilities, their ids and the entropy of
        ``distribution()``: the log-probabilities ``[..., V]`` each token was drawn from, formed
        only then."""
        record = dict(logprobs=self.logprobs.at[at].set(logprob, mode="drop"))
        top_n, with_entropy = self.top_logprobs.shape[-1], self.entropy.shape[-1]
        if not (top_n or with_entropy):
            return record
        logprobs = distribution()
        if top_n:
            top, ids = jax.lax.top_k(logprobs, top_n)  # [..., n]
            record.update(top_logprobs=self.top_logprobs.at[at].set(top, mode="drop"),
                          top_ids=self.top_ids.at[at].set(ids.astype(jnp.int32), mode="drop"))
        if with_entropy:
            record.update(entropy=self.entropy.at[at].set(sampling.logprob_entropy(logprobs),
                                                          mode="drop"))
        return record
