"""Models with random weights for studies whose numbers do not depend on the weights' values (the
serving studies: the same shapes run the same operations), kept across the points of a process."""

from __future__ import annotations

import functools
import json

from flax import nnx

from decodelab.experiment.presets import build_model_config
from decodelab.model.transformer import Transformer


@functools.lru_cache(maxsize=2)
def _cached(model_json: str, vocab_size: int, seed: int) -> Transformer:
    cfg = build_model_config(json.loads(model_json), vocab_size)
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def random_model(section, vocab_size: int, seed: int) -> Transformer:
    """The model of config section ``section`` (a ConfigDict or a dict of ModelConfig fields) at
    ``vocab_size`` with random weights drawn from ``seed``; the same arguments give the same
    model object for the last two sets of arguments of this process."""
    fields = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    return _cached(json.dumps(fields, sort_keys=True), vocab_size, seed)
