"""speculative_generate(): a drafter proposes ``gamma`` tokens, the target scores them all in one
forward pass, and the rejection rule of Leviathan et al. (2023) / Chen et al. (2023) keeps the
output distributed exactly as the target's.

Conventions (every caller relies on them):

- The sequence layout is ``decode``'s: ``tokens[b, j]`` is position j, ``lengths[b]`` counts prompt
  plus output. A row with ``L`` tokens starts a round with its target cache holding positions
  ``0 .. L-2`` (the last token heads the verify block) and its draft cache holding ``0 .. L-2`` or
  ``0 .. L-3`` (one behind after a round that accepted every proposal; the draft's first block of
  the next round catches it up).
- A round, per row: the drafter proposes ``d_0 .. d_{gamma-1}`` for positions ``L .. L+gamma-1``,
  drawn from ``q_0 .. q_{gamma-1}``. The target runs ``[t_{L-1}, d_0, .., d_{gamma-1}]`` once and
  gives ``p_0 .. p_gamma`` for positions ``L .. L+gamma``. ``d_j`` is accepted with probability
  ``min(1, p_j(d_j) / q_j(d_j))`` while every earlier one was; at the first rejection ``n`` the
  row's next token is drawn from ``normalise(max(0, p_n - q_n))``, and if all were accepted from
  ``p_gamma`` (the bonus token). The row gains ``n + 1`` tokens, and both caches are rewound to it.
- ``p`` and ``q`` are ``sampling.processed_logprobs`` of the target's and the drafter's logits with
  the same parameters and the history including the proposals before them: the distributions that
  are sampled from. At temperature 0 both are one-hot, so a proposal is accepted iff it is the
  target's argmax, and the output equals greedy ``generate``'s. When every running row is greedy
  (a run-time check: one program serves both) a round compares argmaxes and forms no
  distribution at all.
- Mirostat (``sampling.mirostat``): the target's distribution at position ``L + t`` uses the
  row's ``mu`` moved by the surprises of ``d_0 .. d_{t-1}`` under the target's processed
  distributions before them (a scan over the ``gamma + 1`` positions); the row keeps ``mu``
  moved by its kept tokens only, the residual or bonus token's surprise taken under ``p_n``, the
  distribution its position has in ``generate`` (a rejection rewinds ``mu``). A draft model's
  ``q`` uses the same Mirostat on its own logits with its own ``mu``, moved along its draws and
  kept in the ``Proposal`` for the ``q`` row of a rejection; a model-free drafter's one-hot ``q``
  reads none. So the output is distributed as ``generate``'s Mirostat.
- A round holds nothing vocabulary-wide per proposal: the drafter returns each proposal's
  probability ``q_j(d_j)``, and the ``q`` row at a rejection only when a sampled row rejects
  (``Drafter.rejected_logq``); the target's rows are normalised once (one logsumexp each).
- A drafter may propose fewer than ``gamma`` tokens for a row (``Proposal.count``); positions past
  them have ``q = 0``, so the token there is drawn from ``p``: the rule stays exact for any count.
  A model-free drafter's ``q`` is one-hot at its proposal: accepted with probability ``p(x)``,
  otherwise the next token is drawn from ``p`` without ``x``, renormalised.
- Constraints (``SamplingParams.regex`` / ``json_schema``, ``generate``'s): ``p`` and ``q`` are
  the constrained distributions, the logits masked to the tokens of the constraint state at
  their position before the processors. A model drafter masks each draft step with the state
  advanced along its own draft; proposals a row's state forbids (a model-free drafter's) are cut
  before the target sees them. The round keeps each position's state (``Proposal``), so a row's
  state after the round is the one of its kept tokens: it rewinds with the cache, and the
  output is distributed exactly as constrained ``generate``'s.
- Randomness is per request: the draws for the token at position ``pos`` of request r use
  ``fold_in(fold_in(request key r, pos), stream)`` (the request keys come from the seeds as in
  ``generate``; ``drafters.stream_keys``) with one stream each for the draft sample, the
  acceptance test and the target's (residual or bonus) sample. A key influences the output only
  once its position is kept, so re-drafting a position after a rejection is still exact, and with
  per-request seeds a request's output never depends on its batch-mates.
- Drafters (``ModelDrafter``, ``NgramDrafter``) live in ``drafters``, one round in ``rounds``
  and the loop's state in ``state`` (``SpecState``: ``decode``'s ``RowState`` plus both caches
  and the acceptance counts); the loop runs through ``SPECULATIVE_LOOP`` (compiled, or its
  Python twin with ``python_loop``).
- The loop is one ``lax.while_loop`` of rounds with static shapes; rows that have stopped are
  carried along with nothing written and their caches unchanged. Rows stop as in ``generate``
  (EOS, stop sequences and strings, ``max_new_tokens``, ``max_len``, bad logits), a
  constrained row out of budget before its pattern completes with "incomplete".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.cache import check_kind, init_cache, max_rewind
from decodelab.cache.dense import KVCache
from decodelab.checks import check_model, check_size, tokenizer_size
from decodelab.sharding import data_size
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.output import GenerateOutput, finish_output, host_output
from decodelab.decode.request import (DecodeOptions, OutputSpec, RowInputs, check_request,
                                      speculative_sizes)
from decodelab.decode.samples import grouped, sample_block, with_samples
from decodelab.decode.shapes import Shapes
from decodelab.model.parts import split
from decodelab.sampling.params import SamplingParams
from decodelab.speculative.drafters import Drafter, ModelDrafter, NgramDrafter, Proposal
from decodelab.speculative.rounds import SpecState, speculative_round, verify

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "Proposal", "SpecState",
           "SpeculativeOptions", "SpeculativeOutput", "SpeculativeStats",
           "expected_tokens_per_call", "predicted_speedup", "speculative_generate",
           "speculative_round", "verify"]


_STATIC = ("graphdef", "drafter")


@functools.partial(jax.jit, static_argnames=(*_STATIC, "max_len", "kv_cache"))
def prefill(target_weights, draft_weights, block, num_valid, *, graphdef, drafter,
             max_len, kv_cache=None) -> tuple[KVCache, KVCache | None]:
    """Both caches after the prompt block ``[B, T]``, of which ``num_valid[b]`` tokens are fed:
    each prompt but its last token."""
    target = nnx.merge(graphdef, target_weights)
    cache = init_cache(target.config, block.shape[0], max_len, kv_cache)
    _, cache = target(block, cache=cache, num_valid=num_valid, reach=block.shape[1])
    return cache, drafter.prefill(draft_weights, block, num_valid, max_len)


@functools.partial(jax.jit, static_argnames=("gamma", "outputs"))
def initial_state(target_cache: KVCache, draft_cache: KVCache | None, block: np.ndarray,
                  rows: RowInputs, *, gamma: int, outputs: OutputSpec,
                  samples: jax.Array | None = None) -> SpecState:
    """The state before the first round, around the prefilled caches: a program of its own, so
    the prefill does not depend on ``gamma`` or the output options. With ``samples`` (``[R]``
    int32: n samples per prompt, as in ``decode.prefill``) state row r starts from copies of
    block row ``samples[r]`` and its cache rows; ``rows`` are the R state rows' values."""
    if samples is not None:
        block, target_cache = block[samples], target_cache.take_rows(samples)
        draft_cache = None if draft_cache is None else draft_cache.take_rows(samples)
    B, N = block.shape[0], outputs.max_new_tokens
    return SpecState.start(
        jnp.asarray(block, jnp.int32), rows, target_cache.max_len, outputs,
        target_cache=target_cache,
        draft_cache=draft_cache,
        rounds=jnp.zeros((B,), jnp.int32),
        tested=jnp.zeros((B, gamma), jnp.int32),
        accepted=jnp.zeros((B, gamma), jnp.int32),
        per_round=jnp.full((B, N), -1, jnp.int32),
    ).counted()


