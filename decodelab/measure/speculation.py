"""What one speculative-decoding point measures: acceptance, tokens per target call and the
wall-clock speed-up of ``speculative_generate`` over target-only ``generate``, beside the theory
of Leviathan et al. (2023) and beside a prediction from costs measured alone.

The prompts (equal lengths) run in consecutive batches of ``Run.batch_size``; every request
generates exactly ``Run.new_tokens`` tokens (no EOS), prompt i with seed ``Run.seed + i``. What
each number of ``measure_point``'s row is:

- ``alpha``: accepted / tested proposals over all requests (a proposal is tested when every
  earlier one of its round was accepted).
- ``tokens_per_call``: output tokens / target calls (verify passes), all requests together;
  ``expected_tokens_per_call = (1 - alpha^(g+1)) / (1 - alpha)``.
- ``c``: the cost ratio. For a draft model, its decode-step time over the target's, each from
  ``generate`` runs of ``step_tokens`` and of 1 token (the difference over ``step_tokens - 1``
  steps). For prompt lookup, the time of one proposal / gamma over the target's step time.
- ``verify_cost`` v(gamma), ``propose_cost``, ``isolated_round_cost``: the seconds of the target's
  verify pass over gamma + 1 tokens, of the drafter's proposal and of a whole round, each timed
  alone (a compiled loop repeating it from the state the first round starts from, the caches
  rewound after each), over the target's decode step. All these runs are timed round-robin, once
  per repetition (``cost_seconds``), each ratio taken within its repetition and the median over
  repetitions reported: the machine's speed drifts by up to 2x over tens of seconds.
  ``target_step_ms`` and ``draft_step_ms``: medians.
- ``overhead``: ``isolated_round_cost - propose_cost - v``, in target steps: the accept test, the
  residual or bonus draw, stop checks, recording and rewinds (and, for a model draft on a sampled
  rejection, the step that recomputes the rejected position's q row).
- ``predicted_speedup = (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1))``: the theory, which charges a
  verify pass as one decode step and a round nothing else.
- ``predicted_speedup_measured_costs = tokens_per_call / (g c + v + overhead)``.
- ``speedup``: median seconds of target-only ``generate`` over the median seconds of
  ``speculative_generate`` for all prompts, same parameters, seeds and cache size. After one
  warm-up run of each (compiles), all prompts are timed ``repeats`` times, each batch's two runs
  back to back in alternating order (``paired_seconds``). ``compile_s``: the first speculative
  run minus the median.
- ``round_cost``: measured seconds per loop round (a batch's rounds are its slowest row's) over
  the theory's charge per round, ``(g c + 1)`` target steps.
- ``load_1min``: the machine's 1-minute load average when the point started.
- Per prompt and per repetition, for a bootstrap over prompts: ``accepted_per_prompt``,
  ``tested_per_prompt``, ``generated_per_prompt``, ``rounds_per_prompt`` (prompt order), and
  ``target_seconds_per_batch`` / ``speculative_seconds_per_batch`` (``{"r<i>": [seconds of each
  batch]}`` for repetition i).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decodelab.decode.generation import generate
from decodelab.decode.request import DecodeOptions, OutputSpec, RowInputs
from decodelab.measure.timing import timed
from decodelab.model.transformer import param_count
from decodelab.sampling.params import SamplingParams, batch_keys
from decodelab.speculative import generation as speculative

ROUND_PARTS = ("propose", "verify", "round")
COST_REPEATS = 5  # repetitions of the cost timings (at least; ``Run.repeats`` if more)


@dataclasses.dataclass(frozen=True)
class Run:
    """One point's decoding and timing: proposals per round, temperature of both models,
    requests per batch, output tokens per request, the first request's seed, the cache size of
    every run, timed repetitions and the output tokens of the step-timing runs."""

    gamma: int
    temperature: float
    batch_size: int
    new_tokens: int
    seed: int
    max_len: int
    repeats: int
    step_tokens: int


def step_runs(model, prompts, params, step_tokens: int, max_len: int) -> tuple:
    """``generate`` of ``step_tokens`` tokens and of 1, whose time difference over
    ``step_tokens - 1`` is one decode step of ``model`` at this batch and these parameters."""
    return tuple(functools.partial(generate, model, prompts, params, n, seed=0,
                                   options=DecodeOptions(max_len=max_len))
                 for n in (step_tokens, 1))


def start_state(target, drafter, draft_weights, prompts, params, gamma: int, max_len: int,
                max_new_tokens: int) -> speculative.SpecState:
    """The state ``speculative_generate`` starts its rounds from, for ``prompts`` (equal
    lengths), seed 0."""
    if params.constrained:  # the rows below carry no constraint table
        raise ValueError(f"params must be free of constraints for a timed round, got "
                         f"regex={params.regex!r}, json_schema={params.json_schema!r}")
    block = np.asarray(prompts, np.int32)
    B, V = block.shape[0], target.config.vocab_size
    lengths = np.full((B,), block.shape[1], np.int32)
    graphdef, weights = nnx.split(target)
    caches = speculative.prefill(weights, draft_weights, block, lengths - 1, graphdef=graphdef,
                                 drafter=drafter, max_len=max_len)
    rows = RowInputs(prompt_lengths=lengths, keys=batch_keys(0, B), params=params.per_row(B, V),
                     eos_mask=np.zeros((V,), bool), stop_ids=np.zeros((0, 1), np.int32))
    return speculative.initial_state(*caches, block, rows, gamma=gamma,
                                     outputs=OutputSpec(max_new_tokens))


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


def cost_seconds(target, draft, prompts, params, run: Run, repeats: int,
                 count: int = 20) -> dict[str, list[float]]:
    """Seconds of what the predictions charge, one value per repetition: ``target_step`` and (for
    a draft model) ``draft_step``, a decode step of ``generate`` (``step_runs``); and each part
    of one round at this batch (``ROUND_PARTS``): the drafter's proposal, the target's verify
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
    state = start_state(target, drafter, draft_weights, prompts, params, run.gamma, run.max_len,
                        run.new_tokens)
    proposal, _ = jax.jit(drafter.propose)(draft_weights, state)
    runs = dict(zip(("target_many", "target_one"),
                    step_runs(target, prompts, params, run.step_tokens, run.max_len)))
    if draft_weights is not None:
        runs.update(zip(("draft_many", "draft_one"),
                        step_runs(draft, prompts, params, run.step_tokens, run.max_len)))
    for part in ROUND_PARTS:
        runs[part] = functools.partial(_repeat_part, (target_weights, draft_weights), state,
                                       proposal, graphdef=graphdef, drafter=drafter, part=part,
                                       count=count)
    for fn in runs.values():
        fn()  # warm-up (compiles)
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    out = {part: [t / count for t in times[part]] for part in ROUND_PARTS}
    for model in ("target", "draft"):
        if f"{model}_many" in times:
            out[f"{model}_step"] = [max(many - one, 1e-9) / (run.step_tokens - 1) for many, one
                                    in zip(times[f"{model}_many"], times[f"{model}_one"])]
    return out


