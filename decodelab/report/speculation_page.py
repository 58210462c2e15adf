"""The speculative-decoding page's prose and plot, computed from one page's rows
(``report.speculation``): the one-sentence answer, the method, the caveats (what the claims rest
on, with their numbers), the comparison with another target and the speed-up grid."""

from __future__ import annotations

import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from decodelab.measure.speculation import COST_REPEATS
from decodelab.measure.timing import SHARED_CORES
from decodelab.measure.stats import RESAMPLES, Interval
from decodelab.report import speculation as spec
from decodelab.report.claims import Judged
from decodelab.report.form import tally
from decodelab.report.pages import other_cores
from decodelab.report.tables import Table, format_value

Rows = spec.Rows


def times(value: Interval | float) -> str:
    """``2.00x`` or, with its interval, ``2.00x [1.90, 2.10]`` (3 significant figures)."""
    if isinstance(value, Interval):
        return f"{format_value(value.value)}x [{format_value(value.low)}, " \
               f"{format_value(value.high)}]"
    return f"{format_value(float(value))}x"


def answer(pick: spec.Pick):
    """(judged, rows) -> the page's first line: its fastest point and the claims' tally."""
    def text(judged: Sequence[Judged], rows: Rows) -> str:
        found = max(pick(rows), key=lambda r: spec.metric(r, "speedup"))
        c = found["config"]
        return (f"At best speculative decoding runs {times(spec.cells(found)['speedup'])} as fast "
                f"as target-only decoding ({spec.DRAFTER_LABELS[c['drafter']]}, batch "
                f"{c['batch_size']}, temperature {c['temperature']:g}, gamma {c['gamma']}); "
                f"{tally(judged)}.")
    return text


def method(rows: Rows, target: str) -> list[str]:
    """At most 8 lines: what was measured for ``target``'s rows, and how."""
    config, m0 = rows[0]["config"], rows[0]["metrics"]
    pretrained = spec.pretrained_target(rows[0])
    if pretrained is None:
        who = (f"`{target}` ({m0['target_params']:,} parameters, "
               f"{config['target']['train']['steps']} training steps)")
        vocabulary, prompts = "", "from the held-out test plays"
    else:
        who = (f"the pretrained `{pretrained}` ({m0['target_params']:,} parameters, its GGUF "
               f"file dequantized to float32)")
        vocabulary = " in the target's tokens (its tokenizer, not one trained here)"
        prompts = ("from the held-out test plays, plain text in the target's tokens (no chat "
                   "turn: the instruct model continues the passage)")
    described = {
        "draft": f"the `draft` preset ({max(spec.metric(r, 'draft_params') for r in rows):,} "
                 f"parameters) trained on the corpus{vocabulary} for "
                 f"{config['draft']['train']['steps']} steps",
        "distilled": f"the same preset distilled from the target for "
                     f"{config['distill_train']['steps']} steps (forward KL to its next-token "
                     f"distributions at temperature {config['distill_temperature']:g})",
        "ngram": f"prompt lookup (n-grams {config['ngram']['min_ngram']}.."
                 f"{config['ngram']['max_ngram']})"}
    present = {spec.metric(r, "drafter") for r in rows}
    drafters = "; ".join(text for name, text in described.items() if name in present)
    batching = ", ".join(
        "at batch 1 the prompts run one after another" if b == 1 else
        f"at batch {b} together" if b == config["num_prompts"] else f"at batch {b} in groups"
        for b in spec.values(rows, "batch_size"))
    return [
        f"Target: {who}. Drafters: {drafters}.",
        f"{config['num_prompts']} prompts of {config['prompt_tokens']} tokens {prompts}, "
        f"{config['new_tokens']} new tokens each, no EOS; {batching}.",
        f"Speed-up: target-only `dl.generate` time over `dl.speculative_generate` time, same "
        f"prompts, parameters, seeds and cache size, medians of {config['repeats']} repetitions "
        f"after a warm-up (compilation excluded), each batch's two runs back to back in "
        f"alternating order.",
        f"c: draft step time over target step time; it, v (the verify pass over gamma + 1 tokens) "
        f"and the overhead (the rest of a round) are timed alone at each point, round-robin, "
        f"every ratio within one repetition (the median of {COST_REPEATS} reported), in target "
        f"decode steps: this machine's speed drifts by up to 2x over tens of seconds.",
        "Theory: tokens per call (1 - a^(g+1)) / (1 - a), speed-up (1 - a^(g+1)) / "
        "((1 - a)(g c + 1)) from the measured alpha and c; beside it, the prediction with "
        "measured costs, tokens per call / (g c + v(g) + overhead).",
        brackets(rows),
        "Exactly what is timed: `decodelab/measure/speculation.py`; the table holds the best "
        "gamma (largest measured speed-up) of each drafter, batch and temperature.",
    ]


