"""Serving rows (``measure.replays``) -> intervals, claim quantities and tables.

A serving row keeps two kinds of units to resample:

- replays: ``replay_<name>`` lists, one value per replay (replay r of every point replays the
  same trace). A whole-replay quantity (``OVER_REPLAYS``: output tokens/s, which is one number of
  a replay, not a sum over requests, and the mean running requests) is shown as the mean over
  the replays with its 95% bootstrap interval over them; the ratio of two points is the ratio of
  their means, paired replay by replay.
- requests: ``per_request_<name>`` lists of replay 0's completed requests, trace order. A
  latency, TTFT, TPOT or longest-gap percentile (``RESAMPLED``) is shown with its interval over
  those requests; two points on the same trace are compared request by request (a paired
  bootstrap: there is no EOS, so request i is the same request under any policy) where every
  request completed in both with the same output lengths (``paired``).

Where a row cannot give an interval (one replay, no per-request lists, unpaired requests) the
plain number stands in, so a claim on it is judged as a point estimate and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.measure import stats
from decodelab.report.claims import Quantity
from decodelab.report.tables import Table, row_value, select, swept_keys, with_metrics

Row = Mapping[str, Any]
Metrics = Mapping[str, Any]
Where = Mapping[str, Any]

PER_REQUEST = ("latency_s", "ttft_s", "tpot_s", "max_tbt_s", "tokens")
OVER_REPLAYS = ("output_tokens_per_s", "mean_running")


def percentile(q: float) -> stats.Statistic:
    """The ``q``-th percentile over the last axis (``[..., n] -> [...]``) with NumPy's linear
    interpolation, as the rows' summaries compute it: a ``stats`` statistic."""

    def statistic(x: np.ndarray) -> np.ndarray:
        return np.percentile(x, q, axis=-1)

    return statistic


# metric -> (statistic, the per-request columns it takes). ``max_tbt_p99_s`` is the report's own
# (the rows' ``tbt_p99_s`` pools every gap of every request, which the rows do not keep).
RESAMPLED = {
    "latency_p50_s": (percentile(50), ("latency_s",)),
    "latency_p99_s": (percentile(99), ("latency_s",)),
    "ttft_p50_s": (percentile(50), ("ttft_s",)),
    "ttft_p99_s": (percentile(99), ("ttft_s",)),
    "tpot_p50_s": (percentile(50), ("tpot_s",)),
    "max_tbt_p99_s": (percentile(99), ("max_tbt_s",)),
}


def requests(m: Metrics) -> dict[str, np.ndarray] | None:
    """The row's per-request values, ``[n]`` each in trace order (NaN where a request has none:
    TPOT below 2 tokens, longest gap below 2 deliveries); None for a row without them."""
    if any(f"per_request_{name}" not in m for name in PER_REQUEST):
        return None
    return {name: np.array([np.nan if v is None else v for v in m[f"per_request_{name}"]],
                           np.float64) for name in PER_REQUEST}


def _kept(columns: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The columns at the requests where every column has a value."""
    keep = np.logical_and.reduce([np.isfinite(c) for c in columns])
    return tuple(c[keep] for c in columns)


def replayed(m: Metrics, name: str = "output_tokens_per_s") -> np.ndarray | None:
    """``name`` of each replay, ``[R]`` in replay order; None for a row without them (or with a
    replay that has none)."""
    values = m.get(f"replay_{name}")
    if values is None or any(v is None for v in values):
        return None
    return np.asarray(values, np.float64)


def replay_mean(m: Metrics, name: str = "output_tokens_per_s") -> stats.Interval | None:
    """The mean of ``name`` over the row's replays with its 95% interval over them; None with
    fewer than 2 replays."""
    values = replayed(m, name)
    return None if values is None or len(values) < 2 else stats.bootstrap(stats.mean, values)


def mean_over_replays(m: Metrics, name: str = "output_tokens_per_s") -> float:
    """The plain mean of ``name`` over the row's replays (replay 0's value for a row without)."""
    values = replayed(m, name)
    return float(values.mean()) if values is not None else m[name]


def replay_ratio(a: Metrics, b: Metrics, name: str = "output_tokens_per_s"
                 ) -> stats.Interval | float:
    """Mean ``name`` of row ``a`` over that of row ``b``, its interval paired by replay (replay r
    of both replays the same trace); the plain ratio of the means where the rows hold fewer than
    2 replays each, different numbers of them, or no finite ratio."""
    x, y = replayed(a, name), replayed(b, name)
    if x is not None and y is not None and len(x) == len(y) >= 2:
        try:
            return stats.bootstrap_ratio(stats.mean, x, y, paired=True)
        except ValueError:
            pass
    return mean_over_replays(a, name) / mean_over_replays(b, name)


def plain(m: Metrics, metric: str) -> float | None:
    """The row's number for ``metric``: its summary value, or for the report's own
    ``max_tbt_p99_s`` the p99 of replay 0's longest gaps."""
    if metric in m:
        return m[metric]
    units = requests(m)
    if units is None or metric not in RESAMPLED:
        return None
    kept = _kept([units[n] for n in RESAMPLED[metric][1]])[0]
    return float(np.percentile(kept, 99)) if kept.size else None


