"""Decode-speed benchmark: dl.generate against the roofline, the no-cache baseline and transformers.

    python -m experiments.bench_decode --config=configs/bench_decode.py --workdir=runs/bench_decode
    python -m experiments.bench_decode --config=configs/bench_decode.py:smollm2-135m \
        --workdir=runs/bench_decode
    python -m experiments.report --workdir=runs/bench_decode --out=results

One point = one preset and batch size: a model with random weights for a size preset (speed does
not depend on the weights) or the real weights of a pretrained preset (``smollm2-135m``, its GGUF
dequantized to float32), ``batch_size`` rows of ``prompt_len`` random token ids, greedy decoding
of exactly ``new_tokens`` tokens per row (no EOS) into a cache of ``max_len`` slots per row (0:
``prompt_len + new_tokens``). Every figure is the median of ``repeats`` timed runs after a warm-up
run; every call blocks until its results are on the host; the runs' seconds are kept
(``generate_reps_s``, ``prefill_reps_s``, ``hf_generate_reps_s``, ``llama[_f32]_*_reps_s``) and
the page's 95% intervals of the medians and of the ratios resample them (``decodelab.measure.stats``;
repetitions of two programs are resampled independently). What each number is:

- ``generate_s``: one ``dl.generate`` call (prefill, decode loop, results copied to NumPy);
  ``tokens_per_s = batch_size * new_tokens / generate_s``.
- ``prefill_ms``: the time to the first token, the same call with ``max_new_tokens=1`` and the
  same cache size: prefill, sampling the first token and the call's fixed costs.
  ``step_ms = (generate_s - prefill) / (new_tokens - 1)``: what each further token costs, i.e.
  the time per output token of each row once decoding runs (0 if noise makes it negative).
- ``compile_s``: the first ``generate`` call minus ``generate_s`` (both programs' compilation).
- ``roofline_step_ms``: ``decodelab.measure.roofline`` with this process's measured bandwidth and matmul
  rate, averaged over the loop's steps; ``roofline_ratio = roofline_step_ms / step_ms`` (1 = at the
  roofline).
- ``nocache_tokens_per_s``: greedy decoding that recomputes the whole sequence for every new token
  (one jitted forward pass over all ``t`` tokens, logits at the last position only, argmax). One
  step is timed at ``nocache.lengths`` sequence lengths from ``prompt_len`` to
  ``prompt_len + new_tokens - 1``; the ``new_tokens`` steps' total is the sum of the timed steps
  interpolated linearly between those lengths (running every step at every length would
  take longer than the rest of the benchmark). ``cache_speedup = tokens_per_s /
  nocache_tokens_per_s``.
- ``hf_tokens_per_s``: transformers ``LlamaForCausalLM.generate`` in PyTorch on the CPU with
  ``torch.set_num_threads`` set to the threads XLA uses: the same shapes (width, layers, heads, kv
  heads, head width, MLP width, vocabulary, tied embeddings, RoPE theta, norm epsilon), the same
  float32 weights (copied from the decodelab model), the same prompt ids, greedy,
  ``max_new_tokens = min_new_tokens = new_tokens``.
  ``speed_vs_hf = tokens_per_s / hf_tokens_per_s``. Without torch and transformers (the ``peer``
  extra) these are n/a.
- ``llama_*`` and ``llama_f32_*`` (a pretrained preset at batch 1, ``config.llama``): the same
  ``generate_s`` / ``tokens_per_s`` / ``prefill_ms`` / ``step_ms`` for llama.cpp
  (``llama-cpp-python``, the ``llamacpp`` extra) decoding the prompt's one row greedily with the
  same threads, from the GGUF file as stored (``llama``) and from llama.cpp's own float32
  conversion of it (``llama_f32``); ``*_weight_bytes`` the file's tensor bytes,
  ``*_bytes_per_token`` those plus its float16 KV cache at the middle step, ``*_roofline_ratio``
  its roofline step (its bytes over the measured bandwidth) over its step.
  ``speed_vs_llama[_f32] = tokens_per_s / llama[_f32]_tokens_per_s``; ``step_bytes`` is
  decodelab's own bytes per step (float32 weights and cache at the middle step). n/a without the
  extra.
- ``sampled_*``: the same figures for sampled decoding (``config.sampled``: temperature and top-p
  in every row); ``sampled_vs_greedy = sampled_step_ms / step_ms``.
- ``breakdown_<mode>_<level>_step_ms`` (``config.breakdown.enabled``; mode ``greedy`` or
  ``sampled``): ``step_ms`` with the ablations ``ABLATIONS`` applied cumulatively up to
  ``level``: ``full`` (none), ``no_attention`` (attention over the cache returns its queries:
  no cache read), ``no_model`` (the whole model call is a stand-in whose logits are a one-hot of
  the next token id, so sampling still sees data it cannot fold away), ``no_sampling`` (the
  sampling processors and the random draw are skipped: the token is the argmax). The differences
  are each part's cost per step: attention = full - no_attention, MLP and projections (embedding,
  norms, projections, MLP, output layer, cache write) = no_attention - no_model, sampling =
  no_model - no_sampling, loop bookkeeping (recording the token, finish checks, the loop) =
  no_sampling. Differences of medians can be slightly negative where a part costs ~0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from flax import nnx

from decodelab import experiment, optional, sampling
from decodelab import report as results
from decodelab.config import ModelConfig
from decodelab.decode.generation import generate
from decodelab.experiment import artefacts as pipeline
from decodelab.experiment import presets
from decodelab.measure import roofline, stats
from decodelab.model import Transformer, attention
from decodelab.sampling.params import SamplingParams
from experiments import llama_peer

_FLAGS = experiment.define_flags("configs/bench_decode.py")

# Tokens of the transformers warm-up call.
HF_WARMUP_TOKENS = 16

IMPLEMENTATIONS = {"tokens_per_s": "decodelab", "hf_tokens_per_s": "transformers",
                   "nocache_tokens_per_s": "no cache"}


def _timed(fn, *args) -> float:
    """Wall seconds of ``fn(*args)`` until its results are ready (``generate`` returns NumPy
    arrays, so it has waited for the device already)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


# --- decodelab ----------------------------------------------------------------------------------


