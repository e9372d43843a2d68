"""Interval estimates for the comparisons of the book, in numpy and scipy (no torch).

The design decides the interval:

- ``paired_interval``: runs that share seed-level randomness (one seed gives every method the same
  initialization, data order and dropout stream) are compared seed by seed: the t interval of the
  mean per-seed difference.
- ``difference_interval``: independent samples (Welch's t interval, unequal variances).
- ``mean_interval``: the t interval of a mean over independent units, e.g. per-seed win rates when
  the sentences are shared by every seed (clustered data: the seed is the unit, not the sentence).
- ``wilson_interval``: a binomial proportion of independent trials.
- ``crossed_interval``: a mean over seeds and test examples together (crossed: every seed is scored on
  every example), counting both samples.
- ``paired_se``: the standard error of a mean paired difference over seeds and examples (``crossed_interval``'s),
  or over the examples alone where there is one seed: what the step-size grids' tie rule reads.

Every function returns NaN bounds where the data cannot give an interval (fewer than two units, or
no spread at all), never a degenerate one.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["GENERALIZATION", "POWER", "clustered_rate", "crossed_interval", "detectable_effect", "detectable_from_se",
           "difference_interval", "generalization_floor", "mean_interval", "paired_interval", "paired_se", "seeds_for_half_width",
           "wilson_interval"]


@functools.lru_cache(maxsize=1024)
def _t_ppf(q: float, dof: float) -> float:
    """Student's t quantile (cached: scipy's ppf takes milliseconds, and a scorecard rebuilds its verdicts
    on hundreds of resamples of the same few sizes)."""
    from scipy.stats import t

    return float(t.ppf(q, dof))


def _t_quantile(confidence: float, dof: float) -> float:
    return _t_ppf(0.5 + confidence / 2, dof)


def mean_interval(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float, float]:
    """The mean of ``values`` with its one-sample t interval: (mean, low, high). NaN bounds with fewer
    than two values or no spread."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_interval needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"mean_interval needs finite values, got {x.tolist()}")
    mean = float(x.mean())
    if x.size < 2 or x.std() == 0:
        return mean, math.nan, math.nan
    half = _t_quantile(confidence, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


#: The power at which ``detectable_effect`` states the smallest effect a design can detect.
POWER = 0.8


def detectable_effect(values: ArrayLike, confidence: float = 0.95, power: float = POWER) -> float:
    """The smallest true mean a one-sample t test of ``values`` (per-unit differences, or per-seed rates
    minus their null) detects with probability ``power`` at the two-sided level 1 - ``confidence``, at
    the observed spread: (t_{(1+c)/2, n-1} + t_{power, n-1}) s / sqrt(n), s the standard deviation
    (ddof 1). The usual normal-approximation formula with t quantiles; NaN with fewer than two values
    or no spread."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or not np.all(np.isfinite(x)) or x.std() == 0:
        return math.nan
    return detectable_from_se(float(x.std(ddof=1)) / math.sqrt(x.size), x.size, confidence, power)


def seeds_for_half_width(sd: float, half_width: float, confidence: float = 0.95, most: int = 10_000) -> int:
    """The fewest units n >= 2 whose t interval of a mean has half-width t_{(1+c)/2, n-1} sd / sqrt(n) at
    most ``half_width``, at the spread ``sd`` (``most`` when even that many do not suffice)."""
    if not (sd >= 0 and half_width > 0):
        raise ValueError(f"need sd >= 0 and half_width > 0, got {sd} and {half_width}")
    for n in range(2, most + 1):
        if _t_quantile(confidence, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    return most


def paired_interval(first: ArrayLike, second: ArrayLike, confidence: float = 0.95) -> tuple[float, float, float]:
    """mean(first - second) over pairs (``first[i]`` and ``second[i]`` share seed i) with the paired t
    interval: (difference, low, high). The two sides must have equal lengths."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_interval needs two 1-d sequences of equal length (one value per seed), got "
                         f"shapes {a.shape} and {b.shape}")
    return mean_interval(a - b, confidence)


