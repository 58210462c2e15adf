"""Per-request timings of a replayed trace and their summary.

Conventions (times in seconds on the replay's clock, measured from the start of the trace):

- TTFT (time to first token) = first-token time - arrival: it includes the wait in the queue and
  the prefill. A token's time is the end of the engine call that produced it (host round trip
  included), so with ``steps_per_call = n`` tokens are seen in groups of up to n.
- Latency (end to end) = finish time - arrival.
- TPOT (time per output token) = (latency - TTFT) / (tokens - 1), over requests with >= 2 tokens.
- Time between tokens (TBT): the gap between two consecutive engine calls that gave a request
  tokens, i.e. the stall a streaming client sees (a call that gives n tokens is one delivery).
  The summary pools every gap of every request; each request's longest gap is its ``max_tbt``.
- A request of n samples (``Request.n``) has a record per sample, each counted as a request.
- Output tokens/s and requests/s are totals over the makespan: from the first arrival to the last
  finish. Slot occupancy = slot-seconds spent decoding a request / (slots x makespan); the mean
  number of running requests = those slot-seconds / makespan.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class RequestRecord:
    """What happened to one request of a trace."""

    request_id: int | str
    arrival: float
    sample: int = 0  # which of its request's samples (one record each)
    status: str = "waiting"  # "completed" | "rejected" (or "waiting" / "running" mid-replay)
    error: str = ""  # why it was rejected
    admitted: float | None = None  # inserted into a slot (prefill started)
    first_token: float | None = None
    finish: float | None = None  # completed or rejected
    slot: int | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str = ""
    deliveries: list[float] = dataclasses.field(default_factory=list)  # times tokens arrived
    preemptions: int = 0  # times it was taken out of its slot for lack of pages (paged memory)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def latency(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        n = len(self.tokens)
        if self.status != "completed" or n < 2:
            return None
        return (self.latency - self.ttft) / (n - 1)


    @property
    def gaps(self) -> list[float]:
        """Times between consecutive deliveries of tokens (TBT), in order."""
        return [b - a for a, b in zip(self.deliveries, self.deliveries[1:])]

    @property
    def max_tbt(self) -> float | None:
        return max(self.gaps, default=None)


def per_request(records: list[RequestRecord]) -> dict[str, list]:
    """The completed requests' values, one list per quantity in trace order (what a bootstrap
    over requests resamples): latency, TTFT, TPOT (None below 2 tokens), longest TBT (None
    below 2 deliveries), output tokens."""
    done = [r for r in records if r.status == "completed"]
    return {"latency_s": [r.latency for r in done], "ttft_s": [r.ttft for r in done],
            "tpot_s": [r.tpot for r in done], "max_tbt_s": [r.max_tbt for r in done],
            "tokens": [len(r.tokens) for r in done]}


def _percentiles(prefix: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}_p{q}_s": None for q in (50, 90, 99)} | {f"{prefix}_mean_s": None}
    array = np.asarray(values, np.float64)
    out = {f"{prefix}_p{q}_s": float(np.percentile(array, q)) for q in (50, 90, 99)}
    out[f"{prefix}_mean_s"] = float(array.mean())
    return out


def summarize(records: list[RequestRecord], num_slots: int, busy_slot_seconds: float
              ) -> dict[str, float | int | None]:
    """Throughput, latency percentiles and occupancy of a finished replay (see module doc)."""
    done = [r for r in records if r.status == "completed"]
    rejected = [r for r in records if r.status == "rejected"]
    if len(done) + len(rejected) != len(records):
        raise ValueError("every request must end completed or rejected before summarizing, got "
                         f"{len(records) - len(done) - len(rejected)} unfinished")
    start = min((r.arrival for r in records), default=0.0)
    end = max((r.finish for r in records), default=start)
    makespan = max(end - start, 1e-12)
    tokens = sum(len(r.tokens) for r in done)
    out = {
        "requests": len(records),
        "completed": len(done),
        "rejected": len(rejected),
        "output_tokens": tokens,
        "makespan_s": makespan,
        "output_tokens_per_s": tokens / makespan,
        "requests_per_s": len(done) / makespan,
        "slot_occupancy": busy_slot_seconds / (num_slots * makespan),
        "mean_running": busy_slot_seconds / makespan,
        "preemptions": sum(r.preemptions for r in records),
    }
    out |= _percentiles("ttft", [r.ttft for r in done])
    out |= _percentiles("tpot", [r.tpot for r in done if r.tpot is not None])
    out |= _percentiles("tbt", [gap for r in done for gap in r.gaps])
    out |= _percentiles("latency", [r.latency for r in done])
    out |= _percentiles("queue", [r.admitted - r.arrival for r in done])
    return out
