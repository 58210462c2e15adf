"""The paged-memory study's rows -> its decomposition, step costs and roofline prediction.

Arms (``config.arm``) at one KV memory budget: (a) ``static`` and (b) ``continuous`` on padded
slots, (c) ``paged`` continuous batching; ``step`` points time a decode round at a batch size.
At the largest arrival rate (saturation) and each ``max_len``, paged continuous over static (c /
a) splits into scheduling (b / a) and memory (c / b), each an output tokens/s ratio of means over
replays, paired replay by replay (``serving_rows.replay_ratio``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.decode import bucket_length
from decodelab.measure import stats
from decodelab.measure.paged_roofline import FULL_POOL, Benchmark, roofline_prediction
from decodelab.report.claims import Quantity
from decodelab.report.serving_rows import replay_ratio, top
from decodelab.report.tables import Table, format_value, select

Row = Mapping[str, Any]


def arm_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r["config"]["arm"] != "step"]


def step_seconds(rows: Sequence[Row]) -> dict[int, float]:
    """Batch -> median seconds per decode round, from the ``step`` points."""
    return {r["config"]["step_batch"]: r["metrics"]["step_s"]
            for r in rows if r["config"]["arm"] == "step"}


def interpolated(steps: Mapping[int, float], batch: float) -> float | None:
    """Seconds per round at ``batch``, linear between the measured batches; None without any."""
    if not steps:
        return None
    xs = sorted(steps)
    return float(np.interp(batch, xs, [steps[x] for x in xs]))


@dataclasses.dataclass(frozen=True)
class Decomposed:
    """One ``max_len`` at saturation: the three arms' metrics and the ratios between them
    (Intervals paired by replay, or plain ratios where the rows have no interval)."""

    max_len: int
    a: Mapping[str, Any]
    b: Mapping[str, Any]
    c: Mapping[str, Any]
    scheduling: stats.Interval | float
    memory: stats.Interval | float
    total: stats.Interval | float
    running: stats.Interval | float
    step_cost: float | None  # seconds per round at (c)'s mean running over that at (b)'s

    @property
    def ratio(self) -> float:
        """The reservation ratio: ``max_len`` over the trace's mean request length."""
        return self.c["reservation_ratio"]


def decomposition(rows: Sequence[Row]) -> list[Decomposed]:
    """Each ``max_len`` that has all three arms at the largest arrival rate, ascending."""
    arms = top(arm_rows(rows), {})
    steps = step_seconds(rows)
    out = []
    for max_len in sorted({r["config"]["max_len"] for r in arms}):
        found = [select(arms, {"arm": arm, "max_len": max_len})
                 for arm in ("static", "continuous", "paged")]
        if not all(found):
            continue
        a, b, c = (f[0]["metrics"] for f in found)
        step_b = interpolated(steps, b["mean_running"])
        cost = None if step_b is None else interpolated(steps, c["mean_running"]) / step_b
        out.append(Decomposed(max_len, a, b, c, replay_ratio(b, a), replay_ratio(c, b),
                              replay_ratio(c, a), replay_ratio(c, b, "mean_running"), cost))
    return out


def nearest(rows: Sequence[Row], ratio: float) -> Decomposed | None:
    """The decomposition at the measured reservation ratio nearest ``ratio``."""
    found = decomposition(rows)
    return min(found, key=lambda d: abs(d.ratio - ratio)) if found else None


def decomposition_table(rows: Sequence[Row], *, every_column: bool = False) -> Table:
    """The decomposition at saturation, one line per ``max_len``: the main table (7 columns) or,
    with ``every_column``, also the padded slots, each arm's mean running requests and (c)'s
    preemptions in replay 0."""
    columns = ["max_len", "reservation ratio", "scheduling (b / a)", "memory (c / b)",
               "paged / static (c / a)", "running requests (c / b)", "step cost (c / b)"]
    extra = ["padded slots", "mean running (b)", "mean running (c)", "preemptions (c, replay 0)"]
    body = []
    for d in decomposition(rows):
        line = [d.max_len, d.ratio, d.scheduling, d.memory, d.total, d.running, d.step_cost]
        if every_column:
            line += [d.b["slots"], d.b["mean_running"], d.c["mean_running"], d.c["preemptions"]]
        body.append(line)
    return Table(columns + (extra if every_column else []), body)


def steps_table(rows: Sequence[Row]) -> Table:
    """What a bigger batch costs per decode round here, from the ``step`` points."""
    return Table(["batch", "seconds per decode round", "tokens/s"],
                 [[b, s, b / s] for b, s in sorted(step_seconds(rows).items())])


