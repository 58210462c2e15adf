"""Orbax checkpoints that are self-contained: parameters, optional optimizer state, and a JSON
``meta`` item holding the step, the ModelConfig, the tokenizer (a trained one's SentencePiece model
bytes under ``tokenizer``, a pretrained model's ``PretrainedTokenizer.to_json`` under
``pretrained_tokenizer``) and any caller metadata (e.g. the training config).

Every checkpoint directory is an Orbax ``CheckpointManager`` directory (one sub-folder per step), so
a training run's folder and a model saved with ``save_checkpoint`` load the same way. Orbax writes
each step to a temporary folder and renames it when complete, so an interrupted save never leaves a
checkpoint that looks finished; ``save_checkpoint(..., overwrite=True)`` writes the new checkpoint
beside the old one and then swaps the two folders, so a crash midway leaves the old one intact.

A step that cannot be read (``integrity``: truncated or garbled array files, a missing or malformed
manifest or metadata file) is a ``DamagedCheckpoint`` naming the step and the file; reading "the
latest step" (``load_checkpoint``, ``load_sharded``, a resumed training run) falls back to the
latest intact step with a warning (``newest_intact``).
"""

from __future__ import annotations

import base64
import ctypes
import os
import pathlib
import shutil
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from decodelab import sharding
from decodelab.checks import check_bool, check_int, check_path, tokenizer_size
from decodelab.compress.quantization import describe as describe_quantization
from decodelab.compress.quantization import restructure
from decodelab.config import ModelConfig
from decodelab.convert.tokenizer import PretrainedTokenizer
from decodelab.model import Transformer
from decodelab.text.tokenizer import Tokenizer
from decodelab.train.integrity import DamagedCheckpoint, damaged, read_step_item

T = TypeVar("T")


def open_manager(directory, *, max_to_keep: int | None = 3, read_only: bool = False):
    """A synchronous ``CheckpointManager`` over ``directory`` (created unless ``read_only``)."""
    directory = check_path("checkpoint directory", directory, "directory",
                           write=not read_only).absolute()
    options = ocp.CheckpointManagerOptions(  # (Orbax warns about any saving option if read_only)
        max_to_keep=None if read_only else max_to_keep, create=not read_only,
        read_only=read_only, save_interval_steps=0 if read_only else 1,
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


def _chosen_steps(manager, directory, step: int | None) -> list[int]:
    """The steps to try, newest first: every saved step (``step=None``) or just ``step``."""
    steps = sorted(manager.all_steps(), reverse=True)
    if not steps:
        raise ValueError(f"no checkpoint found in {str(directory)!r}")
    if step is None:
        return steps
    if step not in steps:
        raise ValueError(f"step must be one of the saved steps {sorted(steps)}, got {step!r}")
    return [step]


def newest_intact(manager, steps: list[int], read: Callable[[int], T]) -> tuple[int, T]:
    """``(step, read(step))`` for the first of ``steps`` (newest first) that ``read`` finds
    intact. Each ``DamagedCheckpoint`` before it is one warning line (naming the step and its
    file); if every step is damaged, the newest one's error, noting the others."""
    errors = []
    for step in steps:
        try:
            value = read(step)
        except DamagedCheckpoint as e:
            errors.append(e)
            continue
        for error in errors:
            warnings.warn(f"{error}; using step {step}, the latest intact one", stacklevel=3)
        return step, value
    if len(errors) > 1:
        raise DamagedCheckpoint(f"{errors[0]}; no earlier step is intact either (steps "
                                f"{sorted(steps)} in {str(manager.directory)!r})") from errors[0]
    raise errors[0]


def restore_meta(manager, step: int) -> dict[str, Any]:
    """The ``meta`` item of ``step``, or a ``DamagedCheckpoint`` naming its file."""
    file = pathlib.Path(manager.directory) / str(step) / "meta" / "metadata"
    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # noqa: BLE001 (Orbax raises bare Exceptions, KeyErrors and JSON errors)
        raise damaged(manager.directory, step, "metadata", file, e) from e
    if not isinstance(meta, dict):
        raise damaged(manager.directory, step, "metadata", file,
                      f"a JSON object is expected, got {type(meta).__name__}")
    return meta


def meta_config(manager, step: int, meta: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of ``meta`` (of ``step``), or a ``DamagedCheckpoint``."""
    try:
        return ModelConfig.from_dict(meta["model_config"])
    except (KeyError, TypeError, ValueError) as e:
        raise damaged(manager.directory, step, "model config",
                      pathlib.Path(manager.directory) / str(step) / "meta" / "metadata", e) from e


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
    in a run over several processes, every process calls this), and the model remembers it.
    Damaged files, or parameters holding a NaN or an infinity (never saved), are a
    ``DamagedCheckpoint`` naming the step and the file."""
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
    step_dir = pathlib.Path(manager.directory) / str(step)
    parts = {"params": "parameters", "opt_state": "optimizer state"}
    restored = read_step_item(lambda: manager.restore(step, args=ocp.args.Composite(**items)),
                              manager.directory, step, {parts[k]: step_dir / k for k in items})
    bad = nonfinite_arrays(restored["params"])
    if bad:
        raise damaged(manager.directory, step, "parameters", step_dir / "params",
                      f"NaN or infinite values in {bad[:3]}")
    nnx.replace_by_pure_dict(abstract_params, restored["params"])
    model = nnx.merge(graphdef, abstract_params)
    if mesh is not None:
        model.mesh = mesh
    return model, (restored["opt_state"] if opt_state_like is not None else None)


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swap the directories ``a`` and ``b`` in one atomic step (Linux's ``renameat2`` with
    ``RENAME_EXCHANGE``); False where the system or the file system has no such call."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    return renameat2 is not None and renameat2(at_fdcwd, os.fsencode(a), at_fdcwd,
                                               os.fsencode(b), rename_exchange) == 0


def _replace_directory(old: pathlib.Path, new: pathlib.Path) -> None:
    """Put the complete directory ``new`` in ``old``'s place and delete ``old``'s content: an
    atomic swap where the system has one, else two renames (between which ``old``'s content
    sits intact at ``new``'s name with ``.old`` appended)."""
    if not _exchange(old, new):
        retired = new.with_name(new.name + ".old")
        shutil.rmtree(retired, ignore_errors=True)
        os.rename(old, retired)
        os.rename(new, old)
        new = retired
    shutil.rmtree(new)


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"decodelab.train.checkpoint {name}")


