"""The processor interface and the pieces every processor is built from.

A processor maps ``[B, V]`` float32 logits to ``[B, V]`` logits, ``-inf`` marking a removed token;
it reads its per-row setting from ``RowParams`` (``processors``) under its ``Parameter``'s name.
``remove``, ``probs``, ``entropy``, ``keep_top_mass`` and ``keep_above`` are the shared steps the
truncations are written in; ``logprob_entropy`` is also the entropy the decode loops record.
A processor is in every compiled program; one that no row enables is skipped at run time (a
``lax.cond`` on its ``[B]`` enabled flags), so the parameter values, which processors are on
included, are data and never a new trace.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp

from decodelab.sampling import select
from decodelab.sampling.inputs import History, Parameter

# ``RowParams`` (``processors``) is built from the registry of the processors defined on this
# interface: annotations name it as a string, and this module never imports it.


def remove(logits: jax.Array, keep: jax.Array) -> jax.Array:
    return jnp.where(keep, logits, -jnp.inf)


def probs(logits: jax.Array) -> jax.Array:
    return jax.nn.softmax(logits, axis=-1)


def entropy(logits: jax.Array) -> jax.Array:  # [B, V] -> [B], in nats; removed tokens add 0
    return logprob_entropy(jax.nn.log_softmax(logits, axis=-1))


def logprob_entropy(logprobs: jax.Array) -> jax.Array:
    """``[..., V]`` normalised log-probabilities -> ``[...]`` entropy in nats; removed tokens
    (-inf) add 0."""
    p = jnp.exp(logprobs)
    return -jnp.sum(jnp.where(p > 0, p * logprobs, 0.0), axis=-1)


def keep_top_mass(logits: jax.Array, order: jax.Array, mass: jax.Array,
                  active: jax.Array) -> jax.Array:
    """Keep the smallest set of tokens, taken in descending ``order``, whose probability mass
    reaches ``mass[b]`` (of the row's float32 total, so a mass just below 1 is always reached): a
    token stays if the mass before it is < mass (so with probabilities 0.5 / 0.4 / 0.1 and mass
    0.9 exactly two stay). Ties with the last kept token's order stay too. ``order`` of removed
    tokens must be -inf; rows not ``active`` pass unchanged. Found without sorting
    (``select.keep_top_weight``): the mass sums run in another order than a sorted prefix sum, so
    a boundary within float32 rounding of ``mass`` can fall either way."""
    keep = select.keep_top_weight(select.sortable(order), probs(logits), mass, active)
    return remove(logits, keep)


def keep_above(logits: jax.Array, threshold: jax.Array) -> jax.Array:
    """Keep tokens with probability >= threshold[b], and always the most probable."""
    p = probs(logits)
    best = jnp.max(p, axis=-1, keepdims=True)
    return remove(logits, (p >= threshold[:, None]) | (p >= best))


class LogitsProcessor(abc.ABC):
    """One step of the pipeline: ``[B, V]`` logits -> ``[B, V]`` logits; ``-inf`` = removed.

    ``parameter`` is the per-row setting it owns (None for one that reads only ``logit_bias``).
    ``enabled`` says which rows it acts on (by default: those whose setting is not neutral); the
    others pass through unchanged, and when no row is enabled it does no work.
    """

    parameter: ClassVar[Parameter | None] = None
    # Further settings it reads (DRY's base, XTC's threshold, Mirostat's tau and eta): each a
    # field of SamplingParams and RowParams like ``parameter``, defaulting to its ``neutral``
    # value; only ``parameter`` (or ``enabled``) turns the processor on.
    settings: ClassVar[tuple[Parameter, ...]] = ()
    # Whether it looks at the tokens so far (History): its kept set is not a function of the
    # logits alone.
    reads_history: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.parameter.name

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        """``parameter`` (if any), then ``settings``: the fields it adds."""
        return (() if self.parameter is None else (self.parameter,)) + self.settings

    def enabled(self, params: RowParams) -> jax.Array:
        """``[B]`` bool."""
        return getattr(params, self.parameter.name) != self.parameter.neutral

    @abc.abstractmethod
    def apply(self, logits: jax.Array, params: RowParams, history: History) -> jax.Array:
        """The processed logits of every row (only enabled rows are kept)."""

    def __call__(self, logits: jax.Array, params: RowParams, history: History) -> jax.Array:
        on = self.enabled(params)  # [B]

        def run(logits):
            return jnp.where(on[:, None], self.apply(logits, params, history), logits)

        return jax.lax.cond(jnp.any(on), run, lambda logits: logits, logits)


def argmax(x: jax.Array, best: jax.Array | None = None) -> jax.Array:
    """``[..., V]`` -> ``[...]`` int32: the lowest index of the maximum along the last axis, as
    ``jnp.argmax`` (a row holding NaN gives some index in range); ``best``, if given, is that
    maximum (``[...]``, computed already). Computed with two plain float32 reductions: XLA's CPU
    argmax (a variadic reduce) is ~20x slower at V = 4096, and greedy decoding takes several per
    token; the ids are float32 (exact below 2^24), whose minimum XLA on CPU reduces faster than
    int32's (in a loop, 136 against 158 us at [32, 4096], 778 against 1070 us at [32, 49152])."""
    V = x.shape[-1]
    if V >= 1 << 24:
        raise ValueError(f"x's last axis must hold fewer than 2^24 entries, got {V}")
    ids = jnp.arange(V, dtype=jnp.float32).reshape((1,) * (x.ndim - 1) + (V,))
    best = jnp.max(x, axis=-1) if best is None else best
    first = jnp.min(jnp.where(x == best[..., None], ids, float(V)), axis=-1)
    return jnp.minimum(first, V - 1).astype(jnp.int32)