def crossed_interval(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float, float, float, float]:
    """The mean of a (units x examples) table, e.g. per-seed and per-sentence differences, with an interval
    over both samples: the seeds and the test examples, each a sample of what the claim is about.
    Returns (mean, low, high, se, seeds_se).

    Crossed random effects v_se = mu + a_s + b_e + r_se (S units, N examples): the variance of the mean is
    var(a)/S + var(b)/N + var(r)/(S N). The units' part and the noise come from the unit means,
    s_u^2 / S (the seeds-only variance, ``mean_interval``'s, whose square root is ``seeds_se``); the
    examples' part is estimated without the noise, s_e^2/N - MS_r/(S N) (s_e^2: the variance of the N
    example means over units, MS_r: the residual mean square of the two-way table), and counted only
    when positive, so the interval is never narrower than the seeds-only one. The interval is
    mean +- t_{(1+c)/2, S-1} se (the units' degrees of freedom: the conservative choice). NaN bounds
    with fewer than two units or no spread; one example column gives the seeds-only interval."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 2 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"crossed_interval needs a finite 2-d table (units x examples), got shape {x.shape}")
    S, N = x.shape
    mean = float(x.mean())
    units, examples = x.mean(axis=1), x.mean(axis=0)
    if S < 2 or units.std() == 0 and examples.std() == 0:
        return mean, math.nan, math.nan, math.nan, math.nan
    seeds_var = float(units.var(ddof=1)) / S
    example_var = 0.0
    if N > 1:
        residual = x - units[:, None] - examples[None, :] + mean
        ms_residual = float((residual ** 2).sum()) / ((S - 1) * (N - 1))
        example_var = max(0.0, float(examples.var(ddof=1)) / N - ms_residual / (S * N))
    se = math.sqrt(seeds_var + example_var)
    if se == 0:
        return mean, math.nan, math.nan, math.nan, math.nan
    half = _t_quantile(confidence, S - 1) * se
    return mean, mean - half, mean + half, se, math.sqrt(seeds_var)


def slope_fit(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares slope of ``y`` on ``x`` and its standard error (residual variance on n - 2 degrees
    of freedom), for each row of ``y`` (..., n) at once: (slope, standard error), as
    ``scipy.stats.linregress`` gives them for one row."""
    x = np.asarray(x, float) - np.mean(x)
    y = np.asarray(y, float)
    slope = y @ x / (x @ x)
    residual = y - y.mean(axis=-1, keepdims=True) - slope[..., None] * x
    return slope, np.sqrt((residual ** 2).sum(axis=-1) / (x.size - 2) / (x @ x))


def detectable_from_se(se: float, units: int, confidence: float = 0.95, power: float = POWER,
                       dof: int | None = None) -> float:
    """``detectable_effect`` from a standard error and the units' count: (t_{(1+c)/2, d} + t_{power, d}) se,
    d = ``dof`` (None: n - 1; a slope over n points: n - 2). NaN without a standard error or degrees of
    freedom."""
    d = units - 1 if dof is None else dof
    if not (se == se and se > 0) or units < 2 or d < 1:
        return math.nan
    return (_t_quantile(confidence, d) + _t_ppf(power, d)) * se


def difference_interval(first: ArrayLike, second: ArrayLike, confidence: float = 0.95) -> tuple[float, float, float]:
    """mean(first) - mean(second) of independent samples with Welch's t interval (unequal variances):
    (difference, low, high). NaN bounds with fewer than two values on a side, or no spread at all."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("difference_interval needs at least one value on each side")
    difference = float(a.mean() - b.mean())
    if min(a.size, b.size) < 2:
        return difference, math.nan, math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return difference, math.nan, math.nan
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = _t_quantile(confidence, dof) * math.sqrt(va + vb)
    return difference, difference - half, difference + half


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion of independent trials."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    from scipy.stats import norm

    z = norm.ppf(0.5 + confidence / 2)
    phat = successes / trials
    centre = (phat + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return centre - half, centre + half


def clustered_rate(wins: ArrayLike, losses: ArrayLike, confidence: float = 0.95) -> tuple[float, float, float]:
    """A win rate among non-tied comparisons when the comparisons cluster (``wins[s]`` and
    ``losses[s]``: the counts of cluster s, e.g. one seed's model pair over the shared sentences): each
    cluster's rate wins / (wins + losses), and the t interval of their mean over clusters (``mean_interval``),
    its bounds cut to [0, 1]. Clusters without a non-tied comparison are left out."""
    w, l = np.asarray(wins, dtype=float), np.asarray(losses, dtype=float)
    if w.shape != l.shape or w.ndim != 1 or np.any(w < 0) or np.any(l < 0):
        raise ValueError("clustered_rate needs two equal-length sequences of counts >= 0, one entry per cluster")
    kept = (w + l) > 0
    if not kept.any():
        raise ValueError("clustered_rate needs at least one cluster with a non-tied comparison")
    rate, low, high = mean_interval(w[kept] / (w[kept] + l[kept]), confidence)
    return rate, max(low, 0.0) if low == low else low, min(high, 1.0) if high == high else high


#: The share of the bag-of-words baseline's margin over chance (50 %) that the sentiment models must
#: recover, in mean test accuracy at the stop rule, for a claim about what they learned to be judged.
GENERALIZATION = 0.5


def generalization_floor(baseline: float) -> float:
    """The test accuracy a sentiment model needs for the gates: 50 % + GENERALIZATION x (baseline - 50 %)."""
    return 0.5 + GENERALIZATION * (baseline - 0.5)


def paired_se(differences: ArrayLike) -> float:
    """The standard error of the mean of a (seeds x examples) table of paired differences, e.g. two step
    sizes' per-example scores on the same validation examples at the same seeds: ``crossed_interval``'s
    ``se`` (seeds and examples both counted) with two or more seeds; with one seed the seeds' part cannot
    be estimated and is absent, and the error is the examples' alone, sd / sqrt(N) over the N paired
    differences (ddof 1). NaN with a single example, or where the differences have no spread at all."""
    x = np.asarray(differences, dtype=float)
    if x.ndim != 2 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"paired_se needs a finite 2-d table (seeds x examples), got shape {x.shape}")
    if x.shape[0] > 1:
        return crossed_interval(x)[3]
    if x.shape[1] < 2 or x.std() == 0:
        return math.nan
    return float(x[0].std(ddof=1)) / math.sqrt(x.shape[1])
