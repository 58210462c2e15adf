"""Greedy ``generate`` of one model on one device or under a device mesh of this process, timed:
what partitioning costs on the devices at hand, and a digest of the tokens so that every mesh can
be checked against one device. On fake CPU devices (``fake_cpu_devices``) the devices are threads
of one CPU, so the times show the cost of partitioning on one host, not a speed-up."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
import time
from collections.abc import Sequence

import jax
import numpy as np

from decodelab import sharding
from decodelab.checks import check_int
from decodelab.decode.generation import generate
from decodelab.sampling.params import SamplingParams

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
ONE_DEVICE = "none"  # the mesh named so: one device, no mesh (the reference)
THREADS_PER_DEVICE = 4  # XLA CPU pool threads per fake device (``fake_cpu_environment``)


@dataclasses.dataclass(frozen=True)
class MeshTiming:
    """One mesh's run: ``shape`` (data, model), None for one device without a mesh."""

    shape: tuple[int, int] | None
    first_s: float  # the first call, which compiles
    rep_s: tuple[float, ...]  # each timed call after it
    tokens_sha256: str  # of the generated tokens [B, new_tokens] as int32: equal tokens, equal

    @property
    def median_s(self) -> float:
        return statistics.median(self.rep_s)

    @property
    def compile_s(self) -> float:
        """The first call minus the median of the timed ones."""
        return self.first_s - self.median_s


def tokens_digest(tokens) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(tokens, np.int32)).tobytes()).hexdigest()


def mesh_shape(mesh: str) -> tuple[int, int] | None:
    """A mesh as a config names it, ``"DxM"`` (data x model), as (D, M); ``ONE_DEVICE``: None."""
    if mesh == ONE_DEVICE:
        return None
    parts = mesh.split("x") if isinstance(mesh, str) else []
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"mesh must be {ONE_DEVICE!r} or 'DxM' (data x model, positive ints), "
                         f"got {mesh!r}")
    return int(parts[0]), int(parts[1])


def time_mesh(model, prompts: Sequence[Sequence[int]], new_tokens: int, repeats: int,
              shape: tuple[int, int] | None) -> MeshTiming:
    """A first call of greedy ``generate`` with ``model`` sharded on a ``shape`` mesh (None: as
    it is, on one device), then ``repeats`` timed calls."""
    check_int("repeats", repeats, 1)
    m = model if shape is None else sharding.shard(model, sharding.make_mesh(*shape))
    greedy = SamplingParams.greedy()
    start = time.perf_counter()
    out = generate(m, prompts, greedy, new_tokens)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generate(m, prompts, greedy, new_tokens)
        times.append(time.perf_counter() - start)
    return MeshTiming(shape, first, tuple(times), tokens_digest(out.tokens))


def fake_cpu_environment(count: int) -> None:
    """Set the environment for ``count`` fake CPU devices; it counts only before JAX's backend
    starts. ``DEVICE_COUNT_FLAG`` is added to XLA_FLAGS (the other flags kept), and XLA's CPU
    thread pool gets at least ``THREADS_PER_DEVICE`` threads per device (``NPROC``, which XLA
    reads for the pool's size; a larger value already set is kept).

    The devices share that one pool, and XLA's CPU runtime runs a device's independent collectives
    at the same time, each holding a thread while it waits for the other devices. With one thread
    per device (XLA's size when devices outnumber cores) the waiting collectives can hold every
    thread while a device that would complete them waits for one: the program deadlocks, and XLA
    aborts it after 40 s. The sharding study's 2 x 4 mesh did so in about one run of three."""
    check_int("count", count, 1)
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith(DEVICE_COUNT_FLAG + "=")]
    os.environ["XLA_FLAGS"] = " ".join([*kept, f"{DEVICE_COUNT_FLAG}={count}"])
    threads = THREADS_PER_DEVICE * count
    set_threads = os.environ.get("NPROC", "")
    if not (set_threads.isdigit() and int(set_threads) >= threads):
        os.environ["NPROC"] = str(threads)


def fake_cpu_devices(count: int) -> int:
    """``fake_cpu_environment(count)``, then return how many devices JAX has. The count is fixed
    when the backend starts, so a program calls this before anything asks JAX for devices;
    ValueError when the backend had already started with fewer."""
    fake_cpu_environment(count)
    found = jax.device_count()
    if found < count:
        raise ValueError(f"count={count} devices need XLA_FLAGS={DEVICE_COUNT_FLAG}={count} "
                         f"(and JAX_PLATFORMS=cpu) before JAX's backend starts; it started "
                         f"earlier, with {found} {jax.default_backend()} device(s)")
    return found
