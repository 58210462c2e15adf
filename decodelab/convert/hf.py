"""load_hf: a local Hugging Face checkpoint directory -> (Transformer, PretrainedTokenizer).

The directory holds ``config.json``, the weights as ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``) and ``tokenizer.json``. Two families are read, each by a rule
from ``config.json``'s ``model_type`` to a ModelConfig and a parameter mapping:

- ``llama``: RMSNorm, SwiGLU, RoPE with grouped-query attention, ``rope_theta`` and the
  ``rope_scaling`` / ``rope_parameters`` types default, linear, dynamic, yarn and llama3, tied or
  untied embeddings, optional attention and MLP biases;
- ``gpt2``: learned absolute positions, LayerNorm and every projection with biases, GELU (tanh
  approximation), PyTorch ``Conv1D`` projections stored ``[in, out]``, q/k/v in one matrix.

Weights become float32 whatever their stored dtype (float32, float16, bfloat16).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from decodelab.checks import check_path
from decodelab.config import ModelConfig
from decodelab.convert import llama
from decodelab.convert.tokenizer import PretrainedTokenizer, from_hf_directory
from decodelab.convert.weights import TensorSource, build_transformer
from decodelab.model import Transformer
from decodelab.optional import require


def _get(hf: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = hf.get(key)
    return default if value is None else value


def _require_value(hf: Mapping[str, Any], key: str, allowed: tuple, default: Any) -> None:
    value = _get(hf, key, default)
    if value not in allowed:
        raise ValueError(f"config.json: {key} must be one of {allowed} (what decodelab "
                         f"implements), got {value!r}")


# --- RoPE scaling ---------------------------------------------------------------------------------


def _rope_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig RoPE fields of a Llama config: transformers 5 writes ``rope_parameters``
    (theta inside), 4.x ``rope_theta`` and ``rope_scaling``."""
    rope = dict(_get(hf, "rope_parameters") or _get(hf, "rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    max_positions = _get(hf, "max_position_embeddings", 2048)
    fields = {"rope_theta": float(rope.get("rope_theta", _get(hf, "rope_theta", 10000.0)))}
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"config.json: partial_rotary_factor must be 1.0 (decodelab rotates the "
                         f"whole head), got {rope['partial_rotary_factor']!r}")
    if kind == "default":
        return fields
    original = _get(rope, "original_max_position_embeddings", max_positions)
    factor = rope.get("factor")
    if factor is None and kind == "yarn":
        factor = max_positions / original  # DeepSeek-style: the factor the lengths imply
    if factor is None:
        raise ValueError(f"config.json: rope scaling {kind!r} must give a factor, got {rope}")
    fields.update(rope_scaling_factor=float(factor))
    if kind == "linear":
        return {**fields, "rope_scaling": "linear"}
    if kind == "dynamic":
        # Hugging Face's dynamic NTK starts scaling past max_position_embeddings.
        return {**fields, "rope_scaling": "dynamic", "rope_original_max_len": max_positions}
    if kind == "llama3":
        return {**fields, "rope_scaling": "llama3", "rope_original_max_len": int(original),
                "llama3_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
                "llama3_high_freq_factor": float(rope.get("high_freq_factor", 4.0))}
    if kind == "yarn":
        yarn_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        unsupported = {k: rope[k] for k in ("mscale", "mscale_all_dim") if rope.get(k)}
        if rope.get("truncate", True) is not True:
            unsupported["truncate"] = rope["truncate"]
        attention = rope.get("attention_factor")
        if attention is not None and not math.isclose(attention, yarn_factor, rel_tol=1e-6):
            unsupported["attention_factor"] = attention
        if unsupported:
            raise ValueError(f"config.json: yarn rope scaling must use YaRN's own attention "
                             f"factor 0.1 ln(s) + 1 and truncated bounds, got {unsupported}")
        return {**fields, "rope_scaling": "yarn", "rope_original_max_len": int(original),
                "yarn_beta_fast": float(rope.get("beta_fast") or 32.0),
                "yarn_beta_slow": float(rope.get("beta_slow") or 1.0)}
    raise ValueError(f"config.json: rope type must be one of ('default', 'linear', 'dynamic', "
                     f"'yarn', 'llama3'), got {kind!r}")


# --- the two families -----------------------------------------------------------------------------


def _llama_config(hf: Mapping[str, Any], vocab_size: int) -> ModelConfig:
    _require_value(hf, "hidden_act", ("silu",), "silu")
    _require_value(hf, "pretraining_tp", (1,), 1)
    D, N = hf["hidden_size"], hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=vocab_size, d_model=D, n_layers=hf["num_hidden_layers"], n_heads=N,
        n_kv_heads=_get(hf, "num_key_value_heads", N), head_dim=_get(hf, "head_dim", D // N),
        d_ff=hf["intermediate_size"], max_seq_len=_get(hf, "max_position_embeddings", 2048),
        position="rope", norm="rms", norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)),
        mlp="swiglu", attention_bias=bool(_get(hf, "attention_bias", False)),
        mlp_bias=bool(_get(hf, "mlp_bias", False)),
        tie_embeddings=bool(_get(hf, "tie_word_embeddings", False)), **_rope_fields(hf))


def _llama_params(cfg: ModelConfig, src: TensorSource) -> dict[str, np.ndarray]:
    return llama.llama_params(cfg, src, llama.HF_NAMES)


