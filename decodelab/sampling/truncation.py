"""Temperature (fixed or dynamic) and the truncations: top-n-sigma, top-k, top-p, min-p,
typical-p, epsilon and eta; then XTC, which mixes in a distribution without the top choices.
Each truncation keeps at least the most probable token, and none sorts the vocabulary: top-k,
top-p and typical-p find their cut with ``select``'s bounded search, the others are one or two
reductions. Their order in the pipeline is ``processors.PROCESSORS``'s.
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
    """Divide by the temperature; at 0 keep only the argmax (lowest id among ties), with logit 0.

    Dynamic temperature (llama.cpp's ``temp_ext``): with ``dynatemp_range`` r > 0 the row's
    temperature is ``lo + (hi - lo) * (H / log n) ** dynatemp_exponent``, ``lo = max(0, t -
    r)``, ``hi = t + r``, H the entropy of the distribution here and n its allowed tokens. Here
    is before the truncations (decodelab's order), so H and n are over every token the penalties
    and bans leave; llama.cpp applies temperature last, over the survivors of top-k / top-p /
    min-p, so the two agree where no truncation is on. A dynamic temperature of 0 keeps the
    argmax (as llama.cpp's), one in (0, 0.01) is raised to 0.01, the lowest fixed temperature
    (keeping the logits finite). A temperature-0 row is greedy and takes no range
    (``SamplingParams`` refuses one)."""

    parameter = Parameter(
        name="temperature", dtype="float32", neutral=1.0, low=1 / MAX_SCALE, also=0.0,
        note="0 means greedy",
        help=(
            "Divide logits by this; 0 means greedy (argmax after penalties, bans and "
            "min-new-tokens; the lowest id among ties)."))
    settings = (
        Parameter(name="dynatemp_range", dtype="float32", neutral=0.0, low=0, high=MAX_SCALE,
                  note="0 disables it; needs temperature > 0",
                  help=("Dynamic temperature (llama.cpp): the temperature moves within "
                        "temperature +- this with the normalised entropy.")),
        Parameter(name="dynatemp_exponent", dtype="float32", neutral=1.0, low=0, high=MAX_SCALE,
                  note="llama.cpp's default 1",
                  help="Dynamic temperature: the power of the normalised entropy."),
    )

    def enabled(self, params):
        return (params.temperature != 1.0) | (params.dynatemp_range > 0)

    def apply(self, logits, params, history):
        t = params.temperature[:, None]  # [B, 1]
        spread = params.dynatemp_range[:, None]
        n = jnp.sum(logits > -jnp.inf, axis=-1, keepdims=True)
        normalised = entropy(logits)[:, None] / jnp.log(jnp.maximum(n, 2).astype(jnp.float32))
        lo, hi = jnp.maximum(t - spread, 0.0), t + spread
        dynamic = lo + (hi - lo) * normalised ** params.dynatemp_exponent[:, None]
        dynamic = jnp.where(dynamic > 0, jnp.maximum(dynamic, 1 / MAX_SCALE), 0.0)
        t = jnp.where((spread > 0) & (t > 0) & (n > 1), dynamic, t)
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



@dataclasses.dataclass(frozen=True)
class Xtc(LogitsProcessor):
    """XTC, "exclude top choices" (llama.cpp): with probability ``xtc_probability``, remove every
    token whose probability is >= ``xtc_threshold`` but the least probable of them, when at least
    two reach it (ties: the order is top-k's, so of tied least probable tokens the highest id
    stays).

    A row's distribution must be a function of its prefix (the reported logprob, speculative
    decoding's accept test and the draw all read it), so instead of flipping a coin this gives
    the exact mixture ``p * D_xtc + (1 - p) * D`` (as log-probabilities): drawing from it draws
    what llama.cpp's coin flip then draw does, with no randomness of its own. It is last in the
    pipeline, after every truncation, so D is the distribution the row samples from without
    XTC. A greedy row never reaches it (greedy is the argmax of the scores before temperature);
    llama.cpp's would take the argmax of what its XTC leaves."""

    parameter = Parameter(
        name="xtc_probability", dtype="float32", neutral=0.0, low=0, high=1,
        note="0 disables it",
        help=(
            "XTC (llama.cpp): the chance that every token with probability >= xtc_threshold but "
            "the least probable of them is removed, when two or more reach it."))
    settings = (
        Parameter(name="xtc_threshold", dtype="float32", neutral=0.1, low=0, high=1,
                  note="llama.cpp's default 0.1; above 0.5 it removes nothing",
                  help="XTC: the probability a top choice reaches."),
    )

    def apply(self, logits, params, history):
        p = probs(logits)
        ids = jnp.arange(logits.shape[-1], dtype=jnp.int32)[None, :]
        top = (p >= params.xtc_threshold[:, None]) & (logits > -jnp.inf)
        least = jnp.min(jnp.where(top, p, jnp.inf), axis=-1, keepdims=True)
        spared = jnp.max(jnp.where(top & (p == least), ids, -1), axis=-1, keepdims=True)
        cut = top & (ids != spared) & (jnp.sum(top, axis=-1, keepdims=True) >= 2)
        chance = params.xtc_probability[:, None]
        # The mixture in one elementwise pass: a cut token keeps (1 - chance) of its probability,
        # every other token is scaled by one factor per row, (1 - chance) + chance * (the whole
        # mass / the mass XTC keeps), as log-sum-exps so that a kept mass that underflows stays
        # exact (two log-softmaxes and a logaddexp of [B, V] before).
        whole = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        kept = jax.nn.logsumexp(remove(logits, ~cut), axis=-1, keepdims=True)
        passed = jnp.log1p(-chance)  # the coin did not remove the top choices
        spared_factor = jnp.logaddexp(jnp.log(chance) + whole - kept, passed)
        return logits - whole + jnp.where(cut, passed, spared_factor)
