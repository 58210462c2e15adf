"""Counting compilations: how a test or a benchmark checks that a sweep over traced values
compiles each program once.

Both counters listen on ``jax.monitoring`` by function name while a block runs, so they see every
jitted function, ours or a library's: ``count_traces`` counts jaxpr traces, ``count_compiles``
counts backend compilations (an XLA compile, or a read of the persistent compilation cache in its
place: either way a new executable, which a program reused from the in-process cache is not).
"""

from __future__ import annotations

import collections
import contextlib

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
