"""Sampling: per-row parameters, logits processors in one fixed order, and exact sampling.

Conventions (every caller relies on them):

- Logits are float32 ``[B, V]``. A processor removes a token by setting its logit to ``-inf`` and
  never removes every token: each truncation keeps at least the most probable one.
- ``SamplingParams`` holds what a user typed: each field a scalar or one value per row. It is
  validated when built; ``per_row(B, V)`` turns it into ``RowParams``, a pytree of ``[B]`` arrays
  (and a ``[B, V]`` bias), so a sweep over values is a sweep over array contents and never
  recompiles.
- A value that disables a processor makes it exactly the identity for that row (rows are selected
  with ``where``), and a processor disabled for every row costs nothing (``lax.cond`` skips it).
- ``processed_logprobs`` is the distribution that is sampled from, reported as the token's logprob,
  and used by speculative decoding's accept/reject test: one function, so the three never disagree.
- Randomness is per request: the key of a row for the token at sequence position ``p`` is
  ``fold_in(key(seed), p)``, independent of batch-mates and slot.

The processor order (``PROCESSORS``) is fixed:

  1. repetition penalty     6. temperature (0 = greedy)    11. typical-p
  2. frequency penalty      7. top-n-sigma                 12. epsilon cutoff
  3. presence penalty       8. top-k                       13. eta cutoff
  4. no-repeat-n-gram       9. top-p
  5. logit bias / banned   10. min-p

Penalties and bans act on the model's scores, before any reshaping, as in CTRL and the OpenAI
API. Min-new-tokens sits with the bans (it bans EOS) and before temperature, so greedy never picks
a suppressed EOS. Top-n-sigma comes first among the truncations because its statistic (the
standard deviation of the logits, Tang et al. 2024) is defined over the whole vocabulary; after
top-k it would be the spread of a handful of survivors. Its kept set does not depend on the
temperature (max and sigma scale alike), so its place relative to temperature is immaterial.
The remaining truncations follow the order of Hugging Face's and vLLM's samplers.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# --- Parameters -----------------------------------------------------------------------------------

# name -> (is_int, allowed(x) on a float64 array, what is allowed in words, neutral value)
_FIELDS: dict[str, tuple[bool, Callable[[np.ndarray], np.ndarray], str, float]] = {
    "temperature": (False, lambda x: x >= 0, ">= 0 (0 means greedy)", 1.0),
    "top_k": (True, lambda x: x >= 0, "an int >= 0 (0 disables it)", 0),
    "top_p": (False, lambda x: (x > 0) & (x <= 1), "in (0, 1] (1 disables it)", 1.0),
    "min_p": (False, lambda x: (x >= 0) & (x <= 1), "in [0, 1] (0 disables it)", 0.0),
    "typical_p": (False, lambda x: (x > 0) & (x <= 1), "in (0, 1] (1 disables it)", 1.0),
    "epsilon": (False, lambda x: (x >= 0) & (x < 1), "in [0, 1) (0 disables it)", 0.0),
    "eta": (False, lambda x: (x >= 0) & (x < 1), "in [0, 1) (0 disables it)", 0.0),
    "top_n_sigma": (False, lambda x: x >= 0, ">= 0 (0 disables it)", 0.0),
    "repetition_penalty": (False, lambda x: x > 0, "> 0 (1 disables it)", 1.0),
    "frequency_penalty": (False, lambda x: x == x, "a finite number (0 disables it)", 0.0),
    "presence_penalty": (False, lambda x: x == x, "a finite number (0 disables it)", 0.0),
    "no_repeat_ngram_size": (True, lambda x: x >= 0, "an int >= 0 (0 disables it)", 0),
    "min_new_tokens": (True, lambda x: x >= 0, "an int >= 0 (0 disables it)", 0),
}


def _as_values(name: str, value: Any) -> np.ndarray:
    """``value`` as a 0-d or 1-d float64 array, or a ValueError naming ``name``."""
    is_int, allowed, rule, _ = _FIELDS[name]
    kind = "an int" if is_int else "a number"
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} must be a concrete value, got a traced array")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {kind} or one per row, got {value!r}") from None
    if array.ndim > 1 or (array.ndim == 1 and array.size == 0):
        raise ValueError(f"{name} must be a scalar or a 1-D sequence with one value per row, "
                         f"got shape {array.shape}")
    numeric = np.issubdtype(array.dtype, np.integer if is_int else np.number)
    if array.dtype == bool or not numeric or np.iscomplexobj(array):
        raise ValueError(f"{name} must be {kind} or one per row, got {value!r}")
    values = array.astype(np.float64)
    ok = np.isfinite(values) & allowed(values)
    if not ok.all():
        if array.ndim == 0:
            raise ValueError(f"{name} must be {rule}, got {value!r}")
        i = int(np.argmin(ok))
        raise ValueError(f"{name}[{i}] must be {rule}, got {array[i].item()!r}")
    return values


def _is_token_id(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_bias(logit_bias: Any) -> None:
    def check_one(name: str, bias: Any) -> None:
        if not isinstance(bias, Mapping):
            raise ValueError(f"{name} must be a dict {{token id: bias}}, got {bias!r}")
        for token, b in bias.items():
            if not _is_token_id(token):
                raise ValueError(f"{name} keys must be int token ids, got {token!r}")
            if not (isinstance(b, (int, float, np.number)) and not isinstance(b, bool)
                    and math.isfinite(b)):
                raise ValueError(f"{name}[{token}] must be a finite number (ban a token with "
                                 f"banned_tokens), got {b!r}")

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
    if all(_is_token_id(t) for t in banned):
        return
    for row, ids in enumerate(banned):
        if (isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray))
                or not all(_is_token_id(t) for t in ids)):
            raise ValueError(f"banned_tokens must be a list of token ids or a list with one list "
                             f"of ids per row, got banned_tokens[{row}] = {ids!r}")


def _is_per_row_bias(logit_bias: Any) -> bool:
    return logit_bias is not None and not isinstance(logit_bias, Mapping)


def _is_per_row_banned(banned: Any) -> bool:
    return banned is not None and len(banned) > 0 and not all(_is_token_id(t) for t in banned)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class SamplingParams:
    """How to turn logits into a token; every field a scalar or one value per row.

    Neutral values disable a processor. Validated when built; ``per_row`` checks what needs the
    batch size and vocabulary (per-row lengths, token ids) and clamps ``top_k`` to the vocabulary.
    """

    # Divide logits by this; 0 means greedy (argmax after penalties, bans and min-new-tokens).
    temperature: Any = 1.0
    # Keep the k most probable tokens; 0 keeps all; k >= V is clamped to V (keeps all).
    top_k: Any = 0
    # Keep the smallest prefix of tokens, by probability, whose mass reaches p (nucleus sampling).
    top_p: Any = 1.0
    # Keep tokens with probability >= min_p * (largest probability).
    min_p: Any = 0.0
    # Keep the tokens whose surprisal is closest to the entropy, up to mass typical_p (Meister et
    # al. 2022, as in Hugging Face).
    typical_p: Any = 1.0
    # Keep tokens with probability >= epsilon (Hewitt et al. 2022); the most probable always stays.
    epsilon: Any = 0.0
    # Keep tokens with probability >= min(eta, sqrt(eta) * exp(-entropy)) (eta sampling).
    eta: Any = 0.0
    # Keep tokens whose logit is >= max - n * std(logits) (Tang et al. 2024); 0 disables.
    top_n_sigma: Any = 0.0
    # CTRL penalty on every token seen in the prompt or the output: positive logits divided by it,
    # negative ones multiplied.
    repetition_penalty: Any = 1.0
    # OpenAI penalties on output tokens: logit -= frequency * count + presence * (count > 0).
    frequency_penalty: Any = 0.0
    presence_penalty: Any = 0.0
    # Ban any token that would repeat an n-gram of the prompt or output; 0 disables.
    no_repeat_ngram_size: Any = 0
    # Ban the EOS ids until this many tokens have been generated.
    min_new_tokens: Any = 0
    # Added to the logits: {token id: bias}, or a list with one dict per row.
    logit_bias: Mapping[int, float] | Sequence[Mapping[int, float]] | None = None
    # Never sampled: a list of ids, or a list with one list per row.
    banned_tokens: Sequence[int] | Sequence[Sequence[int]] | None = None

    def __post_init__(self) -> None:
        for name in _FIELDS:
            _as_values(name, getattr(self, name))
        _check_bias(self.logit_bias)
        _check_banned(self.banned_tokens)

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(temperature=0.0)

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    def per_row(self, batch_size: int, vocab_size: int) -> RowParams:
        """The traced form: one value per row for each field, plus a ``[B, V]`` additive bias."""
        B, V = batch_size, vocab_size
        values = {}
        for name, (is_int, _, _, _) in _FIELDS.items():
            array = _as_values(name, getattr(self, name))
            if array.ndim == 1 and array.shape[0] != B:
                raise ValueError(f"{name} has {array.shape[0]} values but the batch has {B} rows; "
                                 f"give one value or one per row")
            array = np.broadcast_to(array, (B,))
            if name == "top_k":
                array = np.minimum(array, V)
            values[name] = jnp.asarray(array, jnp.int32 if is_int else jnp.float32)
        return RowParams(**values, logit_bias=jnp.asarray(self._bias(B, V)))

    def _bias(self, B: int, V: int) -> np.ndarray:
        bias = np.zeros((B, V), np.float32)  # [B, V]
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
                raise ValueError(f"banned_tokens bans all {V} tokens of row {row}; at least one "
                                 f"must stay allowed")
        return bias


@struct.dataclass(kw_only=True)
class RowParams:
    """``SamplingParams`` as arrays, one value per row: the form the decode loop traces."""

    temperature: jax.Array  # [B] float32
    top_k: jax.Array  # [B] int32, in [0, V]
    top_p: jax.Array  # [B] float32
    min_p: jax.Array  # [B] float32
    typical_p: jax.Array  # [B] float32
    epsilon: jax.Array  # [B] float32
    eta: jax.Array  # [B] float32
    top_n_sigma: jax.Array  # [B] float32
    repetition_penalty: jax.Array  # [B] float32
    frequency_penalty: jax.Array  # [B] float32
    presence_penalty: jax.Array  # [B] float32
    no_repeat_ngram_size: jax.Array  # [B] int32
    min_new_tokens: jax.Array  # [B] int32
    logit_bias: jax.Array  # [B, V] float32, -inf for a banned token


# --- What a processor may look at -----------------------------------------------------------------


@struct.dataclass(kw_only=True)
class History:
    """The tokens of each row so far: prompt, then output. What penalties and bans look at."""

    tokens: jax.Array  # [B, S] int32; slot j holds position j; slots at or past `lengths` ignored
    prompt_lengths: jax.Array  # [B] int32
    lengths: jax.Array  # [B] int32, prompt + output tokens
    eos_mask: jax.Array  # [V] bool, the ids min_new_tokens suppresses

    @property
    def num_generated(self) -> jax.Array:  # [B]
        return self.lengths - self.prompt_lengths

    def counts(self, vocab_size: int, *, output_only: bool) -> jax.Array:
        """``[B, V]`` int32: occurrences of each token in the output (or in prompt + output)."""
        B, S = self.tokens.shape
        slot = jnp.arange(S, dtype=jnp.int32)[None, :]  # [1, S]
        start = self.prompt_lengths[:, None] if output_only else jnp.zeros((B, 1), jnp.int32)
        valid = (slot >= start) & (slot < self.lengths[:, None])  # [B, S]
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
        return jnp.zeros((B, vocab_size), jnp.int32).at[rows, self.tokens].add(
            valid.astype(jnp.int32), mode="drop")


# --- Processors -----------------------------------------------------------------------------------


def _remove(logits: jax.Array, keep: jax.Array) -> jax.Array:
    return jnp.where(keep, logits, -jnp.inf)


def _probs(logits: jax.Array) -> jax.Array:
    return jax.nn.softmax(logits, axis=-1)


def _entropy(logits: jax.Array) -> jax.Array:  # [B, V] -> [B], in nats; removed tokens add 0
    logp = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def _keep_top_mass(logits: jax.Array, order_key: jax.Array, mass: jax.Array) -> jax.Array:
    """Keep the smallest set of tokens, taken in ascending ``order_key``, whose probability mass
    reaches ``mass[b]``: a token stays if the mass before it is < mass. Ties with the last kept
    token's key stay too. ``order_key`` of removed tokens must be +inf."""
    key_sorted, p_sorted = jax.lax.sort((order_key, _probs(logits)), dimension=-1, num_keys=1)
    before = jnp.cumsum(p_sorted, axis=-1) - p_sorted  # [B, V] exclusive cumulative mass
    n_keep = jnp.sum(before < mass[:, None], axis=-1)  # [B], >= 1 since before[0] = 0 < mass
    cutoff = jnp.take_along_axis(key_sorted, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
    return _remove(logits, order_key <= cutoff)


def _keep_above(logits: jax.Array, threshold: jax.Array) -> jax.Array:
    """Keep tokens with probability >= threshold[b], and always the most probable."""
    p = _probs(logits)
    best = jnp.max(p, axis=-1, keepdims=True)
    return _remove(logits, (p >= threshold[:, None]) | (p >= best))


class LogitsProcessor(abc.ABC):
    """One step of the pipeline: ``[B, V]`` logits -> ``[B, V]`` logits; ``-inf`` = removed.

    ``enabled`` says which rows it acts on; the others pass through unchanged, and when no row is
    enabled the step is skipped at run time.
    """

    @abc.abstractmethod
    def enabled(self, params: RowParams) -> jax.Array:
        """``[B]`` bool."""

    @abc.abstractmethod
    def apply(self, logits: jax.Array, params: RowParams, history: History) -> jax.Array:
        """The processed logits of every row (only enabled rows are kept)."""

    def __call__(self, logits: jax.Array, params: RowParams, history: History) -> jax.Array:
        on = self.enabled(params)  # [B]

        def run(logits):
            return jnp.where(on[:, None], self.apply(logits, params, history), logits)

        return jax.lax.cond(jnp.any(on), run, lambda logits: logits, logits)


@dataclasses.dataclass(frozen=True)
class RepetitionPenalty(LogitsProcessor):
    """CTRL (Keskar et al. 2019): a token seen in prompt or output has its logit divided by the
    penalty if positive, multiplied if negative."""

    def enabled(self, params):
        return params.repetition_penalty != 1.0

    def apply(self, logits, params, history):
        seen = history.counts(logits.shape[-1], output_only=False) > 0
        penalty = params.repetition_penalty[:, None]
        penalised = jnp.where(logits > 0, logits / penalty, logits * penalty)
        return jnp.where(seen, penalised, logits)


@dataclasses.dataclass(frozen=True)
class FrequencyPenalty(LogitsProcessor):
    """OpenAI: ``logit -= frequency_penalty * (times the token occurs in the output)``."""

    def enabled(self, params):
        return params.frequency_penalty != 0.0

    def apply(self, logits, params, history):
        counts = history.counts(logits.shape[-1], output_only=True)
        return logits - params.frequency_penalty[:, None] * counts.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class PresencePenalty(LogitsProcessor):
    """OpenAI: ``logit -= presence_penalty`` for every token that occurs in the output."""

    def enabled(self, params):
        return params.presence_penalty != 0.0

    def apply(self, logits, params, history):
        present = history.counts(logits.shape[-1], output_only=True) > 0
        return logits - params.presence_penalty[:, None] * present.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class NoRepeatNgram(LogitsProcessor):
    """Ban every token that would complete an n-gram already in the row (prompt + output)."""

    def enabled(self, params):
        return params.no_repeat_ngram_size > 0

    def apply(self, logits, params, history):
        B, S = history.tokens.shape
        n = params.no_repeat_ngram_size[:, None]  # [B, 1]
        length = history.lengths[:, None]  # [B, 1]
        slot = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32)[None, :], (B, S))
        # candidate[b, j]: the token at slot j ends an earlier n-gram whose first n - 1 tokens equal
        # the row's last n - 1 tokens, so sampling tokens[b, j] now would repeat that n-gram.
        candidate = (slot >= n - 1) & (slot < length)

        def match_offset(k, candidate):  # compare the token k before slot j with the k-th last
            before = jnp.take_along_axis(history.tokens, jnp.maximum(slot - k, 0), axis=1)
            last = jnp.take_along_axis(history.tokens, jnp.maximum(length - k, 0), axis=1)
            return candidate & ((k >= n) | (before == last))

        candidate = jax.lax.fori_loop(1, jnp.max(n), match_offset, candidate)
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
        banned = jnp.zeros(logits.shape, jnp.int32).at[rows, history.tokens].max(
            candidate.astype(jnp.int32), mode="drop")
        return _remove(logits, banned == 0)