def brackets(rows: Rows) -> str:
    """What the page's brackets are, and which rows have none."""
    kept = sum("accepted_per_prompt" in r["metrics"] for r in rows)
    if not kept:
        return ("No intervals: the rows keep no per-prompt values (an earlier version of the "
                "study wrote them).")
    n = rows[0]["config"]["num_prompts"]
    one_batch = [b for b in spec.values(rows, "batch_size") if b == n]
    return (f"Brackets: 95% percentile bootstrap interval ({RESAMPLES:,} resamples, fixed seed): "
            f"alpha and tokens per call over the prompts; the speed-up over the timed batches "
            f"(at batch 1, the prompts), each batch's two runs drawn together; measured / "
            f"predicted, the speed-up's interval over the prediction, taken as fixed."
            + "".join(f" At batch {b} the {n} prompts run as one batch: its speed-ups have no "
                      f"interval." for b in one_batch)
            + (" Rows that keep no per-prompt values (an earlier version of the study) show "
               "plain numbers." if kept < len(rows) else ""))


def caveats(rows: Rows, least: float, reseeded: Rows = (),
            compared: Mapping[str, Rows] | None = None) -> list[str]:
    """What the claims rest on, computed from one page's rows: the best points, which prediction
    the measurements follow, the verify pass's growth, the alphas behind the distillation claims
    (at each drafter seed: ``reseeded`` holds the rows of seeds other than 0), the seed spread,
    the comparison with other targets (``compared``: name -> rows) and the machine's load.
    ``least``: the target of measured / predicted with measured costs at the best points."""
    lines = ["The best gamma is the one of largest measured speed-up, so its interval leans high."]
    ratios = [1 + spec.metric(b, "prediction_error_measured_costs")
              for *_, b in spec.best_points(rows)]
    lines.append(f"{sum(r >= least for r in ratios)} of {len(ratios)} best points reach {least:g} "
                 f"measured / predicted with measured costs (range {format_value(min(ratios))} to "
                 f"{format_value(max(ratios))}); the claim judges the lowest, a point without an "
                 f"interval at its measured value.")
    lines.append(
        f"Over all {len(rows)} points the median |log(measured / predicted)| is "
        f"{format_value(spec.spread(rows, 'prediction_error'))} against the theory's, which "
        f"charges the verify pass as one decode step and a round nothing else, and "
        f"{format_value(spec.spread(rows, 'prediction_error_measured_costs'))} against the "
        f"prediction with measured costs; v ranges {format_value(_low(rows, 'verify_cost'))} to "
        f"{format_value(_high(rows, 'verify_cost'))}, the overhead "
        f"{format_value(_low(rows, 'overhead'))} to {format_value(_high(rows, 'overhead'))}. "
        f"What the second still misses is what an isolated round does not show: at batch > 1 a "
        f"batch runs as many rounds as its slowest row.")
    lines.append(verify_growth(rows))
    seeds = sorted({spec.draft_seed(r) for r in reseeded})
    for temperature in spec.values(rows, "temperature"):
        for seed in [0, *seeds]:
            group = rows if seed == 0 else [r for r in reseeded if spec.draft_seed(r) == seed]
            found = spec.distillation(group, temperature)
            if found is not None:
                gammas, means, difference = found
                lines.append(
                    f"Distillation at temperature {temperature:g}, batch 1"
                    f"{f', drafters trained from seed {seed}' if seeds else ''}, mean over gamma "
                    f"{', '.join(map(str, gammas))}: alpha {format_value(means['draft'])} with "
                    f"the trained draft, {format_value(means['distilled'])} with the distilled "
                    f"one; distilled minus trained {format_value(difference)}"
                    f"{_paired(difference)}.")
        for seed in seeds:
            lines += seed_spread(rows, [r for r in reseeded if spec.draft_seed(r) == seed],
                                 temperature, seed)
    for name, other in (compared or {}).items():
        lines.append(f"Against the `{name}` target (its page: [speculative_{name}.md]"
                     f"(speculative_{name}.md); the same drafters and sweep), the best batch-1 "
                     f"speed-up here against there: " + "; ".join(
                         f"{d} at temperature {t:g}: {times(s1)} (gamma {g1}, c = "
                         f"{format_value(c1)}) against {times(s2)} (gamma {g2}, c = "
                         f"{format_value(c2)})"
                         for d, t, s1, g1, c1, s2, g2, c2 in comparison_table(rows, other).rows)
                     + ".")
    if seeds:
        lines.append(f"The model drafters trained from seed {', '.join(map(str, seeds))} are "
                     f"kept out of the table and plot (seed 0); their points are in the seeds "
                     f"CSV.")
    loads = [spec.metric(r, "load_1min") for r in rows]
    load = (f"1-minute load average {format_value(min(loads))} to {format_value(max(loads))} "
            f"(median {format_value(statistics.median(loads))}) at the starts of the points on "
            f"{rows[0]['provenance'].get('cpu_count')} CPUs, the program's own threads included")
    busy = other_cores(rows)
    if busy and max(busy) < SHARED_CORES:
        lines.append(f"No other process shared the cores (up to {max(busy):.2f} cores busy during "
                     f"a point, under the {SHARED_CORES} that counts as sharing; {load}).")
    else:
        lines.append(f"The {load}"
                     + (f"; other processes kept up to {max(busy):.2f} cores busy during a point"
                        if busy else "")
                     + ": the timed runs shared the machine with whatever else ran, which the "
                     "interleaved repetitions spread over both sides of each ratio.")
    return lines


