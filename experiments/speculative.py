"""Speculative decoding: acceptance, tokens per target call and wall-clock speed-up of three
drafters against target-only decoding, beside the theory of Leviathan et al. (2023).

    python -m experiments.speculative --config=configs/speculative.py --workdir=runs/speculative
    python -m experiments.report --workdir=runs/speculative --out=results

One point = one (target, drafter, gamma, temperature, batch size). The target is `medium` (or, in
the comparison rows, `small`) trained on the corpus; the drafters are the `draft` preset trained
on the corpus, the same preset distilled from the target, and prompt lookup
(``decodelab.experiment.drafts``). With ``configs/speculative.py:<pretrained preset>`` the target
is that real model and the draft is trained on the corpus in its tokenizer. What each number of
a row is, and how it is timed: ``decodelab.measure.speculation``. Each target's rows get a page
of their own (``forms``): `speculative.md` for `medium`, `speculative_<name>.md` for another.
"""

from __future__ import annotations


from decodelab import experiment, report
from decodelab.experiment import drafts
from decodelab.measure import speculation as measure
from decodelab.report import speculation as spec
from decodelab.report import speculation_page as prose

_FLAGS = experiment.define_flags("configs/speculative.py")

DEFAULT_TARGET = "medium"  # the target whose page is `speculative.md` and states the targets
COMMAND = "python -m experiments.report --all"


def evaluate(config, ctx) -> dict:
    load = drafts.begin_point()
    target, drafter, tokenizer = drafts.point_models(config, ctx)
    prompts = drafts.point_prompts(tokenizer, config)
    return measure.measure_point(target, drafter, prompts, drafts.point_run(config),
                                 name=config.drafter, load_1min=load, status=ctx.status)


# --- The claims -----------------------------------------------------------------------------------

# The default target's speed-up targets at batch 1: (drafter, temperature, at least).
SPEED_TARGETS = (("distilled", 0.0, 2.0), ("distilled", 0.7, 1.5), ("ngram", 0.0, 1.5))
# measured / predicted with measured costs, at the best gamma of every drafter, batch and
# temperature (every page).
MEASURED_COSTS_TARGET = 0.85


def pick(target: str, seed: int | None = 0) -> spec.Pick:
    """rows -> the rows of ``target`` whose model drafter was trained from ``seed`` (prompt
    lookup counts as seed 0); ``seed`` None: the rows of every other seed."""
    def chosen(row) -> bool:
        seed_ = spec.draft_seed(row)
        return drafts.target_name(row) == target and (seed_ == seed if seed is not None
                                                      else seed_ != 0)
    return lambda rows: [r for r in rows if chosen(r)]


def claims(target: str, rows) -> list[report.Claim]:
    """What ``target``'s page judges: the default target's speed-up targets, the prediction with
    measured costs at the best points, which prediction the speed-ups follow, and distillation
    raising acceptance at each temperature and drafter training seed."""
    page, found = pick(target), pick(target, seed=None)(rows) + pick(target)(rows)
    out = []
    if target == DEFAULT_TARGET:
        out += [report.Claim(f"speed-up >= {least:g}x with {spec.DRAFTER_LABELS[drafter]}, "
                             f"batch 1, temperature {t:g}", spec.best_speedup(page, drafter, 1, t),
                             least, units="prompts", unit="x")
                for drafter, t, least in SPEED_TARGETS]
        out.append(report.Claim("batch 8, temperature 0: faster than `generate` with the best "
                                "drafter", spec.fastest(page, 8, 0.0), 1.0, unit="x"))
    out.append(report.Claim(
        f"measured / predicted (measured costs) >= {MEASURED_COSTS_TARGET:g} at the best gamma "
        "of every drafter, batch and temperature (the lowest)",
        spec.lowest_measured_costs_ratio(page), MEASURED_COSTS_TARGET, units="prompts"))
    out.append(report.Claim(
        "the speed-ups follow the prediction with measured costs more closely than the theory's "
        "(median |log(measured / predicted)|, the theory's minus the measured costs')",
        spec.prediction_gap(page), 0.0))
    if {"draft", "distilled"} <= {r["config"]["drafter"] for r in found}:
        seeds = sorted({spec.draft_seed(r) for r in found})
        out += [report.Claim(
            f"distillation raises acceptance (distilled minus trained draft's alpha), batch 1, "
            f"temperature {t:g}" + (f", drafters trained from seed {seed}" if len(seeds) > 1
                                    else ""),
            spec.distillation_gain(pick(target, seed), t), 0.0, units="prompts")
            for t in spec.values(found, "temperature") for seed in seeds]
    return out


# --- The pages ------------------------------------------------------------------------------------


def question(target: str, rows) -> str:
    if spec.pretrained_target(rows[0]):
        return (f"What speed-up does speculative decoding give the pretrained `{target}`, and "
                f"does it follow the theory?")
    if target == DEFAULT_TARGET:
        return (f"What speed-up do a trained draft, a distilled draft and prompt lookup give the "
                f"`{target}` target, and does it follow the theory?")
    return f"What speed-up do the same drafters give the `{target}` target (comparison rows)?"


def form(target: str, rows, targets: list[str]) -> report.Form:
    """The page of ``target``'s rows (seed 0; the other drafter seeds in their own CSV, and the
    default target's page set beside the other targets trained here)."""
    page, others = pick(target), pick(target, seed=None)
    here, reseeded = page(rows), others(rows)
    compared = {name: pick(name)(rows) for name in targets if target == DEFAULT_TARGET
                and name != target and not spec.pretrained_target(pick(name)(rows)[0])}
    csvs = {"best": lambda r: spec.best_table(page(r)),
            "points": lambda r: spec.points_table(page(r))}
    if reseeded:
        csvs["seeds"] = lambda r: spec.points_table(others(r))
    for name in compared:
        csvs[f"against_{name}"] = lambda r, name=name: prose.comparison_table(page(r),
                                                                               pick(name)(r))
    return report.Form(
        name="speculative" + ("" if target == DEFAULT_TARGET else f"_{target}"),
        question=question(target, here), claims=claims(target, rows), answer=prose.answer(page),
        table=lambda r: spec.main_table(page(r)), method=prose.method(here, target),
        caveats=prose.caveats(here, MEASURED_COSTS_TARGET, reseeded, compared),
        plot=prose.speedup_plot(page), plot_caption="speed-up against gamma, measured (bars: "
        "95% interval), theory (dashed) and with measured costs (dotted)", csvs=csvs,
        command=COMMAND, own_rows=lambda r: [row for row in r if drafts.target_name(row)
                                             in (target, *compared)])


def forms(rows) -> list[report.Form]:
    """One page per target with seed-0 rows: the default `medium`, `small`, a pretrained one."""
    targets = list(dict.fromkeys(drafts.target_name(r) for r in rows if spec.draft_seed(r) == 0))
    return [form(target, rows, targets) for target in targets]


def main(argv) -> None:
    experiment.run_from_flags(_FLAGS, evaluate, argv)


if __name__ == "__main__":
    experiment.run_program(main)
