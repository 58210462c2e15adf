"""compare(reference, candidate, tokens): how far a compressed model's next-token distributions are
from the reference's, on the same windows (llama.cpp's ``llama-perplexity --kl-divergence`` table).

What is counted, exactly:

- ``tokens`` is ``int [W, T]``: W windows of T tokens. Each model reads a window in one forward pass
  at positions ``0 .. T-1``; the distributions at positions ``0 .. T-2`` are scored (the target of
  position j is token j + 1 of the window), ``W * (T - 1)`` positions in all.
- At every scored position: ``KL(P_ref || P_cand) = sum_v P_ref(v) (log P_ref(v) - log P_cand(v))``
  in nats; whether both models' most likely tokens are the same (ties go to the lowest id); the
  difference ``P_cand(t) - P_ref(t)`` at the reference's most likely token t.
- ``kl_mean`` / ``kl_p99``: the mean and the 99th percentile (linear interpolation) of the KL over
  all positions; ``same_top``: the percentage of positions with the same top token;
  ``rms_top_prob``: the root mean square of the probability difference at the reference's top token.
- Perplexity ``exp(mean NLL of the targets)`` of each model on the same positions, and the
  difference candidate minus reference.
- Per window (for a bootstrap over windows): ``kl_per_window`` and ``same_top_per_window`` (the
  window's mean KL and percentage), ``nll_reference_per_window`` / ``nll_candidate_per_window`` (the
  window's mean NLL). Every window has ``T - 1`` positions, so their means are the totals'.
- ``parameter_bytes`` at each element's bit width (``quantize.parameter_bytes``);
  ``kv_bytes_per_token``: the bytes the KV cache holds per token (all layers, keys and values,
  with scales).
- A model with a ``kv_cache`` kind other than None reads its windows through a cache of that kind
  (prefilled with the window), so a quantized cache's error is in its logits.

Either model may be any callable ``tokens [B, T] -> logits [B, T, V]`` (tests use stand-ins); bytes
are reported only for decodelab models (None otherwise).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.cache import bytes_per_token, check_kind, init_cache
from decodelab.checks import check_int
from decodelab.compress.quantization import parameter_bytes
from decodelab.model.losses import token_nll


@dataclasses.dataclass(frozen=True)
class Scoreboard:
    """The comparison of ``candidate`` with ``reference`` (module docstring)."""

    positions: int  # scored positions, W * (T - 1)
    kl_mean: float  # nats
    kl_p99: float  # nats
    same_top: float  # percent
    rms_top_prob: float  # RMS of P_cand - P_ref at the reference's top token
    perplexity_reference: float
    perplexity_candidate: float
    perplexity_diff: float  # candidate - reference
    parameter_bytes_reference: int | None
    parameter_bytes_candidate: int | None
    kv_bytes_per_token_reference: int | None
    kv_bytes_per_token_candidate: int | None
    kl_per_window: tuple[float, ...]
    same_top_per_window: tuple[float, ...]
    nll_reference_per_window: tuple[float, ...]
    nll_candidate_per_window: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@functools.partial(jax.jit, static_argnames=("graphdef", "kv_cache"))
def _model_logits(graphdef, state, windows, *, kv_cache):
    model = nnx.merge(graphdef, state)
    if kv_cache is None:
        logits = model(windows)
    else:
        B, T = windows.shape
        cache = init_cache(model.config, B, T, kv_cache)
        logits, _ = model(windows, cache=cache)
    return logits.astype(jnp.float32)  # [B, T, V]


def _logits(model, windows: np.ndarray, kv_cache: str | None) -> jax.Array:
    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)
        return _model_logits(graphdef, state, jnp.asarray(windows), kv_cache=kv_cache)
    if kv_cache is not None:
        raise ValueError("a kv_cache kind needs a decodelab model, got a plain callable")
    return jnp.asarray(model(jnp.asarray(windows)), jnp.float32)


@jax.jit
def _position_stats(ref_logits: jax.Array, cand_logits: jax.Array, targets: jax.Array):
    """Per position ``[B, T]``: KL, same top, P difference at the reference's top, both NLLs."""
    ref = jax.nn.log_softmax(ref_logits, axis=-1)  # [B, T, V]
    cand = jax.nn.log_softmax(cand_logits, axis=-1)
    p_ref = jnp.exp(ref)
    kl = jnp.sum(p_ref * (ref - cand), axis=-1)
    top = jnp.argmax(ref, axis=-1)
    same = top == jnp.argmax(cand, axis=-1)
    at_top = lambda lp: jnp.take_along_axis(lp, top[..., None], axis=-1)[..., 0]  # noqa: E731
    diff = jnp.exp(at_top(cand)) - jnp.exp(at_top(ref))
    return kl, same, diff, token_nll(ref_logits, targets), token_nll(cand_logits, targets)


