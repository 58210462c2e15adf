"""The speculative-decoding study's rows (``measure.speculation``) as the page reads them: each
number with its interval where the row keeps per-unit values, the best gamma of each drafter,
batch and temperature, the tables, and the quantities its claims judge.

Intervals are 95% percentile bootstraps (``measure.stats``): alpha and tokens per call over the
prompts (a ratio of sums, as the row's number is; the prompt is the unit at every batch size);
the speed-up over the timed batches, each batch's target and speculative seconds drawn together;
measured / predicted, the speed-up's interval over the prediction, taken as fixed. A row without
the per-unit values (an earlier version of the study), or whose prompts ran as one batch, gives
the plain number (``no_interval`` says why). A ``Pick`` chooses the rows of one page (one target,
one drafter seed) from all the rows, so that the claims' quantities read all rows as
``report.render`` passes them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.measure.stats import Interval, bootstrap, bootstrap_difference, ratio_of_sums
from decodelab.report.tables import Table

Rows = Sequence[Mapping[str, Any]]
Pick = Callable[[Rows], Rows]

DRAFTER_LABELS = {"draft": "draft (trained)", "distilled": "draft (distilled)",
                  "ngram": "prompt lookup"}
NO_UNITS = "the row keeps no per-prompt values, written by an earlier version of the study"
# How alpha and tokens per call are recomputed from a row's per-prompt counts (ratio of sums).
RESAMPLED = {"alpha": ("accepted_per_prompt", "tested_per_prompt"),
             "tokens_per_call": ("generated_per_prompt", "rounds_per_prompt")}


def metric(row: Mapping[str, Any], name: str) -> Any:
    return row["metrics"][name]


def where(rows: Rows, **conditions: Any) -> list:
    """The rows whose metric (or, where it is no metric, config field) equals each condition."""
    return [r for r in rows if all(metric(r, k) == v if k in r["metrics"] else r["config"][k] == v
                                   for k, v in conditions.items())]


def values(rows: Rows, field: str) -> list:
    """The distinct values of a config field over ``rows``, ascending."""
    return sorted({r["config"][field] for r in rows})


def draft_seed(row: Mapping[str, Any]) -> int:
    """The training seed of the row's model drafter (0 for prompt lookup): rows of another seed
    than 0 are the distillation claim's second seed, kept out of the grids and best tables."""
    config = row["config"]
    field = {"draft": ("draft", "train"), "distilled": ("distill_train",)}.get(config["drafter"])
    if field is None:
        return 0
    section = config
    for key in field:
        section = section[key]
    return section["seed"]


def pretrained_target(row: Mapping[str, Any]) -> str | None:
    """The pretrained preset a row's target is (None: a model trained here)."""
    return row["config"]["target"]["model"].get("pretrained")


def per_prompt_counts(row: Mapping[str, Any], name: str) -> tuple[np.ndarray, ...] | None:
    """The per-prompt (numerator, denominator) counts of ``name`` (``RESAMPLED``), or None."""
    m = row["metrics"]
    if m.get(name) is None or any(len(m.get(k) or ()) < 2 for k in RESAMPLED[name]):
        return None
    return tuple(np.asarray(m[k], np.float64) for k in RESAMPLED[name])


def rate(row: Mapping[str, Any], name: str) -> Interval | None:
    """alpha (accepted / tested) or tokens per call (output tokens / target calls) with its
    interval over the prompts, a ratio of sums as the row's number is. The prompt is the unit at
    every batch size: each batch row drafts, tests and counts its target calls on its own."""
    columns = per_prompt_counts(row, name)
    try:
        return None if columns is None else bootstrap(ratio_of_sums, columns)
    except ValueError:  # nothing tested on half the resamples
        return None


def batch_seconds(row: Mapping[str, Any], key: str) -> list[np.ndarray] | None:
    """Each repetition's seconds of each batch (``{"r<i>": [...]}``, repetitions in order)."""
    per = row["metrics"].get(key)
    return None if not per else [np.asarray(per[k], np.float64)
                                 for k in sorted(per, key=lambda k: int(k[1:]))]


def speedup_statistic(*columns: np.ndarray) -> np.ndarray:
    """The row's speed-up from per-batch seconds: the target's columns (one per repetition,
    ``[..., batches]``), then the speculative ones; the median over repetitions of the total over
    batches, target over speculative."""
    def median_total(cols):
        return np.median(np.stack([np.sum(c, axis=-1) for c in cols]), axis=0)

    half = len(columns) // 2
    return median_total(columns[:half]) / median_total(columns[half:])


def speedup(row: Mapping[str, Any]) -> Interval | None:
    """The speed-up with its interval over the timed batches, each batch's target and speculative
    seconds (every repetition) drawn together: paired, as the same batches ran both. The statistic
    is the row's own, so the estimate is the measured ``speedup``. None for an old row or a
    single batch (``no_interval``)."""
    target = batch_seconds(row, "target_seconds_per_batch")
    ours = batch_seconds(row, "speculative_seconds_per_batch")
    if not target or not ours or len(target) != len(ours) or len(target[0]) < 2:
        return None
    return bootstrap(speedup_statistic, tuple(target + ours))


