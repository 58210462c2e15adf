"""Bootstrap intervals: the mean's interval covers the true mean at about the nominal rate, the
paired interval finds a constant shift and not pure noise, ratios of medians, the number of units a
too-wide interval would need, and bad input refused by name."""

import math

import numpy as np
import pytest

from decodelab.measure import stats


def test_mean_interval_covers_the_true_mean_at_about_the_nominal_rate():
    # 200 normal samples of 40 units (true mean 3); a 95% interval should miss about 10 of them
    # (189 of 200 cover it with these seeds). Percentile intervals run a little narrow at n = 40,
    # and the count's binomial sd is about 3: the bound is loose, [88%, 99%].
    rng = np.random.default_rng(1234)
    covered = 0
    for trial in range(200):
        sample = rng.normal(3.0, 2.0, size=40)
        interval = stats.bootstrap(stats.mean, sample, resamples=1000, seed=trial)
        covered += interval.low <= 3.0 <= interval.high
    assert 176 <= covered <= 198


def test_mean_interval_matches_the_normal_theory_width():
    # Half-width of a 95% interval of a mean: 1.96 s / sqrt(n) (s = 2, n = 400: 0.196).
    sample = np.random.default_rng(0).normal(0.0, 2.0, size=400)
    interval = stats.bootstrap(stats.mean, sample)
    assert interval.value == pytest.approx(sample.mean(), abs=1e-12)
    assert (interval.high - interval.low) / 2 == pytest.approx(1.96 * sample.std() / 20, rel=0.1)
    assert interval.units == 400 and interval.level == 0.95


def test_bootstrap_is_reproducible_with_its_fixed_seed():
    sample = np.arange(30.0) ** 1.5
    assert stats.bootstrap(stats.median, sample) == stats.bootstrap(stats.median, sample)
    assert stats.bootstrap(stats.median, sample) != stats.bootstrap(stats.median, sample, seed=1)


def test_interval_of_constant_units_is_a_point():
    interval = stats.bootstrap(stats.mean, np.full(10, 2.5))
    assert (interval.value, interval.low, interval.high) == (2.5, 2.5, 2.5)


def test_ratio_of_sums_and_perplexity_pool_units_of_different_sizes():
    counts, sizes = np.array([1.0, 3.0, 0.0]), np.array([2.0, 6.0, 2.0])
    assert stats.ratio_of_sums(counts, sizes) == pytest.approx(0.4)
    nll, tokens = np.array([2.0, 4.0]), np.array([1.0, 2.0])
    assert stats.perplexity(nll, tokens) == pytest.approx(math.exp(2.0))
    assert math.isnan(stats.ratio_of_sums(np.array([1.0]), np.array([0.0])))


def test_paired_difference_detects_a_constant_shift():
    # b = a + 0.05 on every unit: the unit-to-unit noise (sd 1) cancels in the paired difference.
    a = np.random.default_rng(0).normal(size=50)
    shift = stats.bootstrap_difference(stats.mean, a + 0.05, a)
    assert shift.value == pytest.approx(0.05, abs=1e-12)
    assert shift.low > 0
    assert shift.excludes(0.0)
    # Unpaired, the same shift is lost in the noise.
    assert not stats.bootstrap_difference(stats.mean, a + 0.05, a, paired=False).excludes(0.0)


def test_paired_difference_does_not_detect_pure_noise():
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=60), rng.normal(size=60)
    difference = stats.bootstrap_difference(stats.mean, a, b)
    assert difference.low < 0 < difference.high


def test_paired_difference_takes_several_columns_per_side():
    # Rates pooled over units: 6/20 against 2/20 on the same units.
    hits_a, hits_b, sizes = np.array([2., 1., 3.]), np.array([1., 0., 1.]), np.array([5., 5., 10.])
    difference = stats.bootstrap_difference(stats.ratio_of_sums, (hits_a, sizes), (hits_b, sizes))
    assert difference.value == pytest.approx(0.2)
    assert difference.low <= 0.2 <= difference.high


def test_ratio_of_medians_is_a_speed_up():
    # A takes 2 s, B 1 s, each with a little independent jitter: a speed-up of about 2.
    rng = np.random.default_rng(3)
    slow, fast = 2.0 + rng.uniform(0, 0.02, 9), 1.0 + rng.uniform(0, 0.01, 9)
    speed_up = stats.bootstrap_ratio(stats.median, slow, fast)
    assert speed_up.value == pytest.approx(np.median(slow) / np.median(fast), abs=1e-12)
    assert 1.97 < speed_up.low <= speed_up.value <= speed_up.high < 2.03


def test_units_needed_scales_with_the_square_of_the_width():
    # The half-width below the estimate is 0.2 at 100 units; the estimate is 0.1 from zero:
    # the half-width must halve, so 4x the units.
    interval = stats.Interval(0.1, -0.1, 0.4, units=100)
    assert stats.units_needed(interval) == 400
    assert stats.units_needed(interval, threshold=0.1) is None
    assert stats.units_needed(stats.Interval(1.0, 0.5, 1.5, units=10), threshold=0.0) == 10


def test_interval_formats_as_value_and_bounds():
    assert f"{stats.Interval(57.71, 56.14, 59.25, units=64):.1f}" == "57.7 [56.1, 59.2]"


@pytest.mark.parametrize("call, message", [
    (lambda: stats.bootstrap(stats.mean, [1.0]), "at least 2 units"),
    (lambda: stats.bootstrap(stats.mean, [[1.0, 2.0]]), "1-D"),
    (lambda: stats.bootstrap(stats.mean, [1.0, math.nan]), "finite"),
    (lambda: stats.bootstrap(stats.mean, ["a", "b"]), "numeric"),
    (lambda: stats.bootstrap(stats.mean, [1.0, 2.0], resamples=100), "resamples must be"),
    (lambda: stats.bootstrap(stats.mean, [1.0, 2.0], level=95), "level must be"),
    (lambda: stats.bootstrap(stats.ratio_of_sums, ([1.0, 2.0], [1.0])), "one value per unit"),
    (lambda: stats.bootstrap(stats.ratio_of_sums, ([1.0, 2.0], [0.0, 0.0])), "must be finite"),
    (lambda: stats.bootstrap_difference(stats.mean, [1.0, 2.0], [1.0, 2.0, 3.0]),
     "same units"),
    (lambda: stats.bootstrap_ratio(stats.mean, [1.0, 2.0], [0.0, 0.0]), "finite"),
    (lambda: stats.Interval(1.0, 2.0, 0.0, units=3), "low must be <= high"),
    (lambda: stats.units_needed((0.1, 0.0, 0.2)), "interval must be an Interval"),
])
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
