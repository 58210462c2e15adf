"""The compression pages' shared parts (quantization, pruning): one page per reference model, a
row's intervals over the scored windows and over the timed runs, and targets as data.

Rows hold ``metrics`` with the scoreboard of ``compare`` (``kl_per_window``,
``same_top_per_window``, ...) and, per batch size B, ``reference_reps_s_b<B>`` / ``reps_s_b<B>``
(each timed run's seconds, in run order) and ``speedup_b<B>`` (``decodelab.measure.compression``).
A figure gets a 95% bootstrap interval where its row keeps those values (over the windows; over
the runs, resampled in pairs: run i of the reference and of the candidate ran back to back, so
load that drifts between runs cancels) and is its point value where the row keeps none.

A ``Target`` is one of a page's targets as data: the rows it reads (``where``, as
``report.select`` reads it), what is measured, the threshold and the comparison, and the pages it
is judged on. Every page judges its own model's rows only (``page_rows``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from decodelab.measure import stats
from decodelab.measure.stats import Interval
from decodelab.report.claims import Claim, Judged
from decodelab.report.form import Form, tally
from decodelab.report.tables import Where, select

Rows = Sequence[Mapping[str, Any]]
Value = Callable[[Rows], "Interval | float | None"]
PER_WINDOW = {"kl_mean": "kl_per_window", "same_top": "same_top_per_window"}
COMMAND = "python -m experiments.report --all"


def metric(row: Mapping[str, Any], name: str) -> Any:
    return row["metrics"].get(name)


def model_of(row: Mapping[str, Any]) -> str | None:
    """The pretrained model a row's reference is (None: a preset trained on the corpus)."""
    return row["config"]["model"].get("pretrained")


def by_model(rows: Rows) -> dict[str | None, list]:
    """The rows of each reference model, in sweep order (the order of first appearance)."""
    groups: dict = {}
    for row in sorted(rows, key=lambda r: r.get("sweep_index", 0)):
        groups.setdefault(model_of(row), []).append(row)
    return groups


def page_rows(rows: Rows, pretrained: str | None) -> list:
    return by_model(rows).get(pretrained, [])


def page_name(study: str, pretrained: str | None) -> str:
    """``quantization`` (the trained model) or ``quantization_<pretrained>``."""
    return study + ("" if pretrained is None else f"_{pretrained}")


def scoped(fn: Callable, pretrained: str | None) -> Callable:
    """``fn(rows, ...)`` of one page: it sees that page's model's rows only."""
    return lambda rows, *args: fn(page_rows(rows, pretrained), *args)


def model_text(config: Mapping[str, Any]) -> str:
    """What the reference of a row's ``config`` is, in words."""
    model = config["model"]
    if model.get("pretrained"):
        return (f"the pretrained `{model['pretrained']}` (its GGUF file dequantized to "
                "float32)")
    return (f"a model {model['d_model']} wide with {model['n_layers']} layers (the `medium` "
            f"preset unless overridden) trained on the corpus for {config['train']['steps']} "
            "steps")


def find(rows: Rows, where: Where) -> Mapping[str, Any] | None:
    """The first row (in sweep order) matching ``where``, or None."""
    chosen = select(rows, where)
    return chosen[0] if chosen else None


def one(rows: Rows, where: Where) -> Mapping[str, Any] | None:
    """The one row matching ``where`` (None if none; two are an error: a claim reads one row)."""
    chosen = select(rows, where)
    if len(chosen) > 1:
        raise ValueError(f"where={where!r} must pick at most one row of a page, got "
                         f"{len(chosen)}")
    return chosen[0] if chosen else None


# --- a row's intervals -------------------------------------------------------------------------


def window_interval(row: Mapping[str, Any], name: str) -> Interval | None:
    """The bootstrap interval over windows of the row's ``name`` (``kl_mean`` or ``same_top``),
    from its per-window values; None for a row without them."""
    per_window = metric(row, PER_WINDOW[name])
    if not per_window or len(per_window) < 2:
        return None
    return stats.bootstrap(stats.mean, np.asarray(per_window, np.float64))