@dataclasses.dataclass(frozen=True)
class LogitBias(LogitsProcessor):
    """Add the row's bias; banned tokens carry ``-inf``."""

    def enabled(self, params):
        return jnp.any(params.logit_bias != 0.0, axis=-1)

    def apply(self, logits, params, history):
        return logits + params.logit_bias


@dataclasses.dataclass(frozen=True)
class MinNewTokens(LogitsProcessor):
    """Ban the EOS ids while fewer than ``min_new_tokens`` tokens have been generated."""

    def enabled(self, params):
        return params.min_new_tokens > 0

    def apply(self, logits, params, history):
        early = history.num_generated < params.min_new_tokens  # [B]
        return _remove(logits, ~(early[:, None] & history.eos_mask[None, :]))


@dataclasses.dataclass(frozen=True)
class Temperature(LogitsProcessor):
    """Divide by the temperature; at 0 keep only the argmax (lowest id among ties), with logit 0."""

    def enabled(self, params):
        return params.temperature != 1.0

    def apply(self, logits, params, history):
        t = params.temperature[:, None]  # [B, 1]
        ids = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, :]
        best = (ids == argmax(logits)[:, None]) & (logits > -jnp.inf)
        greedy = jnp.where(best, 0.0, -jnp.inf)
        return jnp.where(t > 0, logits / jnp.where(t > 0, t, 1.0), greedy)


