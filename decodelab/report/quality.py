"""The sampling-strategies page from its rows: claim quantities (callable dataclasses, so a study
declares its claims as data), the tables, the plot and the page's text.

A row's metrics are ``measure.strategies.strategy_row``'s: one strategy's quality metrics with
``per_prompt`` sums, from which ``measure.strategies`` gives each metric's 95% interval over
prompts and the paired comparison of two strategies. Rows without ``per_prompt`` (an earlier
version of the study) give plain numbers, judged as point estimates.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from decodelab.measure.stats import Interval
from decodelab.measure.strategies import interval, paired, prompt_columns, shown
from decodelab.report.claims import Judged, verdict
from decodelab.report.tables import Table, format_number, format_value, select

Rows = Sequence[Mapping[str, Any]]

# metric -> its header; the first six, after the strategy, make the page's table (7 columns).
COLUMNS = {"ppl_scorer": "ppl (scorer)", "distinct_2": "distinct-2", "repetition_4": "rep-4",
           "self_bleu": "self-BLEU", "top1_rate": "top-1", "improbable_rate": "p<1%",
           "ppl_generator": "ppl (generator)", "distinct_1": "distinct-1",
           "distinct_3": "distinct-3", "identical_samples": "identical", "zipf": "Zipf",
           "candidates_p10": "cand. p10", "candidates_median": "cand. median",
           "candidates_p90": "cand. p90", "mean_length": "length", "eos_rate": "EOS",
           "surprise_generator": "surprise (bits)", "surprise_sampled": "surprise drawn (bits)"}
MAIN = list(COLUMNS)[:6]
# The order of today's CSV (every metric the page reads, then the decoding time).
CSV_ORDER = ["ppl_generator", "ppl_scorer", "distinct_1", "distinct_2", "distinct_3",
             "repetition_4", "self_bleu", "identical_samples", "zipf", "top1_rate",
             "improbable_rate", "candidates_p10", "candidates_median", "candidates_p90",
             "mean_length", "eos_rate", "surprise_generator", "surprise_sampled"]

NO_UNITS = ("the rows keep no per-prompt values (written by an earlier version of the study); "
            "rerun it for intervals")


def by_name(rows: Rows) -> dict[str, Mapping[str, Any]]:
    """strategy -> its metrics."""
    return {row["metrics"]["strategy"]: row["metrics"] for row in rows}


# --- Claim quantities -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Metric:
    """``metric`` of ``strategy`` with its interval over prompts (``with_interval`` False: the
    plain value, for a count that needs none); None where no row is that strategy's."""

    strategy: str
    metric: str
    with_interval: bool = True

    def __call__(self, rows: Rows) -> Interval | float | None:
        m = by_name(rows).get(self.strategy)
        if m is None:
            return None
        return shown(m, self.metric) if self.with_interval else m.get(self.metric)


@dataclasses.dataclass(frozen=True)
class Paired:
    """``metric`` of strategy ``a`` minus (``ratio``: over) that of ``b``, paired prompt by
    prompt; the plain difference (ratio) where the rows keep no per-prompt values."""

    a: str
    b: str
    metric: str
    ratio: bool = False

    def __call__(self, rows: Rows) -> Interval | float | None:
        named = by_name(rows)
        a, b = named.get(self.a), named.get(self.b)
        if a is None or b is None or None in (a.get(self.metric), b.get(self.metric)):
            return None
        both = paired(a, b, self.metric, ratio=self.ratio)
        if both is not None or (prompt_columns(a, self.metric) and prompt_columns(b, self.metric)):
            return both
        if not self.ratio:
            return a[self.metric] - b[self.metric]
        return a[self.metric] / b[self.metric] if b[self.metric] else None


@dataclasses.dataclass(frozen=True)
class Spread:
    """How much the kept set of ``strategy`` varies: its 90th over its 10th percentile of
    candidates over all steps (a point estimate: percentiles pooled over prompts)."""

    strategy: str

    def __call__(self, rows: Rows) -> float | None:
        m = by_name(rows).get(self.strategy)
        if m is None or m.get("candidates_p90") is None:
            return None
        return m["candidates_p90"] / max(m["candidates_p10"], 1)


# --- Tables and the plot --------------------------------------------------------------------------


