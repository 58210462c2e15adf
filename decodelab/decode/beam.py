"""beam_search(): the most probable continuations of each prompt, ranked with a length penalty.

Conventions (every caller relies on them):

- A prompt gets ``W`` beams: rows ``b * W .. b * W + W - 1`` of one batch of ``B * W`` rows that
  share the model call. The ragged prompts are prefilled once (padded to a power-of-two bucket, as
  in ``decode``) into a ``BeamCache``, whose physical rows start as copies of their prompt's row;
  each beam then writes only the tokens it generates into its own physical row. Every step gives
  each surviving beam its parent's history by reordering a ``[B * W, S]`` table of which row
  holds each slot (``BeamCache.take_rows``), never by copying keys and values.
- ``kv_cache``: None (float) or "int8" (``cache.QuantizedKVCache``: a scale per token, so a slot
  reads the same from whichever row holds it). KIVI's int4 cache is refused: its key groups and
  float ring belong to a physical row's own history, which beams do not have.
- A hypothesis's log-probability is the sum of the model's log-probabilities (``log_softmax`` of
  the logits, no sampling processors) of its output tokens. Hypotheses are ranked by
  ``logprob / lp(n)``, ``lp(n) = ((5 + n) / 6) ** alpha`` (Wu et al. 2016, GNMT), where ``n`` counts
  the output tokens including the EOS that ends it; ``alpha = 0`` ranks by log-probability.
- Each step extends every running beam by every token. The ``W`` best extensions by an EOS id
  (once the output has ``min_new_tokens`` tokens) are finished hypotheses: they enter a pool that
  keeps the ``W`` best finished ones by rank score and are never extended. The ``W`` best
  extensions by any other token are the next running beams.
- A prompt stops when its output budget is spent (``max_new_tokens``, or the room ``max_len``
  leaves after its prompt): its running beams then join the pool with finish reason "length". It
  stops earlier when the pool holds ``W`` hypotheses and no running beam can still beat the worst:
  a beam's log-probability only falls, so for ``alpha >= 0`` its rank score can at best reach
  ``logprob / lp(budget)``. The pool cannot change after that, so stopping early changes no output.
- Ties go to the lower beam index, then the lower token id. Prompts never interact: a prompt's
  hypotheses do not depend on its batch-mates or its position in the batch.
- The programs compile once per (batch bucket, prompt bucket, ``W``, output width, ``max_len``):
  the prompts and the output columns are padded to ``request``'s buckets (padding prompts are
  born done, with a budget of 0, and cut from the output); prompt lengths, budgets, EOS ids,
  ``alpha`` and ``min_new_tokens`` are array values. ``BEAM_LOOP`` runs
  the steps compiled or, with ``python_loop``, as their Python twin.
- Diverse beam search (``BeamOptions.num_beam_groups`` G > 1): the state's rows are the prompts'
  groups, B * G of W / G beams, that penalise each other's tokens (``beam_groups``).
- Finish codes are ``request``'s table: a hypothesis ends with ``EOS`` or ``LENGTH``, and an empty
  slot of the n-best list is ``NO_HYPOTHESIS`` (finish reason "none").
- Constraints (``BeamOptions.regex`` / ``json_schema``, per prompt): each beam carries its own
  automaton state, gathered with its parent when the beams reorder; a beam's log-probabilities
  are those of the constrained distribution (the logits masked to its state's tokens, then
  ``log_softmax``), so EOS ends a hypothesis only where its pattern is complete, and a running
  beam that meets the budget before then joins the pool as "incomplete", ranked after every
  complete hypothesis whatever its score.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from decodelab.cache import BeamCache, bytes_per_token, check_kind, init_cache
from decodelab.checks import (check_bool, check_memory, check_model, check_number, check_size,
                              is_int, nbytes, position_limit, tokenizer_size)
from decodelab.decode.beam_groups import check_groups, diverse_top_k, merged, pool_order
from decodelab.decode.beam_output import BeamSearchOutput, n_best
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.request import (EOS, INCOMPLETE, LENGTH, NO_HYPOTHESIS, PAD_TOKEN,
                                      BeamOptions, check_eos, check_prompts)
from decodelab.decode.shapes import batch_shapes, prompt_block, take_rows
from decodelab.decode.state import LoopState
from decodelab.model.parts import split
from decodelab.sampling.constraint import ConstraintTable
from decodelab.sampling.patterns import pattern_table
from decodelab.sharding import data_size


@struct.dataclass(kw_only=True)
class BeamState(LoopState):
    """Everything the beam loop carries (``LoopState``'s step, budgets per prompt and EOS mask,
    then its own): running beams, the pool of finished hypotheses, the cache. ``B`` prompts,
    ``W`` beams each, ``N`` = max_new_tokens."""

    min_new_tokens: jax.Array  # [] int32, no hypothesis finishes with EOS before this length
    lengths: jax.Array  # [B] int32, output tokens of each prompt's running beams
    done: jax.Array  # [B] bool
    cache: BeamCache  # B * W rows, prompt b's beams at rows b * W + w
    logits: jax.Array  # [B * W, V] float32, each running beam's next-token logits
    tokens: jax.Array  # [B, W, N] int32, running beams' output; PAD_TOKEN past lengths
    logprobs: jax.Array  # [B, W] float32, running beams' log-probabilities (-inf: no beam)
    pool_tokens: jax.Array  # [B, W, N] int32, finished hypotheses, best first
    pool_scores: jax.Array  # [B, W] float32, their rank scores (-inf: empty slot)
    pool_logprobs: jax.Array  # [B, W] float32
    pool_lengths: jax.Array  # [B, W] int32
    pool_reasons: jax.Array  # [B, W] int32, NO_HYPOTHESIS | EOS | LENGTH (request's codes)
    alpha: jax.Array  # [] float32, the length penalty exponent
    usable: jax.Array  # [V] bool, ids a hypothesis may take (False: a padded vocabulary's padding)
    # Structured output: the batch's automata and each running beam's state (None: no prompt
    # constrained, and no step reads a table).
    constraint: ConstraintTable | None = None
    constraint_states: jax.Array | None = None  # [B, W] int32, FREE for a free prompt
    # Diverse beam search: [G] float32, the penalty once per group (``beam_groups``: then the
    # rows are groups, B * G of W / G beams); None: one group, plain beam search.
    diversity_penalty: jax.Array | None = None

    @property
    def width(self) -> int:
        return self.logprobs.shape[1]

    @property
    def max_new_tokens(self) -> int:
        return self.tokens.shape[2]


def length_penalty(lengths: jax.Array, alpha: jax.Array) -> jax.Array:
    """GNMT's ``((5 + n) / 6) ** alpha`` for output lengths ``n``."""
    return ((5.0 + lengths.astype(jnp.float32)) / 6.0) ** alpha