def no_interval(row: Mapping[str, Any]) -> str:
    """Why a row's speed-up has no interval."""
    if not row["metrics"].get("speculative_seconds_per_batch"):
        return NO_UNITS
    return (f"its {row['config']['num_prompts']} prompts ran as one batch: one timed unit, "
            "nothing to resample")


def over(value: Interval | float, predicted: float | None) -> Interval | float | None:
    """measured / predicted: the speed-up (and its interval) over the prediction, taken as fixed:
    the interval carries the timing's spread, not the prediction's own."""
    if predicted is None:
        return None
    if isinstance(value, Interval) and predicted > 0:
        return Interval(value.value / predicted, value.low / predicted, value.high / predicted,
                        value.units)
    return value / predicted


def cells(row: Mapping[str, Any]) -> dict:
    """The row's numbers as the page shows them: an Interval where the row keeps per-unit values,
    otherwise the plain number."""
    measured = speedup(row) or metric(row, "speedup")
    return {"alpha": rate(row, "alpha") or metric(row, "alpha"),
            "tokens_per_call": rate(row, "tokens_per_call") or metric(row, "tokens_per_call"),
            "speedup": measured,
            "predicted": over(measured, metric(row, "predicted_speedup")),
            "measured_costs": over(measured, metric(row, "predicted_speedup_measured_costs"))}


def best(rows: Rows, drafter: str, batch: int, temperature: float):
    """The point of largest measured speed-up in a (drafter, batch, temperature) group, or None."""
    group = where(rows, drafter=drafter, batch_size=batch, temperature=temperature)
    return max(group, key=lambda r: metric(r, "speedup")) if group else None


def best_points(rows: Rows, batches: Sequence[int] | None = None):
    """``(drafter, batch, temperature, best point)`` for each group of ``rows`` with points,
    drafters in label order, then batch sizes (``batches``, default all) and temperatures."""
    for drafter in DRAFTER_LABELS:
        for batch in batches or values(rows, "batch_size"):
            for temperature in values(rows, "temperature"):
                found = best(rows, drafter, batch, temperature)
                if found is not None:
                    yield drafter, batch, temperature, found


def points_table(rows: Rows) -> Table:
    """Every point: its acceptance, costs, speed-up and both predictions."""
    columns = ["drafter", "batch", "temperature", "gamma", "alpha", "tokens/call",
               "expected tokens/call", "c", "v", "overhead", "speed-up", "predicted",
               "measured / predicted", "predicted (measured costs)",
               "measured / predicted (measured costs)", "round cost", "acceptance by position"]
    body = []
    for r in sorted(rows, key=lambda r: (list(DRAFTER_LABELS).index(metric(r, "drafter")),
                                         r["config"]["batch_size"], r["config"]["temperature"],
                                         r["config"]["gamma"])):
        c = cells(r)
        body.append([DRAFTER_LABELS[metric(r, "drafter")], r["config"]["batch_size"],
                     r["config"]["temperature"], r["config"]["gamma"], c["alpha"],
                     c["tokens_per_call"], metric(r, "expected_tokens_per_call"), metric(r, "c"),
                     metric(r, "verify_cost"), metric(r, "overhead"), c["speedup"],
                     metric(r, "predicted_speedup"), c["predicted"],
                     metric(r, "predicted_speedup_measured_costs"), c["measured_costs"],
                     metric(r, "round_cost"), metric(r, "acceptance_by_position")])
    return Table(columns, body)


def best_table(rows: Rows) -> Table:
    """Per drafter, batch and temperature: the gamma with the largest measured speed-up."""
    columns = ["drafter", "batch", "temperature", "best gamma", "alpha", "c", "v", "overhead",
               "tokens/call", "speed-up", "predicted", "measured / predicted",
               "predicted (measured costs)", "measured / predicted (measured costs)"]
    body = []
    for drafter, batch, temperature, found in best_points(rows):
        c = cells(found)
        body.append([DRAFTER_LABELS[drafter], batch, temperature, found["config"]["gamma"],
                     c["alpha"], metric(found, "c"), metric(found, "verify_cost"),
                     metric(found, "overhead"), c["tokens_per_call"], c["speedup"],
                     metric(found, "predicted_speedup"), c["predicted"],
                     metric(found, "predicted_speedup_measured_costs"), c["measured_costs"]])
    return Table(columns, body)


def main_table(rows: Rows) -> Table:
    """The page's table: ``best_table``'s acceptance, speed-up and measured / predicted (with
    measured costs) at each best gamma."""
    full = best_table(rows)
    keep = ["drafter", "batch", "temperature", "best gamma", "alpha", "speed-up",
            "measured / predicted (measured costs)"]
    index = [full.columns.index(name) for name in keep]
    return Table(keep, [[row[i] for i in index] for row in full.rows])


def spread(rows: Rows, error_field: str) -> float:
    """Median |log(measured / predicted)| over the rows that have the prediction."""
    logs = [abs(np.log(1.0 + metric(r, error_field))) for r in rows
            if metric(r, error_field) is not None]
    return float(np.median(logs)) if logs else float("nan")