@dataclasses.dataclass(frozen=True)
class TopNSigma(LogitsProcessor):
    """Keep logits >= max - n * sigma, sigma the standard deviation of the allowed logits."""

    def enabled(self, params):
        return params.top_n_sigma > 0.0

    def apply(self, logits, params, history):
        allowed = logits > -jnp.inf
        count = jnp.sum(allowed, axis=-1, keepdims=True)
        finite = jnp.where(allowed, logits, 0.0)
        mean = jnp.sum(finite, axis=-1, keepdims=True) / count
        var = jnp.sum(jnp.where(allowed, (finite - mean) ** 2, 0.0), axis=-1, keepdims=True) / count
        top = jnp.max(logits, axis=-1, keepdims=True)
        return _remove(logits, logits >= top - params.top_n_sigma[:, None] * jnp.sqrt(var))


@dataclasses.dataclass(frozen=True)
class TopK(LogitsProcessor):
    """Keep the k largest logits (and any tied with the k-th)."""

    def enabled(self, params):
        return (params.top_k > 0) & (params.top_k < params.logit_bias.shape[-1])

    def apply(self, logits, params, history):
        descending = -jnp.sort(-logits, axis=-1)
        kth = jnp.take_along_axis(descending, jnp.maximum(params.top_k - 1, 0)[:, None], axis=-1)
        return _remove(logits, logits >= kth)