def cell(row: Mapping[str, Any], name: str) -> Interval | float | None:
    """A scoreboard figure: its interval over windows where the row has per-window values, else
    the plain value."""
    return window_interval(row, name) or metric(row, name)


def speedup(row: Mapping[str, Any], B: int) -> Interval | None:
    """The speed-up at batch ``B`` (median over median) with its bootstrap interval, the runs
    resampled in pairs; None for a row with fewer than 2 runs kept."""
    ref, cand = metric(row, f"reference_reps_s_b{B}"), metric(row, f"reps_s_b{B}")
    if not ref or not cand or len(ref) < 2:
        return None
    return stats.bootstrap_ratio(stats.median, np.asarray(ref, np.float64),
                                 np.asarray(cand, np.float64), paired=True)


def speed_cell(row: Mapping[str, Any], B: int) -> Interval | float | None:
    return speedup(row, B) or metric(row, f"speedup_b{B}")


def windows_compared(a: Mapping[str, Any], b: Mapping[str, Any], name: str = "kl_mean", *,
                     ratio: bool = False) -> Interval | None:
    """Row ``a``'s ``name`` (``kl_mean`` or ``same_top``, mean over windows) minus row ``b``'s,
    or over it (``ratio``), paired over the windows (both scored on the same windows); None
    where either row keeps no per-window values."""
    wa, wb = metric(a, PER_WINDOW[name]), metric(b, PER_WINDOW[name])
    if not wa or not wb or len(wa) != len(wb) or len(wa) < 2:
        return None
    two = stats.bootstrap_ratio if ratio else stats.bootstrap_difference
    try:
        return two(stats.mean, np.asarray(wa, np.float64), np.asarray(wb, np.float64),
                   paired=True)
    except ValueError:  # a ratio over a mean of 0
        return None


def speed_over(a: Mapping[str, Any], b: Mapping[str, Any], B: int) -> Interval | None:
    """Row ``a``'s tokens/s at batch ``B`` over row ``b``'s (the same tokens per run): ``b``'s
    median run seconds (``reps_s_b<B>``) over ``a``'s, each row's runs resampled on their own;
    None where either keeps fewer than 2 runs."""
    ra, rb = metric(a, f"reps_s_b{B}"), metric(b, f"reps_s_b{B}")
    if not ra or not rb or len(ra) < 2 or len(rb) < 2:
        return None
    return stats.bootstrap_ratio(stats.median, np.asarray(rb, np.float64),
                                 np.asarray(ra, np.float64))


def point(value: Interval | float | None) -> float | None:
    return value.value if isinstance(value, Interval) else value


def times(ratio: Interval | float) -> str:
    """``2.00x`` or, with its interval, ``2.00x [1.90, 2.10]``."""
    if isinstance(ratio, Interval):
        return f"{ratio.value:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"
    return f"{ratio:.2f}x"


def bars(values: Sequence[Any]) -> list[list[float]]:
    """Error-bar lengths below and above for a list of Intervals (0 for plain numbers)."""
    low = [v.value - v.low if isinstance(v, Interval) else 0.0 for v in values]
    high = [v.high - v.value if isinstance(v, Interval) else 0.0 for v in values]
    return [low, high]


# --- what a target measures -----------------------------------------------------------------------


def scoreboard(name: str, where: Where) -> Value:
    """A scoreboard figure (``kl_mean``, ``same_top``) of the row ``where`` picks (``cell``)."""
    return lambda rows: None if (row := one(rows, where)) is None else cell(row, name)


def speed(B: int, where: Where) -> Value:
    """The speed-up at batch ``B`` of the row ``where`` picks (``speed_cell``)."""
    return lambda rows: None if (row := one(rows, where)) is None else speed_cell(row, B)


def against(where: Where, other: Where, compared: Callable) -> Value:
    """``compared(a, b)`` of the rows ``where`` and ``other`` pick (None if either is missing):
    ``windows_compared`` or ``speed_over`` with their options bound."""
    def value(rows: Rows) -> Interval | None:
        a, b = one(rows, where), one(rows, other)
        return None if a is None or b is None else compared(a, b)

    return value