def _gpt2_config(hf: Mapping[str, Any], vocab_size: int) -> ModelConfig:
    # gelu_new and gelu_pytorch_tanh are both GELU's tanh approximation.
    _require_value(hf, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new")
    _require_value(hf, "scale_attn_weights", (True,), True)
    _require_value(hf, "scale_attn_by_inverse_layer_idx", (False,), False)
    D = hf["n_embd"]
    return ModelConfig(
        vocab_size=vocab_size, d_model=D, n_layers=hf["n_layer"], n_heads=hf["n_head"],
        d_ff=_get(hf, "n_inner", 4 * D), max_seq_len=_get(hf, "n_positions", 1024),
        position="learned", norm="layer", norm_eps=float(_get(hf, "layer_norm_epsilon", 1e-5)),
        mlp="gelu", attention_bias=True, mlp_bias=True,
        tie_embeddings=bool(_get(hf, "tie_word_embeddings", True)))


def _gpt2_params(cfg: ModelConfig, src: TensorSource) -> dict[str, np.ndarray]:
    D, F, V, N, H = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.n_heads, cfg.head_dim
    # GPT2LMHeadModel saves "transformer.h.0..."; the original GPT-2 files have no prefix.
    prefix = "transformer." if src.has("transformer.wte.weight") else ""
    take = lambda name, shape: src.take(prefix + name, shape)  # noqa: E731
    params = {"embed.embedding": take("wte.weight", (V, D)),
              "positions.table.embedding": take("wpe.weight", (cfg.max_seq_len, D)),
              "final_norm.scale": take("ln_f.weight", (D,)),
              "final_norm.bias": take("ln_f.bias", (D,))}
    if not cfg.tie_embeddings:
        params["lm_head.kernel"] = src.take("lm_head.weight", (V, D)).T
    for i in range(cfg.n_layers):
        h, p = f"h.{i}.", f"blocks.{i}."
        for norm, ours in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            params[p + f"{ours}.scale"] = take(h + f"{norm}.weight", (D,))
            params[p + f"{ours}.bias"] = take(h + f"{norm}.bias", (D,))
        # Conv1D computes x @ W + b with W: [in, out]; c_attn's outputs are q, k, v side by side.
        qkv = take(h + "attn.c_attn.weight", (D, 3 * D))
        qkv_bias = take(h + "attn.c_attn.bias", (3 * D,))
        for j, key in enumerate("qkv"):
            params[p + f"attn.{key}.kernel"] = qkv[:, j * D:(j + 1) * D].reshape(D, N, H)
            params[p + f"attn.{key}.bias"] = qkv_bias[j * D:(j + 1) * D].reshape(N, H)
        params[p + "attn.o.kernel"] = take(h + "attn.c_proj.weight", (D, D)).reshape(N, H, D)
        params[p + "attn.o.bias"] = take(h + "attn.c_proj.bias", (D,))
        params[p + "mlp.up.kernel"] = take(h + "mlp.c_fc.weight", (D, F))
        params[p + "mlp.up.bias"] = take(h + "mlp.c_fc.bias", (F,))
        params[p + "mlp.down.kernel"] = take(h + "mlp.c_proj.weight", (F, D))
        params[p + "mlp.down.bias"] = take(h + "mlp.c_proj.bias", (D,))
    return params


def _gpt2_ignored(name: str) -> bool:
    # Older files save attention's causal-mask buffers; a tied head may be saved as a copy.
    return name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight"


def _llama_ignored(name: str) -> bool:
    # A buffer older transformers saved; a tied head may be saved as a copy.
    return name.endswith(".rotary_emb.inv_freq") or name == "lm_head.weight"


# model_type -> (config rule, parameter rule, tensors to skip)
ARCHITECTURES: dict[str, tuple[Callable, Callable, Callable[[str], bool]]] = {
    "llama": (_llama_config, _llama_params, _llama_ignored),
    "gpt2": (_gpt2_config, _gpt2_params, _gpt2_ignored),
}


# --- safetensors ----------------------------------------------------------------------------------


def _bfloat16(path: pathlib.Path, name: str) -> np.ndarray:
    """A bfloat16 tensor of a safetensors file as float32 (NumPy has no bfloat16): its bits are
    the upper half of a float32's."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_len))[name]
    start, end = entry["data_offsets"]
    raw = np.fromfile(path, dtype="<u2", count=(end - start) // 2, offset=8 + header_len + start)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _safetensors_source(directory: pathlib.Path, ignored: Callable[[str], bool]) -> TensorSource:
    safe_open = require("safetensors").safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: directory / shard for name, shard in weight_map.items()}
    elif (directory / "model.safetensors").is_file():
        with safe_open(directory / "model.safetensors", framework="numpy") as f:
            files = {name: directory / "model.safetensors" for name in f.keys()}
    else:
        raise ValueError(f"directory must hold model.safetensors (or model.safetensors.index.json "
                         f"and its shards), got neither in {str(directory)!r}")

    def read(name: str) -> np.ndarray:
        with safe_open(files[name], framework="numpy") as f:
            if f.get_slice(name).get_dtype() == "BF16":
                return _bfloat16(files[name], name)
            return f.get_tensor(name)

    return TensorSource(str(directory), files, read, ignored)


def load_hf(directory: str | os.PathLike) -> tuple[Transformer, PretrainedTokenizer]:
    """The float32 model and the tokenizer of a local Hugging Face checkpoint directory (Llama
    family or GPT-2; see the module docstring). Nothing is downloaded."""
    directory = check_path("directory", directory, "directory", what="checkpoint ")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"directory must hold a Hugging Face config.json, got none in "
                         f"{str(directory)!r}")
    hf = json.loads(config_path.read_text())
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"config.json: model_type must be one of {sorted(ARCHITECTURES)}, got "
                         f"{model_type!r}")
    config_rule, params_rule, ignored = ARCHITECTURES[model_type]
    cfg = config_rule(hf, int(hf["vocab_size"]))
    tokenizer = from_hf_directory(directory, hf)
    src = _safetensors_source(directory, ignored)
    params = params_rule(cfg, src)
    src.check_used()
    return build_transformer(cfg, params), tokenizer
