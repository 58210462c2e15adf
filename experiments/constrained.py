"""How much does per-token masking distort a model's distribution, and when?

    python -m experiments.constrained --config=configs/constrained.py --workdir=runs/constrained
    python -m experiments.report --workdir=runs/constrained --out=results

Points (configs/constrained.py): one per task (masked against exact constrained sampling,
``decodelab.measure.constrained``), one building three patterns' automata on the model's
vocabulary. The page form and its tables: ``decodelab.report.constrained``. What a constrained
decode step costs is a decode-speed study (``configs/bench_decode.py:constrained``).
"""

from __future__ import annotations

from decodelab import experiment, report
from decodelab.experiment import artefacts, presets
from decodelab.experiment.random_model import random_model
from decodelab.measure import constrained as measure
from decodelab.report import constrained as page

_FLAGS = experiment.define_flags("configs/constrained.py")


def model_and_tokenizer(config, ctx):
    tokenizer = artefacts.tokenizer_for(config.tokenizer, ctx.workdir)
    if presets.is_pretrained(config.model):
        return artefacts.pretrained_model(config.model)[0], tokenizer
    return random_model(config.model, len(tokenizer.token_bytes()), config.seed), tokenizer


def evaluate(config, ctx) -> dict:
    model, tokenizer = model_and_tokenizer(config, ctx)
    eos = [tokenizer.eos_id]
    ctx.status(config.point)
    if config.point == "automaton":
        return measure.automaton_row(tokenizer, model.config.vocab_size, eos,
                                     {k: tuple(v) for k, v in config.automata.items()})
    sampling = measure.Sampling(**config.sampling.to_dict(), seed=config.seed)
    return measure.task_row(model, tokenizer, config.task.kind, config.task.pattern,
                            config.task.instruction, sampling, eos)


# --- The claims -----------------------------------------------------------------------------------

# Masking is "close" to the exact constrained distribution below this total variation.
CLOSE_TV = 0.2


def claims(rows) -> list[report.Claim]:
    return [report.Claim(f"`{task}`: masking stays close to the exact constrained distribution "
                         "(total variation over complete outputs)", page.task_value(task, "tv"),
                         CLOSE_TV, at_least=False, units="outputs")
            for task in page.task_names(rows)]


def forms(rows) -> list[report.Form]:
    model = page.model_name(rows)
    return [report.Form(
        name="constrained" + (f"_{model}" if model != "tiny" else ""),
        question=f"How much does per-token masking distort `{model}`'s distribution, and when?",
        claims=claims(rows), answer=page.answer, table=page.task_table,
        method=page.method(rows), caveats=page.caveats(rows), plot=page.plot,
        plot_caption="total variation and both KLs of masked from exact, per task",
        csvs={"automata": page.automaton_table, "outputs": page.outputs_table,
              "points": report.points_table},
        command="python -m experiments.report --all")]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
