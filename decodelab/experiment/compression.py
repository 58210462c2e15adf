"""The compression studies' candidates (quantization, pruning): the float32 reference of a point,
kept across the points of one process; the candidate a point builds from it (quantized, pruned,
recovered), one at a time; the label a row gives it; and the checks of a point's config, made
before any model is.

A pruned candidate's extra row fields (``pruned``): ``sparsity`` (the mean fraction of zero
weights over the attention and MLP projections, measured before any quantization), ``params``
(parameters, zeros included: a zeroed weight is still stored and read), ``recovery_loss`` (the
recovery run's training loss at each step) and, for heads removed, ``heads_kept`` (1 per query
head kept, 0 per head removed) and ``head_importance`` (per key/value head group), each one list
per layer (``measure.compression.by_layer``).
"""

from __future__ import annotations


import numpy as np

from decodelab.compress.pruning import (head_importance, heads_to_keep, prune, prune_heads,
                                        prune_neurons, sparsity_of, update_mask)
from decodelab.compress.quantization import quantize
from decodelab.experiment import artefacts, presets
from decodelab.experiment.process_cache import cached, reference_key, swap_candidate
from decodelab.measure.compression import by_layer
from decodelab.text.data import token_windows
from decodelab.model import param_count
from decodelab.text import data
from decodelab.train.options import RunOptions
from decodelab.train.trainer import TrainConfig, train

PRUNING_KINDS = ("dense", "unstructured", "2:4", "4:8", "heads", "neurons")
# config.weights of a pruning point -> what the row's label says of it.
PRUNED_WEIGHTS = {"": "", "int8-w8a8": "int8 W8A8", "int4-g32": "int4 g32"}
# config.peer of a quantization point -> the row's label; the peer's llama.cpp conversion of the
# file (None: the file as stored) is its name after "llama.cpp-".
PEERS = {"llama.cpp": "llama.cpp (GGUF as stored)", "llama.cpp-f32": "llama.cpp (its float32 copy)",
         "llama.cpp-q8_0": "llama.cpp Q8_0", "llama.cpp-q4_0": "llama.cpp Q4_0",
         "llama.cpp-q4_k_m": "llama.cpp Q4_K_M"}


def peer_ftype(peer: str) -> str | None:
    """The llama.cpp conversion a peer point scores (``measure.llama_cpp.FTYPES``), None for the
    file as stored."""
    return peer.partition("-")[2] or None


def reference_model(config, ctx) -> tuple:
    """``(model, tokenizer)`` of the point's reference: its pretrained model, or the preset trained
    on the corpus (cached in the workdir, and in this process by ``reference_key``)."""
    return cached(reference_key(config), lambda: artefacts.model_for(
        config.tokenizer, config.model, config.train, ctx.workdir, progress=ctx.show_progress))


# --- quantization ---------------------------------------------------------------------------------


def check_quantization(config) -> None:
    """A llama.cpp point (``config.peer``) names a known peer and a pretrained model's file."""
    if config.peer and config.peer not in PEERS:
        raise ValueError(f"config.peer must be '' or one of {sorted(PEERS)}, got "
                         f"{config.peer!r}")
    if config.peer and not presets.is_pretrained(config.model):
        raise ValueError(f"config.peer={config.peer!r} needs a pretrained model's GGUF file, "
                         f"got the architecture {dict(config.model)}")


def quantization_label(config) -> str:
    """``"int4 g32 min-max"``, ``"int8 W8A8"`` (``"int8 W8A8x2"``: activations as two int8
    terms), ``"self-draft (int4 g32)"``, the llama.cpp rows'."""
    if config.peer:
        return PEERS[config.peer]
    if config.self_draft:
        return "self-draft (int4 g32)"
    if config.weights == "f32":
        return "f32"
    group = f" g{config.group_size}" if config.group_size else ""
    extra = {"rtn": "" if config.scheme == "absmax" else " min-max", "gptq": " GPTQ",
             "awq": " AWQ"}[config.method]
    activations = {"": "", "int8": " W8A8", "int8x2": " W8A8x2"}[config.activations]
    head = " +head" if config.get("embeddings", False) else ""
    return f"{config.weights}{group}{extra}{activations}{head}"