def _benchmark(rows: Sequence[Row]) -> Benchmark:
    return Benchmark(**rows[0]["config"]["published"])


def predictions(rows: Sequence[Row]) -> list[dict[str, float]]:
    """The decomposition predicted for the published benchmark at a few assumed mean outputs
    (its own and 128 and 512 tokens): each with the pool occupancy measured by the paged arm at
    saturation nearest its reservation ratio, and with the pool ``FULL_POOL`` full (``full_*``).
    Empty without a paged row that measured its occupancy."""
    benchmark = _benchmark(rows)
    paged = [r for r in top(arm_rows(rows), {}) if r["config"]["arm"] == "paged"
             and r["metrics"].get("page_occupancy") is not None]
    out = []
    for mean_output in sorted({benchmark.mean_output, 128.0, 512.0}) if paged else ():
        ratio = benchmark.reservation_ratio(mean_output)
        near = min(paged, key=lambda r: abs(r["metrics"]["reservation_ratio"] - ratio))
        occupancy = near["metrics"]["page_occupancy"]
        measured = roofline_prediction(benchmark, mean_output, occupancy)
        full = roofline_prediction(benchmark, mean_output, FULL_POOL)
        out.append({"mean_output": mean_output, "occupancy": occupancy, **measured,
                    **{f"full_{k}": v for k, v in full.items()}})
    return out


def predicted_total(rows: Sequence[Row]) -> float | None:
    """The largest gain scheduling times memory predicts for the published benchmark."""
    found = predictions(rows)
    return max(max(p["product"], p["full_product"]) for p in found) if found else None


def predictions_table(rows: Sequence[Row]) -> Table:
    return Table(["mean output (assumed)", "reservation ratio", "pool occupancy (measured here)",
                  "padded batch", "paged batch", "scheduling", "memory", "predicted total",
                  f"paged batch, pool {FULL_POOL:.0%} full", "memory, full pool",
                  "predicted total, full pool"],
                 [[p["mean_output"], p["ratio"], p["occupancy"], p["padded_batch"],
                   p["paged_batch"], p["scheduling"], p["memory"], p["product"],
                   p["full_paged_batch"], p["full_memory"], p["full_product"]]
                  for p in predictions(rows)])


def memory_reading(rows: Sequence[Row], ratio: float = 8.0) -> str | None:
    """Why (c)'s extra requests bought (or did not buy) throughput over (b) at the reservation
    ratio nearest ``ratio``: the rounds alone cap each arm's output tokens/s at its mean running
    requests over the seconds a round of the rows it decodes costs (the `step` points,
    interpolated): (b) decodes all its padded slots, (c) its occupied slots rounded up to a power
    of two (as ``SlotEngine`` does); and how full (c)'s pool ran. None without `step` points."""
    steps, d = step_seconds(rows), nearest(rows, ratio)
    if d is None or not steps:
        return None
    b, c = d.b, d.c
    config = next(r["config"] for r in rows if r["config"]["arm"] == "paged")
    bucket = bucket_length(max(math.ceil(c["mean_running"]), 1), minimum=1)
    step_b, step_c = interpolated(steps, b["slots"]), interpolated(steps, bucket)
    cap_b, cap_c = b["mean_running"] / step_b, c["mean_running"] / step_c
    capacity = config["memory_tokens"] / c["mean_request_len"]
    n = format_value
    return (f"At reservation ratio {n(d.ratio)} (c) ran {n(c['mean_running'])} requests at once "
            f"against (b)'s {n(b['mean_running'])}, but a round costs more at a bigger batch on "
            f"this CPU: (c) decodes its occupied slots rounded up to a power of two ({bucket} rows "
            f"at its mean of {n(c['mean_running'])} running, {n(1e3 * step_c)} ms a round), (b) "
            f"all its {b['slots']} slots ({n(1e3 * step_b)} ms), so the rounds alone cap (b) at "
            f"{n(cap_b)} and (c) at {n(cap_c)} output tokens/s ({n(cap_c / cap_b)}x); and (c)'s "
            f"pool, room for ~{n(capacity)} requests of the trace's mean length, ran "
            f"{n(c['page_occupancy'])} full over a trace that fills and drains it.")


def at_ratio(ratio: float, factor: str) -> Quantity:
    """A claim quantity: ``factor`` (a ``Decomposed`` field: scheduling, memory, total, running)
    at the measured reservation ratio nearest ``ratio``; None without a complete one."""

    def quantity(rows: Sequence[Row]) -> stats.Interval | float | None:
        found = nearest(rows, ratio)
        return None if found is None else getattr(found, factor)

    return quantity
