"""The constrained-output study's page: per task, masked against exact constrained sampling
(``measure.constrained``: total variation and KL from importance weights, the match rate two
ways, perplexities, with intervals), and the automata's build cost. The constrained decode step's
cost is on the decode-speed page (``experiments.bench_decode``, study ``constrained``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from decodelab.measure import constrained as measure
from decodelab.measure.stats import Interval
from decodelab.report.claims import Judged, Quantity
from decodelab.report.form import tally, value_text
from decodelab.report.plots import Axes, line_plot
from decodelab.report.tables import Table

Rows = Sequence[Mapping[str, Any]]


def _points(rows: Rows, point: str) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["config"]["point"] == point]


def _task(rows: Rows, task: str) -> Mapping[str, Any] | None:
    found = [r for r in _points(rows, "task") if r["config"]["task"]["name"] == task]
    return found[0] if found else None


def task_names(rows: Rows) -> list[str]:
    return [r["config"]["task"]["name"] for r in _points(rows, "task")]


def task_value(task: str, name: str) -> Quantity:
    """A task's ``tv``, ``kl`` or ``kl_reverse`` interval (None where the task has no row, or
    too few complete outputs)."""
    def quantity(rows: Rows) -> Interval | None:
        row = _task(rows, task)
        return None if row is None else measure.distances(row["metrics"])[name]
    return quantity


def model_name(rows: Rows) -> str:
    model = rows[0]["config"]["model"]
    return model.get("pretrained") or "tiny"


def task_table(rows: Rows) -> Table:
    """Per task: TV, both KLs, the match rate weighted and measured, the weights' effective
    sample size, and the perplexity of the masked and the exact outputs."""
    lines = []
    for row in _points(rows, "task"):
        m = row["metrics"]
        d = measure.distances(m)
        complete = int(sum(m["outputs"]["complete"]))
        lines.append([
            row["config"]["task"]["name"], value_text(d["tv"]), value_text(d["kl"]),
            value_text(d["kl_reverse"]),
            f"{value_text(measure.weighted_match_rate(m))} / {value_text(measure.validity(m))}",
            f"{measure.effective_size(m):.0f} of {complete}",
            f"{value_text(measure.perplexity(m, False))} / "
            f"{value_text(measure.perplexity(m, True))}"])
    return Table(["task", "TV", "KL(exact‖masked)", "KL(masked‖exact)",
                  "P(match): weighted / measured", "effective outputs",
                  "perplexity: masked / exact"], lines)


# The distances the plot draws per task: key of ``measure.distances`` -> its label.
PLOTTED = {"tv": "total variation", "kl": "KL(exact‖masked), nats",
           "kl_reverse": "KL(masked‖exact), nats"}


def plot(rows: Rows, path) -> None:
    """Per task, the three distances of masked from exact constrained sampling with their
    intervals, on a log scale (a task too short of complete outputs has none)."""
    points = [{"task": task, "distance": label, "value": value}
              for task in task_names(rows) for key, label in PLOTTED.items()
              if (value := task_value(task, key)(rows)) is not None]
    line_plot(points, path, x="task", y="value", group="distance",
              axes=Axes(logy=True, title=f"Masked against exact constrained sampling, "
                                          f"`{model_name(rows)}`"))


def outputs_table(rows: Rows) -> Table:
    """Every task's most frequent masked outputs with their counts (the CSV)."""
    return Table(["task", "output", "count"],
                 [[r["config"]["task"]["name"], text, n] for r in _points(rows, "task")
                  for text, n in json.loads(r["metrics"]["examples"])])


def automaton_table(rows: Rows) -> Table:
    lines = []
    for row in (r["metrics"] for r in _points(rows, "automaton")):
        names = [k[:-len("_build_s")] for k in row if k.endswith("_build_s")]
        lines += [[n, row[f"{n}_build_s"], row[f"{n}_states"], row[f"{n}_edges"],
                   row[f"{n}_table_bytes"], row[f"{n}_dense"]] for n in names]
    return Table(["pattern", "build s", "states", "transitions", "table bytes", "dense"], lines)


def automaton_lines(rows: Rows) -> list[str]:
    """One sentence per pattern of the automaton point: its size and its build time."""
    return [f"Automaton `{name}`: {states:,} states, {edges:,} transitions, a "
            f"{'dense' if dense else 'sparse'} table of {nbytes / 2**20:.1f} MiB, built in "
            f"{build:.2f} s from an empty cache."
            for name, build, states, edges, nbytes, dense in automaton_table(rows).rows]


def answer(judged: Sequence[Judged], rows: Rows) -> str:
    far = [j.claim.text.split("`")[1] for j in judged if "`" in j.claim.text
           and j.verdict.side < 0]
    return (f"{tally(judged)}; masking departs measurably from the exact constrained "
            f"distribution on: {', '.join(far) or 'no task'}.")


def method(rows: Rows) -> list[str]:
    tasks = _points(rows, "task")
    s = tasks[0]["config"]["sampling"] if tasks else {}
    return [
        f"Per task, {s.get('masked')} outputs masked by the pattern (temperature 1, at most "
        f"{s.get('new_tokens')} tokens) and {s.get('unconstrained')} unconstrained ones; both "
        "sides are compared over complete outputs (ended within the budget).",
        "Each complete masked output y is weighted w = p(y)/q(y), the unconstrained over the "
        "masked probability of its tokens; the exact constrained distribution is q re-weighted "
        "by w (`decodelab/measure/constrained.py`).",
        "TV = ½·mean|w/mean(w) − 1|; KL(exact‖masked) = Σπ·log w − log mean(w) with π the "
        "normalised weights; KL(masked‖exact) = log mean(w) − mean(log w); nats.",
        "P(match) weighted = mean(w) over all masked outputs (incomplete ones 0); measured = the "
        "share of unconstrained outputs that end matching: the two agree when the weights hold.",
        "Intervals: 95% percentile bootstrap over outputs; effective outputs = (Σw)²/Σw²; "
        "perplexity is the unconstrained model's, pooled over tokens (exact: weighted).",
        "Automata: built cold (empty builder cache) into one device table on the model's "
        "vocabulary. The constrained step's cost is on the decode-speed page.",
    ]


def caveats(rows: Rows) -> list[str]:
    out = [f"`{r['config']['task']['name']}`: only {measure.effective_size(r['metrics']):.0f} "
           "effective outputs: the weights are dominated by a few outputs, so the exact side's "
           "figures and their intervals rest on those few."
           for r in _points(rows, "task") if 0 < measure.effective_size(r["metrics"]) < 30]
    out += automaton_lines(rows)
    if model_name(rows) == "tiny":
        out.append("The tiny default is a model with random weights: these numbers exercise "
                   "the program and mean nothing about any trained model.")
    return out
