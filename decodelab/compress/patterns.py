"""Sparsity patterns: which weights of a scored projection ``[In, Out]`` a pattern zeroes
(``decodelab.compress.pruning``'s module docstring states the patterns and the scores).

A weight that is already zero scores 0, the lowest score there is, so pruning a pruned model
keeps its zeros; ``zeros_asked`` is what a pattern zeroes, which ``prune`` compares with the
zeros a projection already holds.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

PATTERNS = ("unstructured", "2:4", "4:8")
SCOPES = ("row", "layer")


def n_and_m(pattern: str) -> tuple[int, int] | None:
    """``(N, M)`` of an ``"N:M"`` pattern, None for ``"unstructured"``."""
    match = re.fullmatch(r"(\d+):(\d+)", pattern)
    return None if match is None else (int(match[1]), int(match[2]))


def scores(w: jax.Array, input_norm: jax.Array | None) -> jax.Array:
    """``|W| [In, Out]``, times ``input_norm [In]`` (Wanda) when given."""
    magnitude = jnp.abs(jnp.asarray(w, jnp.float32))
    if input_norm is not None and np.shape(input_norm) != magnitude.shape[:1]:
        raise ValueError(f"input_norm must have one value per input ({magnitude.shape[0]}), got "
                         f"shape {list(np.shape(input_norm))}")
    return magnitude if input_norm is None else magnitude * input_norm[:, None]


def lowest(score: jax.Array, k: int, axis: int | None) -> jax.Array:
    """A mask (True: kept) zeroing exactly the ``k`` lowest scores along ``axis`` (None: all)."""
    flat = score.reshape(-1) if axis is None else jnp.moveaxis(score, axis, -1)
    order = jnp.argsort(flat, axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)  # each score's place in ascending order
    keep = rank >= k
    return keep.reshape(score.shape) if axis is None else jnp.moveaxis(keep, -1, axis)


def mask_of(score: jax.Array, sparsity: float, pattern: str, scope: str) -> jax.Array:
    """The kept-weight mask ``[In, Out]`` of ``score``: ``zeros_asked`` of its weights are False."""
    In, Out = score.shape
    n_m = n_and_m(pattern)
    if n_m is not None:
        N, M = n_m
        if In % M:
            raise ValueError(f"pattern={pattern!r} needs each projection's input dimension to be "
                             f"a multiple of {M}, got {In}")
        grouped = score.reshape(In // M, M, Out)  # [In / M, M, Out]
        return lowest(grouped, N, axis=1).reshape(In, Out)
    if scope == "row":
        return lowest(score, round(sparsity * In), axis=0)
    return lowest(score, round(sparsity * In * Out), axis=None)


def zeros_asked(shape: tuple[int, int], sparsity: float, pattern: str, scope: str) -> int:
    """How many weights of a projection ``[In, Out]`` ``mask_of`` zeroes."""
    (In, Out), n_m = shape, n_and_m(pattern)
    if n_m is not None:
        return n_m[0] * (In // n_m[1]) * Out
    return round(sparsity * In) * Out if scope == "row" else round(sparsity * In * Out)
