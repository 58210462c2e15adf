"""GGUF block-quantized tensors kept as stored: Q8_0, Q4_0 and Q4_1 -> ``qlinear.QuantizedEinsum``.

A GGUF matrix is PyTorch's ``[out, in]`` with each row cut into blocks of 32 consecutive inputs;
a block is a float16 scale ``d`` (Q4_1 also a float16 minimum ``m``) and 32 integers:

- Q8_0: ``d``, 32 int8 ``q``; ``w = q * d``;
- Q4_0: ``d``, 16 bytes of 4-bit ``q`` in [0, 15] (low nibbles are elements 0-15, high nibbles
  16-31); ``w = (q - 8) * d``;
- Q4_1: ``d``, ``m``, 16 bytes as Q4_0; ``w = q * d + m``.

These map onto ``quantize``'s representation ``w = qvalue * scale + offset`` with groups of 32 input
channels: Q8_0 as int8 with scale ``d``; Q4_0 as int4 ``q - 8`` with scale ``d``; Q4_1 as int4
``q - 8`` with scale ``d`` and offset ``m + 8 d`` (float32: int4 holds [-8, 7], not [0, 15], and
``m + 8 d`` needs more bits than float16). Scales stay float16 as stored. Nothing is dequantized
except by the model's own grouped matmul, so the model reads the file's 4.5 to 8.5 bits per weight.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

BLOCK = 32
KEPT = ("Q8_0", "Q4_0", "Q4_1")


def _split_blocks(raw: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    """``raw`` bytes of a ``rows``-row tensor -> ``[rows, blocks, block_bytes]`` uint8."""
    return np.ascontiguousarray(raw, np.uint8).reshape(rows, -1, block_bytes)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """``[..., 16]`` bytes -> ``[..., 32]`` values in [0, 15]: low nibbles first, then high."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def block_parts(kind: str, raw: np.ndarray, shape: tuple[int, int]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The stored parts of a ``kind`` tensor of ``shape = (out, in)``: ``(q [out, in] int8 in the
    representation's range, scale [out, in / 32] float16, offset [out, in / 32] float32 or None)``
    with ``weight = q * scale + offset`` exactly as gguf dequantizes it."""
    rows, cols = shape
    if kind == "Q8_0":
        blocks = _split_blocks(raw, rows, 2 + BLOCK)
        scale = blocks[..., :2].copy().view(np.float16)[..., 0]
        q = blocks[..., 2:].copy().view(np.int8)
        return q.reshape(rows, cols), scale, None
    if kind in ("Q4_0", "Q4_1"):
        head = 2 if kind == "Q4_0" else 4
        blocks = _split_blocks(raw, rows, head + BLOCK // 2)
        halves = blocks[..., :head].copy().view(np.float16)  # [rows, blocks, 1 or 2]
        scale = halves[..., 0]
        q = (_nibbles(blocks[..., head:]).astype(np.int8) - 8).reshape(rows, cols)
        offset = None
        if kind == "Q4_1":
            offset = halves[..., 1].astype(np.float32) + 8 * scale.astype(np.float32)
        return q, scale, offset
    raise ValueError(f"kind must be one of {KEPT}, got {kind!r}")


def _modules(cfg, names) -> dict[str, tuple[tuple, int | None]]:
    """GGUF tensor name -> (decodelab module path, heads whose q/k rows llama.cpp permuted)."""
    found = {names.embed: (("embed",), None), names.lm_head: (("lm_head",), None)}
    for i in range(cfg.n_layers):
        for key, name, heads in (("q", names.q, cfg.n_heads), ("k", names.k, cfg.n_kv_heads),
                                 ("v", names.v, None), ("o", names.o, None)):
            found[name.format(i=i)] = (("blocks", i, "attn", key), heads)
        for key, name in (("gate", names.gate), ("up", names.up), ("down", names.down)):
            found[name.format(i=i)] = (("blocks", i, "mlp", key), None)
    return found


def load_kept(cfg, tensors, source: str, read_float, rows_to_rotate_half):
    """The Transformer of a Llama GGUF whose Q8_0 / Q4_0 / Q4_1 projections (and embedding table
    or head) are ``QuantizedEinsum`` / ``QuantizedEmbed`` holding the file's blocks; other tensors
    are read as float32 by ``read_float(tensor)``."""
    from decodelab.compress.qlinear import QuantizedEinsum, QuantizedEmbed, QuantizedWeights
    from decodelab.compress.quantization import layout, set_module
    from decodelab.convert import llama
    from decodelab.convert.weights import TensorSource, build_transformer

    shape = lambda t: tuple(int(d) for d in reversed(t.shape))  # noqa: E731  (GGUF: fastest first)
    kept = {name for name, t in tensors.items() if t.tensor_type.name in KEPT}
    def read(name: str) -> np.ndarray:  # kept tensors: placeholders, replaced below
        tensor = tensors[name]
        return np.zeros(shape(tensor), np.float32) if name in kept else read_float(tensor)

    src = TensorSource(source, tensors, read)
    model = build_transformer(cfg, llama.llama_params(cfg, src, llama.GGUF_NAMES,
                                                      rows_to_rotate_half))
    src.check_used()
    for name, (path, heads) in _modules(cfg, llama.GGUF_NAMES).items():
        if name not in kept:
            continue
        tensor = tensors[name]
        q, scale, offset = block_parts(tensor.tensor_type.name, tensor.data, shape(tensor))
        if heads is not None:  # rows are outputs: the blocks (along inputs) move with them
            q, scale = rows_to_rotate_half(q, heads), rows_to_rotate_half(scale, heads)
            offset = None if offset is None else rows_to_rotate_half(offset, heads)
        module = model
        for key in path:
            module = module[key] if isinstance(key, int) else getattr(module, key)
        equation, kernel_shape, _ = layout(module)
        embed = path == ("embed",)
        bias = None if embed or module.bias is None else module.bias[...]
        dtype = jnp.int8 if tensor.tensor_type.name == "Q8_0" else jnp.int4
        cls = QuantizedEmbed if embed else QuantizedEinsum
        weights = QuantizedWeights(jnp.asarray(q.T, dtype), jnp.asarray(scale.T),
                                   None if offset is None else jnp.asarray(offset.T))
        set_module(model, path, cls(equation, kernel_shape, weights, bias,
                                    dtype=module.dtype or jnp.float32))
    return model
