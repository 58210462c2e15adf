"""Per-token negative log-likelihood: the one definition training, perplexity, pruning and the
quality measures share."""

from __future__ import annotations

import jax
import optax
from flax import nnx


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Negative log-likelihood in nats of ``targets: [B, T]`` under ``logits: [B, T, V]``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets)


def window_nll(model: nnx.Module, windows: jax.Array) -> jax.Array:
    """``[B, T]``: the NLL of each next token of ``windows: [B, T + 1]`` under ``model`` (any
    ``tokens -> logits`` callable), the logits of the first T tokens predicting the last T."""
    return token_nll(model(windows[:, :-1]), windows[:, 1:])
