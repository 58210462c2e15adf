"""Decode-speed rows -> intervals and claims (the decode_speed page; tables in ``speed_tables``).

A row of the decode-speed benchmark keeps every timed run's seconds (``generate_reps_s``,
``prefill_reps_s``, ``sampled_*``, ``hf_generate_reps_s``, ``llama[_f32]_generate_reps_s``; see
``decodelab.measure.timing``). Its speeds and ratios get 95% intervals by resampling them
(``decodelab.measure.stats``): a program's whole-call and prefill runs together by repetition
index; two programs timed in the same rounds (``timing.time_interleaved``: the max_len, sampling,
samplers, weights and constrained studies) together by round, so that what drifts over a point
falls on both sides of their ratio; other programs' repetitions (a peer's, the speed study's
sampled runs after its greedy ones) independently. A row that keeps fewer than 2
repetitions has no interval, and a claim about it is not judged ("not measured").

A ``Target`` is one of the benchmark's targets as data: what is measured, the threshold and the
comparison, judged on each row it covers (one ``Claim`` per row) or on the whole sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.measure import sampling_cost, stats
from decodelab.measure.stats import Interval
from decodelab.report.claims import Claim, Judged
from decodelab.report.form import tally

Rows = Sequence[Mapping[str, Any]]
# Presets in the order the page lists them (others after them, by name).
PRESET_ORDER = ("tiny", "small", "medium")


def metric_rows(rows: Rows, study: str = "speed") -> list[dict]:
    """The metrics of ``study``'s rows (rows written before studies existed are "speed") plus
    their prompt and output lengths, presets small to large, then by batch size and cache size."""
    order = {name: i for i, name in enumerate(PRESET_ORDER)}
    metrics = [{**r["metrics"], "prompt_len": r["config"]["prompt_len"],
                "new_tokens": r["config"]["new_tokens"]}
               for r in rows if r["config"].get("study", "speed") == study]
    return sorted(metrics, key=lambda m: (order.get(m["preset"], len(order)), m["preset"],
                                          m["batch_size"], m.get("max_len") or 0))


def label(m: Mapping[str, Any]) -> str:
    """``"small batch 8"``: which row a claim or a sentence is about."""
    return f"{m['preset']} batch {m['batch_size']}"


def repetitions(m: Mapping[str, Any], key: str) -> np.ndarray | None:
    """A row's per-repetition seconds under ``key``; None with fewer than 2 (no interval)."""
    values = m.get(key)
    return np.asarray(values, np.float64) if values and len(values) >= 2 else None


def scaled(interval: Interval | None, factor: float) -> Interval | None:
    if interval is None:
        return None
    return dataclasses.replace(interval, value=interval.value * factor,
                               low=interval.low * factor, high=interval.high * factor)


def tokens_per_s(m: Mapping[str, Any], reps_key: str, tokens: int) -> Interval | None:
    """``tokens`` over the median of the repetitions under ``reps_key``, with its interval."""
    reps = repetitions(m, reps_key)
    if reps is None:
        return None
    return stats.bootstrap(lambda seconds: tokens / stats.median(seconds), reps)


def speed_ratio(m: Mapping[str, Any], peer_reps_key: str,
                tokens_ratio: float = 1.0) -> Interval | None:
    """decodelab's tokens/s over a peer's: ``tokens_ratio`` (decodelab's tokens per call over the
    peer's) x the peer's median seconds over decodelab's, each program resampled on its own."""
    ours, peer = repetitions(m, "generate_reps_s"), repetitions(m, peer_reps_key)
    if ours is None or peer is None:
        return None
    return scaled(stats.bootstrap_ratio(stats.median, peer, ours), tokens_ratio)


