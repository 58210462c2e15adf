"""Timing ``dl.generate`` the way the decode-speed benchmark reports it: a warm-up run first, every
call blocked until its results are on the host, ``repeats`` timed runs, medians, and the runs'
seconds kept so that a page can resample them (``decodelab.measure.stats``).

What each figure is (``time_generate``):

- ``generate_s``: one ``generate`` call (prefill, decode loop, results copied to NumPy);
  ``tokens_per_s = B * new_tokens / generate_s``.
- ``prefill_ms``: the time to the first token, the same call with ``max_new_tokens=1`` and the
  same cache size: prefill, sampling the first token and the call's fixed costs.
  ``step_ms = (generate_s - prefill) / (new_tokens - 1)``: what each further token costs, i.e. the
  time per output token of each row once decoding runs (0 if noise makes it negative).
- ``compile_s``: the first ``generate`` call minus ``generate_s`` (both programs' compilation).
- ``generate_reps_s``, ``prefill_reps_s``: the timed runs' seconds behind the two medians.

``time_interleaved`` times several runs of one point, their repetitions interleaved (the sampling,
weights and max_len studies: ``time_capacity`` sets a cache size beside the smallest).

The no-cache baseline (``time_recompute``) decodes greedily by recomputing the whole sequence for
every new token (one jitted forward pass over all ``t`` tokens, logits at the last position only,
argmax). One step is timed at a few sequence lengths from the prompt to ``prompt + new - 1``; the
total is the sum of the timed steps interpolated linearly between those lengths (running every step
at every length would take longer than the rest of the benchmark).

``Machine`` holds this process's measured memory bandwidth and matmul rate, and ``load_reading``
says from the rows whether other processes shared the machine while the points ran.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.config import ModelConfig
from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions
from decodelab.measure import roofline
from decodelab.model import Transformer
from decodelab.sampling.params import SamplingParams


def threads() -> int:
    """CPU threads this process may use: XLA's CPU thread pool has one per core it can run on."""
    return len(os.sched_getaffinity(0))


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None where either is missing (a figure not measured, or a zero denominator
    passed as None)."""
    return None if a is None or b is None else a / b


def timed(fn: Callable, *args) -> float:
    """Wall seconds of ``fn(*args)`` until its results are ready (``generate`` returns NumPy
    arrays, so it has waited for the device already)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def time_generate(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                  params: SamplingParams | None = None, max_len: int = 0,
                  options: DecodeOptions = DecodeOptions()) -> dict:
    """Compile, prefill, per-step and whole-call times of ``generate`` with ``params`` (default
    greedy), ``max_len`` cache slots (0: prompt + new tokens) and the rest of ``options`` (a
    constraint's tokenizer and end-of-sequence ids); see the module docstring.
    ``prompts: [B, P]`` int32. Every row must generate exactly ``new_tokens`` tokens (no EOS)."""
    params = params or SamplingParams(temperature=0.0)
    B, P = prompts.shape
    rows = prompts.tolist()
    run = functools.partial(generate, model, rows, params, seed=0,
                            options=dataclasses.replace(options, max_len=max_len or P + new_tokens))
    first = time.perf_counter()
    out = run(new_tokens)
    first = time.perf_counter() - first
    if out.lengths.tolist() != [new_tokens] * B or set(out.finish_reason) != {"length"}:
        raise RuntimeError(f"every row must generate {new_tokens} tokens, got lengths "
                           f"{out.lengths.tolist()} and finish reasons {out.finish_reason}")
    wholes = [timed(run, new_tokens) for _ in range(repeats)]
    run(1)  # warm-up: compiles the prefill-only program
    prefills = [timed(run, 1) for _ in range(repeats)]
    return summary(wholes, prefills, B, new_tokens, first)