def cost_ratios(costs: dict[str, list[float]], gamma: int) -> dict[str, float]:
    """The row's cost fields from ``cost_seconds``: each cost over the target step of its own
    repetition, then the median over repetitions; ``target_step`` in seconds (the median)."""
    steps = costs["target_step"]
    per_step = {name: statistics.median(t / step for t, step in zip(costs[name], steps))
                for name in (*ROUND_PARTS, "draft_step") if name in costs}
    target_step = statistics.median(steps)
    c = per_step["draft_step"] if "draft_step" in per_step else per_step["propose"] / gamma
    return {"c": c, "target_step": target_step, "draft_step": c * target_step,
            "verify_cost": per_step["verify"], "propose_cost": per_step["propose"],
            "isolated_round_cost": per_step["round"],
            "overhead": per_step["round"] - per_step["propose"] - per_step["verify"]}


def paired_seconds(target_batch: Callable[[int], object],
                   speculative_batch: Callable[[int], object], num_batches: int, repeats: int
                   ) -> tuple[list[list[float]], list[list[float]]]:
    """``(target, speculative)`` seconds ``[repetition][batch]``: each batch's two runs back to
    back, which first alternating with the repetition and the batch, so that a drift in the
    machine's speed reaches both sides of every pair."""
    target_times, speculative_times = [], []
    for repetition in range(repeats):
        pair = ([], [])
        for i in range(num_batches):
            order = (0, 1) if (repetition + i) % 2 == 0 else (1, 0)
            for arm in order:
                fn = (target_batch, speculative_batch)[arm]
                pair[arm].append(timed(functools.partial(fn, i)))
        target_times.append(pair[0])
        speculative_times.append(pair[1])
    return target_times, speculative_times


@dataclasses.dataclass(frozen=True)
class Timed:
    """A point's timings: the median seconds of all prompts, target-only and speculative; the
    first speculative run's seconds (with its compiles); and each repetition's seconds of each
    batch, ``[repetition][batch]``."""

    target_s: float
    speculative_s: float
    first_s: float
    target_times: list[list[float]]
    speculative_times: list[list[float]]