@dataclasses.dataclass(frozen=True)
class TopP(LogitsProcessor):
    """Nucleus (Holtzman et al. 2020): the most probable tokens until their mass reaches p."""

    def enabled(self, params):
        return params.top_p < 1.0

    def apply(self, logits, params, history):
        return _keep_top_mass(logits, -logits, params.top_p)


@dataclasses.dataclass(frozen=True)
class MinP(LogitsProcessor):
    """Keep tokens with probability >= min_p times the largest probability."""

    def enabled(self, params):
        return params.min_p > 0.0

    def apply(self, logits, params, history):
        p = _probs(logits)
        return _remove(logits, p >= params.min_p[:, None] * jnp.max(p, axis=-1, keepdims=True))


@dataclasses.dataclass(frozen=True)
class TypicalP(LogitsProcessor):
    """Locally typical sampling: tokens by |surprisal - entropy|, closest first, up to mass p."""

    def enabled(self, params):
        return params.typical_p < 1.0

    def apply(self, logits, params, history):
        logp = jax.nn.log_softmax(logits, axis=-1)
        distance = jnp.abs(-logp - _entropy(logits)[:, None])
        distance = jnp.where(logits > -jnp.inf, distance, jnp.inf)
        return _keep_top_mass(logits, distance, params.typical_p)


