"""The processors that act on the model's scores before any reshaping: the penalties over the
tokens so far (repetition, frequency, presence, DRY, no-repeat n-grams), the logit bias and bans,
and min-new-tokens. Their order in the pipeline is ``processors.PROCESSORS``'s.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from decodelab.sampling.base import LogitsProcessor, remove
from decodelab.sampling.inputs import MAX_SCALE, MAX_SHIFT, Parameter


@dataclasses.dataclass(frozen=True)
class RepetitionPenalty(LogitsProcessor):
    """CTRL (Keskar et al. 2019): a token seen in prompt or output has its logit divided by the
    penalty if positive, multiplied if negative."""

    reads_history = True
    parameter = Parameter(
        name="repetition_penalty", dtype="float32", neutral=1.0, low=1 / MAX_SCALE, high=MAX_SCALE,
        note="1 disables it",
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
        name="frequency_penalty", dtype="float32", neutral=0.0, low=-MAX_SHIFT, high=MAX_SHIFT,
        note="0 disables it",
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
        name="presence_penalty", dtype="float32", neutral=0.0, low=-MAX_SHIFT, high=MAX_SHIFT,
        note="0 disables it",
        help=(
            "OpenAI penalty on output tokens: logit -= presence_penalty * (count > 0)."))

    def apply(self, logits, params, history):
        present = history.output_occurrences(logits.shape[-1]) > 0
        return logits - params.presence_penalty[:, None] * present.astype(jnp.float32)


# DRY's exponent is clamped where base ** exponent would pass the float32 range (llama.cpp's
# bound, from the log of the largest float32), and its penalty at DRY_PENALTY_CAP: past it a token
# is as good as banned, and the logits stay finite (``inputs.MAX_SHIFT``'s reason).
_LOG_FLOAT32_MAX = 88.7228391
DRY_PENALTY_CAP = 1e30


@dataclasses.dataclass(frozen=True)
class Dry(LogitsProcessor):
    """DRY, "don't repeat yourself" (p-e-w, as llama.cpp defines it): a token that would extend
    a repeat of the row's last n >= allowed_length tokens loses ``multiplier * base ** (n -
    allowed_length)`` from its logit, n the longest such repeat it would extend.

    The repeats are the common suffixes that ``History`` carries (``dry_suffixes``): at slot j,
    how far the tokens before j agree with the row's end, never reaching back across the last
    sequence breaker (so a repeat counts only the tokens since it). Here they are cut to the
    window of the last ``dry_penalty_last_n`` tokens (-1: the whole row, prompt and output; the
    earlier copy lies inside the window), and ``tokens[j]`` takes the largest penalty over its
    slots, that of its longest repeat: one scatter-max. A breaker token itself is never
    penalised. Exponents are clamped where llama.cpp clamps them (``base ** exponent`` within
    float32), and the penalty at ``DRY_PENALTY_CAP``. The breakers are a ``[B, V]`` table in
    ``RowParams`` (``breakers``)."""

    reads_history = True
    parameter = Parameter(
        name="dry_multiplier", dtype="float32", neutral=0.0, low=0, high=MAX_SHIFT,
        note="0 disables it",
        help=(
            "DRY (llama.cpp): a token that would extend a repeat of n >= dry_allowed_length of "
            "the row's last tokens loses dry_multiplier * dry_base ** (n - dry_allowed_length) "
            "from its logit."))
    settings = (
        Parameter(name="dry_base", dtype="float32", neutral=1.75, low=1, high=MAX_SCALE,
                  note="llama.cpp's default 1.75",
                  help="DRY's growth per repeated token past dry_allowed_length."),
        Parameter(name="dry_allowed_length", dtype="int32", neutral=2, low=1,
                  note="llama.cpp's default 2",
                  help="DRY: repeats shorter than this are not penalised."),
        Parameter(name="dry_penalty_last_n", dtype="int32", neutral=-1, low=-1,
                  note="-1 is the whole row, 0 disables DRY",
                  help="DRY looks for repeats in the row's last this many tokens."),
    )

    def enabled(self, params):
        return (params.dry_multiplier != 0) & (params.dry_penalty_last_n != 0)

    def apply(self, logits, params, history):
        B, S = history.tokens.shape
        slot = jnp.arange(S, dtype=jnp.int32)[None, :]
        length, last_n = history.lengths[:, None], params.dry_penalty_last_n[:, None]
        start = jnp.where(last_n > 0, jnp.maximum(length - last_n, 0), 0)  # the window's first
        allowed = params.dry_allowed_length[:, None]
        n = jnp.minimum(history.suffixes(params, "dry_suffixes"), slot - start)
        counted = (slot < length) & (n >= allowed)
        base = params.dry_base[:, None]
        # The clamp; a base within 1e-6 of 1 has none (its bound is past any row's length).
        bound = jnp.floor(_LOG_FLOAT32_MAX / jnp.log(base))  # inf at base 1
        exponent = jnp.minimum((n - allowed).astype(jnp.float32), bound)
        penalty = jnp.minimum(params.dry_multiplier[:, None] * base ** exponent, DRY_PENALTY_CAP)
        # The penalty grows with n (base >= 1), so the largest over a token's slots is the
        # penalty of its longest repeat: priced per slot ([B, S]) and scattered, not per token.
        penalty = jnp.where(counted, penalty, 0.0)
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
        token_penalty = jnp.zeros(logits.shape, jnp.float32).at[rows, history.tokens].max(
            penalty, mode="drop")
        hit = (token_penalty > 0) & ~params.dry_breakers
        return jnp.where(hit, logits - token_penalty, logits)


@dataclasses.dataclass(frozen=True)
class NoRepeatNgram(LogitsProcessor):
    """Ban every token that would complete an n-gram already in the row (prompt + output): the
    token after each earlier copy of the row's last n - 1 tokens (``History.suffixes``)."""

    reads_history = True
    parameter = Parameter(
        name="no_repeat_ngram_size", dtype="int32", neutral=0, low=0, note="0 disables it",
        help=(
            "Ban any token that would repeat an n-gram of the prompt or output; 0 disables."))

    def apply(self, logits, params, history):
        B, S = history.tokens.shape
        n = params.no_repeat_ngram_size  # [B]
        # Sampling tokens[b, j] now would repeat an n-gram iff the n - 1 tokens before slot j are
        # the row's last n - 1: their common suffix (carried by the loop) reaches n - 1.
        slot = jnp.arange(S, dtype=jnp.int32)[None, :]
        repeats = (history.suffixes(params) >= n[:, None] - 1) & (slot < history.lengths[:, None])
        rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, S))
        banned = jnp.zeros(logits.shape, jnp.int32).at[rows, history.tokens].max(
            repeats.astype(jnp.int32), mode="drop")
        return remove(logits, banned == 0)


@dataclasses.dataclass(frozen=True)
class LogitBias(LogitsProcessor):
    """Add the row's bias; banned tokens carry ``-inf``."""

    @property
    def name(self) -> str:
        return "logit_bias"

    def enabled(self, params):
        return params.biased

    def apply(self, logits, params, history):
        return logits + params.logit_bias


@dataclasses.dataclass(frozen=True)
class MinNewTokens(LogitsProcessor):
    """Ban the EOS ids while fewer than ``min_new_tokens`` tokens have been generated."""

    reads_history = True
    parameter = Parameter(
        name="min_new_tokens", dtype="int32", neutral=0, low=0, note="0 disables it",
        help=(
            "Ban the EOS ids until this many tokens have been generated."))

    def apply(self, logits, params, history):
        early = history.num_generated < params.min_new_tokens  # [B]
        return remove(logits, ~(early[:, None] & history.eos_mask[None, :]))