def time_generate(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                  params: SamplingParams | None = None, max_len: int = 0) -> dict:
    """Compile, prefill, per-step and whole-call times of ``generate`` with ``params`` (default
    greedy) and ``max_len`` cache slots (0: prompt + new tokens); see the module docstring.
    ``prompts: [B, P]`` int32."""
    params = params or SamplingParams(temperature=0.0)
    B, P = prompts.shape
    rows = prompts.tolist()
    run = functools.partial(generate, model, rows, params, seed=0,
                            max_len=max_len or P + new_tokens)
    first = time.perf_counter()
    out = run(new_tokens)
    first = time.perf_counter() - first
    if out.lengths.tolist() != [new_tokens] * B or set(out.finish_reason) != {"length"}:
        raise RuntimeError(f"every row must generate {new_tokens} tokens, got lengths "
                           f"{out.lengths.tolist()} and finish reasons {out.finish_reason}")
    wholes = [_timed(run, new_tokens) for _ in range(repeats)]
    run(1)  # warm-up: compiles the prefill-only program
    prefills = [_timed(run, 1) for _ in range(repeats)]
    whole, prefill = statistics.median(wholes), statistics.median(prefills)
    return {"compile_s": max(first - whole, 0.0), "prefill_ms": 1e3 * prefill,
            "step_ms": 1e3 * max(whole - prefill, 0.0) / (new_tokens - 1), "generate_s": whole,
            "tokens_per_s": B * new_tokens / whole, "generate_reps_s": wholes,
            "prefill_reps_s": prefills}


# --- where a step's time goes -------------------------------------------------------------------


def _no_attention(q, *args, **kwargs):
    """Attention over the cache that reads nothing: the queries stand in for its output."""
    return q


def _no_model(self, tokens, *, cache=None, num_valid=None):
    """The model call without the model: logits one-hot at ``(token + 1) % V`` (they depend on the
    tokens, so XLA cannot fold the sampling that reads them), the cache only advanced."""
    logits = jax.nn.one_hot((tokens + 1) % self.config.vocab_size, self.config.vocab_size)
    if cache is None:
        return logits
    B, T = tokens.shape
    counts = jnp.full((B,), T, jnp.int32) if num_valid is None else jnp.asarray(num_valid)
    return logits, cache.advance(counts)


def _no_processors(logits, params, history):
    """No sampling processors: the logits are the scores (greedy) or log-probabilities."""
    return logits


def _draw_argmax(logprobs, params, keys, *, skip=None):
    """No random draw: the most probable token."""
    return sampling.argmax(logprobs)


# (level, what it removes, its patches: (module, attribute, stand-in)), applied cumulatively: the
# step time at a level has every patch of that level and the levels before it. The patched names
# are the ones the decode step calls at trace time.
ABLATIONS = (
    ("full", "nothing", ()),
    ("no_attention", "attention over the cache",
     ((attention, "blocked_attention", _no_attention),)),
    ("no_model", "the rest of the model (MLP, projections, norms, embeddings, cache write)",
     ((Transformer, "__call__", _no_model),)),
    ("no_sampling", "the sampling processors and the random draw",
     ((sampling, "greedy_scores", _no_processors), (sampling, "processed_logprobs",
                                                    _no_processors),
      (sampling, "draw", _draw_argmax))),
)
# Each part's cost: the step time of one level minus the next (the last level's is the loop).
PARTS = {"attention": ("full", "no_attention"), "mlp_projections": ("no_attention", "no_model"),
         "sampling": ("no_model", "no_sampling"), "loop": ("no_sampling", None)}


@contextlib.contextmanager
def ablated(level: str):
    """Apply the patches of ``ABLATIONS`` up to ``level``; compiled programs are dropped on entry
    and exit so that every traced step sees exactly these patches."""
    names = [name for name, _, _ in ABLATIONS]
    patches = [p for _, _, level_patches in ABLATIONS[: names.index(level) + 1]
               for p in level_patches]
    saved = []
    try:
        for owner, name, stand_in in patches:
            if not hasattr(owner, name):
                raise RuntimeError(f"ablation {level!r} patches {owner.__name__}.{name}, which no "
                                   f"longer exists; update bench_decode.ABLATIONS")
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, stand_in)
        jax.clear_caches()
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
        jax.clear_caches()


def time_breakdown(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                   params: SamplingParams, max_len: int, mode: str) -> dict:
    """``breakdown_<mode>_<level>_step_ms`` for every ablation level and
    ``breakdown_<mode>_<part>_ms`` for every part of ``PARTS`` (see the module docstring)."""
    steps = {}
    for level, _, _ in ABLATIONS:
        with ablated(level):
            steps[level] = time_generate(model, prompts, new_tokens, repeats, params,
                                         max_len)["step_ms"]
    out = {f"breakdown_{mode}_{level}_step_ms": ms for level, ms in steps.items()}
    for part, (level, without) in PARTS.items():
        out[f"breakdown_{mode}_{part}_ms"] = steps[level] - (steps[without] if without else 0.0)
    return out


# --- the no-cache baseline ----------------------------------------------------------------------


def last_logits(model: Transformer, tokens: jax.Array) -> jax.Array:
    """``model(tokens)[:, -1]`` (``[B, T] -> [B, V]``) without the logits of the other positions:
    what a decoder that recomputes the sequence for each new token needs."""
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))  # [B, T]
    x = model.positions.embed(model.embed(tokens), positions)  # [B, T, D]
    bias = model.positions.bias(positions, positions)  # [B, N, T, T] or None
    for layer, block in enumerate(model.blocks):
        x, _ = block(x, model.positions, positions, positions, bias, None, layer)
    x = model.final_norm(x[:, -1:])  # [B, 1, D]
    logits = model.embed.attend(x) if model.config.tie_embeddings else model.lm_head(x)
    return logits[:, 0].astype(jnp.float32)  # [B, V]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _recompute_step(weights, tokens, *, graphdef) -> jax.Array:
    """One no-cache greedy step: ``[B, T]`` tokens -> ``[B]`` next tokens."""
    return jnp.argmax(last_logits(nnx.merge(graphdef, weights), tokens), axis=-1)


def time_recompute(model: Transformer, prompts: np.ndarray, new_tokens: int, num_lengths: int,
                   repeats: int, seed: int) -> dict:
    """Seconds the no-cache baseline takes for ``new_tokens`` tokens: step ``i`` (0-based) runs
    the model over ``P + i`` tokens; steps are timed at ``num_lengths`` lengths and interpolated."""
    B, P = prompts.shape
    lengths = np.unique(np.linspace(P, P + new_tokens - 1, num_lengths).round().astype(int))
    rng = np.random.default_rng(seed)
    sequence = np.concatenate(  # [B, P + new_tokens - 1]: the prompt, then any ids
        [prompts, rng.integers(0, model.config.vocab_size, (B, new_tokens - 1), dtype=np.int32)],
        axis=1)
    graphdef, weights = nnx.split(model)
    seconds = []
    for T in lengths:
        tokens = jnp.asarray(sequence[:, :T])
        seconds.append(roofline.median_time(
            functools.partial(_recompute_step, graphdef=graphdef), weights, tokens,
            repeats=repeats))
    total = float(np.interp(np.arange(P, P + new_tokens), lengths, seconds).sum())
    return {"nocache_generate_s": total, "nocache_tokens_per_s": B * new_tokens / total,
            "nocache_lengths_timed": len(lengths)}


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


