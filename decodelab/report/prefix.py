"""The prefix-sharing study's page parts: its main table, the quantities its claims judge and
the roofline prediction, from the rows of ``experiments/prefix.py`` (one row per workload, n and
sharing; ``measure.prefix_sharing`` holds what each metric means)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.measure import stats
from decodelab.measure.prefix_sharing import prefill_seconds
from decodelab.measure.stats import Interval
from decodelab.report.tables import Table

Rows = Sequence[Mapping[str, Any]]


def find(rows: Rows, workload: str, sharing: bool | None = None, n: int | None = None
         ) -> Mapping[str, Any] | None:
    """The metrics of the row of ``workload`` (and ``sharing``, ``n`` where given), or None."""
    for row in rows:
        c = row["config"]
        if c["workload"] == workload and sharing in (None, c["sharing"]) and n in (None, c["n"]):
            return row["metrics"]
    return None


def mean_interval(values: Sequence[float]) -> Interval | float:
    """The mean of per-repetition ``values`` with its bootstrap interval (one value: itself)."""
    return stats.bootstrap(stats.mean, values) if len(values) > 1 else float(values[0])


def prefill_ratio(n: int, key: str = "prefill_tokens"):
    """The claim quantity: the passk workload's ``key`` at ``n`` with sharing over without (a
    deterministic count for prefill tokens; for measured seconds, an interval over reps)."""
    def quantity(rows: Rows):
        shared, separate = find(rows, "passk", True, n), find(rows, "passk", False, n)
        if shared is None or separate is None:
            return None
        if key == "prefill_tokens":
            return shared[key] / separate[key]
        return stats.bootstrap_ratio(stats.mean, shared[key], separate[key])
    return quantity


def hit_over_miss(rows: Rows) -> Interval | None:
    """Time to first token of a hit over a miss of the system prompt, over reps."""
    hit = find(rows, "hit")
    if hit is None:
        return None
    return stats.bootstrap_ratio(stats.mean, hit["hit_ttft_s"], hit["miss_ttft_s"])


def gpu_prefill_ratio(rows: Rows) -> float | None:
    """The roofline's prediction: prefill seconds of the GPU config's requests prefilled as one
    batch, sharing the system prompt (one pass of it, then one of every question) over each
    prefilling its whole prompt (one pass of them all)."""
    if not rows:
        return None
    c = rows[0]["config"]
    g, count = c["gpu"], c["gpu"]["requests"]
    def seconds(tokens):
        return prefill_seconds(g["params"], tokens, g["bandwidth"], g["flops"])
    shared = seconds(c["system"]) + seconds(count * c["question"])
    return shared / seconds(count * (c["system"] + c["question"]))


def main_table(rows: Rows) -> Table:
    """One line per point: workload, n, sharing, prefill tokens, peak pool pages, time to first
    token and output tokens/s (means over reps with their intervals)."""
    lines = []
    for row in rows:
        c, m = row["config"], row["metrics"]
        if c["workload"] == "hit":
            lines += [[f"system prompt {kind}", 1, "prefix cache", m[f"{kind}_prefill_tokens"],
                       None, mean_interval(m[f"{kind}_ttft_s"]), None] for kind in ("miss", "hit")]
            continue
        lines.append([c["workload"], c["n"] if c["workload"] == "passk" else c["num_requests"],
                      "shared" if c["sharing"] else "separate", m["prefill_tokens"],
                      m["peak_pages"], mean_interval(m["rep_ttft_s"]),
                      mean_interval(m["rep_output_tokens_per_s"])])
    return Table(["workload", "samples or requests", "sharing", "prefill tokens",
                  "peak pool pages", "time to first token (s)", "output tokens/s"], lines)
