"""The compiled shapes of a batch call (``generate``, ``speculative_generate``, ``beam_search``):
the buckets a batch, its prompts and its output are padded to, so that a new batch size, prompt
length or ``max_new_tokens`` within a bucket compiles nothing (``request``'s module docstring
states the buckets and what a padding row is), and the cache slots per row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from decodelab.cache import bucket_length, bucket_rows
from decodelab.checks import INT32_MAX, check_size


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The compiled shapes of one batch call (``batch_shapes``) and what is cut back from them:
    ``rows`` real rows in ``padded_rows`` (``cache.bucket_rows``), ``columns`` output tokens per
    row (the clamped ``max_new_tokens``) in ``width`` buffer columns (``output_width``), and
    ``max_len`` cache slots per row."""

    rows: int
    padded_rows: int
    columns: int
    max_len: int

    @property
    def width(self) -> int:
        return output_width(self.columns)


def output_width(max_new_tokens: int) -> int:
    """Output buffer columns of a call with budget ``max_new_tokens``: its bucket, a power of
    two >= 8 (``request``'s module docstring)."""
    return bucket_length(max_new_tokens, minimum=8)


def take_rows(tree: Any, rows: np.ndarray) -> Any:
    """``tree``'s host arrays ``[B, ...]`` with row ``i`` a copy of row ``rows[i]`` (repeats
    allowed: a padding row repeats the last real row, holding values it never uses)."""
    return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def resolve_max_len(max_len: Any, rows: list[np.ndarray], default: int,
                    limit: int | None) -> int:
    """Cache slots per row: ``max_len``, or ``default`` capped by the position table ``limit``;
    every prompt must be shorter than it."""
    if max_len is None:
        S = min(default, limit) if limit else default
        source = ("max_len (default: prompt bucket + max_new_tokens bucket, capped by the "
                  "position table)")
        if S > INT32_MAX:
            raise ValueError(f"{source} is {S}, past 2**31 - 1 (cache lengths are int32); give a "
                             f"smaller max_new_tokens or a max_len")
    else:
        S = check_size("max_len", max_len, 2)
        source = "max_len"
        if limit and S > limit:
            raise ValueError(f"max_len must be <= {limit}, the model's position table "
                             f"(max_seq_len), got {S}")
    for i, r in enumerate(rows):
        if len(r) >= S:
            raise ValueError(f"prompts[{i}] has {len(r)} tokens but {source} is {S}; a prompt "
                             f"must be shorter than max_len to leave room for output")
    return S


def batch_shapes(rows: list[np.ndarray], max_new_tokens: int, max_len: Any, limit: int | None,
                 data: int = 1, extra: int = 0) -> Shapes:
    """The shapes of a call on ``rows`` (checked prompts) with ``max_new_tokens``: ``max_len``
    resolved (default: the prompt bucket plus the output width plus ``extra`` slots, within the
    position table ``limit``), ``max_new_tokens`` clamped to it, and the rows padded for a mesh
    whose ``data`` axis has ``data`` devices (module docstring)."""
    longest = max(len(r) for r in rows)
    S = resolve_max_len(max_len, rows, bucket_length(longest) + output_width(max_new_tokens)
                        + extra, limit)
    return Shapes(rows=len(rows), padded_rows=bucket_rows(len(rows), data),
                  columns=clamp_new_tokens(max_new_tokens, rows, S), max_len=S)


def sample_shapes(shapes: Shapes, n: int, data: int = 1) -> Shapes:
    """The shapes of the state of ``n`` samples per prompt, from ``shapes`` of the P prompts (the
    cache slots and output columns depend on the prompts alone): ``P * n`` real rows, bucketed
    for a mesh whose ``data`` axis has ``data`` devices. Arithmetic only, so a huge ``n`` is
    refused by the memory check before any row exists."""
    if n == 1:
        return shapes
    return dataclasses.replace(shapes, rows=shapes.rows * n,
                               padded_rows=bucket_rows(shapes.rows * n, data))


def clamp_new_tokens(max_new_tokens: int, rows: list[np.ndarray], max_len: int) -> int:
    """The output columns a call needs: ``max_new_tokens``, at most the room ``max_len`` leaves
    after the shortest prompt. A row stops at ``max_len`` anyway, so clamping changes no output
    and keeps a huge budget from sizing buffers nothing can fill."""
    return min(max_new_tokens, max_len - min(len(r) for r in rows))


def prompt_width(rows: list[np.ndarray], max_len: int) -> int:
    """Columns of the prompt block: the bucket of the longest prompt, at most ``max_len``."""
    return min(bucket_length(max(len(r) for r in rows)), max_len)


def prompt_block(rows: list[np.ndarray], shapes: Shapes) -> tuple[np.ndarray, np.ndarray]:
    """The prompts left-aligned in a ``[P, T]`` block (``P``: ``shapes.padded_rows``, each
    padding row a one-token prompt; ``T``: ``prompt_width``), zero-padded, and their lengths
    ``[P]``."""
    block = np.zeros((shapes.padded_rows, prompt_width(rows, shapes.max_len)), np.int32)
    lengths = np.ones((shapes.padded_rows,), np.int32)
    for i, r in enumerate(rows):
        block[i, :len(r)], lengths[i] = r, len(r)
    return block, lengths
