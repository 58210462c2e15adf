"""Schedulers (static, dynamic, continuous) over one SlotEngine, and ``replay``, which plays a
trace through an engine under a scheduler and a clock.

A scheduler answers one question, asked before every engine step: how many of the waiting requests
(first come, first served) go into free slots now? Everything else (arrivals, rejections, prefill,
stepping, retiring, timing) is the same replay loop for every policy, so policies differ only in
that answer:

- ``Static(batch_size)``: when the engine is idle and ``batch_size`` requests wait, insert them all;
  the batch runs until its last request finishes. A final partial batch starts once no more
  requests will arrive.
- ``Dynamic(max_batch_size, max_wait)``: when the engine is idle, insert up to ``max_batch_size``
  as soon as that many wait or the oldest has waited ``max_wait`` seconds; run until the batch
  finishes.
- ``Continuous()``: fill every free slot at every step (iteration-level scheduling, as in Orca).

Every policy inserts at most ``engine.room(waiting)`` requests: the free slots and, on paged
memory, the requests whose pages fit. Batch sizes count slots: a request of ``n`` samples takes
``n`` (one larger than a batch runs as a batch of its own); a replay keeps one record per
sample. A request the engine preempts (paged memory out of pages) goes back to the head of the
queue, with those of its samples that were running.

Clocks (``Clock``): ``WallClock`` reads ``time.perf_counter``; prefill, steps and all host work
take their real time. While the engine is idle and the next event (an arrival, a scheduler's
deadline) is in the future, ``WallClock(skip_idle=False)`` sleeps until it; ``skip_idle=True`` (the
default) jumps the clock there instead, which shortens a replay by the idle time without changing
any measured duration of work. ``VirtualClock(step_s)`` reads no timer: it jumps to each event and
charges every engine call exactly ``step_s`` seconds, so a replay's times are a pure function of
the trace, the policy and the number of engine calls (what tests of a policy need).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import time
from collections.abc import Sequence
from typing import ClassVar

from tqdm.auto import tqdm

from decodelab.serving.engine import SlotEngine
from decodelab.serving.samples import fitting
from decodelab.serving.metrics import RequestRecord, summarize
from decodelab.serving.requests import Request


def _batch(waiting: Sequence[Request], size: int) -> int:
    """Requests from the head of ``waiting`` in a batch of ``size`` slots (at least one)."""
    return max(fitting((r.n for r in waiting), size), 1)


def _check_slots(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class Scheduler(abc.ABC):
    """How many waiting requests to insert now."""

    name: ClassVar[str]

    @abc.abstractmethod
    def admit(self, now: float, waiting: Sequence[Request], engine: SlotEngine,
              more_coming: bool) -> int:
        """The number of requests, from the head of ``waiting``, to insert now (<= free slots)."""

    def deadline(self, waiting: Sequence[Request]) -> float | None:
        """A time at which ``admit`` may say yes without a new arrival (None: only arrivals)."""
        return None


@dataclasses.dataclass(frozen=True)
class Static(Scheduler):
    name: ClassVar[str] = "static"
    batch_size: int

    def __post_init__(self):
        _check_slots("batch_size", self.batch_size)

    def admit(self, now, waiting, engine, more_coming):
        if engine.active or not waiting:
            return 0
        size = min(self.batch_size, engine.num_slots)
        if sum(r.n for r in waiting) >= size or not more_coming:
            return min(_batch(waiting, size), engine.room(waiting))
        return 0


@dataclasses.dataclass(frozen=True)
class Dynamic(Scheduler):
    name: ClassVar[str] = "dynamic"
    max_batch_size: int
    max_wait: float  # seconds the oldest waiting request may wait for batch-mates

    def __post_init__(self):
        _check_slots("max_batch_size", self.max_batch_size)
        if isinstance(self.max_wait, bool) or not isinstance(self.max_wait, (int, float)) or not (
                0 <= self.max_wait < float("inf")):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, got "
                             f"{self.max_wait!r}")

    def admit(self, now, waiting, engine, more_coming):
        if engine.active or not waiting:
            return 0
        size = min(self.max_batch_size, engine.num_slots)
        if (sum(r.n for r in waiting) >= size or now >= waiting[0].arrival + self.max_wait
                or not more_coming):
            return min(_batch(waiting, size), engine.room(waiting))
        return 0

    def deadline(self, waiting):
        return waiting[0].arrival + self.max_wait if waiting else None


@dataclasses.dataclass(frozen=True)
class Continuous(Scheduler):
    name: ClassVar[str] = "continuous"

    def admit(self, now, waiting, engine, more_coming):
        return engine.room(waiting)


SCHEDULERS: dict[str, type[Scheduler]] = {cls.name: cls for cls in (Static, Dynamic, Continuous)}


def make_scheduler(name: str, num_slots: int, max_wait: float = 0.0) -> Scheduler:
    """The policy ``name`` with batches of up to ``num_slots`` (``max_wait`` for dynamic only)."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {sorted(SCHEDULERS)}, got {name!r}")
    _check_slots("num_slots", num_slots)
    return {"static": lambda: Static(num_slots), "dynamic": lambda: Dynamic(num_slots, max_wait),
            "continuous": Continuous}[name]()