def save_checkpoint(path, model: Transformer, tokenizer: Tokenizer | PretrainedTokenizer, *,
                    step: int = 0, overwrite: bool = False, **extra: Any) -> None:
    """Save a ready-to-use model and its tokenizer to the directory ``path`` (created if needed).

    A directory that already holds a checkpoint is refused unless ``overwrite=True``, which
    replaces that checkpoint atomically: the new one is written beside it (in ``.<name>.new``)
    and then takes its place, so a crash midway leaves the old checkpoint intact. A directory
    holding other files besides a checkpoint is never replaced. The model's vocabulary may be
    padded past the tokenizer's (``checks.tokenizer_size``), never smaller."""
    check_int("step", step, 0)
    check_bool("overwrite", overwrite)
    quantization = describe_quantization(model)
    if quantization:
        extra = {**extra, "quantization": quantization}
    meta = make_meta(model.config, tokenizer, step, **extra)  # checked before anything is written
    path = check_path("path", path, "directory", write=True).absolute()
    entries = sorted(p.name for p in path.iterdir())
    held = sorted(int(name) for name in entries if name.isdigit())
    if held and not overwrite:
        raise ValueError(f"path {str(path)!r} already holds a checkpoint (steps {held}); pass "
                         f"overwrite=True to replace it, or choose another path")
    others = [name for name in entries if not name[:1].isdigit()]  # steps and Orbax temp folders
    if held and others:
        raise ValueError(f"path {str(path)!r} holds other files besides its checkpoint "
                         f"({others[:3]}); overwrite=True replaces the whole directory, so move "
                         f"them first or choose another path")
    target = path.with_name(f".{path.name}.new") if held else path
    if held and jax.process_index() == 0:
        shutil.rmtree(target, ignore_errors=True)  # left by a save that crashed
    _sync("stale copy removed")
    try:
        manager = open_manager(target)
        try:
            save(manager, step, nnx.state(model, nnx.Param), meta)
        finally:
            manager.close()
    except BaseException:
        if held and jax.process_index() == 0:
            shutil.rmtree(target, ignore_errors=True)
        raise
    if held and jax.process_index() == 0:
        _replace_directory(path, target)
    _sync("checkpoint replaced")


def _load_step(manager, step: int) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """``(model, tokenizer)`` of one step, or a ``DamagedCheckpoint`` naming the damaged part."""
    meta = restore_meta(manager, step)
    cfg = meta_config(manager, step, meta)
    try:
        tokenizer = _meta_tokenizer(meta)
    except Exception as e:  # noqa: BLE001 (base64, SentencePiece and JSON errors alike)
        raise damaged(manager.directory, step, "tokenizer",
                      pathlib.Path(manager.directory) / str(step) / "meta" / "metadata", e) from e
    model, _ = restore(manager, step, cfg, quantization=meta.get("quantization"))
    return model, tokenizer


def load_checkpoint(path, *, step: int | None = None
                    ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """Load ``(model, tokenizer)`` from a checkpoint directory (the latest step unless given).

    A damaged step (truncated or garbled array files, a missing or malformed metadata file or
    manifest) is a ``DamagedCheckpoint`` (a ValueError) naming the checkpoint, the step, the
    damaged part and its file. Without ``step``, a damaged latest step falls back to the latest
    intact one with a warning (a training run keeps several steps); with ``step``, there is no
    fallback.

    The model's vocabulary may be padded past the tokenizer's (``model.config.vocab_size`` >=
    ``tokenizer.vocab_size``): pass the tokenizer to generation (``DecodeOptions(tokenizer=...)``,
    ``EngineOptions(tokenizer=...)``) and the padded ids are never sampled.
    """
    path = check_path("path", path, "directory", what="checkpoint ")
    manager = open_manager(path, read_only=True)
    try:
        return newest_intact(manager, _chosen_steps(manager, path, step),
                             lambda s: _load_step(manager, s))[1]
    finally:
        manager.close()


def load_sharded(path, mesh: Mesh, *, step: int | None = None) -> nnx.Module:
    """The model of a checkpoint (``save_checkpoint`` or a training run's folder; the latest step
    unless given, falling back as ``load_checkpoint`` does), restored by Orbax straight onto
    ``mesh``, each device reading only its shards. The mesh need not have the shape the
    checkpoint was saved from. (``load_checkpoint`` gives the tokenizer.)"""
    mesh = sharding.check_mesh(mesh)
    path = check_path("path", path, "directory", what="checkpoint ")
    manager = open_manager(path, read_only=True)

    def read(s: int) -> nnx.Module:
        meta = restore_meta(manager, s)
        return restore(manager, s, meta_config(manager, s, meta), mesh=mesh,
                       quantization=meta.get("quantization"))[0]

    try:
        return newest_intact(manager, _chosen_steps(manager, path, step), read)[1]
    finally:
        manager.close()
