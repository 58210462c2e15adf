"""Norms and MLPs, each chosen from a registry by a ModelConfig field; the projections they and
attention are made of.

Parameters in 16 bits. With ``ModelConfig.param_dtype`` "bfloat16" or "float16", every projection's
kernel and bias (attention q, k, v, o; the MLP; the untied head) and the token embedding table are
stored in that dtype: half the bytes of float32. The norms' scales and the position encodings'
tables (learned, T5) stay float32, as llama.cpp keeps its norms: vectors and small tables. The
computation runs in ``ModelConfig.dtype``: each kernel is converted to it (exactly: every bfloat16
or float16 value is a float32) where the einsum reads it and the dot accumulates in float32, so a
float32-computing model holding 16-bit weights gives the logits of a float32 model holding the
same rounded weights. On XLA CPU the convert is its own fusion, not part of the dot (the dot is a
library call reading float32 operands): the compiled step writes a float32 copy of each 16-bit
kernel and reads it back, so 16-bit weights save memory at rest, not time, there. Reading column
blocks in a loop (as ``decodelab.compress.qlinear`` does for integer kernels) does not help: XLA
CPU converts a bfloat16 array that enters a loop to float32 first, and for float16, which it
slices as stored, the loop measured no faster than the whole convert. On GPU and TPU XLA fuses
such a convert into the dot's operand.

Projections contract in their kernel's axis order (``kernel_order_einsum``). The attention output
projection contracts two axes of its ``[N, H, D]`` kernel; ``jnp.einsum`` lists them H first, and
XLA then transposed the whole kernel to that order inside every compiled step: on SmolLM2 a
1.3 MB copy per layer per token (7% more bytes than the weights themselves) and 30 more kernels
to launch. Contracting (N, H) as stored reads the kernel in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab.config import ModelConfig


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


def kernel_order_einsum(equation: str, x: jax.Array, kernel: jax.Array, *, precision=None,
                        preferred_element_type=None, out_sharding=None) -> jax.Array:
    """``jnp.einsum(equation, x, kernel)`` for a projection (no axis shared by all three), as one
    ``dot_general`` contracting the axes in the kernel's own order. ``jnp.einsum`` may list them
    in another (``"BTNH,NHD->BTD"`` contracts H before N), and XLA then transposes the kernel to
    that order, a copy of the whole kernel at every call (every decode step, on CPU)."""
    lhs, rhs, out = split_equation(equation)
    if out_sharding is not None or set(lhs) & set(rhs) & set(out):
        return jnp.einsum(equation, x, kernel, precision=precision, out_sharding=out_sharding,
                          preferred_element_type=preferred_element_type)
    contracted = [letter for letter in rhs if letter in lhs and letter not in out]
    y = jax.lax.dot_general(x, kernel, (([lhs.index(c) for c in contracted],
                                         [rhs.index(c) for c in contracted]), ((), ())),
                            precision=precision, preferred_element_type=preferred_element_type)
    produced = [c for c in lhs if c not in contracted] + [c for c in rhs if c not in contracted]
    return jnp.transpose(y, [produced.index(c) for c in out])


def split_equation(equation: str) -> tuple[str, str, str]:
    """A projection's ``"lhs,kernel->out"`` einsum as its three subscripts, spaces removed."""
    inputs, out = equation.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    return lhs, rhs, out


def projection(cfg: ModelConfig, equation: str, kernel_shape: tuple[int, ...],
               bias_shape: tuple[int, ...] | None, kernel_init: Callable,
               rngs: nnx.Rngs) -> nnx.Einsum:
    """A projection computed in ``cfg.dtype`` with its parameters stored in ``cfg.param_dtype``
    (module docstring), contracting in its kernel's axis order (``kernel_order_einsum``)."""
    return nnx.Einsum(equation, kernel_shape, bias_shape, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), kernel_init=kernel_init,
                      einsum_op=kernel_order_einsum, rngs=rngs)


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