def time_interleaved(runs: Mapping[str, Callable[[int], Any]], batch_size: int, new_tokens: int,
                     repeats: int) -> dict:
    """``summary``'s keys for each named run (``runs[name](max_new_tokens)``: one ``generate``
    call) under ``<name>_`` (the name ``""``: unprefixed); every call must generate
    ``new_tokens`` per row.

    The repetitions are interleaved: each round times every run once (a whole call, then a
    prefill-only call), starting one run later than the round before, so a drift of the
    machine's speed over the point falls on every run alike, never on one alone. An untimed
    prefill-only call precedes each run's timed pair, so that both timed calls find the spare
    cache of their own layout (``decodelab.cache.spares``) as repeated calls of one run would,
    whatever layout the run before it left."""
    firsts = {}
    for name, run in runs.items():  # the first calls compile
        start = time.perf_counter()
        out = run(new_tokens)
        firsts[name] = time.perf_counter() - start
        if out.lengths.tolist() != [new_tokens] * batch_size:
            raise RuntimeError(f"every row must generate {new_tokens} tokens, got lengths "
                               f"{out.lengths.tolist()} under {name or 'the unnamed run'!r}")
        run(1)
    wholes = {name: [] for name in runs}
    prefills = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name](1)
            wholes[name].append(timed(runs[name], new_tokens))
            prefills[name].append(timed(runs[name], 1))
    found = {}
    for name in runs:
        prefix = f"{name}_" if name else ""
        found.update({f"{prefix}{key}": value for key, value in summary(
            wholes[name], prefills[name], batch_size, new_tokens, firsts[name]).items()})
    return found


def time_capacity(model: Transformer, prompts: np.ndarray, new_tokens: int, repeats: int,
                  max_len: int) -> dict:
    """Greedy timings at ``max_len`` cache slots (unprefixed, ``time_generate``'s keys) and, where
    ``max_len`` is larger, at the smallest cache that holds the call (prompt + new tokens; under
    ``smallest_``), their repetitions interleaved (``time_interleaved``): what the capacity
    costs, free of the machine's drift between points. ``prompts: [B, P]`` int32."""
    B, P = prompts.shape
    smallest = P + new_tokens
    if max_len and max_len < smallest:
        raise ValueError(f"max_len must be 0 or at least prompt + new tokens = {smallest}, "
                         f"got {max_len}")
    greedy = SamplingParams(temperature=0.0)
    sizes = {"": max_len or smallest, **({"smallest_": smallest} if max_len > smallest else {})}
    runs = {name.rstrip("_"): functools.partial(generate, model, prompts.tolist(), greedy, seed=0,
                                                options=DecodeOptions(max_len=size))
            for name, size in sizes.items()}
    return time_interleaved(runs, B, new_tokens, repeats)


def summary(wholes: Sequence[float], prefills: Sequence[float], batch_size: int,
            new_tokens: int, first: float) -> dict:
    """``time_generate``'s metrics from the timed whole calls and prefill-only calls (seconds)
    and the first (compiling) call's seconds."""
    whole, prefill = statistics.median(wholes), statistics.median(prefills)
    return {"compile_s": max(first - whole, 0.0), "prefill_ms": 1e3 * prefill,
            "step_ms": 1e3 * max(whole - prefill, 0.0) / (new_tokens - 1), "generate_s": whole,
            "tokens_per_s": batch_size * new_tokens / whole, "generate_reps_s": list(wholes),
            "prefill_reps_s": list(prefills)}


# --- the roofline of this machine ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Machine:
    """This process's measured memory read ``bandwidth`` (bytes/s) and float32 matmul rate
    (``flops_per_s``), the two rates of ``roofline.StepCost.seconds``."""

    bandwidth: float
    flops_per_s: float

    @classmethod
    def measure(cls, bandwidth_bytes: int, matmul_n: int, repeats: int) -> Machine:
        """Both probes of ``roofline``: a jitted sum over ``bandwidth_bytes`` bytes of float32 and
        a square ``matmul_n`` float32 matmul, each the median of ``repeats`` runs."""
        return cls(roofline.measure_bandwidth(bandwidth_bytes, repeats),
                   roofline.measure_matmul_flops(matmul_n, repeats))

    def roofline_step_s(self, cfg: ModelConfig, batch_size: int, prompt_len: int,
                        new_tokens: int) -> float:
        """The roofline of a decode step, averaged over the ``new_tokens - 1`` loop steps."""
        steps = new_tokens - 1
        return roofline.decode_seconds(cfg, batch_size, prompt_len, steps, self.bandwidth,
                                       self.flops_per_s) / steps

    def bound(self, cost: roofline.StepCost) -> str:
        """``"memory"`` or ``"compute"``: which of the two rates bounds a step of ``cost``."""
        return "memory" if cost.bytes / self.bandwidth >= cost.flops / self.flops_per_s \
            else "compute"


# --- the no-cache baseline ----------------------------------------------------------------------


