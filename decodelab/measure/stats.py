"""Uncertainty of a study's numbers: percentile bootstrap intervals over evaluation units.

A *unit* is what a study evaluates independently and could have drawn differently: an eval window
(perplexity), a prompt (the sampling metrics), a timed repetition (speed). A row stores its
per-unit values as *columns*, each ``float [n]`` with one value per unit (a window's NLL sum, a
prompt's count of repeated 4-grams and its count of 4-grams, one repetition's seconds). A
*statistic* maps columns to the row's number and is written for a leading resample axis: it takes
``[..., n]`` arrays and reduces the last axis (``mean``, ``median``, ``ratio_of_sums``,
``perplexity``), so all resamples are computed in one vectorised call.

- ``bootstrap``: the statistic's 95% percentile interval, resampling the units with replacement.
- ``bootstrap_difference``: statistic(a) - statistic(b). Paired (the default) when a and b are
  measured on the same units (two strategies on the same prompts, two encodings on the same
  windows): one draw of unit indices serves both, so what the units share cancels.
- ``bootstrap_ratio``: statistic(a) / statistic(b), e.g. a speed-up, median seconds of A over
  median seconds of B; unpaired by default (repetitions of two programs are not matched).
- ``units_needed``: when an interval does not separate its estimate from a threshold, about how
  many units would (interval width scales as 1 / sqrt(n)).

Every call uses a fixed seed (``seed=0``), so a page renders the same intervals every time.
Resamples on which the statistic is undefined (NaN: e.g. a ratio whose resampled denominator is 0)
are left out of the percentiles; if half or more are, the interval is refused. Units are taken
as independent: neighbouring windows of one text are not, so a window interval is, if anything,
too narrow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from decodelab.checks import check_int, check_number

RESAMPLES = 2000
LEVEL = 0.95

Statistic = Callable[..., np.ndarray]
Columns = np.ndarray | Sequence[float] | tuple


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate and its confidence interval over ``units`` units, at confidence ``level``."""

    value: float
    low: float
    high: float
    units: int
    level: float = LEVEL

    def __post_init__(self):
        if not self.low <= self.high:
            raise ValueError(f"low must be <= high, got low={self.low!r}, high={self.high!r}")

    def excludes(self, threshold: float) -> bool:
        """True if the whole interval lies strictly on one side of ``threshold``."""
        return self.low > threshold or self.high < threshold

    def __format__(self, spec: str) -> str:
        """``f"{interval:.1f}"`` -> ``57.7 [56.1, 59.2]``."""
        return f"{self.value:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


# --- Statistics: columns [..., n] -> [...] --------------------------------------------------------


def mean(x: np.ndarray) -> np.ndarray:
    return np.mean(x, axis=-1)


def median(x: np.ndarray) -> np.ndarray:
    return np.median(x, axis=-1)


def ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """sum(numerator) / sum(denominator): a rate pooled over units of different sizes (e.g.
    repeated 4-grams over 4-grams); NaN where the denominator sums to 0."""
    top, bottom = np.sum(numerator, axis=-1), np.sum(denominator, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(bottom != 0, top / np.where(bottom != 0, bottom, 1), np.nan)


def perplexity(nll: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """exp(sum of NLL / sum of tokens): ``nll`` per unit in nats, ``tokens`` the targets scored."""
    with np.errstate(over="ignore"):
        return np.exp(ratio_of_sums(nll, tokens))


# --- Bootstrap ------------------------------------------------------------------------------------


def _columns(name: str, columns: Columns) -> list[np.ndarray]:
    """One array or a tuple of arrays, each [n] float with the same n >= 2."""
    parts = list(columns) if isinstance(columns, tuple) else [columns]
    if not parts:
        raise ValueError(f"{name} must hold at least one column, got an empty tuple")
    arrays = []
    for i, part in enumerate(parts):
        try:
            array = np.asarray(part, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be numeric per-unit values, got {part!r}") from None
        if array.ndim != 1:
            raise ValueError(f"{name} columns must be 1-D (one value per unit), got shape "
                             f"{array.shape} for column {i}")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must be finite, got a non-finite value in column {i}")
        arrays.append(array)
    sizes = {len(a) for a in arrays}
    if len(sizes) != 1:
        raise ValueError(f"{name} columns must have one value per unit each, got lengths "
                         f"{[len(a) for a in arrays]}")
    if sizes.pop() < 2:
        raise ValueError(f"{name} must hold at least 2 units to resample, got {len(arrays[0])}")
    return arrays


def _check(resamples: int, level: float, seed: int) -> None:
    check_int("resamples", resamples, 1000)
    check_number("level", level, 0.5, 1, open_high=True)
    check_int("seed", seed, 0)


def _interval(value: float, draws: np.ndarray, units: int, level: float) -> Interval:
    """From the resampled statistics, NaN (undefined) draws dropped unless half or more are."""
    kept = draws[~np.isnan(draws)]
    if 2 * kept.size <= draws.size:
        raise ValueError("the statistic is undefined (NaN) on at least half of the resamples; "
                         "these units cannot support an interval")
    low, high = np.quantile(kept, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(value), float(min(low, value)), float(max(high, value)), units, level)


def _draws(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    return rng.integers(0, n, size=(resamples, n))  # [R, n]


def bootstrap(statistic: Statistic, columns: Columns, *, resamples: int = RESAMPLES,
              level: float = LEVEL, seed: int = 0) -> Interval:
    """The ``level`` percentile bootstrap interval of ``statistic(*columns)``.

    ``columns``: one array ``[n]`` or a tuple of them (one value per unit each; n >= 2). The
    interval is widened, if need be, to contain the estimate itself."""
    _check(resamples, level, seed)
    arrays = _columns("columns", columns)
    n = len(arrays[0])
    index = _draws(np.random.default_rng(seed), n, resamples)
    value = float(statistic(*arrays))
    if not math.isfinite(value):
        raise ValueError(f"the statistic of the columns must be finite, got {value!r}")
    draws = np.asarray(statistic(*(a[index] for a in arrays)), np.float64)
    return _interval(value, np.where(np.isfinite(draws), draws, np.nan), n, level)


def _two(statistic: Statistic, a: Columns, b: Columns, paired: bool, resamples: int,
         level: float, seed: int, combine: Callable[[np.ndarray, np.ndarray], np.ndarray]
         ) -> Interval:
    _check(resamples, level, seed)
    a_cols, b_cols = _columns("a", a), _columns("b", b)
    n_a, n_b = len(a_cols[0]), len(b_cols[0])
    if paired and n_a != n_b:
        raise ValueError(f"paired a and b must be measured on the same units, got {n_a} and {n_b} "
                         "units (pass paired=False for independent samples)")
    rng = np.random.default_rng(seed)
    index_a = _draws(rng, n_a, resamples)
    index_b = index_a if paired else _draws(rng, n_b, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = combine(np.float64(statistic(*a_cols)), np.float64(statistic(*b_cols)))
        draws = combine(np.asarray(statistic(*(c[index_a] for c in a_cols)), np.float64),
                        np.asarray(statistic(*(c[index_b] for c in b_cols)), np.float64))
    draws = np.where(np.isfinite(draws), draws, np.nan)
    if not np.isfinite(value):
        raise ValueError(f"the statistic of a and b gives no finite {combine.__name__}, got "
                         f"{value!r}")
    return _interval(value, draws, min(n_a, n_b), level)


def bootstrap_difference(statistic: Statistic, a: Columns, b: Columns, *, paired: bool = True,
                         resamples: int = RESAMPLES, level: float = LEVEL,
                         seed: int = 0) -> Interval:
    """The interval of ``statistic(*a) - statistic(*b)``. Paired: ``a`` and ``b`` hold values of
    the same units in the same order, resampled together; unpaired: each resampled on its own."""
    return _two(statistic, a, b, paired, resamples, level, seed, np.subtract)


def bootstrap_ratio(statistic: Statistic, a: Columns, b: Columns, *, paired: bool = False,
                    resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Interval:
    """The interval of ``statistic(*a) / statistic(*b)`` (e.g. a speed-up: ``median`` of A's
    seconds over ``median`` of B's). Unpaired by default; ``paired=True`` for the same units."""
    return _two(statistic, a, b, paired, resamples, level, seed, np.divide)


def units_needed(interval: Interval, threshold: float = 0.0) -> int | None:
    """About how many units an interval like this one would need to exclude ``threshold``.

    The interval's half on the threshold's side (estimate to bound) shrinks as 1 / sqrt(n); it
    must shrink below the distance from the estimate to the threshold. Returns ``interval.units``
    or more; None when the estimate sits exactly on the threshold (no sample size would do)."""
    if not isinstance(interval, Interval):
        raise ValueError(f"interval must be an Interval, got {type(interval).__name__}")
    distance = abs(interval.value - threshold)
    if distance == 0:
        return None
    half = interval.value - interval.low if interval.value > threshold else (
        interval.high - interval.value)
    # Rounded first so that float noise (0.95 - 0.85 = 0.0999...) does not add a unit.
    return max(interval.units, math.ceil(round(interval.units * (half / distance) ** 2, 6)))
