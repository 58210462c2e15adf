"""generate(): ragged prompts -> one jit-compiled prefill -> one ``lax.while_loop`` of decode steps.

Conventions (every caller relies on them):

- A row's sequence is its prompt then its output; ``DecodeState.tokens[b, j]`` is position j.
  The prefill leaves the logits for each row's next token in the state; one step samples from
  them, records the token, and feeds it to the model for the next logits. So sampling is
  compiled once, in the loop, and the cache holds every token of a running row.
- Prompts are padded to a power-of-two block (``bucket_length``) for one prefill; a row's cache
  advances by its own prompt length only, so padding is never attended. Every other varying
  input (sampling parameters, seeds, prompt lengths within a bucket) is an array value, so the
  programs compile once per (batch size, prompt bucket, ``max_new_tokens``, ``max_len``, number
  and width of stop sequences, output options).
- The token at position p of request r is drawn with ``fold_in(key(seed_r), p)``
  (``sampling.row_keys``): a request's output does not depend on its batch-mates or its row.
- A row stops at the first of: an EOS id ("eos"), the end of a stop sequence ("stop"),
  ``max_new_tokens`` generated or ``max_len`` tokens in the row ("length"), or logits that hold
  NaN / +inf or leave no allowed token ("error"; nothing is sampled from them). The finishing
  EOS or stop sequence is part of the output.
- The loop ends when every row has stopped; rows that stopped earlier are carried along
  without advancing their cache.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from decodelab import sampling
from decodelab import kvquant
from decodelab.cache import KVCache
from decodelab.sampling import RowParams, SamplingParams

# DecodeState.finish codes. Both error codes are reported as finish reason "error".
RUNNING, EOS, STOP, LENGTH, BAD_LOGITS, NO_ALLOWED_TOKEN = range(6)
FINISH_REASONS = ("running", "eos", "stop", "length", "error", "error")

PAD_TOKEN = -1  # GenerateOutput.tokens past a row's length


def bucket_length(n: int, minimum: int = 16) -> int:
    """The power of two >= max(n, minimum): prompt blocks are padded to it so new prompt lengths
    reuse a compiled program."""
    return max(minimum, 1 << (int(n) - 1).bit_length())


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
    seeds: jax.Array  # [B] uint32, one per request
    params: RowParams  # [B] per field
    eos_mask: jax.Array  # [V] bool
    stop_ids: jax.Array  # [M, W] or per row [B, M, W] int32, each sequence right-aligned, -1 before
    budgets: jax.Array  # [B] int32, output tokens a row may generate (<= max_new_tokens)
    logprobs: jax.Array  # [B, N] float32, of each output token under its sampling distribution
    top_logprobs: jax.Array  # [B, N, n] float32 (n = 0 unless requested)
    top_ids: jax.Array  # [B, N, n] int32
    entropy: jax.Array  # [B, N] float32 in nats, or [B, 0] unless requested

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
                                lengths=self.lengths, eos_mask=self.eos_mask)


def _ends_with_stop(state: DecodeState, lengths: jax.Array) -> jax.Array:
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
    """Sample each running row's next token from ``state.logits`` and record it."""
    B, S = state.tokens.shape
    N = state.max_new_tokens
    running = ~state.done
    logits = state.logits
    logprobs = sampling.processed_logprobs(logits, state.params, state.history)  # [B, V]
    bad_logits = jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1)
    no_token = ~jnp.any(logprobs > -jnp.inf, axis=-1)
    # A greedy row's distribution is one token, so argmax draws it too; when every row is greedy
    # this skips generating B x V random numbers per step.
    token = jax.lax.cond(
        jnp.all(state.params.temperature == 0.0),
        lambda: sampling.argmax(logprobs),
        lambda: sampling.sample_tokens(logprobs, sampling.row_keys(state.seeds, state.lengths)),
    )  # [B]
    write = running & ~bad_logits & ~no_token

    rows = jnp.arange(B)
    slot = jnp.where(write, state.lengths, S)  # out of range: dropped
    out = jnp.where(write, state.num_generated, N)
    tokens = state.tokens.at[rows, slot].set(token, mode="drop")
    chosen = jnp.take_along_axis(logprobs, token[:, None], axis=-1)[:, 0]
    record = dict(logprobs=state.logprobs.at[rows, out].set(chosen, mode="drop"))
    if state.top_logprobs.shape[-1]:
        top, ids = jax.lax.top_k(logprobs, state.top_logprobs.shape[-1])  # [B, n]
        record.update(top_logprobs=state.top_logprobs.at[rows, out].set(top, mode="drop"),
                      top_ids=state.top_ids.at[rows, out].set(ids.astype(jnp.int32), mode="drop"))
    if state.entropy.shape[-1]:
        p = jnp.exp(logprobs)
        entropy = -jnp.sum(jnp.where(p > 0, p * logprobs, 0.0), axis=-1)
        record.update(entropy=state.entropy.at[rows, out].set(entropy, mode="drop"))

    lengths = state.lengths + write.astype(jnp.int32)
    state = state.replace(tokens=tokens, **record)
    code = jnp.select(
        [bad_logits, no_token, state.eos_mask[token], _ends_with_stop(state, lengths),
         (lengths - state.prompt_lengths >= state.budgets) | (lengths >= S)],
        [BAD_LOGITS, NO_ALLOWED_TOKEN, EOS, STOP, LENGTH],
        RUNNING,
    )
    finish = jnp.where(running, code, state.finish)
    return state.replace(step=state.step + 1, lengths=lengths, finish=finish)


