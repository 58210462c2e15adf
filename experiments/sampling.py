"""Sampling strategies read against human text: quality metrics of each strategy's continuations
of held-out prompts, and of the true continuations.

    python -m experiments.sampling --config=configs/sampling.py --workdir=runs/sampling
    python -m experiments.report --workdir=runs/sampling --out=results

Each point is one strategy (configs/sampling.py lists them). The first point trains the generator
and the scorer (cached in the workdir), or loads a pretrained model
(`configs/sampling.py:smollm2-135m`); the process keeps them, so every later point reuses the
compiled decode programs. Each row counts the jit compilations that happened during its point.

Each row keeps its per-prompt sums (``per_prompt``, see ``quality.quality_row``): the page's 95%
intervals resample the prompts, and two strategies are compared prompt by prompt (a paired
bootstrap: every strategy continues the same prompts). The candidate percentiles and the Zipf
exponent are pooled over prompts and have no interval.
"""

from __future__ import annotations

import math
import pathlib
import re
import time

import numpy as np
from absl import app
from matplotlib.figure import Figure

from decodelab import experiment
from decodelab import report as results
from decodelab.experiment import artefacts as pipeline
from decodelab.measure import compiles, quality, stats
from decodelab.sampling.params import SamplingParams
from decodelab.text import data
from decodelab.train import trainer as train

_FLAGS = experiment.define_flags("configs/sampling.py")

# The programs whose compilations a row counts: jitted function name -> metric name.
PROGRAMS = {"prefill": "compiles_generate_prefill", "_decode_loop": "compiles_generate_loop",
            "_beam_prefill": "compiles_beam_prefill", "_beam_loop": "compiles_beam_loop",
            "_target_logprobs": "compiles_scoring", "_token_stats": "compiles_token_stats"}




_MODELS: dict[tuple, tuple] = {}


def _model(config, role: str, workdir, progress: bool):
    """(model, tokenizer, validation perplexity) of ``config.<role>``, kept for the process."""
    section = config[role]
    key = (str(workdir), experiment.config_hash({"tokenizer": config.tokenizer.to_dict(),
                                                 **section.to_dict()}))
    if key not in _MODELS:
        model, tokenizer = pipeline.model_for(config.tokenizer, section.model, section.train,
                                              workdir, progress=progress)
        windows = data.eval_windows(data.token_stream(tokenizer, "validation"),
                                    section.train.seq_len)
        _MODELS[key] = (model, tokenizer, train.evaluate(model, windows, 32)["perplexity"])
    return _MODELS[key]


def strategy(decode) -> quality.Strategy:
    if decode.method == "human":
        return quality.Human()
    if decode.method == "beam":
        return quality.Beam(decode.beam_width, decode.length_penalty, decode.min_new_tokens)
    if decode.method == "sample":
        return quality.Sampled(SamplingParams(
            temperature=decode.temperature, top_k=decode.top_k, top_p=decode.top_p,
            min_p=decode.min_p, typical_p=decode.typical_p, min_new_tokens=decode.min_new_tokens))
    raise ValueError(f"decode.method must be 'sample', 'beam' or 'human', got {decode.method!r}")


def evaluate(config, ctx) -> dict:
    with compiles.count_traces() as counts:
        ctx.status("generator")
        generator, tokenizer, generator_ppl = _model(config, "generator", ctx.workdir,
                                                     ctx.show_progress)
        ctx.status("scorer")
        scorer, scorer_tokenizer, scorer_ppl = _model(config, "scorer", ctx.workdir,
                                                      ctx.show_progress)
        if scorer_tokenizer.vocab_size != tokenizer.vocab_size:
            raise ValueError("generator and scorer must share one tokenizer")
        p = config.prompts
        prompts = quality.held_out_prompts(tokenizer, per_document=p.per_play,
                                           prompt_tokens=p.prompt_tokens, new_tokens=p.new_tokens,
                                           instruction=p.get("instruction"))
        method = strategy(config.decode)
        ctx.status("decode")
        start = time.perf_counter()
        samples = method.continuations(generator, prompts, new_tokens=p.new_tokens,
                                       samples=p.samples, seed=config.seed,
                                       eos_id=tokenizer.eos_id)
        decode_s = time.perf_counter() - start
        ctx.status("score")
        row = quality.quality_row(prompts, samples, tokenizer=tokenizer, generator=generator,
                                  scorer=scorer, params=method.params,
                                  improbable_below=config.eval.improbable_below,
                                  batch_size=config.eval.batch_size)
    return {"strategy": config.decode.name, **row, "decode_s": decode_s,
            "prompts": len(prompts), "generator_val_ppl": generator_ppl,
            "scorer_val_ppl": scorer_ppl, "generator_params": generator.config.num_params(),
            "scorer_params": scorer.config.num_params(),
            **{metric: counts[name] for name, metric in PROGRAMS.items()},
            "example_prompt": tokenizer.decode(prompts[0].tokens),
            "example": tokenizer.decode(samples[0][0])}


