"""Claims judged against intervals: ``verdict``, the one rule every page uses (a difference, a ratio
or an estimate against a threshold is called only when its interval excludes the threshold), and
``across_seeds`` for a claim judged on each training seed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from decodelab.measure.stats import Interval, units_needed
from decodelab.report.tables import select


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A claim's outcome: ``side`` +1 (the interval lies above the threshold), -1 (below), 0 (it
    contains the threshold, or there is no interval); ``text`` is what the page says."""

    side: int
    text: str

    def __str__(self) -> str:
        return self.text


def verdict(interval: Interval | None, *, above: str, below: str, threshold: float = 0.0,
            units: str = "units", missing: str = "no interval") -> Verdict:
    """The one rule for a generated claim about ``interval`` (a difference, a ratio, or an estimate
    compared with a target ``threshold``): ``above`` when the whole interval lies above the
    threshold, ``below`` when it lies below, and otherwise "not distinguishable at this sample size
    (about N units would be needed)", N from ``stats.units_needed`` (past 100 times the interval's
    units, only that). ``interval`` None (a row without per-unit values) gives "not judged
    (``missing``)"."""
    if interval is None:
        return Verdict(0, f"not judged ({missing})")
    if not isinstance(interval, Interval):
        raise ValueError(f"interval must be an Interval or None, got {type(interval).__name__}")
    if interval.low > threshold:
        return Verdict(1, above)
    if interval.high < threshold:
        return Verdict(-1, below)
    needed = units_needed(interval, threshold)
    if needed is None:
        return Verdict(0, "not distinguishable at this sample size (the estimate sits on "
                          f"{threshold:g}; no number of {units} would separate them)")
    if needed > 100 * interval.units:
        return Verdict(0, f"not distinguishable at this sample size (over 100 times these "
                          f"{interval.units:,} {units} would be needed)")
    return Verdict(0, f"not distinguishable at this sample size (about {needed:,} {units} would "
                      "be needed)")


def _seed_list(seeds: list) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def across_seeds(verdicts: Mapping[Any, Verdict]) -> Verdict:
    """One claim judged separately on each training seed (``verdicts``: seed -> its verdict) as
    one verdict: called (``side`` +1 or -1) only when every seed calls it, with the same text,
    "... on every seed (seeds 0, 1, 2)"; otherwise side 0, "seeds disagree: ...", each outcome
    with its seeds in seed order ("not distinguishable ... on every seed" when none calls it). An
    uncalled seed counts as disagreeing: a seed that cannot separate the two is evidence for
    neither. One seed gives its own verdict unchanged."""
    if not verdicts:
        raise ValueError("verdicts must hold at least one seed's verdict, got none")
    if len(verdicts) == 1:
        return next(iter(verdicts.values()))
    groups: dict[str, tuple[int, list]] = {}
    for seed in sorted(verdicts):
        judged = verdicts[seed]
        label = judged.text if judged.side else judged.text.split(" (")[0]
        groups.setdefault(label, (judged.side, []))[1].append(seed)
    if len(groups) == 1:
        (label, (side, seeds)), = groups.items()
        return Verdict(side, f"{label} on every seed ({_seed_list(seeds)})")
    return Verdict(0, "seeds disagree: " + "; ".join(
        f"{label} ({_seed_list(seeds)})" for label, (_, seeds) in groups.items()))


# --- Claims declared as data ----------------------------------------------------------------------

Quantity = Callable[[Sequence[Mapping[str, Any]]], "Interval | float | None"]


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim as data: what is measured (``quantity``: the rows -> an Interval where the rows
    allow one, a plain number where they do not, None where they hold nothing to measure), the
    ``threshold`` and the comparison (``at_least``: the claim holds when the quantity is >= the
    threshold; otherwise when it is <=). ``units`` names what the interval resamples (prompts,
    repetitions), for the "about N would be needed" of an undecided claim; ``unit`` is written
    after the measured value and the threshold ("x", " ms")."""

    text: str
    quantity: Quantity
    threshold: float
    at_least: bool = True
    units: str = "units"
    unit: str = ""

    def __post_init__(self):
        if not self.text:
            raise ValueError("text must say what is claimed, got an empty string")
        if not callable(self.quantity):
            raise ValueError(f"quantity must be a function of the rows, got {self.quantity!r}")
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool):
            raise ValueError(f"threshold must be a number, got {self.threshold!r}")

    @property
    def comparison(self) -> str:
        return ">=" if self.at_least else "<="

    def judge(self, rows: Sequence[Mapping[str, Any]]) -> Judged:
        """The claim against ``rows``: met (side +1) when the whole interval lies on the claimed
        side of the threshold, not met (-1) when it lies on the other, undecided (0) when it
        holds the threshold; a plain number is judged on its point value, and says so; None is
        not measured (0)."""
        measured = self.quantity(rows)
        if measured is None:
            return Judged(self, None, Verdict(0, "not measured"))
        if isinstance(measured, Interval):
            judged = verdict(measured, threshold=self.threshold, above="met", below="not met",
                             units=self.units)
            if not self.at_least:
                judged = Verdict(-judged.side, {"met": "not met", "not met": "met"}.get(
                    judged.text, judged.text))
            if judged.side == 0:
                judged = Verdict(0, judged.text.replace("not distinguishable at this sample size",
                                                        "undecided"))
            return Judged(self, measured, judged)
        value = float(measured)
        holds = value >= self.threshold if self.at_least else value <= self.threshold
        return Judged(self, value, Verdict(1 if holds else -1, ("met" if holds else "not met")
                                           + " (point estimate, no interval)"))


@dataclasses.dataclass(frozen=True)
class Judged:
    """A claim, what was measured for it and its verdict (``verdict.side``: +1 met, -1 not met, 0
    undecided or not measured)."""

    claim: Claim
    measured: Interval | float | None
    verdict: Verdict

    @property
    def met(self) -> bool:
        return self.verdict.side > 0


def on_row(value: Callable[[Mapping[str, Any]], Interval | float | None],
           **where: Any) -> Quantity:
    """A quantity read from the one row whose values match ``where`` (keys as ``tables.row_value``
    reads them, dotted config keys or metric names, written with ``__`` for ``.``: ``model__preset=
    "small"``): ``value(row)``. None when no row matches (the claim is not measured); two matching
    rows are an error."""
    wanted = {key.replace("__", "."): v for key, v in where.items()}

    def quantity(rows: Sequence[Mapping[str, Any]]) -> Interval | float | None:
        chosen = select(rows, wanted)
        if len(chosen) > 1:
            raise ValueError(f"where={wanted!r} must pick at most one row, got {len(chosen)}")
        return value(chosen[0]) if chosen else None

    return quantity
