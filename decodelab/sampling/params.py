"""Sampling: per-row parameters, their keys and exact draws (the distribution a row samples from
is ``distribution``'s).

Conventions (every caller relies on them):

- ``SamplingParams`` holds what a user typed: each field a scalar or one value per row. Its fields
  are the parameters of the registered processors (``processors.PROCESSORS``, which also fixes
  their order; see that module) plus ``logit_bias``, ``banned_tokens`` and DRY's
  ``dry_sequence_breakers`` (strings or token ids, ``breakers``). It is validated when
  built; ``per_row(B, V)`` turns it into ``RowParams``, a pytree of ``[B]`` arrays (and a
  ``[B, V]`` bias) with nothing static: a sweep over any settings, processors switched on and
  off and greedy against sampled included, is a sweep over array contents and compiles one
  program (see ``processors``).
- ``draw`` samples exactly from a row's processed distribution with one uniform per row (the
  inverse of its distribution function in token-id order, ``select.draw``): no sort and no
  vocabulary of random numbers. A greedy row's distribution is one token, which it draws.
- Randomness is per request. A request has a key: ``key(seed_r)`` for per-request seeds
  (``seed_keys``), and ``fold_in(key(seed), r)`` for row r of a batch under one int seed
  (``batch_keys``), so no (seed, row) pair shares a stream with another. The token at sequence
  position ``p`` is drawn with ``fold_in(request key, p)`` (``row_keys``): independent of
  batch-mates and slot. n samples of a request draw from ``sample_keys``: sample 0 from the
  request's key, sample i > 0 from a key folded from it and i.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from decodelab.checks import check_number, is_int
from decodelab.sampling import select
from decodelab.sampling.breakers import breaker_table, check_breakers
from decodelab.sampling.constraint import ConstraintTable
from decodelab.sampling.inputs import MAX_SHIFT
from decodelab.sampling.patterns import check_patterns, pattern_table
from decodelab.sampling.processors import PARAMETERS, RowParams

__all__ = ["SamplingParams", "batch_keys", "draw", "indexed_sample_keys", "row_keys",
           "sample_keys", "seed_keys"]


# --- Parameters -----------------------------------------------------------------------------------


def _check_bias(logit_bias: Any) -> None:
    def check_one(name: str, bias: Any) -> None:
        if not isinstance(bias, Mapping):
            raise ValueError(f"{name} must be a dict {{token id: bias}}, got {bias!r}")
        for token, b in bias.items():
            if not is_int(token):
                raise ValueError(f"{name} keys must be int token ids, got {token!r}")
            try:  # a shift, bounded as the penalties are (inputs.MAX_SHIFT)
                check_number(f"{name}[{token}]", b, -MAX_SHIFT, MAX_SHIFT)
            except ValueError as error:
                raise ValueError(f"{error}; ban a token with banned_tokens") from None

    if logit_bias is None or isinstance(logit_bias, Mapping):
        check_one("logit_bias", logit_bias or {})
    elif isinstance(logit_bias, Sequence) and not isinstance(logit_bias, str) and logit_bias:
        for row, bias in enumerate(logit_bias):
            check_one(f"logit_bias[{row}]", bias)
    else:
        raise ValueError(f"logit_bias must be a dict {{token id: bias}} or a list with one dict "
                         f"per row, got {logit_bias!r}")


def _check_banned(banned: Any) -> None:
    if banned is None:
        return
    if isinstance(banned, (str, bytes, Mapping)) or not isinstance(banned, (Sequence, np.ndarray)):
        raise ValueError(f"banned_tokens must be a list of token ids or a list with one list per "
                         f"row, got {banned!r}")
    if all(is_int(t) for t in banned):
        return
    for row, ids in enumerate(banned):
        if (isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray))
                or not all(is_int(t) for t in ids)):
            raise ValueError(f"banned_tokens must be a list of token ids or a list with one list "
                             f"of ids per row, got banned_tokens[{row}] = {ids!r}")


def _check_dynatemp(temperature: Any, dynatemp_range: Any) -> None:
    """A temperature-0 row is greedy: a dynamic temperature range on it is refused (llama.cpp
    would sample it at temperatures up to the range)."""
    t, r = np.asarray(temperature, np.float64), np.asarray(dynatemp_range, np.float64)
    if t.ndim and r.ndim and t.shape != r.shape:
        return  # per_row refuses the lengths
    bad = np.broadcast_to((t == 0) & (r > 0), np.broadcast(t, r).shape).reshape(-1)
    if bad.any():
        i = int(np.argmax(bad))
        where = "dynatemp_range" if r.ndim == 0 else f"dynatemp_range[{i}]"
        raise ValueError(f"{where} must be 0 where temperature is 0 (greedy), got "
                         f"{float(r.reshape(-1)[min(i, r.size - 1)])!r}")


def _is_per_row_bias(logit_bias: Any) -> bool:
    return logit_bias is not None and not isinstance(logit_bias, Mapping)


def _is_per_row_banned(banned: Any) -> bool:
    return banned is not None and len(banned) > 0 and not all(is_int(t) for t in banned)


def _registry_fields(cls: type) -> type:
    """Give ``cls`` one field per registered parameter, defaulting to its neutral value, before
    its own fields, and list them in its docstring."""
    for name, parameter in PARAMETERS.items():
        setattr(cls, name, parameter.neutral)
    cls.__annotations__ = {**{name: "Any" for name in PARAMETERS}, **cls.__annotations__}
    cls.__doc__ += "".join(f"\n    {name}: {p.help} Allowed: {p.rule}."
                           for name, p in PARAMETERS.items())
    return cls


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
@_registry_fields
class SamplingParams:
    """How to turn logits into a token; every field a scalar or one value per row.

    Neutral values (the defaults) disable a processor. Validated when built: each value against
    its parameter's rule and the range of the dtype it is stored in (int32 or float32); ``per_row``
    checks what needs the batch size and vocabulary (per-row lengths, token ids) and stores
    ``top_k >= V`` as 0 (keeps all). The fields, in pipeline order:
    """

    # Added to the logits: {token id: bias in [-100, 100]}, or a list with one dict per row.
    logit_bias: Mapping[int, float] | Sequence[Mapping[int, float]] | None = None
    # Never sampled: a list of ids, or a list with one list per row.
    banned_tokens: Sequence[int] | Sequence[Sequence[int]] | None = None
    # Structured output (``patterns``), applied before every processor: a regex (str), or a
    # JSON schema (dict or JSON str), or a list with one per row; None is free text.
    regex: str | Sequence[str | None] | None = None
    json_schema: Any = None
    # DRY's sequence breakers (``breakers``): None for llama.cpp's ("\n", ":", "\"", "*"), a
    # list of strings (needing ``DecodeOptions.tokenizer``) or token ids, or one list per row.
    dry_sequence_breakers: Sequence[str | int] | Sequence[Sequence[str | int]] | None = None

    def __post_init__(self) -> None:
        for name, parameter in PARAMETERS.items():
            parameter.values(getattr(self, name))
        _check_dynatemp(self.temperature, self.dynatemp_range)
        check_breakers(self.dry_sequence_breakers)
        _check_bias(self.logit_bias)
        _check_banned(self.banned_tokens)
        check_patterns(self.regex, self.json_schema)

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(temperature=0.0)

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    def per_row(self, batch_size: int, vocab_size: int, tokenizer_size: int | None = None,
                tokenizer: Any = None) -> RowParams:
        """The traced form: one value per row for each field, plus a ``[B, V]`` additive bias
        and the ``[B, V]`` table of DRY's breaker tokens.

        ``tokenizer_size`` (``checks.tokenizer_size``: at most ``V``), when the caller knows the
        tokenizer: ids from it to ``V`` are a padded vocabulary's padding, which no tokenizer
        can decode, and get ``-inf`` in the bias, so neither a sampled nor a greedy row ever
        picks one (the bias is data: no new program). ``tokenizer`` finds the tokens of string
        breakers for the rows with DRY on (``breakers``)."""
        B, V = batch_size, vocab_size
        values = self._row_values(B, V)
        breakers = self.breakers(B, V, tokenizer)
        bias = self._bias(B, V, V if tokenizer_size is None else tokenizer_size)  # the last check
        return RowParams(**{name: jnp.asarray(a) for name, a in values.items()},
                         logit_bias=jnp.asarray(bias), biased=jnp.asarray(np.any(bias != 0, -1)),
                         dry_breakers=jnp.asarray(breakers))

    def _row_values(self, B: int, V: int) -> dict[str, np.ndarray]:
        """Each registered parameter's ``[B]`` values, as stored (in NumPy: nothing is traced)."""
        values = {}
        for name, parameter in PARAMETERS.items():
            array = parameter.values(getattr(self, name))
            if array.ndim == 1 and array.shape[0] != B:
                raise ValueError(f"{name} has {array.shape[0]} values but the batch has {B} rows; "
                                 f"give one value or one per row")
            array = np.broadcast_to(array, (B,))
            if parameter.vocab_sized:
                array = np.where(array >= V, parameter.neutral, array)
            values[name] = array.astype(parameter.dtype)
        return values

    def breakers(self, batch_size: int, vocab_size: int, tokenizer: Any = None) -> np.ndarray:
        """``[B, V]`` bool: DRY's breaker tokens of the rows with DRY on (``breakers``); a
        ValueError for string breakers without a ``tokenizer`` or ids past the vocabulary."""
        values = self._row_values(batch_size, vocab_size)
        dry = (values["dry_multiplier"] != 0) & (values["dry_penalty_last_n"] != 0)
        return breaker_table(self.dry_sequence_breakers, batch_size, vocab_size, tokenizer, dry)

    @property
    def constrained(self) -> bool:
        """Whether a ``regex`` or ``json_schema`` is given (for some row): a function that
        forms the distribution without the batch's ``constraint_table`` must refuse it."""
        return self.regex is not None or self.json_schema is not None

    def constraint_table(self, batch_size: int, vocab_size: int, tokenizer: Any,
                         eos_ids: Sequence[int]) -> tuple[ConstraintTable, np.ndarray] | None:
        """The batch's constraint table and each row's start state ``[B]``, or None when no row
        has a ``regex`` or ``json_schema`` (``patterns.pattern_table``)."""
        return pattern_table(self.regex, self.json_schema, batch_size, vocab_size, tokenizer,
                             eos_ids)

    def _bias(self, B: int, V: int, usable: int) -> np.ndarray:
        bias = np.zeros((B, V), np.float32)  # [B, V]
        bias[:, usable:] = -np.inf  # a padded vocabulary's padding
        per_row = _is_per_row_bias(self.logit_bias)
        if per_row and len(self.logit_bias) != B:
            raise ValueError(f"logit_bias has {len(self.logit_bias)} dicts but the batch has {B} "
                             f"rows; give one dict or one per row")
        for row in range(B):
            row_bias = self.logit_bias[row] if per_row else (self.logit_bias or {})
            for token, b in row_bias.items():
                if not 0 <= token < V:
                    raise ValueError(f"logit_bias keys must be token ids in [0, {V}), got {token}")
                bias[row, token] += b
        banned = self.banned_tokens if self.banned_tokens is not None else []
        per_row = _is_per_row_banned(banned)
        if per_row and len(banned) != B:
            raise ValueError(f"banned_tokens has {len(banned)} lists but the batch has {B} rows; "
                             f"give one list or one per row")
        for row in range(B):
            ids = np.asarray(banned[row] if per_row else banned, np.int64).reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() >= V):
                bad = ids[(ids < 0) | (ids >= V)][0]
                raise ValueError(f"banned_tokens must be token ids in [0, {V}), got {int(bad)}")
            bias[row, ids] = -np.inf
            if np.isneginf(bias[row]).all():
                padding = f" (ids from {usable} are padding)" if usable < V else ""
                raise ValueError(f"banned_tokens bans all {usable} tokens of row {row}{padding}; "
                                 f"at least one must stay allowed")
        return bias


