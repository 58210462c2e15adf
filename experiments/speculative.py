"""Speculative decoding: acceptance, tokens per target call and wall-clock speed-up of three
drafters against target-only decoding, beside the theory of Leviathan et al. (2023).

    python -m experiments.speculative --config=configs/speculative.py --workdir=runs/speculative
    python -m experiments.report --workdir=runs/speculative --out=results

One point = one (target, drafter, gamma, temperature, batch size). The target is `medium` (or, in
the comparison rows, `small`) trained on the corpus; the drafters are the `draft` preset trained
on the corpus, the same preset distilled from the target, and prompt lookup. With
``configs/speculative.py:<pretrained preset>`` the target is that real model
(``pipeline.model_for``) and the draft is trained on the corpus in its tokenizer
(``tokenizer.pretrained``); each target's rows get a page of their own (``report``). The prompts
are ``num_prompts`` evenly spaced windows of the held-out test plays (in the target's tokens), run
in consecutive batches of ``batch_size``; every request generates exactly ``new_tokens`` tokens
(no EOS), with seed ``seed + i`` for prompt i. What each number is:

- ``alpha``: accepted / tested proposals over all requests (``SpeculativeStats.overall_alpha``;
  a proposal is tested when every earlier one of its round was accepted).
- ``tokens_per_call``: output tokens / target calls (verify passes), all requests together;
  ``expected_tokens_per_call = (1 - alpha^(g+1)) / (1 - alpha)``.
- ``c``: the cost ratio, measured at this point. For a draft model, its decode-step time over
  the target's, each from ``dl.generate`` runs of ``step_tokens`` and of 1 token (the difference
  over ``step_tokens - 1`` steps). For prompt lookup, the time of one proposal (``propose``
  below) / gamma over the target's step time.
- ``verify_cost`` v(gamma), ``propose_cost``, ``isolated_round_cost``: the seconds of the target's
  verify pass over gamma + 1 tokens, of the drafter's proposal, and of a whole round, each timed
  alone (a compiled loop repeating it from the state the first round starts from, the caches
  rewound after each), over the target's decode step. All these runs are timed round-robin, once
  per repetition (``cost_seconds``), each ratio taken within its repetition and the median over
  repetitions reported: the machine's speed drifts by up to 2x over tens of seconds.
  ``target_step_ms`` and ``draft_step_ms``: medians.
- ``overhead``: what an isolated round costs beyond its proposal and its verify pass,
  ``isolated_round_cost - propose_cost - v``, in target steps: the accept test, the residual or
  bonus draw, stop checks, recording and rewinds (and, for a model draft on a sampled rejection,
  the step that recomputes the rejected position's q row).
- ``predicted_speedup = (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1))``: the theory, which charges
  a verify pass as one decode step and a round nothing else.
- ``predicted_speedup_measured_costs = tokens_per_call / (g c + v + overhead)``: the measured
  tokens per call over the measured cost of a round.
- ``speedup``: median seconds of target-only ``dl.generate`` over the median seconds of
  ``speculative_generate`` for all prompts, with the same parameters, seeds and cache size
  (``prompt bucket + new_tokens + cache_slack``). After one warm-up run of each (compiles), all
  prompts are timed ``repeats`` times, each batch's two runs back to back in alternating order,
  so that a drift in the machine's speed reaches both sides of every pair. ``compile_s``: the
  first speculative run minus the median.
- ``round_cost``: measured seconds per loop round (``speculative_generate`` time over its rounds;
  a batch's rounds are its slowest row's) over the theory's charge per round, ``(g c + 1)`` target
  steps: above 1 where verifying ``g + 1`` tokens, the bookkeeping of a round or a batch waiting
  for its slowest row costs more than the theory says.
- ``load_1min``: the machine's 1-minute load average when the point started.
- Per prompt and per repetition, for a bootstrap over prompts: ``accepted_per_prompt``,
  ``tested_per_prompt``, ``generated_per_prompt``, ``rounds_per_prompt`` (lists in prompt order),
  and ``target_seconds_per_batch`` / ``speculative_seconds_per_batch`` (``{"r<i>": [seconds of
  each batch]}`` for repetition i; at batch 1 a batch is one prompt).

The page shows alpha and tokens per call with a 95% bootstrap interval over the prompts, the
speed-up with one over the timed batches (``_speedup``; none when all prompts ran as one batch),
and judges the targets and the distillation claim by ``results.verdict``; rows without the
per-unit values (an earlier version of the study) render with plain numbers, not judged.
"""

from __future__ import annotations

import functools
import os
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from flax import nnx
from matplotlib.figure import Figure

from decodelab import experiment, sampling
from decodelab import report as results
from decodelab.decode.generation import generate
from decodelab.decode.request import bucket_length
from decodelab.experiment import artefacts as pipeline
from decodelab.experiment.presets import MODEL_PRESETS
from decodelab.measure.stats import (RESAMPLES, Interval, bootstrap, bootstrap_difference,
                                     ratio_of_sums)
from decodelab.model import param_count
from decodelab.sampling.params import SamplingParams
from decodelab.speculative import generation as speculative
from decodelab.text import data

_FLAGS = experiment.define_flags("configs/speculative.py")

DEFAULT_TARGET = "medium"  # the target whose page is `speculative.md` and states the targets
DRAFTER_LABELS = {"draft": "draft (trained)", "distilled": "draft (distilled)",
                  "ngram": "prompt lookup"}

# Models and step times, kept for the whole process: every point reuses them.
_CACHE: dict = {}


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def load_models(config, ctx):
    """``(target, drafter, tokenizer)`` for the point's drafter (trained or loaded once); the
    target is trained, or a pretrained model's (``pipeline.model_for``)."""
    def target():
        return pipeline.model_for(config.tokenizer, config.target.model, config.target.train,
                                  ctx.workdir, progress=ctx.show_progress)

    model, tokenizer = _cached(("target", experiment.config_hash(config.target)), target)
    if config.drafter == "ngram":
        drafter = speculative.NgramDrafter(config.ngram.max_ngram, config.ngram.min_ngram)
    elif config.drafter == "draft":
        drafter, _ = _cached(("draft", experiment.config_hash(config.draft)), lambda: (
            pipeline.trained_model(config.tokenizer, config.draft.model, config.draft.train,
                                   ctx.workdir, progress=ctx.show_progress)))
    elif config.drafter == "distilled":
        key = tuple(experiment.config_hash(section) for section in (
            config.target, config.draft.model, config.distill_train))
        drafter, _ = _cached(("distilled", *key), lambda: (
            pipeline.distilled_model(config.tokenizer, config.target.model, config.target.train,
                                     config.draft.model, config.distill_train, ctx.workdir,
                                     temperature=config.distill_temperature,
                                     progress=ctx.show_progress)))
    else:
        raise ValueError(f"drafter must be one of {sorted(DRAFTER_LABELS)}, "
                         f"got {config.drafter!r}")
    return model, drafter, tokenizer


