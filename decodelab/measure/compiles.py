"""Counting compilations: how a test or a benchmark checks that a sweep over traced values
compiles each program once."""

from __future__ import annotations

import collections
import contextlib


@contextlib.contextmanager
def count_traces():
    """Count jit traces (each one is a compilation) by function name while the block runs:
    ``with count_traces() as counts: ...`` then ``counts["_decode_loop"]``. Through
    ``jax.monitoring``, so it sees every jitted function, ours or a library's."""
    import jax

    counts: collections.Counter = collections.Counter()

    def listen(event, duration, **kwargs):
        del duration
        if event == "/jax/core/compile/jaxpr_trace_duration":
            counts[kwargs.get("fun_name")] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
