"""Metrics of models and their outputs. So far: perplexity of a token stream at a context length.

What ``perplexity`` counts, exactly:

- ``stream`` is ``int [N]`` token ids (``data.token_stream``: documents as ``bos + ids + eos``,
  concatenated). Its ``N - 1`` tokens after the first are the *targets*.
- A *window* is ``L + 1`` consecutive tokens, ``L = context_len``: the model reads ``w[:-1]`` at
  positions ``0 .. L-1`` in one forward pass and predicts ``w[1:]``. The target at input position
  ``j`` is predicted from the ``j + 1`` tokens before it in its window (never from earlier windows).
- ``mode="chunks"``: windows start at ``0, L, 2L, ...`` (neighbours share one token) and every
  target of every window is scored: each target once, with 1 to L tokens of context. This is how
  ``train.evaluate`` over ``data.eval_windows`` counts.
- ``mode="sliding"``: windows start at ``0, S, 2S, ...`` (``S = stride``, ``1 <= S <= L``) and each
  window scores only its last ``S`` targets: each scored target sees ``L - S + 1`` to ``L`` tokens of
  context. The first ``L - S`` targets of the stream are not scored. ``S = L`` is ``"chunks"``.
- Both modes use the ``K = (N - L - 1) // S + 1`` windows that fit (``S = L`` for chunks); the
  remaining tail (fewer than ``S`` targets) is not scored. ``tokens = K * S`` targets are scored.
- ``loss`` is the mean negative log-likelihood in nats per scored target; ``perplexity = exp(loss)``.
- ``bits_per_char = loss * (N - 1) / num_chars / ln 2``: the mean loss per target, charged to all
  ``N - 1`` targets of the stream, over the ``num_chars`` characters the stream encodes. When every
  target is scored this is exactly the total nats / ln 2 / ``num_chars``; when a head or a tail is
  not scored, the scored targets stand in for them at their mean. Targets ``bos`` and ``eos`` count
  as tokens but encode no character (``data.split_num_chars`` counts the documents' characters).

One jit compilation serves every call with the same model structure, ``batch_size`` and
``context_len`` (the stride is a traced value); the last batch is padded and its padding rows masked.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

MODES = ("chunks", "sliding")


@functools.partial(jax.jit, static_argnums=0)
def _scored_nll_sum(graphdef, state, windows, row_weights, first_scored):
    """``[B]``: per row, the NLL summed over targets at input positions ``>= first_scored``, times
    the row's weight (1 real, 0 padding); the caller adds the rows up in float64.

    ``graphdef`` is an nnx GraphDef with ``state`` its state, or a plain ``tokens -> logits``
    function with ``state`` None. windows: [B, L + 1] int32, row_weights: [B] float32.
    """
    model = graphdef if state is None else nnx.merge(graphdef, state)
    logits = model(windows[:, :-1])  # [B, L, V]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])  # [B, L]
    positions = jnp.arange(nll.shape[1], dtype=jnp.int32)  # [L]
    scored = (positions >= first_scored).astype(jnp.float32)[None, :] * row_weights[:, None]
    return (nll * scored).sum(axis=1)  # [B]


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def perplexity(
    model: nnx.Module | Callable[[jax.Array], jax.Array],
    stream: np.ndarray,
    context_len: int,
    *,
    mode: str = "chunks",
    stride: int | None = None,
    batch_size: int = 16,
    num_chars: int | None = None,
    progress: bool = False,
) -> dict[str, float | int]:
    """Perplexity of ``model`` on ``stream`` at ``context_len`` (see the module docstring for what is
    scored). ``model`` maps ``tokens [B, T] int32 -> logits [B, T, V]``: a ``Transformer`` (or any
    nnx Module) or a plain function.

    Returns ``{"loss", "perplexity", "tokens"}`` plus ``"bits_per_char"`` when ``num_chars`` is given.
    Raises ValueError naming a bad argument; a model with a learned position table refuses a
    ``context_len`` beyond it.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _check_int("context_len", context_len, 1)
    if mode == "chunks":
        if stride is not None:
            raise ValueError(f"stride must be None for mode='chunks' (windows advance by "
                             f"context_len), got {stride!r}")
        stride = context_len
    elif (not isinstance(stride, (int, np.integer)) or isinstance(stride, bool)
          or not 1 <= stride <= context_len):
        raise ValueError(f"stride must be an int in [1, context_len={context_len}] for "
                         f"mode='sliding', got {stride!r}")
    _check_int("batch_size", batch_size, 1)
    if num_chars is not None:
        _check_int("num_chars", num_chars, 1)
    stream = np.asarray(stream)
    if stream.ndim != 1 or not np.issubdtype(stream.dtype, np.integer):
        raise ValueError(f"stream must be a 1-D array of token ids, got shape {stream.shape} of "
                         f"{stream.dtype}")
    if len(stream) < context_len + 1:
        raise ValueError(f"stream must hold at least context_len + 1 = {context_len + 1} tokens, "
                         f"got {len(stream)}")
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if stream.min() < 0 or (vocab_size is not None and stream.max() >= vocab_size):
        raise ValueError(f"stream must hold ids in [0, {vocab_size or 'V'}), got "
                         f"[{stream.min()}, {stream.max()}]")
    stream = stream.astype(np.int32)

    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)
    else:
        graphdef, state = model, None
    num_windows = (len(stream) - context_len - 1) // stride + 1
    offsets = np.arange(context_len + 1)  # [L + 1]
    first_scored = np.int32(context_len - stride)
    partial_sums = []
    batches = range(0, num_windows, batch_size)
    for start in tqdm(batches, disable=not progress, desc=f"perplexity @{context_len}",
                      unit="batch", leave=False, dynamic_ncols=True):
        starts = np.arange(start, min(start + batch_size, num_windows)) * stride  # [b]
        windows = np.zeros((batch_size, context_len + 1), np.int32)  # [B, L + 1]
        windows[:len(starts)] = stream[starts[:, None] + offsets[None, :]]
        weights = np.zeros((batch_size,), np.float32)
        weights[:len(starts)] = 1.0
        partial_sums.append(_scored_nll_sum(graphdef, state, windows, weights, first_scored))
    tokens = num_windows * stride
    loss = sum(np.asarray(s, np.float64).sum() for s in partial_sums) / tokens
    loss = float(loss)
    # exp overflows a float past ~709 nats; such a model's perplexity is reported as inf.
    result = {"loss": loss, "perplexity": math.exp(loss) if loss < 709 else math.inf,
              "tokens": tokens}
    if num_chars is not None:
        result["bits_per_char"] = loss * (len(stream) - 1) / num_chars / math.log(2)
    return result
