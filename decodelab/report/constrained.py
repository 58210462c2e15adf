"""The constrained-output study's page: per task, masked against exact constrained sampling
(``measure.constrained``: total variation, KL, validity, perplexities, with intervals); the
automata's build cost; a constrained decode step against a free one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.measure import constrained as measure
from decodelab.measure.stats import Interval
from decodelab.report.claims import Judged, Quantity
from decodelab.report.form import tally, value_text
from decodelab.report.tables import Table

Rows = Sequence[Mapping[str, Any]]


def _points(rows: Rows, point: str) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["config"]["point"] == point]


def _task(rows: Rows, task: str) -> Mapping[str, Any] | None:
    found = [r for r in _points(rows, "task") if r["config"]["task"]["name"] == task]
    return found[0] if found else None


def task_value(task: str, name: str) -> Quantity:
    """A task's ``tv`` or ``kl`` interval (None where the task has no row, or too few outputs)."""
    def quantity(rows: Rows) -> Interval | None:
        row = _task(rows, task)
        return None if row is None else measure.distances(row["metrics"])[name]
    return quantity


def batch_sizes(rows: Rows) -> list[int]:
    return sorted({r["config"]["speed"]["batch_size"] for r in _points(rows, "speed")})


def step_ratio_at(batch_size: int) -> Quantity:
    """The constrained over free step time at ``batch_size``, with its interval."""
    def quantity(rows: Rows) -> Interval | None:
        found = [r for r in _points(rows, "speed")
                 if r["config"]["speed"]["batch_size"] == batch_size]
        return measure.step_ratio(found[0]["metrics"]) if found else None
    return quantity


def model_name(rows: Rows) -> str:
    model = rows[0]["config"]["model"]
    return model.get("pretrained") or "tiny"


def task_table(rows: Rows) -> Table:
    """Per task: TV, KL(exact || masked), validity of free sampling, each side's perplexity."""
    lines = []
    for row in _points(rows, "task"):
        m = row["metrics"]
        d = measure.distances(m)
        lines.append([row["config"]["task"]["name"], m["exact_method"], value_text(d["tv"]),
                      value_text(d["kl"]), value_text(measure.validity(m)),
                      value_text(measure.perplexity(m, 0)), value_text(measure.perplexity(m, 1))])
    return Table(["task", "exact by", "TV", "KL(exact||masked)", "valid unconstrained",
                  "ppl masked", "ppl exact"], lines)


def automaton_table(rows: Rows) -> Table:
    lines = []
    for row in (r["metrics"] for r in _points(rows, "automaton")):
        names = [k[:-len("_build_s")] for k in row if k.endswith("_build_s")]
        lines += [[n, row[f"{n}_build_s"], row[f"{n}_states"], row[f"{n}_edges"],
                   row[f"{n}_table_bytes"], row[f"{n}_dense"]] for n in names]
    return Table(["pattern", "build s", "states", "transitions", "table bytes", "dense"], lines)


def speed_table(rows: Rows) -> Table:
    return Table(["batch", "free step ms", "constrained step ms", "ratio [interval]"],
                 [[r["config"]["speed"]["batch_size"], r["metrics"]["free_step_ms"],
                   r["metrics"]["constrained_step_ms"],
                   value_text(measure.step_ratio(r["metrics"]))]
                  for r in _points(rows, "speed")])


def answer(judged: Sequence[Judged], rows: Rows) -> str:
    far = [j.claim.text.split("`")[1] for j in judged if "`" in j.claim.text
           and j.verdict.side < 0]
    return (f"{tally(judged)}; masking departs measurably from the exact constrained "
            f"distribution on: {', '.join(far) or 'no task'}.")


def method(rows: Rows) -> list[str]:
    s = _points(rows, "task")[0]["config"]["sampling"] if _points(rows, "task") else {}
    return [
        f"Per task, {s.get('masked')} outputs masked by the pattern (temperature 1) against the "
        "exact constrained distribution: the model's own outputs (temperature 1) that end and "
        "match the pattern (rejection sampling, from "
        f"{s.get('unconstrained')} draws), or, with fewer than {s.get('min_accepted')} matches, "
        "a second masked set weighted by p(y)/q(y) (self-normalised importance weighting).",
        "TV and KL(exact||masked) compare the two empirical distributions over output strings; "
        f"KL adds {measure.ALPHA} to the count of every string either side drew, so a string one "
        "side never drew is not infinitely surprising.",
        "Intervals: 95% percentile bootstrap over outputs, both sides pooled and resampled "
        "together; perplexity is the unconstrained model's, pooled over tokens.",
        "Automata: built cold (empty builder cache) into one device table on the model's "
        "vocabulary; step ratio: `time_generate` step times, greedy, EOS banned, medians.",
    ]


def caveats(rows: Rows) -> list[str]:
    out = ["Empirical TV is biased upward when outputs are many and samples few: two samples "
           "of the same distribution already differ; read small TVs against that floor."]
    if model_name(rows) == "tiny":
        out.append("The tiny default is a model with random weights: these numbers exercise "
                   "the program and mean nothing about any trained model.")
    return out
