"""Length extrapolation: a model's perplexity at a multiple of its training length, window by
window, and how it grows from one length to another.

Two numbers per evaluation length ``context = factor * L`` (L the training length), both on the
same leading tokens of a stream (``perplexity.perplexity`` says exactly what a window scores):

- ``perplexity``: non-overlapping windows of the context length (as in Press et al.): every token
  is scored, with 1 .. context tokens before it, so it averages short and long contexts.
- ``tail_perplexity``: sliding windows of the context length advanced by L, scoring only each
  window's last L tokens, i.e. only positions (factor - 1) L .. factor L - 1: the positions the
  model never saw in training. At factor 1 it equals ``perplexity`` up to the first window.

A row of metrics (``length_metrics``) keeps every window's NLL sum (``window_nll``,
``tail_window_nll``) with the targets each scores (``window_tokens``, ``tail_window_tokens``):
the units a bootstrap resamples (``stats``). ``window_columns`` reads them back, ``interval`` is a
perplexity's 95% interval over its windows and ``growth`` the ratio of one length's tail
perplexity to another's, the two lengths' windows resampled independently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx

from decodelab.measure import stats
from decodelab.measure.perplexity import perplexity
from decodelab.model import with_config
from decodelab.text import data

METRICS = ("perplexity", "tail_perplexity")
ROPE_SCALINGS = ("none", "linear", "ntk", "yarn")


def encoding_label(position: str, rope_scaling: str) -> str:
    """``rope`` + ``yarn`` -> ``rope+yarn``; an encoding without scaling keeps its name."""
    return position if rope_scaling == "none" else f"{position}+{rope_scaling}"


def scaled(model: nnx.Module, rope_scaling: str, factor: int, train_len: int) -> nnx.Module:
    """``model`` with RoPE ``rope_scaling`` applied at inference time for ``factor`` times its
    training length ``train_len`` (no retraining; the parameters are shared); "none": ``model``."""
    if rope_scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling must be one of {ROPE_SCALINGS}, got {rope_scaling!r}")
    if rope_scaling == "none":
        return model
    if model.config.position != "rope":
        raise ValueError(f"rope_scaling={rope_scaling!r} needs a model with position='rope', "
                         f"got {model.config.position!r}")
    return with_config(model, model.config.replace(
        rope_scaling=rope_scaling, rope_scaling_factor=float(factor),
        rope_original_max_len=train_len))


def length_metrics(model: nnx.Module, tokenizer: Any, *, train_len: int, factor: int,
                   max_tokens: int, batch_size: int) -> dict[str, Any]:
    """The perplexities of ``model`` (trained at length ``train_len``) at ``factor * train_len`` on
    the first ``max_tokens + 1`` validation tokens, with their windows (module docstring). A model
    whose position table is shorter than the context gets None, and a note saying why: it has
    no number for positions it has no row for."""
    context = train_len * factor
    row = {"context_len": context, "factor": factor}
    limit = model.positions.max_positions
    if limit is not None and context > limit:
        return {**row, "perplexity": None, "tail_perplexity": None, "bits_per_char": None,
                "note": f"n/a: {model.config.position} has {limit} positions"}
    stream = data.token_stream(tokenizer, "validation")[:max_tokens + 1]
    num_chars = len(tokenizer.decode(stream.tolist()))
    whole = perplexity(model, stream, context, mode="chunks", batch_size=batch_size,
                       num_chars=num_chars)
    tail = perplexity(model, stream, context, mode="sliding", stride=train_len,
                      batch_size=batch_size)
    return {**row, "perplexity": whole["perplexity"], "bits_per_char": whole["bits_per_char"],
            "tokens": whole["tokens"], "tail_perplexity": tail["perplexity"],
            "tail_tokens": tail["tokens"], "note": "",
            # Per window, the NLL summed over its scored targets (context targets per window for
            # the non-overlapping windows, L for the tail's): what the intervals resample.
            "window_nll": whole["window_nll"], "window_tokens": context,
            "tail_window_nll": tail["window_nll"], "tail_window_tokens": train_len}


def window_columns(metrics: Mapping[str, Any], metric: str = "tail_perplexity"
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """(NLL sums, scored targets), one per window ``[n]``, of ``metric`` (``perplexity`` or
    ``tail_perplexity``) in a row's ``metrics``; None for a row without them (an earlier version
    of the study kept none) or without a finite value."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    prefix = metric.removesuffix("perplexity")
    nll = metrics.get(f"{prefix}window_nll")
    if metrics.get(metric) is None or not nll or len(nll) < 2 or not np.isfinite(metrics[metric]):
        return None
    return (np.asarray(nll, np.float64),
            np.full(len(nll), float(metrics[f"{prefix}window_tokens"])))


def interval(metrics: Mapping[str, Any], metric: str = "tail_perplexity"
             ) -> stats.Interval | None:
    """The 95% interval of ``metric`` over the row's windows; None without windows."""
    columns = window_columns(metrics, metric)
    return None if columns is None else stats.bootstrap(stats.perplexity, columns)


def difference(a: Mapping[str, Any], b: Mapping[str, Any], metric: str = "tail_perplexity"
               ) -> stats.Interval | float | None:
    """``metric`` of ``a`` minus that of ``b`` (two rows' metrics at one length), paired window
    by window (both read the same windows); the plain difference where either keeps no windows;
    None where either has no value."""
    if a.get(metric) is None or b.get(metric) is None:
        return None
    ca, cb = window_columns(a, metric), window_columns(b, metric)
    if ca is None or cb is None or len(ca[0]) != len(cb[0]):
        return a[metric] - b[metric]
    return stats.bootstrap_difference(stats.perplexity, ca, cb)


def growth(low: Mapping[str, Any], high: Mapping[str, Any]) -> stats.Interval | float | None:
    """The tail perplexity of ``high`` (a longer length's metrics) over that of ``low``: an
    Interval where both keep windows (each length's windows resampled on its own), the plain
    ratio where they do not, None where either has no value."""
    if low.get("tail_perplexity") is None or high.get("tail_perplexity") is None:
        return None
    cols_high, cols_low = window_columns(high), window_columns(low)
    if cols_high is None or cols_low is None:
        return high["tail_perplexity"] / low["tail_perplexity"]
    return stats.bootstrap_ratio(stats.perplexity, cols_high, cols_low)
