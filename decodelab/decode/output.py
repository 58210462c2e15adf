"""What a batch call returns: ``GenerateOutput``, built on the host from a finished loop state,
with rows that failed raised and rows cut at their stop strings.

Conventions (``generate``, ``speculative_generate`` and their callers rely on them):

- Outputs are host arrays padded to ``N`` columns, ``N`` = ``max_new_tokens`` clamped to the
  room ``max_len`` leaves after the shortest prompt: ``PAD_TOKEN`` past a row's length, NaN in
  the float fields there (padding, not a numerical failure: ``GenerateOutput.valid`` is the mask
  of real entries).
- Finish reasons are the names of ``request``'s finish codes (``FINISH_REASONS``).
- A stop string ends a row at the first token whose text completes it: the output is decoded
  once, and only a row that holds a stop string is searched (``stop_string_cut``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from decodelab.decode.request import (BAD_LOGITS, FINISH_REASONS, NO_ALLOWED_TOKEN, PAD_TOKEN,
                                      BatchRequest)
from decodelab.decode.shapes import Shapes
from decodelab.decode.state import RowState


@dataclasses.dataclass(frozen=True, eq=False)
class GenerateOutput:
    """Per-row results of ``generate``; arrays are padded to ``N`` columns, ``N`` =
    ``min(max_new_tokens, max_len - shortest prompt)`` (no row can generate more). With ``n``
    samples per prompt (n > 1) every array has the leading axes ``[P, n]`` in place of ``[B]``
    and ``finish_reason`` is one list of n reasons per prompt (``samples.grouped``).

    Past a row's length (where ``valid`` is False) the token ids are ``PAD_TOKEN``, the top ids
    ``PAD_TOKEN`` and the float fields NaN: deliberate padding, not a numerical failure. Within a
    row's length they are never NaN (a row whose logits hold NaN stops with finish reason "error"
    before anything is recorded)."""

    tokens: np.ndarray  # [B, N] int32, the output only; PAD_TOKEN past lengths[b]
    lengths: np.ndarray  # [B] int32, output tokens per row
    finish_reason: list[str]  # per row: "eos" | "stop" | "length" | "incomplete" | "error"
    logprobs: np.ndarray  # [B, N] float32, of each token under the distribution it was drawn
    #   from; NaN past lengths[b] (padding)
    top_logprobs: np.ndarray | None  # [B, N, n] float32, that distribution's n largest,
    #   descending; NaN past lengths[b] (padding)
    top_ids: np.ndarray | None  # [B, N, n] int32, their ids (arbitrary where the logprob is
    #   -inf); PAD_TOKEN past lengths[b]
    entropy: np.ndarray | None  # [B, N] float32, that distribution's entropy in nats; NaN past
    #   lengths[b] (padding)

    @property
    def valid(self) -> np.ndarray:
        """``[B, N]`` bool (``[P, n, N]`` with n samples): True where a column holds an output
        token of its row, False where the fields are padding (PAD_TOKEN, NaN)."""
        return np.arange(self.tokens.shape[-1]) < self.lengths[..., None]

    def token_lists(self) -> list[list[int]] | list[list[list[int]]]:
        """Each row's output tokens: one list per prompt, or with n samples per prompt (n > 1)
        one list of n lists per prompt."""
        def lists(tokens, lengths):
            return [row[:k].tolist() for row, k in zip(tokens, lengths)]

        if self.tokens.ndim == 3:
            return [lists(t, k) for t, k in zip(self.tokens, self.lengths)]
        return lists(self.tokens, self.lengths)


def host_output(state: RowState, shapes: Shapes) -> GenerateOutput:
    """The host-side output of a finished loop state (generate's or speculative decoding's), cut
    back to the real rows and ``columns`` of ``shapes``: only those rows of the output fields
    come to the host, never the cache. The top logprobs and the entropy are there when the loop
    recorded them (``OutputSpec``)."""
    B, N = shapes.rows, shapes.columns
    (tokens, prompt_lengths, lengths, finish, logprobs, top_logprobs, top_ids, entropy) = (
        jax.device_get((state.tokens[:B], state.prompt_lengths[:B], state.lengths[:B],
                        state.finish[:B], state.logprobs[:B, :N], state.top_logprobs[:B, :N],
                        state.top_ids[:B, :N], state.entropy[:B, :N])))
    generated = (lengths - prompt_lengths).astype(np.int32)
    index = np.minimum(prompt_lengths[:, None] + np.arange(N)[None, :], tokens.shape[1] - 1)
    valid = np.arange(N)[None, :] < generated[:, None]
    return GenerateOutput(
        tokens=np.where(valid, np.take_along_axis(tokens, index, axis=1), PAD_TOKEN),
        lengths=generated,
        finish_reason=[FINISH_REASONS[c] for c in finish],
        logprobs=logprobs,
        top_logprobs=top_logprobs if top_logprobs.shape[-1] else None,
        top_ids=top_ids if top_ids.shape[-1] else None,
        entropy=entropy if entropy.shape[-1] else None,
    )


def stop_string_cut(ids: list[int], stop_strings: Sequence[str], tokenizer: Any) -> int | None:
    """The smallest k such that ``tokenizer.decode(ids[:k])`` contains a stop string, or None.

    The whole output is decoded once; only a row that holds a stop string is searched, by
    bisection over prefix lengths: a prefix's text is the longer text's start, up to a last
    character still incomplete in the prefix, so once a prefix contains a stop string every
    longer one does. O(log n) decodes rather than one per prefix."""
    def contains(k: int) -> bool:
        text = tokenizer.decode(ids[:k])
        return any(s in text for s in stop_strings)

    if not contains(len(ids)):
        return None
    low, high = 0, len(ids)  # contains(low) is False (the empty prefix), contains(high) True
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if contains(mid) else (mid, high)
    return high


def cut_at_stop_strings(out: GenerateOutput, stop_strings: Sequence[str],
                        tokenizer: Any) -> GenerateOutput:
    """End each row at the first token whose text completes a stop string (finish reason "stop")."""
    tokens, lengths = out.tokens.copy(), out.lengths.copy()
    names = ("logprobs", "top_logprobs", "top_ids", "entropy")
    arrays = {name: getattr(out, name) for name in names}
    arrays = {name: (a.copy() if a is not None else None) for name, a in arrays.items()}
    reasons = list(out.finish_reason)
    for row, n in enumerate(out.lengths):
        cut = stop_string_cut(tokens[row, :n].tolist(), stop_strings, tokenizer)
        if cut is None:
            continue
        lengths[row], reasons[row] = cut, "stop"
        tokens[row, cut:] = PAD_TOKEN
        for name, a in arrays.items():
            if a is not None:
                a[row, cut:] = PAD_TOKEN if name == "top_ids" else np.nan
    return dataclasses.replace(out, tokens=tokens, lengths=lengths, finish_reason=reasons, **arrays)


def finish_output(out: GenerateOutput, finish: np.ndarray,
                  request: BatchRequest) -> GenerateOutput:
    """Raise for rows that failed (unless the request says not to), then cut rows at their stop
    strings. ``finish``: the loop's finish codes, of ``out``'s rows first."""
    finish = np.asarray(finish)[:len(out.lengths)]
    errors = [i for i, c in enumerate(finish) if c in (BAD_LOGITS, NO_ALLOWED_TOKEN)]
    if errors and request.raise_on_error:
        causes = {BAD_LOGITS: "the model's logits hold NaN or +inf",
                  NO_ALLOWED_TOKEN: "no token has a finite probability (the constraint, the "
                                    "sampling parameters or the model's logits exclude every "
                                    "token)"}
        detail = "; ".join(f"row {i} after {int(out.lengths[i])} tokens: {causes[int(finish[i])]}"
                           for i in errors)
        raise ValueError(f"generation failed, nothing was sampled from these rows: {detail} "
                         f"(raise_on_error=False returns the other rows)")
    if request.stop_strings:
        out = cut_at_stop_strings(out, request.stop_strings, request.tokenizer)
    return out