class Clock(abc.ABC):
    """Seconds since ``start()``, as the replay loop sees them."""

    @abc.abstractmethod
    def start(self) -> None:
        """Set the time to 0 (and the skipped idle time to 0)."""

    @abc.abstractmethod
    def now(self) -> float:
        """The current time in seconds since ``start()``."""

    @abc.abstractmethod
    def wait_until(self, t: float) -> None:
        """Return at time ``t`` or later (at once if ``t`` has passed)."""

    def after_step(self) -> None:
        """Called after each engine call: a clock that models work charges its cost here."""

    @property
    @abc.abstractmethod
    def skipped(self) -> float:
        """Idle seconds jumped over since ``start()``."""


class WallClock(Clock):
    """Seconds since ``start``, by ``time.perf_counter``; see the module doc for ``skip_idle``."""

    def __init__(self, skip_idle: bool = True):
        self.skip_idle = skip_idle
        self._start = time.perf_counter()
        self._skipped = 0.0

    @property
    def skipped(self) -> float:
        return self._skipped

    def start(self) -> None:
        self._start, self._skipped = time.perf_counter(), 0.0

    def now(self) -> float:
        return time.perf_counter() - self._start + self._skipped

    def wait_until(self, t: float) -> None:
        gap = t - self.now()
        if gap <= 0:
            return
        if self.skip_idle:
            self._skipped += gap
        else:
            time.sleep(gap)


class VirtualClock(Clock):
    """A clock that reads no timer: it stands still while the host works, jumps to each event the
    replay waits for, and advances exactly ``step_s`` seconds per engine call."""

    def __init__(self, step_s: float = 1.0):
        if isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or not (
                0 <= step_s < float("inf")):
            raise ValueError(f"step_s must be a finite number of seconds >= 0, got {step_s!r}")
        self.step_s = float(step_s)
        self._now = self._skipped = 0.0

    @property
    def skipped(self) -> float:
        return self._skipped

    def start(self) -> None:
        self._now = self._skipped = 0.0

    def now(self) -> float:
        return self._now

    def wait_until(self, t: float) -> None:
        if t > self._now:
            self._skipped += t - self._now
            self._now = t

    def after_step(self) -> None:
        self._now += self.step_s


@dataclasses.dataclass
class Replay:
    """The outcome of ``replay``: one record per request (trace order) and the summary."""

    records: list[RequestRecord]
    summary: dict
    steps: int  # engine calls
    idle_skipped_s: float  # idle time the clock jumped over (0 with skip_idle=False)