@dataclasses.dataclass(frozen=True)
class EpsilonCutoff(LogitsProcessor):
    """Truncation sampling (Hewitt et al. 2022): keep probabilities >= epsilon."""

    def enabled(self, params):
        return params.epsilon > 0.0

    def apply(self, logits, params, history):
        return _keep_above(logits, params.epsilon)


@dataclasses.dataclass(frozen=True)
class EtaCutoff(LogitsProcessor):
    """Eta sampling (Hewitt et al. 2022): keep probabilities >= min(eta, sqrt(eta) e^-entropy)."""

    def enabled(self, params):
        return params.eta > 0.0

    def apply(self, logits, params, history):
        eta = params.eta
        return _keep_above(logits, jnp.minimum(eta, jnp.sqrt(eta) * jnp.exp(-_entropy(logits))))


PROCESSORS: tuple[LogitsProcessor, ...] = (
    RepetitionPenalty(),
    FrequencyPenalty(),
    PresencePenalty(),
    NoRepeatNgram(),
    LogitBias(),
    MinNewTokens(),
    Temperature(),
    TopNSigma(),
    TopK(),
    TopP(),
    MinP(),
    TypicalP(),
    EpsilonCutoff(),
    EtaCutoff(),
)


# --- The distribution and the draw ----------------------------------------------------------------