# --- Keys and the draw --------------------------------------------------------------------------


@jax.jit
def seed_keys(seeds: jax.Array) -> jax.Array:
    """``[B]`` uint32 per-request seeds -> ``[B, ...]`` uint32 key data of ``key(seeds[b])``."""
    return jax.random.key_data(jax.vmap(jax.random.key)(seeds))


@jax.jit
def _fold_rows(seed: jax.Array, rows: jax.Array) -> jax.Array:
    return jax.random.key_data(jax.vmap(lambda r: jax.random.fold_in(jax.random.key(seed), r))(
        rows))


def batch_keys(seed: int, batch_size: int) -> jax.Array:
    """``[B, ...]`` uint32 key data of ``fold_in(key(seed), r)`` for the rows r of a batch under
    one int seed: distinct for every (seed, row) pair."""
    return _fold_rows(np.uint32(seed), np.arange(batch_size, dtype=np.int32))


# Sample i > 0 of a request folds SAMPLE_BASE + i into its key: past every position (int32), so a
# sample's key is never the key of a position of its request (row_keys).
SAMPLE_BASE = 2**31


@jax.jit
def indexed_sample_keys(keys: jax.Array, samples: jax.Array) -> jax.Array:
    """``[B, ...]`` key data of sample ``samples[b]`` (``[B]`` ints >= 0) of request b, from the
    requests' key data ``keys: [B, ...]``: sample 0 keeps the request's key (its draws are the
    request's single-sample draws), sample i > 0 has ``fold_in(key, 2**31 + i)``. A sample's
    stream depends only on its request's key and its index (a serving slot holds one sample)."""
    def one(k, i):
        folded = jax.random.fold_in(jax.random.wrap_key_data(k), np.uint32(SAMPLE_BASE) + i)
        return jnp.where(i == 0, k, jax.random.key_data(folded))

    return jax.vmap(one)(keys, jnp.asarray(samples, jnp.uint32))


