"""How far past its training length does each position encoding hold its perplexity?

    python -m experiments.extrapolation --config=configs/extrapolation.py --workdir=runs/extrapolation
    python -m experiments.report --workdir=runs/extrapolation --out=results

Each point evaluates one encoding's model (trained at L, cached in the workdir) at factor x L,
RoPE also with inference-time scaling: the perplexity over non-overlapping windows and the tail
perplexity of each window's last L tokens, with every window's NLL kept for the intervals
(``decodelab.measure.extrapolation``). The sweep trains `rope`, `alibi`, `sinusoidal` and `t5`
with three seeds (``train.seed``); the tables are the first seed's, and each claim is judged on
every seed that trained what it compares (``report.seeded``): called only when every seed's
interval calls it the same way.
"""

from __future__ import annotations


from decodelab import experiment, report
from decodelab.experiment import artefacts
from decodelab.measure import extrapolation
from decodelab.report import extrapolation as pages
from decodelab.report.seeded import SeededClaim, seeds_table

_FLAGS = experiment.define_flags("configs/extrapolation.py")


def evaluate(config, ctx) -> dict:
    model, tokenizer = artefacts.trained_model(config.tokenizer, config.model, config.train,
                                               ctx.workdir, progress=ctx.show_progress)
    train_len, factor = config.train.seq_len, config.eval.factor
    label = extrapolation.encoding_label(config.model.position, config.eval.rope_scaling)
    ctx.status(f"{label} @ {train_len * factor}")
    model = extrapolation.scaled(model, config.eval.rope_scaling, factor, train_len)
    return {"encoding": label, **extrapolation.length_metrics(
        model, tokenizer, train_len=train_len, factor=factor,
        max_tokens=config.eval.max_tokens, batch_size=config.eval.batch_size)}


# --- The claims: tail perplexities, judged on each seed -------------------------------------------

TOP = 8  # the longest factor of the sweep (configs/extrapolation.py FACTORS)
GROWING = ("sinusoidal", "t5", "alibi", "rope", "nope")  # `learned` has no value past L


def _growth(encoding: str) -> SeededClaim:
    return SeededClaim(f"{encoding}'s tail perplexity grows from L to {TOP}L ({TOP}L / L)",
                       pages.Growth(encoding, TOP), 1.0, units="windows per length", unit="x")


def _difference(text: str, a: str, b: str, factor: int, *, worse: bool) -> SeededClaim:
    """``a - b`` at ``factor`` L, claimed >= 0 (``worse``: ``a`` no better) or <= 0."""
    return SeededClaim(f"{text} ({a} - {b} at {factor}L)", pages.Difference(a, b, factor), 0.0,
                       at_least=worse, units="windows")


CLAIMS = [
    *(_growth(encoding) for encoding in GROWING),
    _difference("RoPE degrades at least as badly as sinusoidal", "rope", "sinusoidal", TOP,
                worse=True),
    _difference("YaRN recovers RoPE's loss without retraining", "rope+yarn", "rope", TOP,
                worse=False),
    _difference("NTK-aware scaling helps RoPE at 2L", "rope+ntk", "rope", 2, worse=False),
    _difference("Linear position interpolation hurts without fine-tuning", "rope+linear",
                "rope", 2, worse=True),
    _difference("ALiBi holds better than T5's buckets", "alibi", "t5", TOP, worse=False),
    SeededClaim("RoPE has the lowest tail perplexity at L (the runner-up's minus RoPE's)",
                pages.Lowest("rope", 1), 0.0, units="windows"),
    SeededClaim(f"ALiBi has the lowest tail perplexity at {TOP}L (the runner-up's minus "
                "ALiBi's)", pages.Lowest("alibi", TOP), 0.0, units="windows"),
]


# --- The page -------------------------------------------------------------------------------------


def forms(rows) -> list[report.Form]:
    train_len = rows[0]["config"]["train"]["seq_len"]
    first = pages.first_seed(rows)
    seeds = sorted({pages.seed_of(r) for r in rows})
    intervals = (
        "Brackets: 95% percentile bootstrap intervals over the evaluation windows (2,000 "
        "resamples, fixed seed; `decodelab.measure.stats`); a difference of two encodings at one "
        "length is paired window by window, a growth resamples each length's windows on its own."
        if pages.windows_kept(rows) else f"No intervals: {pages.NO_WINDOWS}.")
    return [report.Form(
        name="extrapolation",
        question="How far past its training length does each position encoding hold its "
                 "perplexity?",
        claims=CLAIMS,
        answer=lambda judged, rows: pages.answer(judged, report.tally(judged)),
        table=pages.length_table,
        plot=pages.tail_plot,
        plot_caption=f"tail perplexity against context length, one line per encoding (seed "
                     f"{first})",
        method=[
            (f"One `small` model per position encoding, all trained at L = {train_len} with the "
             "same data and budget, evaluated at L, 2L, 4L and 8L on the same "
             f"{rows[0]['metrics'].get('tokens', 0):,} leading validation tokens."),
            ("`rope+linear`, `rope+ntk`, `rope+yarn`: the RoPE model with that scaling applied "
             "at inference time (factor = context / L), without retraining."),
            ("The table: tail perplexity, the last L tokens of each sliding window (positions "
             "(factor-1)L .. factor L - 1): the positions the model never trained on. Every "
             "token over non-overlapping windows (Press et al.): `extrapolation_whole.csv`."),
            intervals,
            (f"Seeds {', '.join(map(str, seeds))}; the table and the plot are seed {first}'s. A "
             "claim is judged on each seed that trained what it compares and called only when "
             f"every seed calls it the same way; measured: seed {first}'s, every seed's in "
             "`extrapolation_claims.csv`."),
        ],
        caveats=pages.caveats(rows, TOP),
        csvs={"whole": lambda rows: pages.length_table(rows, "perplexity"),
              "growth": lambda rows: pages.growth_table(rows, TOP),
              "seeds": pages.seeds_table,
              "claims": lambda rows: seeds_table(CLAIMS, rows),
              "points": report.points_table},
        command="python -m experiments.report --all")]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
