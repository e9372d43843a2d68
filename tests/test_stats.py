"""The interval estimates of mdlib.experiments.stats against scipy and hand computations."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from mdlib.experiments import stats


def test_mean_interval_matches_scipy_one_sample_t():
    x = [0.61, 0.58, 0.66, 0.52, 0.7]
    mean, low, high = stats.mean_interval(x)
    ci = scipy_stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert mean == pytest.approx(np.mean(x), abs=1e-15)
    assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-12)
    ci90 = scipy_stats.ttest_1samp(x, 0.0).confidence_interval(0.9)
    assert stats.mean_interval(x, 0.9)[1:] == pytest.approx((ci90.low, ci90.high), abs=1e-12)
    assert all(math.isnan(v) for v in stats.mean_interval([0.5])[1:])
    assert all(math.isnan(v) for v in stats.mean_interval([0.5, 0.5, 0.5])[1:])  # no spread: no interval
    with pytest.raises(ValueError, match="finite"):
        stats.mean_interval([0.5, math.nan])
    with pytest.raises(ValueError, match="at least one"):
        stats.mean_interval([])


def test_paired_interval_matches_scipy_ttest_rel():
    a = [0.683, 0.701, 0.672, 0.690]
    b = [0.660, 0.690, 0.645, 0.671]  # seed by seed: a shared seed shifts both
    d, low, high = stats.paired_interval(a, b)
    result = scipy_stats.ttest_rel(a, b)
    ci = result.confidence_interval(0.95)
    assert d == pytest.approx(np.mean(np.subtract(a, b)), abs=1e-15)
    assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-12)
    # pairing matters: the same numbers as independent samples give a far wider interval here
    _, wl, wh = stats.difference_interval(a, b)
    assert wh - wl > 2 * (high - low)
    with pytest.raises(ValueError, match="equal length"):
        stats.paired_interval([1, 2, 3], [1, 2])


def test_difference_interval_matches_welch():
    a, b = [0.83, 0.84, 0.82, 0.85], [0.80, 0.81, 0.83]
    d, low, high = stats.difference_interval(a, b)
    ci = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert abs(d - (np.mean(a) - np.mean(b))) < 1e-12
    assert abs(low - ci.low) < 1e-9 and abs(high - ci.high) < 1e-9
    assert np.isnan(stats.difference_interval([0.8], [0.7, 0.75])[1])


def test_wilson_interval_by_hand():
    low, high = stats.wilson_interval(22, 40)
    z, p, n = 1.959964, 22 / 40, 40
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (low, high) == pytest.approx((centre - half, centre + half), rel=1e-6)
    assert stats.wilson_interval(0, 10)[0] == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError):
        stats.wilson_interval(5, 3)


def test_clustered_rate_takes_the_cluster_as_the_unit():
    wins, losses = [30, 20, 28, 10], [18, 26, 20, 0]  # the last cluster: 10 wins, no loss
    rate, low, high = stats.clustered_rate(wins, losses, 0.95)
    rates = np.array([30 / 48, 20 / 46, 28 / 48, 1.0])
    ci = scipy_stats.ttest_1samp(rates, 0.5).confidence_interval(0.95)
    assert rate == pytest.approx(rates.mean()) and (low, high) == pytest.approx((ci.low, min(ci.high, 1)), abs=1e-12)
    # the pooled Wilson interval over all comparisons is much narrower: it treats them as independent
    pooled = stats.wilson_interval(sum(wins), sum(wins) + sum(losses))
    assert pooled[1] - pooled[0] < (high - low) / 2
    assert stats.clustered_rate([3, 0], [1, 0])[1:] == (pytest.approx(math.nan, nan_ok=True),) * 2  # one cluster
    assert stats.clustered_rate([9, 1], [1, 9]) == pytest.approx((0.5, 0.0, 1.0))  # cut to [0, 1]
    with pytest.raises(ValueError, match="non-tied"):
        stats.clustered_rate([0, 0], [0, 0])
    with pytest.raises(ValueError, match="counts"):
        stats.clustered_rate([1, -1], [0, 2])


def test_the_detectable_effect_is_the_one_a_paired_t_test_sees_with_80_percent_power():
    """Against scipy's noncentral t: a true mean equal to the detectable effect is rejected by the
    two-sided 5 % t test with probability close to 0.8 (the formula is the usual approximation)."""
    from scipy.stats import nct, t

    rng = np.random.default_rng(0)
    for n in (4, 8, 12, 30):
        x = rng.normal(size=n)
        effect = stats.detectable_effect(x)
        s = x.std(ddof=1)
        assert effect == pytest.approx((t.ppf(0.975, n - 1) + t.ppf(0.8, n - 1)) * s / np.sqrt(n))
        shift = effect / (s / np.sqrt(n))  # the noncentrality of the test statistic at that true mean
        critical = t.ppf(0.975, n - 1)
        power = nct.sf(critical, n - 1, shift) + nct.cdf(-critical, n - 1, shift)
        assert 0.76 <= power <= 0.81, (n, power)
    assert np.isnan(stats.detectable_effect([1.0])) and np.isnan(stats.detectable_effect([2.0, 2.0]))
    assert stats.detectable_effect([0, 1, 2], power=0.5) < stats.detectable_effect([0, 1, 2])


def test_seeds_for_half_width_is_the_fewest_that_fit():
    from scipy.stats import t

    for sd, width in ((1.0, 0.9), (1.3, 0.9), (2.0, 0.5)):
        n = stats.seeds_for_half_width(sd, width)
        assert t.ppf(0.975, n - 1) * sd / np.sqrt(n) <= width < t.ppf(0.975, n - 2) * sd / np.sqrt(n - 1)
    assert stats.seeds_for_half_width(0.0, 0.1) == 2
    with pytest.raises(ValueError, match="half_width > 0"):
        stats.seeds_for_half_width(1.0, 0.0)


def crossed_table(rng, S, N, sd_seed, sd_example, sd_noise, mu=0.0):
    return (mu + sd_seed * rng.standard_normal((S, 1)) + sd_example * rng.standard_normal((1, N))
            + sd_noise * rng.standard_normal((S, N)))


def test_crossed_interval_by_hand_and_its_limits():
    x = np.array([[1.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 3.0], [2.0, 1.0, 2.0, 1.0]])
    mean, low, high, se, seeds_se = stats.crossed_interval(x)
    units, examples = x.mean(axis=1), x.mean(axis=0)
    residual = x - units[:, None] - examples[None, :] + x.mean()
    ms = (residual ** 2).sum() / (2 * 3)
    var = units.var(ddof=1) / 3 + max(0.0, examples.var(ddof=1) / 4 - ms / 12)
    assert mean == pytest.approx(x.mean()) and se == pytest.approx(math.sqrt(var))
    assert seeds_se == pytest.approx(units.std(ddof=1) / math.sqrt(3))
    assert (high - low) / 2 == pytest.approx(scipy_stats.t.ppf(0.975, 2) * se)
    # one example column: the seeds' t interval
    column = x[:, :1]
    assert stats.crossed_interval(column)[1:3] == pytest.approx(stats.mean_interval(column[:, 0])[1:])
    # never narrower than the seeds-only interval
    rng = np.random.default_rng(1)
    for _ in range(20):
        table = crossed_table(rng, 5, 30, 1.0, 0.0, 3.0)
        _, low, high, se, seeds_se = stats.crossed_interval(table)
        assert se >= seeds_se and high - low >= stats.mean_interval(table.mean(axis=1))[2] - stats.mean_interval(
            table.mean(axis=1))[1] - 1e-12
    assert all(math.isnan(v) for v in stats.crossed_interval(np.ones((3, 4)))[1:])
    assert all(math.isnan(v) for v in stats.crossed_interval(np.ones((1, 4)))[1:])
    with pytest.raises(ValueError, match="2-d table"):
        stats.crossed_interval(np.ones(4))


def test_crossed_interval_estimates_the_random_effects_variance_and_covers():
    """Reference: the crossed random-effects model with known parts, whose mean has variance
    var(a)/S + var(b)/N + var(r)/(S N). Over simulated tables the estimated variance averages to it
    (within the Monte Carlo error, the truncation at 0 aside), the interval covers mu about 95 % of the
    time, while the seeds-only interval, blind to the examples, covers far less when they vary."""
    rng = np.random.default_rng(0)
    S, N, sd = 8, 200, (0.3, 2.5, 2.0)
    true = sd[0] ** 2 / S + sd[1] ** 2 / N + sd[2] ** 2 / (S * N)
    variances, covered, seeds_covered = [], 0, 0
    for _ in range(2000):
        table = crossed_table(rng, S, N, *sd, mu=1.0)
        _, low, high, se, _ = stats.crossed_interval(table)
        _, s_low, s_high = stats.mean_interval(table.mean(axis=1))
        variances.append(se ** 2)
        covered += low <= 1.0 <= high
        seeds_covered += s_low <= 1.0 <= s_high
    assert np.mean(variances) == pytest.approx(true, rel=0.06)
    assert 0.93 <= covered / 2000 <= 0.985
    assert seeds_covered / 2000 < 0.85


def test_detectable_from_se_is_detectable_effect_of_the_values():
    x = np.array([0.3, -0.1, 0.5, 0.2, 0.4])
    se = x.std(ddof=1) / math.sqrt(x.size)
    assert stats.detectable_from_se(se, x.size) == pytest.approx(stats.detectable_effect(x))
    assert math.isnan(stats.detectable_from_se(math.nan, 5)) and math.isnan(stats.detectable_from_se(0.1, 1))


def test_the_paired_error_counts_the_seeds_where_there_are_several_and_the_examples_alone_with_one():
    rng = np.random.default_rng(3)
    table = rng.normal(0.01, 0.3, (3, 400))
    assert stats.paired_se(table) == stats.crossed_interval(table)[3]
    one = table[:1]
    assert stats.paired_se(one) == pytest.approx(one.std(ddof=1) / np.sqrt(400))
    assert np.isnan(stats.crossed_interval(one)[3])  # what the grids' tie rule would read without paired_se
    assert np.isnan(stats.paired_se(np.zeros((1, 10)))) and np.isnan(stats.paired_se(np.ones((1, 1))))
    with pytest.raises(ValueError, match="seeds x examples"):
        stats.paired_se(np.ones(5))
