"""Mirostat (Basu et al. 2021), v1 and v2 as llama.cpp defines them (``src/llama-sampling.cpp``,
``llama_sampler_mirostat_apply`` and ``..._v2_apply``): a truncation steered by each row's
target surprise ``mu``, in bits, which every kept token moves.

- ``mu`` starts at ``2 * mirostat_tau`` when a row starts (``start_mu``: a loop's start, a
  serving slot's admission) and, after each kept token of surprise ``s = -log2 p`` under the
  distribution it was drawn from, becomes ``mu - mirostat_eta * (s - mirostat_tau)``
  (``advanced_mu``). The decode loops carry it per row (``History.mirostat_mu``) and update it
  from the log-probability they record for the token, so the update reads no vocabulary.
- v2 keeps the tokens whose surprise ``-log2 p`` is at most ``mu`` (always the most probable).
- v1 estimates the Zipf exponent ``s`` of the row from its ``M = 100`` most probable tokens
  (least squares of ``log(p_i / p_{i+1})`` on ``log((i + 2) / (i + 1))``), sets
  ``k = (e 2^mu / (1 - V^-e))^(1/s)`` with ``e = s - 1`` and keeps the ``floor(k)`` most
  probable tokens (at least 1, the lowest ids among ties, as ``top_k``). ``V`` is the logits'
  width (llama.cpp's ``n_vocab``). Found without a sort: the ``M`` largest by ``select``'s
  search, ranked among themselves by ``M x M`` compares. ``k`` is computed in log space, so a
  large ``mu`` keeps every token where llama.cpp's ``powf(2, mu)`` overflows to an infinite
  ``k``, whose conversion to int is undefined in C++; an estimate with no pair of kept tokens
  (one token left) keeps that one, as llama.cpp's NaN ``k`` does on x86.
- Both renormalise (the processed logits' softmax is the distribution drawn from).

Order: Mirostat is the last processor (``processors.PROCESSORS``), so a row's processed
distribution is Mirostat's output and the surprise of the token drawn from it is the one
``mu`` learns from. llama.cpp's chain with Mirostat on is temperature then Mirostat, skipping
its other samplers (penalties, top-k, top-p, ...); decodelab applies whatever else the row
enables first, which with the defaults is llama.cpp's chain. A greedy row (temperature 0) stays
greedy (the argmax always survives the cut) and its ``mu`` moves as llama.cpp's does for it, by
a surprise of 0.

Speculative verification reads a row at several positions at once (``History.ahead``): the
processor then scans the positions in order, each with ``mu`` moved by the proposals before it
under the distributions it formed for them (``Mirostat.apply``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from decodelab.sampling import select
from decodelab.sampling.base import LogitsProcessor, probs, remove
from decodelab.sampling.inputs import History, Parameter

LN2 = math.log(2.0)
M = 100  # v1's tokens for the Zipf estimate (llama.cpp's m)
MAX_TAU = 64  # bits: the target surprise of one token


def start_mu(params) -> jax.Array:
    """``[B]`` float32: each row's ``mu`` when it starts, ``2 * mirostat_tau``."""
    return 2.0 * params.mirostat_tau


def advanced_mu(mu: jax.Array, logprob: jax.Array, params, kept: jax.Array) -> jax.Array:
    """``[B]``: ``mu`` after a token whose log-probability (nats) under the distribution it was
    drawn from is ``logprob``: ``mu - eta * (-logprob / ln 2 - tau)``, where ``kept [B]`` and
    the row's Mirostat is on (elsewhere ``mu`` is unchanged). A kept token always has a finite
    log-probability; an infinite one (a position past a rejection) leaves ``mu`` as it is."""
    surprise = -logprob / LN2
    moved = mu - params.mirostat_eta * (surprise - params.mirostat_tau)
    return jnp.where(kept & (params.mirostat != 0) & jnp.isfinite(logprob), moved, mu)


def advanced_along(mu: jax.Array, logprobs: jax.Array, count: jax.Array, params) -> jax.Array:
    """``[B]``: ``mu`` after the first ``count[b]`` tokens whose log-probabilities are
    ``logprobs [B, T]``, one ``advanced_mu`` each, in order."""
    for t in range(logprobs.shape[1]):
        mu = advanced_mu(mu, logprobs[:, t], params, t < count)
    return mu


