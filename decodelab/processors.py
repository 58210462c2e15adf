"""Logits processors: one class per processor, each owning its parameter; one registry fixes
their order.

Conventions (every processor relies on them):

- Logits are float32 ``[B, V]``. A processor removes a token by setting its logit to ``-inf`` and
  never removes every token: each truncation keeps at least the most probable one.
- A processor reads its per-row setting from ``RowParams`` (``sampling``) under its
  ``Parameter``'s name. The parameter's neutral value makes the processor exactly the identity for
  that row.
- What a compiled program contains is decided on the host, from the values, by ``Plan``: a
  processor neutral in every row is not in the program at all; one enabled in every row is applied
  to every row; one enabled in some rows is applied and its rows selected with ``where``. When
  every row is greedy (temperature 0) the truncations after temperature are left out (they keep
  the one token greedy keeps). The plan is static: a sweep over the *values* of the enabled
  processors runs one program, and a different *set* (a processor switched on or off in every row,
  greedy against sampled) compiles one more. A state whose rows change parameters (the serving
  engine) runs under the ``union`` of the plans its rows may hold: every processor any of them
  enables, each applied with the per-row ``where``. ``Plan.ANY`` traces every processor and skips
  one that no row enables at run time (``lax.cond``).
- Top-k and top-p look at the ``Plan.candidates`` largest logits (``lax.top_k``) and fall back to
  sorting the whole vocabulary only when some row needs more (``lax.cond``); both give exactly
  the kept set of the full sort.
- Adding a processor is one class (its ``parameter`` and its ``apply``) plus one line in
  ``PROCESSORS``: ``SamplingParams`` and ``RowParams`` take their fields, defaults, validation and
  storage dtype from the registry.

The processor order (``PROCESSORS``) is fixed:

  1. repetition penalty     6. temperature (0 = greedy)    11. typical-p
  2. frequency penalty      7. top-n-sigma                 12. epsilon cutoff
  3. presence penalty       8. top-k                       13. eta cutoff
  4. no-repeat-n-gram       9. top-p
  5. logit bias / banned   10. min-p
     and min-new-tokens

Penalties and bans act on the model's scores, before any reshaping, as in CTRL and the OpenAI
API. Min-new-tokens sits with the bans (it bans EOS) and before temperature, so greedy never picks
a suppressed EOS. Top-n-sigma comes first among the truncations because its statistic (the
standard deviation of the logits, Tang et al. 2024) is defined over the whole vocabulary; after
top-k it would be the spread of a handful of survivors. Its kept set does not depend on the
temperature (max and sigma scale alike), so its place relative to temperature is immaterial.
The remaining truncations follow the order of Hugging Face's and vLLM's samplers.

Ties: greedy (temperature 0) and top-k keep the lowest token id among tied logits, so
``top_k=1`` is greedy decoding; top-p, typical-p and the probability cutoffs keep every token tied
with the last one kept.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

# Re-exported: what a processor reads.
from decodelab.processor_inputs import CANDIDATES, History, Parameter, Plan  # noqa: F401

if TYPE_CHECKING:
    from decodelab.sampling import RowParams  # derived from this module's registry

# --- Processors -----------------------------------------------------------------------------------


def _remove(logits: jax.Array, keep: jax.Array) -> jax.Array:
    return jnp.where(keep, logits, -jnp.inf)


def _probs(logits: jax.Array) -> jax.Array:
    return jax.nn.softmax(logits, axis=-1)


def _entropy(logits: jax.Array) -> jax.Array:  # [B, V] -> [B], in nats; removed tokens add 0
    logp = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def exclusive_cumsum(x: jax.Array) -> jax.Array:
    """``[..., V]`` -> ``[..., V]``: the sum of the entries before each one (0 for the first),
    formed as a shifted inclusive sum, so entry i is exactly the inclusive sum up to i - 1 (a
    difference ``cumsum - x`` can round across a boundary)."""
    inclusive = jnp.cumsum(x, axis=-1)
    return jnp.concatenate([jnp.zeros_like(inclusive[..., :1]), inclusive[..., :-1]], axis=-1)


def _keep_top_mass(logits: jax.Array, order_key: jax.Array, mass: jax.Array) -> jax.Array:
    """Keep the smallest set of tokens, taken in ascending ``order_key``, whose probability mass
    reaches ``mass[b]``: a token stays if the mass before it is < mass (so with probabilities
    0.5 / 0.4 / 0.1 and mass 0.9 exactly two stay). Ties with the last kept token's key stay
    too. ``order_key`` of removed tokens must be +inf."""
    key_sorted, p_sorted = jax.lax.sort((order_key, _probs(logits)), dimension=-1, num_keys=1)
    before = exclusive_cumsum(p_sorted)  # [B, V] mass before each token
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

    ``parameter`` is the per-row setting it owns (None for one that reads only ``logit_bias``).
    ``enabled`` says which rows it acts on (by default: those whose setting is not neutral); the
    others pass through unchanged. ``params.plan`` says whether it is in the program at all.
    """

    parameter: ClassVar[Parameter | None] = None
    # Whether it looks at the tokens so far (History): its kept set is not a function of the
    # logits alone.
    reads_history: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.parameter.name

    def enabled(self, params: RowParams) -> jax.Array:
        """``[B]`` bool."""
        return getattr(params, self.parameter.name) != self.parameter.neutral

    def enabled_on_host(self, values: dict[str, np.ndarray]) -> np.ndarray:
        """``[B]`` bool from the host arrays ``RowParams`` is built from (its fields by name)."""
        return values[self.parameter.name] != self.parameter.neutral

    @abc.abstractmethod
    def apply(self, logits: jax.Array, params: RowParams, history: History) -> jax.Array:
        """The processed logits of every row (only enabled rows are kept)."""

    def __call__(self, logits: jax.Array, params: RowParams, history: History) -> jax.Array:
        plan = params.plan
        if plan.active is not None and self.name in plan.uniform:
            return self.apply(logits, params, history)
        on = self.enabled(params)  # [B]

        def run(logits):
            return jnp.where(on[:, None], self.apply(logits, params, history), logits)

        if plan.active is None:
            return jax.lax.cond(jnp.any(on), run, lambda logits: logits, logits)
        return run(logits)