def roofline_interval(m: Mapping[str, Any]) -> Interval | None:
    """roofline step / measured step, the step being (median whole call - median prefill) /
    (new tokens - 1); None where the step's interval reaches 0 (the ratio is unbounded)."""
    whole, prefill = repetitions(m, "generate_reps_s"), repetitions(m, "prefill_reps_s")
    if whole is None or prefill is None:
        return None
    step = stats.bootstrap_difference(stats.median, whole, prefill, paired=False)
    if step.low <= 0:
        return None
    scale = m["roofline_step_ms"] * (m["new_tokens"] - 1) / 1e3
    return Interval(scale / step.value, scale / step.high, scale / step.low, step.units)


def step_seconds(whole: np.ndarray, prefill: np.ndarray) -> np.ndarray:
    """A decode step's time up to the constant 1 / (new tokens - 1): median whole call - median
    prefill (a statistic over repetitions, ``[..., n]`` each)."""
    return stats.median(whole) - stats.median(prefill)


def step_ratio(a: Mapping[str, Any], b: Mapping[str, Any], a_prefix: str = "",
               b_prefix: str = "", *, paired: bool = False) -> Interval | None:
    """Step time of row ``a`` (its ``<a_prefix>generate_reps_s`` and ``..prefill_reps_s``) over
    that of row ``b`` (the same new tokens). ``paired``: the two were timed in the same rounds
    (``timing.time_interleaved``) and are resampled together by round; otherwise each program's
    repetitions are resampled on their own. None without 2 or more repetitions of each, unequal
    counts, or a step of 0 or less."""
    columns = []
    for m, prefix in ((a, a_prefix), (b, b_prefix)):
        whole = repetitions(m, f"{prefix}generate_reps_s")
        prefill = repetitions(m, f"{prefix}prefill_reps_s")
        if whole is None or prefill is None or len(whole) != len(prefill):
            return None
        columns.append((whole, prefill))
    try:
        return stats.bootstrap_ratio(step_seconds, *columns, paired=paired)
    except ValueError:  # a step of 0 or less (the ratio is undefined), or unequal paired counts
        return None


def interleaved_step_ratio(m: Mapping[str, Any], prefix: str, base_prefix: str = ""
                           ) -> Interval | None:
    """Row ``m``'s step under ``prefix`` over its step under ``base_prefix``, two programs that
    one ``timing.time_interleaved`` call timed in the same rounds (resampled by round)."""
    return step_ratio(m, m, prefix, base_prefix, paired=True)


def sampled_over_greedy(m: Mapping[str, Any]) -> Interval | None:
    """The row's sampled step over its greedy step (the speed study times its sampled runs after
    its greedy ones, not interleaved: resampled on their own)."""
    return step_ratio(m, m, "sampled_")


def at_smallest_cache(m: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]
                      ) -> tuple[Mapping[str, Any], str]:
    """Where the max_len study's row ``m`` finds the smallest cache's timings: ``(m,
    "smallest_")`` where it timed that cache beside its own (``timing.time_capacity``), else
    ``(the smallest row of its preset and batch, "")`` (rows timed one point after another)."""
    if m.get("smallest_generate_reps_s"):
        return m, "smallest_"
    same = [o for o in metrics if (o["preset"], o["batch_size"]) == (m["preset"], m["batch_size"])]
    return min(same, key=lambda o: o["max_len"]), ""


def at_largest_cache(metrics: Sequence[Mapping[str, Any]]) -> tuple[Mapping, Mapping, str] | None:
    """The max_len study's pair behind its claims: the largest cache's row and where it finds the
    smallest cache's timings (``at_smallest_cache``); None with fewer than 2 cache sizes."""
    if len({m["max_len"] for m in metrics}) < 2:
        return None
    largest = max(metrics, key=lambda m: m["max_len"])
    return largest, *at_smallest_cache(largest, metrics)


def max_len_step_ratio(metrics: Sequence[Mapping[str, Any]]) -> Interval | None:
    """The step at the largest cache over the step at the smallest (the same live tokens); paired
    by round where the largest cache's row timed the smallest beside it."""
    pair = at_largest_cache(metrics)
    if pair is None:
        return None
    return step_ratio(pair[0], pair[1], "", pair[2], paired=pair[1] is pair[0])


