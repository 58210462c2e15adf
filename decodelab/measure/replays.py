"""Serving measured on a wall clock: request traces replayed through a ``serving.SlotEngine`` under
one batching policy, each replay after a warm-up that compiles every program it can need, and
the seconds a decode round costs with a batch of slots all running.

What a caller relies on:

- ``Arm`` is an engine shape and a policy: padded slots (every slot reserves ``max_len`` cache
  slots) or, with ``kv_tokens``, a paged pool of that many tokens; the scheduler's batch is the
  engine's slots.
- ``replay_arm`` makes ``replays`` replays: replay r replays ``trace_for(r)`` on a fresh engine
  under a fresh scheduler after ``warm_up``; the clock is ``serving.WallClock()`` (prefill, steps
  and host work take their real time, idle gaps are skipped, which changes no measured duration).
  Only the replay itself is timed (``Replayed.wall_s``); warm-ups are summed apart (``warmup_s``).
- ``warm_up`` compiles each prefill shape (rows prefilled together: each power of two up to the
  slots; prompt block: each power of two up to the longest prompt, at most the chunk), from slot
  0 and, with chunks, from later in the row. Compiled programs are cached, so a warm-up of shapes
  already compiled costs only its run time; ``once=True`` skips even that for a set of shapes this
  process has warmed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from decodelab import serving
from decodelab.checks import check_int
from decodelab.decode import bucket_length
from decodelab.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class Arm:
    """One engine shape under one policy (``serving.make_scheduler``'s names).

    ``num_slots``: rows of the engine's state (the most requests running at once, the scheduler's
    batch); ``max_len``: cache slots per request; ``steps_per_call``: decode rounds per engine
    call; ``prefill_chunk``: prompt tokens per waiting prompt per call (0: whole prompts);
    ``kv_tokens``: None for padded slots, else the tokens of the shared paged pool, in pages of
    ``page_size``; ``max_wait``: the dynamic policy's longest wait for batch-mates (seconds).
    """

    policy: str
    num_slots: int
    max_len: int
    steps_per_call: int = 1
    prefill_chunk: int = 0
    kv_tokens: int | None = None
    page_size: int = 16
    max_wait: float = 0.0

    def __post_init__(self):
        if self.policy not in serving.SCHEDULERS:
            raise ValueError(f"policy must be one of {sorted(serving.SCHEDULERS)}, got "
                             f"{self.policy!r}")
        check_int("num_slots", self.num_slots, 1)
        check_int("max_len", self.max_len, 2)
        check_int("steps_per_call", self.steps_per_call, 1)
        check_int("prefill_chunk", self.prefill_chunk, 0)

    @property
    def paged(self) -> bool:
        return self.kv_tokens is not None

    def engine(self, model) -> serving.SlotEngine:
        """A fresh engine of this shape for ``model``."""
        options = serving.EngineOptions(prefill_chunk=self.prefill_chunk or None)
        if self.paged:
            return serving.SlotEngine(model, self.num_slots, self.max_len,
                                      kv_tokens=self.kv_tokens, page_size=self.page_size,
                                      options=options)
        return serving.SlotEngine(model, self.num_slots, self.max_len, options=options)

    def scheduler(self) -> serving.Scheduler:
        return serving.make_scheduler(self.policy, self.num_slots, self.max_wait)


_WARMED: set = set()  # the shape sets ``warm_up(once=True)`` has run in this process


def warm_up(model, arm: Arm, trace: Sequence[serving.Request], *, once: bool = False) -> None:
    """Compile, before timing, every program a replay of ``trace`` on ``arm`` can run: the decode
    loop, the read-back and each prefill shape (module docstring). On paged memory a preempted
    request re-prefills its prompt and its tokens, so the blocks go up to ``max_len - 1``, and a
    batch holds one request of the block's length beside requests of one token (so that it fits
    the pool); on padded slots every request of a batch has the block's length."""
    longest = arm.max_len - 1 if arm.paged else max(len(r.prompt) for r in trace)
    chunk = arm.prefill_chunk or arm.max_len
    # what fixes the compiled shapes (not the policy: it only decides when requests go in)
    key = (repr(model.config), arm.num_slots, arm.max_len, arm.steps_per_call, arm.prefill_chunk,
           arm.kv_tokens, arm.page_size, bucket_length(longest), repr(trace[0].params))
    if once and key in _WARMED:
        return
    _WARMED.add(key)
    # block -> the longest sequence that gets it
    blocks = {min(bucket_length(n), chunk): n for n in range(1, min(longest, chunk) + 1)}
    lengths = list(blocks.values())
    if arm.prefill_chunk and longest > chunk:  # a later chunk, alone or beside first chunks
        lengths += [chunk + n for n in blocks.values() if chunk + n < arm.max_len]
    rows = bucket_length(arm.num_slots, minimum=1)  # the largest prefill block's row count
    counts = [min(1 << i, arm.num_slots) for i in range(rows.bit_length())]
    engine, params = arm.engine(model), trace[0].params
    for count in counts:
        for length in lengths:
            engine.run([serving.Request(id=i, prompt=[i % 2 + 1] * (
                1 if arm.paged and i else length), max_new_tokens=1, params=params, seed=i)
                for i in range(count)], n=arm.steps_per_call)