def _rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """``x: [B, M, ...]`` at ``index: [B, K]`` along axis 1 -> ``[B, K, ...]``."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _extend(tokens: jax.Array, parents: jax.Array, new: jax.Array, at: jax.Array) -> jax.Array:
    """``tokens: [B, W, N]`` -> rows ``parents: [B, K]`` of each prompt with ``new: [B, K]`` written
    at output position ``at: [B]``."""
    N = tokens.shape[2]
    chosen = _rows(tokens, parents)  # [B, K, N]
    here = jnp.arange(N, dtype=jnp.int32)[None, None, :] == at[:, None, None]  # [B, 1, N]
    return jnp.where(here, new[:, :, None], chosen)


def _select_and_record(state: BeamState) -> tuple[BeamState, jax.Array]:
    """One step's choice: extend every running beam by every token, move EOS extensions to the
    pool, keep the best other extensions as running beams. Returns the state and ``[B, W]`` parent
    beam of each new running beam (the identity for prompts that were already done)."""
    B, W, N = state.tokens.shape
    V = state.logits.shape[-1]
    logits, table = jnp.where(state.usable[None, :], state.logits, -jnp.inf), state.constraint
    if table is not None:  # a beam's distribution is the constrained one
        logits = table.mask_logits(logits, state.constraint_states.reshape(B * W))
    logp = jax.nn.log_softmax(logits, axis=-1)  # padding never taken
    if table is not None:  # a state that allows nothing (untrimmed) extends nothing, not NaN
        logp = jnp.where(jnp.any(logits > -jnp.inf, axis=-1, keepdims=True), logp, -jnp.inf)
    logp = logp.reshape(B, W, V)
    extended = state.logprobs[:, :, None] + logp  # [B, W, V]
    n = state.lengths + 1  # [B], output length after this step
    penalty = length_penalty(n, state.alpha)  # [B]

    may_end = state.eos_mask[None, None, :] & (n >= state.min_new_tokens)[:, None, None]
    ends = jnp.where(may_end, extended, -jnp.inf).reshape(B, W * V)
    # lax.top_k: descending, ties to the lower index (lower beam, then lower token id).
    ended, ended_index = jax.lax.top_k(ends, W)  # [B, W]
    goes_on = jnp.where(state.eos_mask[None, None, :], -jnp.inf, extended).reshape(B, W * V)
    if state.diversity_penalty is None:
        running, running_index = jax.lax.top_k(goes_on, W)  # [B, W]
    else:  # the groups choose in order, each steered off the tokens earlier ones chose
        running, running_index = diverse_top_k(goes_on, state.diversity_penalty, state.done, V)
    running_parent, running_token = running_index // V, running_index % V
    tokens = _extend(state.tokens, running_parent, running_token.astype(jnp.int32), n - 1)
    at_budget = n >= state.budgets  # [B]

    # Pool candidates: the current pool, this step's EOS extensions, and at the budget the running
    # beams (finish "length"). The pool keeps the W best by rank score.
    ended_tokens = _extend(state.tokens, ended_index // V, (ended_index % V).astype(jnp.int32),
                           n - 1)
    last = jnp.where(at_budget[:, None], running, -jnp.inf)
    cand_logprobs = jnp.concatenate([state.pool_logprobs, ended, last], axis=1)  # [B, 3W]
    cand_scores = jnp.concatenate([state.pool_scores, ended / penalty[:, None],
                                   last / penalty[:, None]], axis=1)
    cand_tokens = jnp.concatenate([state.pool_tokens, ended_tokens, tokens], axis=1)
    n_col = jnp.broadcast_to(n[:, None], (B, W))
    cand_lengths = jnp.concatenate([state.pool_lengths, n_col, n_col], axis=1)
    states = {}
    if table is not None:  # each new beam's state: its parent's, advanced by its token
        moved = table.advance(_rows(state.constraint_states, running_parent).reshape(B * W),
                              running_token.reshape(B * W).astype(jnp.int32)).reshape(B, W)
        states = dict(constraint_states=moved)
        out_of_budget = jnp.where(table.accepting[moved], LENGTH, INCOMPLETE).astype(jnp.int32)
    else:
        out_of_budget = jnp.full((B, W), LENGTH, jnp.int32)
    cand_reasons = jnp.concatenate([state.pool_reasons, jnp.full((B, W), EOS, jnp.int32),
                                    out_of_budget], axis=1)
    keep = pool_order(cand_scores, cand_reasons if table is not None else None, W)  # [B, W]
    pool_scores = _rows(cand_scores, keep)
    filled = pool_scores > -jnp.inf  # [B, W]; empty slots hold nothing

    # Done: budget spent, no running beam left, or none can beat the worst of a full pool.
    best = jnp.max(running, axis=1)  # running[:, 0] unless groups penalise each other
    best_reachable = best / length_penalty(state.budgets, state.alpha)
    done = at_budget | (best == -jnp.inf) | (best_reachable <= pool_scores[:, W - 1])

    was_done = state.done

    def keep_old(old: jax.Array, new: jax.Array) -> jax.Array:  # prompts done before stand still
        return jnp.where(was_done.reshape((B,) + (1,) * (old.ndim - 1)), old, new)

    identity = jnp.broadcast_to(jnp.arange(W, dtype=jnp.int32)[None, :], (B, W))
    state = state.replace(
        step=state.step + 1,
        lengths=keep_old(state.lengths, n),
        done=was_done | done,
        tokens=keep_old(state.tokens, tokens),
        logprobs=keep_old(state.logprobs, running),
        pool_tokens=keep_old(state.pool_tokens, _rows(cand_tokens, keep)),
        pool_scores=keep_old(state.pool_scores, pool_scores),
        pool_logprobs=keep_old(state.pool_logprobs, _rows(cand_logprobs, keep)),
        pool_lengths=keep_old(state.pool_lengths, jnp.where(filled, _rows(cand_lengths, keep), 0)),
        pool_reasons=keep_old(state.pool_reasons, jnp.where(filled, _rows(cand_reasons, keep),
                                                            NO_HYPOTHESIS)),
        **{name: keep_old(getattr(state, name), x) for name, x in states.items()},
    )
    return state, keep_old(identity, running_parent.astype(jnp.int32))


def _step(model: nnx.Module, state: BeamState) -> BeamState:
    """Choose the next beams, give each its parent's history, and feed its new token."""
    B, W, N = state.tokens.shape
    state, parents = _select_and_record(state)
    rows = (jnp.arange(B, dtype=jnp.int32)[:, None] * W + parents).reshape(B * W)
    last = jnp.take_along_axis(state.tokens, jnp.clip(state.lengths - 1, 0, N - 1)[:, None, None],
                               axis=2)  # [B, W, 1]
    feed = jnp.repeat(~state.done, W).astype(jnp.int32)  # [B * W]: finished prompts stand still
    logits, cache = model(last.reshape(B * W, 1), cache=state.cache.take_rows(rows),
                          num_valid=feed)
    return state.replace(cache=cache, logits=logits[:, 0])


