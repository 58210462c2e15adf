"""The request layer every decoder shares: validating what a caller asked for.

Conventions (``generate``, ``beam_search``, ``speculative_generate`` and the serving engine rely
on them):

- ``check_request`` validates the arguments of a batch call and returns a ``BatchRequest``; it
  converts nothing to traced values, so an entry point can check more and still reject bad input
  before anything is compiled. Every size that ends up in an int32 array is checked against the
  int32 range. The rarer arguments come grouped: ``DecodeOptions`` (stops, extra outputs, how
  the loop runs) for ``generate`` and ``speculative_generate``, ``BeamOptions`` for beam search.
- Seeds: an int ``seed`` gives row r the key ``fold_in(key(seed), r)`` (``sampling.batch_keys``),
  so no (seed, row) pair shares a stream; a list gives each request its own ``key(seed_r)``
  (``sampling.seed_keys``), and then a request's output depends only on its own tokens,
  parameters and seed, never on its batch-mates or its row.
- Finish codes are one table (``FINISH_REASONS``) for every decoder and the engine. A row is
  ``RUNNING`` until it stops; both error codes are reported as finish reason "error";
  ``NO_HYPOTHESIS`` marks an empty slot of a beam's n-best list; ``INCOMPLETE`` ("incomplete")
  is a constrained row that ran out of budget (or cache) before its output matched its pattern.
- Constraints (``SamplingParams.regex`` / ``json_schema``) become one ``ConstraintTable`` and
  a start state per row here, in ``check_request``, only when some row has one: then
  ``RowInputs.constraint`` holds the table (data, not a static value: one program per table
  bucket, whatever the patterns); without one it is None and the programs are those of
  unconstrained decoding, with no table work at all. So a constrained batch compiles one
  program per table bucket beside the unconstrained one, rather than every batch carrying a
  free table: that would cost every unconstrained step a ``[B, V]`` mask for nothing.
- Sizes are bounded by what the model and the cache can use: ``max_new_tokens`` is clamped to
  the room ``max_len`` leaves after the shortest prompt (no row can generate more), and before
  anything is allocated the bytes of the cache and buffers are checked against the memory limit
  (``checks.check_memory``; ``decode_buffers`` lists them).
- What a loop records per output token is an ``OutputSpec`` (static: it sets the buffers'
  shapes), whose ``buffers`` are the one place the output buffers are built; the host-side
  output is ``output``'s.
- Prompts are padded to a power-of-two block (``bucket_length``) for one prefill, so a new prompt
  length within a bucket does not recompile; ``BatchRequest.row_inputs`` puts the per-row values
  on the device (``RowInputs``), as every loop state starts from them.
- Nor does a new batch size or ``max_new_tokens``: the compiled shapes are buckets (``Shapes``).
  The batch is padded to ``cache.bucket_rows`` rows (a power of two, then a multiple of the
  mesh's ``data`` axis: fewer than twice the rows asked for off a mesh) and the output buffers
  to ``output_width`` columns (a power of two >= 8, fewer than twice ``max_new_tokens`` past 8:
  a sweep of 1..64 touches 4 widths); the default ``max_len`` adds the buckets (prompt bucket
  plus output width), so it does not recompile either. Each row's budget stays an array value
  (``RowInputs.budgets``). A padding row has a one-token prompt, a budget of 0 and the last real
  row's parameters and key: it is born done, so it is never sampled, never advances its cache,
  and the output is cut back to the real rows and ``max_new_tokens`` columns. A row's tokens
  do not depend on the padding: its key and parameters are computed for the real batch first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab import sampling
from decodelab.cache import bucket_length
from decodelab.checks import (INT32_MAX, check_bool, check_memory, check_size, is_int,
                              kv_cache_bytes, nbytes, position_limit, token_ids, tokenizer_size)
from decodelab.decode.guide import Guide, check_guide
from decodelab.decode.shapes import (Shapes, batch_shapes, output_width, prompt_width,
                                    sample_shapes, take_rows)
from decodelab.sampling.constraint import ConstraintTable
from decodelab.sampling.params import SamplingParams
from decodelab.sharding import data_size
from decodelab.sampling.processors import RowParams

# Finish codes of a row (DecodeState.finish, SpecState.finish, BeamState.pool_reasons).
RUNNING, EOS, STOP, LENGTH, BAD_LOGITS, NO_ALLOWED_TOKEN, NO_HYPOTHESIS, INCOMPLETE = range(8)
FINISH_REASONS = ("running", "eos", "stop", "length", "error", "error", "none", "incomplete")

PAD_TOKEN = -1  # output token ids past a row's length


# --- Input checks ---------------------------------------------------------------------------------


def check_prompts(prompts: Any, vocab_size: int) -> list[np.ndarray]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; give at least one prompt (a list of token ids)")
    return [token_ids(f"prompts[{i}]", p, vocab_size) for i, p in enumerate(prompts)]


def check_seed(name: str, seed: Any) -> int:
    """One seed: an int in ``[0, 2**32)``."""
    if not is_int(seed) or not 0 <= seed < 2**32:
        raise ValueError(f"{name} must be an int in [0, 2**32), got {seed!r}")
    return int(seed)


def check_seeds(seed: Any, B: int) -> int | list[int]:
    """``seed`` as one int in ``[0, 2**32)`` or a list of ``B`` of them."""
    if is_int(seed):
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32 - 1] (row r of the batch draws "
                             f"from fold_in(key(seed), r)), got {seed!r}")
        return int(seed)
    if not isinstance(seed, (Sequence, np.ndarray)) or isinstance(seed, (str, bytes)):
        raise ValueError(f"seed must be an int or one int per prompt, got {seed!r}")
    if len(seed) != B:
        raise ValueError(f"seed has {len(seed)} values but there are {B} prompts; give one int or "
                         f"one per prompt")
    return [check_seed(f"seed[{i}]", s) for i, s in enumerate(seed)]


def request_keys(seeds: int | list[int], B: int) -> np.ndarray:
    """``[B, ...]`` uint32 key data of each row's request key (see the module docstring) for
    seeds checked by ``check_seeds``."""
    if isinstance(seeds, int):
        return np.asarray(sampling.batch_keys(seeds, B))
    return np.asarray(sampling.seed_keys(np.asarray(seeds, np.uint64).astype(np.uint32)))


def check_eos(eos_ids: Any, vocab_size: int) -> np.ndarray:
    """``eos_ids`` (an id or a list of ids) as a ``[V]`` bool mask."""
    ids = [eos_ids] if is_int(eos_ids) else eos_ids
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise ValueError(f"eos_ids must be an int or a list of ints, got {eos_ids!r}")
    mask = np.zeros((vocab_size,), bool)
    for i in ids:
        if not is_int(i) or not 0 <= i < vocab_size:
            raise ValueError(f"eos_ids must be token ids in [0, {vocab_size}), got {i!r}")
        mask[i] = True
    return mask


def check_stop_strings(stop_strings: Any, tokenizer: Any) -> list[str]:
    if isinstance(stop_strings, str) or not isinstance(stop_strings, Sequence):
        raise ValueError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r}")
    for s in stop_strings:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop_strings must be non-empty strings, got {s!r}")
    if stop_strings and not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode")):
        raise ValueError(f"stop_strings need a tokenizer with encode/decode, got "
                         f"tokenizer={tokenizer!r}")
    return list(stop_strings)


def stop_block(sequences: list[np.ndarray]) -> np.ndarray:
    """Stop sequences right-aligned in an ``[M, W]`` block, -1 before each."""
    width = max((len(s) for s in sequences), default=1)
    block = np.full((len(sequences), width), -1, np.int32)
    for m, s in enumerate(sequences):
        block[m, width - len(s):] = s
    return block


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """The rarer arguments of ``generate`` and ``speculative_generate``, checked by
    ``check_request`` (each ValueError names the field)."""

    max_len: int | None = None  # cache slots per row (prompt + output); None: from the buckets
    eos_ids: int | Sequence[int] = ()  # ids that end a row (finish reason "eos")
    stop_sequences: Sequence[Sequence[int]] = ()  # token-id sequences that end a row ("stop")
    stop_strings: Sequence[str] = ()  # strings that end a row ("stop"); need ``tokenizer``
    # With encode / decode. Its ids past its size (``len`` or ``vocab_size``), a padded
    # vocabulary's padding, are never sampled; one with more ids than the model is refused.
    # A constraint (``SamplingParams.regex`` / ``json_schema``) is compiled over its tokens.
    tokenizer: Any = None
    return_top_logprobs: int = 0  # n > 0: the n largest log-probabilities of each step
    return_entropy: bool = False  # the entropy of each step's sampling distribution
    python_loop: bool = False  # run the steps from Python (same step, same tokens)
    raise_on_error: bool = True  # False: a failed row just finishes with reason "error"
    # Classifier-free guidance (``guide``): None off, or a number or one per prompt (data), with
    # one negative prompt per prompt ([]: the prompt's last token); ``generate`` only.
    guidance_scale: float | Sequence[float] | None = None
    negative_prompts: Sequence[Sequence[int]] | None = None
    # DoLa's premature layers (``guide``): None off, "low", "high" or layer ids; ``generate`` only.
    dola_layers: str | Sequence[int] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BeamOptions:
    """The rarer arguments of ``beam_search`` (``beam_search`` says what each does)."""

    num_return: int | None = None  # hypotheses per prompt, in [1, width]; None: width
    eos_ids: int | Sequence[int] = ()  # ids that finish a hypothesis
    min_new_tokens: int = 0  # no hypothesis ends with an EOS id before this many tokens
    python_loop: bool = False  # run the steps from Python (same step, same hypotheses)
    # A padded vocabulary's tokenizer: ids past its size are never taken. Structured output,
    # as in SamplingParams (``sampling.patterns``): a regex or a JSON schema per prompt or
    # shared, None free, compiled over ``tokenizer``'s tokens.
    tokenizer: Any = None
    regex: Any = None
    json_schema: Any = None
    num_beam_groups: int = 1  # diverse beam search (``beam_groups``): groups, dividing width
    diversity_penalty: float = 0.0  # >= 0, per beam of an earlier group with the same token


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """What a loop records per output token: ``max_new_tokens`` columns of log-probabilities,
    ``top_n`` top log-probabilities and ids per column, and the entropy when ``with_entropy``.
    Hashable: a static argument of the programs, as it sets the buffers' shapes."""

    max_new_tokens: int
    top_n: int = 0
    with_entropy: bool = False

    def buffers(self, batch_size: int) -> dict[str, jax.Array]:
        """The empty output buffers of ``batch_size`` rows: NaN (PAD_TOKEN for ids) until a
        token is recorded."""
        B, N, n = batch_size, self.max_new_tokens, self.top_n
        return dict(logprobs=jnp.full((B, N), jnp.nan, jnp.float32),  # [B, N]
                    top_logprobs=jnp.full((B, N, n), jnp.nan, jnp.float32),  # [B, N, n]
                    top_ids=jnp.full((B, N, n), PAD_TOKEN, jnp.int32),  # [B, N, n]
                    entropy=jnp.full((B, N if self.with_entropy else 0), jnp.nan, jnp.float32))


