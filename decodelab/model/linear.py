"""Projections and the token embedding, with parameters stored in ``ModelConfig.param_dtype``.

What is stored in 16 bits. With ``param_dtype`` "bfloat16" or "float16", every projection's
kernel and bias (attention q, k, v, o; the MLP; the untied head) and the token embedding table
(tied or not) are stored in that dtype: half the bytes of float32. The norms' scales and the
position encodings' tables (learned, T5) stay float32, as llama.cpp keeps its norms: they are
vectors or small tables, and a norm's scale multiplies every activation.

How it is computed. The computation runs in ``ModelConfig.dtype``: a 16-bit weight is converted
to it exactly (every bfloat16 or float16 value is a float32) and each dot accumulates in float32,
so a float32-computing model holding 16-bit weights gives the logits of a float32 model holding
the same rounded weights, up to float32 summation order. XLA on CPU does not fuse a convert into
a dot's operand (the dot is a library call reading float32 operands): ``x @ w.astype(f32)`` writes
a float32 copy of the whole kernel once per call and reads it back, 10 bytes moved per weight
where float32 storage moves 4, and a bfloat16 x bfloat16 dot is converted the same way. So on CPU
a kernel stored in 16 bits is read by ``blocked_matmul``, a ``lax.scan`` over blocks of output
columns that converts ``[In, C]`` to ``dtype`` (at most ``BLOCK_ELEMENTS`` weights, 512 KiB of
float32, which stays in the core's cache) and multiplies it: the compiled step holds no float copy
of a whole kernel (``tests/test_half_precision.py`` checks the compiled text). With ``dtype``
"bfloat16" the block stays bfloat16 and XLA converts it for its dot, a block at a time. The
quantized layers (``decodelab.compress.qlinear``) read their int8 / int4 kernels through the same
loop. On other backends XLA fuses a convert into a dot's operand, so there the kernel is
converted inside the einsum itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab.config import ModelConfig

# Weights converted at a time by a blocked matmul, unless a layer is given another number
# (module docstring): 512 KiB of float32.
BLOCK_ELEMENTS = 2**17


def contracted_axes(equation: str, kernel_shape: Sequence[int]) -> int:
    """How many leading kernel axes ``equation`` contracts with the input's trailing axes; a
    kernel laid out otherwise cannot be viewed as ``[In, Out]`` and is refused."""
    inputs, _ = equation.replace(" ", "").split("->")
    lhs, kernel = inputs.split(",")
    n = sum(letter in lhs for letter in kernel)
    if kernel[:n] != lhs[len(lhs) - n:] or any(letter in lhs for letter in kernel[n:]):
        raise ValueError(f"equation {equation!r} must contract the kernel's leading axes with the "
                         "input's trailing axes in order")
    return n


def columns_per_block(In: int, Out: int, block_elements: int = BLOCK_ELEMENTS) -> int:
    """Output columns a blocked matmul converts at a time: the largest divisor of Out whose
    block ``[In, columns]`` has at most ``block_elements`` weights (one column when even one is
    larger)."""
    fits = max(block_elements // In, 1)
    return max(c for c in range(1, min(fits, Out) + 1) if Out % c == 0)


def blocked_matmul(x: jax.Array,  # [R, In]
                   block: Callable[[jax.Array, int], jax.Array],  # (j, C) -> [In, C] float
                   Out: int, C: int) -> jax.Array:  # [R, Out]
    """``x @ kernel`` where ``block(j, C)`` gives the kernel's output columns ``j * C ..
    (j + 1) * C - 1`` in ``x``'s dtype; one block at a time, so no float copy of the whole kernel
    is formed (module docstring). ``C`` must divide ``Out``."""

    def step(_, j):
        return None, x @ block(j, C)  # [R, C]

    _, y = jax.lax.scan(step, None, jnp.arange(Out // C))  # [Out / C, R, C]
    return jnp.moveaxis(y, 0, 1).reshape(-1, Out)


def reads_in_blocks(kernel: jax.Array) -> bool:
    """Whether a kernel is read by ``blocked_matmul``: stored in 16 bits, on CPU (module
    docstring)."""
    return jnp.dtype(kernel.dtype).itemsize == 2 and jax.default_backend() == "cpu"


def stored_matmul(x: jax.Array, kernel: jax.Array, n_in: int) -> jax.Array:
    """``x [..., *in_dims] @ kernel [*in_dims, *out_dims] -> [..., *out_dims]`` in ``x``'s
    dtype, ``kernel``'s columns converted a block at a time (``blocked_matmul``)."""
    in_dims, out_dims = kernel.shape[:n_in], kernel.shape[n_in:]
    In, Out = math.prod(in_dims), math.prod(out_dims)
    w = kernel.reshape(In, Out)
    cols = lambda j, C: jax.lax.dynamic_slice_in_dim(w, j * C, C, axis=1)  # noqa: E731
    y = blocked_matmul(x.reshape(-1, In), lambda j, C: cols(j, C).astype(x.dtype), Out,
                       columns_per_block(In, Out))
    return y.reshape(*x.shape[: x.ndim - n_in], *out_dims)


class Einsum(nnx.Einsum):
    """An ``nnx.Einsum`` (the same parameters, the same equation) whose kernel and bias may be
    stored in 16 bits: ``x [..., *in_dims] -> [..., *out_dims]`` in ``dtype`` (module
    docstring)."""

    def __call__(self, inputs: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        if not reads_in_blocks(kernel):
            return super().__call__(inputs)
        x = inputs.astype(self.dtype)
        y = stored_matmul(x, kernel, contracted_axes(self.einsum_str, kernel.shape))
        if self.bias is not None:
            out_dims = self.bias.shape
            y = y + self.bias[...].astype(self.dtype).reshape(
                *(1 for _ in range(y.ndim - len(out_dims))), *out_dims)
        return y


class Embed(nnx.Embed):
    """An ``nnx.Embed`` whose table ``[V, D]`` may be stored in 16 bits: a lookup converts only
    the rows it takes, and ``attend`` (the tied head, ``x [..., D] -> [..., V]``) reads the
    table a block of rows at a time (module docstring)."""

    def __call__(self, tokens: jax.Array) -> jax.Array:
        table = self.embedding[...]
        if table.dtype == jnp.float32:
            return super().__call__(tokens)
        return jnp.take(table, tokens, axis=0).astype(self.dtype)

    def attend(self, query: jax.Array) -> jax.Array:
        table = self.embedding[...]  # [V, D]
        if not reads_in_blocks(table):
            return super().attend(query)
        V, D = table.shape
        x = query.astype(self.dtype)
        rows = lambda j, C: jax.lax.dynamic_slice_in_dim(table, j * C, C, axis=0)  # noqa: E731
        y = blocked_matmul(x.reshape(-1, D), lambda j, C: rows(j, C).astype(x.dtype).T, V,
                           columns_per_block(D, V))
        return y.reshape(*x.shape[:-1], V)


def projection(cfg: ModelConfig, equation: str, kernel_shape: Sequence[int],
               bias_shape: Sequence[int] | None, kernel_init: Callable, rngs: nnx.Rngs) -> Einsum:
    """A projection of ``cfg``'s computation dtype and parameter dtype."""
    return Einsum(equation, kernel_shape, bias_shape, dtype=jnp.dtype(cfg.dtype),
                  param_dtype=jnp.dtype(cfg.param_dtype), kernel_init=kernel_init, rngs=rngs)