def time_hf_generate(model: Transformer, prompts: np.ndarray, new_tokens: int,
                     repeats: int) -> dict:
    """Median seconds of transformers' greedy ``generate`` with ``model``'s shapes and weights
    and the same prompt ids, after a short warm-up call (eager PyTorch compiles nothing; the
    warm-up only starts its thread pool and allocator); ``{}`` if torch or transformers is not
    installed."""
    try:
        torch = optional.require("torch")
        transformers = optional.require("transformers")
    except optional.MissingExtra:
        return {}
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(llama_peer.threads())
    cfg = model.config
    B, P = prompts.shape
    peer = transformers.LlamaForCausalLM(llama_config(cfg, P + new_tokens)).eval()
    if peer.num_parameters() != cfg.num_params():
        raise RuntimeError(f"the transformers model has {peer.num_parameters()} parameters, "
                           f"decodelab's {cfg.num_params()}: the shapes differ")
    weights = {k: torch.from_numpy(v.copy()) for k, v in llama_state_dict(model).items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if cfg.tie_embeddings else set()):
        raise RuntimeError(f"decodelab's weights do not fill the transformers model: missing "
                           f"{missing}, unexpected {unexpected}")
    input_ids = torch.as_tensor(prompts, dtype=torch.long)
    def run(n: int):
        return peer.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                              do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=n,
                              pad_token_id=0)

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
            "hf_version": f"transformers {transformers.__version__}, torch {torch.__version__}"}


# --- llama.cpp ----------------------------------------------------------------------------------


def time_llama_cpp(path: pathlib.Path, prompt: np.ndarray, new_tokens: int, repeats: int,
                   extra_buffers: bool = False) -> dict:
    """llama.cpp (through ``llama-cpp-python``) decoding one row greedily from the GGUF file at
    ``path`` with ``llama_peer.threads()`` threads: the median seconds of ``new_tokens`` tokens
    after ``prompt`` (``[P]`` ids; prefill included, as in ``generate_s``) and of the first token
    alone (its prefill), each after a warm-up call; EOS is ignored (the tokens are taken as they
    come). Every call starts from an empty KV cache. ``extra_buffers``: as ``llama_peer.load``."""
    llama_cpp = optional.require("llama_cpp")
    P = len(prompt)
    llm = llama_peer.load(path, n_ctx=P + new_tokens, n_batch=P, extra_buffers=extra_buffers)
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
            "weight_bytes": llama_peer.gguf_tensor_bytes(path), "version": llama_cpp.__version__}


