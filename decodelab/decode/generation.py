"""generate(): ragged prompts -> one jit-compiled prefill -> one ``lax.while_loop`` of decode steps.

Conventions (every caller relies on them):

- A row's sequence is its prompt then its output; ``DecodeState.tokens[b, j]`` is position j.
  The prefill leaves the logits for each row's next token in the state; one step samples from
  them, records the token, and feeds it to the model for the next logits. So sampling is
  compiled once, in the loop, and the cache holds every token of a running row.
- Prompts are padded to a power-of-two block (``request.bucket_length``) for one prefill; a row's
  cache advances by its own prompt length only, so padding is never attended. Every other varying
  input (sampling parameters, seeds, prompt lengths within a bucket, each row's budget) is an
  array value, so the programs compile once per (batch bucket, prompt bucket, output width,
  ``max_len``, number and width of stop sequences, output options): the batch and the output
  are padded to buckets, the padding rows born done and cut from the output (``request``).
- Sampling is one program for every setting: every processor is traced and skipped at run time
  when no row enables it, and a step whose running rows are all greedy takes the argmax path (no
  softmax, no random numbers) by a ``lax.cond``, in the same program. What the history
  processors read is carried in the state and updated by each kept token, never recounted from
  the token buffer: the penalties' counts by one scatter per step, no-repeat-n-gram's common
  suffixes (``sampling.History.suffixes``) by one shifted compare. Each row's Mirostat ``mu``
  (``sampling.mirostat``) starts at ``2 * mirostat_tau`` and moves by the surprise of each kept
  token, read from the log-probability the step records for it (a greedy row's: 0).
- The token at position p of row b is drawn with ``fold_in(request key b, p)``
  (``sampling.row_keys``; the request keys come from the seeds, see ``request``).
- A row stops at the first of: an EOS id ("eos"), the end of a stop sequence ("stop"),
  ``max_new_tokens`` generated or ``max_len`` tokens in the row ("length"), or logits that hold
  NaN / +inf or leave no allowed token ("error"; nothing is sampled from them). The finishing
  EOS or stop sequence is part of the output. The finish codes are ``request``'s table.
- Constraints (``SamplingParams.regex`` / ``json_schema``): each row carries its automaton
  state (``RowState.constraint_states``, ``FREE`` for a free row) as it carries its length, and
  the batch's ``ConstraintTable`` rides in the state as data. The model's logits are masked to
  the state's tokens before every processor, on the greedy and the sampled path alike, so
  truncations and the reported logprobs are those of the constrained distribution; the state
  advances with the kept token. EOS is allowed only in accepting states, and a constrained row
  that meets its budget (or ``max_len``) in another state ends "incomplete". One program per
  table bucket serves any patterns and free rows; a batch with no pattern has no table and runs
  the unconstrained program.
- The loop ends when every row has stopped; rows that stopped earlier are carried along
  without advancing their cache. ``DECODE_LOOP`` runs it compiled or, with ``python_loop``, as
  its Python twin (same step, same tokens).

The loop's state is ``state.RowState`` (shared with speculative decoding, the carried history
included) plus the cache and the next logits. Validation of the arguments lives in ``request``, the output
in ``output``, shared with beam search, speculative decoding and the serving engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx, struct

from decodelab import sampling
from decodelab.cache import Cache, check_kind
from decodelab.cache.dense import KVCache
from decodelab.checks import check_memory, check_model, position_limit
from decodelab.decode.caches import keep_cache, start_cache
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.output import GenerateOutput, finish_output, host_output
from decodelab.decode.request import (BAD_LOGITS, EOS, INCOMPLETE, LENGTH, NO_ALLOWED_TOKEN,
                                      RUNNING, STOP, DecodeOptions, OutputSpec, RowInputs,
                                      check_request, decode_buffers)
from decodelab.decode.samples import grouped, sample_block, with_samples
from decodelab.decode.scoring import Scoring
from decodelab.decode.shapes import batch_shapes, prompt_width, sample_shapes
from decodelab.decode.state import RowState
from decodelab.model.parts import split
from decodelab.sampling.params import SamplingParams
from decodelab.sharding import data_size

# --- The loop -------------------------------------------------------------------------------------


@struct.dataclass(kw_only=True)
class DecodeState(RowState):
    """Everything the decode loop carries (``RowState``'s fields, then its own); the loop is a pure
    function of it. Its ``step`` is the output length of a still-running row."""

    cache: KVCache  # lengths = self.lengths for running rows (with CFG, 2B rows: ``scoring``)
    logits: jax.Array  # [B, V] float32, the scores each row's next token is sampled from
    scoring: Scoring = Scoring()  # how a model call becomes those scores (plain: its logits)


def _choose(state: DecodeState, with_distribution: bool):
    """``(token, its log-probability, bad logits, no allowed token, distribution or None)`` for
    each row, from ``state.logits``: when every running row is greedy, the argmax of the scores
    before temperature (``sampling.greedy_choice``: no softmax, no random numbers, a one-token
    distribution with log-probability 0); otherwise the processed distribution and its draw. A
    run-time ``lax.cond``, so both are one program. A constrained row's logits are masked to
    its state's tokens first, so both paths, the reported logprobs and every processor see the
    constrained distribution; bad logits are judged before the mask, on the model's own."""
    params, history = state.params, state.history
    logits = state.constrained(state.logits)
    B, V = logits.shape
    vocab = jnp.arange(V, dtype=jnp.int32)[None, :]  # [1, V]
    scored = sampling.score(logits, params, history)  # the processors before temperature, once

    def greedy():
        token, bad, none = sampling.greedy_choice(logits, params, history, scored)
        one_hot = jnp.where(vocab == token[:, None], 0.0, -jnp.inf) if with_distribution else None
        return token, jnp.zeros((B,), jnp.float32), bad, none, one_hot

    def sampled():
        # The draw's own sums give each row's normaliser: no log-softmax of [B, V] unless the
        # caller records the distribution (the draw reads the same scores either way).
        scores = sampling.process_scores(scored, params, history)  # [B, V]
        token, total = sampling.draw_with_total(scores, sampling.row_keys(state.keys,
                                                                          state.lengths))
        chosen = jnp.take_along_axis(scores, token[:, None], axis=-1)[:, 0] - total
        logprobs = scores - total[:, None] if with_distribution else None
        return token, chosen, scored.bad(), total == -jnp.inf, logprobs

    token, chosen, bad, none, distribution = jax.lax.cond(
        sampling.all_greedy(params, skip=state.done), greedy, sampled)
    if state.constraint is not None:  # a NaN the mask hid is still the model's failure
        bad = bad | sampling.bad_logits(state.logits)
    return token, chosen, bad, none, distribution


def _sample_and_record(state: DecodeState) -> DecodeState:
    """Sample each running row's next token from ``state.logits`` (``_choose``) and record it,
    with the counts the penalties read."""
    B, S = state.tokens.shape
    N = state.max_new_tokens
    running = ~state.done
    with_distribution = bool(state.top_logprobs.shape[-1] or state.entropy.shape[-1])
    token, chosen, bad_logits, no_token, logprobs = _choose(state, with_distribution)
    write = running & ~bad_logits & ~no_token

    rows = jnp.arange(B)
    slot = jnp.where(write, state.lengths, S)  # out of range: dropped
    out = jnp.where(write, state.num_generated, N)
    tokens = state.tokens.at[rows, slot].set(token, mode="drop")
    record = state.recorded((rows, out), chosen, lambda: logprobs)

    record.update(state.history_after(tokens, token[:, None], write.astype(jnp.int32))
                  .carried_fields)
    record.update(state.moved(chosen[:, None], write.astype(jnp.int32)))

    lengths = state.lengths + write.astype(jnp.int32)
    record.update(state.advanced(token, write))
    at_end = (lengths - state.prompt_lengths >= state.budgets) | (lengths >= S)
    code = jnp.select(
        [bad_logits, no_token, state.eos_mask[token],
         state.ends_with_stop(tokens, lengths[:, None])[:, 0], at_end],
        [BAD_LOGITS, NO_ALLOWED_TOKEN, EOS, STOP,
         jnp.where(state.replace(**record).incomplete(), INCOMPLETE, LENGTH)],
        RUNNING,
    )
    finish = jnp.where(running, code, state.finish)
    return state.replace(step=state.step + 1, tokens=tokens, lengths=lengths, finish=finish,
                         **record)


def step(model: nnx.Module, state: DecodeState) -> DecodeState:
    """One round of the decode loop (also the serving engine's): sample and record each running
    row's next token, then feed it for the next scores (``state.scoring``: with CFG to both
    streams, in one model call).

    Rows that have stopped are fed too (the batch is static) but their cache does not advance.
    """
    state = _sample_and_record(state)
    last = jnp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    scoring = state.scoring
    exits, cache = scoring.read(model, scoring.doubled(last), state.cache,
                                scoring.doubled((~state.done).astype(jnp.int32)))
    return state.replace(cache=cache, logits=scoring.scores(*exits, state.constrained))


def prefill(weights, block, rows: RowInputs, cache: Cache, *, graphdef, outputs: OutputSpec,
            samples=None, scoring: Scoring = Scoring()) -> DecodeState:
    """Run the padded prompt block ``[B, T]`` through the model: the state before the first step.
    ``cache``: B rows to write over from length 0, whatever they hold (a new cache or a spare:
    ``decode.caches``); its slots are the state's ``max_len``. With ``samples`` (``[R]`` int32,
    the block row each state row continues: n samples per prompt) the block is read once and
    state row r starts from copies of block row ``samples[r]``'s cache rows and logits; ``rows``
    are then the R state rows' values. ``scoring`` rides in the state (``scoring``); with CFG,
    its negative prompts' block ``[B, T]`` is read in the same call as the unconditional rows
    B..2B-1 of a cache of 2B rows, and left out of the state."""
    model = nnx.merge(graphdef, weights)
    cache, max_len = cache.rewind(0), cache.max_len
    lengths = rows.prompt_lengths
    if samples is not None:  # each block row's length; a padding row no state row takes: 1
        lengths = jnp.ones((block.shape[0],), jnp.int32).at[samples].max(lengths)
    both, index, negatives = block, samples, scoring.negatives
    if negatives is not None:  # the unconditional rows follow the conditional ones
        both = jnp.concatenate([block, negatives[0]])
        lengths = jnp.concatenate([lengths, negatives[1]])
        index = None if samples is None else jnp.concatenate([samples, samples + block.shape[0]])
    # A fresh cache: the block attends to itself, not to the cache's capacity.
    exits, cache = scoring.read(model, both, cache, lengths, lengths - 1, reach=block.shape[1])
    if samples is not None:
        block, cache = block[samples], cache.take_rows(index)
        exits = jax.tree.map(lambda x: x[index], exits)
    scoring = scoring.replace(negatives=None)
    state = DecodeState.start(block, rows, max_len, outputs, cache=cache, logits=exits[0],
                              scoring=scoring)
    return state.replace(logits=scoring.scores(*exits, state.constrained)).counted()


# The cache is donated and written over in place; with n samples per prompt the state's cache
# rows are copies of the given cache's (``take_rows``), so that program reads it without donation.
prefill_copies = jax.jit(prefill, static_argnames=("graphdef", "outputs"))
prefill = jax.jit(prefill, static_argnames=("graphdef", "outputs"), donate_argnames=("cache",))


def _body(weights, state: DecodeState, *, graphdef) -> DecodeState:
    return step(nnx.merge(graphdef, weights), state)


DECODE_LOOP = CompiledLoop("_decode", _body, lambda weights, state: state.running(),
                           static_argnames=("graphdef",))


# --- Entry points ---------------------------------------------------------------------------------


def generate(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    max_new_tokens: int,
    seed: int | Sequence[int] = 0,
    *,
    n: int = 1,
    kv_cache: str | None = None,
    options: DecodeOptions = DecodeOptions(),
) -> GenerateOutput:
    """Continue each prompt by up to ``max_new_tokens`` tokens, ``n`` times.

    Args:
      model: a ``Transformer`` (or any module with its call signature and a ``config``).
      prompts: one list of token ids per request, of any lengths.
      params: ``SamplingParams``; each field a scalar or one value per prompt.
      max_new_tokens: the output budget per row; clamped to ``max_len`` minus the shortest
        prompt (no row can generate more), which sets the output's column count. A value
        within a bucket (``request``: 1..8, 9..16, 17..32, ...) compiles nothing new.
      seed: one int per prompt (its output then depends only on its own prompt, parameters and
        seed), or one int s: row r draws from ``fold_in(key(s), r)``.
      n: samples per prompt (>= 1), from one prefill of each prompt (``samples``). Sample 0 is
        the ``n=1`` output for the same seed; sample i > 0 draws from its own stream, folded
        from the prompt's key and i. With n > 1 every output array is ``[P, n, ...]`` and
        ``finish_reason`` one list of n per prompt; greedy samples are all the same.
      kv_cache: None (a float cache), "int8" (``cache.QuantizedKVCache``: a scale per token
        and kv head) or "int4" (``cache.KiviKVCache``, KIVI's layout: keys per channel over
        groups of 32 slots, values per token, the newest group in float); a ``cache.Kivi``
        sets int4's group size, float residual and rewind depth.
      options: a ``DecodeOptions``, the rarer arguments:
        max_len: cache slots per row (prompt + output). Default: the prompt bucket plus the
          bucket of ``max_new_tokens``, at most the model's position table if it has one.
        eos_ids: ids that end a row (finish reason "eos"); ``min_new_tokens`` suppresses them.
        stop_sequences: token-id sequences that end a row when its output ends with one
          ("stop").
        stop_strings: strings that end a row when its decoded output contains one ("stop");
          needs ``tokenizer``. The output is cut after the token that completes the string.
        return_top_logprobs: n > 0 also returns the n largest log-probabilities of each step's
          sampling distribution and their ids.
        return_entropy: also return the entropy of each step's sampling distribution.
        python_loop: run the decode steps from Python (same step function, same tokens).
        raise_on_error: raise ValueError if a row hit NaN / +inf logits or a distribution with
          no allowed token; with False such rows just finish with reason "error".
        tokenizer: also what ``params.regex`` / ``json_schema`` are compiled over (with
          ``eos_ids``, allowed exactly where a pattern is complete).
        guidance_scale, negative_prompts: classifier-free guidance (``guide``, ``scoring``):
          each row is also decoded from its negative prompt, in the same model calls, and
          samples from ``log_softmax(u) + g * (log_softmax(c) - log_softmax(u))``; a scale of
          1 is plain decoding, 0 decoding from the negative prompt.
        dola_layers: DoLa (``guide``, ``scoring``): "low", "high" or layer indices whose
          early exits the final layer is contrasted with (a ``Transformer`` only).

    Raises ValueError before anything is allocated when the cache and buffers need more than the
    memory limit (``checks.check_memory``).
    """
    check_model("model", model)
    check_kind("kv_cache", kv_cache)
    V = model.config.vocab_size
    request = with_samples(check_request(V, prompts, params, max_new_tokens, seed, options), n)
    rows, n, data = request.rows, request.samples, data_size(model)
    guide, limit = request.guide, position_limit(model)
    layers = guide.layers(model)
    sized = guide.shape_rows(rows, options.max_len, limit)  # with CFG, negative prompts too
    shapes = sample_shapes(batch_shapes(sized, request.max_new_tokens, options.max_len, limit,
                                        data), n, data)
    S = shapes.max_len
    T = prompt_width(sized, S)
    buffers = decode_buffers(model.config, shapes.padded_rows, S, shapes.width, T, request.top_n,
                             request.with_entropy)
    buffers.update(guide.buffers(model.config, shapes.padded_rows, S, T, layers))
    check_memory("generate", buffers, {"len(prompts)": len(rows), **({"n": n} if n > 1 else {}),
                                       "max_new_tokens": shapes.columns, "max_len": S})
    block, _, lengths, samples = sample_block(request, shapes, data)
    block, inputs, scoring = guide.prefill_inputs(  # row checks come before the first trace
        block, request.row_inputs(lengths, V, shapes), shapes, n, layers)
    graphdef, weights = split(model)
    cache = start_cache(model, weights, graphdef, block.shape[0] * scoring.streams, S, kv_cache)
    state = (prefill if samples is None else prefill_copies)(
        weights, block, inputs, cache, graphdef=graphdef, outputs=request.outputs(shapes),
        samples=samples, scoring=scoring)
    state = DECODE_LOOP.run(weights, state, python_loop=request.python_loop, graphdef=graphdef)
    out = host_output(state, shapes)
    keep_cache(model, state.cache, S, kv_cache, state.finish)
    return grouped(finish_output(out, state.finish, request), n)


def greedy(model: nnx.Module, prompts: Sequence[Sequence[int]],
           max_new_tokens: int) -> list[list[int]]:
    """The argmax continuation of each prompt, ``max_new_tokens`` tokens (fewer only where the
    row reaches the position table), with no stop condition."""
    out = generate(model, prompts, SamplingParams.greedy(), max_new_tokens, seed=0)
    return out.token_lists()
