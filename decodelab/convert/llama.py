"""The Llama family's tensors in decodelab's layout, shared by the Hugging Face and GGUF loaders.

Both formats store each projection as PyTorch's ``[out, in]`` matrix; only the tensor names differ
(``LlamaNames``), and GGUF's q and k rows are in llama.cpp's rotary order (see ``from_gguf``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from decodelab.config import ModelConfig
from decodelab.convert.weights import TensorSource


@dataclasses.dataclass(frozen=True)
class LlamaNames:
    """Tensor names of one format; ``{i}`` is the layer index. A bias is its weight's name with
    ``bias`` for ``weight``."""

    embed: str
    final_norm: str
    lm_head: str
    attn_norm: str
    q: str
    k: str
    v: str
    o: str
    mlp_norm: str
    gate: str
    up: str
    down: str


HF_NAMES = LlamaNames(
    embed="model.embed_tokens.weight", final_norm="model.norm.weight", lm_head="lm_head.weight",
    attn_norm="model.layers.{i}.input_layernorm.weight",
    q="model.layers.{i}.self_attn.q_proj.weight", k="model.layers.{i}.self_attn.k_proj.weight",
    v="model.layers.{i}.self_attn.v_proj.weight", o="model.layers.{i}.self_attn.o_proj.weight",
    mlp_norm="model.layers.{i}.post_attention_layernorm.weight",
    gate="model.layers.{i}.mlp.gate_proj.weight", up="model.layers.{i}.mlp.up_proj.weight",
    down="model.layers.{i}.mlp.down_proj.weight")

GGUF_NAMES = LlamaNames(
    embed="token_embd.weight", final_norm="output_norm.weight", lm_head="output.weight",
    attn_norm="blk.{i}.attn_norm.weight", q="blk.{i}.attn_q.weight", k="blk.{i}.attn_k.weight",
    v="blk.{i}.attn_v.weight", o="blk.{i}.attn_output.weight", mlp_norm="blk.{i}.ffn_norm.weight",
    gate="blk.{i}.ffn_gate.weight", up="blk.{i}.ffn_up.weight", down="blk.{i}.ffn_down.weight")


def _bias(name: str) -> str:
    return name.removesuffix("weight") + "bias"


def llama_params(cfg: ModelConfig, src: TensorSource, names: LlamaNames,
                 rows_to_rotate_half: Callable[[np.ndarray, int], np.ndarray] = lambda w, n: w
                 ) -> dict[str, np.ndarray]:
    """decodelab parameters of a Llama checkpoint. ``rows_to_rotate_half(w, heads)`` reorders the
    rows (first axis) of a q or k weight or bias of ``heads`` heads into RoPE's rotate-half pairs
    (identity for Hugging Face files)."""
    D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    N, K, H = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    params = {"embed.embedding": src.take(names.embed, (V, D)),
              "final_norm.scale": src.take(names.final_norm, (D,))}
    if not cfg.tie_embeddings:
        params["lm_head.kernel"] = src.take(names.lm_head, (V, D)).T
    for i in range(cfg.n_layers):
        at = lambda name: name.format(i=i)  # noqa: E731
        p = f"blocks.{i}."
        params[p + "attn_norm.scale"] = src.take(at(names.attn_norm), (D,))
        params[p + "mlp_norm.scale"] = src.take(at(names.mlp_norm), (D,))
        for key, name, heads in (("q", names.q, N), ("k", names.k, K), ("v", names.v, K)):
            rotate = key != "v"
            weight = src.take(at(name), (heads * H, D))  # [heads * H, D]
            weight = rows_to_rotate_half(weight, heads) if rotate else weight
            params[p + f"attn.{key}.kernel"] = weight.T.reshape(D, heads, H)
            if cfg.attention_bias:
                bias = src.take(_bias(at(name)), (heads * H,))
                bias = rows_to_rotate_half(bias, heads) if rotate else bias
                params[p + f"attn.{key}.bias"] = bias.reshape(heads, H)
        params[p + "attn.o.kernel"] = src.take(at(names.o), (D, N * H)).T.reshape(N, H, D)
        if cfg.attention_bias:
            params[p + "attn.o.bias"] = src.take(_bias(at(names.o)), (D,))
        for key, name, shape in (("gate", names.gate, (F, D)), ("up", names.up, (F, D)),
                                 ("down", names.down, (D, F))):
            params[p + f"mlp.{key}.kernel"] = src.take(at(name), shape).T
            if cfg.mlp_bias:
                params[p + f"mlp.{key}.bias"] = src.take(_bias(at(name)), shape[:1])
    return params