@dataclasses.dataclass(frozen=True)
class RepetitionPenalty(LogitsProcessor):
    """CTRL (Keskar et al. 2019): a token seen in prompt or output has its logit divided by the
    penalty if positive, multiplied if negative."""

    reads_history = True
    parameter = Parameter(
        "repetition_penalty", "float32", 1.0, lambda x: x > 0, "> 0 (1 disables it)",
        help=(
            "CTRL penalty on every token seen in the prompt or the output: positive logits divided "
            "by it, negative ones multiplied."))

    def apply(self, logits, params, history):
        seen = history.seen_tokens(logits.shape[-1])
        penalty = params.repetition_penalty[:, None]
        penalised = jnp.where(logits > 0, logits / penalty, logits * penalty)
        return jnp.where(seen, penalised, logits)


@dataclasses.dataclass(frozen=True)
class FrequencyPenalty(LogitsProcessor):
    """OpenAI: ``logit -= frequency_penalty * (times the token occurs in the output)``."""

    reads_history = True
    parameter = Parameter(
        "frequency_penalty", "float32", 0.0, lambda x: x == x, "a finite number (0 disables it)",
        help=(
            "OpenAI penalty on output tokens: logit -= frequency_penalty * count."))

    def apply(self, logits, params, history):
        counts = history.output_occurrences(logits.shape[-1])
        return logits - params.frequency_penalty[:, None] * counts.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class PresencePenalty(LogitsProcessor):
    """OpenAI: ``logit -= presence_penalty`` for every token that occurs in the output."""

    reads_history = True
    parameter = Parameter(
        "presence_penalty", "float32", 0.0, lambda x: x == x, "a finite number (0 disables it)",
        help=(
            "OpenAI penalty on output tokens: logit -= presence_penalty * (count > 0)."))

    def apply(self, logits, params, history):
        present = history.output_occurrences(logits.shape[-1]) > 0
        return logits - params.presence_penalty[:, None] * present.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class NoRepeatNgram(LogitsProcessor):
    """Ban every token that would complete an n-gram already in the row (prompt + output)."""

    reads_history = True
    parameter = Parameter(
        "no_repeat_ngram_size", "int32", 0, lambda x: x >= 0, "an int >= 0 (0 disables it)",
        help=(
            "Ban any token that would repeat an n-gram of the prompt or output; 0 disables."))

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

    @property
    def name(self) -> str:
        return "logit_bias"

    def enabled(self, params):
        return jnp.any(params.logit_bias != 0.0, axis=-1)

    def enabled_on_host(self, values):
        return np.any(values["logit_bias"] != 0.0, axis=-1)

    def apply(self, logits, params, history):
        return logits + params.logit_bias


@dataclasses.dataclass(frozen=True)
class MinNewTokens(LogitsProcessor):
    """Ban the EOS ids while fewer than ``min_new_tokens`` tokens have been generated."""

    reads_history = True
    parameter = Parameter(
        "min_new_tokens", "int32", 0, lambda x: x >= 0, "an int >= 0 (0 disables it)",
        help=(
            "Ban the EOS ids until this many tokens have been generated."))

    def apply(self, logits, params, history):
        early = history.num_generated < params.min_new_tokens  # [B]
        return _remove(logits, ~(early[:, None] & history.eos_mask[None, :]))