def table(rows: Rows, metrics: Sequence[str] = MAIN, *, decode_s: bool = False) -> Table:
    """One line per strategy, in sweep order: ``metrics`` with their intervals (headers:
    ``COLUMNS``)."""
    header = ["strategy"] + [COLUMNS[k] for k in metrics] + (["decode_s"] if decode_s else [])
    body = [[row["metrics"]["strategy"]] + [shown(row["metrics"], k) for k in metrics]
            + ([row["metrics"].get("decode_s")] if decode_s else []) for row in select(rows)]
    return Table(header, body)


def metrics_table(rows: Rows) -> Table:
    """Every metric of the page, keyed by its metric name, and the decoding time."""
    header = ["strategy", *CSV_ORDER, "decode_s"]
    return Table(header, table(rows, CSV_ORDER, decode_s=True).rows)


_SHORT = [(r"temperature (\S+)", r"t\1"), (r"^t (\S+)", r"t\1"), (r"top-k (\S+)", r"k\1"),
          (r"top-p (\S+)", r"p\1"), (r"min-p (\S+)", r"minp\1"), (r"typical (\S+)", r"typ\1"),
          (r" \+ ", "+"), (r"beam (\d+), no early EOS", r"beam\1 no-EOS"),
          (r"beam (\d+)$", r"beam\1"), (r"repetition (\S+)", r"rep\1"), (r"DRY (\S+)", r"dry\1"),
          (r"XTC (\S+) / \S+", r"xtc\1"), (r"dynamic t (\S+) \+- (\S+)", r"dyn\1±\2"),
          (r"Mirostat v(\d) tau (\S+)", r"miro\1 tau\2"),
          (r"contrastive (\S+), k (\d+)", r"cs\1 k\2"), (r"DoLa high \(greedy\)", "dola"),
          (r"CFG (\S+), t (\S+)", r"cfg\1 t\2")]


def short_label(name: str) -> str:
    """``t 0.7 + top-p 0.95`` -> ``t0.7+p0.95``: plot labels that hide each other less."""
    for pattern, replacement in _SHORT:
        name = re.sub(pattern, replacement, name)
    return name


def diversity_plot(rows: Rows, path: str | os.PathLike) -> pathlib.Path:
    """Diversity against perplexity under the scorer: distinct-2 (within a sample) and self-BLEU
    (across the samples of a prompt), one point per strategy in blue, human text a crimson star
    (or a dashed line where it has no value), each with its 95% intervals over prompts where the
    rows keep per-prompt values."""
    fig = Figure(figsize=(13, 5.5))
    panels = fig.subplots(1, 2)
    rows = select(rows)
    for ax, metric, label in [
            (panels[0], "distinct_2", "distinct-2 within a sample (higher: more varied)"),
            (panels[1], "self_bleu", "self-BLEU across a prompt's samples (lower: more varied)")]:
        for row in rows:
            m = row["metrics"]
            human = m["strategy"] == "human"
            colour = "crimson" if human else "tab:blue"
            if m.get(metric) is None:
                if human:  # one text per prompt: its perplexity only
                    ax.axvline(m["ppl_scorer"], color=colour, linestyle="--", linewidth=1)
                    ax.annotate("human perplexity", (m["ppl_scorer"], 0.02),
                                xycoords=("data", "axes fraction"), textcoords="offset points",
                                xytext=(3, 0), fontsize=8, color=colour)
                continue
            x, y = m["ppl_scorer"], m[metric]
            ax.scatter(x, y, marker="*" if human else "o", s=250 if human else 28, color=colour,
                       zorder=4 if human else 3)
            x_interval, y_interval = interval(m, "ppl_scorer"), interval(m, metric)
            if x_interval and y_interval:  # the 95% intervals over prompts, both axes
                ax.errorbar(x, y, xerr=[[x - x_interval.low], [x_interval.high - x]],
                            yerr=[[y - y_interval.low], [y_interval.high - y]], fmt="none",
                            ecolor=colour, alpha=0.5, linewidth=0.8, zorder=2)
            ax.annotate(short_label(m["strategy"]), (x, y), textcoords="offset points",
                        xytext=(6, -16) if human else (4, 3), fontsize=10 if human else 7.5,
                        fontweight="bold" if human else "normal",
                        color=colour if human else "black", zorder=4)
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
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