def request_interval(m: Metrics, metric: str) -> stats.Interval | None:
    """The 95% interval of percentile ``metric`` over replay 0's completed requests; None
    without per-request values or with fewer than 2 requests that have one."""
    units = requests(m)
    if units is None:
        return None
    statistic, names = RESAMPLED[metric]
    try:
        return stats.bootstrap(statistic, _kept([units[name] for name in names]))
    except ValueError:
        return None


def paired(a: Metrics, b: Metrics) -> bool:
    """Whether rows ``a`` and ``b`` can be compared request by request: both keep per-request
    values, every request completed in both, and the output lengths agree in trace order."""
    return (requests(a) is not None and requests(b) is not None
            and a["completed"] == a["requests"] and b["completed"] == b["requests"]
            and a["per_request_tokens"] == b["per_request_tokens"])


def request_difference(a: Metrics, b: Metrics, metric: str) -> stats.Interval | float | None:
    """``metric`` of row ``a`` minus that of row ``b``, paired request by request over replay 0
    (requests without a value in either row left out); the plain difference where the rows are
    not ``paired`` or fewer than 2 requests are left; None where a row has no value."""
    if paired(a, b):
        statistic, names = RESAMPLED[metric]
        units_a, units_b = requests(a), requests(b)
        columns = _kept([units_a[n] for n in names] + [units_b[n] for n in names])
        try:
            return stats.bootstrap_difference(statistic, columns[:len(names)],
                                              columns[len(names):], paired=True)
        except ValueError:
            pass
    x, y = plain(a, metric), plain(b, metric)
    return None if x is None or y is None else x - y


def shown(m: Metrics, metric: str) -> stats.Interval | float | None:
    """``metric`` as a page shows it: a whole-replay quantity as the mean over replays (with its
    interval where there are 2 or more), a percentile with its interval over requests where the
    row allows one, anything else (or a row without those units) as the row's plain number."""
    if metric in OVER_REPLAYS and metric in m:
        found = replay_mean(m, metric)
        return found if found is not None else mean_over_replays(m, metric)
    if metric in RESAMPLED:
        found = request_interval(m, metric)
        return found if found is not None else plain(m, metric)
    return m.get(metric)


def with_intervals(row: Row, metrics: Sequence[str]) -> dict:
    """A copy of ``row`` whose ``metrics`` are replaced by what ``shown`` gives."""
    return with_metrics(row, **{name: shown(row["metrics"], name) for name in metrics})


def top(rows: Sequence[Row], where: Where, key: str = "trace.rate") -> list[Row]:
    """The rows matching ``where`` at the largest value of ``key`` among them (saturation, for the
    arrival rate)."""
    chosen = select(rows, dict(where))
    if not chosen:
        return []
    peak = max(row_value(r, key) for r in chosen)
    return [r for r in chosen if row_value(r, key) == peak]


def _pair(rows: Sequence[Row], a: Where, b: Where) -> tuple[Metrics, Metrics] | None:
    """The metrics of the one row matching ``a`` and of the one matching ``b``, both at the
    largest arrival rate the rows matching ``a`` reach; None where either is missing."""
    first = top(rows, a)
    if len(first) != 1:
        return None
    second = select(rows, {**b, "trace.rate": row_value(first[0], "trace.rate")})
    return (first[0]["metrics"], second[0]["metrics"]) if len(second) == 1 else None