def llama_cpp_peer(config, cfg: ModelConfig, prompts: np.ndarray, bandwidth: float,
                   flops_per_s: float, ctx) -> dict:
    """The llama.cpp rows of a pretrained preset at batch 1: its GGUF file as stored and
    llama.cpp's float32 conversion of it, each with the bytes it reads per token (weights as
    stored plus its float16 KV cache at the middle step) and its own roofline; ``{}`` when
    llama-cpp-python (the ``llamacpp`` extra) is not installed."""
    try:
        optional.require("llama_cpp")
    except optional.MissingExtra:
        return {}
    B, P = prompts.shape
    N = config.new_tokens
    source = presets.pretrained_path(config.model.pretrained)
    kv_per_position = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2  # K and V, float16
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        files = {"llama": source,
                 "llama_f32": llama_peer.float32_copy(source, pathlib.Path(scratch) / "f32.gguf")}
        for name, path in files.items():
            ctx.status(f"llama.cpp ({name})")
            timed = time_llama_cpp(path, prompts[0], N, config.llama.repeats,
                                   config.llama.extra_buffers)
            # Step i (0-based) reads the weights and the cache of P + i + 1 positions.
            roof = sum(max((timed["weight_bytes"] + kv_per_position * (P + i + 1)) / bandwidth,
                           roofline.step_cost(cfg, 1, P + i + 1).flops / flops_per_s)
                       for i in range(N - 1)) / (N - 1)
            out.update({f"{name}_{key}": value for key, value in timed.items()})
            out[f"{name}_bytes_per_token"] = timed["weight_bytes"] + kv_per_position * (P + N // 2)
            out[f"{name}_roofline_step_ms"] = 1e3 * roof
            out[f"{name}_roofline_ratio"] = (1e3 * roof / timed["step_ms"] if timed["step_ms"] > 0
                                            else None)
    return out


# --- one point ----------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def benchmark(config, ctx) -> dict:
    """One preset and batch size: every measurement of the module docstring."""
    B, P, N = config.batch_size, config.prompt_len, config.new_tokens
    for name, value, minimum in (("batch_size", B, 1), ("prompt_len", P, 1), ("new_tokens", N, 2),
                                 ("repeats", config.repeats, 1)):
        if value < minimum:
            raise ValueError(f"config.{name} must be >= {minimum}, got {value}")
    load = os.getloadavg()[0]
    if presets.is_pretrained(config.model):
        model, _ = pipeline.pretrained_model(config.model)
        cfg = model.config
    else:
        cfg = presets.build_model_config(config.model, config.vocab_size)
        model = Transformer(cfg, rngs=nnx.Rngs(config.seed))
    rng = np.random.default_rng(config.seed)
    prompts = rng.integers(0, cfg.vocab_size, (B, P), dtype=np.int32)  # [B, P]

    ctx.status("roofline probes")
    bandwidth = roofline.measure_bandwidth(config.roofline.bandwidth_mib << 20,
                                           config.roofline.repeats)
    flops_per_s = roofline.measure_matmul_flops(config.roofline.matmul_n, config.roofline.repeats)
    roof_step = roofline.decode_seconds(cfg, B, P, N - 1, bandwidth, flops_per_s) / (N - 1)
    middle = roofline.step_cost(cfg, B, P + N // 2)

    S = config.max_len or P + N
    sampled_params = SamplingParams(temperature=config.sampled.temperature,
                                    top_p=config.sampled.top_p)
    ctx.status("decodelab")
    ours = time_generate(model, prompts, N, config.repeats, max_len=S)
    sampled = {}
    if config.sampled.enabled:
        ctx.status("decodelab, sampled")
        timed = time_generate(model, prompts, N, config.repeats, sampled_params, S)
        sampled = {f"sampled_{k}": v for k, v in timed.items()}
        sampled["sampled_vs_greedy"] = _ratio(timed["step_ms"], ours["step_ms"] or None)
    breakdown = {}
    if config.breakdown.enabled:
        modes = {"greedy": SamplingParams(temperature=0.0)}
        if config.sampled.enabled:
            modes["sampled"] = sampled_params
        for mode, params in modes.items():
            ctx.status(f"breakdown, {mode}")
            breakdown.update(time_breakdown(model, prompts, N, config.breakdown.repeats, params,
                                            S, mode))
    nocache = {"nocache_generate_s": None, "nocache_tokens_per_s": None,
               "nocache_lengths_timed": 0}
    if config.nocache.enabled:
        ctx.status("no cache")
        nocache = time_recompute(model, prompts, N, config.nocache.lengths,
                                 config.nocache.repeats, config.seed)
    hf = {}
    if config.peer.enabled:
        ctx.status("transformers")
        hf = time_hf_generate(model, prompts, N, config.peer.repeats)
    hf_tokens_per_s = hf.get("hf_tokens_per_s")
    run_llama = config.llama.enabled and presets.is_pretrained(config.model) and B == 1
    llama = llama_cpp_peer(config, cfg, prompts, bandwidth, flops_per_s, ctx) if run_llama else {}
    return {
        "preset": config.preset, "study": config.study, "batch_size": B, "max_len": S,
        "params": cfg.num_params(), "threads": llama_peer.threads(),
        "vocab_size": cfg.vocab_size, "weights": "pretrained" if presets.is_pretrained(
            config.model) else "random",
        "load_avg_1min": load,
        "bandwidth_gb_s": bandwidth / 1e9, "matmul_gflop_s": flops_per_s / 1e9,
        **ours,
        "roofline_step_ms": 1e3 * roof_step, "roofline_tokens_per_s": B / roof_step,
        "roofline_bound": ("memory" if middle.bytes / bandwidth >= middle.flops / flops_per_s
                           else "compute"),
        "roofline_ratio": roof_step * 1e3 / ours["step_ms"] if ours["step_ms"] > 0 else None,
        **sampled,
        **breakdown,
        **nocache,
        "cache_speedup": _ratio(ours["tokens_per_s"], nocache["nocache_tokens_per_s"]),
        "hf_generate_s": hf.get("hf_generate_s"), "hf_tokens_per_s": hf_tokens_per_s,
        "hf_generate_reps_s": hf.get("hf_generate_reps_s"),
        "hf_step_ms": None if not hf else 1e3 * hf["hf_generate_s"] / N,
        "speed_vs_hf": _ratio(ours["tokens_per_s"], hf_tokens_per_s),
        "hf_version": hf.get("hf_version", "not run" if not config.peer.enabled
                             else "not installed (pip install -e .[peer])"),
        "step_bytes": middle.bytes,
        **llama,
        "speed_vs_llama": _ratio(ours["tokens_per_s"], llama.get("llama_tokens_per_s")),
        "speed_vs_llama_f32": _ratio(ours["tokens_per_s"], llama.get("llama_f32_tokens_per_s")),
        "llama_version": llama.get("llama_version", "not installed (pip install -e .[llamacpp])"
                                   if run_llama else "not run"),
    }


# --- the page -----------------------------------------------------------------------------------

NO_REPS = "the row keeps fewer than 2 repetitions' seconds"


def _reps(m: dict, key: str) -> np.ndarray | None:
    """A row's per-repetition seconds under ``key``; None with fewer than 2 (no interval)."""
    values = m.get(key)
    return np.asarray(values, np.float64) if values and len(values) >= 2 else None


def _scaled(interval: stats.Interval | None, factor: float) -> stats.Interval | None:
    if interval is None:
        return None
    return dataclasses.replace(interval, value=interval.value * factor,
                               low=interval.low * factor, high=interval.high * factor)


def _tokens_per_s(m: dict, reps_key: str, tokens: int) -> stats.Interval | None:
    """``tokens`` over the median of the repetitions, with its interval."""
    reps = _reps(m, reps_key)
    if reps is None:
        return None
    return stats.bootstrap(lambda seconds: tokens / stats.median(seconds), reps)


def _speed_ratio(m: dict, peer_reps_key: str, tokens_ratio: float) -> stats.Interval | None:
    """decodelab's tokens/s over a peer's: ``tokens_ratio`` x the peer's median seconds over
    decodelab's, the two programs' repetitions resampled independently."""
    ours, peer = _reps(m, "generate_reps_s"), _reps(m, peer_reps_key)
    if ours is None or peer is None:
        return None
    return _scaled(stats.bootstrap_ratio(stats.median, peer, ours), tokens_ratio)


def _roofline_interval(m: dict) -> stats.Interval | None:
    """roofline step / measured step, the step being (median whole call - median prefill) /
    (new tokens - 1); None where the step's interval reaches 0 (the ratio is unbounded)."""
    whole, prefill = _reps(m, "generate_reps_s"), _reps(m, "prefill_reps_s")
    if whole is None or prefill is None:
        return None
    step = stats.bootstrap_difference(stats.median, whole, prefill, paired=False)
    if step.low <= 0:
        return None
    scale = m["roofline_step_ms"] * (m["new_tokens"] - 1) / 1e3
    return stats.Interval(scale / step.value, scale / step.high, scale / step.low, step.units)


def _with_intervals(m: dict) -> dict:
    """The row's metrics with tokens/s, the peer ratios and the roofline ratio as Intervals where
    its repetitions allow."""
    B, N = m["batch_size"], m["new_tokens"]
    found = {"tokens_per_s": _tokens_per_s(m, "generate_reps_s", B * N),
             "hf_tokens_per_s": _tokens_per_s(m, "hf_generate_reps_s", B * N),
             "speed_vs_hf": _speed_ratio(m, "hf_generate_reps_s", 1.0),
             "speed_vs_llama": _speed_ratio(m, "llama_generate_reps_s", B),
             "speed_vs_llama_f32": _speed_ratio(m, "llama_f32_generate_reps_s", B),
             "roofline_ratio": _roofline_interval(m)}
    return {**m, **{key: value for key, value in found.items() if value is not None}}


def _point(value) -> float | None:
    return value.value if isinstance(value, stats.Interval) else value


def _min_median_max(m: dict, key: str) -> str | None:
    reps = m.get(key)
    if not reps:
        return None
    return f"{min(reps):.3g} / {statistics.median(reps):.3g} / {max(reps):.3g}"


def _metric_rows(rows, study: str = "speed") -> list[dict]:
    """The metrics of ``study``'s rows (rows written before studies existed are "speed") plus
    their prompt and output lengths, presets small to large."""
    order = {name: i for i, name in enumerate(("tiny", "small", "medium"))}
    metrics = [{**r["metrics"], "prompt_len": r["config"]["prompt_len"],
                "new_tokens": r["config"]["new_tokens"]}
               for r in rows if r["config"].get("study", "speed") == study]
    return sorted(metrics, key=lambda m: (order.get(m["preset"], len(order)), m["preset"],
                                          m["batch_size"], m.get("max_len") or 0))


def _speed_table(metrics: list[dict]) -> results.Table:
    columns = ["preset", "params (M)", "batch", "decodelab tok/s", "transformers tok/s",
               "no-cache tok/s", "roofline tok/s", "decodelab / roofline",
               "decodelab / transformers",
               "cache speed-up", "sampled tok/s"]
    body = [[m["preset"], m["params"] / 1e6, m["batch_size"], m["tokens_per_s"],
             m["hf_tokens_per_s"], m["nocache_tokens_per_s"], m["roofline_tokens_per_s"],
             m["roofline_ratio"], m["speed_vs_hf"], m["cache_speedup"],
             m.get("sampled_tokens_per_s")] for m in metrics]
    return results.Table(columns, body)


def _latency_table(metrics: list[dict]) -> results.Table:
    columns = ["preset", "batch", "compile s", "generate s (min / median / max)", "prefill ms",
               "decodelab step ms", "roofline step ms", "bound by", "transformers ms/token",
               "no-cache ms/token", "sampled step ms", "sampled / greedy step"]
    body = [[m["preset"], m["batch_size"], m["compile_s"],
             _min_median_max(m, "generate_reps_s"), m["prefill_ms"], m["step_ms"],
             m["roofline_step_ms"], m["roofline_bound"], m["hf_step_ms"],
             None if m["nocache_generate_s"] is None
             else 1e3 * m["nocache_generate_s"] / m["new_tokens"],
             m.get("sampled_step_ms"), m.get("sampled_vs_greedy")] for m in metrics]
    return results.Table(columns, body)


def _max_len_table(metrics: list[dict]) -> results.Table:
    """Step time against cache slots at the same live tokens, relative to the smallest cache."""
    columns = ["preset", "batch", "max_len", "live tokens at the end", "decodelab step ms",
               "step / step at the smallest max_len", "sampled step ms"]
    body = []
    for m in metrics:
        base = min((o for o in metrics if (o["preset"], o["batch_size"]) ==
                    (m["preset"], m["batch_size"])), key=lambda o: o["max_len"])
        body.append([m["preset"], m["batch_size"], m["max_len"], m["prompt_len"] + m["new_tokens"],
                     m["step_ms"], _ratio(m["step_ms"], base["step_ms"] or None),
                     m.get("sampled_step_ms")])
    return results.Table(columns, body)


def _breakdown_table(metrics: list[dict]) -> results.Table:
    """Per row and mode, each part's ms per step and its share of the whole step."""
    columns = ["preset", "batch", "decoding", "step ms", *[
        f"{label} ms (share)" for label in PART_LABELS.values()]]
    body = []
    for m in metrics:
        for mode in ("greedy", "sampled"):
            full = m.get(f"breakdown_{mode}_full_step_ms")
            if full is None:
                continue
            cells = []
            for part in PART_LABELS:
                ms = m[f"breakdown_{mode}_{part}_ms"]
                cells.append(f"{ms:.3g} ({_percent(ms / full if full > 0 else None)})")
            body.append([m["preset"], m["batch_size"], mode, full, *cells])
    return results.Table(columns, body)


def _llama_table(metrics: list[dict]) -> results.Table | None:
    """decodelab beside llama.cpp on the same GGUF file (batch 1 rows that ran the peer): bytes
    each reads per token, speed, and the fraction of each side's own roofline."""
    rows = [m for m in metrics if m.get("llama_tokens_per_s") is not None]
    if not rows:
        return None
    columns = ["preset", "implementation", "weights", "MB read per token", "tok/s", "step ms",
               "roofline step ms", "step / own roofline", "decodelab tok/s / this"]
    body = []
    for m in rows:
        body.append([m["preset"], "decodelab", "float32 (dequantized by decodelab)",
                     m["step_bytes"] / 1e6, m["tokens_per_s"], m["step_ms"],
                     m["roofline_step_ms"], m["roofline_ratio"], 1.0])
        for key, label in (("llama_f32", "float32 (converted by llama.cpp)"),
                           ("llama", "as stored in the file")):
            body.append([m["preset"], f"llama.cpp {m['llama_version']}", label,
                         m[f"{key}_bytes_per_token"] / 1e6, m[f"{key}_tokens_per_s"],
                         m[f"{key}_step_ms"], m[f"{key}_roofline_step_ms"],
                         m[f"{key}_roofline_ratio"], m["speed_vs_" + key]])
    return results.Table(columns, body)


def _llama_target(metrics: list[dict]) -> str:
    rows = [m for m in metrics if m.get("speed_vs_llama_f32") is not None]
    if not rows:
        return ("- **Pretrained batch 1 at >= 0.9x llama.cpp on the same float32 weights: not "
                "measured** (llama-cpp-python is not installed: `pip install -e .[llamacpp]`).")
    judged = [(m, _target(m["speed_vs_llama_f32"], 0.9)) for m in rows]
    return (f"- **Pretrained batch 1 at >= 0.9x llama.cpp on the same float32 weights: "
            f"{_overall(judged)}** ("
            + ", ".join(f"{m['preset']} {m['speed_vs_llama_f32']:.2f}x; against llama.cpp on "
                        f"the file's own weights {m['speed_vs_llama']:.2f}x" for m in rows)
            + ").")


PART_LABELS = {"attention": "attention", "mlp_projections": "MLP and projections",
               "sampling": "sampling", "loop": "loop bookkeeping"}


def _plot_rows(metrics: list[dict]) -> list[dict]:
    """One row per (preset, batch, implementation), the shape ``results.line_plot`` reads."""
    return [{"metrics": {"batch_size": m["batch_size"], "tokens_per_s": m[key],
                         "line": f"{m['preset']}, {label}"}}
            for key, label in IMPLEMENTATIONS.items() for m in metrics]


def _fmt_range(values: list[float], unit: str, digits: int = 1) -> str:
    lo, hi = min(values), max(values)
    return (f"{lo:.{digits}f} {unit}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
            else f"{lo:.{digits}f}-{hi:.{digits}f} {unit}")


def _percent(ratio: float | stats.Interval | None) -> str:
    if isinstance(ratio, stats.Interval):
        return f"{100 * ratio.value:.0f}% [{100 * ratio.low:.0f}%, {100 * ratio.high:.0f}%]"
    return "n/a" if ratio is None else f"{100 * ratio:.0f}%"


def _target(value: stats.Interval | float | None, threshold: float, *,
            at_most: bool = False) -> results.Verdict:
    """A row against a target: ``results.verdict`` on the value's interval (above the threshold:
    met; with ``at_most``, below it: met); side +1 is met. A row without repetitions to resample
    is not judged."""
    interval = value if isinstance(value, stats.Interval) else None
    judged = results.verdict(interval, threshold=threshold, above="not met" if at_most else "met",
                             below="met" if at_most else "not met", units="repetitions",
                             missing=NO_REPS)
    return dataclasses.replace(judged, side=-judged.side) if at_most else judged


def _step(whole: np.ndarray, prefill: np.ndarray) -> np.ndarray:
    """A decode step's time up to the constant 1 / (new tokens - 1): median whole call - median
    prefill (statistic over repetitions, ``[..., n]`` each)."""
    return stats.median(whole) - stats.median(prefill)


def _step_ratio(a: dict, b: dict, a_prefix: str = "", b_prefix: str = "") -> stats.Interval | None:
    """Step time of row ``a`` over that of row ``b`` (the same new tokens), each program's
    repetitions resampled on their own (a program's whole-call and prefill runs together, by
    repetition index); None without 2 or more repetitions of each, or unequal counts."""
    columns = []
    for m, prefix in ((a, a_prefix), (b, b_prefix)):
        whole, prefill = _reps(m, f"{prefix}generate_reps_s"), _reps(m, f"{prefix}prefill_reps_s")
        if whole is None or prefill is None or len(whole) != len(prefill):
            return None
        columns.append((whole, prefill))
    try:
        return stats.bootstrap_ratio(_step, *columns)
    except ValueError:  # a step of 0 or less: the ratio is undefined
        return None


def _overall(judged: list[tuple[dict, results.Verdict]]) -> str:
    """``met`` if every row's interval lies above its target, ``not met`` if one lies below,
    otherwise which rows the intervals leave undecided."""
    if any(v.side < 0 for _, v in judged):
        return "not met"
    if all(v.side > 0 for _, v in judged):
        return "met"
    return "undecided: " + "; ".join(f"{m['preset']} batch {m['batch_size']} {v.text}"
                                     for m, v in judged if v.side == 0)


def _roofline_target(metrics: list[dict]) -> str | None:
    """Every small, medium and pretrained row at >= 50% of its roofline (medium and pretrained
    batch 1: >= 75%), each judged by its interval."""
    checked = [m for m in metrics if m["preset"] != "tiny"]
    if not checked:
        return None
    judged = [(m, _target(m["roofline_ratio"],
                          0.75 if m["preset"] != "small" and m["batch_size"] == 1 else 0.5))
              for m in checked]
    return (f"- **Every small, medium and pretrained row at >= 50% of the roofline (medium and "
            f"pretrained batch 1 at >= 75%): {_overall(judged)}** ("
            + ", ".join(f"{m['preset']} batch {m['batch_size']} {_percent(m['roofline_ratio'])}"
                        for m in checked) + ").")


def _peer_targets(metrics: list[dict]) -> list[str]:
    with_hf = [m for m in metrics if m["speed_vs_hf"] is not None]
    if not with_hf:
        return ["- **Faster than transformers: not measured** (torch and transformers are "
                "not installed: `pip install -e .[peer]`)."]
    judged = [(m, _target(m["speed_vs_hf"], 1.0)) for m in with_hf]
    ratios = [_point(m["speed_vs_hf"]) for m in with_hf]
    lines = [
        f"- **Faster than transformers on every row: {_overall(judged)}** (decodelab / "
        f"transformers {min(ratios):.2f}x to {max(ratios):.2f}x"
        + "".join(f"; {m['preset']} batch {m['batch_size']} {m['speed_vs_hf']:.2f}x"
                  for m, v in judged if v.side < 0) + ")."]
    small = [m for m in with_hf if m["preset"] in ("tiny", "small")]
    if small:
        need = lambda m: 1.5 if m["batch_size"] >= 32 else 2.0  # noqa: E731
        lines.append(
            f"- **tiny and small at >= 2x transformers at batch 1 and 8, >= 1.5x at batch 32: "
            f"{_overall([(m, _target(m['speed_vs_hf'], need(m))) for m in small])}** ("
            + ", ".join(f"{m['preset']} batch {m['batch_size']} {m['speed_vs_hf']:.2f}x"
                        for m in small) + ").")
    return lines


def _max_len_target(max_len_rows: list[dict]) -> str:
    if len({m["max_len"] for m in max_len_rows}) < 2:
        return ("- **Step time at max_len 4096 within 15% of max_len 288: not measured** (run "
                "`--config=configs/bench_decode.py:max_len`).")
    lo = min(max_len_rows, key=lambda m: m["max_len"])
    hi = max(max_len_rows, key=lambda m: m["max_len"])
    ratio = _step_ratio(hi, lo) or _ratio(hi["step_ms"], lo["step_ms"] or None)
    verdict = "not measured" if ratio is None else _overall([(hi, _target(ratio, 1.15,
                                                                          at_most=True))])
    return (f"- **Step time at max_len {hi['max_len']} within 15% of max_len {lo['max_len']} "
            f"({lo['preset']}, batch {lo['batch_size']}, the same live tokens): {verdict}** "
            f"({hi['step_ms']:.3g} ms against {lo['step_ms']:.3g} ms, "
            f"{'n/a' if ratio is None else f'{ratio:.2f}x'}).")


def _sampled_target(metrics: list[dict]) -> str:
    at_8 = [m for m in metrics if m["batch_size"] == 8 and m.get("sampled_vs_greedy") is not None]
    if not at_8:
        return "- **Sampled decoding within 25% of greedy at batch 8: not measured.**"
    ratios = {id(m): _step_ratio(m, m, "sampled_") or m["sampled_vs_greedy"] for m in at_8}
    judged = [(m, _target(ratios[id(m)], 1.25, at_most=True)) for m in at_8]
    return (f"- **Sampled decoding (temperature + top-p) within 25% of greedy step time at batch "
            f"8: {_overall(judged)}** (sampled / greedy step: "
            + ", ".join(f"{m['preset']} {ratios[id(m)]:.2f}x" for m in at_8) + ").")


def _findings(metrics: list[dict], new_tokens: int, max_len_rows: list[dict],
              breakdown_rows: list[dict]) -> str:
    """The issue's targets, each met or not, read from the rows, and where the time goes."""
    lines = [line for line in [_roofline_target(metrics)] if line]
    lines += _peer_targets(metrics)
    lines.append(_llama_target(metrics))
    lines.append(_max_len_target(max_len_rows))
    lines.append(_sampled_target(metrics))
    with_nocache = [m for m in metrics if m["cache_speedup"] is not None]
    if with_nocache:
        low = min(with_nocache, key=lambda m: m["cache_speedup"])
        lines.append(
            f"- **KV cache >= 10x faster than recompute at {new_tokens} new tokens: "
            f"{'met' if low['cache_speedup'] >= 10 else 'not met'} on the point estimates** "
            "(the no-cache timing keeps no repetitions, so no interval; lowest "
            f"{low['cache_speedup']:.1f}x at {low['preset']} batch {low['batch_size']}, highest "
            f"{max(m['cache_speedup'] for m in with_nocache):.0f}x).")
    lines.append("- A 20-point sampling sweep compiling the decode loop once is a test, not a "
                 "benchmark row: `tests/test_decode.py` counts the compiles.")
    if breakdown_rows:
        parts = []
        for m in breakdown_rows:
            full = m.get("breakdown_greedy_full_step_ms")
            if not full:
                continue
            largest = max(PART_LABELS, key=lambda part: m[f"breakdown_greedy_{part}_ms"])
            parts.append(f"{m['preset']} batch {m['batch_size']}: {PART_LABELS[largest]} "
                         f"({_percent(m[f'breakdown_greedy_{largest}_ms'] / full)} of "
                         f"{full:.3g} ms)")
        if parts:
            lines += ["", "Where a greedy step's time goes (the breakdown table), the largest "
                          "part per row: " + "; ".join(parts) + "."]
        sampling_cost = []
        for m in breakdown_rows:
            greedy, sampled = (m.get(f"breakdown_{mode}_full_step_ms")
                               for mode in ("greedy", "sampled"))
            if greedy and sampled:
                sampling_cost.append(f"{m['preset']} batch {m['batch_size']} "
                                     f"{sampled - greedy:.3g} ms ({_percent(1 - greedy / sampled)} "
                                     "of the sampled step)")
        if sampling_cost:
            lines += ["", "What sampling costs, the sampled step minus the greedy step: "
                      + "; ".join(sampling_cost) + ". The ablation splits it less well than the "
                      "greedy step: the `no_model` stand-in's one-hot logits leave top-p a "
                      "one-token nucleus, so the cost of the processors on the model's real "
                      "logits shows in the sampled rows' 'MLP and projections' difference. On "
                      "random weights the next-token distribution is nearly flat: top-p 0.95 "
                      "keeps most of the vocabulary, more than the candidate cap "
                      "(`processor_inputs.CANDIDATES`, 256), so every sampled step of those "
                      "rows takes top-p's full-sort fallback; the pretrained rows sample from "
                      "real distributions."]
    return "\n".join(lines)


def _models(metrics: list[dict], vocab_size: int) -> str:
    """What the rows ran: size presets with random weights, pretrained ones with their own."""
    presets_with = lambda kind: list(dict.fromkeys(  # noqa: E731
        m["preset"] for m in metrics if m.get("weights", "random") == kind))
    names = lambda presets: ", ".join(f"`{p}`" for p in presets)  # noqa: E731
    parts = []
    if presets_with("random"):
        parts.append(f"the {names(presets_with('random'))} presets with random weights at "
                     f"vocabulary {vocab_size} (speed does not depend on what the weights are)")
    for preset in presets_with("pretrained"):
        row = next(m for m in metrics if m["preset"] == preset)
        parts.append(f"the pretrained `{preset}` ({row['params'] / 1e6:.0f}M parameters, "
                     f"vocabulary {row['vocab_size']}) with its real weights, dequantized from "
                     "its GGUF file to float32")
    return "; and ".join(parts)


# The cores other processes kept busy on average during a point from which the page calls the
# machine shared (an idle machine's background stays well under a tenth of a core).
SHARED_CORES = 0.25


def load_reading(metrics, other_cores=()) -> str:
    """Whether other processes shared the machine. Where the rows record it, judged by the cores
    other processes kept busy during each point (``results.other_cores``: the machine's CPU time
    less the benchmark's own); otherwise by the 1-minute load averages at the points' starts:
    points run back to back, so a load up to the benchmark's own thread count is what its previous
    point leaves behind, and only a load well above it (half a core more) says that others ran."""
    busy, threads = max(m["load_avg_1min"] for m in metrics), metrics[0]["threads"]
    shared = ("other processes took CPU time from the measurements, so speeds are lower and "
              "noisier than on an idle machine, and PyTorch's OpenMP threads, which wait for each "
              "other at every operation, lose the most. Compare rows measured at similar load.")
    if other_cores:
        worst = max(other_cores)
        measured = (f"other processes kept up to {worst:.2f} of the {threads} cores busy during a "
                    "point (the machine's CPU time in /proc/stat less the benchmark's own)")
        if worst >= SHARED_CORES:
            return f"**The machine was shared during this run**: {measured}; {shared}"
        return (f"The machine was not shared: {measured}, under the {SHARED_CORES} that counts as "
                f"sharing (1-minute load average up to {busy:.1f}, the benchmark's own "
                f"{threads} threads included).")
    if busy >= threads + 0.5:
        return (f"**The machine was shared during this run** (1-minute load average up to "
                f"{busy:.1f} on {threads} cores, more than the benchmark's own {threads} threads "
                f"leave): {shared}")
    return (f"1-minute load average up to {busy:.1f} on {threads} cores: no more than the "
            f"benchmark's own {threads} threads leave behind from the point before (points run "
            "back to back), so no other process is seen sharing the machine.")


def report(rows, out_dir) -> list[pathlib.Path]:
    out_dir = pathlib.Path(out_dir)
    metrics = [_with_intervals(m) for m in _metric_rows(rows)]
    max_len_rows, breakdown_rows = _metric_rows(rows, "max_len"), _metric_rows(rows, "breakdown")
    if not metrics:
        raise ValueError("the page needs rows of the main sweep (study 'speed'); run "
                         "`--config=configs/bench_decode.py` into the same workdir")
    config = next(r["config"] for r in rows if r["config"].get("study", "speed") == "speed")
    N, P = config["new_tokens"], config["prompt_len"]
    page = results.Page("Decode speed", rows)
    hf_versions = sorted({m["hf_version"] for m in metrics})
    sampled = config.get("sampled", {})
    page.text(
        f"Greedy decoding of exactly {N} new tokens per row after a {P}-token prompt (random ids; "
        f"EOS ignored) with {_models(metrics, config['vocab_size'])}"
        + (f"; sampled decoding (temperature {sampled['temperature']}, top-p "
           f"{sampled['top_p']} in every row) of the same rows beside it" if sampled.get("enabled")
           else "") + ". Medians of "
        f"{config['repeats']} timed runs after a warm-up run (no cache: "
        f"{config['nocache']['repeats']} at each length; transformers: "
        f"{config['peer']['repeats']}). Measured in the same run on this "
        "machine: memory read bandwidth "
        f"{_fmt_range([m['bandwidth_gb_s'] for m in metrics], 'GB/s')} "
        f"(a jitted sum over {config['roofline']['bandwidth_mib']} MiB of float32), float32 matmul "
        f"{_fmt_range([m['matmul_gflop_s'] for m in metrics], 'GFLOP/s', 0)} "
        f"({config['roofline']['matmul_n']}^2 matmul); {metrics[0]['threads']} threads for both "
        f"XLA and PyTorch; 1-minute load average at the start of each point "
        f"{_fmt_range([m['load_avg_1min'] for m in metrics], '', 2).strip()}. Peer: "
        f"{'; '.join(hf_versions)}.")
    page.text(load_reading(metrics + max_len_rows + breakdown_rows,
                           results.other_cores(rows)))
    page.text(
        "How each number is made (details in `experiments/bench_decode.py`): tokens/s = batch x "
        f"{N} / the wall time of one whole `generate` call; decodelab step ms = (that time - the "
        "prefill call's) / "
        f"{N - 1}, the time per output token of each row; roofline = the larger of (parameter "
        "bytes + KV-cache bytes of the valid positions) / bandwidth and FLOPs / matmul rate, "
        "averaged over the steps (`decodelab/roofline.py`); decodelab / roofline = roofline step "
        "time / measured step time. No cache: a jitted forward pass over the whole sequence for "
        f"each new token, timed at {metrics[0]['nocache_lengths_timed']} sequence lengths from "
        f"{P} to {P + N - 1} and interpolated linearly over the {N} steps (running all of them "
        "at medium batch 32 would take longer than the rest of the benchmark). transformers: "
        "`LlamaForCausalLM.generate` with the same shapes and "
        + ("weights" if all("weights" in m for m in metrics) else
           "weights (rows measured before the benchmark recorded `weights`: transformers' own "
           "random weights)")
        + ", greedy, `max_new_tokens = "
        f"min_new_tokens = {N}`, after a {HF_WARMUP_TOKENS}-token warm-up call; its ms/token is "
        f"its whole call / {N}.")
    page.table(_speed_table(metrics), out_dir / "decode_speed.csv", number_format="{:.3g}",
               caption="**Output tokens per second** (all rows together) and the ratios.")
    page.table(_latency_table(metrics), out_dir / "decode_speed_latency.csv",
               number_format="{:.3g}",
               caption="**Latency**: compile time of decodelab's two programs, prefill (one "
                       "`generate` call with one new token), one decode step against its roofline.")
    plot = results.line_plot(_plot_rows(metrics), out_dir / "decode_speed.png",
                             x="metrics.batch_size", y="metrics.tokens_per_s", group="metrics.line",
                             logx=True, logy=True, title="output tokens/s vs batch size")
    page.image(plot, "output tokens/s against batch size, one line per preset and implementation")
    written = [out_dir / "decode_speed.csv", out_dir / "decode_speed_latency.csv", plot]
    llama = _llama_table(metrics)
    if llama is not None:
        page.table(llama, out_dir / "decode_speed_llama_cpp.csv", number_format="{:.3g}",
                   caption="**llama.cpp on the same GGUF file** (batch 1, the same prompt ids, "
                           "greedy, the same threads; `llama-cpp-python`, the `llamacpp` extra; "
                           "llama.cpp's extra weight buffers (repacked and AMX kernels) "
                           + ("on" if config.get("llama", {}).get("extra_buffers") else "off: "
                              "its plain AVX2 / AVX-512 kernels") + "). "
                           "MB read per token: the weights as each side stores them plus its KV "
                           "cache at the middle step (decodelab float32, llama.cpp float16); "
                           "roofline step: those bytes over the measured bandwidth (or the "
                           "FLOPs over the matmul rate, if larger).")
        written.append(out_dir / "decode_speed_llama_cpp.csv")
    if max_len_rows:
        page.table(_max_len_table(max_len_rows), out_dir / "decode_speed_max_len.csv",
                   number_format="{:.3g}",
                   caption="**Cache size**: the same rows and live tokens in caches of more "
                           "slots; attention reads only the blocks that hold live tokens, so "
                           "the step should not grow with `max_len`.")
        written.append(out_dir / "decode_speed_max_len.csv")
    if breakdown_rows:
        page.table(_breakdown_table(breakdown_rows), out_dir / "decode_speed_breakdown.csv",
                   number_format="{:.3g}",
                   caption="**Where a step's time goes**, by ablation: the step time with one "
                           "more part removed each time (attention over the cache; the rest of "
                           "the model; the sampling processors and the draw), each part the "
                           "difference, the loop's bookkeeping what is left "
                           "(`experiments/bench_decode.py`, `ABLATIONS`). Differences of "
                           "medians: a part that costs ~0 can come out slightly negative.")
        written.append(out_dir / "decode_speed_breakdown.csv")
    page.text("**Targets of the issue** (from the rows above):\n\n"
              + _findings(metrics, N, max_len_rows, breakdown_rows))
    return [page.write(out_dir / "decode_speed.md"), *written]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, benchmark, argv)


if __name__ == "__main__":
    app.run(main)