def _bytes(model) -> int | None:
    return parameter_bytes(model) if isinstance(model, nnx.Module) else None


def _kv_bytes(model, kv_cache: str | None) -> int | None:
    config = getattr(model, "config", None)
    return None if config is None else bytes_per_token(config, kv_cache)


def compare(reference, candidate, tokens, *, batch_size: int = 8,
            reference_kv_cache: str | None = None,
            candidate_kv_cache: str | None = None) -> Scoreboard:
    """The scoreboard of ``candidate`` against ``reference`` on the windows ``tokens [W, T]``
    (module docstring), ``batch_size`` windows per forward pass."""
    windows = np.asarray(tokens)
    if windows.ndim != 2 or windows.shape[1] < 2 or not np.issubdtype(windows.dtype, np.integer):
        raise ValueError(f"tokens must be integer windows [W, T] with T >= 2, got shape "
                         f"{windows.shape} and dtype {windows.dtype}")
    check_int("batch_size", batch_size, 1)
    for name, kind in (("reference_kv_cache", reference_kv_cache),
                       ("candidate_kv_cache", candidate_kv_cache)):
        check_kind(name, kind)
    windows = windows.astype(np.int32)
    stats = []
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size]
        ref = _logits(reference, batch, reference_kv_cache)[:, :-1]
        cand = _logits(candidate, batch, candidate_kv_cache)[:, :-1]
        stats.append([np.asarray(s, np.float64)
                      for s in _position_stats(ref, cand, jnp.asarray(batch[:, 1:]))])
    per_window = [np.concatenate(column) for column in zip(*stats)]  # each [W, T - 1]
    kl, same, diff, nll_ref, nll_cand = (column.ravel() for column in per_window)

    def window_means(column: np.ndarray, scale: float = 1.0) -> tuple[float, ...]:
        return tuple(float(v) for v in scale * column.mean(axis=1))

    ppl_ref, ppl_cand = math.exp(nll_ref.mean()), math.exp(nll_cand.mean())
    return Scoreboard(
        positions=int(kl.size), kl_mean=float(kl.mean()), kl_p99=float(np.percentile(kl, 99)),
        same_top=float(100.0 * same.mean()), rms_top_prob=float(np.sqrt(np.mean(diff**2))),
        perplexity_reference=ppl_ref, perplexity_candidate=ppl_cand,
        perplexity_diff=ppl_cand - ppl_ref,
        parameter_bytes_reference=_bytes(reference), parameter_bytes_candidate=_bytes(candidate),
        kv_bytes_per_token_reference=_kv_bytes(reference, reference_kv_cache),
        kv_bytes_per_token_candidate=_kv_bytes(candidate, candidate_kv_cache),
        kl_per_window=window_means(per_window[0]),
        same_top_per_window=window_means(per_window[1], 100.0),
        nll_reference_per_window=window_means(per_window[3]),
        nll_candidate_per_window=window_means(per_window[4]))
