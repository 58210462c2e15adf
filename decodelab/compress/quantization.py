"""Weights stored quantized: ``quantize(model, weights="int8" | "int4", ...)`` -> a Transformer
whose projections hold integer values and per-group scales, not float kernels; and weights stored
as 16-bit floats: ``quantize(model, weights="bfloat16" | "float16")`` -> the model under
``ModelConfig.param_dtype``, its projections and embedding table cast (round to nearest even),
computed with as ``decodelab.model.layers`` says.

The quantized modules and their matmul (int8 / int4 values, per-group scales, float or int8
activations) are ``decodelab.compress.qlinear``'s; this module makes them from a float model.

What qwix does and what is written here. The numbers come from qwix: ``qwix.quantize`` computes
absmax / min-max scales, zero points and int8 / int4 values for tiled (grouped) axes, and
``qwix.contrib.gptq_core`` / ``awq_core`` run GPTQ and AWQ on a ``[Out, In]`` matrix. qwix's model
path (``qwix.quantize_model`` with a ``PtqProvider``) is not used, because it does not fit four
needs: (1) it tiles only the last contracted axis, so the output projection ``NHD`` could only be
grouped within one head (H), not over ``In = N * H`` as GPTQ, AWQ and GGUF group it; (2) it
rewrites the model's class and intercepts ``jnp.einsum`` at call time, which the checkpoint loader
cannot rebuild from a saved file (here the saved ``quantization`` description rebuilds it);
(3) its zero points are integers, which cannot hold a GGUF Q4_1 block minimum exactly (a float
``offset`` holds both); (4) it has no embedding-table lookup. And qwix's GPTQ unrolls its column
loop in Python, so its compile time grows with the input width (170 s for a 2-layer d=64 model
here, far more for SmolLM2): ``rounding.gptq`` runs the same algorithm with qwix's per-group and
per-column helpers inside a ``lax.fori_loop``. The module swap, the calibration pass that collects
each projection's inputs (``X^T X`` for GPTQ, mean ``|X|`` for AWQ) are this module's own, as
is the grouped matmul (``decodelab.compress.qlinear``).

A model already quantized is quantized again from its dequantized weights, with a warning (the
table of transforms of transformed models is ``decodelab.compress``'s docstring).

Bytes. ``parameter_bytes`` counts each array at its element's bit width (int4: half a byte), the
size of the stored (packed) representation: JAX on CPU holds an int4 array in one byte per value,
so in memory an int4 model is not smaller than an int8 one there.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.checks import check_bool, check_one_of, is_int
from decodelab.compress.qlinear import (ACTIVATIONS, BLOCK_ELEMENTS, QuantizedEinsum,
                                        QuantizedEmbed, QuantizedWeights, contracted_axes)
from decodelab.compress.rounding import quantize_matrix
from decodelab.model import Transformer, with_config
from decodelab.sharding import place_like

WEIGHTS = {"int8": jnp.int8, "int4": jnp.int4}
FLOAT_WEIGHTS = ("bfloat16", "float16")  # a cast: ModelConfig.param_dtype
METHODS = ("rtn", "gptq", "awq")
SCHEMES = ("absmax", "minmax")  # symmetric, or asymmetric with a zero point (offset)
GROUP_SIZES = (None, 32, 64, 128)
_DTYPES = {"int8": jnp.int8, "int4": jnp.int4, "float32": jnp.float32, "float16": jnp.float16,
           "bfloat16": jnp.bfloat16}


def _check_args(weights, group_size, method, scheme, calibration, embeddings,
                activations) -> None:
    check_one_of("weights", weights, tuple(WEIGHTS) + FLOAT_WEIGHTS)
    if weights in FLOAT_WEIGHTS:
        given = {"group_size": (group_size, None), "method": (method, "rtn"),
                 "scheme": (scheme, "absmax"), "calibration": (calibration, None),
                 "embeddings": (embeddings, None), "activations": (activations, None)}
        for name, (value, default) in given.items():
            if (value is not None) if default is None else (value != default):
                shown = "tokens" if name == "calibration" else repr(value)
                raise ValueError(f"{name} does not apply to weights={weights!r} (a cast of every "
                                 f"projection and of the embedding table), got {name}={shown}; "
                                 f"leave it at its default ({default!r})")
        return
    check_one_of("activations", activations, ACTIVATIONS)
    if group_size is not None and (not is_int(group_size) or group_size <= 0):
        raise ValueError(f"group_size must be None or a positive int (e.g. {GROUP_SIZES[1:]}), "
                         f"got {group_size!r}")
    check_one_of("method", method, METHODS)
    check_one_of("scheme", scheme, SCHEMES)
    if embeddings is not None:
        check_bool("embeddings", embeddings)
    if method != "rtn":
        check_calibration(calibration, f"method={method!r} (it calibrates on the model's "
                                       "activations)")
    elif calibration is not None:
        raise ValueError("calibration is only used by method='gptq' or 'awq', got method='rtn' "
                         "with calibration tokens")


def check_calibration(calibration, needed_by: str) -> None:
    """``calibration`` must be integer token windows ``[B, T]`` (T >= 2), as ``needed_by``
    (e.g. "method='gptq'") needs them."""
    if calibration is None:
        raise ValueError(f"calibration must be a token array [B, T] for {needed_by}, got None")
    calibration = np.asarray(calibration)
    if (calibration.ndim != 2 or calibration.shape[1] < 2
            or not np.issubdtype(calibration.dtype, np.integer)):
        raise ValueError(f"calibration must be an integer token array [B, T] with T >= 2, got "
                         f"shape {calibration.shape} and dtype {calibration.dtype}")


def projections(model: Transformer, embeddings: bool) -> list[tuple[tuple, nnx.Module]]:
    """``(path, module)`` of what to quantize: every Einsum in the blocks, and with
    ``embeddings`` the head (or the tied embedding table); float or already quantized."""
    found = []
    for path, module in nnx.iter_modules(model):
        in_blocks = bool(path) and path[0] == "blocks"
        if isinstance(module, (nnx.Einsum, QuantizedEinsum)) and (in_blocks or embeddings):
            found.append((path, module))
        elif isinstance(module, nnx.Embed) and embeddings and model.config.tie_embeddings:
            found.append((path, module))
    return found


def layout(module: nnx.Module) -> tuple[str, tuple[int, ...], int]:
    """``(equation, kernel_shape, In)`` of an Einsum or a (tied) Embed, float or quantized;
    shapes only."""
    if isinstance(module, nnx.Embed):
        V, D = module.embedding.shape
        return "BTD,DV->BTV", (D, V), D
    if isinstance(module, QuantizedEinsum):
        return module.equation, module.in_dims + module.out_dims, module.qvalue.shape[0]
    shape = tuple(module.kernel.shape)
    return module.einsum_str, shape, math.prod(shape[:contracted_axes(module.einsum_str, shape)])


def as_matrix(module: nnx.Module) -> tuple[jax.Array, str, tuple[int, ...]]:
    """``(w [In, Out], equation, kernel_shape)`` of an Einsum or a (tied) Embed (a quantized one:
    its dequantized kernel)."""
    equation, shape, In = layout(module)
    if isinstance(module, QuantizedEinsum):
        w = module.kernel()
    else:
        w = module.embedding[...].T if isinstance(module, nnx.Embed) else module.kernel[...]
    return w.reshape(In, -1), equation, shape


class _Recorder(nnx.Module):
    """Runs ``inner`` and keeps the statistic of its input that ``method`` needs."""

    def __init__(self, inner: nnx.Module, method: str, sink: dict, key: tuple):
        self.inner, self.method, self.sink, self.key = inner, method, sink, key

    def __call__(self, x):
        X = jnp.asarray(x, jnp.float32).reshape(-1, layout(self.inner)[2])  # [n, In]
        stat = {"gptq": lambda: X.T @ X, "awq": lambda: jnp.abs(X).sum(0),
                "norm": lambda: jnp.square(X).sum(0)}[self.method]()
        total, count = self.sink.get(self.key, (0.0, 0))
        self.sink[self.key] = (total + stat, count + X.shape[0])
        return self.inner(x)


def set_module(root: nnx.Module, path: tuple, module: nnx.Module) -> None:
    parent = root
    for name in path[:-1]:
        parent = parent[name] if isinstance(name, int) else getattr(parent, name)
    setattr(parent, path[-1], module)


def calibrate(model: Transformer, targets, method: str, tokens) -> dict[tuple, Any]:
    """Each target's (``projections``) input statistic over ``tokens``: ``X^T X [In, In]``
    (``"gptq"``), the mean absolute input per channel ``[In]`` (``"awq"``) or the L2 norm of each
    input channel over all tokens ``[In]`` (``"norm"``, Wanda's ``||X_j||_2``)."""
    probe = nnx.clone(model)
    sink: dict[tuple, Any] = {}
    for path, _ in targets:
        inner = functools.reduce(lambda m, k: m[k] if isinstance(k, int) else getattr(m, k),
                                 path, probe)
        if isinstance(inner, nnx.Einsum):
            set_module(probe, path, _Recorder(inner, method, sink, path))
    probe(jnp.asarray(tokens, jnp.int32))
    finish = {"gptq": lambda total, count: total, "awq": lambda total, count: total / count,
              "norm": lambda total, count: jnp.sqrt(total)}[method]
    return {path: finish(total, count) for path, (total, count) in sink.items()}


def quantize(model: Transformer, weights: str = "int8", group_size: int | None = None,
             method: str = "rtn", calibration=None, *, scheme: str = "absmax",
             embeddings: bool | None = None, activations: str | None = None) -> Transformer:
    """A copy of ``model`` whose block projections (and with ``embeddings=True`` the head or the
    tied embedding table; None means False) are stored as ``weights`` values with one scale per
    ``group_size`` input channels of each output channel (None: per output channel). ``method``:
    "rtn" (round to nearest), "gptq" or "awq", the last two calibrated on ``calibration`` tokens
    ``[B, T]``. ``scheme``: "absmax" (symmetric) or "minmax" (asymmetric, with zero points).
    ``activations``: None (float inputs), "int8" (each input row quantized to int8 and an
    integer dot, W8A8) or "int8x2" (each row as two int8 terms, the row's and its remainder's
    rounding, in one integer dot: the fast path, as close as float inputs; ``qlinear``'s
    docstring). Each quantized layer dequantizes
    ``qlinear.BLOCK_ELEMENTS`` weights at a time; ``qlinear.with_block_elements`` changes that.

    ``weights="bfloat16"`` or ``"float16"``: the model under ``param_dtype=weights``, every
    projection and the embedding table cast to it; the other arguments do not apply (each one
    given is a ValueError that names it)."""
    _check_args(weights, group_size, method, scheme, calibration, embeddings, activations)
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a decodelab Transformer, got {type(model).__name__}")
    embeddings = bool(embeddings)
    for path, module in projections(model, embeddings):
        In = layout(module)[2]
        if group_size is not None and In % group_size:
            raise ValueError(f"group_size must divide the input dimension of every quantized "
                             f"projection; {'.'.join(map(str, path))} has {In} inputs, "
                             f"got group_size={group_size}")
        if weights == "int4" and In % 2:
            raise ValueError(f"weights='int4' packs two values per byte along the input "
                             f"dimension, which must be even; {'.'.join(map(str, path))} has "
                             f"{In} inputs: use weights='int8'")
    stored = stored_as(model)
    if stored:
        warnings.warn(f"model is already quantized ({stored}); quantizing its dequantized "
                      f"weights to weights={weights!r} (group_size={group_size}), so the result "
                      f"carries both roundings: quantize the float model to avoid the first",
                      stacklevel=2)
        model = dequantized(model)
    if weights in FLOAT_WEIGHTS:
        return with_config(model, model.config.replace(param_dtype=weights))
    targets = projections(model, embeddings)
    stats = calibrate(model, targets, method, calibration) if method != "rtn" else {}
    qtype = WEIGHTS[weights]
    out = nnx.clone(model)
    for path, module in targets:
        w, equation, kernel_shape = as_matrix(module)
        embed = isinstance(module, nnx.Embed)
        how = "rtn" if embed else method
        weights = QuantizedWeights(*quantize_matrix(w, qtype, group_size, scheme, how,
                                                     stats.get(path)))
        bias = None if embed or module.bias is None else module.bias[...]
        cls = QuantizedEmbed if embed else QuantizedEinsum
        set_module(out, path, cls(equation, kernel_shape, weights, bias,
                                   dtype=module.dtype or jnp.float32, activations=activations))
    return place_like(model, out)


def describe(model: nnx.Module) -> dict[str, dict[str, Any]]:
    """What ``restructure`` needs to rebuild ``model``'s quantized modules from the float model:
    ``{path: {kind, qvalue dtype, groups, scale dtype, offset dtype or None, input_scale,
    activations, block_elements}}``
    (empty for a float model). JSON-serialisable; the checkpoint stores it."""
    found = {}
    for path, module in nnx.iter_modules(model):
        if isinstance(module, QuantizedEinsum):
            found[".".join(map(str, path))] = {
                "kind": "embed" if isinstance(module, QuantizedEmbed) else "einsum",
                "qvalue": str(module.qvalue.dtype), "groups": int(module.scale.shape[0]),
                "scale": str(module.scale.dtype),
                "offset": None if module.offset is None else str(module.offset.dtype),
                "input_scale": module.input_scale is not None,
                "activations": module.activations,
                "block_elements": module.block_elements,
            }
    return found


def stored_as(model: nnx.Module) -> str:
    """How ``model``'s weights are stored when not as float32, e.g. ``"int8 in 14 projections"``
    or ``"bfloat16 parameters"``; empty for a float32 model (a message's words: ``describe`` has
    the details)."""
    kinds = Counter(spec["qvalue"] for spec in describe(model).values())
    found = [f"{kind} in {n} projection{'s' * (n > 1)}" for kind, n in kinds.items()]
    config = getattr(model, "config", None)
    if config is not None and config.param_dtype != "float32":
        found.append(f"{config.param_dtype} parameters")
    return ", ".join(found)


def check_float_model(model: Any, call: str) -> None:
    """``model`` must be a float Transformer for ``call`` (e.g. "prune"), which rewrites float
    kernels: a quantized one is refused, with the order that works."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a decodelab Transformer, got {type(model).__name__}")
    stored = stored_as(model)
    if stored:
        raise ValueError(f"model must be a float model for {call}, got a quantized one "
                         f"({stored}); use the float model (and quantize afterwards) or "
                         f"decodelab.compress.dequantized(model)")


def restructure(model: Transformer, description: dict[str, dict[str, Any]]) -> Transformer:
    """``model`` (float, possibly abstract) with the modules ``description`` names replaced by
    zero-valued quantized ones of the described shapes, ready to receive saved values."""
    out = nnx.clone(model)
    for name, spec in description.items():
        path = tuple(int(p) if p.isdigit() else p for p in name.split("."))
        module = functools.reduce(lambda m, k: m[k] if isinstance(k, int) else getattr(m, k),
                                  path, out)
        equation, kernel_shape, In = layout(module)
        Out, G = math.prod(kernel_shape) // In, spec["groups"]

        def build(module=module, equation=equation, kernel_shape=kernel_shape, spec=spec, G=G,
                  In=In, Out=Out):
            embed = spec["kind"] == "embed"
            offset = (None if spec["offset"] is None
                      else jnp.zeros((G, Out), _DTYPES[spec["offset"]]))
            bias = None if embed or module.bias is None else jnp.zeros(module.bias.shape,
                                                                        module.bias.dtype)
            cls = QuantizedEmbed if embed else QuantizedEinsum
            weights = QuantizedWeights(
                jnp.zeros((In, Out), _DTYPES[spec["qvalue"]]),
                jnp.ones((G, Out), _DTYPES[spec["scale"]]), offset,
                jnp.ones((In,), jnp.float32) if spec["input_scale"] else None)
            return cls(equation, kernel_shape, weights, bias, dtype=module.dtype or jnp.float32,
                       activations=spec.get("activations"),
                       block_elements=spec.get("block_elements", BLOCK_ELEMENTS))

        set_module(out, path, nnx.eval_shape(build))
    return out


def dequantized(model: Transformer) -> Transformer:
    """A float32 copy of ``model``: each quantized module back as the ``nnx.Einsum`` (or
    ``nnx.Embed``) it replaced, holding its dequantized kernel, and 16-bit parameters
    (``param_dtype``) converted to float32 (exactly)."""
    out = nnx.clone(model)
    for path, module in list(nnx.iter_modules(out)):
        if not isinstance(module, QuantizedEinsum):
            continue
        kernel = module.kernel()
        if isinstance(module, QuantizedEmbed):
            D, V = kernel.shape
            float_module = nnx.Embed(V, D, dtype=module.dtype, rngs=nnx.Rngs(0))
            float_module.embedding[...] = kernel.T
        else:
            bias_shape = None if module.bias is None else module.bias.shape
            float_module = nnx.Einsum(module.equation, kernel.shape, bias_shape,
                                      dtype=module.dtype, rngs=nnx.Rngs(0))
            float_module.kernel[...] = kernel
            if module.bias is not None:
                float_module.bias[...] = module.bias[...].astype(jnp.float32)
        set_module(out, path, float_module)
    if out.config.param_dtype != "float32":
        out = with_config(out, out.config.replace(param_dtype="float32"))
    return place_like(model, out)


def parameter_bytes(model: nnx.Module) -> int:
    """Bytes of ``model``'s parameters at each element's bit width (int4 counts half a byte)."""
    bits = 0
    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        dtype = jnp.dtype(leaf.dtype)
        width = jnp.iinfo(dtype).bits if jnp.issubdtype(dtype, jnp.integer) else (
            jnp.finfo(dtype).bits)
        bits += math.prod(leaf.shape) * width
    return bits // 8
