"""generate(): ragged prompts -> one jit-compiled prefill -> one ``lax.while_loop`` of decode steps.

Conventions (every caller relies on them):

- A row's sequence is its prompt then its output; ``DecodeState.tokens[b, j]`` is position j.
  The prefill leaves the logits for each row's next token in the state; one step samples from
  them, records the token, and feeds it to the model for the next logits. So sampling is
  compiled once, in the loop, and the cache holds every token of a running row.
- Prompts are padded to a power-of-two block (``request.bucket_length``) for one prefill; a row's
  cache advances by its own prompt length only, so padding is never attended. Every other varying
  input (sampling parameters, seeds, prompt lengths within a bucket) is an array value, so the
  programs compile once per (batch size, prompt bucket, ``max_new_tokens``, ``max_len``, number
  and width of stop sequences, output options).
- What sampling runs is the static ``sampling.Plan`` of the parameters (in ``RowParams``): the
  processors no row enables are not in the program, greedy is an argmax, and the counts the
  penalties read are carried in the state and updated by each sampled token. A sweep over values
  compiles once; a new set of enabled processors compiles once more.
- The token at position p of row b is drawn with ``fold_in(request key b, p)``
  (``sampling.row_keys``; the request keys come from the seeds, see ``request``).
- A row stops at the first of: an EOS id ("eos"), the end of a stop sequence ("stop"),
  ``max_new_tokens`` generated or ``max_len`` tokens in the row ("length"), or logits that hold
  NaN / +inf or leave no allowed token ("error"; nothing is sampled from them). The finishing
  EOS or stop sequence is part of the output. The finish codes are ``request``'s table.
- The loop ends when every row has stopped; rows that stopped earlier are carried along
  without advancing their cache. ``DECODE_LOOP`` runs it compiled or, with ``python_loop``, as
  its Python twin (same step, same tokens).

Validation of the arguments and the output dataclass live in ``request``, shared with beam search,
speculative decoding and the serving engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from decodelab import sampling
from decodelab.cache import quantized as kvquant
from decodelab.cache.dense import KVCache
from decodelab.checks import check_bool, check_memory, check_model, position_limit
from decodelab.decode.loop import CompiledLoop
from decodelab.decode.request import (BAD_LOGITS, EOS, LENGTH, NO_ALLOWED_TOKEN, PAD_TOKEN, RUNNING,
                                      STOP, GenerateOutput, bucket_length, check_request,
                                      clamp_new_tokens, decode_buffers, finish_output, host_output,
                                      prompt_block, resolve_max_len)
from decodelab.sampling.params import SamplingParams
from decodelab.sampling.processors import RowParams

# --- The loop -------------------------------------------------------------------------------------


@struct.dataclass(kw_only=True)
class DecodeState:
    """Everything the decode loop carries; the loop is a pure function of it."""

    step: jax.Array  # [] int32, sampling rounds so far (= output length of a still-running row)
    tokens: jax.Array  # [B, S] int32, prompt then output; slot j = position j
    prompt_lengths: jax.Array  # [B] int32
    lengths: jax.Array  # [B] int32, prompt + output tokens so far
    finish: jax.Array  # [B] int32, RUNNING or a finish code
    cache: KVCache  # lengths = self.lengths for running rows
    logits: jax.Array  # [B, V] float32, the model's logits for each row's next token
    keys: jax.Array  # [B, ...] uint32, each request's key data (request.request_keys)
    params: RowParams  # [B] per field
    eos_mask: jax.Array  # [V] bool
    stop_ids: jax.Array  # [M, W] or per row [B, M, W] int32, each sequence right-aligned, -1 before
    budgets: jax.Array  # [B] int32, output tokens a row may generate (<= max_new_tokens)
    logprobs: jax.Array  # [B, N] float32, of each output token under its sampling distribution
    top_logprobs: jax.Array  # [B, N, n] float32 (n = 0 unless requested)
    top_ids: jax.Array  # [B, N, n] int32
    entropy: jax.Array  # [B, N] float32 in nats, or [B, 0] unless requested
    # Carried only when the plan has a penalty that reads them (else None: see `carried_counts`).
    output_counts: jax.Array | None = None  # [B, V] int32, occurrences in the output
    seen: jax.Array | None = None  # [B, V] bool, occurs in the prompt or the output

    @property
    def done(self) -> jax.Array:  # [B] bool
        return self.finish != RUNNING

    @property
    def num_generated(self) -> jax.Array:  # [B] int32
        return self.lengths - self.prompt_lengths

    @property
    def max_new_tokens(self) -> int:
        return self.logprobs.shape[1]

    @property
    def history(self) -> sampling.History:
        return sampling.History(tokens=self.tokens, prompt_lengths=self.prompt_lengths,
                                lengths=self.lengths, eos_mask=self.eos_mask,
                                output_counts=self.output_counts, seen=self.seen)


def carried_counts(history: sampling.History, plan: sampling.Plan,
                   vocab_size: int) -> dict[str, jax.Array | None]:
    """The counts a loop under ``plan`` carries, from ``history``: output occurrences when
    frequency or presence penalties are on, the seen tokens when the repetition penalty is;
    None for the others (and for every field under ``Plan.ANY``)."""
    output = plan.carries("frequency_penalty") or plan.carries("presence_penalty")
    return dict(
        output_counts=history.output_occurrences(vocab_size) if output else None,
        seen=history.seen_tokens(vocab_size) if plan.carries("repetition_penalty") else None)


def ends_with_stop(state: DecodeState, lengths: jax.Array) -> jax.Array:
    """``[B]`` bool: the output of row b (up to ``lengths[b]``) ends with a stop sequence."""
    M, W = state.stop_ids.shape[-2:]
    B, S = state.tokens.shape
    if M == 0:
        return jnp.zeros((B,), bool)
    stop_ids = jnp.broadcast_to(state.stop_ids, (B, M, W))  # shared or per row
    index = lengths[:, None] - W + jnp.arange(W, dtype=jnp.int32)[None, :]  # [B, W]
    window = jnp.take_along_axis(state.tokens, jnp.clip(index, 0, S - 1), axis=1)  # [B, W]
    padding = stop_ids < 0  # [B, M, W]
    equal = (window[:, None, :] == stop_ids) | padding  # [B, M, W]
    width = jnp.sum(~padding, axis=-1)  # [B, M]; 0: an unused row of a per-row block
    within_output = (width > 0) & (width <= (lengths - state.prompt_lengths)[:, None])
    return jnp.any(jnp.all(equal, axis=-1) & within_output, axis=-1)


def _sample_and_record(state: DecodeState) -> DecodeState:
    """Sample each running row's next token from ``state.logits`` and record it.

    What runs depends on ``state.params.plan``: a greedy plan is the argmax of the scores before
    temperature (``sampling.greedy_scores``), whose processed distribution is that one token with
    log-probability 0, so no softmax and no random numbers; otherwise the processed distribution
    is formed and sampled."""
    B, S = state.tokens.shape
    N = state.max_new_tokens
    running = ~state.done
    logits = state.logits
    plan = state.params.plan
    vocab = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, :]  # [1, V]
    if plan.greedy:
        scores = sampling.greedy_scores(logits, state.params, state.history)  # [B, V]
        best = jnp.max(scores, axis=-1)  # [B]; NaN if the row holds NaN
        token = sampling.argmax(scores)
        if len(sampling.planned(plan)) == 1:  # temperature alone: the scores are the logits
            bad_logits = jnp.isnan(best) | (best == jnp.inf)
        else:  # a ban may have hidden a NaN
            bad_logits = jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1)
        no_token = best == -jnp.inf
        chosen = jnp.zeros((B,), jnp.float32)
        distribution = lambda: jnp.where(vocab == token[:, None], 0.0, -jnp.inf)  # noqa: E731
    else:
        logprobs = sampling.processed_logprobs(logits, state.params, state.history)  # [B, V]
        bad_logits = jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1)
        no_token = ~jnp.any(logprobs > -jnp.inf, axis=-1)
        keys = sampling.row_keys(state.keys, state.lengths)
        # A finished row's token is discarded: it never forces the vocabulary-wide draw.
        sample = lambda: sampling.draw(logprobs, state.params, keys, skip=state.done)  # noqa: E731
        if plan.active is None:
            # A greedy row's distribution is one token, so argmax draws it too; when every row is
            # greedy this skips generating B x V random numbers per step.
            token = jax.lax.cond(jnp.all(state.params.temperature == 0.0),
                                 lambda: sampling.argmax(logprobs), sample)  # [B]
        else:
            token = sample()  # [B]
        chosen = jnp.take_along_axis(logprobs, token[:, None], axis=-1)[:, 0]
        distribution = lambda: logprobs  # noqa: E731
    write = running & ~bad_logits & ~no_token

    rows = jnp.arange(B)
    slot = jnp.where(write, state.lengths, S)  # out of range: dropped
    out = jnp.where(write, state.num_generated, N)
    tokens = state.tokens.at[rows, slot].set(token, mode="drop")
    record = dict(logprobs=state.logprobs.at[rows, out].set(chosen, mode="drop"))
    if state.top_logprobs.shape[-1] or state.entropy.shape[-1]:
        logprobs = distribution()  # [B, V], the processed distribution
    if state.top_logprobs.shape[-1]:
        top, ids = jax.lax.top_k(logprobs, state.top_logprobs.shape[-1])  # [B, n]
        record.update(top_logprobs=state.top_logprobs.at[rows, out].set(top, mode="drop"),
                      top_ids=state.top_ids.at[rows, out].set(ids.astype(jnp.int32), mode="drop"))
    if state.entropy.shape[-1]:
        p = jnp.exp(logprobs)
        entropy = -jnp.sum(jnp.where(p > 0, p * logprobs, 0.0), axis=-1)
        record.update(entropy=state.entropy.at[rows, out].set(entropy, mode="drop"))

    counted = jnp.where(write, token, logits.shape[-1])  # out of range: dropped
    if state.output_counts is not None:
        record.update(output_counts=state.output_counts.at[rows, counted].add(1, mode="drop"))
    if state.seen is not None:
        record.update(seen=state.seen.at[rows, counted].set(True, mode="drop"))

    lengths = state.lengths + write.astype(jnp.int32)
    state = state.replace(tokens=tokens, **record)
    code = jnp.select(
        [bad_logits, no_token, state.eos_mask[token], ends_with_stop(state, lengths),
         (lengths - state.prompt_lengths >= state.budgets) | (lengths >= S)],
        [BAD_LOGITS, NO_ALLOWED_TOKEN, EOS, STOP, LENGTH],
        RUNNING,
    )
    finish = jnp.where(running, code, state.finish)
    return state.replace(step=state.step + 1, lengths=lengths, finish=finish)


def step(model: nnx.Module, state: DecodeState) -> DecodeState:
    """One round of the decode loop (also the serving engine's): sample and record each running
    row's next token, then feed it for the next logits.

    Rows that have stopped are fed too (the batch is static) but their cache does not advance.
    """
    state = _sample_and_record(state)
    last = jnp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    logits, cache = model(last, cache=state.cache, num_valid=(~state.done).astype(jnp.int32))
    return state.replace(cache=cache, logits=logits[:, 0])


def running(state: DecodeState) -> jax.Array:
    """``[]`` bool: some row runs and the step budget is not spent."""
    return jnp.any(~state.done) & (state.step < state.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_len", "max_new_tokens", "top_n",
                                             "with_entropy", "kv_cache"))
def prefill(weights, block, prompt_lengths, keys, params, eos_mask, stop_ids, *, graphdef,
            max_len, max_new_tokens, top_n, with_entropy, kv_cache=None) -> DecodeState:
    """Run the padded prompt block ``[B, T]`` through the model: the state before the first step
    (also the serving engine's prefill of one request)."""
    model = nnx.merge(graphdef, weights)
    B, T = block.shape
    N = max_new_tokens
    cache = kvquant.init_cache(model.config, B, max_len, kv_cache)
    logits, cache = model(block, cache=cache, num_valid=prompt_lengths)  # [B, T, V]
    last = jnp.take_along_axis(logits, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    state = DecodeState(
        step=jnp.zeros((), jnp.int32),
        tokens=jnp.zeros((B, max_len), jnp.int32).at[:, :T].set(block),
        prompt_lengths=prompt_lengths,
        lengths=prompt_lengths,
        finish=jnp.full((B,), RUNNING, jnp.int32),
        cache=cache,
        logits=last,
        keys=keys,
        params=params,
        eos_mask=eos_mask,
        stop_ids=stop_ids,
        budgets=jnp.full((B,), N, jnp.int32),
        logprobs=jnp.full((B, N), jnp.nan, jnp.float32),
        top_logprobs=jnp.full((B, N, top_n), jnp.nan, jnp.float32),
        top_ids=jnp.full((B, N, top_n), PAD_TOKEN, jnp.int32),
        entropy=jnp.full((B, N if with_entropy else 0), jnp.nan, jnp.float32),
    )
    return state.replace(**carried_counts(state.history, params.plan, model.config.vocab_size))


def _body(weights, state: DecodeState, *, graphdef) -> DecodeState:
    return step(nnx.merge(graphdef, weights), state)


DECODE_LOOP = CompiledLoop("_decode", _body, lambda weights, state: running(state),
                           static_argnames=("graphdef",))


# --- Entry points ---------------------------------------------------------------------------------


def generate(
    model: nnx.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    max_new_tokens: int,
    seed: int | Sequence[int] = 0,
    *,
    eos_ids: int | Sequence[int] = (),
    stop_sequences: Sequence[Sequence[int]] = (),
    stop_strings: Sequence[str] = (),
    tokenizer: Any = None,
    return_top_logprobs: int = 0,
    return_entropy: bool = False,
    max_len: int | None = None,
    python_loop: bool = False,
    raise_on_error: bool = True,
    kv_cache: str | None = None,
) -> GenerateOutput:
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Args:
      model: a ``Transformer`` (or any module with its call signature and a ``config``).
      prompts: one list of token ids per request, of any lengths.
      params: ``SamplingParams``; each field a scalar or one value per prompt.
      max_new_tokens: the output budget per row; clamped to ``max_len`` minus the shortest
        prompt (no row can generate more), which sets the output's column count.
      seed: one int per prompt (its output then depends only on its own prompt, parameters and
        seed), or one int s: row r draws from ``fold_in(key(s), r)``.
      eos_ids: ids that end a row (finish reason "eos"); ``min_new_tokens`` suppresses them.
      stop_sequences: token-id sequences that end a row when its output ends with one ("stop").
      stop_strings: strings that end a row when its decoded output contains one ("stop"); needs
        ``tokenizer``. The output is cut after the token that completes the string.
      return_top_logprobs: n > 0 also returns the n largest log-probabilities of each step's
        sampling distribution and their ids.
      return_entropy: also return the entropy of each step's sampling distribution.
      max_len: cache slots per row (prompt + output). Default: the prompt bucket plus
        ``max_new_tokens``, at most the model's position table if it has one.
      python_loop: run the decode steps from Python (same step function, same tokens).
      raise_on_error: raise ValueError if a row hit NaN / +inf logits or a distribution with no
        allowed token; with False such rows just finish with reason "error".
      kv_cache: None (a float cache), "int8" (``kvquant.QuantizedKVCache``: a scale per token
        and kv head) or "int4" (``kvquant.KiviKVCache``, KIVI's layout: keys per channel over
        groups of 32 slots, values per token, the newest group in float); a ``kvquant.Kivi``
        sets int4's group size, float residual and rewind depth.

    Raises ValueError before anything is allocated when the cache and buffers need more than the
    memory limit (``checks.check_memory``).
    """
    check_model("model", model)
    kvquant.check_kind("kv_cache", kv_cache)
    for name, flag in (("python_loop", python_loop), ("raise_on_error", raise_on_error)):
        check_bool(name, flag)
    request = check_request(model.config.vocab_size, prompts, params, max_new_tokens, seed,
                            eos_ids=eos_ids, stop_sequences=stop_sequences,
                            stop_strings=stop_strings, tokenizer=tokenizer,
                            return_top_logprobs=return_top_logprobs, return_entropy=return_entropy)
    rows, N = request.rows, request.max_new_tokens
    longest = max(len(r) for r in rows)
    S = resolve_max_len(max_len, rows, bucket_length(longest) + N, position_limit(model))
    N = clamp_new_tokens(N, rows, S)
    buffers = decode_buffers(model.config, len(rows), S, N, min(bucket_length(longest), S),
                             request.top_n, return_entropy)
    check_memory("generate", buffers, {"len(prompts)": len(rows), "max_new_tokens": N,
                                       "max_len": S})
    block, lengths = prompt_block(rows, S)
    row_params = params.per_row(len(rows), model.config.vocab_size)
    graphdef, weights = nnx.split(model)
    state = prefill(weights, block, lengths, request.keys(), row_params, request.eos_mask,
                    request.stop_block, graphdef=graphdef, max_len=S, max_new_tokens=N,
                    top_n=request.top_n, with_entropy=return_entropy, kv_cache=kv_cache)
    state = DECODE_LOOP.run(weights, state, python_loop=python_loop, graphdef=graphdef)
    out = host_output(state, request.top_n, return_entropy)
    return finish_output(out, np.asarray(state.finish), request, tokenizer, raise_on_error)


def greedy(model: nnx.Module, prompts: Sequence[Sequence[int]],
           max_new_tokens: int) -> list[list[int]]:
    """The argmax continuation of each prompt, ``max_new_tokens`` tokens (fewer only where the
    row reaches the position table), with no stop condition."""
    out = generate(model, prompts, SamplingParams.greedy(), max_new_tokens, seed=0)
    return out.token_lists()
