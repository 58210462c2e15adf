"""The speculative-decoding study's models as cached artefacts, and what a point starts from.

A point's target is trained on the corpus (or is a pretrained model, ``artefacts.model_for``);
its drafter is the ``draft`` preset trained on the corpus in the target's tokenizer, the same
preset distilled from the target, or prompt lookup. Each model is trained (or distilled) once
per workdir, under a key of the sections that define it (``artefacts``), and loaded once per
process (``MODELS``): every point of a sweep reuses it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax

from decodelab.decode.request import bucket_length
from decodelab.experiment import artefacts
from decodelab.experiment.overrides import config_hash
from decodelab.experiment.presets import MODEL_PRESETS
from decodelab.experiment.process_cache import cached
from decodelab.measure.speculation import Run
from decodelab.speculative.drafters import NgramDrafter
from decodelab.text.data import token_windows

DRAFTERS = ("draft", "distilled", "ngram")

# The models loaded by a process's points: targets, trained and distilled drafts.
MODELS: dict = {}


def begin_point() -> float:
    """The machine's 1-minute load average now (the row's ``load_1min``), then every compiled
    program dropped. Each point compiles programs of its own (per gamma, drafter and round
    part), and a process keeps every executable with its memory maps: a first full run reached
    the kernel's limit (vm.max_map_count, 65530) after 54 points and crashed in LLVM ("Cannot
    allocate memory"). Every point warms up before it times, so dropping earlier points'
    programs costs only their recompilation where shapes repeat."""
    load = os.getloadavg()[0]
    jax.clear_caches()
    return load


def point_models(config, ctx) -> tuple[Any, Any, Any]:
    """``(target, drafter, tokenizer)`` for the point's ``config.drafter`` (trained or loaded
    once); the target is trained, or a pretrained model's (``artefacts.model_for``)."""
    def target():
        return artefacts.model_for(config.tokenizer, config.target.model, config.target.train,
                                   ctx.workdir, progress=ctx.show_progress)

    model, tokenizer = cached(("target", config_hash(config.target)), target, MODELS)
    if config.drafter == "ngram":
        drafter = NgramDrafter(config.ngram.max_ngram, config.ngram.min_ngram)
    elif config.drafter == "draft":
        drafter, _ = cached(("draft", config_hash(config.draft)), lambda: (
            artefacts.trained_model(config.tokenizer, config.draft.model, config.draft.train,
                                    ctx.workdir, progress=ctx.show_progress)), MODELS)
    elif config.drafter == "distilled":
        key = tuple(config_hash(section) for section in (
            config.target, config.draft.model, config.distill_train))
        drafter, _ = cached(("distilled", *key), lambda: (
            artefacts.distilled_model(config.tokenizer, artefacts.Teacher(
                config.target.model, config.target.train, config.distill_temperature),
                config.draft.model, config.distill_train, ctx.workdir,
                progress=ctx.show_progress)), MODELS)
    else:
        raise ValueError(f"drafter must be one of {sorted(DRAFTERS)}, got {config.drafter!r}")
    return model, drafter, tokenizer


def point_prompts(tokenizer, config) -> list[list[int]]:
    """``config.num_prompts`` windows of ``config.prompt_tokens`` tokens, evenly spaced over the
    test plays' token stream (in the target's tokens)."""
    return token_windows(tokenizer, "test", config.num_prompts, config.prompt_tokens).tolist()


def point_run(config) -> Run:
    """The point's decoding and timing; every run's cache holds the prompt bucket, the output
    and ``config.cache_slack`` slots (the largest gamma: the same cache size at every gamma)."""
    return Run(gamma=config.gamma, temperature=config.temperature, batch_size=config.batch_size,
               new_tokens=config.new_tokens, seed=config.seed,
               max_len=bucket_length(config.prompt_tokens) + config.new_tokens
               + config.cache_slack, repeats=config.repeats, step_tokens=config.step_tokens)


def target_name(row: Mapping[str, Any]) -> str:
    """A row's target: a pretrained preset's name, or the size preset it was built from."""
    model = row["config"]["target"]["model"]
    if model.get("pretrained") is not None:
        return model["pretrained"]
    return next(name for name, fields in MODEL_PRESETS.items()
                if all(model.get(k) == v for k, v in fields.items()))