# --- The page -------------------------------------------------------------------------------------

COLUMNS = [  # (metric, header, format)
    ("ppl_generator", "ppl (generator)", "{:.1f}"),
    ("ppl_scorer", "ppl (scorer)", "{:.1f}"),
    ("distinct_1", "distinct-1", "{:.3f}"),
    ("distinct_2", "distinct-2", "{:.3f}"),
    ("distinct_3", "distinct-3", "{:.3f}"),
    ("repetition_4", "rep-4", "{:.3f}"),
    ("self_bleu", "self-BLEU", "{:.1f}"),
    ("identical_samples", "identical", "{:.2f}"),
    ("zipf", "Zipf", "{:.2f}"),
    ("top1_rate", "top-1", "{:.2f}"),
    ("improbable_rate", "p<1%", "{:.3f}"),
    ("candidates_p10", "cand. p10", "{:.0f}"),
    ("candidates_median", "cand. median", "{:.0f}"),
    ("candidates_p90", "cand. p90", "{:.0f}"),
    ("mean_length", "length", "{:.1f}"),
    ("eos_rate", "EOS", "{:.2f}"),
]


NO_UNITS = ("the rows keep no per-prompt values (written by an earlier version of the study); "
            "rerun it for intervals")


def _one_minus_ratio(numerator, denominator):
    return 1.0 - stats.ratio_of_sums(numerator, denominator)


# How each metric is recomputed from a row's per-prompt sums (quality.quality_row): metric ->
# (statistic, the per_prompt columns it takes).
RESAMPLED = {
    "ppl_generator": (stats.perplexity, ("nll_generator", "tokens")),
    "ppl_scorer": (stats.perplexity, ("nll_scorer", "tokens")),
    **{f"distinct_{n}": (stats.ratio_of_sums, (f"distinct_{n}", f"ngram_samples_{n}"))
       for n in (1, 2, 3)},
    "repetition_4": (_one_minus_ratio, ("distinct_4", "ngram_samples_4")),
    "self_bleu": (stats.mean, ("self_bleu",)),
    "identical_samples": (stats.mean, ("identical",)),
    "top1_rate": (stats.ratio_of_sums, ("top1", "tokens")),
    "improbable_rate": (stats.ratio_of_sums, ("improbable", "tokens")),
    "mean_length": (stats.ratio_of_sums, ("tokens", "samples")),
    "eos_rate": (stats.ratio_of_sums, ("eos", "samples")),
}


def _columns(m, metric: str) -> tuple[np.ndarray, ...] | None:
    """The per-prompt columns ``metric`` is a statistic of, or None (no value, or an old row)."""
    per = m.get("per_prompt")
    if metric not in RESAMPLED or per is None or m.get(metric) is None:
        return None
    names = RESAMPLED[metric][1]
    if any(name not in per for name in names) or len(per[names[0]]) < 2:
        return None
    return tuple(np.asarray(per[name], np.float64) for name in names)


def interval(m, metric: str) -> stats.Interval | None:
    """The 95% interval of ``metric`` over the row's prompts; None without per-prompt values."""
    columns = _columns(m, metric)
    return None if columns is None else stats.bootstrap(RESAMPLED[metric][0], columns)