@dataclasses.dataclass(frozen=True)
class Temperature(LogitsProcessor):
    """Divide by the temperature; at 0 keep only the argmax (lowest id among ties), with logit 0."""

    parameter = Parameter(
        "temperature", "float32", 1.0, lambda x: x >= 0, ">= 0 (0 means greedy)",
        help=(
            "Divide logits by this; 0 means greedy (argmax after penalties, bans and "
            "min-new-tokens; the lowest id among ties)."))

    def apply(self, logits, params, history):
        t = params.temperature[:, None]  # [B, 1]
        ids = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, :]
        best = (ids == argmax(logits)[:, None]) & (logits > -jnp.inf)
        greedy = jnp.where(best, 0.0, -jnp.inf)
        return jnp.where(t > 0, logits / jnp.where(t > 0, t, 1.0), greedy)


@dataclasses.dataclass(frozen=True)
class TopNSigma(LogitsProcessor):
    """Keep logits >= max - n * sigma, sigma the standard deviation of the allowed logits."""

    parameter = Parameter(
        "top_n_sigma", "float32", 0.0, lambda x: x >= 0, ">= 0 (0 disables it)",
        help=(
            "Keep tokens whose logit is >= max - n * std(logits) (Tang et al. 2024); 0 disables."))

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
    """Keep exactly the k largest logits: among logits tied with the k-th largest, the lowest ids
    (as ``argmax``), so ``top_k=1`` keeps the greedy token."""

    parameter = Parameter(
        "top_k", "int32", 0, lambda x: x >= 0, "an int >= 0 (0 disables it)",
        help=(
            "Keep the k most probable tokens, the lowest ids among ties (so 1 is greedy); 0 keeps "
            "all, and so does k >= V (stored as 0)."),
        vocab_sized=True)

    def apply(self, logits, params, history):
        k = params.top_k[:, None]  # [B, 1]
        C, V = params.plan.candidates, logits.shape[-1]

        def kth(descending):  # [B, C or V] -> [B, 1]
            return jnp.take_along_axis(descending, jnp.maximum(k - 1, 0), axis=-1)

        def from_sort():
            return kth(-jnp.sort(-logits, axis=-1))

        if C >= V:
            kth = from_sort()
        else:  # the C largest hold the k-th largest of every row with k <= C
            kth = jax.lax.cond(jnp.any(k > C), from_sort,
                               lambda: kth(jax.lax.top_k(logits, C)[0]))
        above = logits > kth
        tied = logits == kth
        room = k - jnp.sum(above, axis=-1, keepdims=True)  # tied tokens that still fit, >= 1
        return _remove(logits, above | (tied & (jnp.cumsum(tied, axis=-1) <= room)))


