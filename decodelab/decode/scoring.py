"""From one model call to the scores a decode step samples from: the model's logits, DoLa's
contrast of layers, or classifier-free guidance's mix of two streams.

Conventions (``generation.prefill`` and ``generation.step`` rely on them; ``guide`` checks the
options and builds the inputs):

- ``Scoring`` rides in the loop state. Its ``dola_layers`` is static (the layers tapped are part
  of the program: one program per choice of layers); its ``guidance`` is data (``[B]`` float32,
  each row's guidance scale: any scale runs the same program), and whether it is there at all
  (CFG on or off) is the state's structure, so CFG on and off are two programs. ``Scoring()``,
  neither, is plain decoding and adds nothing to the program.
- One model call per step serves everything. With CFG the call's rows are the B conditional
  rows then their B unconditional twins (each row's negative prompt, then the tokens the row
  keeps: the twin is fed the same token and its cache row advances with it); with DoLa the call
  also taps the residual stream entering each candidate layer and ``model.head`` turns it into
  early-exit logits (the final norm included: the paper's one vocabulary head for every layer).
- CFG (Sanchez et al. 2023): ``log_softmax(u) + g * (log_softmax(c) - log_softmax(u))``, as
  transformers' CFG processor; at ``g = 1`` the scores are the conditional stream's own logits
  and at ``g = 0`` the unconditional stream's (transformers drops the processor at 1), so 1 is
  plain decoding and 0 decoding from the negative prompt exactly, whatever the processors.
- DoLa (Chuang et al. 2023): per row and step, the candidate layer whose early-exit
  distribution has the largest Jensen-Shannon divergence from the final layer's (the paper's
  JSD, per row; transformers' former implementation took ``KL(M || p)`` terms and one layer per
  batch); the scores are ``log p_final - log p_premature`` over the tokens with
  ``log p_final >= max log p_final + log(relative_top)`` and -inf elsewhere. The maximum is over
  the tokens a constrained row's automaton allows, so a constraint keeps a plausible token.
- A row whose model logits (in any stream) hold NaN or +inf gets NaN scores: the step reports
  it as an error instead of sampling from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from decodelab import sampling
from decodelab.cache import Cache

# DoLa's adaptive plausibility constraint: a token stays if its final-layer probability is at
# least this fraction of the most likely token's (the paper's alpha, transformers' relative_top).
RELATIVE_TOP = 0.1


def guided(cond: jax.Array, uncond: jax.Array, scale: jax.Array) -> jax.Array:
    """``[B, V]`` CFG scores from the conditional and unconditional logits ``[B, V]`` and each
    row's guidance scale ``[B]`` (module docstring)."""
    g = scale[:, None]  # [B, 1]
    lc, lu = jax.nn.log_softmax(cond, axis=-1), jax.nn.log_softmax(uncond, axis=-1)
    mixed = jnp.where(g == 1, cond, jnp.where(g == 0, uncond, lu + g * (lc - lu)))
    bad = sampling.bad_logits(cond) | sampling.bad_logits(uncond)
    return jnp.where(bad[:, None], jnp.nan, mixed)


def dola_contrast(final: jax.Array, early: jax.Array,
                  constrain: Callable[[jax.Array], jax.Array] = lambda x: x
                  ) -> tuple[jax.Array, jax.Array]:
    """``(scores [B, V], chosen [B])``: DoLa's contrast of the final logits ``[B, V]`` with the
    early-exit logits ``[B, n, V]`` of the layer (index into the n candidates) each row picks by
    Jensen-Shannon divergence. ``constrain`` masks a row's forbidden tokens to -inf (the
    plausibility maximum is taken over the rest)."""
    lp_final = jax.nn.log_softmax(final, axis=-1)[:, None]  # [B, 1, V]
    lp_early = jax.nn.log_softmax(early, axis=-1)  # [B, n, V]
    log_mean = jnp.logaddexp(lp_final, lp_early) - math.log(2.0)  # [B, n, V]

    def kl_to_mean(lp):  # KL(p || M) over the vocabulary; a zero-probability token adds 0
        p = jnp.exp(lp)
        return jnp.sum(jnp.where(p > 0, p * (lp - log_mean), 0.0), axis=-1)

    jsd = 0.5 * (kl_to_mean(lp_final) + kl_to_mean(lp_early))  # [B, n]
    chosen = jnp.argmax(jsd, axis=-1)  # [B]
    premature = jnp.take_along_axis(lp_early, chosen[:, None, None], axis=1)[:, 0]  # [B, V]
    lp_final = lp_final[:, 0]
    top = jnp.max(constrain(lp_final), axis=-1, keepdims=True)  # [B, 1]
    plausible = lp_final >= top + math.log(RELATIVE_TOP)
    scores = jnp.where(plausible, lp_final - premature, -jnp.inf)
    return jnp.where(sampling.bad_logits(final)[:, None], jnp.nan, scores), chosen


@struct.dataclass(kw_only=True)
class Scoring:
    """How a decode step turns its model call into scores (module docstring)."""

    guidance: jax.Array | None = None  # [B] float32, each row's guidance scale; None: no CFG
    dola_layers: tuple[int, ...] = struct.field(pytree_node=False, default=())
    # With CFG, the prefill's input only (dropped from the loop state): the negative prompts'
    # block [B, T] and lengths [B], read as the unconditional rows.
    negatives: tuple[jax.Array, jax.Array] | None = None

    @property
    def streams(self) -> int:
        """Model rows per state row: 2 with CFG (conditional, unconditional), else 1."""
        return 1 if self.guidance is None else 2

    def doubled(self, x: jax.Array) -> jax.Array:
        """A per-row model input ``[B, ...]`` for every stream: ``[streams * B, ...]``."""
        return x if self.guidance is None else jnp.concatenate([x, x])

    def read(self, model: nnx.Module, block: jax.Array, cache: Cache, num_valid: jax.Array,
             ends: jax.Array | None = None, reach: int | None = None
             ) -> tuple[tuple[jax.Array, jax.Array | None], Cache]:
        """One model call on ``block [R, T]`` (R = streams x rows): ``((final [R, V], early
        [R, n, V] or None), cache)``, the logits at position ``ends[r]`` of each row (None: the
        block's only position) and, with DoLa, the candidate layers' early exits there."""
        # Only what the call needs is passed: a stand-in model need not know taps.
        extra = {"reach": reach} if reach is not None else {}
        if self.dola_layers:
            extra["taps"] = self.dola_layers
        out = model(block, cache=cache, num_valid=num_valid, **extra)
        logits, cache = out[0], out[1]
        if ends is None:
            final = logits[:, 0]
        else:
            final = jnp.take_along_axis(logits, ends[:, None, None], axis=1)[:, 0]  # [R, V]
        if not self.dola_layers:
            return (final, None), cache
        taps = out[2]  # [n, R, T, D]
        if ends is None:
            hidden = taps[:, :, 0]
        else:
            hidden = jnp.take_along_axis(taps, ends[None, :, None, None], axis=2)[:, :, 0]
        return (final, model.head(jnp.swapaxes(hidden, 0, 1))), cache  # early: [R, n, V]

    def scores(self, final: jax.Array, early: jax.Array | None,
               constrain: Callable[[jax.Array], jax.Array]) -> jax.Array:
        """``[B, V]`` scores of the state's rows from ``read``'s exits (``constrain``: the
        state's constraint mask, ``RowState.constrained``)."""
        if self.dola_layers:
            final = dola_contrast(final, early, constrain)[0]
        if self.guidance is None:
            return final
        B = self.guidance.shape[0]
        return guided(final[:B], final[B:], self.guidance)