def replay(engine: SlotEngine, trace: Sequence[Request], scheduler: Scheduler, *,
           clock: Clock | None = None, steps_per_call: int = 1,
           progress: bool = False) -> Replay:
    """Play ``trace`` through ``engine`` under ``scheduler``: requests arrive at their times,
    wait in a first-come-first-served queue, are inserted when the scheduler says so and retire
    when finished. A request the engine can never serve (``engine.check``) is rejected with an
    error record at its arrival; every request ends "completed" or "rejected". A request of
    ``n`` samples has a record per sample, in trace order (``RequestRecord.sample``; keyed as
    ``requests.sample_key``), its first sample's slot in each. ``clock`` is a
    ``WallClock()`` unless given (``VirtualClock`` for times that do not depend on the machine)."""
    if not isinstance(engine, SlotEngine):
        raise ValueError(f"engine must be a SlotEngine, got {engine!r}")
    if not isinstance(scheduler, Scheduler):
        raise ValueError(f"scheduler must be a Scheduler, got {scheduler!r}")
    _check_slots("steps_per_call", steps_per_call)
    if engine.active:
        raise ValueError(f"engine must be idle at the start of a replay, got "
                         f"{len(engine.active)} active slots")
    if len({r.id for r in trace}) != len(trace):
        raise ValueError("trace request ids must be unique")
    if clock is not None and not isinstance(clock, Clock):
        raise ValueError(f"clock must be a Clock (WallClock, VirtualClock), got {clock!r}")
    clock = clock or WallClock()
    pending = collections.deque(sorted(trace, key=lambda r: r.arrival))
    records = {k: RequestRecord(r.id, r.arrival, sample=i) for r in trace
               for i, k in enumerate(r.keys)}
    waiting: collections.deque[Request] = collections.deque()
    busy_slot_seconds = busy_page_seconds = 0.0
    steps = 0
    bar = tqdm(total=len(records), desc=f"{scheduler.name} replay", unit="req",
               disable=not progress, dynamic_ncols=True, leave=False)
    clock.start()
    with bar:
        while pending or waiting or engine.active:
            now = clock.now()
            while pending and pending[0].arrival <= now:
                request = pending.popleft()
                reason = engine.check(request)
                if reason:
                    for key in request.keys:
                        record = records[key]
                        record.status, record.error, record.finish = "rejected", reason, now
                        bar.update(1)
                else:
                    waiting.append(request)
            for _ in range(scheduler.admit(now, waiting, engine, bool(pending))):
                request = waiting.popleft()
                slot, admitted = engine.insert(request), clock.now()
                for record in (records[k] for k in request.keys):
                    if record.status == "completed":  # finished before its request's preemption
                        continue
                    if record.admitted is None:  # first admission (a preempted request returns)
                        record.admitted = admitted
                    record.status, record.slot = "running", slot
            if engine.active:
                active, started = len(engine.active), clock.now()
                pages = engine.pool.used if engine.pool is not None else 0
                result = engine.step(steps_per_call)
                clock.after_step()
                ended = clock.now()
                steps += 1
                busy_slot_seconds += active * (ended - started)
                busy_page_seconds += pages * (ended - started)
                for request_id, tokens in result.tokens.items():
                    record = records[request_id]
                    if tokens:
                        record.deliveries.append(ended)
                        if record.first_token is None:
                            record.first_token = ended
                for request in reversed(result.preempted):  # first in line again
                    for record in (records[k] for k in request.keys):
                        if record.status == "running":
                            record.preemptions += 1
                            record.status = "waiting"
                    waiting.appendleft(request)
                for completion in result.finished:
                    record = records[completion.key]
                    record.status, record.finish = "completed", ended
                    record.tokens = completion.tokens
                    record.finish_reason = completion.finish_reason
                    bar.update(1)
                bar.set_postfix(active=len(engine.active), waiting=len(waiting), refresh=False)
                continue
            events = [t for t in (pending[0].arrival if pending else None,
                                  scheduler.deadline(waiting)) if t is not None]
            if not events:
                raise RuntimeError(f"scheduler {scheduler!r} admits none of {len(waiting)} "
                                   "waiting requests and nothing else will happen")
            clock.wait_until(min(events))
    ordered = [records[k] for r in trace for k in r.keys]
    summary = summarize(ordered, engine.num_slots, busy_slot_seconds)
    if engine.pool is not None:
        summary["page_occupancy"] = busy_page_seconds / (engine.pool.num_pages *
                                                         summary["makespan_s"])
    return Replay(ordered, summary, steps, clock.skipped)