def kl_minus(where: Where, other: Where) -> Value:
    """Mean KLD of the row ``where`` picks minus that of the row ``other`` picks, paired over
    the windows."""
    return against(where, other, windows_compared)


@dataclasses.dataclass(frozen=True)
class Target:
    """One target of a compression page: ``subject`` (what it is about, "int8 weights": the
    answer groups targets by it), ``name`` (what is measured, "mean KLD"), ``value`` (the page's
    rows -> an Interval, a point value, or None where they hold nothing to measure),
    ``threshold`` and the comparison (``at_least``), ``units`` (what the interval resamples),
    ``unit`` (after the numbers), ``pages``: "all", "pretrained" or "trained"."""

    subject: str
    name: str
    value: Value
    threshold: float
    at_least: bool = True
    units: str = "windows"
    unit: str = ""
    pages: str = "all"

    def __post_init__(self):
        if self.pages not in ("all", "pretrained", "trained"):
            raise ValueError(f"pages must be 'all', 'pretrained' or 'trained', got "
                             f"{self.pages!r}")

    def on_page(self, pretrained: str | None) -> bool:
        return self.pages == "all" or (self.pages == "pretrained") == (pretrained is not None)

    def claim(self, pretrained: str | None) -> Claim:
        """This target's claim on the page of ``pretrained`` (None: the trained model)."""
        return Claim(f"{self.subject}: {self.name}",
                     lambda rows: self.value(page_rows(rows, pretrained)), self.threshold,
                     self.at_least, units=self.units, unit=self.unit)


def page_targets(targets: Sequence[Target], pretrained: str | None) -> list[Target]:
    return [t for t in targets if t.on_page(pretrained)]


def answer(targets: Sequence[Target], judged: Sequence[Judged]) -> str:
    """One sentence from the judged claims of ``targets`` (in their order): the tally, then per
    subject each claim's verdict (a subject of more than 3: on how many it is met)."""
    subjects: dict[str, list] = {}
    for target, done in zip(targets, judged, strict=True):
        subjects.setdefault(target.subject, []).append((target, done))
    parts = []
    for subject, group in subjects.items():
        if len(group) <= 3:
            parts.append(f"{subject}: " + ", ".join(
                f"{t.name} {j.verdict.text.split(' (')[0]}" for t, j in group))
            continue
        met = sum(j.verdict.side > 0 for _, j in group)
        undecided = sum(j.verdict.side == 0 for _, j in group)
        parts.append(f"{subject}: met on {met} of {len(group)}"
                     + (f" ({undecided} undecided or not measured)" if undecided else ""))
    return f"{tally(list(judged))}; " + "; ".join(parts) + "."


def model_forms(study: str, rows: Rows, targets: Callable[[Rows], Sequence[Target]], tables: Any,
                csvs: Callable[[Rows], Mapping[str, Callable]], plot_caption: str) -> list[Form]:
    """One page per reference model of a compression study: ``<study>`` (the trained model) or
    ``<study>_<pretrained>``. ``targets(group)`` and ``csvs(group)`` give a model's targets and
    its every-column tables; ``tables`` is the study's table module (``question``, ``main_table``,
    ``method``, ``caveats``, ``plot``)."""
    pages = []
    for pretrained, group in by_model(rows).items():
        chosen = page_targets(targets(group), pretrained)
        pages.append(Form(
            name=page_name(study, pretrained), question=tables.question(group),
            claims=[t.claim(pretrained) for t in chosen],
            answer=lambda judged, rows, chosen=chosen: answer(chosen, judged),
            table=scoped(tables.main_table, pretrained), method=tables.method(group),
            caveats=tables.caveats(group), plot=scoped(tables.plot, pretrained),
            plot_caption=plot_caption,
            csvs={key: scoped(make, pretrained) for key, make in csvs(group).items()},
            command=COMMAND, own_rows=scoped(list, pretrained)))
    return pages
