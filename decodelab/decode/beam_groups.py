"""Diverse (group) beam search: ``beam_search(..., options=BeamOptions(num_beam_groups=G,
diversity_penalty=lam))`` (Vijayakumar et al. 2018, "Diverse Beam Search", with Hamming
diversity; Hugging Face's former ``group_beam_search``), and the ranking of a pool of finished
hypotheses that plain and group beam search share (``pool_order``).

Conventions (``beam`` relies on them):

- The ``W`` beams of a prompt are ``G`` groups of ``W / G``: group g of prompt b is row ``b * G +
  g`` of the beam state, a beam search of width ``W / G`` of its own, with its own running beams,
  its own pool of the ``W / G`` best finished hypotheses, its own early stop (``beam``'s rule,
  per group) and its own cache rows (rows ``b * W + g * W / G + j``: the beams of a prompt in
  group order, so the state is plain beam search's over ``B * G`` rows). Like every beam search,
  a group starts from one live beam, so its first step picks ``W / G`` distinct tokens.
- At each step the groups of a prompt choose in order. Group g's candidate extensions are ranked
  by their log-probability minus ``lam * c(v)``, where ``c(v)`` counts the running beams that
  groups ``0 .. g - 1`` of the prompt chose with token ``v`` at this step (a group that has
  stopped chooses nothing). The penalty steers which extensions a group keeps; it is not added
  to their scores: a beam's log-probability stays the model's, and finished hypotheses are
  ranked by ``logprob / lp(n)`` as in beam search. (Hugging Face added the penalty into the
  beam scores, so a beam penalised once carried it to the end and into the ranking.) EOS
  extensions go to the group's pool unpenalised: running beams never end with EOS, so no group
  counts an EOS id.
- What is returned: the ``G`` pools of a prompt merged (``W`` hypotheses) and ranked as beam
  search ranks one pool (``pool_order``: by rank score, ties to the lower group then the lower
  slot; constrained prompts' complete hypotheses first), the first ``num_return``. A hypothesis
  two groups both found appears twice.
- ``G = 1`` is beam search itself: the state carries no penalty and the step is the same program.
  ``lam = 0`` makes every group the same beam search of width ``W / G``, so each group returns
  the same hypotheses. ``G`` is static (it sets the shapes ``[B * G, W / G]``); ``lam`` is array
  data, so any penalty reuses the program of its ``G``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from decodelab.checks import check_number, check_size
from decodelab.decode.request import INCOMPLETE

# The largest penalty: beyond it float32 overflows (and inf * 0 would be NaN).
MAX_DIVERSITY_PENALTY = float(np.finfo(np.float32).max)


def check_groups(num_beam_groups: Any, diversity_penalty: Any,
                 width: int) -> np.ndarray | None:
    """``[G]`` float32, the penalty once per group (its length is ``G``), or None for one group;
    ValueError naming the field for a ``G`` that does not divide ``width`` or a penalty < 0."""
    G = check_size("num_beam_groups", num_beam_groups, 1)
    if width % G:
        raise ValueError(f"num_beam_groups must divide width={width} (each group holds width / "
                         f"num_beam_groups beams), got {num_beam_groups!r}")
    penalty = check_number("diversity_penalty", diversity_penalty, 0, MAX_DIVERSITY_PENALTY)
    return None if G == 1 else np.full((G,), penalty, np.float32)


def diverse_top_k(extensions: jax.Array, penalty: jax.Array, done: jax.Array,
                  vocab_size: int) -> tuple[jax.Array, jax.Array]:
    """Each group's running beams: ``extensions [B * G, M]`` (``M = W' * V``: each of the
    group's ``W'`` beams extended by each token, -inf where it may not run on), ``penalty [G]``
    and ``done [B * G]`` -> the ``W'`` chosen extensions' log-probabilities and their indices
    ``[B * G, W']``, group by group in order (module docstring)."""
    G, V = penalty.shape[0], vocab_size
    R, M = extensions.shape
    B, W = R // G, M // V
    batch = jnp.arange(B, dtype=jnp.int32)[:, None]  # [B, 1]

    def group(counts, inputs):  # counts [B, V]: earlier groups' running beams with each token
        x, lam, stopped = inputs  # [B, M], [], [B]
        _, index = jax.lax.top_k(x - lam * jnp.tile(counts, (1, W)), W)  # ties: lower index
        chosen = jnp.take_along_axis(x, index, axis=1)  # [B, W]
        counts = counts.at[batch, index % V].add(((chosen > -jnp.inf) & ~stopped[:, None])
                                                 .astype(jnp.float32))
        return counts, (chosen, index)

    inputs = (extensions.reshape(B, G, M).swapaxes(0, 1), penalty, done.reshape(B, G).T)
    _, (chosen, index) = jax.lax.scan(group, jnp.zeros((B, V), jnp.float32), inputs)
    return chosen.swapaxes(0, 1).reshape(R, W), index.swapaxes(0, 1).reshape(R, W)


def pool_order(scores: jax.Array, reasons: jax.Array | None, W: int) -> jax.Array:
    """``[B, W]`` the candidates a pool keeps: the best ``W`` by rank score, ties to the lower
    candidate; with finish ``reasons`` (a constrained search), every complete hypothesis before
    any "incomplete" one, so a pattern met within the budget outranks one cut off."""
    if reasons is None:
        return jax.lax.top_k(scores, W)[1]
    group = jnp.where(scores == -jnp.inf, 2, (reasons == INCOMPLETE).astype(jnp.int32))
    index = jnp.broadcast_to(jnp.arange(scores.shape[1], dtype=jnp.int32), scores.shape)
    *_, order = jax.lax.sort((group, -scores, index), dimension=1, num_keys=3)
    return order[:, :W]


@struct.dataclass(kw_only=True)
class Pools:
    """The finished hypotheses of each prompt, best first: the fields ``beam_output.n_best``
    reads of a finished beam state (``[B, W, ...]``)."""

    pool_tokens: jax.Array  # [B, W, N] int32
    pool_scores: jax.Array  # [B, W] float32
    pool_logprobs: jax.Array  # [B, W] float32
    pool_lengths: jax.Array  # [B, W] int32
    pool_reasons: jax.Array  # [B, W] int32


@functools.partial(jax.jit, static_argnames=("groups", "constrained"))
def merged_pools(pools: Pools, *, groups: int, constrained: bool) -> Pools:
    """The pools of ``[B * G, W / G]`` group rows as ``[B, W]`` prompt rows, each prompt's ranked
    by ``pool_order``."""
    def by_prompt(x):  # [B * G, W', ...] -> [B, G * W', ...]
        return x.reshape((x.shape[0] // groups, x.shape[1] * groups) + x.shape[2:])

    pools = jax.tree.map(by_prompt, pools)
    scores = pools.pool_scores
    keep = pool_order(scores, pools.pool_reasons if constrained else None, scores.shape[1])
    return jax.tree.map(lambda x: jnp.take_along_axis(
        x, keep.reshape(keep.shape + (1,) * (x.ndim - 2)), axis=1), pools)


def merged(state: Any) -> Pools:
    """The pools of a finished group beam state (``beam.BeamState`` with a diversity penalty),
    merged per prompt and ranked (module docstring)."""
    pools = Pools(**{name: getattr(state, name) for name in Pools.__dataclass_fields__})
    return merged_pools(pools, groups=state.diversity_penalty.shape[0],
                        constrained=state.constraint is not None)