def _body(weights, state: BeamState, *, graphdef) -> BeamState:
    return _step(nnx.merge(graphdef, weights), state)


BEAM_LOOP = CompiledLoop("_beam", _body, lambda weights, state: state.running(),
                         static_argnames=("graphdef",))


@struct.dataclass(kw_only=True)
class BeamInputs:
    """What each prompt row of a beam search starts with, beside its tokens."""

    prompt_lengths: jax.Array  # [B] int32
    budgets: jax.Array  # [B] int32, new tokens each prompt may take (0: a padding row)
    eos_mask: jax.Array  # [V] bool
    alpha: jax.Array  # [] float32, the length penalty's exponent
    min_new_tokens: jax.Array  # [] int32
    usable: jax.Array  # [V] bool, ids below the tokenizer's size (all without a tokenizer)
    constraint: ConstraintTable | None = None  # the batch's automata; None: none constrained
    constraint_states: jax.Array | None = None  # [B] int32, each prompt's start state
    diversity_penalty: jax.Array | None = None  # [G] float32 (``beam_groups.check_groups``)


@functools.partial(jax.jit, static_argnames=("graphdef", "width", "max_len", "max_new_tokens",
                                             "kv_cache"))
def beam_prefill(weights, block, rows: BeamInputs, *, graphdef, width, max_len, max_new_tokens,
                 kv_cache=None) -> BeamState:
    """Prefill the padded prompt block ``[B, T]`` once; its ``W`` beams share each row: the state
    ``BEAM_LOOP`` runs from."""
    prompt_lengths, budgets, eos_mask = rows.prompt_lengths, rows.budgets, rows.eos_mask
    alpha, min_new_tokens = rows.alpha, rows.min_new_tokens
    model = nnx.merge(graphdef, weights)
    B, T = block.shape
    W, N = width, max_new_tokens
    cache = init_cache(model.config, B, max_len, kv_cache)
    logits, cache = model(block, cache=cache, num_valid=prompt_lengths, reach=T)  # [B, T, V]
    last = jnp.take_along_axis(logits, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    beams = jnp.repeat(jnp.arange(B, dtype=jnp.int32), W)  # [B * W]
    cache = BeamCache.from_prompts(cache, W)
    # With G groups, each is a beam search of W / G of its own: B * G rows (``beam_groups``).
    G = 1 if rows.diversity_penalty is None else rows.diversity_penalty.shape[0]
    B, W, budgets = B * G, W // G, jnp.repeat(budgets, G)
    # Only beam 0 of each prompt (of each group) is alive at first, so the first step does not
    # pick W copies of the same extension.
    alive = jnp.where(jnp.arange(W) == 0, 0.0, -jnp.inf).astype(jnp.float32)
    return BeamState(
        step=jnp.zeros((), jnp.int32),
        budgets=budgets,
        min_new_tokens=min_new_tokens,
        lengths=jnp.zeros((B,), jnp.int32),
        done=budgets == 0,  # padding rows are born done
        cache=cache,
        logits=last[beams],
        tokens=jnp.full((B, W, N), PAD_TOKEN, jnp.int32),
        logprobs=jnp.broadcast_to(alive[None, :], (B, W)),
        pool_tokens=jnp.full((B, W, N), PAD_TOKEN, jnp.int32),
        pool_scores=jnp.full((B, W), -jnp.inf, jnp.float32),
        pool_logprobs=jnp.full((B, W), -jnp.inf, jnp.float32),
        pool_lengths=jnp.zeros((B, W), jnp.int32),
        pool_reasons=jnp.full((B, W), NO_HYPOTHESIS, jnp.int32),
        eos_mask=eos_mask,
        alpha=alpha,
        usable=rows.usable,
        constraint=rows.constraint,
        constraint_states=(None if rows.constraint_states is None else
                           jnp.repeat(jnp.repeat(rows.constraint_states, G)[:, None], W, axis=1)),
        diversity_penalty=rows.diversity_penalty,
    )


# --- Entry point ----------------------------------------------------------------------------------


# The largest length_penalty: at alpha <= 4, ``((5 + n) / 6) ** alpha`` stays finite in float32
# for every int32 length n; past it, the long hypotheses' penalties overflow and their scores tie
# at 0.
MAX_ALPHA = 4


def _buffers(cfg: Any, B: int, W: int, S: int, N: int, kv_cache: str | None) -> dict[str, int]:
    """Bytes of the largest buffers of a ``BeamState`` (``checks.check_memory``)."""
    return {"KV cache": B * W * S * bytes_per_token(cfg, kv_cache),
            "running and finished tokens": 2 * nbytes((B, W, N), np.int32),
            "extensions": nbytes((B, W, cfg.vocab_size), np.float32)}


def beam_search(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    width: int,
    max_new_tokens: int,
    *,
    length_penalty: float = 0.0,
    max_len: int | None = None,
    kv_cache: str | None = None,
    options: BeamOptions = BeamOptions(),
) -> BeamSearchOutput:
    """The ``num_return`` best continuations of each prompt found by a beam of ``width``.

    Args:
      model: a ``Transformer`` (or any module with its call signature and a ``config``).
      prompts: one list of token ids per prompt, of any lengths.
      width: beams per prompt, in ``[1, vocab_size]``; 1 is greedy decoding.
      max_new_tokens: the output budget per hypothesis; clamped to ``max_len`` minus the shortest
        prompt (no hypothesis can be longer), which sets the output's column count.
      length_penalty: GNMT's alpha in [0, 4]; hypotheses are ranked by log-probability over
        ``((5 + length) / 6) ** alpha`` (0: by log-probability; larger favours longer outputs).
      max_len: cache slots per row (prompt + output). Default: the prompt bucket plus the
        bucket of ``max_new_tokens``, at most the model's position table if it has one.
      kv_cache: None (a float cache) or "int8" (module docstring; "int4" is refused).
      options: a ``BeamOptions``, the rarer arguments:
        num_return: hypotheses returned per prompt, in ``[1, width]``; default ``width``.
        eos_ids: ids that finish a hypothesis (kept in its output, never extended).
        min_new_tokens: no hypothesis ends with an EOS id before this many output tokens (beam
          search's best hypotheses are often short: Stahlberg and Byrne 2019).
        tokenizer: the model's tokenizer, when its vocabulary is padded past the tokenizer's
          (``checks.tokenizer_size``): ids past its size are never taken, and each step's
          log-probabilities are those of the tokenizer's ids. ``width`` is at most its size.
        python_loop: run the steps from Python (same step function, same hypotheses).
        num_beam_groups, diversity_penalty: diverse beam search (``beam_groups``): G groups of
          width / G beams (G divides width), each steered by lam >= 0 off the tokens earlier
          groups chose at the step; G = 1 (the default) is plain beam search.
        regex, json_schema: structured output, as ``SamplingParams``' fields (one pattern
          per prompt or shared), compiled over ``tokenizer``'s tokens.

    Raises ValueError before anything is allocated when the cache and buffers need more than the
    memory limit (``checks.check_memory``).
    """
    check_model("model", model)
    V = model.config.vocab_size
    rows = check_prompts(prompts, V)
    W = check_size("width", width, 1)
    if W > V:
        raise ValueError(f"width must be <= the vocabulary size {V}, got {width}")
    N = check_size("max_new_tokens", max_new_tokens, 1)
    alpha = float(check_number("length_penalty", length_penalty, 0, MAX_ALPHA))
    if not isinstance(options, BeamOptions):
        raise ValueError(f"options must be a BeamOptions, got {options!r}")
    R = W if options.num_return is None else options.num_return
    if not is_int(R) or not 1 <= R <= W:
        raise ValueError(f"num_return must be an int in [1, width={W}], got "
                         f"{options.num_return!r}")
    eos_mask = check_eos(options.eos_ids, V)
    U = tokenizer_size("tokenizer", options.tokenizer, V) or V
    if W > U:
        raise ValueError(f"width must be <= the tokenizer's size {U}, got {width}")
    min_new = check_size("min_new_tokens", options.min_new_tokens, 0)
    check_bool("python_loop", options.python_loop)
    diversity = check_groups(options.num_beam_groups, options.diversity_penalty, W)
    check_kind("kv_cache", kv_cache, shared_by="beam search")
    constraint = pattern_table(options.regex, options.json_schema, len(rows), V,
                               options.tokenizer, np.flatnonzero(eos_mask).tolist())
    shapes = batch_shapes(rows, N, max_len, position_limit(model), data_size(model))
    S, N = shapes.max_len, shapes.columns
    check_memory("beam_search", _buffers(model.config, shapes.padded_rows, W, S, shapes.width,
                                         kv_cache),
                 {"len(prompts)": len(rows), "width": W, "max_new_tokens": N, "max_len": S})

    block, lengths = prompt_block(rows, shapes)
    real = np.arange(shapes.padded_rows) < shapes.rows
    budgets = np.where(real, np.minimum(N, S - lengths), 0).astype(np.int32)
    graphdef, weights = split(model)
    table, starts = constraint or (None, None)
    inputs = BeamInputs(prompt_lengths=lengths, budgets=budgets, eos_mask=eos_mask,
                        alpha=np.float32(alpha), min_new_tokens=np.int32(min_new),
                        usable=np.arange(V) < U, constraint=table,
                        constraint_states=None if starts is None else
                        take_rows(starts, np.minimum(np.arange(len(block)), len(rows) - 1)),
                        diversity_penalty=diversity)
    state = beam_prefill(weights, block, inputs, graphdef=graphdef, width=W, max_len=S,
                         max_new_tokens=shapes.width, kv_cache=kv_cache)
    state = BEAM_LOOP.run(weights, state, python_loop=options.python_loop, graphdef=graphdef)
    return n_best(state if diversity is None else merged(state), R, shapes)
