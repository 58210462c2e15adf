"""What do the decoding strategies the seed describes do to text, against human text?

    python -m experiments.sampling --config=configs/sampling.py --workdir=runs/sampling
    python -m experiments.report --workdir=runs/sampling --out=results

Each point is one strategy (configs/sampling.py lists them): its continuations of held-out
prompts and their quality metrics, with per-prompt sums for the intervals
(``decodelab.measure.strategies``). The first point trains the generator and the scorer (cached
in the workdir), or loads a pretrained model (`configs/sampling.py:smollm2-135m`); the process
keeps them (``decodelab.experiment.evaluated``), so every later point reuses the compiled decode
programs. Each row counts the jit compilations that happened during its point. The seed's claims
are judged by intervals over prompts, two strategies compared prompt by prompt
(``decodelab.report.quality``).
"""

from __future__ import annotations


from decodelab import experiment, report
from decodelab.experiment import evaluated
from decodelab.measure import compiles, strategies
from decodelab.report import quality

_FLAGS = experiment.define_flags("configs/sampling.py")


def evaluate(config, ctx) -> dict:
    with compiles.count_traces() as counts:
        models = []
        for role in ("generator", "scorer"):
            ctx.status(role)
            models.append(evaluated.evaluated_model(config.tokenizer, config[role], ctx.workdir,
                                                    progress=ctx.show_progress))
        row = strategies.strategy_row(config.decode, config.prompts, *models, seed=config.seed,
                                      improbable_below=config.eval.improbable_below,
                                      batch_size=config.eval.batch_size, status=ctx.status)
    return {**row, **strategies.compile_counts(counts)}


# --- The seed's claims, each judged by its interval over prompts ----------------------------------

PROMPTS = dict(units="prompts")
CLAIMS = [
    # A count, exact: no interval needed.
    report.Claim("Greedy is deterministic: the share of prompts whose samples (seeds) are all "
                 "the same tokens", quality.Metric("greedy", "identical_samples", False), 1.0),
    report.Claim("Greedy is repetitive: its rep-4 over human text's, paired by prompt",
                 quality.Paired("greedy", "human", "repetition_4", ratio=True), 2.0, **PROMPTS,
                 unit="x"),
    report.Claim("Low temperature is almost greedy: the share of temperature 0.3's tokens that "
                 "are the generator's argmax", quality.Metric("temperature 0.3", "top1_rate"),
                 0.9, **PROMPTS),
    report.Claim("Low temperature is at least partly greedy: the same share",
                 quality.Metric("temperature 0.3", "top1_rate"), 0.6, **PROMPTS),
    report.Claim("High temperature is more random: self-BLEU at temperature 1.5 minus at 1.0, "
                 "paired", quality.Paired("temperature 1.5", "temperature 1.0", "self_bleu"),
                 0.0, at_least=False, **PROMPTS),
    report.Claim("High temperature is more random: distinct-2 at temperature 1.5 minus at 1.0, "
                 "paired", quality.Paired("temperature 1.5", "temperature 1.0", "distinct_2"),
                 0.0, **PROMPTS),
    # Top-k's rank guarantee: the processors leave k tokens at most (a count per step).
    report.Claim("Top-k keeps only the k most probable tokens: top-k 40's kept tokens at the "
                 "90th percentile of steps", quality.Metric("top-k 40", "candidates_p90", False),
                 40.0, at_least=False),
    report.Claim("Top-k avoids improbable words: the share of tokens under 1% probability, top-k "
                 "40 minus plain sampling (temperature 1.0), paired",
                 quality.Paired("top-k 40", "temperature 1.0", "improbable_rate"), 0.0,
                 at_least=False, **PROMPTS),
    # Percentiles pooled over all steps: a point estimate.
    report.Claim("Top-p is adaptive: top-p 0.95's kept tokens at the 90th over the 10th "
                 "percentile of steps", quality.Spread("top-p 0.95"), 4.0, unit="x"),
    # llama.cpp's samplers against the repetition penalty, all at temperature 0.7.
    *[claim for name in ("DRY 0.8", "XTC 0.5 / 0.1") for claim in (
        report.Claim(f"{name.split()[0]} cuts repetition more than the repetition penalty: rep-4 "
                     f"of t 0.7 + {name} minus t 0.7 + repetition 1.2, paired",
                     quality.Paired(f"t 0.7 + {name}", "t 0.7 + repetition 1.2",
                                    "repetition_4"), 0.0, at_least=False, **PROMPTS),
        report.Claim(f"{name.split()[0]} does so at no more than 10% higher perplexity: the "
                     f"scorer's perplexity of t 0.7 + {name} over t 0.7 + repetition 1.2, paired",
                     quality.Paired(f"t 0.7 + {name}", "t 0.7 + repetition 1.2", "ppl_scorer",
                                    ratio=True), 1.1, at_least=False, **PROMPTS, unit="x"))],
    # Mirostat steers the surprise of what it draws (under the distribution drawn from) to tau.
    *[report.Claim(f"Mirostat v2 holds tau 5: the mean surprise (bits) of its tokens under the "
                   f"distributions they were drawn from, {side} 10%",
                   quality.Metric("Mirostat v2 tau 5", "surprise_sampled"), threshold,
                   at_least=side == "down to", **PROMPTS, unit=" bits")
      for side, threshold in (("down to", 4.5), ("up to", 5.5))],
    report.Claim("Contrastive search repeats less than greedy: rep-4 of contrastive 0.6, k 4 "
                 "minus greedy, paired", quality.Paired("contrastive 0.6, k 4", "greedy",
                                                        "repetition_4"), 0.0, at_least=False,
                 **PROMPTS),
]


# --- The page -------------------------------------------------------------------------------------


def forms(rows) -> list[report.Form]:
    """``sampling`` for the models trained here, ``sampling_<preset>`` for a pretrained generator
    (so the two studies' pages coexist)."""
    rows = sorted(rows, key=lambda r: r["sweep_index"])
    model = quality.pretrained(rows)
    return [report.Form(
        name="sampling" + (f"_{model}" if model else ""),
        question=("What do the sampling strategies do to text, against human text"
                  + (f", on the pretrained `{model}`?" if model else "?")),
        claims=CLAIMS,
        answer=lambda judged, rows: quality.answer(judged, rows, report.tally(judged)),
        table=quality.table,
        plot=quality.diversity_plot,
        plot_caption="diversity against perplexity under the scorer, one point per strategy",
        method=quality.method(rows),
        caveats=quality.caveats(rows),
        csvs={"all": quality.metrics_table, "points": report.points_table},
        command="python -m experiments.report --all")]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