def _step(model: nnx.Module, state: DecodeState) -> DecodeState:
    """Sample and record each running row's next token, then feed it for the next logits.

    Rows that have stopped are fed too (the batch is static) but their cache does not advance.
    """
    state = _sample_and_record(state)
    last = jnp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    logits, cache = model(last, cache=state.cache, num_valid=(~state.done).astype(jnp.int32))
    return state.replace(cache=cache, logits=logits[:, 0])


def _running(state: DecodeState) -> jax.Array:
    return jnp.any(~state.done) & (state.step < state.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_len", "max_new_tokens", "top_n",
                                             "with_entropy", "kv_cache"))
def _prefill(weights, block, prompt_lengths, seeds, params, eos_mask, stop_ids, *, graphdef,
             max_len, max_new_tokens, top_n, with_entropy, kv_cache=None) -> DecodeState:
    """Run the padded prompt block ``[B, T]`` through the model: the state before the first step."""
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
        seeds=seeds,
        params=params,
        eos_mask=eos_mask,
        stop_ids=stop_ids,
        budgets=jnp.full((B,), N, jnp.int32),
        logprobs=jnp.full((B, N), jnp.nan, jnp.float32),
        top_logprobs=jnp.full((B, N, top_n), jnp.nan, jnp.float32),
        top_ids=jnp.full((B, N, top_n), PAD_TOKEN, jnp.int32),
        entropy=jnp.full((B, N if with_entropy else 0), jnp.nan, jnp.float32),
    )
    return state


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("state",))
def _decode_loop(weights, state: DecodeState, *, graphdef) -> DecodeState:
    """``while any row runs: state = step(state)``, compiled as one ``lax.while_loop``."""
    model = nnx.merge(graphdef, weights)
    return jax.lax.while_loop(_running, functools.partial(_step, model), state)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("state",))
def _decode_step(weights, state: DecodeState, *, graphdef) -> DecodeState:
    """One step, for the Python-loop twin of ``_decode_loop`` (debugging, streaming)."""
    return _step(nnx.merge(graphdef, weights), state)