# --- The page's text ------------------------------------------------------------------------------


def pretrained(rows: Rows) -> str | None:
    """The pretrained generator's name, or None for the models trained here."""
    return rows[0]["config"]["generator"]["model"].get("pretrained")


def share(value: Interval | float | None) -> str:
    """A share as a percentage: ``0.442`` -> ``44.2%``, an Interval with its bounds alike."""
    if isinstance(value, Interval):
        return (f"{format_number(100 * value.value)}% [{format_number(100 * value.low)}%, "
                f"{format_number(100 * value.high)}%]")
    return "n/a" if value is None else f"{format_number(100 * value)}%"


def closest_to_human(rows: Rows) -> tuple[str, Interval | float | None] | None:
    """The strategy whose scorer perplexity is nearest human text's (in log) and its paired
    ratio to it; None without a human row."""
    named = by_name(rows)
    human = named.get("human")
    if human is None or len(named) < 2:
        return None
    closest = min((m for name, m in named.items() if name != "human"),
                  key=lambda m: abs(math.log(m["ppl_scorer"] / human["ppl_scorer"])))
    return closest["strategy"], Paired(closest["strategy"], "human", "ppl_scorer",
                                       ratio=True)(rows)


def answer(judged: Sequence[Judged], rows: Rows, tally: str) -> str:
    """The claims by verdict (each claim's words before its colon) and the strategy closest to
    human text, in one sentence."""
    groups: dict[str, list[str]] = {"met": [], "undecided": [], "not met": []}
    sides: dict[str, set] = {}
    for j in judged:
        sides.setdefault(j.claim.text.split(":")[0], set()).add(j.verdict.side)
    for j in judged:
        side = {1: "met", 0: "undecided", -1: "not met"}[j.verdict.side]
        name = j.claim.text.split(":")[0]
        if len(sides[name]) > 1:  # one name, verdicts apart: each claim's last clause tells them
            name += f" ({j.claim.text.rsplit(', ', 1)[-1]})"
        if not name[1:2].isupper():  # "DRY" and "XTC" keep their capitals
            name = name[0].lower() + name[1:]
        if name not in groups[side]:
            groups[side].append(name)
    listed = "; ".join(f"{side}: {', '.join(names)}" for side, names in groups.items() if names)
    model = f"`{pretrained(rows)}`" if pretrained(rows) else "the `small` model"
    sentence = f"On {model}, {tally} ({listed})"
    closest = closest_to_human(rows)
    if closest:
        name, ratio = closest
        sentence += (f"; the strategy closest to human text in the scorer's perplexity is {name} "
                     f"({format_value(ratio)} times human text's)")
    return sentence + "."


