"""Peers timed on the same shapes as ``dl.generate``: Hugging Face transformers and llama.cpp.

- transformers (``time_hf_generate``; the ``peer`` extra): ``LlamaForCausalLM.generate`` in
  PyTorch on the kind of device JAX runs on (``hf_device``: CUDA where JAX's backend is a GPU
  and torch sees one, else the CPU with ``torch.set_num_threads`` set to the threads XLA uses),
  with the same shapes (width, layers, heads, kv heads, head width, MLP width, vocabulary, tied embeddings, RoPE
  theta, norm epsilon, ``llama_config``), the same float32 weights (copied from the decodelab
  model, ``llama_state_dict``), the same prompt ids, greedy, ``max_new_tokens = min_new_tokens``.
  Without torch and transformers it returns ``{}`` (the benchmark's figures are n/a).
- llama.cpp (``time_llama_cpp``, ``llama_cpp_peer``; the ``llamacpp`` extra, through
  ``decodelab.measure.llama_cpp``): one row decoded greedily with the same threads from a GGUF
  file as stored (``llama_*``) and from llama.cpp's own float32 conversion of it
  (``llama_f32_*``): the same ``generate_s`` / ``tokens_per_s`` / ``prefill_ms`` / ``step_ms`` as
  ``timing.time_generate``, ``*_weight_bytes`` the file's tensor bytes, ``*_bytes_per_token``
  those plus its float16 KV cache at the middle step, ``*_roofline_ratio`` its roofline step (its
  bytes over the measured bandwidth, or its FLOPs over the matmul rate if larger) over its step.
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import numpy as np

from decodelab import optional
from decodelab.config import ModelConfig
from decodelab.measure import llama_cpp, roofline
from decodelab.measure.timing import Machine, threads
from decodelab.model import Transformer
from decodelab.sampling.params import SamplingParams
from decodelab.sampling.processors import PARAMETERS

# Tokens of the transformers warm-up call.
HF_WARMUP_TOKENS = 16


# --- transformers -------------------------------------------------------------------------------


def llama_config(cfg: ModelConfig, max_positions: int):
    """transformers' ``LlamaConfig`` with the shapes of ``cfg`` (a RoPE, RMSNorm, SwiGLU model)."""
    LlamaConfig = optional.require("transformers").LlamaConfig

    llama_like = dict(position="rope", rope_scaling="none", norm="rms", mlp="swiglu")
    differ = {k: getattr(cfg, k) for k, v in llama_like.items() if getattr(cfg, k) != v}
    if differ:
        raise ValueError(f"the transformers peer is a Llama model, so cfg must have {llama_like}; "
                         f"got {differ}")
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
        max_position_embeddings=max_positions, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings, attention_bias=False,
        mlp_bias=False, torch_dtype="float32")


def llama_state_dict(model: Transformer) -> dict[str, np.ndarray]:
    """``model``'s parameters under transformers' ``LlamaForCausalLM`` names, each projection as
    PyTorch's ``[out, in]`` matrix (the inverse of ``decodelab.convert``'s Llama mapping)."""
    cfg = model.config
    D = cfg.d_model
    value = lambda param: np.asarray(param[...], np.float32)  # noqa: E731
    state = {"model.embed_tokens.weight": value(model.embed.embedding),
             "model.norm.weight": value(model.final_norm.scale)}
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = value(model.lm_head.kernel).T
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = value(block.attn_norm.scale)
        state[p + "post_attention_layernorm.weight"] = value(block.mlp_norm.scale)
        for key in "qkv":
            kernel = value(getattr(block.attn, key).kernel)  # [D, heads, H]
            state[p + f"self_attn.{key}_proj.weight"] = kernel.reshape(D, -1).T
        state[p + "self_attn.o_proj.weight"] = value(block.attn.o.kernel).reshape(-1, D).T
        for key in ("gate", "up", "down"):
            state[p + f"mlp.{key}_proj.weight"] = value(getattr(block.mlp, key).kernel).T
    return state