# --- Output ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class GenerateOutput:
    """Per-row results of ``generate``; arrays are padded to ``max_new_tokens`` columns."""

    tokens: np.ndarray  # [B, N] int32, the output only; PAD_TOKEN past lengths[b]
    lengths: np.ndarray  # [B] int32, output tokens per row
    finish_reason: list[str]  # per row: "eos" | "stop" | "length" | "error"
    logprobs: np.ndarray  # [B, N] float32, of each token under the distribution it was drawn from
    top_logprobs: np.ndarray | None  # [B, N, n] float32, that distribution's n largest, descending
    top_ids: np.ndarray | None  # [B, N, n] int32, their ids (arbitrary where the logprob is -inf)
    entropy: np.ndarray | None  # [B, N] float32, that distribution's entropy in nats

    def token_lists(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


def _output(state: DecodeState, top_n: int, with_entropy: bool) -> GenerateOutput:
    """The host-side output of a finished loop state (a DecodeState, or any state with its output
    fields: ``speculative.SpecState``). Only the output fields come to the host, never the cache."""
    (tokens, prompt_lengths, lengths, finish, logprobs, top_logprobs, top_ids, entropy) = (
        jax.device_get((state.tokens, state.prompt_lengths, state.lengths, state.finish,
                        state.logprobs, state.top_logprobs, state.top_ids, state.entropy)))
    N = logprobs.shape[1]
    generated = (lengths - prompt_lengths).astype(np.int32)
    index = np.minimum(prompt_lengths[:, None] + np.arange(N)[None, :], tokens.shape[1] - 1)
    valid = np.arange(N)[None, :] < generated[:, None]
    return GenerateOutput(
        tokens=np.where(valid, np.take_along_axis(tokens, index, axis=1), PAD_TOKEN),
        lengths=generated,
        finish_reason=[FINISH_REASONS[c] for c in finish],
        logprobs=logprobs,
        top_logprobs=top_logprobs if top_n else None,
        top_ids=top_ids if top_n else None,
        entropy=entropy if with_entropy else None,
    )


def _cut_at_stop_strings(out: GenerateOutput, stop_strings: Sequence[str],
                         tokenizer: Any) -> GenerateOutput:
    """End each row at the first token whose text completes a stop string (finish reason "stop")."""
    tokens, lengths = out.tokens.copy(), out.lengths.copy()
    names = ("logprobs", "top_logprobs", "top_ids", "entropy")
    arrays = {name: getattr(out, name) for name in names}
    arrays = {name: (a.copy() if a is not None else None) for name, a in arrays.items()}
    reasons = list(out.finish_reason)
    for row, n in enumerate(out.lengths):
        ids = tokens[row, :n].tolist()
        if not any(s in tokenizer.decode(ids) for s in stop_strings):
            continue
        cut = next(k for k in range(1, n + 1)
                   if any(s in tokenizer.decode(ids[:k]) for s in stop_strings))
        lengths[row], reasons[row] = cut, "stop"
        tokens[row, cut:] = PAD_TOKEN
        for name, a in arrays.items():
            if a is not None:
                a[row, cut:] = PAD_TOKEN if name == "top_ids" else np.nan
    return dataclasses.replace(out, tokens=tokens, lengths=lengths, finish_reason=reasons, **arrays)


# --- Input checks ---------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _id_list(name: str, ids: Any, vocab_size: int) -> np.ndarray:
    """``ids`` as a non-empty 1-D int32 array of token ids, or a ValueError naming ``name``."""
    if isinstance(ids, (str, bytes)) or isinstance(ids, jax.core.Tracer):
        raise ValueError(f"{name} must be a list of token ids, got {ids!r}")
    try:
        array = np.asarray(ids)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of token ids, got {ids!r}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of token ids, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty; it needs at least one token")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold int token ids, got {ids!r}")
    bad = np.flatnonzero((array < 0) | (array >= vocab_size))
    if bad.size:
        raise ValueError(f"{name} holds token id {int(array[bad[0]])} at index {int(bad[0])}; "
                         f"ids must be in [0, {vocab_size})")
    return array.astype(np.int32)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_prompts(prompts: Any, vocab_size: int) -> list[np.ndarray]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; give at least one prompt (a list of token ids)")
    return [_id_list(f"prompts[{i}]", p, vocab_size) for i, p in enumerate(prompts)]


def _check_seeds(seed: Any, B: int) -> np.ndarray:
    limit = 2**32
    if _is_int(seed):
        if not 0 <= seed <= limit - B:
            raise ValueError(f"seed must be an int in [0, 2**32 - {B}] (prompt i gets seed + i), "
                             f"got {seed!r}")
        return (int(seed) + np.arange(B)).astype(np.uint32)
    if not isinstance(seed, (Sequence, np.ndarray)) or isinstance(seed, (str, bytes)):
        raise ValueError(f"seed must be an int or one int per prompt, got {seed!r}")
    if len(seed) != B:
        raise ValueError(f"seed has {len(seed)} values but there are {B} prompts; give one int or "
                         f"one per prompt")
    for i, s in enumerate(seed):
        if not _is_int(s) or not 0 <= s < limit:
            raise ValueError(f"seed[{i}] must be an int in [0, 2**32), got {s!r}")
    return np.asarray([int(s) for s in seed], np.uint64).astype(np.uint32)


