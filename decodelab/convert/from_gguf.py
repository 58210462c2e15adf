"""load_gguf: a Llama-architecture GGUF file -> (Transformer, PretrainedTokenizer), in float32.

The ``gguf`` package reads the file and dequantizes each tensor (``DEQUANTIZABLE``: float32,
float16, bfloat16, the 4/5/8-bit block formats and the K-quants); the model config comes from the
``llama.*`` metadata, the tokenizer from ``tokenizer.*`` (``decodelab.convert.tokenizer``).

llama.cpp's converter reorders the rows of each head's q and k projections from the rotate-half
layout of Hugging Face checkpoints (pairs ``(i, i + H/2)``) to interleaved pairs ``(2i, 2i + 1)``,
its own RoPE layout; decodelab rotates halves, so the loader undoes that reordering.
"""

from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from decodelab.checks import check_bool, check_path
from decodelab.config import ModelConfig
from decodelab.convert import gguf_blocks, llama
from decodelab.convert.tokenizer import PretrainedTokenizer, from_gguf_metadata
from decodelab.convert.weights import TensorSource, build_transformer
from decodelab.model import Transformer
from decodelab.optional import require

ARCHITECTURES = ("llama",)

# Tensor types this loader dequantizes (names of gguf.GGMLQuantizationType).
DEQUANTIZABLE = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def interleaved_to_rotate_half(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: within each head, row ``2i + j`` (pair i, member j) moves
    to ``i + j * H/2``. ``rows: [heads * H, ...]`` -> the same shape."""
    H = rows.shape[0] // heads
    return rows.reshape(heads, H // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _rope_fields(meta: Mapping[str, Any], arch: str, source: str) -> dict[str, Any]:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if factor is None and f"{arch}.rope.scale_linear" in meta:  # older files
        kind, factor = "linear", meta[f"{arch}.rope.scale_linear"]
    if kind == "none" or factor in (None, 1.0):
        return {}
    fields = {"rope_scaling_factor": float(factor)}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if kind == "linear":
        return {**fields, "rope_scaling": "linear"}
    if kind == "yarn":
        if original is None:
            raise ValueError(f"{source}: yarn rope scaling needs "
                             f"{arch}.rope.scaling.original_context_length, got none")
        return {**fields, "rope_scaling": "yarn", "rope_original_max_len": int(original)}
    raise ValueError(f"{source}: {arch}.rope.scaling.type must be one of ('none', 'linear', "
                     f"'yarn'), got {kind!r}")


def gguf_config(meta: Mapping[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    """The ModelConfig of a Llama GGUF from its metadata (and which optional tensors it has)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{source}: general.architecture must be one of {ARCHITECTURES}, got "
                         f"{arch!r}")

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"{source} must give {arch}.{key} in its metadata, got none")
        return meta[f"{arch}.{key}"]

    D, N = int(need("embedding_length")), int(need("attention.head_count"))
    H = int(meta.get(f"{arch}.attention.key_length", D // N))
    rotated = int(meta.get(f"{arch}.rope.dimension_count", H))
    if rotated != H:
        raise ValueError(f"{source}: {arch}.rope.dimension_count must equal the head width {H} "
                         f"(decodelab rotates whole heads), got {rotated}")
    if "rope_freqs.weight" in tensor_names:
        raise ValueError(f"{source} holds rope_freqs.weight (per-frequency RoPE factors, "
                         "llama.cpp's form of Llama 3 scaling), which load_gguf does not support")
    vocab = meta.get(f"{arch}.vocab_size", meta.get("tokenizer.ggml.token_count", 0))
    return ModelConfig(
        vocab_size=int(vocab), d_model=D, n_layers=int(need("block_count")), n_heads=N,
        n_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", N)), head_dim=H,
        d_ff=int(need("feed_forward_length")), max_seq_len=int(need("context_length")),
        position="rope", rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        norm="rms", norm_eps=float(need("attention.layer_norm_rms_epsilon")), mlp="swiglu",
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        mlp_bias="blk.0.ffn_up.bias" in tensor_names,
        tie_embeddings="output.weight" not in tensor_names,
        **_rope_fields(meta, arch, source))


def _read_gguf(path: pathlib.Path):
    """The file's ``gguf.GGUFReader``, parsed once per process while the file is unchanged (its
    path, size and modification time are the key): the reader builds a numpy view per metadata
    string, seconds for a 49,152-token vocabulary, and the file is opened read-only."""
    require("gguf")
    stat = path.stat()
    try:
        return _parsed_gguf(path.resolve(), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    except (ValueError, OSError, IndexError) as e:
        raise ValueError(f"path must be a GGUF file, got {str(path)!r} ({e})") from None


@functools.lru_cache(maxsize=2)
def _parsed_gguf(path: pathlib.Path, size: int, mtime_ns: int, inode: int):
    del size, mtime_ns, inode  # the cache key only
    return require("gguf").GGUFReader(path)


def read_metadata(path: str | os.PathLike, *, tokenizer: bool = True
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(metadata, tensors)`` of a GGUF file: each key's value (without ``tokenizer=False``, the
    ``tokenizer.*`` keys are left out but ``tokenizer.ggml.tokens``, whose length is kept as
    ``tokenizer.ggml.token_count``: decoding a vocabulary takes seconds), and its tensors by
    name (the reader's memory-mapped entries; nothing is dequantized)."""
    path = check_path("path", path, "file", what="GGUF ")
    reader = _read_gguf(path)
    meta = {name: field.contents() for name, field in reader.fields.items()
            if tokenizer or not name.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" in reader.fields:
        meta["tokenizer.ggml.token_count"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    return meta, {t.name: t for t in reader.tensors}


def _dequantize(tensor, source: str) -> np.ndarray:
    dequantize = require("gguf.quants").dequantize
    kind = tensor.tensor_type.name
    if kind not in DEQUANTIZABLE:
        raise ValueError(f"{source}: tensor {tensor.name!r} has quantization type {kind}; "
                         f"load_gguf reads {DEQUANTIZABLE}")
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest axis first
    return dequantize(tensor.data, tensor.tensor_type).reshape(shape)


def gguf_model_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a GGUF file, read from its metadata alone (no tensor is dequantized)."""
    meta, tensors = read_metadata(path, tokenizer=False)
    return gguf_config(meta, set(tensors), str(path))


def _tokenizer(meta: Mapping[str, Any], source: str) -> PretrainedTokenizer:
    return from_gguf_metadata({k: v for k, v in meta.items() if k.startswith("tokenizer.")},
                              source)


def gguf_tokenizer(path: str | os.PathLike) -> PretrainedTokenizer:
    """The tokenizer of a GGUF file alone (no tensor is dequantized)."""
    meta, _ = read_metadata(path)
    return _tokenizer(meta, str(path))


def load_gguf(path: str | os.PathLike, *, dequantize: bool = True
              ) -> tuple[Transformer, PretrainedTokenizer]:
    """The float32 model and the tokenizer of a Llama-architecture GGUF file (module docstring);
    with ``dequantize=False`` its Q8_0 / Q4_0 / Q4_1 tensors stay as stored, quantized
    (``gguf_blocks``)."""
    check_bool("dequantize", dequantize)
    meta, tensors = read_metadata(path)
    source = str(path)
    cfg = gguf_config(meta, set(tensors), source)
    tokenizer = _tokenizer(meta, source)
    if not dequantize:
        model = gguf_blocks.load_kept(cfg, tensors, source, lambda t: _dequantize(t, source),
                                      interleaved_to_rotate_half)
        return model, tokenizer
    src = TensorSource(source, tensors, lambda name: _dequantize(tensors[name], source))
    params = llama.llama_params(cfg, src, llama.GGUF_NAMES, interleaved_to_rotate_half)
    src.check_used()
    return build_transformer(cfg, params), tokenizer