def paired(a, b, metric: str, *, ratio: bool = False) -> stats.Interval | None:
    """``metric`` of strategy ``a`` minus (or over) that of ``b``, paired prompt by prompt; None
    without per-prompt values or where the ratio has no finite value (``b``'s metric is 0)."""
    ca, cb = _columns(a, metric), _columns(b, metric)
    if ca is None or cb is None or len(ca[0]) != len(cb[0]):
        return None
    compare = stats.bootstrap_ratio if ratio else stats.bootstrap_difference
    try:
        return compare(RESAMPLED[metric][0], ca, cb, paired=True)
    except ValueError:
        return None


def _shown(m, metric: str):
    return interval(m, metric) or m.get(metric)


def _table(rows) -> tuple[str, results.Table]:
    markdown = ["| strategy | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
                "|---|" + "---|" * len(COLUMNS)]
    body = []
    for row in rows:
        m = row["metrics"]
        name = f"**{m['strategy']}**" if m["strategy"] == "human" else m["strategy"]
        markdown.append(f"| {name} | " + " | ".join(results.format_value(_shown(m, k), f)
                                                      for k, _, f in COLUMNS) + " |")
        body.append([m["strategy"]] + [_shown(m, k) for k, _, _ in COLUMNS]
                    + [m.get("decode_s")])
    table = results.Table(["strategy"] + [k for k, _, _ in COLUMNS] + ["decode_s"], body)
    return "\n".join(markdown) + "\n", table


_SHORT = [(r"temperature (\S+)", r"t\1"), (r"^t (\S+)", r"t\1"), (r"top-k (\S+)", r"k\1"),
          (r"top-p (\S+)", r"p\1"), (r"min-p (\S+)", r"minp\1"), (r"typical (\S+)", r"typ\1"),
          (r" \+ ", "+"), (r"beam (\d+), no early EOS", r"beam\1 no-EOS"),
          (r"beam (\d+)$", r"beam\1")]


def short_label(name: str) -> str:
    """``t 0.7 + top-p 0.95`` -> ``t0.7+p0.95``: plot labels that hide each other less."""
    for pattern, replacement in _SHORT:
        name = re.sub(pattern, replacement, name)
    return name


