"""Where a decode step's time goes, by ablation: the step time of ``generate`` with parts of the
step replaced by stand-ins that cost nothing, applied cumulatively (``ABLATIONS``).

The levels, each removing one more part: ``full`` (none), ``no_attention`` (attention over the
cache returns its queries: no cache read), ``no_model`` (the whole model call is a stand-in whose
logits are a one-hot of the next token id, so sampling still sees data it cannot fold away),
``no_sampling`` (the sampling processors and the random draw are skipped: the token is the argmax).
The differences are each part's cost per step (``PARTS``): attention = full - no_attention, MLP and
projections (embedding, norms, projections, MLP, output layer, cache write) = no_attention -
no_model, sampling = no_model - no_sampling, loop bookkeeping (recording the token, finish checks,
the loop) = no_sampling. Differences of medians can be slightly negative where a part costs ~0.

A stand-in replaces a name the decode step looks up at trace time, so ``ablated`` drops every
compiled program on entry and on exit.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from decodelab import sampling
from decodelab.measure import timing
from decodelab.model import Transformer, attention
from decodelab.sampling.params import SamplingParams


def no_attention(q, *args, **kwargs):
    """Attention over the cache that reads nothing: the queries stand in for its output."""
    return q


def no_model(self, tokens, *, cache=None, num_valid=None, reach=None):
    """The model call without the model: logits one-hot at ``(token + 1) % V`` (they depend on the
    tokens, so XLA cannot fold the sampling that reads them), the cache only advanced."""
    logits = jax.nn.one_hot((tokens + 1) % self.config.vocab_size, self.config.vocab_size)
    if cache is None:
        return logits
    B, T = tokens.shape
    counts = jnp.full((B,), T, jnp.int32) if num_valid is None else jnp.asarray(num_valid)
    return logits, cache.advance(counts)


def no_processors(logits, params, history):
    """No processors before temperature: the scores are the logits."""
    flat = logits.reshape(-1, logits.shape[-1]).astype(jnp.float32)
    best = jnp.max(flat, axis=-1)
    return sampling.Scored(scores=flat, best=best, raw=best)


def no_distribution(logits, params, history, scored=None):
    """No processors from temperature on and no softmax: the logits are the log-probabilities."""
    return logits


def draw_argmax(logprobs, keys):
    """No random draw: the most probable token."""
    return sampling.argmax(logprobs)


# (level, what it removes, its patches: (owner, attribute, stand-in)), applied cumulatively: the
# step time at a level has every patch of that level and the levels before it. The patched names
# are the ones the decode step calls at trace time.
ABLATIONS = (
    ("full", "nothing", ()),
    ("no_attention", "attention over the cache",
     ((attention, "blocked_attention", no_attention),)),
    ("no_model", "the rest of the model (MLP, projections, norms, embeddings, cache write)",
     ((Transformer, "__call__", no_model),)),
    ("no_sampling", "the sampling processors and the random draw",
     ((sampling, "score", no_processors), (sampling, "processed_logprobs", no_distribution),
      (sampling, "draw", draw_argmax))),
)
# Each part's cost: the step time of one level minus the next (the last level's is the loop).
PARTS = {"attention": ("full", "no_attention"), "mlp_projections": ("no_attention", "no_model"),
         "sampling": ("no_model", "no_sampling"), "loop": ("no_sampling", None)}
PART_LABELS = {"attention": "attention", "mlp_projections": "MLP and projections",
               "sampling": "sampling", "loop": "loop bookkeeping"}


@contextlib.contextmanager
def ablated(level: str):
    """Apply the patches of ``ABLATIONS`` up to ``level``; compiled programs are dropped on entry
    and exit so that every traced step sees exactly these patches."""
    names = [name for name, _, _ in ABLATIONS]
    if level not in names:
        raise ValueError(f"level must be one of {names}, got {level!r}")
    patches = [p for _, _, level_patches in ABLATIONS[: names.index(level) + 1]
               for p in level_patches]
    saved = []
    try:
        for owner, name, stand_in in patches:
            if not hasattr(owner, name):
                raise RuntimeError(f"ablation {level!r} patches {owner.__name__}.{name}, which no "
                                   "longer exists; update decodelab.measure.ablation.ABLATIONS")
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, stand_in)
        jax.clear_caches()
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
        jax.clear_caches()


def time_breakdown(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                   params: SamplingParams, max_len: int, mode: str) -> dict:
    """``breakdown_<mode>_<level>_step_ms`` for every ablation level (``timing.time_generate``'s
    ``step_ms`` under ``ablated(level)``) and ``breakdown_<mode>_<part>_ms`` for every part of
    ``PARTS`` (see the module docstring)."""
    steps = {}
    for level, _, _ in ABLATIONS:
        with ablated(level):
            steps[level] = timing.time_generate(model, prompts, new_tokens, repeats, params,
                                                max_len)["step_ms"]
    out = {f"breakdown_{mode}_{level}_step_ms": ms for level, ms in steps.items()}
    for part, (level, without) in PARTS.items():
        out[f"breakdown_{mode}_{part}_ms"] = steps[level] - (steps[without] if without else 0.0)
    return out
