"""Serving: a slot engine (padded slots or paged KV memory), static / dynamic / continuous
schedulers, request traces and metrics."""

# The engine and its requests
from decodelab.serving.engine import SlotEngine
from decodelab.serving.options import EngineOptions
from decodelab.serving.requests import Completion, Request, StepResult

# Paged memory: the cache view and the host's pool
from decodelab.serving.paged import PagedKVCache
from decodelab.serving.pages import PagePool

# Metrics
from decodelab.serving.metrics import RequestRecord, per_request, summarize

# Schedulers and replay
from decodelab.serving.schedulers import (SCHEDULERS, Clock, Continuous, Dynamic, Replay, Scheduler,
                                          Static, VirtualClock, WallClock, make_scheduler, replay)

# Traces
from decodelab.serving.traces import (LENGTHS, Exponential, Fixed, LengthDistribution, LogNormal,
                                      Uniform, length_distribution, load_trace, poisson_trace,
                                      save_trace)

__all__ = [
    "Completion", "EngineOptions", "Request", "SlotEngine", "StepResult",
    "PagedKVCache", "PagePool",
    "SCHEDULERS", "Clock", "Continuous", "Dynamic", "Replay", "Scheduler", "Static",
    "VirtualClock", "WallClock",
    "make_scheduler", "replay",
    "LENGTHS", "Exponential", "Fixed", "LengthDistribution", "LogNormal", "Uniform",
    "length_distribution", "load_trace", "poisson_trace", "save_trace",
    "RequestRecord", "per_request", "summarize",
]