@dataclasses.dataclass(frozen=True)
class TopP(LogitsProcessor):
    """Nucleus (Holtzman et al. 2020): the most probable tokens until their mass reaches p."""

    parameter = Parameter(
        "top_p", "float32", 1.0, lambda x: (x > 0) & (x <= 1), "in (0, 1] (1 disables it)",
        help=(
            "Keep the smallest prefix of tokens, by probability, whose mass reaches p (nucleus "
            "sampling): a token stays if the mass before it is < p."))

    def apply(self, logits, params, history):
        C, V = params.plan.candidates, logits.shape[-1]
        mass = params.top_p
        if C >= V:
            return _keep_top_mass(logits, -logits, mass)
        # The C most probable tokens, with the probabilities softmax gives them over all V.
        top = jax.lax.top_k(logits, C)[0]  # [B, C] descending
        best = jnp.max(logits, axis=-1, keepdims=True)  # [B, 1]
        total = jnp.sum(jnp.exp(logits - best), axis=-1, keepdims=True)  # [B, 1]
        before = exclusive_cumsum(jnp.exp(top - best) / total)  # [B, C]
        n_keep = jnp.sum(before < mass[:, None], axis=-1)  # [B], in [1, C]
        cutoff = jnp.take_along_axis(top, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
        # A row that keeps all C candidates may need more: then sort the whole vocabulary.
        return jax.lax.cond(jnp.any(n_keep >= C), lambda: _keep_top_mass(logits, -logits, mass),
                            lambda: _remove(logits, logits >= cutoff))


@dataclasses.dataclass(frozen=True)
class MinP(LogitsProcessor):
    """Keep tokens with probability >= min_p times the largest probability."""

    parameter = Parameter(
        "min_p", "float32", 0.0, lambda x: (x >= 0) & (x <= 1), "in [0, 1] (0 disables it)",
        help=(
            "Keep tokens with probability >= min_p * (largest probability)."))

    def apply(self, logits, params, history):
        p = _probs(logits)
        return _remove(logits, p >= params.min_p[:, None] * jnp.max(p, axis=-1, keepdims=True))


@dataclasses.dataclass(frozen=True)
class TypicalP(LogitsProcessor):
    """Locally typical sampling: tokens by |surprisal - entropy|, closest first, up to mass p."""

    parameter = Parameter(
        "typical_p", "float32", 1.0, lambda x: (x > 0) & (x <= 1), "in (0, 1] (1 disables it)",
        help=(
            "Keep the tokens whose surprisal is closest to the entropy, up to mass typical_p "
            "(Meister et al. 2022, as in Hugging Face)."))

    def apply(self, logits, params, history):
        logp = jax.nn.log_softmax(logits, axis=-1)
        distance = jnp.abs(-logp - _entropy(logits)[:, None])
        distance = jnp.where(logits > -jnp.inf, distance, jnp.inf)
        return _keep_top_mass(logits, distance, params.typical_p)


@dataclasses.dataclass(frozen=True)
class EpsilonCutoff(LogitsProcessor):
    """Truncation sampling (Hewitt et al. 2022): keep probabilities >= epsilon."""

    parameter = Parameter(
        "epsilon", "float32", 0.0, lambda x: (x >= 0) & (x < 1), "in [0, 1) (0 disables it)",
        help=(
            "Keep tokens with probability >= epsilon (Hewitt et al. 2022); the most probable "
            "always stays."))

    def apply(self, logits, params, history):
        return _keep_above(logits, params.epsilon)


@dataclasses.dataclass(frozen=True)
class EtaCutoff(LogitsProcessor):
    """Eta sampling (Hewitt et al. 2022): keep probabilities >= min(eta, sqrt(eta) e^-entropy)."""

    parameter = Parameter(
        "eta", "float32", 0.0, lambda x: (x >= 0) & (x < 1), "in [0, 1) (0 disables it)",
        help=(
            "Keep tokens with probability >= min(eta, sqrt(eta) * exp(-entropy)) (eta sampling)."))

    def apply(self, logits, params, history):
        eta = params.eta
        return _keep_above(logits, jnp.minimum(eta, jnp.sqrt(eta) * jnp.exp(-_entropy(logits))))


# The registry: the pipeline order, and (through each processor's parameter) the fields of
# SamplingParams and RowParams.
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


def planned(plan: Plan) -> tuple[LogitsProcessor, ...]:
    """The processors a program under ``plan`` contains, in pipeline order."""
    return plan.select(PROCESSORS)


def union(plans: Sequence[Plan]) -> Plan:
    """The plan of a state whose rows may hold what any of ``plans`` serves: every processor one
    of them contains, in pipeline order, none applied without the per-row ``where`` (a row may
    enable it or not), greedy only if all are. ``union(plans).covers(p)`` for each ``p``."""
    if not plans:
        raise ValueError("plans must hold at least one Plan, got none")
    candidates = {plan.candidates for plan in plans}
    if len(candidates) > 1:
        raise ValueError(f"plans must share one candidate cap, got {sorted(candidates)}")
    greedy = all(plan.greedy for plan in plans)
    if any(plan.active is None for plan in plans):
        return dataclasses.replace(Plan.ANY, greedy=greedy, candidates=candidates.pop())
    names = {name for plan in plans for name in plan.active}
    return Plan(active=tuple(p.name for p in PROCESSORS if p.name in names), greedy=greedy,
                candidates=candidates.pop())


# name -> Parameter, in pipeline order.
PARAMETERS: dict[str, Parameter] = {p.parameter.name: p.parameter for p in PROCESSORS
                                    if p.parameter is not None}
# The parameters of the processors that read the history.
HISTORY_PARAMETERS: dict[str, Parameter] = {p.parameter.name: p.parameter for p in PROCESSORS
                                            if p.parameter is not None and p.reads_history}


def argmax(x: jax.Array) -> jax.Array:
    """``[..., V]`` -> ``[...]`` int32: the lowest index of the maximum along the last axis, as
    ``jnp.argmax`` (a row holding NaN gives some index in range). Computed with two plain
    reductions: XLA's CPU argmax (a variadic reduce) is ~20x slower at V = 4096, and greedy
    decoding takes several per token."""
    V = x.shape[-1]
    ids = jnp.arange(V, dtype=jnp.int32).reshape((1,) * (x.ndim - 1) + (V,))
    first = jnp.min(jnp.where(x == jnp.max(x, axis=-1, keepdims=True), ids, V), axis=-1)
    return jnp.minimum(first, V - 1)
