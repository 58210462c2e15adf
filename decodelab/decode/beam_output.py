"""What ``beam_search`` returns: the n-best hypotheses of each prompt, read from the pool of a
finished beam state (``beam``'s module docstring says how the pool is filled and ranked)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from decodelab.decode.request import FINISH_REASONS, PAD_TOKEN
from decodelab.decode.shapes import Shapes


@dataclasses.dataclass(frozen=True, eq=False)
class BeamSearchOutput:
    """The n-best hypotheses of each prompt, best first (``R`` = ``num_return``, ``N`` =
    ``min(max_new_tokens, max_len - shortest prompt)``).

    Padding is never NaN: token ids are ``PAD_TOKEN`` past a hypothesis's length, and an empty
    slot (finish reason "none") has length 0 and score and log-probability -inf. A NaN in the
    model's logits raises instead of reaching the output."""

    tokens: np.ndarray  # [B, R, N] int32, the output only; PAD_TOKEN past lengths
    lengths: np.ndarray  # [B, R] int32, output tokens, a finishing EOS included
    scores: np.ndarray  # [B, R] float32, logprobs / lp(lengths): what the ranking sorts by;
    #   -inf for an empty slot
    logprobs: np.ndarray  # [B, R] float32, the model's log-probability of the output; -inf for
    #   an empty slot
    finish_reason: list[list[str]]  # "eos" | "length" | "incomplete" ("none": fewer
    #   hypotheses than R exist)

    def token_lists(self) -> list[list[list[int]]]:
        """Per prompt, its hypotheses best first, each a list of token ids."""
        return [[row[:n].tolist() for row, n in zip(rows, ns)]
                for rows, ns in zip(self.tokens, self.lengths)]

    def best(self) -> list[list[int]]:
        """The top hypothesis of each prompt."""
        return [hypotheses[0] for hypotheses in self.token_lists()]


def n_best(state: Any, num_return: int, shapes: Shapes) -> BeamSearchOutput:
    """The n-best lists of the real prompts of a finished ``beam.BeamState``, in
    ``shapes.columns`` columns."""
    B, R, N = shapes.rows, num_return, shapes.columns
    tokens, lengths, scores, logprobs, reasons = jax.device_get(
        (state.pool_tokens[:B, :, :N], state.pool_lengths[:B], state.pool_scores[:B],
         state.pool_logprobs[:B], state.pool_reasons[:B]))
    if np.isnan(scores).any():
        bad = sorted({int(b) for b in np.argwhere(np.isnan(scores))[:, 0]})
        raise ValueError(f"beam search failed for prompts {bad}: the model's logits hold NaN")
    valid = np.arange(tokens.shape[2])[None, None, :] < lengths[:, :R, None]
    return BeamSearchOutput(
        tokens=np.where(valid, tokens[:, :R], PAD_TOKEN).astype(np.int32),
        lengths=lengths[:, :R].astype(np.int32),
        scores=scores[:, :R],
        logprobs=logprobs[:, :R],
        finish_reason=[[FINISH_REASONS[c] for c in row[:R]] for row in reasons],
    )