def _check_eos(eos_ids: Any, vocab_size: int) -> np.ndarray:
    ids = [eos_ids] if _is_int(eos_ids) else eos_ids
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise ValueError(f"eos_ids must be an int or a list of ints, got {eos_ids!r}")
    mask = np.zeros((vocab_size,), bool)
    for i in ids:
        if not _is_int(i) or not 0 <= i < vocab_size:
            raise ValueError(f"eos_ids must be token ids in [0, {vocab_size}), got {i!r}")
        mask[i] = True
    return mask


def _check_stop_strings(stop_strings: Any, tokenizer: Any) -> list[str]:
    if isinstance(stop_strings, str) or not isinstance(stop_strings, Sequence):
        raise ValueError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r}")
    for s in stop_strings:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop_strings must be non-empty strings, got {s!r}")
    if stop_strings and not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode")):
        raise ValueError(f"stop_strings need a tokenizer with encode/decode, got "
                         f"tokenizer={tokenizer!r}")
    return list(stop_strings)


def _stop_block(sequences: list[np.ndarray]) -> np.ndarray:
    """Stop sequences right-aligned in an ``[M, W]`` block, -1 before each."""
    width = max((len(s) for s in sequences), default=1)
    block = np.full((len(sequences), width), -1, np.int32)
    for m, s in enumerate(sequences):
        block[m, width - len(s):] = s
    return block


def _check_bool(name: str, flag: Any) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be a bool, got {flag!r}")
    return flag


def check_model(name: str, model: Any) -> None:
    if not isinstance(model, nnx.Module) or not hasattr(model, "config"):
        raise ValueError(f"{name} must be an nnx.Module with a config, got {type(model).__name__}")