@struct.dataclass(kw_only=True)
class RowInputs:
    """A batch's per-row request values on the device, what every loop state starts from."""

    prompt_lengths: jax.Array  # [B] int32
    keys: jax.Array  # [B, ...] uint32, each request's key data (request_keys)
    params: RowParams  # [B] per field
    eos_mask: jax.Array  # [V] bool
    stop_ids: jax.Array  # [M, W] int32 (or per row [B, M, W]), right-aligned, -1 before
    budgets: jax.Array | None = None  # [B] int32, output tokens each row may generate (0: a
    #   padding row, born done); None: every row the output width
    constraint: ConstraintTable | None = None  # the batch's automata; None: no row constrained
    constraint_states: jax.Array | None = None  # [B] int32, each row's start state (FREE: free)


@dataclasses.dataclass(frozen=True)
class BatchRequest:
    """The validated arguments of one batch call (``generate``, ``speculative_generate``): a batch
    of prompts with their options. The serving engine's single request is ``serving.Request``."""

    rows: list[np.ndarray]  # one int32 prompt per row
    max_new_tokens: int
    seeds: int | list[int]  # one int for the batch, or one per row
    params: SamplingParams  # validated; per_row(B, V) is left to row_inputs
    eos_mask: np.ndarray  # [V] bool
    stop_block: np.ndarray  # [M, W] int32 (stop sequences, and stop strings' own tokenizations)
    stop_strings: list[str]
    tokenizer: Any
    top_n: int
    with_entropy: bool
    python_loop: bool
    raise_on_error: bool
    tokenizer_size: int | None = None  # ids of ``tokenizer``; ids past it are masked
    # The batch's constraint table and each prompt's start state [B]; None: no row constrained.
    constraint: tuple[ConstraintTable, np.ndarray] | None = None
    samples: int = 1  # state rows per prompt (``samples``: n samples per prompt)
    guide: Guide = Guide()  # classifier-free guidance and DoLa (``guide``); default: neither

    def keys(self) -> np.ndarray:
        """``[B, ...]`` uint32 key data of each row's request key: computed on request (it runs
        a compiled function), after every check has passed."""
        return request_keys(self.seeds, len(self.rows))

    def outputs(self, shapes: Shapes) -> OutputSpec:
        """What the loop records, in the output width of ``shapes``."""
        return OutputSpec(shapes.width, self.top_n, self.with_entropy)

    def row_inputs(self, prompt_lengths: np.ndarray, vocab_size: int,
                   shapes: Shapes) -> RowInputs:
        """The per-row values on the device for ``prompt_lengths: [R]`` of the state's rows
        (padding rows included), the last step after every check has passed (the parameters'
        per-row checks first: the keys run a compiled function). Row ``p * samples + i`` is
        sample i of prompt p, with prompt p's parameters and ``sampling.sample_keys``'s key
        (with one sample: row p, prompt p's key). Each real row may generate ``shapes.columns``
        tokens, a padding row none; its parameters and key are the last real row's, computed
        for the real batch, so no row's values depend on the padding."""
        B, R, n = len(self.rows), len(prompt_lengths), self.samples
        rows = np.arange(R)
        params = take_rows(self.params.per_row(B, vocab_size, self.tokenizer_size,
                                               self.tokenizer), np.minimum(rows // n, B - 1))
        keys = take_rows(sampling.sample_keys(self.keys(), n), np.minimum(rows, B * n - 1))
        budgets = np.where(rows < B * n, shapes.columns, 0).astype(np.int32)
        table, starts = self.constraint or (None, None)
        return RowInputs(prompt_lengths=prompt_lengths, keys=keys, params=params,
                         eos_mask=self.eos_mask, stop_ids=self.stop_block, budgets=budgets,
                         constraint=table, constraint_states=None if starts is None else
                         take_rows(starts, np.minimum(rows // n, B - 1)))


def check_request(vocab_size: int, prompts: Any, params: Any, max_new_tokens: Any, seed: Any,
                  options: Any) -> BatchRequest:
    """Validate the arguments every sampling entry point takes; ValueError names the bad one.
    Nothing is traced or compiled here (``BatchRequest.row_inputs`` is the caller's last step),
    so an entry point can check more and still reject bad input before anything is compiled."""
    V = vocab_size
    rows = check_prompts(prompts, V)
    B = len(rows)
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {params!r}")
    N = check_size("max_new_tokens", max_new_tokens, 1)
    seeds = check_seeds(seed, B)
    if not isinstance(options, DecodeOptions):
        raise ValueError(f"options must be a DecodeOptions, got {options!r}")
    o = options
    eos_mask = check_eos(o.eos_ids, V)
    if isinstance(o.stop_sequences, (str, bytes)) or not isinstance(o.stop_sequences, Sequence):
        raise ValueError(f"stop_sequences must be a list of token-id lists, got "
                         f"{o.stop_sequences!r}")
    stops = [token_ids(f"stop_sequences[{i}]", s, V) for i, s in enumerate(o.stop_sequences)]
    strings = check_stop_strings(o.stop_strings, o.tokenizer)
    usable = tokenizer_size("tokenizer", o.tokenizer, V)
    top_n = check_size("return_top_logprobs", o.return_top_logprobs, 0)
    if top_n > V:
        raise ValueError(f"return_top_logprobs must be <= the vocabulary size {V}, got {top_n}")
    for name in ("return_entropy", "python_loop", "raise_on_error"):
        check_bool(name, getattr(o, name))
    # Stop strings also stop the loop early where their own tokenization shows up in the output.
    for s in strings:
        ids = list(o.tokenizer.encode(s))
        if ids and s in o.tokenizer.decode(ids):
            stops.append(token_ids(f"tokenizer.encode({s!r})", ids, V))
    guide = check_guide(o.guidance_scale, o.negative_prompts, o.dola_layers, rows, V)
    params.breakers(B, V, o.tokenizer)  # DRY's string breakers need the tokenizer
    # The last check: it compiles the patterns (on the host), if any row has one.
    constraint = params.constraint_table(B, V, o.tokenizer, np.flatnonzero(eos_mask).tolist())
    return BatchRequest(rows=rows, max_new_tokens=N, seeds=seeds, params=params,
                        eos_mask=eos_mask, stop_block=stop_block(stops), stop_strings=strings,
                        tokenizer=o.tokenizer, top_n=top_n, with_entropy=o.return_entropy,
                        python_loop=o.python_loop, raise_on_error=o.raise_on_error,
                        tokenizer_size=usable, constraint=constraint, guide=guide)


def decode_buffers(cfg: Any, batch_size: int, max_len: int, max_new_tokens: int,
                   prompt_len: int, top_n: int = 0, with_entropy: bool = False) -> dict[str, int]:
    """Bytes of the largest buffers of a ``decode.DecodeState`` (also the serving engine's) of
    ``B`` rows, ``S`` cache slots and ``N`` output columns, and of the prefill's logits of a
    ``prompt_len`` block, for ``checks.check_memory``."""
    B, S, N, T, V = batch_size, max_len, max_new_tokens, prompt_len, cfg.vocab_size
    return {
        "KV cache": kv_cache_bytes(cfg, B, S),
        "token buffer": nbytes((B, S), np.int32),
        "prefill logits": nbytes((B, T, V), np.float32),
        "logprobs": nbytes((B, N, 1 + 2 * top_n + int(with_entropy)), np.float32),
    }


def speculative_sizes(request: BatchRequest, gamma: int, max_len: Any, target: Any,
                      draft: Any) -> tuple[Shapes, int]:
    """``(shapes, gamma)`` of a ``speculative_generate`` call (``draft``: the draft model, None
    for a model-free drafter): ``max_len`` within both position tables, ``max_new_tokens``
    clamped as in ``generate``, ``gamma`` capped at the output width (proposals past the budget
    could never be kept; the width, not the budget, so that a new budget compiles nothing), every
    prompt with room for one round, and the caches and buffers within the memory limit."""
    rows, N = request.rows, request.max_new_tokens
    draft_limit = position_limit(draft) if draft is not None else None
    if draft_limit is not None:
        for i, r in enumerate(rows):
            if len(r) >= draft_limit:
                raise ValueError(f"prompts[{i}] has {len(r)} tokens but the draft's cache holds "
                                 f"at most {draft_limit} (its position table, max_seq_len); a "
                                 f"prompt must be shorter to leave room for output")
        if max_len is not None and is_int(max_len) and max_len > draft_limit:
            raise ValueError(f"max_len must be <= {draft_limit}, the draft's position table "
                             f"(max_seq_len), got {max_len}")
    known = [x for x in (position_limit(target), draft_limit) if x is not None]
    gamma = min(gamma, output_width(N))
    data = data_size(target)
    shapes = sample_shapes(batch_shapes(rows, N, max_len, min(known) if known else None, data,
                                        extra=gamma), request.samples, data)
    S, B = shapes.max_len, shapes.padded_rows
    gamma = min(gamma, shapes.width)
    buffers = decode_buffers(target.config, B, S, shapes.width, prompt_width(rows, S),
                             request.top_n, request.with_entropy)
    buffers["verify history"] = nbytes((B * (gamma + 1), S), np.int32)
    if draft is not None:
        buffers["draft KV cache"] = kv_cache_bytes(draft.config, B, S)
    n = {"n": request.samples} if request.samples > 1 else {}
    check_memory("speculative_generate", buffers, {"len(prompts)": len(rows), **n, "gamma": gamma,
                                                   "max_new_tokens": shapes.columns,
                                                   "max_len": S})
    for i, r in enumerate(rows):
        if len(r) + gamma > S:
            raise ValueError(f"gamma={gamma} is too large for the cache: prompts[{i}] has "
                             f"{len(r)} tokens and one round needs len(prompt) + gamma = "
                             f"{len(r) + gamma} slots, but max_len is {S}")
    return shapes, gamma