def _low(rows: Rows, name: str) -> float:
    return min(spec.metric(r, name) for r in rows)


def _high(rows: Rows, name: str) -> float:
    return max(spec.metric(r, name) for r in rows)


def _paired(difference: Any) -> str:
    return (f" (paired over the {difference.units} prompts)"
            if isinstance(difference, Interval) else "")


def verify_growth(rows: Rows) -> str:
    """How the verify pass's cost grows with the tokens it checks: the median v over the points of
    each batch size and gamma, against the theory's 1."""
    parts = []
    for batch in spec.values(rows, "batch_size"):
        by_gamma: dict = {}
        for r in spec.where(rows, batch_size=batch):
            by_gamma.setdefault(r["config"]["gamma"], []).append(spec.metric(r, "verify_cost"))
        parts.append(f"at batch {batch}, " + ", ".join(
            f"{format_value(statistics.median(v))} at gamma {g}"
            for g, v in sorted(by_gamma.items())))
    return (f"The verify pass over gamma + 1 tokens, in target decode steps (median over the "
            f"points; the theory charges 1): {'; '.join(parts)}. Where it grows with gamma, the "
            f"target's pass is bound by arithmetic rather than by reading its weights once, so "
            f"checking more proposals per round is not free, and the best gamma is small.")


def seed_spread(rows: Rows, reseeded: Rows, temperature: float, seed: int) -> list[str]:
    """How far training seed ``seed`` moves each model drafter's alpha at ``temperature`` (batch
    1) from seed 0's, over the gammas both seeds ran, on the same prompts."""
    parts = []
    for drafter in ("draft", "distilled"):
        found = spec.mean_alphas({0: spec.alphas_by_gamma(rows, drafter, temperature),
                                  seed: spec.alphas_by_gamma(reseeded, drafter, temperature)})
        if found is not None:
            gammas, means, difference = found
            parts.append(
                f"{spec.DRAFTER_LABELS[drafter]} at gamma {', '.join(map(str, gammas))}: alpha "
                f"{format_value(means[0])} (seed 0), {format_value(means[seed])} (seed {seed}), "
                f"seed {seed} minus seed 0 {format_value(difference)}{_paired(difference)}")
    return ([f"Seed spread, temperature {temperature:g}, batch 1: " + "; ".join(parts) + "."]
            if parts else [])


