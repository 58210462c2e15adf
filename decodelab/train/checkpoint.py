"""Orbax checkpoints that are self-contained: parameters, optional optimizer state, and a JSON
``meta`` item holding the step, the ModelConfig, the tokenizer (a trained one's SentencePiece model
bytes under ``tokenizer``, a pretrained model's ``PretrainedTokenizer.to_json`` under
``pretrained_tokenizer``) and any caller metadata (e.g. the training config).

Every checkpoint directory is an Orbax ``CheckpointManager`` directory (one sub-folder per step), so
a training run's folder and a model saved with ``save_checkpoint`` load the same way. Orbax writes
each step to a temporary folder and renames it when complete, so an interrupted save never leaves a
checkpoint that looks finished.
"""

from __future__ import annotations

import base64
import pathlib
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from decodelab import sharding
from decodelab.compress.quantization import describe as describe_quantization
from decodelab.compress.quantization import restructure
from decodelab.checks import tokenizer_size
from decodelab.config import ModelConfig
from decodelab.convert.tokenizer import PretrainedTokenizer
from decodelab.model import Transformer
from decodelab.text.tokenizer import Tokenizer


def open_manager(directory, *, max_to_keep: int | None = 3, read_only: bool = False):
    """A synchronous ``CheckpointManager`` over ``directory`` (created unless ``read_only``)."""
    directory = pathlib.Path(directory).absolute()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint directory must be a directory, got a file: "
                         f"{str(directory)!r}")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=False,
    )
    return ocp.CheckpointManager(directory, options=options)


def make_meta(cfg: ModelConfig, tokenizer: Tokenizer | PretrainedTokenizer, step: int,
              **extra: Any) -> dict[str, Any]:
    tokenizer_size("tokenizer", tokenizer, cfg.vocab_size)  # at most the model's: may be padded
    if isinstance(tokenizer, PretrainedTokenizer):
        saved = {"pretrained_tokenizer": tokenizer.to_json()}
    else:
        saved = {"tokenizer": base64.b64encode(tokenizer.serialized_model()).decode("ascii")}
    return {"step": int(step), "model_config": cfg.to_dict(), **saved, **extra}


def _meta_tokenizer(meta: dict[str, Any]) -> Tokenizer | PretrainedTokenizer:
    """The tokenizer ``make_meta`` stored."""
    if "pretrained_tokenizer" in meta:
        return PretrainedTokenizer.from_json(meta["pretrained_tokenizer"])
    return Tokenizer.from_serialized(base64.b64decode(meta["tokenizer"]))


@jax.jit
def _all_finite(arrays: list[jax.Array]) -> list[jax.Array]:
    return [jnp.isfinite(a).all() for a in arrays]


def nonfinite_arrays(tree: Any) -> list[str]:
    """The paths (``['layers'][0]['attn']...``) of the float arrays in ``tree`` that hold a NaN or
    an infinity; integer arrays (quantized values, counters) are never non-finite."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    floats = [(jax.tree_util.keystr(path), leaf) for path, leaf in leaves
              if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact)]
    finite = _all_finite([leaf for _, leaf in floats])
    return [name for (name, _), ok in zip(floats, finite, strict=True) if not bool(ok)]


def save(manager, step: int, params: nnx.State, meta: dict[str, Any], opt_state=None) -> None:
    """Save ``params`` (and ``opt_state`` when given) with ``meta`` as checkpoint ``step``.
    Parameters holding a NaN or an infinity are refused: such a checkpoint would only spread."""
    pure = nnx.to_pure_dict(params)
    bad = nonfinite_arrays(pure)
    if bad:
        raise ValueError(f"parameters must be finite to be saved as step {step} in "
                         f"{str(manager.directory)!r}, got NaN or infinite values in "
                         f"{bad[:5]}{' ...' if len(bad) > 5 else ''}")
    items = {
        "params": ocp.args.StandardSave(pure),
        "meta": ocp.args.JsonSave(meta),
    }
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardSave(opt_state)
    manager.save(step, args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()


def _latest_step(manager, directory, step: int | None) -> int:
    steps = manager.all_steps()
    if not steps:
        raise ValueError(f"no checkpoint found in {str(directory)!r}")
    if step is None:
        return manager.latest_step()
    if step not in steps:
        raise ValueError(f"step must be one of the saved steps {sorted(steps)}, got {step}")
    return step


def restore_meta(manager, step: int) -> dict[str, Any]:
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


def abstract_model(cfg: ModelConfig, quantization: dict | None = None) -> Transformer:
    """A Transformer of ``cfg`` whose arrays are shapes only (nothing allocated), with the
    quantized modules ``quantization`` (``quantize.describe``) describes."""
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return restructure(model, quantization) if quantization else model


def restore(manager, step: int, cfg: ModelConfig, opt_state_like=None,
            quantization: dict | None = None, mesh=None):
    """Restore ``(model, opt_state or None)`` of ``step``; ``opt_state_like`` gives the optimizer
    state's structure (e.g. ``jax.eval_shape(tx.init, params)``). Without ``mesh`` both are read
    onto one device, whatever mesh they were saved from; with ``mesh`` they are read straight
    onto it, laid out by ``sharding.PARAM_RULES`` (each device reads only its shards;
    in a run over several processes, every process calls this), and the model remembers it."""
    graphdef, abstract_params = nnx.split(abstract_model(cfg, quantization))
    if mesh is None:
        # On this process's first device, whatever mesh the checkpoint was saved from (Orbax
        # would otherwise restore the saved layout, or refuse a different set of devices).
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        place = lambda tree: jax.tree.map(  # noqa: E731
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), tree)
    else:
        place = lambda tree: sharding.abstract_on_mesh(tree, mesh)  # noqa: E731
    items = {"params": ocp.args.StandardRestore(place(nnx.to_pure_dict(abstract_params)))}
    if opt_state_like is not None:
        items["opt_state"] = ocp.args.StandardRestore(place(opt_state_like))
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    nnx.replace_by_pure_dict(abstract_params, restored["params"])
    model = nnx.merge(graphdef, abstract_params)
    if mesh is not None:
        model.mesh = mesh
    return model, (restored["opt_state"] if opt_state_like is not None else None)


def save_checkpoint(path, model: Transformer, tokenizer: Tokenizer | PretrainedTokenizer, *,
                    step: int = 0, **extra: Any) -> None:
    """Save a ready-to-use model and its tokenizer to the directory ``path``. The model's
    vocabulary may be padded past the tokenizer's (``checks.tokenizer_size``), never smaller."""
    manager = open_manager(path)
    quantization = describe_quantization(model)
    if quantization:
        extra = {**extra, "quantization": quantization}
    save(manager, step, nnx.state(model, nnx.Param),
         make_meta(model.config, tokenizer, step, **extra))
    manager.close()


