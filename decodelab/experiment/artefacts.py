"""Trained tokenizers and models, cached in a workdir under the hash of what determines them; and
the pretrained models a config can name instead (``pretrained_model``, ``model_for``).

Layout::

    <workdir>/tokenizers/<tokenizer key>/tokenizer.model   trained on the training plays
    <workdir>/models/<model key>/spec.json                 the configs behind the key (for people)
    <workdir>/models/<model key>/history.json              training log of the runs that returned
    <workdir>/models/<model key>/checkpoints/              Orbax checkpoints of train.train

A tokenizer section either trains a tokenizer (fields: arguments of ``Tokenizer.train``) or names
a pretrained model whose tokenizer to use (``pretrained = <name>`` of ``presets.PRETRAINED_MODELS``
and nothing else), so that a model trained here shares a real model's vocabulary (e.g. a draft for
it). The tokenizer key hashes the tokenizer config (for a pretrained one, its name and the hash of
its ``to_json``: the tokenizer itself) and the corpus (its checksums and its split); the model
key hashes the tokenizer key, the resolved ModelConfig and the TrainConfig (and, for a model
distilled from a teacher, the objective, which names the teacher's key). A finished model is loaded
instead of retrained, an interrupted one continues from its last checkpoint (exactly: see train.py),
and processes sharing a workdir (sweep shards) take a lock per entry, so each is built once.

A run over several processes (``jax.distributed``, e.g. multi-host training) is one user of the
cache: its processes share the workdir (a filesystem every host sees), process 0 takes each
entry's lock on behalf of all of them and alone writes the tokenizer, ``spec.json`` and
``history.json``, and every process takes part in the Orbax checkpointing (whose saves and
restores are collective).

The keys do not cover the code: after changing the model or the training code, use a new workdir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import inspect
import json
import math
import os
import pathlib
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
from jax.experimental import multihost_utils
from ml_collections import config_dict

from decodelab.checks import check_path
from decodelab.config import ModelConfig
from decodelab.convert import PretrainedTokenizer, gguf_tokenizer, load_gguf
from decodelab.experiment import config_hash, json_dumps, presets
from decodelab.experiment.presets import build_model_config
from decodelab.model import Transformer, with_config
from decodelab.text import data
from decodelab.text.tokenizer import Tokenizer
from decodelab.train import checkpoint, distill
from decodelab.train import trainer as train
from decodelab.train.options import RunOptions

_TOKENIZER_ARGS = tuple(inspect.signature(Tokenizer.train).parameters)[1:]  # after `files`


def _as_dict(name: str, section: Any) -> dict[str, Any]:
    if isinstance(section, config_dict.ConfigDict):
        return section.to_dict()
    if isinstance(section, Mapping):
        return dict(section)
    raise ValueError(f"{name} must be a ConfigDict section or a dict, got {type(section).__name__}")


def _tokenizer_args(tokenizer_cfg: Any) -> dict[str, Any]:
    args = _as_dict("tokenizer_cfg", tokenizer_cfg)
    if "pretrained" in args:
        if set(args) != {"pretrained"} or args["pretrained"] not in presets.PRETRAINED_MODELS:
            raise ValueError(f"a pretrained tokenizer_cfg must hold only pretrained = one of "
                             f"{sorted(presets.PRETRAINED_MODELS)}, got {args}")
        return args
    unknown = sorted(set(args) - set(_TOKENIZER_ARGS))
    if unknown:
        raise ValueError(f"tokenizer_cfg fields must be arguments of Tokenizer.train "
                         f"{list(_TOKENIZER_ARGS)}, got unknown {unknown}")
    if "vocab_size" not in args:
        raise ValueError(f"tokenizer_cfg must set vocab_size, got {args}")
    return args


def tokenizer_key(tokenizer_cfg: Any) -> str:
    """The cache key of a tokenizer: its config (for a pretrained model's, its name and the hash
    of the tokenizer itself) and the corpus the models of this key are trained on."""
    args = _tokenizer_args(tokenizer_cfg)
    if "pretrained" in args:
        identity = hashlib.sha256(_pretrained_tokenizer(args["pretrained"]).to_json().encode())
        args = {**args, "sha256": identity.hexdigest()}
    corpus = (data.CORPUS_DIR / "SHA256SUMS").read_text(encoding="utf-8")
    return config_hash({"tokenizer": args, "corpus": corpus,
                        "held_out": [list(data.VALIDATION_DOCS), list(data.TEST_DOCS)]})


def model_key(tokenizer_cfg: Any, model_cfg: ModelConfig, train_cfg: train.TrainConfig) -> str:
    """The cache key of a trained model: its tokenizer's key, model config and training config."""
    return config_hash({"tokenizer": tokenizer_key(tokenizer_cfg), "model": model_cfg.key_dict(),
                        "train": train_cfg.to_dict()})