def _zipf_exponent(logits: jax.Array, active: jax.Array) -> jax.Array:
    """``[B]``: v1's estimate ``s`` from the ``M`` most probable allowed tokens (fewer if fewer
    are allowed); NaN where fewer than two are."""
    B, V = logits.shape
    m = min(M, V)
    logp = jax.nn.log_softmax(logits, axis=-1)
    # The m largest: those above the m-th largest value (the cut), side by side in id order,
    # then copies of the cut's own value for the room left. Tied tokens share one value, so
    # which of them fill the room (what ``keep_exactly`` decides by id, with a running count)
    # changes nothing here. Then each one's rank among them (ties by slot).
    keys = select.sortable(logits)
    cut, _ = select.largest_cut(keys, None, jnp.full((B,), m, jnp.float32), active)
    top = (keys > cut[:, None]) & (logits > -jnp.inf)
    slot = jnp.where(top, jnp.cumsum(top, axis=-1) - 1, m)  # [B, V]; m: dropped
    rows = jnp.arange(B)[:, None]
    values = jnp.full((B, m), -jnp.inf).at[rows, slot].set(logp, mode="drop")  # [B, m]
    at_cut = jnp.max(jnp.where(keys == cut[:, None], logp, -jnp.inf), axis=-1)  # [B]
    j = jnp.arange(m)
    values = jnp.where(j[None, :] >= jnp.sum(top, axis=-1)[:, None], at_cut[:, None], values)
    ahead = (values[:, None, :] > values[:, :, None]) | (
        (values[:, None, :] == values[:, :, None]) & (j[None, None, :] < j[None, :, None]))
    rank = jnp.sum(ahead, axis=-1)  # [B, m]
    ordered = jnp.full((B, m), -jnp.inf).at[rows, rank].set(values)  # descending
    i = jnp.arange(m - 1, dtype=jnp.float32)
    t = jnp.log((i + 2) / (i + 1))[None, :]  # [1, m - 1]
    pair = ordered[:, 1:] > -jnp.inf  # both tokens of the pair allowed
    b = jnp.where(pair, ordered[:, :-1] - ordered[:, 1:], 0.0)  # log(p_i / p_{i+1})
    return jnp.sum(t * b, axis=-1) / jnp.sum(jnp.where(pair, t * t, 0.0), axis=-1)


def _v1_keep(logits: jax.Array, mu: jax.Array, active: jax.Array) -> jax.Array:
    """``[B, V]`` bool: v1's kept tokens (module docstring)."""
    V = logits.shape[-1]
    s = _zipf_exponent(logits, active)
    e = s - 1.0
    # log2 of e / (1 - V^-e), which is positive for either sign of e; 1 / ln V as e -> 0.
    safe = jnp.where(e == 0, 1.0, e)
    ratio = jnp.where(e == 0, 1.0 / math.log(V), safe / -jnp.expm1(-safe * math.log(V)))
    log2_k = (jnp.log2(ratio) + mu) / s
    k = jnp.floor(jnp.exp2(jnp.minimum(log2_k, math.log2(V) + 1.0)))
    k = jnp.where(jnp.isnan(k), 1.0, jnp.clip(k, 1.0, V)).astype(jnp.int32)
    return select.keep_exactly(select.sortable(logits), k, active)


def _v2_keep(logits: jax.Array, mu: jax.Array) -> jax.Array:
    """``[B, V]`` bool: v2's kept tokens, surprise ``-log2 p <= mu``, and the most probable."""
    p = probs(logits)
    return (-jnp.log2(p) <= mu[:, None]) | (p >= jnp.max(p, axis=-1, keepdims=True))


def truncated(logits: jax.Array, params, mu: jax.Array) -> jax.Array:
    """``[B, V]`` logits with each row's Mirostat cut at ``mu [B]`` (rows with Mirostat off, or
    with nothing allowed, unchanged); v1's search runs only when some row uses v1."""
    v1 = params.mirostat == 1
    v2 = params.mirostat == 2
    keep = jnp.where(v2[:, None], _v2_keep(logits, mu), True)
    keep = jax.lax.cond(jnp.any(v1), lambda: keep & _v1_keep(logits, mu, v1), lambda: keep)
    return remove(logits, keep)


@dataclasses.dataclass(frozen=True)
class Mirostat(LogitsProcessor):
    """Mirostat v1 or v2 at the row's ``mu`` (module docstring)."""

    reads_history = True
    parameter = Parameter(
        name="mirostat", dtype="int32", neutral=0, low=0, high=2,
        note="0 disables it, 1 is Mirostat v1, 2 is Mirostat v2",
        help=(
            "Mirostat (llama.cpp's): truncate to steer each token's surprise towards "
            "mirostat_tau bits; 1 is v1 (a top-k from a Zipf estimate), 2 is v2 (drop tokens "
            "whose surprise exceeds mu); 0 disables."))
    settings = (
        Parameter(
            name="mirostat_tau", dtype="float32", neutral=5.0, low=0, high=MAX_TAU,
            open_low=True, note="bits",
            help="Mirostat's target surprise per token, in bits; mu starts at 2 * tau."),
        Parameter(
            name="mirostat_eta", dtype="float32", neutral=0.1, low=0, high=1,
            note="0 keeps mu at 2 * tau",
            help="Mirostat's learning rate: mu -= eta * (surprise - tau) after each token."),
    )

    def apply(self, logits, params, history: History):
        mu = history.mirostat_mu  # None: every row at its start
        if history.ahead is None:
            return truncated(logits, params, start_mu(params) if mu is None else mu)
        # Rows b * T + t: row b at its t-th position, after the proposals ahead[b, :t].
        B, T = history.ahead.shape
        V = logits.shape[-1]
        row = jax.tree.map(lambda a: a[::T], params)  # [B] per field
        mu = start_mu(row) if mu is None else mu

        def position(mu, inputs):
            logits_t, token = inputs  # [B, V], [B]
            cut = truncated(logits_t, row, mu)
            logp = (jnp.take_along_axis(cut, token[:, None], axis=-1)[:, 0]
                    - jax.nn.logsumexp(cut, axis=-1))
            return advanced_mu(mu, logp, row, jnp.ones_like(token, bool)), cut

        _, cut = jax.lax.scan(position, mu, (jnp.swapaxes(logits.reshape(B, T, V), 0, 1),
                                             history.ahead.T))
        return jnp.swapaxes(cut, 0, 1).reshape(B * T, V)