def method(rows: Rows) -> list[str]:
    """The page's method: the models and prompts, the human and beam rows, the intervals, the
    table's columns and the sweep's compilations, read from the rows."""
    first = rows[0]
    c, m = first["config"], first["metrics"]
    p = c["prompts"]
    prompts = (f"{m['prompts']} held-out prompts ({p['per_play']} paragraph starts spread "
               f"through each of the three test plays, {p['prompt_tokens']} tokens each"
               + (f", in a chat turn: \"{p['instruction']}\")" if p.get("instruction") else ")")
               + f" continued by {p['new_tokens']} tokens, {p['samples']} samples per prompt "
               "with fixed seeds, under each strategy")
    if pretrained(rows):
        models = (f"The pretrained instruct model `{pretrained(rows)}` "
                  f"({format_number(m['generator_params'])} parameters, validation perplexity "
                  f"{format_number(m['generator_val_ppl'])}): {prompts}; it also scores the "
                  "text (the only real model installed).")
    else:
        models = (f"The `small` model ({format_number(m['generator_params'])} parameters, "
                  f"{c['generator']['train']['steps']} training steps, validation perplexity "
                  f"{format_number(m['generator_val_ppl'])}): {prompts}; the `scorer` preset "
                  f"({format_number(m['scorer_params'])} parameters, "
                  f"{c['scorer']['train']['steps']} steps, validation perplexity "
                  f"{format_number(m['scorer_val_ppl'])}; same tokenizer and plays) judges it.")
    units = all(r["metrics"].get("per_prompt") for r in rows)
    compiled = {k: sum(r["metrics"].get(k, 0) for r in rows) for k in
                ("compiles_generate_prefill", "compiles_generate_loop", "compiles_beam_prefill",
                 "compiles_beam_loop", "compiles_scoring", "compiles_token_stats",
                 "compiles_contrastive_prefill", "compiles_contrastive_loop")}
    methods = [r["config"]["decode"]["method"] for r in rows]
    newer = any("mirostat" in r["config"]["decode"] for r in rows)  # the llama.cpp samplers' era
    lines = [
        models,
        ("**human**: the same metrics on the true continuation of each prompt (one per prompt: no "
         f"self-BLEU). Beam search (width {c['decode']['beam_width']}, GNMT length penalty "
         f"{c['decode']['length_penalty']}) is deterministic: its best hypothesis stands for every "
         "sample; \"no early EOS\" forbids EOS before the budget."),
        (f"Brackets: 95% percentile bootstrap intervals over the {m['prompts']} prompts (2,000 "
         "resamples, fixed seed; `decodelab.measure.stats`); two strategies are compared paired "
         "prompt by prompt. Zipf and the candidate percentiles, pooled over prompts, have none."
         if units else f"No intervals: {NO_UNITS}."),
        ("llama.cpp's DRY, XTC, dynamic temperature and Mirostat at its definitions (their "
         "order: `decodelab/sampling/processors.py`), DRY's breakers its default strings; "
         "contrastive search (Su et al. 2022), DoLa over the upper layers (Chuang et al. 2023) and "
         "classifier-free guidance against the prompt's last token, as transformers has them.")
        if newer else None,
        ("Columns: perplexity under the scorer (tokens pooled); distinct-2, the share of distinct "
         "2-grams within a sample; rep-4, the share of a sample's 4-grams that repeat an earlier "
         "one; self-BLEU (sacrebleu, 0-100) of each sample against its prompt's other samples; "
         "top-1, the share of tokens that are the generator's argmax; p<1%, the share it gives "
         "under 1% probability. The generator's perplexity, distinct-1/3, identical samples, "
         "Zipf, candidates kept per step, length" + (
             ", EOS and the surprise in bits (under the model and under the distributions drawn "
             "from): the CSVs." if newer else " and EOS: the CSVs.")),
        ("Compilations over the sweep (a `jax.monitoring` listener; from the rows): `generate`'s "
         f"prefill {compiled['compiles_generate_prefill']} and decode loop "
         f"{compiled['compiles_generate_loop']} for {methods.count('sample')} sampling "
         f"strategies; beam search's prefill {compiled['compiles_beam_prefill']} and loop "
         f"{compiled['compiles_beam_loop']} for {methods.count('beam')}"
         + (f"; contrastive search's prefill {compiled['compiles_contrastive_prefill']} and "
            f"loop {compiled['compiles_contrastive_loop']} for {methods.count('contrastive')}"
            if "contrastive" in methods else "") + "; the scoring pass "
         f"{compiled['compiles_scoring']} and the token statistics "
         f"{compiled['compiles_token_stats']}. Decoding took "
         f"{format_number(sum(r['metrics']['decode_s'] for r in rows))} s in all."),
    ]
    return [line for line in lines if line is not None]


