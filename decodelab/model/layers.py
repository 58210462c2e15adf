"""Norms and MLPs, each chosen from a registry by a ModelConfig field."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab.config import ModelConfig
from decodelab.model.linear import projection


def normal(stddev: float) -> Callable:
    return nnx.initializers.normal(stddev)


def rms_norm(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, dtype=jnp.dtype(cfg.dtype), rngs=rngs)


def layer_norm(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    return nnx.LayerNorm(cfg.d_model, epsilon=cfg.norm_eps, dtype=jnp.dtype(cfg.dtype), rngs=rngs)


NORMS: dict[str, Callable[[ModelConfig, nnx.Rngs], nnx.Module]] = {
    "rms": rms_norm,
    "layer": layer_norm,
}


def residual_init(cfg: ModelConfig, fan_in: int) -> Callable:
    """Init for a projection back into the residual stream: fan-in scaled, shrunk by sqrt(2L)
    so the stream's variance at init does not grow with depth (GPT-2)."""
    return normal(1.0 / math.sqrt(fan_in * 2 * cfg.n_layers))


def _mlp_bias(cfg: ModelConfig, width: int) -> tuple[int] | None:
    """The bias shape of an MLP projection to ``width`` outputs (None: no bias)."""
    return (width,) if cfg.mlp_bias else None


class SwiGLU(nnx.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020); x: [B, T, D] -> [B, T, D]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F = cfg.d_model, cfg.d_ff
        self.gate = projection(cfg, "BTD,DF->BTF", (D, F), _mlp_bias(cfg, F), normal(D**-0.5),
                               rngs)
        self.up = projection(cfg, "BTD,DF->BTF", (D, F), _mlp_bias(cfg, F), normal(D**-0.5), rngs)
        self.down = projection(cfg, "BTF,FD->BTD", (F, D), _mlp_bias(cfg, D),
                               residual_init(cfg, F), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class GeluMLP(nnx.Module):
    """``down(gelu(up(x)))`` with the tanh approximation (GPT-2); x: [B, T, D] -> [B, T, D]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F = cfg.d_model, cfg.d_ff
        self.up = projection(cfg, "BTD,DF->BTF", (D, F), _mlp_bias(cfg, F), normal(D**-0.5), rngs)
        self.down = projection(cfg, "BTF,FD->BTD", (F, D), _mlp_bias(cfg, D),
                               residual_init(cfg, F), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(x), approximate=True))


MLPS: dict[str, type[nnx.Module]] = {"swiglu": SwiGLU, "gelu": GeluMLP}
