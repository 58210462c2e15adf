"""Counting compilations: how a test or a benchmark checks that a sweep over traced values
compiles each program once.

Both counters listen on ``jax.monitoring`` by function name while a block runs, so they see every
jitted function, ours or a library's: ``count_traces`` counts jaxpr traces, ``count_compiles``
counts backend compilations (an XLA compile, or a read of the persistent compilation cache in its
place: either way a new executable, which a program reused from the in-process cache is not).

``release_near_map_limit`` keeps a long process (a sweep, a test session) under the kernel's limit
on memory maps, which every compiled program spends.
"""

from __future__ import annotations

import collections
import contextlib
import pathlib

_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def _count(event_name: str):
    import jax

    counts: collections.Counter = collections.Counter()

    def listen(event, duration, **kwargs):
        del duration
        if event == event_name:
            name = kwargs.get("fun_name") or ""
            # The backend names a program "jit(f)"; the tracer names it "f".
            if name.startswith("jit(") and name.endswith(")"):
                name = name[4:-1]
            counts[name] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def count_traces():
    """``with count_traces() as counts: ...`` then ``counts["_decode_loop"]``: the jit traces of
    each function (each one is a compilation) while the block runs."""
    return _count(_TRACE_EVENT)


def count_compiles():
    """``with count_compiles() as counts: ...`` then ``counts["_decode_loop"]``: the backend
    compilations of each function while the block runs, by the function's name (as
    ``count_traces``)."""
    return _count(_COMPILE_EVENT)


def memory_maps() -> tuple[int, int] | None:
    """``(memory maps this process holds, the kernel's limit)`` (``vm.max_map_count``) on Linux;
    None where either cannot be read."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
        limit = int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None
    return held, limit


def release_near_map_limit(fraction: float = 0.5) -> bool:
    """Drop every in-process compiled program (``jax.clear_caches``) when this process holds more
    than ``fraction`` of its memory-map limit; True if it did.

    XLA:CPU maps the code of each compiled kernel into memory regions of its own: one decode loop
    of the tiny test model takes about 700 maps, a speculative loop about 1,900. A process that
    keeps a few dozen such programs reaches Linux's default limit of 65,530, and the next compile
    or compilation-cache read crashes the process (a segmentation fault, not an error). A program
    dropped here is compiled again (or read from the persistent cache) the next time it runs.
    Call it between units of work (the experiment runner does, between points), never inside a
    block whose compilations are being counted."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    use = memory_maps()
    if use is None or use[0] <= fraction * use[1]:
        return False
    import jax

    jax.clear_caches()
    return True