@contextlib.contextmanager
def _lock(path: pathlib.Path):
    """Hold an exclusive lock on the file ``path`` (created if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _entry_lock(path: pathlib.Path):
    """Hold the lock ``path`` of one cache entry for this run. In a run over several processes,
    process 0 holds it for all of them and the others wait at a barrier until it does: each
    process locking on its own would deadlock, the holder entering Orbax's collectives while the
    others wait for the lock."""
    if jax.process_count() == 1:
        with _lock(path):
            yield
        return
    name = f"decodelab.experiment.artefacts {path.name}"
    if jax.process_index() == 0:
        with _lock(path):
            multihost_utils.sync_global_devices(f"{name} locked")
            yield
            multihost_utils.sync_global_devices(f"{name} done")
    else:
        multihost_utils.sync_global_devices(f"{name} locked")
        yield
        multihost_utils.sync_global_devices(f"{name} done")


def _written_by_process_0(name: str) -> None:
    """Wait (in a run over several processes) until process 0 has written what ``name`` says."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"decodelab.experiment.artefacts {name} written")


def _write_atomic(path: pathlib.Path, payload: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise


@functools.cache
def _pretrained_tokenizer(name: str) -> PretrainedTokenizer:
    return gguf_tokenizer(presets.pretrained_path(name))


def tokenizer_for(tokenizer_cfg: Any, workdir: str | os.PathLike
                  ) -> Tokenizer | PretrainedTokenizer:
    """The tokenizer a section names: a pretrained model's (``pretrained = <name>``; loaded once
    per process from the installed file) or ``trained_tokenizer``'s."""
    args = _tokenizer_args(tokenizer_cfg)
    if "pretrained" in args:
        return _pretrained_tokenizer(args["pretrained"])
    return trained_tokenizer(args, workdir)


def trained_tokenizer(tokenizer_cfg: Any, workdir: str | os.PathLike) -> Tokenizer:
    """The tokenizer of ``tokenizer_cfg`` (fields: arguments of ``Tokenizer.train``), trained on the
    training plays the first time and loaded from ``<workdir>/tokenizers/<key>/`` after."""
    args = _tokenizer_args(tokenizer_cfg)
    if "pretrained" in args:
        raise ValueError(f"tokenizer_cfg must be a tokenizer to train, got {args} (a pretrained "
                         "model's tokenizer: tokenizer_for)")
    directory = (check_path("workdir", workdir, "directory", write=True) / "tokenizers"
                 / tokenizer_key(args))
    path = directory / "tokenizer.model"
    with _entry_lock(directory.with_suffix(".lock")):
        tokenizer = None
        if jax.process_index() == 0 and not path.exists():
            with tempfile.TemporaryDirectory() as tmp:
                tokenizer = Tokenizer.train(data.write_split_files("train", tmp), **args)
            directory.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, tokenizer.serialized_model())
        _written_by_process_0(f"tokenizer {directory.name}")
        return Tokenizer.load(path) if tokenizer is None else tokenizer


@dataclasses.dataclass
class TrainedModel:
    model: Transformer
    tokenizer: Tokenizer | PretrainedTokenizer
    # <workdir>/models/<model key>
    directory: pathlib.Path
    # Steps the model has been trained for (train_cfg.steps).
    step: int
    # The checkpoint step this call started from (None: trained from scratch; == step: reused).
    resumed_from: int | None
    # One entry per log interval (step, loss, tokens_per_s) of every run of this model that
    # returned; a killed run leaves a gap from its resume point to the next run's.
    history: list[dict[str, float]]


