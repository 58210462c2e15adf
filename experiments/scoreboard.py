"""What the compression studies (quantization, pruning) share: the token windows they score and
time, a cache that keeps one candidate model at a time, interleaved timing of a candidate against
its reference, and the page cells (bootstrap intervals over windows and over timed runs) and
verdicts drawn from a row's per-window and per-run values.

Rows hold ``metrics`` with the scoreboard of ``dl.compare`` (``kl_per_window``,
``same_top_per_window``, ...) and, per batch size B, ``reference_reps_s_b<B>`` /
``reps_s_b<B>`` (each timed run's seconds, in run order) and ``speedup_b<B>``.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

import decodelab as dl
from decodelab import experiment
from decodelab import report as results
from decodelab.measure import stats

# Models built by a study's points, kept across points of one process (``cached``).

CACHE: dict = {}


def _m(row, name):
    return row["metrics"].get(name)


def reference_key(config) -> tuple:
    """The cache key of a point's reference model: its tokenizer, model and training sections."""
    return ("reference", experiment.config_hash(
        {name: config[name].to_dict() for name in ("tokenizer", "model", "train")}))


def cached(key, make):
    """``CACHE[key]``, made by ``make()`` the first time."""
    if key not in CACHE:
        CACHE[key] = make()
    return CACHE[key]


def swap_candidate(key, make):
    """The candidate model of ``key`` (a quantized or pruned copy of the reference), kept while
    consecutive points use it; a new one drops the previous candidate and every compiled
    program, so a sweep's memory stays that of one candidate (a process that kept them all ran
    out of memory on SmolLM2). The references (``reference_key``) stay."""
    if key not in CACHE:
        for old in [k for k in CACHE if not (isinstance(k, tuple) and k[0] == "reference")]:
            del CACHE[old]
        jax.clear_caches()
    return cached(key, make)


def seconds(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def timed_pair(reference, candidate, repeats: int, B: int) -> dict:
    """Seconds of ``repeats`` runs of ``reference()`` and ``candidate()``, interleaved after a
    warm-up (compilation excluded): the row's ``reference_reps_s_b<B>``, ``reps_s_b<B>`` and
    ``speedup_b<B>`` (median over median), and ``_median_s``, the candidate's median."""
    reference(), candidate()
    pairs = [(seconds(reference), seconds(candidate)) for _ in range(repeats)]
    ref, cand = [p[0] for p in pairs], [p[1] for p in pairs]
    return {f"reference_reps_s_b{B}": ref, f"reps_s_b{B}": cand,
            f"speedup_b{B}": statistics.median(ref) / statistics.median(cand),
            "_median_s": statistics.median(cand)}


def time_decoding(reference, candidate, prompts, config, ctx, kv_cache=None) -> dict:
    """The row's decode-speed fields at each of ``config.batch_sizes``: greedy ``dl.generate``
    of ``config.new_tokens`` tokens for the first B ``prompts``, ``candidate`` (with
    ``kv_cache``) against ``reference`` (``timed_pair``), plus ``tokens_per_s_b<B>``."""
    greedy, N, row = dl.SamplingParams.greedy(), config.new_tokens, {}
    for B in config.batch_sizes:
        ctx.status(f"decode batch {B}")
        timed = timed_pair(
            lambda: dl.generate(reference, prompts[:B], greedy, N).tokens,
            lambda: dl.generate(candidate, prompts[:B], greedy, N, kv_cache=kv_cache).tokens,
            config.repeats, B)
        row[f"tokens_per_s_b{B}"] = B * N / timed.pop("_median_s")
        row.update(timed)
    return row


def window_interval(row, name: str) -> stats.Interval | None:
    """The bootstrap interval over windows of the row's ``name`` (``kl_mean`` or ``same_top``),
    from its per-window values; None for a row without them."""
    per_window = _m(row, {"kl_mean": "kl_per_window", "same_top": "same_top_per_window"}[name])
    if not per_window or len(per_window) < 2:
        return None
    return stats.bootstrap(stats.mean, np.asarray(per_window, np.float64))


def cell(row, name: str):
    """The table's cell of a scoreboard column: its interval over windows where the row has
    per-window values, else the plain value."""
    return window_interval(row, name) or _m(row, name)


def speedup(row, B: int) -> stats.Interval | None:
    """The speed-up at batch ``B`` (median over median) with its bootstrap interval, the
    repetitions resampled in pairs (run i of the reference and of the candidate ran back to back,
    so load that drifts between runs cancels); None for a row with fewer than 2 runs kept."""
    ref, cand = _m(row, f"reference_reps_s_b{B}"), _m(row, f"reps_s_b{B}")
    if not ref or not cand or len(ref) < 2:
        return None
    return stats.bootstrap_ratio(stats.median, np.asarray(ref, np.float64),
                                 np.asarray(cand, np.float64), paired=True)


def speed_cell(row, B: int):
    return speedup(row, B) or _m(row, f"speedup_b{B}")


def judged(row, name: str, threshold: float, at_most: bool) -> str:
    """``met`` / ``not met`` / not distinguishable, by the interval over windows of ``name``
    against ``threshold`` (``at_most``: the target is ``<= threshold``)."""
    interval = window_interval(row, name)
    good, bad = ("met", "not met")
    return results.verdict(interval, above=bad if at_most else good, below=good if at_most else bad,
                           threshold=threshold, units="windows",
                           missing="the row keeps no per-window values").text


def times(ratio) -> str:
    """``2.00x`` or, with its interval, ``2.00x [1.90, 2.10]``."""
    if isinstance(ratio, stats.Interval):
        return f"{ratio.value:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"
    return f"{ratio:.2f}x"


def speed_judged(row, threshold: float, B: int = 1) -> str:
    """A speed-up target (``>= threshold`` at batch ``B``) by the interval over timed runs, or on
    the median alone for a row that keeps no runs' seconds."""
    interval = speedup(row, B)
    if interval is None:
        return (("met" if _m(row, f"speedup_b{B}") >= threshold else "not met")
                + " (median of the runs)")
    return results.verdict(interval, above="met", below="not met", threshold=threshold,
                           units="timed runs").text