def sample_keys(keys: jax.Array, n: int) -> jax.Array:
    """``[B * n, ...]`` key data of n samples per request (row ``b * n + i``: sample i of request
    b, ``indexed_sample_keys``) from the requests' key data ``keys: [B, ...]``."""
    if n == 1:
        return keys
    keys = jnp.asarray(keys)
    return indexed_sample_keys(jnp.repeat(keys, n, axis=0),
                               np.tile(np.arange(n, dtype=np.uint32), keys.shape[0]))


def row_keys(keys: jax.Array, positions: jax.Array) -> jax.Array:
    """``[B]`` keys: ``fold_in(request key b, positions[b])``, the key for the token at that
    sequence position of request b; ``keys`` is the requests' key data ``[B, ...]``."""
    return jax.vmap(lambda k, p: jax.random.fold_in(jax.random.wrap_key_data(k), p))(
        keys, positions)


def draw(logprobs: jax.Array, keys: jax.Array) -> jax.Array:
    """``[..., V]`` log-probabilities (normalised or not) and ``[...]`` keys -> ``[...]`` int32
    draws, exactly from them (``select.draw``: one uniform per row, no sort). A row's draw reads
    only its own distribution and key, never its batch-mates."""
    return select.draw(logprobs, keys)


def draw_with_total(logits: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``draw`` from ``[..., V]`` processed logits, and ``[...]`` each row's log total
    (``logsumexp``, -inf where no token is allowed) from the draw's own sums: the drawn token's
    log-probability is ``logits[token] - total``, without a log-softmax of the whole row."""
    return select.draw_with_total(logits, keys)
