"""Timing one run against another on a machine whose speed drifts: each run warmed up first (its
compilation excluded), then the two timed in turn, repetition after repetition, so that a drift
reaches both sides of every pair; a speed-up is a ratio of runs timed seconds apart.

``seconds`` times one call to completion (``block_until_ready``); ``timed_pair`` interleaves a
reference and a candidate; ``time_decoding`` does it for greedy ``generate`` at several batch
sizes (the compression studies' decode-speed fields)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from decodelab.decode.generation import generate
from decodelab.sampling.params import SamplingParams


def seconds(fn: Callable[[], Any]) -> float:
    """Wall seconds of ``fn()``, up to its result being ready on the device."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def timed_pair(reference: Callable[[], Any], candidate: Callable[[], Any], repeats: int,
               B: int) -> dict:
    """Seconds of ``repeats`` runs of ``reference()`` and ``candidate()``, interleaved after a
    warm-up (compilation excluded): the row's ``reference_reps_s_b<B>``, ``reps_s_b<B>`` and
    ``speedup_b<B>`` (median over median), and ``_median_s``, the candidate's median."""
    reference(), candidate()
    pairs = [(seconds(reference), seconds(candidate)) for _ in range(repeats)]
    ref, cand = [p[0] for p in pairs], [p[1] for p in pairs]
    return {f"reference_reps_s_b{B}": ref, f"reps_s_b{B}": cand,
            f"speedup_b{B}": statistics.median(ref) / statistics.median(cand),
            "_median_s": statistics.median(cand)}


def time_decoding(reference, candidate, prompts: Sequence[Sequence[int]], config, ctx,
                  kv_cache: str | None = None) -> dict:
    """The row's decode-speed fields at each of ``config.batch_sizes``: greedy ``generate`` of
    ``config.new_tokens`` tokens for the first B ``prompts``, ``candidate`` (with ``kv_cache``)
    against ``reference`` (``timed_pair``, ``config.repeats`` runs), plus
    ``tokens_per_s_b<B>``; ``ctx.status`` says which batch is timed."""
    greedy, N, row = SamplingParams.greedy(), config.new_tokens, {}
    for B in config.batch_sizes:
        ctx.status(f"decode batch {B}")
        timed = timed_pair(
            lambda: generate(reference, prompts[:B], greedy, N).tokens,
            lambda: generate(candidate, prompts[:B], greedy, N, kv_cache=kv_cache).tokens,
            config.repeats, B)
        row[f"tokens_per_s_b{B}"] = B * N / timed.pop("_median_s")
        row.update(timed)
    return row
