"""Values kept across the points of one process: a sweep's points reuse the models they load
(trained or read once per process), and the compression studies keep one candidate model at a
time beside the references it is compared with."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax

from decodelab.experiment.overrides import config_hash

# The compression studies' models: references (``reference_key``) and one candidate.
CACHE: dict = {}


def cached(key: Hashable, make: Callable[[], Any], cache: dict = CACHE) -> Any:
    """``cache[key]``, made by ``make()`` the first time."""
    if key not in cache:
        cache[key] = make()
    return cache[key]


def reference_key(config) -> tuple:
    """The cache key of a point's reference model: its tokenizer, model and training sections."""
    return ("reference", config_hash(
        {name: config[name].to_dict() for name in ("tokenizer", "model", "train")}))


def swap_candidate(key: Hashable, make: Callable[[], Any]) -> Any:
    """The candidate model of ``key`` (a quantized or pruned copy of the reference), kept while
    consecutive points use it; a new one drops the previous candidate and every compiled
    program, so a sweep's memory stays that of one candidate (a process that kept them all ran
    out of memory on SmolLM2). The references (``reference_key``) stay."""
    if key not in CACHE:
        for old in [k for k in CACHE if not (isinstance(k, tuple) and k[0] == "reference")]:
            del CACHE[old]
        jax.clear_caches()
    return cached(key, make)