def ratio_at_top(a: Where, b: Where, metric: str = "output_tokens_per_s") -> Quantity:
    """A claim quantity: ``replay_ratio`` of the row matching ``a`` over the row matching ``b``,
    at the largest arrival rate of ``a``'s rows (dotted config keys)."""

    def quantity(rows: Sequence[Row]) -> stats.Interval | float | None:
        found = _pair(rows, a, b)
        return None if found is None else replay_ratio(*found, metric)

    return quantity


def difference_at_top(a: Where, b: Where, metric: str) -> Quantity:
    """A claim quantity: ``request_difference`` of ``metric``, row ``a`` minus row ``b``, at the
    largest arrival rate of ``a``'s rows."""

    def quantity(rows: Sequence[Row]) -> stats.Interval | float | None:
        found = _pair(rows, a, b)
        return None if found is None else request_difference(*found, metric)

    return quantity


def interval_table(rows: Sequence[Row], metrics: Mapping[str, str],
                   label: Callable[[Row], str] | None = None, label_column: str = "point"
                   ) -> Table:
    """One line per row: its ``label`` (or, without one, its swept keys), then each of
    ``metrics`` (column header -> metric) as ``shown``; a CSV gives each interval's bounds."""
    keys = [] if label is not None else swept_keys(rows)
    columns = ([label_column] if label is not None else keys) + list(metrics)
    body = [([label(r)] if label is not None else [row_value(r, k) for k in keys])
            + [shown(r["metrics"], metric) for metric in metrics.values()] for r in rows]
    return Table(columns, body)


def replay_count(rows: Sequence[Row]) -> str:
    """How many replays the rows' whole-replay values are the mean of: "one replay", "mean of 5
    replays", or "mean of 1 to 5 replays"."""
    counts = {1 if replayed(r["metrics"]) is None else len(replayed(r["metrics"])) for r in rows}
    if counts == {1}:
        return "one replay"
    if len(counts) == 1:
        return f"mean of {counts.pop()} replays"
    return f"mean of {min(counts)} to {max(counts)} replays"


def loads(rows: Sequence[Row]) -> str:
    """The 1-minute load average at the start of the points, ``"1.0 to 1.8 on 2 CPUs"``."""
    values = [r["metrics"]["load_avg_1m_before"] for r in rows
              if r["metrics"].get("load_avg_1m_before") is not None]
    cpus = rows[0].get("provenance", {}).get("cpu_count")
    span = f"{min(values):.1f} to {max(values):.1f}" if values else "not recorded"
    return f"{span} on {cpus} CPUs"


def method(rows: Sequence[Row]) -> list[str]:
    """The method lines every serving page shares: the clock, the definitions, the intervals."""
    return [
        "Wall clock, idle gaps skipped (`serving.WallClock`). TTFT = first token - arrival; "
        "throughput = output tokens / makespan; occupancy = busy slot-seconds / (slots x "
        "makespan); longest gap = a request's longest time between two engine calls that gave "
        "it tokens.",
        f"Output tokens/s and mean running requests: the {replay_count(rows)} (replay r replays "
        "trace seed + r at every point), 95% bootstrap interval over replays; a ratio of means is "
        "paired replay by replay.",
        "Percentiles: replay 0, 95% bootstrap interval over its completed requests; differences "
        "paired request by request (the same trace). Saturation: the largest arrival rate."]


def caveats(rows: Sequence[Row]) -> list[str]:
    """The caveats every serving page shares: how coarse its intervals are, and the load."""
    return [
        f"With the {replay_count(rows)} the bootstrap over replays is coarse (its bounds lie "
        "within the smallest and largest replay): a verdict that barely clears its threshold is "
        "weak.",
        "A p99 over one replay's requests interpolates between the largest values (its upper "
        "bound is at most the largest measured); request intervals hold no run-to-run noise.",
        f"Shared machine: 1-minute load average {loads(rows)} at the start of the points."]