def caveats(rows: Rows) -> list[str]:
    """What the table does not say, with the numbers from the rows (the lines whose strategies
    the rows lack are left out)."""
    named = by_name(rows)

    def num(name: str, metric: str) -> str:
        return format_value(shown(named[name], metric))

    def pct(name: str, metric: str) -> str:
        return share(shown(named[name], metric))

    lines = []
    if pretrained(rows):
        lines.append("The generator is its own scorer: the scorer's perplexity is the model's "
                     "own judgement of the text, not an outside one.")
    if {"greedy", "human"} <= set(named):
        lines.append(f"Probable is not human-like: the scorer finds greedy text far more "
                     f"probable than human text (perplexity {num('greedy', 'ppl_scorer')} "
                     f"against {num('human', 'ppl_scorer')}).")
    if {"temperature 0.3", "greedy"} <= set(named):
        lines.append(f"Low temperature is not deterministic: at 0.3 a prompt's samples are all "
                     f"the same tokens for {pct('temperature 0.3', 'identical_samples')} of the "
                     f"prompts (self-BLEU {num('temperature 0.3', 'self_bleu')}, greedy "
                     f"{num('greedy', 'self_bleu')}).")
    if {"top-k 5", "top-k 40", "temperature 1.0", "human"} <= set(named):
        lines.append(f"Top-k's guarantee is about rank only: the share of tokens the generator "
                     f"gives under 1% is {pct('top-k 5', 'improbable_rate')} for k = 5 and "
                     f"{pct('top-k 40', 'improbable_rate')} for k = 40, against "
                     f"{pct('temperature 1.0', 'improbable_rate')} for plain sampling and "
                     f"{pct('human', 'improbable_rate')} in human text.")
    closest = closest_to_human(rows)
    if closest and isinstance(closest[1], Interval):
        name, ratio = closest
        lines.append(f"Closest to human text in the scorer's perplexity: {name} "
                     f"({num(name, 'ppl_scorer')} against {num('human', 'ppl_scorer')}; ratio "
                     f"{format_value(ratio)}, " + verdict(
                         ratio, threshold=1.0, above="more perplexing than human text",
                         below="less perplexing than human text", units="prompts").text
                     + f"); distinct-2 {num(name, 'distinct_2')} against "
                     f"{num('human', 'distinct_2')}, rep-4 {pct(name, 'repetition_4')} against "
                     f"{pct('human', 'repetition_4')}.")
    beam, full = named.get("beam 4"), named.get("beam 4, no early EOS")
    if beam and full and "greedy" in named:
        lines.append(
            f"Beam search ends {pct('beam 4', 'eos_rate')} of its best hypotheses with EOS, "
            f"after {num('beam 4', 'mean_length')} tokens on average: under the length penalty "
            f"the short hypotheses that end the play outscore the "
            f"{rows[0]['config']['prompts']['new_tokens']}-token ones (Stahlberg and Byrne 2019 "
            f"see the same in translation). Made to fill the budget, it repeats "
            f"{pct('beam 4, no early EOS', 'repetition_4')} of its 4-grams (greedy "
            f"{pct('greedy', 'repetition_4')}).")
    penalties = [n for n in ("t 0.7 + DRY 0.8", "t 0.7 + XTC 0.5 / 0.1") if n in named]
    if penalties and "t 0.7 + repetition 1.2" in named:
        lines.append("Against repetition at t 0.7, rep-4 and the scorer's perplexity: " + "; ".join(
            f"{n[8:]} {pct(n, 'repetition_4')}, {num(n, 'ppl_scorer')}"
            for n in ["t 0.7 + repetition 1.2", *penalties]
            + (["temperature 0.7"] if "temperature 0.7" in named else []))
            + " (the last: no penalty). XTC removes top choices rather than repeats.")
    mirostat = [n for n in named if n.startswith("Mirostat") and
                named[n].get("surprise_sampled") is not None]
    if mirostat:
        lines.append("Mirostat's surprise in bits, under the distributions its tokens were drawn "
                     "from (what it steers) and under the model's own: " + "; ".join(
                         f"{n} {num(n, 'surprise_sampled')} and {num(n, 'surprise_generator')}"
                         for n in mirostat) + ". Its mu starts at 2 tau and moves by eta 0.1 a "
                     "token, so the first tokens of each sample draw above tau.")
    searched = [n for n in ("contrastive 0.6, k 4", "DoLa high (greedy)", "CFG 1.5, t 0.7")
                if n in named]
    if searched and "greedy" in named:
        lines.append("Where the search-style methods land (rep-4, distinct-2, the scorer's "
                     "perplexity): " + "; ".join(
                         f"{n} {pct(n, 'repetition_4')}, {num(n, 'distinct_2')}, "
                         f"{num(n, 'ppl_scorer')}" for n in ["greedy", *searched]) + ".")
    lines.append("An empty text scores self-BLEU 0, so beam search's copies of a hypothesis that "
                 "is only EOS lower it; the prompts sit mid-play, so the true continuations never "
                 "end (EOS 0). Candidates: temperature alone allows the whole vocabulary.")
    if "greedy" in named:
        text = " ".join(named["greedy"]["example"].split())
        lines.append(f"Greedy's first sample of the first prompt begins \"{text[:100]}...\" "
                     "(every strategy's: the points CSV).")
    return lines
