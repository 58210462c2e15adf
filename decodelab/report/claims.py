"""Claims judged against intervals: ``verdict``, the one rule every page uses (a difference, a ratio
or an estimate against a threshold is called only when its interval excludes the threshold), and
``across_seeds`` for a claim judged on each training seed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from decodelab.measure.stats import Interval, units_needed


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