def load_or_train(tokenizer_cfg: Any, model_cfg_section: Any, train_cfg: Any,
                  workdir: str | os.PathLike, *, resume: bool = True,
                  progress: bool = True, mesh: Any = None) -> TrainedModel:
    """The model of these configs: loaded if finished, continued if interrupted, else trained.

    ``model_cfg_section`` holds every ModelConfig field but ``vocab_size`` (``presets.model_section``);
    ``train_cfg`` is a TrainConfig or its fields. ``resume=False`` refuses to reuse or continue
    existing checkpoints (as ``train.train`` does), for programs that want a fresh run made explicit.
    ``tokenizer_cfg`` may name a pretrained model's tokenizer (module docstring). ``mesh`` trains
    on a device mesh (``train.train``); it is not part of the cache key.
    """
    fields = _as_dict("model_cfg_section", model_cfg_section)
    if presets.is_pretrained(fields):
        raise ValueError(f"model_cfg_section must be an architecture to train, got the pretrained "
                         f"model {fields['pretrained']!r} (load it with pretrained_model)")
    tokenizer = tokenizer_for(tokenizer_cfg, workdir)
    model_cfg = build_model_config(fields, tokenizer.vocab_size)
    train_cfg = _train_config(train_cfg)
    key = model_key(tokenizer_cfg, model_cfg, train_cfg)
    spec = {"tokenizer": _tokenizer_args(tokenizer_cfg), "model": model_cfg.to_dict(),
            "train": train_cfg.to_dict()}
    return _load_or_run(pathlib.Path(workdir) / "models" / key, spec, tokenizer, model_cfg,
                        train_cfg, train.NextToken(), resume=resume, progress=progress,
                        mesh=mesh)


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The teacher a model is distilled from: the model ``load_or_train`` makes of its configs
    (with the student's tokenizer config), and the ``temperature`` of both distributions in the
    KL. Checked here, before the teacher is trained."""

    model_cfg_section: Any  # every ModelConfig field but vocab_size (presets.model_section)
    train_cfg: Any  # a TrainConfig or its fields
    temperature: float = 1.0

    def __post_init__(self) -> None:
        _as_dict("teacher.model_cfg_section", self.model_cfg_section)
        if not isinstance(self.train_cfg, train.TrainConfig):
            _as_dict("teacher.train_cfg", self.train_cfg)
        t = self.temperature
        finite = not isinstance(t, bool) and isinstance(t, (int, float)) and math.isfinite(t)
        if not finite or t <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {t!r}")


def load_or_distill(tokenizer_cfg: Any, teacher: Teacher, model_cfg_section: Any,
                    train_cfg: Any, workdir: str | os.PathLike, *, resume: bool = True,
                    progress: bool = True) -> TrainedModel:
    """A model distilled from a ``teacher`` (``distill.KLToTeacher``), cached like
    ``load_or_train``.

    The teacher is the model of ``tokenizer_cfg`` and the teacher's configs, itself loaded or
    trained first; the key covers its key, the student's configs and the objective, so a
    distilled model is never mistaken for a trained one of the same configs.
    """
    if not isinstance(teacher, Teacher):
        raise ValueError(f"teacher must be an artefacts.Teacher, got {teacher!r}")
    trained = load_or_train(tokenizer_cfg, teacher.model_cfg_section, teacher.train_cfg, workdir,
                            progress=progress)
    model_cfg = build_model_config(_as_dict("model_cfg_section", model_cfg_section),
                                   trained.tokenizer.vocab_size)
    train_cfg = _train_config(train_cfg)
    objective = distill.KLToTeacher(trained.model, trained.directory.name, teacher.temperature)
    key = config_hash({"tokenizer": tokenizer_key(tokenizer_cfg), "model": model_cfg.key_dict(),
                       "train": train_cfg.to_dict(), "objective": objective.to_dict()})
    spec = {"tokenizer": _tokenizer_args(tokenizer_cfg), "model": model_cfg.to_dict(),
            "train": train_cfg.to_dict(), "objective": objective.to_dict()}
    return _load_or_run(pathlib.Path(workdir) / "models" / key, spec, trained.tokenizer,
                        model_cfg, train_cfg, objective, resume=resume, progress=progress)


def _train_config(train_cfg: Any) -> train.TrainConfig:
    if isinstance(train_cfg, train.TrainConfig):
        return train_cfg
    return train.TrainConfig(**_as_dict("train_cfg", train_cfg))


def _load_or_run(directory: pathlib.Path, spec: dict[str, Any],
                 tokenizer: Tokenizer | PretrainedTokenizer,
                 model_cfg: ModelConfig, train_cfg: train.TrainConfig,
                 objective: train.Objective, *, resume: bool, progress: bool,
                 mesh: Any = None) -> TrainedModel:
    """Load the finished model in ``directory``, or continue or start its training run."""
    checkpoints = directory / "checkpoints"
    primary = jax.process_index() == 0
    with _entry_lock(directory.with_suffix(".lock")):
        history_path = directory / "history.json"
        # Every process reads the history before process 0 writes anything (the Orbax calls
        # below synchronise the processes).
        history = json.loads(history_path.read_text()) if history_path.exists() else []
        if primary:
            directory.mkdir(parents=True, exist_ok=True)
            _write_atomic(directory / "spec.json", json.dumps(spec, indent=2).encode("utf-8"))
        manager = checkpoint.open_manager(checkpoints)
        try:
            latest = manager.latest_step()
            if latest is not None and not resume:
                raise ValueError(f"{str(checkpoints)!r} already holds checkpoints of this model "
                                 f"(step {latest} of {train_cfg.steps}); pass resume=True "
                                 "(--resume) to reuse or continue it")
            if latest == train_cfg.steps:
                try:
                    model, _ = checkpoint.restore(manager, latest, model_cfg, mesh=mesh)
                    return TrainedModel(model, tokenizer, directory, latest, latest, history)
                except checkpoint.DamagedCheckpoint:
                    pass  # train.train falls back to the latest intact step, with a warning
        finally:
            manager.close()
        run = RunOptions(checkpoint_dir=checkpoints, tokenizer=tokenizer,
                         resume=latest is not None, progress=progress)
        result = train.train(model_cfg, train_cfg, data.token_stream(tokenizer, "train"),
                             run=run, objective=objective, mesh=mesh)
        history += result.history
        if primary:
            _write_atomic(history_path, json_dumps(history).encode("utf-8"))
    return TrainedModel(result.model, tokenizer, directory, result.step, result.resumed_from,
                        history)


@functools.cache
def _load_pretrained(name: str) -> tuple[Transformer, PretrainedTokenizer]:
    return load_gguf(presets.pretrained_path(name))


def pretrained_model(model_cfg_section: Any) -> tuple[Transformer, PretrainedTokenizer]:
    """``(model, tokenizer)`` of a pretrained model's section (``presets.model_section`` of a
    ``presets.PRETRAINED_MODELS`` name), loaded once per process and shared: treat it as
    read-only. The section's fields apply to the loaded weights; changing one that holds
    parameters (a width, the vocabulary, biases) is a ValueError."""
    fields = _as_dict("model_cfg_section", model_cfg_section)
    if not presets.is_pretrained(fields):
        raise ValueError(f"model_cfg_section must name a pretrained model (one of "
                         f"{sorted(presets.PRETRAINED_MODELS)}), got a section without "
                         "'pretrained'")
    model, tokenizer = _load_pretrained(fields["pretrained"])
    return with_config(model, build_model_config(fields, model.config.vocab_size)), tokenizer


def model_for(tokenizer_cfg: Any, model_cfg_section: Any, train_cfg: Any,
              workdir: str | os.PathLike, *, progress: bool = True
              ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """The model a config section names: its pretrained model (``pretrained_model``; the
    tokenizer and training configs are not used) or, for a size preset, ``trained_model``."""
    if presets.is_pretrained(_as_dict("model_cfg_section", model_cfg_section)):
        return pretrained_model(model_cfg_section)
    return trained_model(tokenizer_cfg, model_cfg_section, train_cfg, workdir, progress=progress)


def trained_model(tokenizer_cfg: Any, model_cfg_section: Any, train_cfg: Any,
                  workdir: str | os.PathLike, *, progress: bool = True
                  ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """``(model, tokenizer)`` of ``load_or_train`` (trained once, then reused from the workdir)."""
    trained = load_or_train(tokenizer_cfg, model_cfg_section, train_cfg, workdir,
                            progress=progress)
    return trained.model, trained.tokenizer


def distilled_model(tokenizer_cfg: Any, teacher: Teacher, model_cfg_section: Any,
                    train_cfg: Any, workdir: str | os.PathLike, *, progress: bool = True
                    ) -> tuple[Transformer, Tokenizer | PretrainedTokenizer]:
    """``(model, tokenizer)`` of ``load_or_distill`` (distilled once, then reused)."""
    distilled = load_or_distill(tokenizer_cfg, teacher, model_cfg_section, train_cfg, workdir,
                                progress=progress)
    return distilled.model, distilled.tokenizer