def lowest_cache_speedup(metrics: Sequence[Mapping[str, Any]]) -> float | None:
    """The lowest ``cache_speedup`` of the rows (a point value: the no-cache timing keeps no
    repetitions); None where no row timed the baseline."""
    return min((m["cache_speedup"] for m in metrics if m["cache_speedup"] is not None),
               default=None)


def with_intervals(m: Mapping[str, Any]) -> dict:
    """The row's metrics with tokens/s, the peer ratios, the roofline ratio and sampled / greedy
    as Intervals where its repetitions allow (point values elsewhere)."""
    B, N = m["batch_size"], m["new_tokens"]
    found = {"tokens_per_s": tokens_per_s(m, "generate_reps_s", B * N),
             "hf_tokens_per_s": tokens_per_s(m, "hf_generate_reps_s", B * N),
             "speed_vs_hf": speed_ratio(m, "hf_generate_reps_s"),
             "speed_vs_llama": speed_ratio(m, "llama_generate_reps_s", B),
             "speed_vs_llama_f32": speed_ratio(m, "llama_f32_generate_reps_s", B),
             "roofline_ratio": roofline_interval(m),
             "sampled_vs_greedy": sampled_over_greedy(m)}
    return {**m, **{key: value for key, value in found.items() if value is not None}}


def point(value: Interval | float | None) -> float | None:
    return value.value if isinstance(value, Interval) else value


# --- targets as data ----------------------------------------------------------------------------


def every_row(m: Mapping[str, Any]) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Target:
    """One of the benchmark's targets: ``text`` (what is claimed, e.g. "decodelab / transformers"),
    ``value`` (what is measured: an Interval where the repetitions allow, a point value where
    none are kept, None where there is nothing to measure), ``threshold`` and the comparison
    (``at_least``); ``label``: the words the page's answer uses for it.

    ``per_row``: judged on each row of ``study`` that ``covers`` accepts, one claim per row
    ("small batch 8: <text>"; ``value`` gets that row's metrics, and ``row_threshold``, if given,
    sets that row's threshold), or one claim that is not measured when no row is covered;
    otherwise one claim on all the study's rows (``value`` gets their metrics, a list)."""

    label: str
    text: str
    value: Callable[[Any], Interval | float | None]
    threshold: float
    at_least: bool = True
    study: str = "speed"
    per_row: bool = True
    covers: Callable[[Mapping[str, Any]], bool] = every_row
    row_threshold: Callable[[Mapping[str, Any]], float] | None = None
    unit: str = "x"

    def claims(self, rows: Rows) -> list[Claim]:
        """This target's claims on ``rows`` (their quantities read the rows they are judged on)."""
        def claim(text: str, quantity, threshold: float) -> Claim:
            return Claim(text, quantity, threshold, self.at_least, units="repetitions",
                         unit=self.unit)

        if not self.per_row:
            return [claim(self.text, lambda rows: self.value(metric_rows(rows, self.study)),
                          self.threshold)]
        covered = [m for m in metric_rows(rows, self.study) if self.covers(m)]
        if not covered:
            return [claim(self.text, lambda rows: None, self.threshold)]
        return [claim(f"{label(m)}: {self.text}", self.row_quantity(m),
                      self.row_threshold(m) if self.row_threshold else self.threshold)
                for m in covered]

    def row_quantity(self, m: Mapping[str, Any]) -> Callable[[Rows], Interval | float | None]:
        """The quantity of the claim about row ``m``: ``value`` of the one row of the rows judged
        with its preset, batch size and cache size (None if they hold none)."""
        at = (m["preset"], m["batch_size"], m.get("max_len"))

        def quantity(rows: Rows) -> Interval | float | None:
            chosen = [o for o in metric_rows(rows, self.study)
                      if (o["preset"], o["batch_size"], o.get("max_len")) == at]
            if len(chosen) > 1:
                raise ValueError(f"rows must hold at most one {label(m)} row of study "
                                 f"{self.study!r} with max_len {at[2]}, got {len(chosen)}")
            return self.value(chosen[0]) if chosen else None

        return quantity