def process_logits(logits: jax.Array, params: RowParams, history: History) -> jax.Array:
    """``[B, V]`` model logits -> processed logits, through ``PROCESSORS`` in order."""
    logits = logits.astype(jnp.float32)
    for processor in PROCESSORS:
        logits = processor(logits, params, history)
    return logits


def processed_logprobs(logits: jax.Array, params: RowParams, history: History) -> jax.Array:
    """``[B, V]`` log-probabilities of the distribution each row samples from (``-inf`` = never).

    A row whose logits hold NaN, or whose processors left no token, comes back NaN / all ``-inf``;
    the decode loop checks for both and never samples such a row.
    """
    return jax.nn.log_softmax(process_logits(logits, params, history), axis=-1)


def argmax(x: jax.Array) -> jax.Array:
    """``[..., V]`` -> ``[...]`` int32: the lowest index of the maximum along the last axis, as
    ``jnp.argmax`` (a row holding NaN gives some index in range). Computed with two plain
    reductions: XLA's CPU argmax (a variadic reduce) is ~20x slower at V = 4096, and greedy
    decoding takes several per token."""
    V = x.shape[-1]
    ids = jnp.arange(V, dtype=jnp.int32).reshape((1,) * (x.ndim - 1) + (V,))
    first = jnp.min(jnp.where(x == jnp.max(x, axis=-1, keepdims=True), ids, V), axis=-1)
    return jnp.minimum(first, V - 1)


def row_keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
    """``[B]`` keys: ``fold_in(key(seeds[b]), positions[b])``, the key for the token at that
    sequence position of request b."""
    return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.key(s), p))(seeds, positions)


def sample_tokens(logprobs: jax.Array, keys: jax.Array) -> jax.Array:
    """``[B, V]`` log-probabilities and ``[B]`` keys -> ``[B]`` int32 draws, exactly from them."""
    return jax.vmap(jax.random.categorical)(keys, logprobs).astype(jnp.int32)