def quantized(config, model, tokenizer):
    """The point's candidate: ``model`` itself for float32 weights, else its quantized copy (GPTQ
    and AWQ calibrated on training windows), kept while consecutive points share it."""
    if config.weights == "f32":
        return model
    calibration = (token_windows(tokenizer, "train", config.calibration_windows,
                                 config.window_tokens) if config.method != "rtn" else None)
    embeddings = config.get("embeddings", False) or None  # None: 16-bit casts refuse a value
    key = (config.weights, config.group_size, config.scheme, config.method, config.activations,
           embeddings)
    return swap_candidate(key, lambda: quantize(
        model, weights=config.weights, group_size=config.group_size or None,
        method=config.method, calibration=calibration, scheme=config.scheme,
        embeddings=embeddings, activations=config.activations or None))


# --- pruning --------------------------------------------------------------------------------------


def check_pruning(config) -> None:
    """A known kind and weight format; no recovery for a pretrained model."""
    if config.kind not in PRUNING_KINDS:
        raise ValueError(f"config.kind must be one of {PRUNING_KINDS}, got {config.kind!r}")
    if config.weights not in PRUNED_WEIGHTS:
        raise ValueError(f"config.weights must be '', 'int8-w8a8' or 'int4-g32', got "
                         f"{config.weights!r}")
    if config.recovery_steps and presets.is_pretrained(config.model):
        raise ValueError("config.recovery_steps must be 0 for a pretrained model (recovery "
                         "trains on this corpus, which would change what the model is)")


def pruning_label(config) -> str:
    """``"wanda 2:4"``, ``"heads -25% (taylor) + 40 recovery steps"``, ``"int8 W8A8"``."""
    kind = config.kind
    if kind == "dense":
        base = "dense"
    elif kind == "unstructured":
        base = f"{config.method} {round(100 * config.sparsity)}%"
    elif kind in ("2:4", "4:8"):
        base = f"{config.method} {kind}"
    else:
        base = f"{kind} -{round(100 * config.fraction)}% ({config.importance})"
    weights = PRUNED_WEIGHTS[config.weights]
    parts = [weights] if base == "dense" and weights else [base] + ([weights] if weights else [])
    if config.recovery_steps:
        parts.append(f"{config.recovery_steps} recovery steps")
    return " + ".join(parts)


def pruning_key(config) -> tuple:
    """What makes a pruning point's candidate (``swap_candidate``'s key)."""
    return tuple(config[k] for k in ("kind", "method", "sparsity", "fraction", "importance",
                                     "recovery_steps", "weights"))


def recover(model, tokenizer, config, ctx) -> tuple:
    """``recovery_steps`` steps of training on the corpus with the pruned weights held at zero:
    ``(model, the loss at each step)``."""
    fields = {**config.recovery.to_dict(), "steps": config.recovery_steps,
              "checkpoint_every": config.recovery_steps, "log_every": 1}
    result = train(model.config, TrainConfig(**fields), data.token_stream(tokenizer, "train"),
                   init=model, update_mask=update_mask(model),
                   run=RunOptions(progress=ctx.show_progress))
    return result.model, [h["loss"] for h in result.history]


def pruned(config, model, tokenizer, calibration, ctx) -> tuple:
    """``(candidate, extra row fields)`` of a pruning point (module docstring)."""
    extra: dict = {}
    kind = config.kind
    if kind == "dense":
        candidate = model
    elif kind in ("unstructured", "2:4", "4:8"):
        candidate = prune(model, config.method, config.sparsity, pattern=kind,
                          calibration=calibration if config.method == "wanda" else None)
    else:
        calib = calibration if config.importance == "taylor" else None
        if kind == "heads":
            keep = heads_to_keep(model, config.fraction, config.importance, calib)
            extra["heads_kept"] = by_layer(np.asarray(keep, np.int32))
            extra["head_importance"] = by_layer(head_importance(model, config.importance, calib))
            candidate = prune_heads(model, config.fraction, importance=config.importance,
                                    calibration=calib)
        else:
            candidate = prune_neurons(model, config.fraction, importance=config.importance,
                                      calibration=calib)
    if config.recovery_steps:
        ctx.status("recovery")
        candidate, extra["recovery_loss"] = recover(candidate, tokenizer, config, ctx)
    zeros = sparsity_of(candidate)
    extra["sparsity"] = float(np.mean(list(zeros.values())))
    extra["params"] = param_count(candidate)
    if config.weights == "int8-w8a8":
        candidate = quantize(candidate, weights="int8", activations="int8")
    elif config.weights == "int4-g32":
        candidate = quantize(candidate, weights="int4", group_size=32)
    return candidate, extra