def lowest(estimates: Sequence[Interval | float]) -> Interval | float | None:
    """The lowest of several estimates as one: ``[min of lows, min of highs]`` around the lowest
    estimate, which lies above a threshold exactly when every interval does and below it when
    one does; an estimate without an interval counts as its value alone. Plain numbers only: their
    minimum; none: None."""
    if not estimates:
        return None
    if not any(isinstance(e, Interval) for e in estimates):
        return min(estimates)
    spans = [e if isinstance(e, Interval) else Interval(e, e, e, units=1) for e in estimates]
    binding = min(spans, key=lambda e: e.high)
    return Interval(min(e.value for e in spans), min(e.low for e in spans), binding.high,
                    binding.units)


def mean_alpha(*columns: np.ndarray) -> np.ndarray:
    """The mean over gammas of each gamma's alpha: columns accepted, tested of the first gamma,
    then of the next, ... (``[..., prompts]`` each)."""
    return np.mean([ratio_of_sums(a, t) for a, t in zip(columns[::2], columns[1::2])], axis=0)


def alphas_by_gamma(rows: Rows, drafter: str, temperature: float) -> dict:
    """gamma -> the batch-1 row of ``drafter`` at ``temperature`` (rows with an alpha)."""
    return {r["config"]["gamma"]: r for r in where(rows, drafter=drafter,
                                                   temperature=temperature, batch_size=1)
            if metric(r, "alpha") is not None}


def mean_alphas(groups: dict) -> tuple[list, dict, Any] | None:
    """Over the gammas both groups ran (``groups``: two names -> {gamma: row}): the gammas, each
    group's mean over them of each gamma's alpha, and the second's minus the first's; intervals
    from a paired bootstrap over the prompts when the rows keep per-prompt counts. Pooled over
    gammas: the same prompts (and seeds) run at every gamma, so a prompt's counts at all gammas
    are resampled together as one unit (every gamma weighted equally)."""
    gammas = sorted(set.intersection(*(set(group) for group in groups.values())))
    if not gammas:
        return None
    means, columns = {}, {}
    for name, group in groups.items():
        means[name] = statistics.mean(metric(group[g], "alpha") for g in gammas)
        found = [per_prompt_counts(group[g], "alpha") for g in gammas]
        columns[name] = (None if None in found or len({len(c[0]) for c in found}) > 1 else
                         tuple(c for pair in found for c in pair))
    first, second = groups
    difference = means[second] - means[first]
    if columns[first] and columns[second] and len(columns[first][0]) == len(columns[second][0]):
        means = {name: bootstrap(mean_alpha, columns[name]) for name in means}
        difference = bootstrap_difference(mean_alpha, columns[second], columns[first])
    return gammas, means, difference


def distillation(rows: Rows, temperature: float) -> tuple[list, dict, Any] | None:
    """At batch 1 and ``temperature``: alpha with the trained and the distilled draft, each the
    mean over the gammas both ran, and distilled minus trained (``mean_alphas``)."""
    return mean_alphas({d: alphas_by_gamma(rows, d, temperature) for d in ("draft", "distilled")})


# --- The quantities the claims judge, each reading the rows a Pick chooses ------------------------


def best_speedup(pick: Pick, drafter: str, batch: int, temperature: float):
    """rows -> the speed-up (with its interval) at the best gamma of the group, None without."""
    def quantity(rows: Rows):
        found = best(pick(rows), drafter, batch, temperature)
        return None if found is None else cells(found)["speedup"]
    return quantity


def lowest_measured_costs_ratio(pick: Pick):
    """rows -> measured / predicted with measured costs at the best gamma of every drafter, batch
    and temperature, the lowest of them (``lowest``)."""
    return lambda rows: lowest([cells(found)["measured_costs"]
                                for *_, found in best_points(pick(rows))])


def fastest(pick: Pick, batch: int, temperature: float):
    """rows -> the speed-up of the best drafter at its best gamma, at ``batch`` and
    ``temperature`` (None without rows there)."""
    def quantity(rows: Rows):
        found = [b for d, bb, t, b in best_points(pick(rows)) if (bb, t) == (batch, temperature)]
        return cells(max(found, key=lambda r: metric(r, "speedup")))["speedup"] if found else None
    return quantity


def distillation_gain(pick: Pick, temperature: float):
    """rows -> distilled minus trained draft's mean alpha at batch 1 (``distillation``), with its
    paired interval over the prompts; None where the rows keep no per-prompt counts (a
    difference of means without an interval is not judged: it says nothing of the prompts)."""
    def quantity(rows: Rows):
        found = distillation(pick(rows), temperature)
        return found[2] if found is not None and isinstance(found[2], Interval) else None
    return quantity


def prediction_gap(pick: Pick):
    """rows -> how much closer the prediction with measured costs follows the measured speed-ups
    than the theory's: the median |log(measured / predicted)| of the theory minus that of the
    prediction with measured costs (positive: the measured costs' is closer)."""
    return lambda rows: (spread(pick(rows), "prediction_error")
                         - spread(pick(rows), "prediction_error_measured_costs"))
