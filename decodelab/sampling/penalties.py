"""The processors that act on the model's scores before any reshaping: the penalties over the
tokens so far (repetition, frequency, presence, no-repeat n-grams), the logit bias and bans, and
min-new-tokens. Their order in the pipeline is ``processors.PROCESSORS``'s.
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
        repeats = (history.suffixes(n) >= n[:, None] - 1) & (slot < history.lengths[:, None])
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