def measure_point(target, drafter, prompts: Sequence[Sequence[int]], run: Run, *, name: str,
                  load_1min: float, status: Callable[[str], None]) -> dict:
    """The row of one point (the module docstring): ``drafter`` (a draft model or a
    ``speculative.Drafter``, called ``name``) proposing for ``target`` on ``prompts``."""
    B, N, gamma = run.batch_size, run.new_tokens, run.gamma
    if len(prompts) % B:
        raise ValueError(f"num_prompts must be a multiple of batch_size={B}, got {len(prompts)}")
    params = SamplingParams(temperature=run.temperature)
    batches = [(prompts[i:i + B], [run.seed + j for j in range(i, i + B)])
               for i in range(0, len(prompts), B)]

    def target_batch(i):
        chunk, seeds = batches[i]
        return generate(target, chunk, params, N, seed=seeds,
                        options=DecodeOptions(max_len=run.max_len))

    def speculative_batch(i):
        chunk, seeds = batches[i]
        return speculative.speculative_generate(
            target, drafter, chunk, params, gamma, N, seed=seeds,
            options=speculative.SpeculativeOptions(max_len=run.max_len))

    status("warm-up")
    first = time.perf_counter()
    outputs = [speculative_batch(i) for i in range(len(batches))]
    first = time.perf_counter() - first
    for i in range(len(batches)):
        target_batch(i)
    status("timing")
    target_times, speculative_times = paired_seconds(target_batch, speculative_batch,
                                                     len(batches), run.repeats)
    target_s = statistics.median(sum(t) for t in target_times)
    speculative_s = statistics.median(sum(t) for t in speculative_times)
    status("costs")
    costs = cost_ratios(cost_seconds(target, drafter, batches[0][0], params, run,
                                     max(run.repeats, COST_REPEATS)), gamma)
    timed = Timed(target_s=target_s, speculative_s=speculative_s, first_s=first,
                  target_times=target_times, speculative_times=speculative_times)
    sizes = (param_count(target),
             0 if isinstance(drafter, speculative.Drafter) else param_count(drafter))
    return point_row(outputs, costs, timed, gamma, name=name, params=sizes, load_1min=load_1min)


def point_row(outputs: Sequence[speculative.SpeculativeOutput], costs: dict[str, float],
              timed: Timed, gamma: int, *, name: str, params: tuple[int, int],
              load_1min: float) -> dict:
    """The row (the module docstring) from the warm-up's outputs (one per batch), the costs
    (``cost_ratios``), the timings, the drafter's name, the parameter counts (target, draft) and
    the load average."""
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
    c, v, overhead, target_step = (costs[k] for k in ("c", "verify_cost", "overhead",
                                                      "target_step"))
    target_s, speculative_s = timed.target_s, timed.speculative_s

    def per_prompt(field):  # prompt order, batch after batch
        return [int(x) for s in stats for x in getattr(s, field)]

    def per_repetition(seconds_):  # repetition -> each batch's seconds
        return {f"r{i}": [float(t) for t in batch] for i, batch in enumerate(seconds_)}

    row = {
        "drafter": name,
        "alpha": alpha,
        "tokens_per_call": tokens_per_call,
        "expected_tokens_per_call": (None if alpha is None else
                                     float(speculative.expected_tokens_per_call(alpha, gamma))),
        "acceptance_by_position": " ".join("n/a" if np.isnan(a) else f"{a:.3f}"
                                           for a in by_position),
        "c": c,
        "target_step_ms": 1e3 * target_step,
        "draft_step_ms": 1e3 * costs["draft_step"],
        "predicted_speedup": (None if alpha is None else
                              float(speculative.predicted_speedup(alpha, gamma, c))),
        "verify_cost": v,
        "propose_cost": costs["propose_cost"],
        "isolated_round_cost": costs["isolated_round_cost"],
        "overhead": overhead,
        "predicted_speedup_measured_costs": tokens_per_call / (gamma * c + v + overhead),
        "speedup": target_s / speculative_s,
        "target_tokens_per_s": generated / target_s,
        "speculative_tokens_per_s": generated / speculative_s,
        "target_s": target_s,
        "speculative_s": speculative_s,
        "round_ms": 1e3 * speculative_s / rounds,
        "round_cost": speculative_s / rounds / ((gamma * c + 1) * target_step),
        "compile_s": max(timed.first_s - speculative_s, 0.0),
        "target_params": params[0],
        "draft_params": params[1],
        "load_1min": load_1min,
        # Per prompt (prompt order) and per repetition, for resampling prompts later.
        "accepted_per_prompt": per_prompt("accepted"),
        "tested_per_prompt": per_prompt("tested"),
        "generated_per_prompt": per_prompt("generated"),
        "rounds_per_prompt": per_prompt("rounds"),
        "target_seconds_per_batch": per_repetition(timed.target_times),
        "speculative_seconds_per_batch": per_repetition(timed.speculative_times),
    }
    row["prediction_error"] = (None if row["predicted_speedup"] is None else
                               row["speedup"] / row["predicted_speedup"] - 1.0)
    row["prediction_error_measured_costs"] = (
        row["speedup"] / row["predicted_speedup_measured_costs"] - 1.0)
    return row