def comparison_table(rows: Rows, other: Rows) -> Table:
    """Each drafter's best batch-1 speed-up here beside the same drafter's on another target,
    with its gamma and c: what a larger target buys the same drafters."""
    body = []
    for drafter, _, temperature, here in spec.best_points(rows, batches=[1]):
        there = spec.best(other, drafter, 1, temperature)
        if there is not None:
            body.append([spec.DRAFTER_LABELS[drafter], temperature] + [
                value for b in (here, there) for value in (
                    spec.cells(b)["speedup"], b["config"]["gamma"], spec.metric(b, "c"))])
    return Table(["drafter", "temperature", "speed-up here", "gamma here", "c here",
                  "speed-up there", "gamma there", "c there"], body)


def speedup_plot(pick: spec.Pick):
    """(rows, path) -> one panel per (batch, temperature): the measured speed-up (solid, its
    interval as an error bar), the theory's (dashed) and the prediction with measured costs
    (dotted) against gamma, one colour per drafter."""
    def plot(all_rows: Rows, path: pathlib.Path) -> pathlib.Path:
        rows = pick(all_rows)
        batches, temperatures = spec.values(rows, "batch_size"), spec.values(rows, "temperature")
        fig = Figure(figsize=(4.0 * len(temperatures), 3.3 * len(batches)), layout="constrained")
        axes = fig.subplots(len(batches), len(temperatures), squeeze=False, sharex=True)
        colours = dict(zip(spec.DRAFTER_LABELS, ("tab:blue", "tab:orange", "tab:green")))
        for i, batch in enumerate(batches):
            for j, temperature in enumerate(temperatures):
                ax = axes[i][j]
                for drafter, label in spec.DRAFTER_LABELS.items():
                    group = sorted(spec.where(rows, drafter=drafter, batch_size=batch,
                                              temperature=temperature),
                                   key=lambda r: r["config"]["gamma"])
                    if group:
                        _lines(ax, group, label, colours[drafter])
                ax.axhline(1.0, color="grey", linewidth=0.8)
                ax.set_title(f"batch {batch}, temperature {temperature:g}", fontsize=10)
                ax.set_xlabel("gamma")
                ax.set_ylabel("speed-up over target only")
                ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle("Speed-up against gamma: measured (solid; bars: 95% interval),\ntheory "
                     "(dashed), with measured costs (dotted)", fontsize=11)
        fig.savefig(path, dpi=110)
        return path
    return plot


def _lines(ax, group: Rows, label: str, colour: str) -> None:
    gammas = [r["config"]["gamma"] for r in group]
    spans = [(v.value, v.low, v.high) if isinstance(v, Interval) else (v, v, v)
             for v in (spec.cells(r)["speedup"] for r in group)]
    ys = [y for y, _, _ in spans]
    ax.errorbar(gammas, ys, yerr=[[y - low for y, low, _ in spans],
                                  [high - y for y, _, high in spans]],
                marker="o", capsize=3, color=colour, label=f"{label}, measured")
    pairs = [(g, spec.metric(r, "predicted_speedup")) for g, r in zip(gammas, group)
             if spec.metric(r, "predicted_speedup") is not None]
    ax.plot([g for g, _ in pairs], [v for _, v in pairs], marker="x", linestyle="--",
            color=colour, label=f"{label}, theory")
    ax.plot(gammas, [spec.metric(r, "predicted_speedup_measured_costs") for r in group],
            marker=".", linestyle=":", color=colour, label=f"{label}, with measured costs")
