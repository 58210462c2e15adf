"""The distribution each row samples from: the model's logits through the processors
(``processors.PROCESSORS``, in pipeline order, each skipped at run time when no row enables it),
and the greedy choice, which takes the argmax of the scores before temperature.

``processed_logprobs`` is the distribution that is sampled from, and the one speculative
decoding's accept/reject test reads. The decode loops draw from the same processed logits
(``process_scores``) and report the token's logprob as its logit less the draw's log total
(``params.draw_with_total``): the same distribution up to float32 rounding, without a
log-softmax of the whole vocabulary per step.

A decode step chooses between the argmax (every running row greedy) and the sampled draw at run
time, in one program. ``score`` runs the processors before temperature once for both paths, and
``greedy_choice`` and ``process_scores`` continue from its ``Scored``: the program holds each
processor once, not once per path, which keeps it (and its compile time) smaller.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from decodelab.sampling.base import argmax
from decodelab.sampling.inputs import History
from decodelab.sampling.processors import PROCESSORS, RowParams

__all__ = ["Scored", "all_greedy", "bad_logits", "greedy_choice", "greedy_scores",
           "process_logits", "process_scores", "processed_logprobs", "score"]

# The processors before temperature: what a greedy row's argmax is taken over.
_BEFORE_TEMPERATURE = PROCESSORS[:[p.name for p in PROCESSORS].index("temperature")]
_FROM_TEMPERATURE = PROCESSORS[len(_BEFORE_TEMPERATURE):]


# process_logits and processed_logprobs are compiled as one program each when called outside a
# traced function (a reference distribution, a quality metric): op by op, every processor's
# lax.cond would compile on its own at every call. Inside a traced function they are inlined.
@jax.jit
def process_logits(logits: jax.Array, params: RowParams, history: History) -> jax.Array:
    """``[B, V]`` model logits -> processed logits, through every processor in pipeline order
    (each skipped at run time when no row enables it)."""
    logits = logits.astype(jnp.float32)
    for processor in PROCESSORS:
        logits = processor(logits, params, history)
    return logits


def greedy_scores(logits: jax.Array, params: RowParams, history: History) -> jax.Array:
    """``[B, V]`` model logits -> the scores a greedy row takes the argmax of: the logits through
    the processors before temperature (penalties, bans, min-new-tokens). A greedy row's
    processed distribution is that argmax alone, with log-probability 0."""
    logits = logits.astype(jnp.float32)
    for processor in _BEFORE_TEMPERATURE:
        logits = processor(logits, params, history)
    return logits


def all_greedy(params: RowParams, skip: jax.Array | None = None) -> jax.Array:
    """``[]`` bool: every row (but those in ``skip``, ``[B]`` bool) has temperature 0, so a
    decode step can take the argmax path (``greedy_choice``) at run time, in the same program."""
    greedy = params.temperature == 0.0
    return jnp.all(greedy if skip is None else greedy | skip)


@jax.jit
def processed_logprobs(logits: jax.Array, params: RowParams, history: History,
                       scored: Scored | None = None) -> jax.Array:
    """``[B, V]`` log-probabilities of the distribution each row samples from (``-inf`` = never);
    ``scored``: ``score``'s, when the caller has them already.

    A row whose logits hold NaN, or whose processors left no token, comes back NaN / all ``-inf``;
    the decode loop checks for both and never samples such a row.
    """
    if scored is None:
        return jax.nn.log_softmax(process_logits(logits, params, history), axis=-1)
    return jax.nn.log_softmax(process_scores(scored, params, history), axis=-1)


def bad_logits(logits: jax.Array) -> jax.Array:
    """``[...]`` bool: the ``[..., V]`` logits hold NaN or +inf, so nothing can be sampled."""
    return jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1)


class Scored(struct.PyTreeNode):
    """The model's logits through the processors before temperature, once, for both of a step's
    paths (``score``): the greedy argmax is taken over ``scores`` (``greedy_choice``), and the
    processors from temperature on continue from them (``process_scores``)."""

    scores: jax.Array  # [B', V] float32: greedy_scores, or the logits when no row enables one
    best: jax.Array  # [B'] their max (-inf: no token allowed)
    raw: jax.Array  # [B'] the max of the model's own logits (NaN or +inf: bad logits)

    def bad(self) -> jax.Array:
        """``[B']`` bool: the row's logits hold NaN or +inf (``bad_logits``, from their max)."""
        return jnp.isnan(self.raw) | (self.raw == jnp.inf)

    def usable(self, log_normaliser: jax.Array) -> jax.Array:
        """``[B']`` bool: finite logits that leave at least one allowed token (``log_normaliser``:
        the logsumexp of the processed logits, -inf when none is allowed)."""
        return ~self.bad() & (log_normaliser > -jnp.inf)

    def greedy(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``([B'] argmax of the scores, [B'] bad logits, [B'] no allowed token)``."""
        return argmax(self.scores, self.best), self.bad(), ~(self.best > -jnp.inf)


def score(logits: jax.Array, params: RowParams, history: History) -> Scored:
    """``[..., V]`` logits -> ``Scored`` of their ``[B', V]`` rows. One run-time check for the
    whole group of processors before temperature, so a step with none of them on pays one cond
    and no copy."""
    flat = logits.reshape(-1, logits.shape[-1])
    raw = jnp.max(flat, axis=-1)  # NaN if the row holds NaN (a ban may hide it in the scores)

    def plain():  # no processor before temperature is on: the scores are the logits
        return flat.astype(jnp.float32), raw.astype(jnp.float32)

    def processed():
        scores = greedy_scores(flat, params, history)  # [B', V]
        return scores, jnp.max(scores, axis=-1)

    on = functools.reduce(jnp.logical_or, [jnp.any(p.enabled(params))
                                           for p in _BEFORE_TEMPERATURE])
    scores, best = jax.lax.cond(on, processed, plain)
    return Scored(scores=scores, best=best, raw=raw)


def process_scores(scored: Scored, params: RowParams, history: History) -> jax.Array:
    """``[B', V]`` processed logits: ``process_logits`` continued from ``score``'s scores (the
    processors from temperature on)."""
    logits = scored.scores
    for processor in _FROM_TEMPERATURE:
        logits = processor(logits, params, history)
    return logits


def greedy_choice(logits: jax.Array, params: RowParams, history: History,
                  scored: Scored | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``[..., V]`` logits of greedy rows -> ``([...] argmax, [...] bad logits, [...] no
    allowed token)``: the argmax of the scores before temperature (``greedy_scores``), with no
    softmax; a row is usable where neither flag is set. ``scored``: ``score``'s, when the caller
    has them already."""
    scored = score(logits, params, history) if scored is None else scored
    return tuple(x.reshape(logits.shape[:-1]) for x in scored.greedy())