def last_logits(model: Transformer, tokens: jax.Array) -> jax.Array:
    """``model(tokens)[:, -1]`` (``[B, T] -> [B, V]``) without the logits of the other positions:
    what a decoder that recomputes the sequence for each new token needs."""
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))  # [B, T]
    x = model.positions.embed(model.embed(tokens), positions)  # [B, T, D]
    bias = model.positions.bias(positions, positions)  # [B, N, T, T] or None
    for layer, block in enumerate(model.blocks):
        x, _ = block(x, model.positions, positions, positions, bias, None, layer)
    return model.head(x[:, -1])  # [B, V]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _recompute_step(weights, tokens, *, graphdef) -> jax.Array:
    """One no-cache greedy step: ``[B, T]`` tokens -> ``[B]`` next tokens."""
    return jnp.argmax(last_logits(nnx.merge(graphdef, weights), tokens), axis=-1)


# The no-cache figures of a point that does not time the baseline.
NO_RECOMPUTE = {"nocache_generate_s": None, "nocache_tokens_per_s": None,
                "nocache_lengths_timed": 0}


def time_recompute(model: Transformer, prompts: np.ndarray, new_tokens: int, num_lengths: int,
                   repeats: int, seed: int) -> dict:
    """Seconds the no-cache baseline takes for ``new_tokens`` tokens: step ``i`` (0-based) runs
    the model over ``P + i`` tokens; steps are timed at ``num_lengths`` lengths and interpolated.
    The ids after the prompt are random (``seed``): the step's cost does not depend on them."""
    B, P = prompts.shape
    lengths = np.unique(np.linspace(P, P + new_tokens - 1, num_lengths).round().astype(int))
    rng = np.random.default_rng(seed)
    sequence = np.concatenate(  # [B, P + new_tokens - 1]: the prompt, then any ids
        [prompts, rng.integers(0, model.config.vocab_size, (B, new_tokens - 1), dtype=np.int32)],
        axis=1)
    graphdef, weights = nnx.split(model)
    seconds = []
    for T in lengths:
        tokens = jnp.asarray(sequence[:, :T])
        seconds.append(roofline.median_time(
            functools.partial(_recompute_step, graphdef=graphdef), weights, tokens,
            repeats=repeats))
    total = float(np.interp(np.arange(P, P + new_tokens), lengths, seconds).sum())
    return {"nocache_generate_s": total, "nocache_tokens_per_s": B * new_tokens / total,
            "nocache_lengths_timed": len(lengths)}


# --- was the machine shared? --------------------------------------------------------------------

# The cores other processes kept busy on average during a point from which the machine counts as
# shared (an idle machine's background stays well under a tenth of a core).
SHARED_CORES = 0.25


def load_reading(metrics: Sequence[Mapping[str, Any]], other_cores: Sequence[float] = ()) -> str:
    """Whether other processes shared the machine, from rows' metrics (``load_avg_1min``,
    ``threads``). Where the rows record it, judged by the cores other processes kept busy during
    each point (``other_cores``: the machine's CPU time less the benchmark's own, as
    ``report.other_cores`` reads it); otherwise by the 1-minute load averages at the points'
    starts: points run back to back, so a load up to the benchmark's own thread count is what its
    previous point leaves behind, and only a load well above it (half a core more) says that
    others ran."""
    busy, threads_used = max(m["load_avg_1min"] for m in metrics), metrics[0]["threads"]
    shared = ("other processes took CPU time from the measurements, so speeds are lower and "
              "noisier than on an idle machine, and PyTorch's OpenMP threads, which wait for each "
              "other at every operation, lose the most. Compare rows measured at similar load.")
    if other_cores:
        worst = max(other_cores)
        measured = (f"other processes kept up to {worst:.2f} of the {threads_used} cores busy "
                    "during a point (the machine's CPU time in /proc/stat less the benchmark's "
                    "own)")
        if worst >= SHARED_CORES:
            return f"**The machine was shared during this run**: {measured}; {shared}"
        return (f"The machine was not shared: {measured}, under the {SHARED_CORES} that counts as "
                f"sharing (1-minute load average up to {busy:.1f}, the benchmark's own "
                f"{threads_used} threads included).")
    if busy >= threads_used + 0.5:
        return (f"**The machine was shared during this run** (1-minute load average up to "
                f"{busy:.1f} on {threads_used} cores, more than the benchmark's own "
                f"{threads_used} threads leave): {shared}")
    return (f"1-minute load average up to {busy:.1f} on {threads_used} cores: no more than the "
            f"benchmark's own {threads_used} threads leave behind from the point before (points "
            "run back to back), so no other process is seen sharing the machine.")