def _body(weights, state: SpecState, *, graphdef, drafter) -> SpecState:
    target_weights, draft_weights = weights
    return speculative_round(nnx.merge(graphdef, target_weights), drafter, draft_weights, state)


SPECULATIVE_LOOP = CompiledLoop("_speculative", _body, lambda weights, state: state.running(),
                                static_argnames=_STATIC)


# --- Output and statistics ------------------------------------------------------------------------


def expected_tokens_per_call(alpha, gamma: int):
    """Leviathan et al.'s expected tokens per target call, ``(1 - a^(g+1)) / (1 - a)``, for
    i.i.d. acceptance with probability ``alpha`` (``gamma + 1`` at ``alpha = 1``)."""
    alpha = np.asarray(alpha, np.float64)
    safe = np.where(alpha < 1.0, alpha, 0.0)
    return np.where(alpha < 1.0, (1.0 - safe ** (gamma + 1)) / (1.0 - safe), gamma + 1.0)


def predicted_speedup(alpha, gamma: int, cost_ratio):
    """Leviathan et al.'s expected wall-time improvement over target-only decoding,
    ``(1 - a^(g+1)) / ((1 - a)(g c + 1))``, with ``c`` = draft step time / target step time."""
    return expected_tokens_per_call(alpha, gamma) / (gamma * np.asarray(cost_ratio) + 1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class SpeculativeStats:
    """Acceptance counts of one ``speculative_generate`` call, per row.

    A proposal is *tested* when every earlier proposal of its round was accepted (and the target's
    distribution there was usable); the acceptance rate ``alpha`` is accepted / tested, the
    quantity the i.i.d. theory's alpha estimates. Counts include proposals accepted in the last
    round beyond what the budget, an EOS or a stop sequence let the row keep.

    A rate with nothing tested (a row, or a draft position, where no proposal was tested; every
    row when no row was) is NaN: 0 / 0, deliberately not 0 or 1, since no proposal was judged.
    ``tested`` and ``tested_by_position`` say where.
    """

    gamma: int
    rounds: np.ndarray  # [B] int, target calls (verify passes; the prefill not counted)
    generated: np.ndarray  # [B] int, output tokens (GenerateOutput.lengths before stop strings)
    tested_by_position: np.ndarray  # [B, gamma] int
    accepted_by_position: np.ndarray  # [B, gamma] int
    accepted_per_round: np.ndarray  # [B, N] int, per round of the row; -1 past its rounds
    #   (padding, as the output's NaN logprobs past a row's length)

    @property
    def tested(self) -> np.ndarray:  # [B]
        return self.tested_by_position.sum(axis=1)

    @property
    def accepted(self) -> np.ndarray:  # [B]
        return self.accepted_by_position.sum(axis=1)

    @property
    def alpha(self) -> np.ndarray:  # [B] float, NaN where nothing was tested
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.accepted / self.tested

    @property
    def overall_alpha(self) -> float:  # NaN where no row tested a proposal
        tested = int(self.tested.sum())
        return float(self.accepted.sum() / tested) if tested else float("nan")

    @property
    def tokens_per_call(self) -> np.ndarray:  # [B] float
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.generated / self.rounds

    @property
    def overall_tokens_per_call(self) -> float:
        return float(self.generated.sum() / max(int(self.rounds.sum()), 1))

    @property
    def acceptance_by_position(self) -> np.ndarray:  # [gamma] float over all rows; NaN at a
        # position no row tested
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.accepted_by_position.sum(axis=0) / self.tested_by_position.sum(axis=0)


@dataclasses.dataclass(frozen=True, eq=False)
class SpeculativeOutput(GenerateOutput):
    """``GenerateOutput``'s fields (logprobs etc. under the target's distribution; NaN past a
    row's length, as there) plus ``stats``."""

    stats: SpeculativeStats


# --- Entry point ----------------------------------------------------------------------------------


def _check_tokenizers(tokenizer: Any, draft_tokenizer: Any) -> None:
    if tokenizer is None or draft_tokenizer is None or tokenizer is draft_tokenizer:
        return
    if hasattr(tokenizer, "serialized_model") and hasattr(draft_tokenizer, "serialized_model"):
        same = tokenizer.serialized_model() == draft_tokenizer.serialized_model()
    else:
        same = tokenizer == draft_tokenizer
    if not same:
        raise ValueError(f"draft_tokenizer must be the target's tokenizer (token ids must mean the "
                         f"same text), got {draft_tokenizer!r} for target tokenizer {tokenizer!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeOptions(DecodeOptions):
    """``generate``'s ``DecodeOptions``, plus what ``generate`` takes as keywords and a
    speculative call (with its draft and gamma) keeps here: the samples per prompt, the cache
    kind, and the draft's tokenizer. ``speculative_generate`` also takes a plain
    ``DecodeOptions``."""

    n: int = 1  # samples per prompt, as generate's n (one prefill of target and draft each)
    kv_cache: str | None = None  # as in generate, for both caches
    draft_tokenizer: Any = None  # must be the target's tokenizer when both are given


def _speculative_options(options: Any) -> SpeculativeOptions:
    if isinstance(options, SpeculativeOptions):
        return options
    if not isinstance(options, DecodeOptions):
        raise ValueError(f"options must be a SpeculativeOptions or a DecodeOptions, got "
                         f"{options!r}")
    return SpeculativeOptions(**{f.name: getattr(options, f.name)
                                 for f in dataclasses.fields(DecodeOptions)})


def speculative_generate(
    target: nnx.Module,
    draft: nnx.Module | Drafter,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    gamma: int,
    max_new_tokens: int,
    seed: int | Sequence[int] = 0,
    *,
    options: DecodeOptions = SpeculativeOptions(),
) -> SpeculativeOutput:
    """Continue each prompt by up to ``max_new_tokens`` tokens distributed exactly as ``target``'s
    ``generate`` output, drafting ``gamma`` tokens per target call.

    Args:
      target: a ``Transformer`` (or any module with its call signature and a ``config``).
      draft: a draft model with the target's vocabulary (it samples with ``params`` too), or a
        model-free ``Drafter`` such as ``NgramDrafter()``.
      prompts, params, max_new_tokens, seed: as in ``generate``.
      gamma: proposals per round (>= 1); capped at the bucket of ``max_new_tokens`` (after its
        clamping; ``request``'s output width), as proposals past the budget could never be
        kept, and a new budget within the bucket compiles nothing. The tokens are those of the
        uncapped gamma; ``stats.gamma`` reports the gamma used.
      options: a ``SpeculativeOptions`` (or a ``DecodeOptions``):
        eos_ids, stop_sequences, stop_strings, return_top_logprobs, return_entropy,
          python_loop, raise_on_error: as in ``generate``; the logprobs, top logprobs and
          entropy are those of the target's sampling distribution.
        tokenizer, draft_tokenizer: the models' tokenizers; when both are given they must be
          the same (``tokenizer`` also serves ``stop_strings``). Ids past its size (a padded
          vocabulary's padding) are never sampled, as in ``generate``.
        n: samples per prompt, as ``generate``'s ``n``: one prefill of the target and the draft
          per prompt; outputs ``[P, n, ...]`` when n > 1, ``stats`` per sample row (row
          ``p * n + i``).
        max_len: cache slots per row, for both models. Default: the prompt bucket plus the
          bucket of ``max_new_tokens`` plus ``gamma``, capped by the smaller position table.
          Every prompt needs room for one round: ``len(prompt) + gamma <= max_len``.
          ``max_new_tokens`` is clamped to ``max_len`` minus the shortest prompt, as in
          ``generate``.
        kv_cache: as in ``generate``, for the target's cache and a draft model's; with "int4" a
          round's rewind (up to ``gamma + 1`` slots) must be within ``Kivi.max_rewind``.

    Raises ValueError before anything is allocated when the caches and buffers need more than the
    memory limit (``checks.check_memory``).

    Returns a ``SpeculativeOutput``: ``generate``'s fields plus ``stats`` (``SpeculativeStats``).
    """
    o = _speculative_options(options)
    _check_models(target, draft, o.tokenizer, o.draft_tokenizer, o.kv_cache)
    gamma = check_size("gamma", gamma, 1)
    V = target.config.vocab_size
    request = check_request(V, prompts, params, max_new_tokens, seed, o)
    request.guide.refuse("speculative_generate")
    if request.tokenizer_size is None:  # the draft's tokenizer, the same, masks the padding
        request = dataclasses.replace(
            request, tokenizer_size=tokenizer_size("draft_tokenizer", o.draft_tokenizer, V))
    request = with_samples(request, o.n)
    shapes, gamma = speculative_sizes(request, gamma, o.max_len, target,
                                      None if isinstance(draft, Drafter) else draft)
    _check_rewind_depth(gamma, o.kv_cache)

    graphdef, target_weights = split(target)
    drafter, draft_weights = _drafter(draft, o.kv_cache)
    # Both caches hold each prompt but its last token, which heads the first verify block.
    block, block_lengths, lengths, samples = sample_block(request, shapes, data_size(target))
    inputs = request.row_inputs(lengths, V, shapes)  # its checks come before the first trace
    caches = prefill(target_weights, draft_weights, block, block_lengths - 1,
                     graphdef=graphdef, drafter=drafter, max_len=shapes.max_len,
                     kv_cache=o.kv_cache)
    state = initial_state(*caches, block, inputs, gamma=gamma,
                          outputs=request.outputs(shapes), samples=samples)
    state = SPECULATIVE_LOOP.run((target_weights, draft_weights), state,
                                 python_loop=request.python_loop, graphdef=graphdef,
                                 drafter=drafter)
    return grouped(finish_output(_output(state, gamma, shapes), state.finish, request),
                   request.samples)


def _check_models(target, draft, tokenizer, draft_tokenizer, kv_cache) -> None:
    """The target, the draft (a model with the target's vocabulary and tokenizer, or a
    model-free drafter without a tokenizer) and the cache kind."""
    check_model("target", target)
    check_kind("kv_cache", kv_cache)
    if isinstance(draft, Drafter):
        if draft_tokenizer is not None:
            raise ValueError(f"draft_tokenizer must be None for a model-free drafter "
                             f"({type(draft).__name__}), got {draft_tokenizer!r}")
        return
    check_model("draft", draft)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft must have the target's vocabulary: draft vocab_size "
                         f"{draft.config.vocab_size}, target vocab_size "
                         f"{target.config.vocab_size}")
    _check_tokenizers(tokenizer, draft_tokenizer)


def _check_rewind_depth(gamma: int, kv_cache: str | None) -> None:
    depth = max_rewind(kv_cache)
    if depth is not None and gamma + 1 > depth:
        raise ValueError(f"gamma must be at most {depth - 1} with kv_cache={kv_cache!r} (a round "
                         f"rewinds up to gamma + 1 slots; Kivi.max_rewind is {depth}), got "
                         f"{gamma}")


def _drafter(draft, kv_cache: str | None) -> tuple[Drafter, Any]:
    """``(drafter, its traced weights)``: a model-free drafter as it is, a draft model as a
    ``ModelDrafter`` over its graph and weights."""
    if isinstance(draft, Drafter):
        return draft, None
    draft_graphdef, draft_weights = split(draft)
    return ModelDrafter(draft_graphdef, kv_cache), draft_weights


def _output(state: SpecState, gamma: int, shapes: Shapes) -> SpeculativeOutput:
    """The final state on the host, cut back to the real rows and columns of ``shapes``:
    ``generate``'s output fields and the statistics."""
    out = host_output(state, shapes)
    B, N = shapes.rows, shapes.columns
    rounds, tested, accepted, per_round = jax.device_get(
        (state.rounds[:B], state.tested[:B], state.accepted[:B], state.per_round[:B, :N]))
    stats = SpeculativeStats(gamma=gamma, rounds=rounds, generated=out.lengths.copy(),
                             tested_by_position=tested, accepted_by_position=accepted,
                             accepted_per_round=per_round)
    return SpeculativeOutput(**{f.name: getattr(out, f.name)
                                for f in dataclasses.fields(GenerateOutput)}, stats=stats)