def target_claims(targets: Sequence[Target], rows: Rows) -> list[tuple[Target, list[Claim]]]:
    """Each target with its claims on ``rows``."""
    return [(target, target.claims(rows)) for target in targets]


def answer(groups: Sequence[tuple[Target, Sequence[Claim]]], judged: Sequence[Judged]) -> str:
    """One sentence from the judged claims (in the order of ``groups``' claims): the tally, then
    per target on how many of its rows it is met (a one-claim target: its verdict)."""
    verdicts = iter(judged)
    parts = []
    for target, claims in groups:
        group = [next(verdicts) for _ in claims]
        if len(group) == 1:
            parts.append(f"{target.label}: {group[0].verdict.text.split(' (')[0]}")
            continue
        met = sum(j.verdict.side > 0 for j in group)
        undecided = sum(j.verdict.side == 0 for j in group)
        parts.append(f"{target.label} on {met} of {len(group)} rows"
                     + (f" ({undecided} undecided)" if undecided else ""))
    return f"{tally(list(judged))}: " + "; ".join(parts) + "."


# --- what sampling costs beside greedy (the "sampling" study) ------------------------------------


def setting_over_greedy(name: str) -> Callable[[Mapping[str, Any]], Interval | None]:
    """The row's step under sampling setting ``name`` over its greedy step (timed in the same
    rounds)."""
    return lambda m: interleaved_step_ratio(m, f"{name}_")


def over_peer_sampled(m: Mapping[str, Any]) -> Interval | None:
    """decodelab's tokens/s over transformers' with the same processors (``PEER_SETTING``)."""
    setting = sampling_cost.PEER_SETTING
    ours = repetitions(m, f"{setting}_generate_reps_s")
    peer = repetitions(m, f"hf_{setting}_generate_reps_s")
    if ours is None or peer is None:
        return None
    return stats.bootstrap_ratio(stats.median, peer, ours)


def sampling_targets() -> tuple[Target, ...]:
    """The sampling study's targets: each sampled setting's step within 25% of greedy on every
    row; the history processors within 10% of greedy at SmolLM2 batch 8; and decodelab sampled
    >= 2x transformers sampled (same processors) for small and medium at batch 8 and 32."""
    labels = sampling_cost.LABELS
    per_setting = tuple(
        Target(f"{labels[name]} step within 25% of greedy", f"{labels[name]} step / greedy step",
               setting_over_greedy(name), 1.25, at_least=False, study="sampling")
        for name in sampling_cost.SETTINGS if name != "history")
    return per_setting + (
        Target("history processors within 10% of greedy at smollm2-135m batch 8",
               f"{labels['history']} step / greedy step", setting_over_greedy("history"), 1.10,
               at_least=False, study="sampling",
               covers=lambda m: m["preset"] == "smollm2-135m" and m["batch_size"] == 8),
        Target(">= 2x transformers, both sampling, for small and medium at batch 8 and 32",
               f"decodelab / transformers, both sampling with {labels['all']}",
               over_peer_sampled, 2.0, study="sampling",
               covers=lambda m: m["preset"] in ("small", "medium") and m["batch_size"] >= 8))


def sampler_targets() -> tuple[Target, ...]:
    """The samplers study's targets: each of llama.cpp's samplers within 25% of greedy on every
    row; contrastive search, a forward of k candidates per row, within k greedy steps."""
    labels, k = sampling_cost.LABELS, sampling_cost.CONTRASTIVE["top_k"]
    return tuple(
        Target(f"{labels[name]} step within 25% of greedy", f"{labels[name]} step / greedy step",
               setting_over_greedy(name), 1.25, at_least=False, study="samplers")
        for name in sampling_cost.SAMPLERS) + (
        Target(f"contrastive search step within {k} greedy steps (its k)",
               f"{labels['contrastive']} step / greedy step", setting_over_greedy("contrastive"),
               float(k), at_least=False, study="samplers"),)