def hf_sampling(params: SamplingParams) -> dict:
    """transformers' ``generate`` arguments for the same processors as ``params`` (one value per
    field; temperature, top-k, top-p, min-p, typical-p, repetition penalty): ``do_sample`` and
    each processor set, top-k 0 where decodelab's is off (transformers' default is 50)."""
    fields = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
              "repetition_penalty": 1.0}
    values = {name: np.asarray(getattr(params, name)).item() for name in fields}
    others = [name for name, p in PARAMETERS.items() if name not in fields
              and np.any(np.asarray(getattr(params, name)) != p.neutral)]
    if others or params.logit_bias or params.banned_tokens or params.constrained:
        raise ValueError(f"params must use only {sorted(fields)} for a transformers peer, got "
                         f"{others or 'a logit bias, banned tokens or a constraint'}")
    if values["temperature"] == 0.0:
        return {"do_sample": False, "repetition_penalty": values["repetition_penalty"]}
    values["min_p"] = values["min_p"] or None
    return {"do_sample": True, **values}


def time_hf_generate(model: Transformer, prompts: np.ndarray, new_tokens: int,
                     repeats: int, params: SamplingParams | None = None) -> dict:
    """Median seconds of transformers' ``generate`` (greedy, or the processors of ``params``:
    ``hf_sampling``) with ``model``'s shapes and weights and the same prompt ids (``[B, P]``),
    after a short warm-up call (eager PyTorch compiles nothing; the warm-up only starts its
    thread pool and allocator): ``hf_generate_s``, ``hf_tokens_per_s``, ``hf_generate_reps_s``
    (every timed run), ``hf_version`` and ``hf_device`` (``peer_device``); ``{}`` if torch or
    transformers is not installed."""
    try:
        torch = optional.require("torch")
        transformers = optional.require("transformers")
    except optional.MissingExtra:
        return {}
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads())
    device = peer_device(torch)
    cfg = model.config
    B, P = prompts.shape
    peer = transformers.LlamaForCausalLM(llama_config(cfg, P + new_tokens)).eval().to(device)
    if peer.num_parameters() != cfg.num_params():
        raise RuntimeError(f"the transformers model has {peer.num_parameters()} parameters, "
                           f"decodelab's {cfg.num_params()}: the shapes differ")
    weights = {k: torch.from_numpy(v.copy()).to(device)
               for k, v in llama_state_dict(model).items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if cfg.tie_embeddings else set()):
        raise RuntimeError(f"decodelab's weights do not fill the transformers model: missing "
                           f"{missing}, unexpected {unexpected}")
    input_ids = torch.as_tensor(prompts, dtype=torch.long, device=device)

    sampling = hf_sampling(params) if params is not None else {"do_sample": False}
    torch.manual_seed(0)

    def run(n: int):
        out = peer.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                            num_beams=1, max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                            **sampling)
        if device == "cuda":
            torch.cuda.synchronize()  # the timer stops when the tokens exist, as generate's
        return out

    with torch.inference_mode():
        run(min(new_tokens, HF_WARMUP_TOKENS))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = run(new_tokens)
            times.append(time.perf_counter() - start)
    if tuple(out.shape) != (B, P + new_tokens):
        raise RuntimeError(f"transformers generated shape {tuple(out.shape)}, expected "
                           f"{(B, P + new_tokens)}")
    seconds = statistics.median(times)
    return {"hf_generate_s": seconds, "hf_tokens_per_s": B * new_tokens / seconds,
            "hf_generate_reps_s": times,
            "hf_version": f"transformers {transformers.__version__}, torch {torch.__version__}",
            "hf_device": device}


def hf_columns(hf: dict, new_tokens: int, enabled: bool) -> dict:
    """A benchmark row's transformers columns from ``time_hf_generate``'s result ``hf`` (``{}``
    when not run, or not installed): each figure or None, the step, the version or why none."""
    return {**{k: hf.get(k) for k in ("hf_generate_s", "hf_tokens_per_s", "hf_generate_reps_s",
                                      "hf_device")},
            "hf_step_ms": 1e3 * hf["hf_generate_s"] / new_tokens if hf else None,
            "hf_version": hf.get("hf_version", "not installed (pip install -e .[peer])"
                                 if enabled else "not run")}