@dataclasses.dataclass(frozen=True)
class Replayed:
    """One timed replay: its trace, its outcome, its wall seconds and its ``values`` (the
    summary and what ``replay_arm``'s ``per_replay`` added)."""

    trace: list[serving.Request]
    result: serving.Replay
    wall_s: float
    values: dict


@dataclasses.dataclass(frozen=True)
class Replays:
    """The replays of one point, in replay order, with the warm-up seconds (all replays
    together) and the 1-minute load average before the first timed replay and after the last."""

    runs: tuple[Replayed, ...]
    warmup_s: float
    load_before: float
    load_after: float

    @property
    def first(self) -> Replayed:
        return self.runs[0]

    def per_request(self) -> dict[str, list]:
        """Replay 0's completed requests' values (``per_request_<name>`` lists, trace order)."""
        return {f"per_request_{name}": values
                for name, values in serving.per_request(self.first.result.records).items()}

    def overall(self, replayed: Sequence[str]) -> dict:
        """``warmup_s``, the load averages, ``replays`` and, for each name in ``replayed``, its
        value in every replay (``replay_<name>``, element 0 replay 0's)."""
        return {"warmup_s": self.warmup_s, "load_avg_1m_before": self.load_before,
                "load_avg_1m_after": self.load_after, "replays": len(self.runs),
                **{f"replay_{name}": [run.values[name] for run in self.runs]
                   for name in replayed}}


def replay_arm(model, arm: Arm, trace_for: Callable[[int], list[serving.Request]],
               replays: int, *, per_replay: Callable[[list[serving.Request]], dict] | None = None,
               warm_once: bool = False, status: Callable[[str], None] = lambda text: None,
               progress: bool = False) -> Replays:
    """``replays`` timed replays of ``arm`` (replay r: ``trace_for(r)``), each after
    ``warm_up(..., once=warm_once)``; ``per_replay(trace)`` adds values of each replay's trace to
    its summary (``Replayed.values``); ``status`` hears "replay r/R"."""
    check_int("replays", replays, 1)
    warmup, runs, load_before = 0.0, [], None
    for index in range(replays):
        status(f"replay {index + 1}/{replays}")
        trace = trace_for(index)
        started = time.perf_counter()
        warm_up(model, arm, trace, once=warm_once)
        warmup += time.perf_counter() - started
        if load_before is None:
            load_before = os.getloadavg()[0]
        scheduler = arm.scheduler()
        started = time.perf_counter()
        result = serving.replay(arm.engine(model), trace, scheduler,
                                steps_per_call=arm.steps_per_call, progress=progress)
        wall = time.perf_counter() - started
        extra = per_replay(trace) if per_replay is not None else {}
        runs.append(Replayed(trace, result, wall, {**result.summary, **extra}))
    return Replays(tuple(runs), warmup, load_before, os.getloadavg()[0])


def trace_lengths(trace: Sequence[serving.Request]) -> dict[str, float | int]:
    """The mean and longest prompt and output budget of ``trace``, in tokens."""
    prompts, outputs = [len(r.prompt) for r in trace], [r.max_new_tokens for r in trace]
    return {"mean_prompt_len": sum(prompts) / len(prompts), "max_prompt_len": max(prompts),
            "mean_output_len": sum(outputs) / len(outputs), "max_output_len": max(outputs)}


def static_waste_factor(outputs: Sequence[int], num_slots: int) -> float:
    """Slot-steps full static batches of ``num_slots`` spend on requests of ``outputs`` tokens in
    trace order (each row held until its batch's longest request ends) over the slot-steps the
    requests need: continuous batching's ideal gain at saturation for that trace."""
    groups = [outputs[i:i + num_slots] for i in range(0, len(outputs), num_slots)]
    return sum(max(g) * len(g) for g in groups) / sum(outputs)


def round_seconds(model, batch: int, max_len: int, params: SamplingParams, *,
                  steps_per_call: int, calls: int,
                  status: Callable[[str], None] = lambda text: None) -> dict:
    """Seconds per decode round with ``batch`` slots all running: ``calls`` timed engine calls of
    ``steps_per_call`` rounds after two untimed ones (prefill and compile), requests of a
    10-token prompt. Returns ``step_s`` (the median), ``step_s_all`` (each call's), ``batch`` and
    the 1-minute load averages before and after."""
    check_int("calls", calls, 1)
    n = steps_per_call
    budget = n * (calls + 2)
    engine = serving.SlotEngine(model, batch, max_len)
    for i in range(batch):
        engine.insert(serving.Request(id=i, prompt=[1 + i % 7] * 10, max_new_tokens=budget,
                                      params=params, seed=i))
    engine.step(n)  # prefill and compile
    engine.step(n)
    load_before = os.getloadavg()[0]
    seconds = []
    for _ in range(calls):
        status(f"step cost, batch {batch}")
        started = time.perf_counter()
        result = engine.step(n)
        seconds.append((time.perf_counter() - started) / result.rounds)
    return {"step_s": float(np.median(seconds)), "step_s_all": seconds, "batch": batch,
            "load_avg_1m_before": load_before, "load_avg_1m_after": os.getloadavg()[0]}