def position_limit(model: nnx.Module) -> int | None:
    """The model's position-table size (positions it can encode), or None if it has no table."""
    return getattr(getattr(model, "positions", None), "max_positions", None)


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated request: what ``generate`` and ``speculative_generate`` share."""

    rows: list[np.ndarray]  # one int32 prompt per row
    max_new_tokens: int
    seeds: np.ndarray  # [B] uint32
    params: SamplingParams  # validated; per_row(B, V) is left to the caller's last step
    eos_mask: np.ndarray  # [V] bool
    stop_block: np.ndarray  # [M, W] int32 (stop sequences, and stop strings' own tokenizations)
    stop_strings: list[str]
    top_n: int
    with_entropy: bool


def check_request(vocab_size: int, prompts: Any, params: Any, max_new_tokens: Any, seed: Any, *,
                  eos_ids: Any, stop_sequences: Any, stop_strings: Any, tokenizer: Any,
                  return_top_logprobs: Any, return_entropy: Any) -> Request:
    """Validate the arguments every decoding entry point takes; ValueError names the bad one.
    It converts nothing to JAX arrays (the caller's ``params.per_row``, its last step, does), so
    an entry point can check more and still reject bad input before anything is traced."""
    V = vocab_size
    rows = _check_prompts(prompts, V)
    B = len(rows)
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {params!r}")
    N = _check_int("max_new_tokens", max_new_tokens, 1)
    seeds = _check_seeds(seed, B)
    eos_mask = _check_eos(eos_ids, V)
    if isinstance(stop_sequences, (str, bytes)) or not isinstance(stop_sequences, Sequence):
        raise ValueError(f"stop_sequences must be a list of token-id lists, got {stop_sequences!r}")
    stops = [_id_list(f"stop_sequences[{i}]", s, V) for i, s in enumerate(stop_sequences)]
    strings = _check_stop_strings(stop_strings, tokenizer)
    top_n = _check_int("return_top_logprobs", return_top_logprobs, 0)
    if top_n > V:
        raise ValueError(f"return_top_logprobs must be <= the vocabulary size {V}, got {top_n}")
    _check_bool("return_entropy", return_entropy)
    # Stop strings also stop the loop early where their own tokenization shows up in the output.
    for s in strings:
        ids = list(tokenizer.encode(s))
        if ids and s in tokenizer.decode(ids):
            stops.append(_id_list(f"tokenizer.encode({s!r})", ids, V))
    return Request(rows=rows, max_new_tokens=N, seeds=seeds, params=params,
                   eos_mask=eos_mask, stop_block=_stop_block(stops), stop_strings=strings,
                   top_n=top_n, with_entropy=return_entropy)


def resolve_max_len(max_len: Any, rows: list[np.ndarray], default: int,
                    limit: int | None) -> int:
    """Cache slots per row: ``max_len``, or ``default`` capped by the position table ``limit``;
    every prompt must be shorter than it."""
    if max_len is None:
        S = min(default, limit) if limit else default
        source = "max_len (default: prompt bucket + max_new_tokens, capped by the position table)"
    else:
        S = _check_int("max_len", max_len, 2)
        source = "max_len"
        if limit and S > limit:
            raise ValueError(f"max_len must be <= {limit}, the model's position table "
                             f"(max_seq_len), got {S}")
    for i, r in enumerate(rows):
        if len(r) >= S:
            raise ValueError(f"prompts[{i}] has {len(r)} tokens but {source} is {S}; a prompt "
                             f"must be shorter than max_len to leave room for output")
    return S


def prompt_block(rows: list[np.ndarray], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The prompts left-aligned in a ``[B, T]`` block (T: the bucket of the longest, at most
    ``max_len``), zero-padded, and their lengths ``[B]``."""
    T = min(bucket_length(max(len(r) for r in rows)), max_len)
    block = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        block[i, :len(r)] = r
    return block, np.asarray([len(r) for r in rows], np.int32)


def finish_output(out: GenerateOutput, finish: np.ndarray, request: Request, tokenizer: Any,
                  raise_on_error: bool) -> GenerateOutput:
    """Raise for rows that failed (unless told not to), then cut rows at their stop strings."""
    errors = [i for i, c in enumerate(finish) if c in (BAD_LOGITS, NO_ALLOWED_TOKEN)]
    if errors and raise_on_error:
        causes = {BAD_LOGITS: "the model's logits hold NaN or +inf",
                  NO_ALLOWED_TOKEN: "no token has a finite probability (the sampling parameters "
                                    "or the model's logits exclude every token)"}
        detail = "; ".join(f"row {i} after {int(out.lengths[i])} tokens: {causes[int(finish[i])]}"
                           for i in errors)
        raise ValueError(f"generation failed, nothing was sampled from these rows: {detail} "
                         f"(raise_on_error=False returns the other rows)")
    if request.stop_strings:
        out = _cut_at_stop_strings(out, request.stop_strings, tokenizer)
    return out


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
      max_new_tokens: the output budget per row.
      seed: one int per prompt, or an int s meaning prompt i gets s + i.
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
      kv_cache: None (a float cache) or "int8" / "int4": keys and values stored quantized
        (``kvquant.QuantizedKVCache``).
    """
    check_model("model", model)
    kvquant.check_kind("kv_cache", kv_cache)
    for name, flag in (("python_loop", python_loop), ("raise_on_error", raise_on_error)):
        _check_bool(name, flag)
    request = check_request(model.config.vocab_size, prompts, params, max_new_tokens, seed,
                            eos_ids=eos_ids, stop_sequences=stop_sequences,
                            stop_strings=stop_strings, tokenizer=tokenizer,
                            return_top_logprobs=return_top_logprobs, return_entropy=return_entropy)
    rows, N = request.rows, request.max_new_tokens
    longest = max(len(r) for r in rows)
    S = resolve_max_len(max_len, rows, bucket_length(longest) + N, position_limit(model))
    block, lengths = prompt_block(rows, S)
    row_params = params.per_row(len(rows), model.config.vocab_size)
    graphdef, weights = nnx.split(model)
    state = _prefill(weights, block, lengths, request.seeds, row_params, request.eos_mask,
                     request.stop_block, graphdef=graphdef, max_len=S, max_new_tokens=N,
                     top_n=request.top_n, with_entropy=return_entropy, kv_cache=kv_cache)
    if python_loop:
        while bool(_running(state)):
            state = _decode_step(weights, state, graphdef=graphdef)
    else:
        state = _decode_loop(weights, state, graphdef=graphdef)
    out = _output(state, request.top_n, return_entropy)
    return finish_output(out, np.asarray(state.finish), request, tokenizer, raise_on_error)


def greedy(model: nnx.Module, prompts: Sequence[Sequence[int]],
           max_new_tokens: int) -> list[list[int]]:
    """The argmax continuation of each prompt, ``max_new_tokens`` tokens (fewer only where the
    row reaches the position table), with no stop condition."""
    out = generate(model, prompts, SamplingParams.greedy(), max_new_tokens, seed=0)
    return out.token_lists()
