"""Models a study keeps for the whole process, with their validation perplexity: the first point
of a sweep trains (or loads) and evaluates a model, every later point reuses it and the decode
programs compiled for it."""

from __future__ import annotations

import os
from typing import Any

from decodelab.experiment import artefacts, config_hash
from decodelab.measure.strategies import EvaluatedModel
from decodelab.text import data
from decodelab.train import trainer

# (workdir, hash of the tokenizer and model sections) -> the evaluated model, for the process.
_KEPT: dict[tuple[str, str], EvaluatedModel] = {}


def evaluated_model(tokenizer_cfg: Any, section: Any, workdir: str | os.PathLike, *,
                    progress: bool = True, batch_size: int = 32) -> EvaluatedModel:
    """The model of ``section`` (its ``model`` and ``train`` sections; ``artefacts.model_for``:
    trained once in ``workdir``, or a pretrained one) with its perplexity on the validation
    plays in windows of ``section.train.seq_len``, kept for the process."""
    key = (str(workdir), config_hash({"tokenizer": tokenizer_cfg.to_dict(), **section.to_dict()}))
    if key not in _KEPT:
        model, tokenizer = artefacts.model_for(tokenizer_cfg, section.model, section.train,
                                               workdir, progress=progress)
        windows = data.eval_windows(data.token_stream(tokenizer, "validation"),
                                    section.train.seq_len)
        _KEPT[key] = EvaluatedModel(model, tokenizer,
                                    trainer.evaluate(model, windows, batch_size)["perplexity"])
    return _KEPT[key]
