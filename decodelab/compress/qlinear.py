"""Linear layers whose weights are stored quantized: ``QuantizedEinsum`` and ``QuantizedEmbed``
(made by ``decodelab.compress.quantization`` and by the GGUF loader's kept-as-stored blocks).

Representation. Every quantized projection is a ``QuantizedEinsum`` that replaces an
``nnx.Einsum`` whose kernel's contracted axes come first (all of decodelab's: ``DF``, ``FD``,
``DNH``, ``NHD``, ``DV``). The kernel is viewed as a matrix ``[In, Out]`` (In: the contracted axes
flattened, e.g. ``N * H`` for the output projection; Out: the rest) and stored as

    qvalue [In, Out] int8 | int4,  scale [G, Out],  offset [G, Out] or none,
    weight[i, o] = qvalue[i, o] * scale[i // g, o] + offset[i // g, o],   g = In / G

so one group is ``g`` consecutive input channels of one output column (``G = 1``: one scale per
output channel). ``offset`` is the zero point in float form (``-scale * zero_point`` for min-max
calibration, the block minimum of a GGUF Q4_1 block); symmetric (absmax) quantization has none.
An ``input_scale [In]`` (AWQ) multiplies the input first. Tied embeddings quantized with
``embeddings=True`` become a ``QuantizedEmbed``: the same matrix with ``In = D`` and ``Out = V``,
read by column for lookups.

The matmul, in blocks of output columns. XLA on CPU does not fuse a dequantization (convert,
scale) into a dot's operand: the dot is a library call that reads float32 operands, so
``x @ dequantize(qvalue)`` writes the whole float kernel and reads it back. Applying the scales to
the output does not change that (the int8 -> float32 convert still feeds the dot; a mixed
int8 x float32 ``dot_general`` is converted the same way), and a multiply-and-reduce fusion that
never forms the kernel is slower than the float32 dot there. Worse, XLA keeps the dequantized
kernels of a whole decode step alive at once (100 MB for ``medium``, as large as its float32
weights), so the step wrote and read 4 bytes per weight on top of reading 1: int8 decoded at a
fifth of float32's speed. So ``__call__`` loops (``lax.scan``) over blocks of output columns: each
iteration dequantizes ``[In, C]`` (at most ``block_elements`` weights, by default
``BLOCK_ELEMENTS``: 512 KiB of float32, which stays in the core's cache) and multiplies it; a group
runs along In, so a block holds whole groups. The step then never forms a float buffer larger than
one block (``tests/test_quantize.py`` checks its jaxpr and compiled memory). int4 weights are the
exception that stays: XLA on CPU converts an int4 array that enters a loop to an int8 copy first,
and its int4 -> float convert is 3 to 4 times slower than int8's, so int4 decodes no faster than
int8 there.

Integer activations (``activations="int8"``, W8A8). The input of each row (one token) is rounded
to int8 in the weights' groups, each group of inputs with its own absmax scale (the whole row for
one scale per output channel; 32 inputs for int8 in blocks of 32, as llama.cpp's Q8_0 x Q8_0 dot
rounds them). It adds the activations' rounding, so it is a different quantization, judged on the
scoreboard of its own; rounding in the weights' blocks is what keeps it close (SmolLM2, 16 windows
of 128 tokens: int8 in blocks of 32 with W8A8 has mean KL 0.0053, llama.cpp's Q8_0 0.0058,
against 0.052 for int8 per output channel with each row rounded whole). With one scale per output
channel the product is an integer dot, the one formulation that reads integer weights without a
float copy on CPU: ``dot_general(int8, int8) -> int32`` on XLA's integer GEMM, then the input and
weight scales (the min-max offsets add ``sum of the inputs x offset``). XLA runs a one-row integer
dot on a slow path (~10x the two-row one), so a single row is padded to ``INT8_MIN_ROWS``. With
groups, the rounded inputs go through the blocked float matmul above: the same products up to
float rounding. The integer form would need one int32 sum per group, a dot batched over the
groups that runs each ``[rows, 32] x [32, Out]`` product on its own; on SmolLM2 it decoded at
0.50x (W8A8) and 0.67x (W8A8x2) float32's speed at batch 1 and 0.41x and 0.25x at batch 8,
where the blocked float matmul runs int8 in blocks at 1.0x and 0.94x.

Two int8 terms (``activations="int8x2"``): the fast int8 path. The inputs are rounded as above,
then their remainder (at most half a step) is rounded the same way, and both terms go through one
integer dot of ``2 R`` rows (per output channel; in blocks, their sum through the blocked float
matmul, as above): ``x @ W ~ s1 (q1 @ Q) + s2 (q2 @ Q)``. The activations' rounding
is then ~127 times finer than W8A8's (about 15 bits), so the output is the weights' rounding
alone: on SmolLM2 the mean KL equals float activations' (0.0046 with int8 per output channel,
0.0019 in blocks of 32), and at batch 1 the second term fills the row W8A8 pads anyway. What
else was measured for the block sums, and why it lost: an int16 multiply-and-reduce fusion (1.5x
float32 at batch 1 but 0.4x at batch 8: it is compute-bound) and the float dot batched over blocks
(0.2x). SmoothQuant's per-channel migration (``input_scale``, alpha 0.5) takes per-channel W8A8
from 0.059 to 0.020, not to 0.01; GPTQ takes per-channel int8 from 0.0046 to 0.0022 (16 or 64
calibration windows alike), not to 0.002.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from decodelab.checks import check_int, check_one_of, is_int
from decodelab.model.layers import split_equation

# Float inputs, or inputs quantized per row to int8 terms (module docstring): how many terms each.
ACTIVATION_TERMS = {"int8": 1, "int8x2": 2}
ACTIVATIONS = (None, *ACTIVATION_TERMS)
# Rows an int8 x int8 dot is padded to (module docstring: one row takes a slow path on CPU).
INT8_MIN_ROWS = 2
# Weights dequantized at a time by a quantized matmul, unless a layer is given another
# ``block_elements`` (module docstring): 512 KiB of float32.
BLOCK_ELEMENTS = 2**17


def contracted_axes(equation: str, kernel_shape: Sequence[int]) -> int:
    """How many leading kernel axes ``equation`` contracts with the input's trailing axes; a
    kernel laid out otherwise cannot be viewed as ``[In, Out]`` and is refused."""
    lhs, kernel, _ = split_equation(equation)
    n = sum(letter in lhs for letter in kernel)
    if kernel[:n] != lhs[len(lhs) - n:] or any(letter in lhs for letter in kernel[n:]):
        raise ValueError(f"equation {equation!r} must contract the kernel's leading axes with the "
                         "input's trailing axes in order")
    return n


def _dequantize(qvalue: jax.Array, scale: jax.Array, offset: jax.Array | None,
                dtype) -> jax.Array:
    """``qvalue [In, ...]`` with ``scale`` / ``offset [G, ...]`` -> float ``[In, ...]``."""
    G = scale.shape[0]
    grouped = qvalue.astype(dtype).reshape(G, -1, *qvalue.shape[1:])  # [G, g, ...]
    w = grouped * scale.astype(dtype)[:, None]
    if offset is not None:
        w = w + offset.astype(dtype)[:, None]
    return w.reshape(qvalue.shape)


@dataclasses.dataclass(frozen=True)
class QuantizedWeights:
    """A kernel's stored form (module docstring): ``qvalue [In, Out]`` (int8 | int4), ``scale
    [G, Out]`` with G dividing In, ``offset [G, Out]`` or None, ``input_scale [In]`` or None.
    Checked here; each ValueError names the field."""

    qvalue: jax.Array
    scale: jax.Array
    offset: jax.Array | None = None
    input_scale: jax.Array | None = None

    def __post_init__(self) -> None:
        if len(self.qvalue.shape) != 2:
            raise ValueError(f"qvalue must be a matrix [In, Out], got shape {self.qvalue.shape}")
        In, Out = self.qvalue.shape
        G = self.scale.shape[0] if len(self.scale.shape) == 2 else 0
        if self.scale.shape[1:] != (Out,) or not G or In % G:
            raise ValueError(f"scale must be [G, {Out}] with G dividing In = {In}, got shape "
                             f"{self.scale.shape}")
        if self.offset is not None and self.offset.shape != self.scale.shape:
            raise ValueError(f"offset must be None or of the scale's shape {self.scale.shape}, "
                             f"got shape {self.offset.shape}")
        if self.input_scale is not None and self.input_scale.shape != (In,):
            raise ValueError(f"input_scale must be None or [{In}], got shape "
                             f"{self.input_scale.shape}")


class QuantizedEinsum(nnx.Module):
    """An ``nnx.Einsum`` (same equation, same call) whose kernel is stored quantized (module
    docstring): ``x [..., *in_dims] -> [..., *out_dims]``. ``block_elements``: the most weights
    the float matmul dequantizes at a time (a static size: each value compiles its own program)."""

    def __init__(self, equation: str, kernel_shape: Sequence[int], weights: QuantizedWeights,
                 bias: jax.Array | None = None, *, dtype=jnp.float32,
                 activations: str | None = None, block_elements: int = BLOCK_ELEMENTS):
        n_in = contracted_axes(equation, kernel_shape)
        check_one_of("activations", activations, ACTIVATIONS)
        self.block_elements = check_int("block_elements", block_elements, 1)
        if not isinstance(weights, QuantizedWeights):
            raise ValueError(f"weights must be a QuantizedWeights, got {type(weights).__name__}")
        self.equation = equation
        self.in_dims = tuple(kernel_shape[:n_in])
        self.out_dims = tuple(kernel_shape[n_in:])
        In, Out = math.prod(self.in_dims), math.prod(self.out_dims)
        if weights.qvalue.shape != (In, Out):
            raise ValueError(f"qvalue must be [{In}, {Out}] (kernel_shape {tuple(kernel_shape)} "
                             f"as [In, Out]), got {weights.qvalue.shape}")
        self.dtype = jnp.dtype(dtype)
        self.activations = activations
        self.qvalue = nnx.Param(weights.qvalue)
        self.scale = nnx.Param(weights.scale)
        self.offset = nnx.Param(weights.offset) if weights.offset is not None else None
        self.bias = nnx.Param(bias) if bias is not None else None
        self.input_scale = (nnx.Param(weights.input_scale) if weights.input_scale is not None
                            else None)

    @property
    def group_size(self) -> int:
        return self.qvalue.shape[0] // self.scale.shape[0]

    def kernel(self) -> jax.Array:
        """The dequantized kernel in the replaced Einsum's shape (for tests and inspection)."""
        w = _dequantize(self.qvalue[...], self.scale[...],
                        None if self.offset is None else self.offset[...], jnp.float32)
        if self.input_scale is not None:
            w = w * self.input_scale[...][:, None]
        return w.reshape(*self.in_dims, *self.out_dims)

    def columns_per_block(self) -> int:
        """Output columns dequantized at a time by ``__call__``: the largest divisor of Out
        whose block ``[In, columns]`` has at most ``block_elements`` weights (one column when
        even one is larger)."""
        In, Out = self.qvalue.shape
        fits = max(self.block_elements // In, 1)
        return max(c for c in range(1, min(fits, Out) + 1) if Out % c == 0)

    def __call__(self, x: jax.Array) -> jax.Array:
        lead = x.shape[: x.ndim - len(self.in_dims)]
        x = x.astype(self.dtype).reshape(-1, self.qvalue.shape[0])  # [R, In]
        if self.input_scale is not None:
            x = x * self.input_scale[...].astype(self.dtype)[None, :]
        y = self._blocked_matmul(x) if self.activations is None else self._integer_matmul(x)
        y = y.reshape(*lead, *self.out_dims)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype).reshape(*(1 for _ in lead), *self.out_dims)
        return y

    def _blocked_matmul(self, x: jax.Array) -> jax.Array:
        """``x [R, In] @ kernel -> [R, Out]``, dequantizing a block of columns at a time."""
        Out = self.qvalue.shape[1]
        C = self.columns_per_block()
        offset = None if self.offset is None else self.offset[...]

        def block(_, j):  # output columns j * C .. (j + 1) * C - 1: [R, C]
            cols = lambda a: jax.lax.dynamic_slice_in_dim(a, j * C, C, axis=1)  # noqa: E731
            w = _dequantize(cols(self.qvalue[...]), cols(self.scale[...]),
                            None if offset is None else cols(offset), self.dtype)  # [In, C]
            return None, x @ w

        _, y = jax.lax.scan(block, None, jnp.arange(Out // C))  # [Out / C, R, C]
        return jnp.moveaxis(y, 0, 1).reshape(-1, Out)

    def _integer_matmul(self, x: jax.Array) -> jax.Array:
        """``x [R, In] @ kernel -> [R, Out]`` with ``x`` quantized per row and weight group
        (module docstring): int8 terms (``"int8"``: one, padded to ``INT8_MIN_ROWS``;
        ``"int8x2"``: two), an int8 x int8 dot accumulated in int32, then the scales; with
        groups, the rounded inputs times the kernel dequantized a block at a time."""
        (R, In), (G, Out) = x.shape, self.scale.shape
        n = ACTIVATION_TERMS[self.activations]
        if G > 1:  # the rounded inputs through the blocked float matmul (module docstring)
            terms = activation_terms(x, n, G)
            return self._blocked_matmul(
                sum(q.astype(self.dtype) * s[..., None] for q, s in terms).reshape(R, In))
        rows = max(R, INT8_MIN_ROWS) if n == 1 else R  # a one-row integer dot is slow
        terms = activation_terms(jnp.pad(x, ((0, rows - R), (0, 0))), n)
        xq = jnp.concatenate([q[:, 0] for q, _ in terms])  # [terms * rows, In] int8
        xs = jnp.concatenate([s for _, s in terms])  # [terms * rows, 1]
        acc = jax.lax.dot_general(xq, self.qvalue[...].astype(jnp.int8), (((1,), (0,)), ((), ())),
                                  preferred_element_type=jnp.int32)  # [terms * rows, Out]
        y = acc.astype(self.dtype) * xs * self.scale[...].astype(self.dtype)
        y = y.reshape(len(terms), rows, Out).sum(0)
        if self.offset is not None:
            row_sums = sum(q.astype(self.dtype).sum(-1) * s for q, s in terms)  # [rows, 1]
            y = y + row_sums @ self.offset[...].astype(self.dtype)
        return y[:R]


def round_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x [..., g]`` -> ``(int8 [..., g], scale [...])``: each row of the last axis rounded with
    its absmax / 127 (an all-zero row gets scale 1)."""
    absmax = jnp.max(jnp.abs(x), axis=-1)
    scale = jnp.where(absmax > 0, absmax / 127, 1).astype(x.dtype)
    return jnp.clip(jnp.round(x / scale[..., None]), -127, 127).astype(jnp.int8), scale


def activation_terms(x: jax.Array, n: int, groups: int = 1) -> list[tuple[jax.Array, jax.Array]]:
    """``x [R, In]`` as ``n`` int8 terms ``[(q [rows, groups, In / groups], scale [rows,
    groups])]`` with ``x ~ sum q * scale``, each group of ``In / groups`` inputs of a row rounded
    with its own scale: term 1 rounds the groups, term 2 the remainder (module docstring)."""
    if not is_int(groups) or groups < 1 or x.shape[-1] % groups:
        raise ValueError(f"groups must be a positive int dividing x's {x.shape[-1]} inputs, got "
                         f"{groups!r}")
    rest = x.reshape(x.shape[0], groups, -1)
    terms = [round_rows(rest)]
    for _ in range(n - 1):
        q, scale = terms[-1]
        terms.append(round_rows(rest := rest - q.astype(x.dtype) * scale[..., None]))
    return terms


class QuantizedEmbed(QuantizedEinsum):
    """A tied embedding table ``[V, D]`` stored quantized as the matrix ``[In = D, Out = V]``
    (groups along D): ``embed(tokens [B, T]) -> [B, T, D]``,
    ``attend(x [B, T, D]) -> [B, T, V]``."""

    def __call__(self, tokens: jax.Array) -> jax.Array:
        cols = jnp.take(self.qvalue[...], tokens, axis=1)  # [D, B, T]
        scale = jnp.take(self.scale[...], tokens, axis=1)  # [G, B, T]
        offset = None if self.offset is None else jnp.take(self.offset[...], tokens, axis=1)
        return jnp.moveaxis(_dequantize(cols, scale, offset, self.dtype), 0, -1)

    def attend(self, x: jax.Array) -> jax.Array:
        return QuantizedEinsum.__call__(self, x)


def with_block_elements(model: nnx.Module, block_elements: int) -> nnx.Module:
    """A copy of ``model`` whose quantized layers dequantize at most ``block_elements`` weights at
    a time (module docstring); the same weights, so the same outputs up to the float rounding of
    another block shape."""
    block_elements = check_int("block_elements", block_elements, 1)
    if not any(isinstance(m, QuantizedEinsum) for _, m in nnx.iter_modules(model)):
        raise ValueError("model must have quantized layers for with_block_elements (it sets how "
                         "many weights they dequantize at a time), got a float model")
    out = nnx.clone(model)
    for _, module in nnx.iter_modules(out):
        if isinstance(module, QuantizedEinsum):
            module.block_elements = block_elements
    return out
