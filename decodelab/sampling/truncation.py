"""Temperature and the truncations: top-n-sigma, top-k, top-p, min-p, typical-p, epsilon and eta.
Each keeps at least the most probable token, and none sorts the vocabulary: top-k, top-p and
typical-p find their cut with ``select``'s bounded search, the others are one or two reductions.
Their order in the pipeline is ``processors.PROCESSORS``'s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from decodelab.sampling import select
from decodelab.sampling.base import (LogitsProcessor, argmax, entropy, keep_above, keep_top_mass,
                                     probs, remove)
from decodelab.sampling.inputs import MAX_SCALE, Parameter


@dataclasses.dataclass(frozen=True)
class Temperature(LogitsProcessor):
    """Divide by the temperature; at 0 keep only the argmax (lowest id among ties), with logit 0."""

    parameter = Parameter(
        name="temperature", dtype="float32", neutral=1.0, low=1 / MAX_SCALE, also=0.0,
        note="0 means greedy",
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
        name="top_n_sigma", dtype="float32", neutral=0.0, low=0, note="0 disables it",
        help=(
            "Keep tokens whose logit is >= max - n * std(logits) (Tang et al. 2024); 0 disables."))

    def apply(self, logits, params, history):
        allowed = logits > -jnp.inf
        count = jnp.sum(allowed, axis=-1, keepdims=True)
        finite = jnp.where(allowed, logits, 0.0)
        mean = jnp.sum(finite, axis=-1, keepdims=True) / count
        var = jnp.sum(jnp.where(allowed, (finite - mean) ** 2, 0.0), axis=-1, keepdims=True) / count
        top = jnp.max(logits, axis=-1, keepdims=True)
        return remove(logits, logits >= top - params.top_n_sigma[:, None] * jnp.sqrt(var))


@dataclasses.dataclass(frozen=True)
class TopK(LogitsProcessor):
    """Keep exactly the k largest logits: among logits tied with the k-th largest, the lowest ids
    (as ``argmax``), so ``top_k=1`` keeps the greedy token."""

    parameter = Parameter(
        name="top_k", dtype="int32", neutral=0, low=0, note="0 disables it",
        help=(
            "Keep the k most probable tokens, the lowest ids among ties (so 1 is greedy); 0 keeps "
            "all, and so does k >= V (stored as 0)."),
        vocab_sized=True)

    def apply(self, logits, params, history):
        k = jnp.where(params.top_k > 0, params.top_k, logits.shape[-1])
        return remove(logits, select.keep_exactly(select.sortable(logits), k, self.enabled(params)))


@dataclasses.dataclass(frozen=True)
class TopP(LogitsProcessor):
    """Nucleus (Holtzman et al. 2020): the most probable tokens until their mass reaches p."""

    parameter = Parameter(
        name="top_p", dtype="float32", neutral=1.0, low=0, high=1, open_low=True,
        note="1 disables it",
        help=(
            "Keep the smallest prefix of tokens, by probability, whose mass reaches p (nucleus "
            "sampling): a token stays if the mass before it is < p."))

    def apply(self, logits, params, history):
        return keep_top_mass(logits, logits, params.top_p, self.enabled(params))


@dataclasses.dataclass(frozen=True)
class MinP(LogitsProcessor):
    """Keep tokens with probability >= min_p times the largest probability."""

    parameter = Parameter(
        name="min_p", dtype="float32", neutral=0.0, low=0, high=1, note="0 disables it",
        help=(
            "Keep tokens with probability >= min_p * (largest probability)."))

    def apply(self, logits, params, history):
        p = probs(logits)
        return remove(logits, p >= params.min_p[:, None] * jnp.max(p, axis=-1, keepdims=True))


@dataclasses.dataclass(frozen=True)
class TypicalP(LogitsProcessor):
    """Locally typical sampling: tokens by |surprisal - entropy|, closest first, up to mass p."""

    parameter = Parameter(
        name="typical_p", dtype="float32", neutral=1.0, low=0, high=1, open_low=True,
        note="1 disables it",
        help=(
            "Keep the tokens whose surprisal is closest to the entropy, up to mass typical_p "
            "(Meister et al. 2022, as in Hugging Face)."))

    def apply(self, logits, params, history):
        logp = jax.nn.log_softmax(logits, axis=-1)
        distance = jnp.abs(-logp - entropy(logits)[:, None])
        closeness = jnp.where(logits > -jnp.inf, -distance, -jnp.inf)
        return keep_top_mass(logits, closeness, params.typical_p, self.enabled(params))


@dataclasses.dataclass(frozen=True)
class EpsilonCutoff(LogitsProcessor):
    """Truncation sampling (Hewitt et al. 2022): keep probabilities >= epsilon."""

    parameter = Parameter(
        name="epsilon", dtype="float32", neutral=0.0, low=0, high=1, open_high=True,
        note="0 disables it",
        help=(
            "Keep tokens with probability >= epsilon (Hewitt et al. 2022); the most probable "
            "always stays."))

    def apply(self, logits, params, history):
        return keep_above(logits, params.epsilon)


@dataclasses.dataclass(frozen=True)
class EtaCutoff(LogitsProcessor):
    """Eta sampling (Hewitt et al. 2022): keep probabilities >= min(eta, sqrt(eta) e^-entropy)."""

    parameter = Parameter(
        name="eta", dtype="float32", neutral=0.0, low=0, high=1, open_high=True,
        note="0 disables it",
        help=(
            "Keep tokens with probability >= min(eta, sqrt(eta) * exp(-entropy)) (eta sampling)."))

    def apply(self, logits, params, history):
        eta = params.eta
        return keep_above(logits, jnp.minimum(eta, jnp.sqrt(eta) * jnp.exp(-entropy(logits))))

