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
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from decodelab.quantize import describe as describe_quantization, restructure
from decodelab.config import ModelConfig
from decodelab.convert.tokenizer import PretrainedTokenizer
from decodelab.model import Transformer
from decodelab.tokenizer import Tokenizer


def open_manager(directory, *, max_to_keep: int | None = 3, read_only: bool = False):
    """A synchronous ``CheckpointManager`` over ``directory`` (created unless ``read_only``)."""
    directory = pathlib.Path(directory).absolute()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint directory must be a directory, got a file: {str(directory)!r}")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=False,
    )
    return ocp.CheckpointManager(directory, options=options)


def make_meta(cfg: ModelConfig, tokenizer: Tokenizer | PretrainedTokenizer, step: int,
              **extra: Any) -> dict[str, Any]:
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


def save(manager, step: int, params: nnx.State, meta: dict[str, Any], opt_state=None) -> None:
    """Save ``params`` (and ``opt_state`` when given) with ``meta`` as checkpoint ``step``."""
    items = {
        "params": ocp.args.StandardSave(nnx.to_pure_dict(params)),
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
            quantization: dict | None = None):
    """Restore ``(model, opt_state or None)`` of ``step``; ``opt_state_like`` gives the optimizer
    state's structure (e.g. ``jax.eval_shape(tx.init, params)``)."""
    graphdef, abstract_params = nnx.split(abstract_model(cfg, quantization))
    items = {"params": ocp.args.StandardRestore(
        jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(abstract_params)))}
    if opt_state_like is not None:
        items["opt_state"] = ocp.args.StandardRestore(opt_state_like)
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    nnx.replace_by_pure_dict(abstract_params, restored["params"])
    model = nnx.merge(graphdef, abstract_params)
    return model, (restored["opt_state"] if opt_state_like is not None else None)


def save_checkpoint(path, model: Transformer, tokenizer: Tokenizer | PretrainedTokenizer, *,
                    step: int = 0, **extra: Any) -> None:
    """Save a ready-to-use model and its tokenizer to the directory ``path``."""
    manager = open_manager(path)
    quantization = describe_quantization(model)
    if quantization:
        extra = {**extra, "quantization": quantization}
    save(manager, step, nnx.state(model, nnx.Param),
         make_meta(model.config, tokenizer, step, **extra))
    manager.close()


def load_checkpoint(path, *, step: int | None = None
                    ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """Load ``(model, tokenizer)`` from a checkpoint directory (the latest step unless given)."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise ValueError(f"path must be an existing checkpoint directory, got {str(path)!r}")
    manager = open_manager(path, read_only=True)
    step = _latest_step(manager, path, step)
    meta = restore_meta(manager, step)
    cfg = ModelConfig.from_dict(meta["model_config"])
    model, _ = restore(manager, step, cfg, quantization=meta.get("quantization"))
    manager.close()
    return model, _meta_tokenizer(meta)
