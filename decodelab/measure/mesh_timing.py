"""Greedy ``generate`` of one model on one device and under each device mesh of this process,
timed: what partitioning costs on the devices at hand and whether every mesh gives the one-device
tokens. On fake CPU devices (``--xla_force_host_platform_device_count``) the devices are threads
of one CPU, so the times show the cost of partitioning on one host, not a speed-up."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import time
from collections.abc import Sequence

import jax

from decodelab import sharding
from decodelab.decode.generation import generate
from decodelab.sampling.params import SamplingParams


@dataclasses.dataclass(frozen=True)
class MeshTiming:
    """One mesh's run: ``shape`` (data, model), None for one device without a mesh."""

    shape: tuple[int, int] | None
    compile_s: float  # the first (compiling) call minus the median
    median_s: float  # the median of the timed calls
    same_tokens: bool  # the tokens equal the one-device run's


def time_meshes(model, prompts: Sequence[Sequence[int]], new_tokens: int, repeats: int,
                shapes: Sequence[tuple[int, int] | None]) -> list[MeshTiming]:
    """For each mesh shape (the first should be None: the one-device reference), a first call of
    greedy ``generate`` then ``repeats`` timed calls of the model sharded on that mesh."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    greedy, found, reference = SamplingParams.greedy(), [], None
    for shape in shapes:
        m = model if shape is None else sharding.shard(model, sharding.make_mesh(*shape))
        start = time.perf_counter()
        out = generate(m, prompts, greedy, new_tokens)
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            generate(m, prompts, greedy, new_tokens)
            times.append(time.perf_counter() - start)
        reference = out.tokens if reference is None else reference
        median = statistics.median(times)
        found.append(MeshTiming(shape, first - median, median,
                                bool((out.tokens == reference).all())))
    return found


def machine_text() -> str:
    """This machine as the page names it: processor, cores, load average now, jax, the date."""
    return (f"`{platform.processor() or platform.machine()}`, {os.cpu_count()} cores (load "
            f"average {os.getloadavg()[0]:.1f} at the end: other work shared them), jax "
            f"{jax.__version__}, {datetime.date.today().isoformat()}")
