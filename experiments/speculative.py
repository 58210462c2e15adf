"""Speculative decoding: acceptance, tokens per target call and wall-clock speed-up of three
drafters against target-only decoding, beside the theory of Leviathan et al. (2023).

    python -m experiments.speculative --config=configs/speculative.py --workdir=runs/speculative
    python -m experiments.report --workdir=runs/speculative --out=results

One point = one (drafter, gamma, temperature, batch size). The target is `small` trained on the
corpus; the drafters are the `draft` preset trained on the corpus, the same preset distilled from
the target, and prompt lookup. With ``configs/speculative.py:<pretrained preset>`` the target is
that real model (``pipeline.model_for``) and the draft is trained on the corpus in its tokenizer
(``tokenizer.pretrained``); each target's rows get a page of their own (``report``). The prompts are
``num_prompts`` evenly spaced windows of the held-out test plays (in the target's tokens), run in
consecutive batches of ``batch_size``; every request generates exactly
``new_tokens`` tokens (no EOS), with seed ``seed + i`` for prompt i. What each number is:

- ``alpha``: accepted / tested proposals over all requests (``SpeculativeStats.overall_alpha``;
  a proposal is tested when every earlier one of its round was accepted).
- ``tokens_per_call``: output tokens / target calls (verify passes), all requests together;
  ``expected_tokens_per_call = (1 - alpha^(g+1)) / (1 - alpha)``.
- ``c``: the cost ratio, measured in this process at this batch size and temperature. For a draft
  model, its decode-step time over the target's, each from ``dl.generate`` runs of
  ``step_tokens`` and of 1 token (the difference over ``step_tokens - 1`` steps). For prompt
  lookup, the time of one proposal (of gamma tokens, compiled in a loop) / gamma over the
  target's step time.
- ``predicted_speedup = (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1))``.
- ``speedup``: median seconds of target-only ``dl.generate`` over the median seconds of
  ``speculative_generate`` for all prompts, with the same parameters, seeds and cache size
  (``prompt bucket + new_tokens + cache_slack``). After one warm-up run of each (compiles), the
  two are timed ``repeats`` times, alternately, so that a change in the machine's load reaches
  both. ``compile_s``: the first speculative run minus the median.
- ``round_cost``: measured seconds per loop round (``speculative_generate`` time over its rounds;
  a batch's rounds are its slowest row's) over the theory's charge per round, ``(g c + 1)`` target
  steps: above 1 where verifying ``g + 1`` tokens, the bookkeeping of a round or a batch waiting
  for its slowest row costs more than the theory says.
- ``load_1min``: the machine's 1-minute load average when the point started.
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

from decodelab import data, experiment, pipeline, results, sampling, speculative
from decodelab.decode import generate
from decodelab.model import param_count
from decodelab.request import bucket_length
from decodelab.sampling import SamplingParams

_FLAGS = experiment.define_flags("configs/speculative.py")

DRAFTER_LABELS = {"draft": "draft (trained)", "distilled": "draft (distilled)",
                  "ngram": "prompt lookup"}

# Models and step times, kept for the whole process: every point reuses them.
_CACHE: dict = {}


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def held_out_prompts(tokenizer, num: int, length: int) -> list[list[int]]:
    """``num`` windows of ``length`` tokens, evenly spaced over the test plays' token stream."""
    stream = data.token_stream(tokenizer, "test")
    starts = np.linspace(0, len(stream) - length - 1, num).astype(int)
    return [stream[s:s + length].tolist() for s in starts]


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
        drafter, _ = _cached(("distilled", experiment.config_hash(config.draft)), lambda: (
            pipeline.distilled_model(config.tokenizer, config.target.model, config.target.train,
                                     config.draft.model, config.draft.train, ctx.workdir,
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


def step_seconds(model, prompts, params, step_tokens: int, max_len: int, repeats: int) -> float:
    """One decode step of ``model`` in ``dl.generate`` at this batch and these parameters:
    (median time of ``step_tokens`` tokens - median time of 1) / (step_tokens - 1)."""
    run = functools.partial(generate, model, prompts, params, seed=0, max_len=max_len)
    times = {}
    for n in (step_tokens, 1):
        run(n)  # warm-up (compiles)
        times[n] = statistics.median(_seconds(lambda: run(n)) for _ in range(repeats))
    return max(times[step_tokens] - times[1], 1e-9) / (step_tokens - 1)


@functools.partial(jax.jit, static_argnames=("drafter", "count"))
def _propose_repeatedly(state, *, drafter, count):
    def body(_, total):
        # Depending on the carry keeps XLA from hoisting the (loop-invariant) proposal out.
        now = state.replace(lengths=state.lengths + jnp.minimum(total, 0))
        proposal, _ = drafter.propose(None, now)
        return total + jnp.sum(proposal.tokens)
    return jax.lax.fori_loop(0, count, body, jnp.zeros((), jnp.int32))


def ngram_proposal_seconds(target, drafter, prompts, params, gamma: int, max_len: int,
                           repeats: int, count: int = 200) -> float:
    """Seconds of one prompt-lookup proposal of ``gamma`` tokens for the batch ``prompts``."""
    block = np.asarray(prompts, np.int32)
    lengths = np.full((len(prompts),), block.shape[1], np.int32)
    graphdef, weights = nnx.split(target)
    caches = speculative.prefill(weights, None, block, lengths - 1, graphdef=graphdef,
                                 drafter=drafter, max_len=max_len)
    V = target.config.vocab_size
    state = speculative.initial_state(
        *caches, block, lengths, sampling.batch_keys(0, len(prompts)),
        params.per_row(len(prompts), V), np.zeros((V,), bool), np.zeros((0, 1), np.int32),
        gamma=gamma, max_new_tokens=8)
    run = functools.partial(_propose_repeatedly, state, drafter=drafter, count=count)
    run()
    return statistics.median(_seconds(run) for _ in range(repeats)) / count


def evaluate(config, ctx) -> dict:
    load = os.getloadavg()[0]
    target, drafter, tokenizer = load_models(config, ctx)
    prompts = held_out_prompts(tokenizer, config.num_prompts, config.prompt_tokens)
    B, N, gamma = config.batch_size, config.new_tokens, config.gamma
    if config.num_prompts % B:
        raise ValueError(f"num_prompts must be a multiple of batch_size={B}, "
                         f"got {config.num_prompts}")
    params = SamplingParams(temperature=config.temperature)
    max_len = bucket_length(config.prompt_tokens) + N + config.cache_slack
    batches = [(prompts[i:i + B], [config.seed + j for j in range(i, i + B)])
               for i in range(0, len(prompts), B)]

    def run_target():
        return [generate(target, chunk, params, N, seed=seeds, max_len=max_len)
                for chunk, seeds in batches]

    def run_speculative():
        return [speculative.speculative_generate(target, drafter, chunk, params, gamma, N,
                                                 seed=seeds, max_len=max_len)
                for chunk, seeds in batches]

    ctx.status("warm-up")
    first = time.perf_counter()
    outputs = run_speculative()
    first = time.perf_counter() - first
    run_target()
    ctx.status("timing")
    target_times, speculative_times = [], []
    for _ in range(config.repeats):
        target_times.append(_seconds(run_target))
        speculative_times.append(_seconds(run_speculative))
    target_s, speculative_s = statistics.median(target_times), statistics.median(speculative_times)

    ctx.status("cost ratio")
    step_repeats = max(config.repeats, 3)
    target_step = _cached(("step", "target", B, config.temperature), lambda: step_seconds(
        target, batches[0][0], params, config.step_tokens, max_len, step_repeats))
    if config.drafter == "ngram":
        draft_step = ngram_proposal_seconds(target, drafter, batches[0][0], params, gamma,
                                            max_len, step_repeats) / gamma
    else:
        draft_step = _cached(("step", config.drafter, B, config.temperature), lambda: step_seconds(
            drafter, batches[0][0], params, config.step_tokens, max_len, step_repeats))
    c = draft_step / target_step

    stats = [out.stats for out in outputs]
    tested = sum(s.tested_by_position.sum(axis=0) for s in stats)  # [gamma]
    accepted = sum(s.accepted_by_position.sum(axis=0) for s in stats)
    alpha = float(accepted.sum() / tested.sum()) if tested.sum() else None
    generated = sum(int(s.generated.sum()) for s in stats)
    calls = sum(int(s.rounds.sum()) for s in stats)
    rounds = sum(int(s.rounds.max()) for s in stats)  # loop iterations: a batch's slowest row
    with np.errstate(invalid="ignore", divide="ignore"):
        by_position = accepted / tested
    row = {
        "drafter": config.drafter,
        "alpha": alpha,
        "tokens_per_call": generated / calls,
        "expected_tokens_per_call": (None if alpha is None else
                                     float(speculative.expected_tokens_per_call(alpha, gamma))),
        "acceptance_by_position": " ".join("n/a" if np.isnan(a) else f"{a:.3f}"
                                           for a in by_position),
        "c": c,
        "target_step_ms": 1e3 * target_step,
        "draft_step_ms": 1e3 * draft_step,
        "predicted_speedup": (None if alpha is None else
                              float(speculative.predicted_speedup(alpha, gamma, c))),
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
    }
    row["prediction_error"] = (None if row["predicted_speedup"] is None else
                               row["speedup"] / row["predicted_speedup"] - 1.0)
    return row


# --- The page -------------------------------------------------------------------------------------


def _m(row, name):
    return row["metrics"][name]


def _where(rows, **conditions):
    return [r for r in rows if all(_m(r, k) == v if k in r["metrics"] else r["config"][k] == v
                                   for k, v in conditions.items())]


def _points_table(rows) -> results.Table:
    columns = ["drafter", "batch", "temperature", "gamma", "alpha", "tokens/call",
               "expected tokens/call", "c", "speed-up", "predicted", "measured / predicted",
               "round cost", "acceptance by position"]
    body = []
    for r in sorted(rows, key=lambda r: (list(DRAFTER_LABELS).index(_m(r, "drafter")),
                                         r["config"]["batch_size"], r["config"]["temperature"],
                                         r["config"]["gamma"])):
        error = _m(r, "prediction_error")
        body.append([DRAFTER_LABELS[_m(r, "drafter")], r["config"]["batch_size"],
                     r["config"]["temperature"], r["config"]["gamma"], _m(r, "alpha"),
                     _m(r, "tokens_per_call"), _m(r, "expected_tokens_per_call"), _m(r, "c"),
                     _m(r, "speedup"), _m(r, "predicted_speedup"),
                     None if error is None else 1.0 + error, _m(r, "round_cost"),
                     _m(r, "acceptance_by_position")])
    return results.Table(columns, body)


def _best_table(rows) -> results.Table:
    """Per drafter, batch and temperature: the gamma with the largest measured speed-up."""
    columns = ["drafter", "batch", "temperature", "best gamma", "alpha", "c", "tokens/call",
               "speed-up", "predicted", "measured / predicted"]
    body = []
    for drafter in DRAFTER_LABELS:
        for batch in sorted({r["config"]["batch_size"] for r in rows}):
            for temperature in sorted({r["config"]["temperature"] for r in rows}):
                group = _where(rows, drafter=drafter, batch_size=batch, temperature=temperature)
                if not group:
                    continue
                best = max(group, key=lambda r: _m(r, "speedup"))
                error = _m(best, "prediction_error")
                body.append([DRAFTER_LABELS[drafter], batch, temperature,
                             best["config"]["gamma"], _m(best, "alpha"), _m(best, "c"),
                             _m(best, "tokens_per_call"), _m(best, "speedup"),
                             _m(best, "predicted_speedup"), None if error is None else 1 + error])
    return results.Table(columns, body)


def _grid_plot(rows, path, measured: str, predicted: str, ylabel: str, title: str):
    """One panel per (batch, temperature): ``measured`` (solid) and ``predicted`` (dashed)
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
                ax.plot(gammas, [_m(r, measured) for r in group], marker="o",
                        color=colours[drafter], label=f"{label}, measured")
                pairs = [(g, _m(r, predicted)) for g, r in zip(gammas, group)
                         if _m(r, predicted) is not None]
                ax.plot([g for g, _ in pairs], [v for _, v in pairs], marker="x", linestyle="--",
                        color=colours[drafter], label=f"{label}, theory")
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


def _summary(rows) -> str:
    """The reading of the table, computed from the rows: the targets (of the default study, whose
    target model is trained here), the theory, distillation."""
    lines = []
    targets = _pretrained(rows[0]) is None
    greedy1 = _where(rows, batch_size=1, temperature=0.0)
    if greedy1:
        best = max(greedy1, key=lambda r: _m(r, "speedup"))
        met = _m(best, "speedup") >= 1.5
        error = _m(best, "prediction_error")
        within = error is not None and abs(error) <= 0.2
        lines.append(
            (f"**Target 1 (>= 1.5x at batch 1, temperature 0): {'met' if met else 'not met'}.** "
             if targets else "**Batch 1, temperature 0.** ") +
            f"The best point is {DRAFTER_LABELS[_m(best, 'drafter')]} at gamma "
            f"{best['config']['gamma']}: {_m(best, 'speedup'):.2f}x the target-only tokens/s "
            f"({_m(best, 'speculative_tokens_per_s'):.0f} vs {_m(best, 'target_tokens_per_s'):.0f}"
            f" tokens/s), alpha {_m(best, 'alpha'):.3f}, {_m(best, 'tokens_per_call'):.2f} "
            f"tokens per target call, c = {_m(best, 'c'):.3f}.")
        for drafter in ("draft", "distilled"):
            group = _where(greedy1, drafter=drafter)
            if group:
                b = max(group, key=lambda r: _m(r, "speedup"))
                lines.append(
                    f"With {DRAFTER_LABELS[drafter]} the best is {_m(b, 'speedup'):.2f}x at gamma "
                    f"{b['config']['gamma']} (alpha {_m(b, 'alpha'):.3f}, c = {_m(b, 'c'):.3f}, "
                    f"predicted {_m(b, 'predicted_speedup'):.2f}x).")
        lines.append("")
        if not targets:
            lines.append("At that point measured / predicted = " + (
                "n/a (no alpha)." if error is None else f"{1 + error:.2f}."))
        elif error is not None:
            lines.append(f"**Target 2 (measured within 20% of predicted, at that point): "
                         f"{'met' if within else 'not met'}** — measured / predicted = "
                         f"{1 + error:.2f}.")
        else:
            lines.append("**Target 2**: n/a (no alpha).")
        errors = [_m(r, "prediction_error") for r in rows if _m(r, "prediction_error") is not None]
        inside = sum(abs(e) <= 0.2 for e in errors)
        costs = [_m(r, "round_cost") for r in greedy1]
        batches = {r["config"]["batch_size"] for r in rows}
        lines.append(
            f"Over all {len(errors)} points, {inside} are within 20% of the prediction "
            f"(median measured / predicted {1 + statistics.median(errors):.2f}). The theory "
            f"charges a round gamma * c + 1 target steps; measured, a round at batch 1 and "
            f"temperature 0 costs {min(costs):.2f}x to {max(costs):.2f}x that (median "
            f"{statistics.median(costs):.2f}x, the `round cost` column): the verify pass over "
            f"gamma + 1 tokens is dearer than one decode step, and a round's bookkeeping (the "
            f"processors and the accept test on gamma + 1 positions, the cache rewinds) is paid "
            f"per round, not per token. Where a round costs more than the theory charges, the "
            f"speed-up falls short of the prediction by that factor" + (
                f" (at batch {max(batches)} also because a batch runs as many rounds as its "
                f"slowest row)." if max(batches) > 1 else "."))
    lines.append("")
    for temperature in sorted({r["config"]["temperature"] for r in rows}):
        pairs = []
        for drafter in ("draft", "distilled"):
            group = _where(rows, drafter=drafter, temperature=temperature, batch_size=1)
            alphas = [_m(r, "alpha") for r in group if _m(r, "alpha") is not None]
            if alphas:
                pairs.append(statistics.mean(alphas))
        if len(pairs) == 2:
            lines.append(f"- Temperature {temperature:g}: alpha {pairs[0]:.3f} with the trained "
                         f"draft, {pairs[1]:.3f} with the distilled one (mean over gamma, batch 1)"
                         f": distillation {'raises' if pairs[1] > pairs[0] else 'does not raise'} "
                         f"acceptance by {pairs[1] - pairs[0]:+.3f}.")
    loads = [_m(r, "load_1min") for r in rows]
    lines.append("")
    lines.append(f"The machine's 1-minute load average at the start of the points was "
                 f"{min(loads):.2f} to {max(loads):.2f} (median {statistics.median(loads):.2f}) "
                 f"on {rows[0]['provenance'].get('cpu_count')} CPUs: the timed runs shared it "
                 f"with whatever else ran, which the interleaved repetitions spread over both "
                 f"sides of each ratio.")
    return "\n".join(lines)


def _pretrained(row) -> str | None:
    """The pretrained preset a row's target is (None: the `small` model trained here)."""
    return row["config"]["target"]["model"].get("pretrained")


def _intro(rows) -> str:
    """What the rows measured: the target, the drafters present, the prompts and the timing."""
    config, m0 = rows[0]["config"], rows[0]["metrics"]
    pretrained = _pretrained(rows[0])
    if pretrained is None:
        target = (f"`small` ({m0['target_params']:,} parameters, "
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
        "distilled": f"the same preset distilled from the target for as many steps (forward KL "
                     f"to its next-token distributions at temperature "
                     f"{config['distill_temperature']:g})",
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
        f"and cache size, medians of {config['repeats']} interleaved repetitions after a warm-up "
        f"(compilation excluded). c: draft step time over target step time, measured in the same "
        f"process. Theory: tokens per call (1 - a^(g+1)) / (1 - a), speed-up (1 - a^(g+1)) / "
        f"((1 - a)(g c + 1)) from the measured alpha and c. See `experiments/speculative.py` for "
        f"exactly what is timed.")


def report(rows, out_dir) -> list[pathlib.Path]:
    """One page per target: ``speculative.md`` for the `small` target trained here,
    ``speculative_<preset>.md`` for a pretrained one (each with its own tables and plots)."""
    targets: dict[str | None, list] = {}
    for row in rows:
        targets.setdefault(_pretrained(row), []).append(row)
    return [path for pretrained, group in targets.items()
            for path in _page(group, pathlib.Path(out_dir),
                              "speculative" + ("" if pretrained is None else f"_{pretrained}"))]


def _page(rows, out_dir: pathlib.Path, name: str) -> list[pathlib.Path]:
    """The page of one target's rows, its files named ``<name>...``."""
    pretrained = _pretrained(rows[0])
    page = results.Page("Speculative decoding" if pretrained is None else
                        f"Speculative decoding of the pretrained `{pretrained}`", rows)
    page.text(_intro(rows))
    page.text(_summary(rows))
    page.table(_best_table(rows), out_dir / f"{name}_best.csv", number_format="{:.3g}",
               caption="**Best gamma per drafter, batch size and temperature** (by measured "
                       "speed-up).")
    speedup = _grid_plot(rows, out_dir / f"{name}_speedup.png", "speedup",
                         "predicted_speedup", "speed-up over target only",
                         "Speed-up against gamma: measured (solid) and theory (dashed)")
    page.image(speedup, "speed-up against gamma, measured and predicted")
    calls = _grid_plot(rows, out_dir / f"{name}_tokens_per_call.png", "tokens_per_call",
                       "expected_tokens_per_call", "tokens per target call",
                       "Tokens per target call: measured (solid) and (1-a^(g+1))/(1-a) (dashed)")
    page.image(calls, "tokens per target call against gamma, measured and expected")
    page.table(_points_table(rows), out_dir / f"{name}.csv", number_format="{:.3g}",
               caption="**Every point.** `round cost`: measured time per round over the "
                       "theory's gamma * c + 1 target steps.")
    return [page.write(out_dir / f"{name}.md"), out_dir / f"{name}.csv",
            out_dir / f"{name}_best.csv", speedup, calls]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    app.run(main)