def _damaged(path: pathlib.Path, step: int, part: str, error: BaseException) -> ValueError:
    while error.__cause__ is not None:  # Orbax wraps TensorStore's error, which says what failed
        error = error.__cause__
    detail = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return ValueError(f"checkpoint {str(path)!r} step {step} is damaged: its {part} cannot be "
                      f"read ({type(error).__name__}: {detail})")


def _load_step(manager, path: pathlib.Path, step: int
               ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """``(model, tokenizer)`` of one step, or a ValueError naming the part that is damaged."""
    # Orbax and TensorStore raise bare Exceptions, KeyErrors and JSON errors for damaged files:
    # each stage is read on its own so the error can say which part failed.
    meta_dir = path / str(step) / "meta"
    try:
        meta = restore_meta(manager, step)
    except Exception as e:  # noqa: BLE001 (see above)
        raise _damaged(path, step, f"metadata ({str(meta_dir)!r})", e) from e
    if not isinstance(meta, dict):
        raise _damaged(path, step, f"metadata ({str(meta_dir)!r})",
                       TypeError(f"a JSON object is expected, got {type(meta).__name__}"))
    try:
        cfg = ModelConfig.from_dict(meta["model_config"])
    except (KeyError, TypeError, ValueError) as e:
        raise _damaged(path, step, f"model config (model_config in {str(meta_dir)!r})", e) from e
    try:
        tokenizer = _meta_tokenizer(meta)
    except Exception as e:  # noqa: BLE001 (base64, SentencePiece and JSON errors alike)
        raise _damaged(path, step, f"tokenizer (in {str(meta_dir)!r})", e) from e
    params_dir = path / str(step) / "params"
    try:
        model, _ = restore(manager, step, cfg, quantization=meta.get("quantization"))
    except Exception as e:  # noqa: BLE001 (see above)
        raise _damaged(path, step, f"parameters ({str(params_dir)!r}: array data, manifest or "
                                   "array metadata)", e) from e
    bad = nonfinite_arrays(nnx.to_pure_dict(nnx.state(model)))
    if bad:
        raise _damaged(path, step, f"parameters ({str(params_dir)!r})",
                       ValueError(f"NaN or infinite values in {bad[:3]}"))
    return model, tokenizer


def load_checkpoint(path, *, step: int | None = None
                    ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """Load ``(model, tokenizer)`` from a checkpoint directory (the latest step unless given).

    A damaged step (truncated or garbled array files, a missing or malformed metadata file or
    manifest) is a ValueError naming the checkpoint, the step and the damaged part. Without
    ``step``, a damaged latest step falls back to the latest intact one with a warning (a
    training run keeps several steps); with ``step``, there is no fallback.

    The model's vocabulary may be padded past the tokenizer's (``model.config.vocab_size`` >=
    ``tokenizer.vocab_size``): pass the tokenizer to generation (``DecodeOptions(tokenizer=...)``,
    ``EngineOptions(tokenizer=...)``) and the padded ids are never sampled.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise ValueError(f"path must be an existing checkpoint directory, got {str(path)!r}")
    manager = open_manager(path, read_only=True)
    try:
        chosen = _latest_step(manager, path, step)
        candidates = [chosen] if step is not None else sorted(manager.all_steps(), reverse=True)
        first_error = None
        for candidate in candidates:
            try:
                loaded = _load_step(manager, path, candidate)
            except ValueError as e:
                first_error = first_error or e
                continue
            if first_error is not None:
                warnings.warn(f"{first_error}; loaded step {candidate}, the latest intact one",
                              stacklevel=2)
            return loaded
    finally:
        manager.close()
    if len(candidates) > 1:
        raise ValueError(f"{first_error}; no earlier step is intact either "
                         f"(steps {sorted(candidates)})") from first_error
    raise first_error


def load_sharded(path, mesh: Mesh, *, step: int | None = None) -> nnx.Module:
    """The model of a checkpoint (``save_checkpoint`` or a training run's folder; the latest step
    unless given), restored by Orbax straight onto ``mesh``, each device reading only its shards.
    The mesh need not have the shape the checkpoint was saved from. (``load_checkpoint`` gives the
    tokenizer.)"""
    mesh = sharding.check_mesh(mesh)
    manager = open_manager(path, read_only=True)
    try:
        steps = manager.all_steps()
        if not steps or (step is not None and step not in steps):
            raise ValueError(f"step must be one of the saved steps {sorted(steps)} in "
                             f"{str(path)!r}, got {step!r}")
        step = manager.latest_step() if step is None else step
        meta = restore_meta(manager, step)
        model, _ = restore(manager, step, ModelConfig.from_dict(meta["model_config"]),
                                      mesh=mesh)
    finally:
        manager.close()
    return model