def _plot(rows, path: pathlib.Path) -> pathlib.Path:
    """Diversity against perplexity under the scorer: distinct-2 (within a sample) and self-BLEU
    (across the samples of a prompt), one point per strategy, human starred, each with its 95%
    intervals over prompts where the rows keep per-prompt values."""
    fig = Figure(figsize=(13, 5.5))
    panels = fig.subplots(1, 2)
    for ax, metric, label in [
            (panels[0], "distinct_2", "distinct-2 within a sample (higher: more varied)"),
            (panels[1], "self_bleu", "self-BLEU across a prompt's samples (lower: more varied)")]:
        for row in rows:
            m = row["metrics"]
            human = m["strategy"] == "human"
            if m.get(metric) is None:
                if human:  # one text per prompt: its perplexity only
                    ax.axvline(m["ppl_scorer"], color="crimson", linestyle="--", linewidth=1)
                    ax.annotate("human perplexity", (m["ppl_scorer"], 0.02),
                                xycoords=("data", "axes fraction"), textcoords="offset points",
                                xytext=(3, 0), fontsize=8, color="crimson")
                continue
            ax.scatter(m["ppl_scorer"], m[metric], marker="*" if human else "o",
                       s=250 if human else 28, color="crimson" if human else "tab:blue",
                       zorder=4 if human else 3)
            x_interval, y_interval = interval(m, "ppl_scorer"), interval(m, metric)
            if x_interval and y_interval:  # the 95% intervals over prompts, both axes
                ax.errorbar(m["ppl_scorer"], m[metric],
                            xerr=[[m["ppl_scorer"] - x_interval.low],
                                  [x_interval.high - m["ppl_scorer"]]],
                            yerr=[[m[metric] - y_interval.low], [y_interval.high - m[metric]]],
                            fmt="none", ecolor="crimson" if human else "tab:blue", alpha=0.5,
                            linewidth=0.8, zorder=2)
            ax.annotate(short_label(m["strategy"]), (m["ppl_scorer"], m[metric]),
                        textcoords="offset points", xytext=(6, -16) if human else (4, 3),
                        fontsize=10 if human else 7.5, fontweight="bold" if human else "normal",
                        color="crimson" if human else "black", zorder=4)
        ax.set_xscale("log")
        if metric == "self_bleu":
            ax.set_yscale("log")
        ax.set_xlabel("perplexity of the text under the scorer (log scale)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("Diversity against perplexity, one point per strategy, human text starred "
                 "(t = temperature, k = top-k, p = top-p, minp = min-p, typ = typical)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _by_name(rows) -> dict:
    return {row["metrics"]["strategy"]: row["metrics"] for row in rows}


def pct(x: float | stats.Interval) -> str:
    """``0.4`` -> ``40%``; an Interval -> ``40% [38%, 42%]``."""
    if isinstance(x, stats.Interval):
        return f"{100 * x.value:.0f}% [{100 * x.low:.0f}%, {100 * x.high:.0f}%]"
    return f"{100 * x:.0f}%"


def _num(m, metric: str, fmt: str) -> str:
    """A metric with its interval where the row has one: ``5.0 [4.1, 6.2]``."""
    return results.format_value(_shown(m, metric), fmt)


def _rate(m, metric: str) -> str:
    return pct(_shown(m, metric))


def claims(rows) -> str:
    """The seed's five claims, each judged by the intervals over prompts (``results.verdict``: a
    difference or a comparison with a target is called only when its interval excludes it; every
    number read from the rows; the thresholds are in the code next to each sentence)."""
    m = _by_name(rows)
    needed = ["human", "greedy", "temperature 0.3", "temperature 1.0", "temperature 1.5",
              "top-k 5", "top-k 40", "top-p 0.8", "top-p 0.95"]
    missing = [n for n in needed if n not in m]
    if missing:
        return f"(The claims need the rows {missing}.)"
    h, g, t03, t1, t15, k5, k40, p80, p95 = (m[n] for n in needed)

    def judge(interval_, **kwargs) -> results.Verdict:
        return results.verdict(interval_, units="prompts", missing=NO_UNITS, **kwargs)

    lines = []
    # Deterministic: every prompt's samples identical (a count, no interval needed).
    # Repetitive: rep-4 over twice human's on the same prompts (paired ratio above 2).
    deterministic = g["identical_samples"] == 1
    repeat_ratio = paired(g, h, "repetition_4", ratio=True)
    repetitive = judge(repeat_ratio, threshold=2.0, above="repetitive", below="not repetitive")
    if repetitive.side:
        verdict = {(True, 1): "holds", (True, -1): "half holds (deterministic only)",
                   (False, 1): "half holds (repetitive only)",
                   (False, -1): "does not hold"}[deterministic, repetitive.side]
    else:
        verdict = (f"{'deterministic' if deterministic else 'not deterministic'}; over twice "
                   f"human's repetition: {repetitive.text}")
    lines.append(
        f"- **Greedy is \"deterministic but repetitive\"**: {verdict}. Its "
        f"{g['samples'] // g['prompts']} samples (seeds) of a prompt are the same tokens for "
        f"{pct(g['identical_samples'])} of the prompts, and {_rate(g, 'repetition_4')} of its "
        f"4-grams repeat one earlier in the same text, against {_rate(h, 'repetition_4')} in the "
        f"true continuations (greedy over human, paired by prompt: "
        f"{results.format_value(repeat_ratio, '{:.1f}')}x) and "
        f"{_rate(t1, 'repetition_4')} when sampling at temperature 1 (distinct-2 "
        f"{_num(g, 'distinct_2', '{:.2f}')}, human {_num(h, 'distinct_2', '{:.2f}')}). The scorer "
        f"finds its text far more probable than human text (perplexity "
        f"{_num(g, 'ppl_scorer', '{:.1f}')} against {_num(h, 'ppl_scorer', '{:.1f}')}): probable "
        f"is not human-like.")
    # Almost greedy: at least 90% of tokens are the argmax; partly: at least 60%.
    top1 = interval(t03, "top1_rate")
    almost = judge(top1, threshold=0.9, above="holds", below="below 90%")
    if almost.side == -1:
        partly = judge(top1, threshold=0.6, above="partly holds", below="does not hold")
        almost_text = partly.text if partly.side else f"below 90%; against 60%: {partly.text}"
    else:
        almost_text = almost.text
    lines.append(
        f"- **Low temperature is \"almost greedy\"**: {almost_text} at 0.3 (rule: at least 90% "
        f"of its tokens the argmax, partly: 60%). {_rate(t03, 'top1_rate')} of its tokens are "
        f"the generator's argmax (greedy 100%, temperature 1 {_rate(t1, 'top1_rate')}, human "
        f"text {_rate(h, 'top1_rate')}) and its repetition is {_rate(t03, 'repetition_4')} "
        f"(greedy {_rate(g, 'repetition_4')}); but it is not deterministic: its samples of a "
        f"prompt are all identical for {pct(t03['identical_samples'])} of the prompts (self-BLEU "
        f"{t03['self_bleu']:.0f}, greedy {g['self_bleu']:.0f}).")
    # More random: lower self-BLEU and higher distinct-2 than at temperature 1, prompt by prompt.
    bleu, distinct = paired(t15, t1, "self_bleu"), paired(t15, t1, "distinct_2")
    lower_bleu = judge(bleu, above="higher", below="lower")
    more_distinct = judge(distinct, above="higher", below="lower")
    if lower_bleu.side == -1 and more_distinct.side == 1:
        random = "holds"
    elif lower_bleu.side == 1 or more_distinct.side == -1:
        random = "does not hold"
    else:
        random = "not distinguishable at this sample size"
    lines.append(
        f"- **High temperature is \"more random\"**: {random}. From temperature 1.0 to 1.5, "
        f"self-BLEU goes {_num(t1, 'self_bleu', '{:.1f}')} -> {_num(t15, 'self_bleu', '{:.1f}')} "
        f"(paired difference {results.format_value(bleu, '{:+.1f}')}: {lower_bleu.text}), "
        f"distinct-2 {_num(t1, 'distinct_2', '{:.3f}')} -> {_num(t15, 'distinct_2', '{:.3f}')} "
        f"({results.format_value(distinct, '{:+.3f}')}: {more_distinct.text}), and the share of "
        f"tokens the generator gives under 1% {_rate(t1, 'improbable_rate')} -> "
        f"{_rate(t15, 'improbable_rate')}. The scorer's perplexity shows the price: "
        f"{_num(t1, 'ppl_scorer', '{:.0f}')} -> {_num(t15, 'ppl_scorer', '{:.0f}')} (human "
        f"{_num(h, 'ppl_scorer', '{:.0f}')}).")
    fewer = judge(paired(k40, t1, "improbable_rate"),
                  above="k = 40 samples more of them than plain sampling",
                  below="k = 40 samples fewer of them than plain sampling")
    lines.append(
        f"- **Top-k \"never picks bad or terrible\" words**: holds for rank only. Top-k never "
        f"samples outside the k most probable tokens, but those can still be improbable ones: the "
        f"share of sampled tokens the generator gives under 1% is {_rate(k5, 'improbable_rate')} "
        f"for k = 5 and {_rate(k40, 'improbable_rate')} for k = 40, against "
        f"{_rate(t1, 'improbable_rate')} for plain sampling ({fewer.text}; human text: "
        f"{_rate(h, 'improbable_rate')}).")
    # Adaptive: the 90th percentile of the kept-set size at least 4x the 10th. The percentiles
    # are over steps pooled across prompts, so this rule is read on the point estimates.
    spread = p95["candidates_p90"] / max(p95["candidates_p10"], 1)
    lines.append(
        f"- **Top-p is \"adaptive\"**: {'holds' if spread >= 4 else 'does not hold clearly'} "
        f"on the point estimates (no interval: percentiles over all steps). "
        f"The number of tokens top-p 0.95 keeps varies with the model's confidence: "
        f"{p95['candidates_p10']:.0f} at the 10th percentile of steps, "
        f"{p95['candidates_median']:.0f} at the median, {p95['candidates_p90']:.0f} at the 90th "
        f"(top-p 0.8: {p80['candidates_p10']:.0f} / {p80['candidates_median']:.0f} / "
        f"{p80['candidates_p90']:.0f}), where top-k keeps k at every step. It still lets "
        f"{_rate(p95, 'improbable_rate')} of its tokens come from under 1% probability.")
    sampled = [r for r in m.values() if r["strategy"] != "human"]
    closest = min(sampled, key=lambda r: abs(math.log(r["ppl_scorer"] / h["ppl_scorer"])))
    against_human = paired(closest, h, "ppl_scorer", ratio=True)
    lines.append(
        f"\nClosest to human text in the scorer's perplexity: {closest['strategy']} "
        f"({_num(closest, 'ppl_scorer', '{:.1f}')} against {_num(h, 'ppl_scorer', '{:.1f}')}; "
        f"ratio {results.format_value(against_human, '{:.2f}')}, "
        + judge(against_human, threshold=1.0, above="more perplexing than human text",
                below="less perplexing than human text").text
        + f"; distinct-2 {_num(closest, 'distinct_2', '{:.3f}')} against "
        f"{_num(h, 'distinct_2', '{:.3f}')}, rep-4 {_rate(closest, 'repetition_4')} against "
        f"{_rate(h, 'repetition_4')}).")
    beam, full = m.get("beam 4"), m.get("beam 4, no early EOS")
    new_tokens = rows[0]["config"]["prompts"]["new_tokens"]
    if beam and full:
        lines.append(
            f"Beam search (scorer perplexity {_num(beam, 'ppl_scorer', '{:.1f}')}; greedy "
            f"{_num(g, 'ppl_scorer', '{:.1f}')}) ends {_rate(beam, 'eos_rate')} of its best "
            f"hypotheses with EOS, after {_num(beam, 'mean_length', '{:.1f}')} tokens on average: "
            f"under the length penalty, the short hypotheses that end the play outscore the "
            f"{new_tokens}-token ones the beam finds (Stahlberg and Byrne 2019 report the same in "
            f"translation, where the single most probable output is often the empty one). Made to "
            f"fill the budget (\"no early EOS\"), it repeats {_rate(full, 'repetition_4')} of its "
            f"4-grams (greedy {_rate(g, 'repetition_4')}) at scorer perplexity "
            f"{_num(full, 'ppl_scorer', '{:.1f}')}.")
    return "\n".join(line for line in lines if line)


def report(rows, out_dir) -> list[pathlib.Path]:
    """The page, its CSV and plot: ``sampling.*`` for the models trained here,
    ``sampling_<preset>.*`` for a pretrained generator (so the two studies' pages coexist)."""
    out_dir = pathlib.Path(out_dir)
    rows = sorted(rows, key=lambda r: r["sweep_index"])
    pretrained = rows[0]["config"]["generator"]["model"].get("pretrained")
    stem = "sampling" + (f"_{pretrained}" if pretrained else "")
    m = _by_name(rows)
    first = rows[0]
    c = first["config"]
    p = c["prompts"]
    any_row = first["metrics"]
    page = results.Page("Sampling strategies against human text" if not pretrained else
                        f"Sampling strategies against human text: the pretrained `{pretrained}`",
                        rows)
    if pretrained:
        models = (
            f"The pretrained instruct model `{pretrained}` ({any_row['generator_params']:,} "
            f"parameters, perplexity {any_row['generator_val_ppl']:.1f} on the validation plays) "
            f"is asked to continue {any_row['prompts']} held-out passages ({p['per_play']} "
            f"paragraph starts spread through each of the three test plays, {p['prompt_tokens']} "
            f"tokens each, in a chat turn: \"{p['instruction']}\") by {p['new_tokens']} tokens, "
            f"{p['samples']} samples per prompt with fixed seeds, under each strategy. It also "
            "scores the text (the only real model installed), so the scorer columns are its own "
            "judgement, not an outside one.")
    else:
        models = (
            f"The `small` model ({any_row['generator_params']:,} parameters, "
            f"{c['generator']['train']['steps']} training steps, validation perplexity "
            f"{any_row['generator_val_ppl']:.1f}) continues "
            f"{any_row['prompts']} held-out prompts ({p['per_play']} paragraph starts spread "
            f"through each of the three test plays, {p['prompt_tokens']} tokens each) by "
            f"{p['new_tokens']} tokens, {p['samples']} samples per prompt with fixed seeds, under "
            f"each strategy. A larger model, the `scorer` preset ({any_row['scorer_params']:,} "
            f"parameters, {c['scorer']['train']['steps']} steps, validation perplexity "
            f"{any_row['scorer_val_ppl']:.1f}; same tokenizer and training plays) judges the "
            "text.")
    page.text(
        f"{models} The **human** row is the same metrics on the true continuation of each prompt "
        f"(one per prompt, so no self-BLEU). Beam search (width {c['decode']['beam_width']}, "
        f"GNMT length penalty {c['decode']['length_penalty']}) is deterministic: its best "
        f"hypothesis stands for every sample; \"no early EOS\" forbids EOS before the budget.")
    markdown, table = _table(rows)
    units = all(r["metrics"].get("per_prompt") for r in rows)
    page.text(f"Brackets: 95% percentile bootstrap interval over the {any_row['prompts']} prompts "
              "(2,000 resamples, fixed seed; `decodelab.measure.stats`); Zipf and the candidate "
              "percentiles, pooled over prompts, have none." if units else
              f"No intervals: {NO_UNITS}.")
    csv_path = out_dir / f"{stem}.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.write_text(table.to_csv(), encoding="utf-8")
    page.text(markdown + f"\nCSV: [{csv_path.name}]({csv_path.name})")
    page.text(
        "Columns: perplexity of the continuations under the generator and the scorer (tokens "
        "pooled); distinct-n, the share of distinct n-grams within a sample; rep-4, the share of "
        "a sample's 4-grams that repeat an earlier one (1 - distinct-4); self-BLEU (sacrebleu, "
        "0-100), each sample against the other samples of its prompt (an empty text scores 0, "
        "so beam search's copies of a hypothesis that is only EOS lower it); identical, the "
        "share of prompts whose samples are all the same tokens; Zipf, the fitted exponent "
        "of the token frequency-rank law; top-1, the share of tokens that are the generator's "
        "argmax; p<1%, the share of tokens the generator gives less than 1% probability; cand., "
        "how many tokens the strategy's processors left allowed at a step (10th percentile, "
        "median, 90th percentile over all steps; temperature alone allows the whole vocabulary); "
        "length in tokens; EOS, the share of samples "
        "that ended on their own (the prompts sit mid-play: the true continuations never end).")
    plot = _plot(rows, out_dir / f"{stem}.png")
    page.image(plot, "diversity against perplexity under the scorer, one point per strategy")
    page.text("## What the seed claims, on our models\n\n" + claims(rows))
    compiled = {metric: sum(r["metrics"].get(metric, 0) for r in rows)
                for metric in PROGRAMS.values()}
    sampled = sum(1 for r in rows if r["config"]["decode"]["method"] == "sample")
    beams = sum(1 for r in rows if r["config"]["decode"]["method"] == "beam")
    page.text(
        f"Compilations over the whole sweep (counted with a `jax.monitoring` listener; from the "
        f"rows): `generate`'s prefill {compiled['compiles_generate_prefill']} and decode loop "
        f"{compiled['compiles_generate_loop']} for {sampled} sampling strategies; beam search's "
        f"prefill {compiled['compiles_beam_prefill']} and loop {compiled['compiles_beam_loop']} "
        f"for {beams}; the scoring forward pass {compiled['compiles_scoring']} (one per model and "
        f"padded length) and the token statistics {compiled['compiles_token_stats']}. Decoding "
        f"took {sum(r['metrics']['decode_s'] for r in rows):.1f} s in all; the rest of the wall "
        f"time is {'loading and evaluating the model' if pretrained else 'training the two models'}"
        f" (first point) and scoring.")
    examples = ["| strategy | first sample of the first prompt |", "|---|---|"]
    for name, metrics_ in m.items():
        text = " ".join(metrics_["example"].split())
        examples.append(f"| {name} | {text.replace('|', '/')} |")
    prompt = " ".join(first["metrics"]["example_prompt"].split())
    page.text(f"Example continuations of the first prompt, \"{prompt}\":\n\n" + "\n".join(examples))
    return [page.write(out_dir / f"{stem}.md"), csv_path, plot]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    app.run(main)