def peer_device(torch) -> str:
    """Where the transformers peer runs: ``"cuda"`` where JAX's default backend is a GPU and
    ``torch`` sees a CUDA device, else ``"cpu"`` (a peer on another kind of device than
    decodelab's would compare machines, not implementations)."""
    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


# --- llama.cpp ----------------------------------------------------------------------------------


def time_llama_cpp(path: pathlib.Path, prompt: np.ndarray, new_tokens: int, repeats: int,
                   extra_buffers: bool = False) -> dict:
    """llama.cpp (through ``llama-cpp-python``) decoding one row greedily from the GGUF file at
    ``path`` with ``threads()`` threads: the median seconds of ``new_tokens`` tokens after
    ``prompt`` (``[P]`` ids; prefill included, as in ``generate_s``) and of the first token alone
    (its prefill), each after a warm-up call; EOS is ignored (the tokens are taken as they come).
    Every call starts from an empty KV cache. ``extra_buffers``: as ``llama_cpp.load``."""
    binding = optional.require("llama_cpp")
    P = len(prompt)
    llm = llama_cpp.load(path, n_ctx=P + new_tokens, n_batch=P, extra_buffers=extra_buffers)
    ids = [int(t) for t in prompt]

    def run(n: int) -> list[int]:
        llm.reset()  # no prefix of the previous call is reused
        out = []
        for token in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == n:
                return out
        raise RuntimeError(f"llama.cpp stopped after {len(out)} of {n} tokens")

    def timed(n: int) -> list[float]:
        run(n)  # warm-up
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(n)
            seconds.append(time.perf_counter() - start)
        return seconds

    wholes, prefills = timed(new_tokens), timed(1)
    whole, prefill = statistics.median(wholes), statistics.median(prefills)
    return {"generate_s": whole, "tokens_per_s": new_tokens / whole, "prefill_ms": 1e3 * prefill,
            "step_ms": 1e3 * max(whole - prefill, 0.0) / (new_tokens - 1),
            "generate_reps_s": wholes, "prefill_reps_s": prefills,
            "weight_bytes": llama_cpp.gguf_tensor_bytes(path), "version": binding.__version__}


def llama_cpp_peer(source: pathlib.Path, cfg: ModelConfig, prompt: np.ndarray, new_tokens: int,
                   repeats: int, machine: Machine, *, extra_buffers: bool = False,
                   status: Callable[[str], None] = lambda _: None) -> dict:
    """The llama.cpp figures of the GGUF file ``source`` (the model of ``cfg``) decoding
    ``prompt`` (``[P]`` ids): the file as stored (``llama_*``) and llama.cpp's float32 conversion
    of it (``llama_f32_*``), each with the bytes it reads per token (weights as stored plus its
    float16 KV cache at the middle step) and its own roofline on ``machine``; ``status`` hears
    which is being timed. ``{}`` when llama-cpp-python (the ``llamacpp`` extra) is missing."""
    try:
        optional.require("llama_cpp")
    except optional.MissingExtra:
        return {}
    P, N = len(prompt), new_tokens
    kv_per_position = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2  # K and V, float16
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        files = {"llama": source,
                 "llama_f32": llama_cpp.convert(source, pathlib.Path(scratch) / "f32.gguf", "f32")}
        for name, path in files.items():
            status(f"llama.cpp ({name})")
            timed = time_llama_cpp(path, prompt, N, repeats, extra_buffers)
            # Step i (0-based) reads the weights and the cache of P + i + 1 positions.
            roof = sum(max((timed["weight_bytes"] + kv_per_position * (P + i + 1))
                           / machine.bandwidth,
                           roofline.step_cost(cfg, 1, P + i + 1).flops / machine.flops_per_s)
                       for i in range(N - 1)) / (N - 1)
            out.update({f"{name}_{key}": value for key, value in timed.items()})
            out[f"{name}_bytes_per_token"] = timed["weight_bytes"] + kv_per_position * (P + N // 2)
            out[f"{name}_roofline_step_ms"] = 1e3 * roof
            out[f"{name}_roofline_ratio"] = (1e3 * roof / timed["step_ms"] if timed["step_ms"] > 0
                                            else None)
    return out