def _seconds(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _step_runs(model, prompts, params, step_tokens: int, max_len: int) -> tuple:
    """``dl.generate`` of ``step_tokens`` tokens and of 1, whose time difference over
    ``step_tokens - 1`` is one decode step of ``model`` at this batch and these parameters."""
    return tuple(functools.partial(generate, model, prompts, params, n, seed=0, max_len=max_len)
                 for n in (step_tokens, 1))


def start_state(target, drafter, draft_weights, prompts, params, gamma: int, max_len: int,
                max_new_tokens: int) -> speculative.SpecState:
    """The state ``speculative_generate`` starts its rounds from, for ``prompts`` (equal
    lengths), seed 0."""
    block = np.asarray(prompts, np.int32)
    B, V = block.shape[0], target.config.vocab_size
    lengths = np.full((B,), block.shape[1], np.int32)
    graphdef, weights = nnx.split(target)
    caches = speculative.prefill(weights, draft_weights, block, lengths - 1, graphdef=graphdef,
                                 drafter=drafter, max_len=max_len)
    return speculative.initial_state(
        *caches, block, lengths, sampling.batch_keys(0, B), params.per_row(B, V),
        np.zeros((V,), bool), np.zeros((0, 1), np.int32), gamma=gamma,
        max_new_tokens=max_new_tokens)


ROUND_PARTS = ("propose", "verify", "round")
COST_REPEATS = 5  # repetitions of the cost timings (at least; ``config.repeats`` if more)


def _rewound(cache, before):
    """``cache`` with the lengths of ``before`` (None for a drafter without a cache)."""
    return None if before is None else cache.rewind(before.lengths)


@functools.partial(jax.jit, static_argnames=("graphdef", "drafter", "part", "count"))
def _repeat_part(weights, state, proposal, *, graphdef, drafter, part, count):
    """``count`` times one ``part`` of a round from ``state``, in one compiled loop; after each,
    the caches (and lengths) go back to where they were, so every repetition does the same
    work, on caches updated in place as in the real loop."""
    target_weights, draft_weights = weights
    target = nnx.merge(graphdef, target_weights)

    def body(_, carry):
        s, total = carry
        if part == "propose":
            made, cache = drafter.propose(draft_weights, s)
            value = jnp.sum(made.tokens).astype(jnp.float32)
            s = s.replace(draft_cache=_rewound(cache, state.draft_cache))
        elif part == "verify":
            logits, cache = speculative.verify(target, s, proposal)
            value = jnp.sum(logits[..., 0])
            s = s.replace(target_cache=_rewound(cache, state.target_cache))
        else:
            after = speculative.speculative_round(target, drafter, draft_weights, s)
            value = jnp.sum(after.lengths).astype(jnp.float32)
            s = after.replace(step=state.step, lengths=state.lengths, finish=state.finish,
                              target_cache=_rewound(after.target_cache, state.target_cache),
                              draft_cache=_rewound(after.draft_cache, state.draft_cache))
        return s, total + value

    return jax.lax.fori_loop(0, count, body, (state, jnp.zeros((), jnp.float32)))[1]


def cost_seconds(target, draft, prompts, params, gamma: int, max_len: int,
                 max_new_tokens: int, step_tokens: int, repeats: int,
                 count: int = 20) -> dict[str, list[float]]:
    """Seconds of what the predictions charge, one value per repetition: ``target_step`` and (for
    a draft model) ``draft_step``, a decode step of ``dl.generate`` (``_step_runs``); and each
    part of one round at this batch (``ROUND_PARTS``): the drafter's proposal, the target's verify
    pass over ``gamma + 1`` tokens and a whole round (proposal, verify, accept test, residual
    draw, stop checks, record, rewinds), each a compiled loop of ``count`` from the state the
    first round starts from, over ``count``. Every run is timed once per repetition, round-robin,
    so that a cost ratio divides measurements taken within seconds of each other: this machine's
    speed drifts by up to 2x over tens of seconds, so costs measured minutes apart do not
    compare."""
    if isinstance(draft, speculative.Drafter):
        drafter, draft_weights = draft, None
    else:
        draft_graphdef, draft_weights = nnx.split(draft)
        drafter = speculative.ModelDrafter(draft_graphdef)
    graphdef, target_weights = nnx.split(target)
    state = start_state(target, drafter, draft_weights, prompts, params, gamma, max_len,
                        max_new_tokens)
    proposal, _ = jax.jit(drafter.propose)(draft_weights, state)
    runs = dict(zip(("target_many", "target_one"),
                    _step_runs(target, prompts, params, step_tokens, max_len)))
    if draft_weights is not None:
        runs.update(zip(("draft_many", "draft_one"),
                        _step_runs(draft, prompts, params, step_tokens, max_len)))
    for part in ROUND_PARTS:
        runs[part] = functools.partial(_repeat_part, (target_weights, draft_weights), state,
                                       proposal, graphdef=graphdef, drafter=drafter, part=part,
                                       count=count)
    for run in runs.values():
        run()  # warm-up (compiles)
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(_seconds(run))
    seconds = {part: [t / count for t in times[part]] for part in ROUND_PARTS}
    for model in ("target", "draft"):
        if f"{model}_many" in times:
            seconds[f"{model}_step"] = [max(many - one, 1e-9) / (step_tokens - 1) for many, one
                                        in zip(times[f"{model}_many"], times[f"{model}_one"])]
    return seconds


def evaluate(config, ctx) -> dict:
    load = os.getloadavg()[0]
    # Each point compiles programs of its own (per gamma, drafter and round part), and a process
    # keeps every executable with its memory maps: a first full run reached the kernel's limit
    # (vm.max_map_count, 65530) after 54 points and crashed in LLVM ("Cannot allocate memory").
    # Every point warms up before it times, so dropping earlier points' programs costs only
    # their recompilation where shapes repeat.
    jax.clear_caches()
    target, drafter, tokenizer = load_models(config, ctx)
    prompts = data.token_windows(tokenizer, "test", config.num_prompts,
                                 config.prompt_tokens).tolist()
    B, N, gamma = config.batch_size, config.new_tokens, config.gamma
    if config.num_prompts % B:
        raise ValueError(f"num_prompts must be a multiple of batch_size={B}, "
                         f"got {config.num_prompts}")
    params = SamplingParams(temperature=config.temperature)
    max_len = bucket_length(config.prompt_tokens) + N + config.cache_slack
    batches = [(prompts[i:i + B], [config.seed + j for j in range(i, i + B)])
               for i in range(0, len(prompts), B)]

    def target_batch(i):
        chunk, seeds = batches[i]
        return generate(target, chunk, params, N, seed=seeds, max_len=max_len)

    def speculative_batch(i):
        chunk, seeds = batches[i]
        return speculative.speculative_generate(target, drafter, chunk, params, gamma, N,
                                                seed=seeds, max_len=max_len)

    def timed_pairs(repetition):  # each batch's target and speculative seconds, back to back
        pair = ([], [])
        for i in range(len(batches)):
            order = (0, 1) if (repetition + i) % 2 == 0 else (1, 0)
            for arm in order:
                run = (target_batch, speculative_batch)[arm]
                pair[arm].append(_seconds(functools.partial(run, i)))
        return pair

    ctx.status("warm-up")
    first = time.perf_counter()
    outputs = [speculative_batch(i) for i in range(len(batches))]
    first = time.perf_counter() - first
    for i in range(len(batches)):
        target_batch(i)
    ctx.status("timing")
    target_times, speculative_times = [], []  # [repetition][batch] seconds
    for repetition in range(config.repeats):
        target_s_, speculative_s_ = timed_pairs(repetition)
        target_times.append(target_s_)
        speculative_times.append(speculative_s_)
    target_s = statistics.median(sum(t) for t in target_times)
    speculative_s = statistics.median(sum(t) for t in speculative_times)

    ctx.status("costs")
    costs = cost_seconds(target, drafter, batches[0][0], params, gamma, max_len, N,
                         config.step_tokens, max(config.repeats, COST_REPEATS))
    steps = costs["target_step"]
    # Each cost over the target step of its own repetition, then the median over repetitions.
    per_step = {name: statistics.median(t / step for t, step in zip(costs[name], steps))
                for name in (*ROUND_PARTS, "draft_step") if name in costs}
    target_step = statistics.median(steps)
    c = per_step["draft_step"] if "draft_step" in per_step else per_step["propose"] / gamma
    draft_step = c * target_step
    verify_cost = per_step["verify"]
    isolated_round_cost = per_step["round"]
    propose_cost = per_step["propose"]
    overhead = isolated_round_cost - propose_cost - verify_cost

    stats = [out.stats for out in outputs]
    tested = sum(s.tested_by_position.sum(axis=0) for s in stats)  # [gamma]
    accepted = sum(s.accepted_by_position.sum(axis=0) for s in stats)
    alpha = float(accepted.sum() / tested.sum()) if tested.sum() else None
    generated = sum(int(s.generated.sum()) for s in stats)
    calls = sum(int(s.rounds.sum()) for s in stats)
    rounds = sum(int(s.rounds.max()) for s in stats)  # loop iterations: a batch's slowest row
    tokens_per_call = generated / calls
    with np.errstate(invalid="ignore", divide="ignore"):
        by_position = accepted / tested

    def per_prompt(field):  # prompt order, batch after batch
        return [int(v) for s in stats for v in getattr(s, field)]

    def per_repetition(times):  # repetition -> each batch's seconds
        return {f"r{i}": [float(t) for t in batch] for i, batch in enumerate(times)}

    row = {
        "drafter": config.drafter,
        "alpha": alpha,
        "tokens_per_call": tokens_per_call,
        "expected_tokens_per_call": (None if alpha is None else
                                     float(speculative.expected_tokens_per_call(alpha, gamma))),
        "acceptance_by_position": " ".join("n/a" if np.isnan(a) else f"{a:.3f}"
                                           for a in by_position),
        "c": c,
        "target_step_ms": 1e3 * target_step,
        "draft_step_ms": 1e3 * draft_step,
        "predicted_speedup": (None if alpha is None else
                              float(speculative.predicted_speedup(alpha, gamma, c))),
        "verify_cost": verify_cost,
        "propose_cost": propose_cost,
        "isolated_round_cost": isolated_round_cost,
        "overhead": overhead,
        "predicted_speedup_measured_costs": tokens_per_call / (gamma * c + verify_cost + overhead),
        "speedup": target_s / speculative_s,
        "target_tokens_per_s": generated / target_s,
        "speculative_tokens_per_s": generated / speculative_s,
        "target_s": target_s,
        "speculative_s": speculative_s,
        "round_ms": 1e3 * speculative_s / rounds,
        "round_cost": speculative_s / rounds / ((gamma * c + 1) * target_step),
        "compile_s": max(first - speculative_s, 0.0),
        "target_params": param_count(target),
        "draft_params": 0 if config.drafter == "ngram" else param_count(drafter),
        "load_1min": load,
        # Per prompt (prompt order) and per repetition, for resampling prompts later.
        "accepted_per_prompt": per_prompt("accepted"),
        "tested_per_prompt": per_prompt("tested"),
        "generated_per_prompt": per_prompt("generated"),
        "rounds_per_prompt": per_prompt("rounds"),
        "target_seconds_per_batch": per_repetition(target_times),
        "speculative_seconds_per_batch": per_repetition(speculative_times),
    }
    row["prediction_error"] = (None if row["predicted_speedup"] is None else
                               row["speedup"] / row["predicted_speedup"] - 1.0)
    row["prediction_error_measured_costs"] = (
        row["speedup"] / row["predicted_speedup_measured_costs"] - 1.0)
    return row


# --- The page -------------------------------------------------------------------------------------

NO_UNITS = "the row keeps no per-prompt values, written by an earlier version of the study"
# How alpha and tokens per call are recomputed from a row's per-prompt counts (ratio of sums).
RESAMPLED = {"alpha": ("accepted_per_prompt", "tested_per_prompt"),
             "tokens_per_call": ("generated_per_prompt", "rounds_per_prompt")}


def _m(row, name):
    return row["metrics"][name]


def _where(rows, **conditions):
    return [r for r in rows if all(_m(r, k) == v if k in r["metrics"] else r["config"][k] == v
                                   for k, v in conditions.items())]


def _columns(row, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-prompt (numerator, denominator) counts of ``metric``, or None (an old row)."""
    m = row["metrics"]
    if m.get(metric) is None or any(len(m.get(name) or ()) < 2 for name in RESAMPLED[metric]):
        return None
    return tuple(np.asarray(m[name], np.float64) for name in RESAMPLED[metric])


def _rate(row, metric: str) -> Interval | None:
    """alpha (accepted / tested) or tokens per call (output tokens / target calls) with its
    interval over the prompts, a ratio of sums as the row's number is. The prompt is the unit at
    every batch size: each batch row drafts, tests and counts its target calls on its own."""
    columns = _columns(row, metric)
    try:
        return None if columns is None else bootstrap(ratio_of_sums, columns)
    except ValueError:  # nothing tested on half the resamples
        return None


def _batch_seconds(row, key: str) -> list[np.ndarray] | None:
    """Each repetition's seconds of each batch (``{"r<i>": [...]}``, repetitions in order)."""
    per = row["metrics"].get(key)
    return None if not per else [np.asarray(per[k], np.float64)
                                 for k in sorted(per, key=lambda k: int(k[1:]))]


def _speedup_statistic(*columns: np.ndarray) -> np.ndarray:
    """The row's speed-up from per-batch seconds: the target's columns (one per repetition,
    ``[..., batches]``), then the speculative ones; the median over repetitions of the total over
    batches, target over speculative."""
    def median_total(cols):
        return np.median(np.stack([np.sum(c, axis=-1) for c in cols]), axis=0)

    half = len(columns) // 2
    return median_total(columns[:half]) / median_total(columns[half:])


def _speedup(row) -> Interval | None:
    """The speed-up with its interval over the timed batches, each batch's target and speculative
    seconds (every repetition) drawn together: paired, as the same batches ran both. The statistic
    is the row's own (median over repetitions of all batches' total, target over speculative), so
    the estimate is the measured ``speedup``; the sum of per-batch medians would differ from it by
    how the median is taken. None for an old row or a single batch (``_no_interval``)."""
    target = _batch_seconds(row, "target_seconds_per_batch")
    ours = _batch_seconds(row, "speculative_seconds_per_batch")
    if not target or not ours or len(target) != len(ours) or len(target[0]) < 2:
        return None
    return bootstrap(_speedup_statistic, tuple(target + ours))


def _no_interval(row) -> str:
    """Why a row's speed-up has no interval."""
    if not row["metrics"].get("speculative_seconds_per_batch"):
        return NO_UNITS
    return (f"its {row['config']['num_prompts']} prompts ran as one batch: one timed unit, "
            "nothing to resample")


def _speed_units(row) -> str:
    batch = row["config"]["batch_size"]
    return "prompts" if batch == 1 else f"batches of {batch} prompts"


def _over(speedup, predicted: float | None) -> Interval | float | None:
    """measured / predicted: the speed-up (and its interval) over the prediction, which is taken
    as fixed: the interval carries the timing's spread, not the prediction's own (through alpha
    and the measured costs)."""
    if predicted is None:
        return None
    if isinstance(speedup, Interval) and predicted > 0:
        return Interval(speedup.value / predicted, speedup.low / predicted,
                        speedup.high / predicted, speedup.units)
    return speedup / predicted


def _cells(row) -> dict:
    """The row's numbers as the page shows them: an Interval where the row keeps per-unit values,
    otherwise the plain number."""
    speedup = _speedup(row) or _m(row, "speedup")
    return {"alpha": _rate(row, "alpha") or _m(row, "alpha"),
            "tokens_per_call": _rate(row, "tokens_per_call") or _m(row, "tokens_per_call"),
            "speedup": speedup,
            "predicted": _over(speedup, _m(row, "predicted_speedup")),
            "measured_costs": _over(speedup, _m(row, "predicted_speedup_measured_costs"))}


def _points_table(rows) -> results.Table:
    columns = ["drafter", "batch", "temperature", "gamma", "alpha", "tokens/call",
               "expected tokens/call", "c", "v", "overhead", "speed-up", "predicted",
               "measured / predicted", "predicted (measured costs)",
               "measured / predicted (measured costs)", "round cost", "acceptance by position"]
    body = []
    for r in sorted(rows, key=lambda r: (list(DRAFTER_LABELS).index(_m(r, "drafter")),
                                         r["config"]["batch_size"], r["config"]["temperature"],
                                         r["config"]["gamma"])):
        cells = _cells(r)
        body.append([DRAFTER_LABELS[_m(r, "drafter")], r["config"]["batch_size"],
                     r["config"]["temperature"], r["config"]["gamma"], cells["alpha"],
                     cells["tokens_per_call"], _m(r, "expected_tokens_per_call"), _m(r, "c"),
                     _m(r, "verify_cost"), _m(r, "overhead"), cells["speedup"],
                     _m(r, "predicted_speedup"), cells["predicted"],
                     _m(r, "predicted_speedup_measured_costs"), cells["measured_costs"],
                     _m(r, "round_cost"), _m(r, "acceptance_by_position")])
    return results.Table(columns, body)


def _best(rows, drafter, batch, temperature):
    """The point of largest measured speed-up in a (drafter, batch, temperature) group, or None."""
    group = _where(rows, drafter=drafter, batch_size=batch, temperature=temperature)
    return max(group, key=lambda r: _m(r, "speedup")) if group else None


def _best_points(rows, batches=None):
    """``(drafter, batch, temperature, best point)`` for each group of ``rows`` with points,
    drafters in label order, then batch sizes (``batches``, default all) and temperatures."""
    temperatures = sorted({r["config"]["temperature"] for r in rows})
    for drafter in DRAFTER_LABELS:
        for batch in batches or sorted({r["config"]["batch_size"] for r in rows}):
            for temperature in temperatures:
                best = _best(rows, drafter, batch, temperature)
                if best is not None:
                    yield drafter, batch, temperature, best


def _best_table(rows) -> results.Table:
    """Per drafter, batch and temperature: the gamma with the largest measured speed-up."""
    columns = ["drafter", "batch", "temperature", "best gamma", "alpha", "c", "v", "overhead",
               "tokens/call", "speed-up", "predicted", "measured / predicted",
               "predicted (measured costs)", "measured / predicted (measured costs)"]
    body = []
    for drafter, batch, temperature, best in _best_points(rows):
        cells = _cells(best)
        body.append([DRAFTER_LABELS[drafter], batch, temperature, best["config"]["gamma"],
                     cells["alpha"], _m(best, "c"), _m(best, "verify_cost"),
                     _m(best, "overhead"), cells["tokens_per_call"], cells["speedup"],
                     _m(best, "predicted_speedup"), cells["predicted"],
                     _m(best, "predicted_speedup_measured_costs"), cells["measured_costs"]])
    return results.Table(columns, body)


def _grid_plot(rows, path, measured: str, predicted: str, ylabel: str, title: str,
               measured_costs: str | None = None):
    """One panel per (batch, temperature): ``measured`` (solid, with its interval as an error bar
    where the row has one), ``predicted`` (dashed) and ``measured_costs`` (dotted, when given)
    against gamma, one colour per drafter."""
    batches = sorted({r["config"]["batch_size"] for r in rows})
    temperatures = sorted({r["config"]["temperature"] for r in rows})
    fig = Figure(figsize=(4.0 * len(temperatures), 3.3 * len(batches)), layout="constrained")
    axes = fig.subplots(len(batches), len(temperatures), squeeze=False, sharex=True)
    colours = dict(zip(DRAFTER_LABELS, ("tab:blue", "tab:orange", "tab:green")))
    for i, batch in enumerate(batches):
        for j, temperature in enumerate(temperatures):
            ax = axes[i][j]
            for drafter, label in DRAFTER_LABELS.items():
                group = sorted(_where(rows, drafter=drafter, batch_size=batch,
                                      temperature=temperature), key=lambda r: r["config"]["gamma"])
                if not group:
                    continue
                gammas = [r["config"]["gamma"] for r in group]
                values = [_cells(r)[measured] for r in group]
                spans = [(v.value, v.low, v.high) if isinstance(v, Interval) else (v, v, v)
                         for v in values]
                ys = [y for y, _, _ in spans]
                bars = [[y - low for y, low, _ in spans], [high - y for y, _, high in spans]]
                ax.errorbar(gammas, ys, yerr=bars, marker="o", capsize=3,
                            color=colours[drafter], label=f"{label}, measured")
                pairs = [(g, _m(r, predicted)) for g, r in zip(gammas, group)
                         if _m(r, predicted) is not None]
                ax.plot([g for g, _ in pairs], [v for _, v in pairs], marker="x", linestyle="--",
                        color=colours[drafter], label=f"{label}, theory")
                if measured_costs is not None:
                    ax.plot(gammas, [_m(r, measured_costs) for r in group], marker=".",
                            linestyle=":", color=colours[drafter],
                            label=f"{label}, with measured costs")
            if measured == "speedup":
                ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_title(f"batch {batch}, temperature {temperature:g}", fontsize=10)
            ax.set_xlabel("gamma")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


# The targets of the default (`medium`) study: (label, drafter, batch, temperature, at least).
SPEED_TARGETS = (
    ("distilled draft, batch 1, temperature 0", "distilled", 1, 0.0, 2.0),
    ("distilled draft, batch 1, temperature 0.7", "distilled", 1, 0.7, 1.5),
    ("prompt lookup, batch 1, temperature 0", "ngram", 1, 0.0, 1.5),
)
MEASURED_COSTS_TARGET = 0.85  # measured / predicted with measured costs, at each best gamma


def _spread(rows, error_field) -> float:
    """Median |log(measured / predicted)| over the rows that have the prediction."""
    logs = [abs(np.log(1.0 + _m(r, error_field))) for r in rows
            if _m(r, error_field) is not None]
    return float(np.median(logs)) if logs else float("nan")


def _target(row, value, threshold: float, strict: bool = False) -> results.Verdict:
    """``value`` (a cell of ``row``) against a target: ``results.verdict`` on its interval (met
    when the whole interval lies above ``threshold``); without an interval, on the median alone
    (met at or above the threshold, or only above it if ``strict``), saying why it has none."""
    if isinstance(value, Interval):
        return results.verdict(value, threshold=threshold, above="met", below="not met",
                               units=_speed_units(row))
    met = value > threshold or (value == threshold and not strict)
    unjudged = results.verdict(None, above="met", below="not met", missing=_no_interval(row))
    return results.Verdict(1 if met else -1,
                           f"{'met' if met else 'not met'} on the median alone; {unjudged}")


def _times(speedup) -> str:
    """``2.00x`` or, with its interval, ``2.00x [1.90, 2.10]``."""
    if isinstance(speedup, Interval):
        return f"{speedup.value:.2f}x [{speedup.low:.2f}, {speedup.high:.2f}]"
    return f"{speedup:.2f}x"


def _measured_costs_target(bests, targets: bool) -> str:
    """measured / predicted (measured costs) at each best point, against the target: the
    speed-up's interval over the fixed prediction (``_over``), judged point by point; the target
    is met when every point is, not met when one is not, otherwise undecided."""
    ratios = [1 + _m(b, "prediction_error_measured_costs") for b in bests]
    within = sum(r >= MEASURED_COSTS_TARGET for r in ratios)
    reach = (f"{within} of {len(ratios)} best points reach {MEASURED_COSTS_TARGET} (range "
             f"{min(ratios):.2f} to {max(ratios):.2f})")
    if not targets:
        return f"- {reach}."
    cells = [_cells(b)["measured_costs"] for b in bests]
    judged = [_target(b, cell, MEASURED_COSTS_TARGET) for b, cell in zip(bests, cells)]
    overall = ("not met" if any(v.side < 0 for v in judged) else
               "met" if all(v.side > 0 for v in judged) else "undecided")
    undecided = "".join(f"; {DRAFTER_LABELS[_m(b, 'drafter')]}, batch {b['config']['batch_size']}"
                        f", temperature {b['config']['temperature']:g}: {v}"
                        for b, v in zip(bests, judged) if not v.side)
    alone = [_no_interval(b) for b, cell in zip(bests, cells) if not isinstance(cell, Interval)]
    return (f"- **measured / predicted (measured costs) >= {MEASURED_COSTS_TARGET} at the best "
            f"gamma of each drafter, batch and temperature: {overall}** — {reach}{undecided}"
            + (f"; {len(alone)} judged on the median alone ({'; '.join(sorted(set(alone)))})"
               if alone else "") + ".")


def _mean_alpha(*columns: np.ndarray) -> np.ndarray:
    """The mean over gammas of each gamma's alpha: columns accepted, tested of the first gamma,
    then of the next, ... (``[..., prompts]`` each)."""
    return np.mean([ratio_of_sums(a, t) for a, t in zip(columns[::2], columns[1::2])], axis=0)


def _mean_alphas(groups: dict) -> tuple[list, dict, object] | None:
    """Over the gammas both groups ran (``groups``: two names -> {gamma: row}): the gammas, each
    group's mean over them of each gamma's alpha, and the second's minus the first's; intervals
    from a paired bootstrap over the prompts when the rows keep per-prompt counts. Pooled over
    gammas rather than one value per gamma: the same prompts (and seeds) run at every gamma, so a
    prompt's counts at all gammas are resampled together as one unit (every gamma weighted
    equally, as the page said before intervals)."""
    gammas = sorted(set.intersection(*(set(group) for group in groups.values())))
    if not gammas:
        return None
    means, columns = {}, {}
    for name, group in groups.items():
        means[name] = statistics.mean(_m(group[g], "alpha") for g in gammas)
        found = [_columns(group[g], "alpha") for g in gammas]
        columns[name] = (None if None in found or len({len(c[0]) for c in found}) > 1 else
                         tuple(c for pair in found for c in pair))
    first, second = groups
    difference = means[second] - means[first]
    if columns[first] and columns[second] and len(columns[first][0]) == len(columns[second][0]):
        means = {name: bootstrap(_mean_alpha, columns[name]) for name in means}
        difference = bootstrap_difference(_mean_alpha, columns[second], columns[first])
    return gammas, means, difference


def _alphas_by_gamma(rows, drafter: str, temperature: float) -> dict:
    return {r["config"]["gamma"]: r for r in _where(rows, drafter=drafter,
                                                    temperature=temperature, batch_size=1)
            if _m(r, "alpha") is not None}


def _paired(difference) -> str:
    return (f" (paired over the {difference.units} prompts)"
            if isinstance(difference, Interval) else "")


def _distillation(rows, temperature: float, seed: int | None = None) -> str | None:
    """The distillation claim at ``temperature`` (batch 1): alpha with the distilled draft minus
    alpha with the trained one, each the mean over the gammas both ran (``_mean_alphas``), judged
    by ``results.verdict``. ``seed``: the drafters' training seed, named in the line (None: one
    seed, not named)."""
    found = _mean_alphas({d: _alphas_by_gamma(rows, d, temperature)
                          for d in ("draft", "distilled")})
    if found is None:
        return None
    gammas, means, difference = found
    judged = results.verdict(difference if isinstance(difference, Interval) else None,
                             above="distillation raises acceptance",
                             below="distillation lowers acceptance", units="prompts",
                             missing=NO_UNITS)
    return (f"- Temperature {temperature:g}, batch 1, "
            f"{'' if seed is None else f'drafters trained from seed {seed}, '}mean over gamma "
            f"{', '.join(map(str, gammas))}: alpha "
            f"{results.format_value(means['draft'], '{:.3f}')} with the trained draft, "
            f"{results.format_value(means['distilled'], '{:.3f}')} with the distilled one; "
            f"distilled minus trained {results.format_value(difference, '{:+.3f}')}"
            f"{_paired(difference)}: {judged}.")


def _seed_spread(rows, reseeded, temperature: float) -> str | None:
    """How far a second training seed moves each model drafter's alpha at ``temperature`` (batch
    1), over the gammas both seeds ran, on the same prompts."""
    parts = []
    for drafter in ("draft", "distilled"):
        for seed in sorted({draft_seed(r) for r in reseeded if r["config"]["drafter"] == drafter}):
            found = _mean_alphas({0: _alphas_by_gamma(rows, drafter, temperature),
                                  seed: _alphas_by_gamma(
                                      [r for r in reseeded if draft_seed(r) == seed], drafter,
                                      temperature)})
            if found is None:
                continue
            gammas, means, difference = found
            parts.append(
                f"{DRAFTER_LABELS[drafter]} at gamma {', '.join(map(str, gammas))}: alpha "
                f"{results.format_value(means[0], '{:.3f}')} (seed 0), "
                f"{results.format_value(means[seed], '{:.3f}')} (seed {seed}), seed {seed} minus "
                f"seed 0 {results.format_value(difference, '{:+.3f}')}{_paired(difference)}")
    if not parts:
        return None
    return f"- Seed spread, temperature {temperature:g}, batch 1: " + "; ".join(parts) + "."


def _summary(rows, targets: bool, reseeded=()) -> str:
    """The reading of the rows, computed from them: the targets (on the default study's page),
    judged by their intervals, the best points, which prediction the measurements follow and the
    distillation claim, at each drafter seed (``reseeded``: the rows of seeds other than 0)."""
    lines = []
    for label, drafter, batch, temperature, least in (SPEED_TARGETS if targets else ()):
        best = _best(rows, drafter, batch, temperature)
        if best is None:
            lines.append(f"- **>= {least:g}x with {label}: no rows.**")
            continue
        cells = _cells(best)
        lines.append(
            f"- **>= {least:g}x with {label}: {_target(best, cells['speedup'], least)}** — "
            f"{_times(cells['speedup'])} at gamma {best['config']['gamma']} "
            f"({_m(best, 'speculative_tokens_per_s'):.0f} vs {_m(best, 'target_tokens_per_s'):.0f}"
            f" tokens/s; alpha {results.format_value(cells['alpha'], '{:.3f}')}, "
            f"{results.format_value(cells['tokens_per_call'], '{:.2f}')} tokens per call, "
            f"c = {_m(best, 'c'):.3f}, v = {_m(best, 'verify_cost'):.2f}, overhead "
            f"{_m(best, 'overhead'):.2f} target steps).")
    groups = [(d, b, t) for d in DRAFTER_LABELS for b in sorted({r["config"]["batch_size"]
                                                                 for r in rows})
              for t in sorted({r["config"]["temperature"] for r in rows})]
    bests = [best for best in (_best(rows, *g) for g in groups) if best is not None]
    lines.append(_measured_costs_target(bests, targets))
    batch8 = [b for b in bests if b["config"]["batch_size"] == 8
              and b["config"]["temperature"] == 0.0]
    if targets and batch8:
        top = max(batch8, key=lambda r: _m(r, "speedup"))
        speedup = _cells(top)["speedup"]
        lines.append(
            f"- **batch 8, temperature 0, faster than `generate` with the best drafter: "
            f"{_target(top, speedup, 1.0, strict=True)}** — "
            f"{DRAFTER_LABELS[_m(top, 'drafter')]} at gamma {top['config']['gamma']}: "
            f"{_times(speedup)}.")
    lines.append("")
    theory = _spread(rows, "prediction_error")
    measured = _spread(rows, "prediction_error_measured_costs")
    follows = "the prediction with measured costs" if measured < theory else "the theory's"
    lines.append(
        f"Which prediction the measurements follow: {follows}. Over all {len(rows)} points the "
        f"median |log(measured / predicted)| is {theory:.3f} against the theory's "
        f"(1 - a^(g+1)) / ((1 - a)(g c + 1)), which charges the verify pass over gamma + 1 tokens "
        f"as one decode step and a round nothing else, and {measured:.3f} against "
        f"tokens per call / (g c + v(g) + overhead), which charges the verify pass and the rest "
        f"of a round as measured alone (the `v` and `overhead` columns, in target decode steps). "
        f"v ranges {min(_m(r, 'verify_cost') for r in rows):.2f} to "
        f"{max(_m(r, 'verify_cost') for r in rows):.2f}, the overhead "
        f"{min(_m(r, 'overhead') for r in rows):.2f} to {max(_m(r, 'overhead') for r in rows):.2f}."
        f" What the second prediction still misses is what an isolated round does not show: at "
        f"batch > 1 a batch runs as many rounds as its slowest row.")
    lines.append(_verify_growth(rows))
    for temperature in sorted({r["config"]["temperature"] for r in rows}):
        for seed in sorted({0} | {draft_seed(r) for r in reseeded}):
            line = _distillation(rows if seed == 0 else
                                 [r for r in reseeded if draft_seed(r) == seed], temperature,
                                 seed=seed if reseeded else None)
            if line is not None:
                lines.append(line)
        line = _seed_spread(rows, reseeded, temperature) if reseeded else None
        if line is not None:
            lines.append(line)
    loads = [_m(r, "load_1min") for r in rows]
    lines.append("")
    lines.append(f"The machine's 1-minute load average at the start of the points was "
                 f"{min(loads):.2f} to {max(loads):.2f} (median {statistics.median(loads):.2f}) "
                 f"on {rows[0]['provenance'].get('cpu_count')} CPUs: the timed runs shared it "
                 f"with whatever else ran, which the interleaved repetitions spread over both "
                 f"sides of each ratio.")
    return "\n".join(lines)


def _verify_growth(rows) -> str:
    """How the verify pass's cost grows with the tokens it checks: the median v over the points of
    each batch size and gamma, against the theory's 1."""
    parts = []
    for batch in sorted({r["config"]["batch_size"] for r in rows}):
        by_gamma = {}
        for r in _where(rows, batch_size=batch):
            by_gamma.setdefault(r["config"]["gamma"], []).append(_m(r, "verify_cost"))
        parts.append(f"at batch {batch}, " + ", ".join(
            f"{statistics.median(v):.2f} at gamma {g}" for g, v in sorted(by_gamma.items())))
    return (f"The verify pass over gamma + 1 tokens, in target decode steps (median over the "
            f"points; the theory charges 1): {'; '.join(parts)}. Where it grows with gamma, the "
            f"target's pass is bound by arithmetic rather than by reading its weights once, so "
            f"checking more proposals per round is not free, and the best gamma is small.")


def _pretrained(row) -> str | None:
    """The pretrained preset a row's target is (None: a model trained here)."""
    return row["config"]["target"]["model"].get("pretrained")


def _target_name(row) -> str:
    """The row's target: a pretrained preset's name, or the size preset it was built from."""
    pretrained = _pretrained(row)
    if pretrained is not None:
        return pretrained
    model = row["config"]["target"]["model"]
    return next(name for name, fields in MODEL_PRESETS.items()
                if all(model.get(k) == v for k, v in fields.items()))


def _intro(rows) -> str:
    """What the rows measured: the target, the drafters present, the prompts and the timing."""
    config, m0 = rows[0]["config"], rows[0]["metrics"]
    pretrained = _pretrained(rows[0])
    if pretrained is None:
        target = (f"`{_target_name(rows[0])}` ({m0['target_params']:,} parameters, "
                  f"{config['target']['train']['steps']} training steps)")
        vocabulary = ""
        prompts = "from the held-out test plays"
    else:
        target = (f"the pretrained `{pretrained}` ({m0['target_params']:,} parameters, its GGUF "
                  f"file dequantized to float32)")
        vocabulary = " in the target's tokens (its tokenizer, not one trained here)"
        prompts = ("from the held-out test plays, plain text in the target's tokens (no chat "
                   "turn: the instruct model continues the passage)")
    descriptions = {
        "draft": f"the `draft` preset ({max(_m(r, 'draft_params') for r in rows):,} parameters) "
                 f"trained on the corpus{vocabulary} for {config['draft']['train']['steps']} steps",
        "distilled": f"the same preset distilled from the target for "
                     f"{config['distill_train']['steps']} steps (forward KL to its next-token "
                     f"distributions at temperature {config['distill_temperature']:g})",
        "ngram": f"prompt lookup (n-grams {config['ngram']['min_ngram']}.."
                 f"{config['ngram']['max_ngram']})",
    }
    present = {_m(r, "drafter") for r in rows}
    drafters = [text for name, text in descriptions.items() if name in present]
    if len(drafters) > 1:
        drafters = ["; ".join(drafters[:-1]) + "; and " + drafters[-1]]
    batching = ", ".join(
        "at batch 1 the prompts run one after another" if b == 1 else
        f"at batch {b} together" if b == config["num_prompts"] else f"at batch {b} in groups"
        for b in sorted({r["config"]["batch_size"] for r in rows}))
    return (
        f"Target: {target}. Drafters: {drafters[0]}. "
        f"{config['num_prompts']} prompts of {config['prompt_tokens']} tokens {prompts}, "
        f"{config['new_tokens']} new tokens each, no EOS; {batching}. Speed-up: target-only "
        f"`dl.generate` time over `dl.speculative_generate` time, same prompts, parameters, seeds "
        f"and cache size, medians of {config['repeats']} repetitions after a warm-up "
        f"(compilation excluded), each batch's two runs back to back in alternating order. c: "
        f"draft step time over target step time; it, v and the overhead are timed at each point, "
        f"round-robin, every ratio within one repetition (the median of {COST_REPEATS} "
        f"reported): this machine's speed drifts by up to 2x over tens of seconds. Theory: tokens per call (1 - a^(g+1)) / (1 - a), speed-up (1 - a^(g+1)) / "
        f"((1 - a)(g c + 1)) from the measured alpha and c; beside it, the prediction with "
        f"measured costs, tokens per call / (g c + v(g) + overhead), where v(g) is the target's "
        f"verify pass over g + 1 tokens and the overhead the rest of a round, each timed alone, in "
        f"target decode steps. See `experiments/speculative.py` for exactly what is timed."
        + _brackets(rows))


def _brackets(rows) -> str:
    """What the page's brackets are, and which rows have none."""
    kept = sum("accepted_per_prompt" in r["metrics"] for r in rows)
    if not kept:
        return (" No intervals: the rows keep no per-prompt values (an earlier version of the "
                "study wrote them).")
    n = rows[0]["config"]["num_prompts"]
    one_batch = sorted({r["config"]["batch_size"] for r in rows
                        if r["config"]["batch_size"] == r["config"]["num_prompts"]})
    return (f" Brackets: 95% percentile bootstrap interval ({RESAMPLES:,} resamples, fixed "
            f"seed; `decodelab.measure.stats`): alpha and tokens per call over the prompts; the speed-up "
            f"over the timed batches (at batch 1, the prompts), each batch's target and "
            f"speculative seconds drawn together, its estimate the measured speed-up; measured / "
            f"predicted, the speed-up's interval over the prediction, taken as fixed. The best "
            f"gamma is the one of largest measured speed-up, so its interval leans high."
            + "".join(f" At batch {b} the {n} prompts run as one batch: its speed-ups have no "
                      f"interval." for b in one_batch)
            + (" Rows that keep no per-prompt values (an earlier version of the study) show "
               "plain numbers." if kept < len(rows) else ""))


def report(rows, out_dir) -> list[pathlib.Path]:
    """One page per target: ``speculative.md`` for the default `medium` target,
    ``speculative_<name>.md`` for another one trained here (`small`) or a pretrained one, each
    with its own tables and plots."""
    targets: dict[str, list] = {}
    for row in rows:
        targets.setdefault(_target_name(row), []).append(row)
    seed0 = {name: [r for r in group if draft_seed(r) == 0] for name, group in targets.items()}
    return [path for name, group in targets.items()
            for path in _page(seed0[name], pathlib.Path(out_dir),
                              "speculative" + ("" if name == DEFAULT_TARGET else f"_{name}"),
                              reseeded=[r for r in group if draft_seed(r) != 0],
                              compared={other: group0 for other, group0 in seed0.items()
                                        if name == DEFAULT_TARGET and other != name
                                        and group0 and not _pretrained(group0[0])})]


def draft_seed(row) -> int:
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


def _comparison(rows, compared: dict) -> str | None:
    """The best batch-1 speed-up of each drafter beside the same drafter's on another target
    trained here (the `small` comparison rows): what a larger target buys the same drafters."""
    lines = []
    for name, other in compared.items():
        cells = []
        for drafter, _, temperature, here in _best_points(rows, batches=[1]):
            there = _best(other, drafter, 1, temperature)
            if there is None:
                continue
            cells.append(
                f"{DRAFTER_LABELS[drafter]} at temperature {temperature:g}: "
                + " against ".join(f"{_times(_cells(best)['speedup'])} (gamma "
                                   f"{best['config']['gamma']}, c = {_m(best, 'c'):.3f})"
                                   for best in (here, there)))
        if cells:
            lines.append(
                f"**Against the `{name}` target** (its page: [speculative_{name}.md]"
                f"(speculative_{name}.md); the same drafters and sweep), best speed-up at batch 1 "
                f"here against there: " + "; ".join(cells) + ".")
    return "\n\n".join(lines) or None


def _page(rows, out_dir: pathlib.Path, name: str, reseeded=(),
          compared=None) -> list[pathlib.Path]:
    """The page of one target's rows, its files named ``<name>...``; ``reseeded``: its rows with
    drafters trained from another seed (the distillation claim's second seed, and a table);
    ``compared``: other targets' rows (name -> rows) whose best points the page sets beside its
    own."""
    pretrained, target = _pretrained(rows[0]), _target_name(rows[0])
    page = results.Page(
        "Speculative decoding" if target == DEFAULT_TARGET else
        f"Speculative decoding of the pretrained `{pretrained}`" if pretrained else
        f"Speculative decoding of `{target}` (comparison rows)", rows)
    page.text(_intro(rows))
    page.text(_summary(rows, targets=target == DEFAULT_TARGET, reseeded=reseeded))
    comparison = _comparison(rows, compared or {})
    if comparison:
        page.text(comparison)
    page.table(_best_table(rows), out_dir / f"{name}_best.csv", number_format="{:.3g}",
               caption="**Best gamma per drafter, batch size and temperature** (by measured "
                       "speed-up).")
    speedup = _grid_plot(rows, out_dir / f"{name}_speedup.png", "speedup",
                         "predicted_speedup", "speed-up over target only",
                         "Speed-up against gamma: measured (solid; bars: 95% interval), theory "
                         "(dashed), with measured costs (dotted)",
                         measured_costs="predicted_speedup_measured_costs")
    page.image(speedup, "speed-up against gamma, measured and predicted")
    calls = _grid_plot(rows, out_dir / f"{name}_tokens_per_call.png", "tokens_per_call",
                       "expected_tokens_per_call", "tokens per target call",
                       "Tokens per target call: measured (solid; bars: 95% interval) and "
                       "(1-a^(g+1))/(1-a) (dashed)")
    page.image(calls, "tokens per target call against gamma, measured and expected")
    page.table(_points_table(rows), out_dir / f"{name}.csv", number_format="{:.3g}",
               caption="**Every point.** `round cost`: measured time per round over the "
                       "theory's gamma * c + 1 target steps.")
    written = [out_dir / f"{name}.csv", out_dir / f"{name}_best.csv", speedup, calls]
    if reseeded:
        seeds = sorted({draft_seed(r) for r in reseeded})
        page.table(_points_table(reseeded), out_dir / f"{name}_seeds.csv",
                   number_format="{:.3g}",
                   caption=f"**The model drafters trained from seed {', '.join(map(str, seeds))}"
                           f"** (the points above: seed 0), for the distillation claim.")
        written.append(out_dir / f"{name}_seeds.csv")
    return [page.write(out_dir / f"{name}.md"), *written]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    app.run(main)
