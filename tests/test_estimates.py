"""The claims' estimates (``mdlib.experiments.estimates``) against independent references: scipy's
paired t test, the per-seed rates by hand, and the gates' counts on crafted runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from mdlib.experiments import estimates
from mdlib.experiments.estimates import Estimate


def models(values: dict[str, list[float]], column: str) -> pd.DataFrame:
    """One row per (method, seed) with ``column``; seeds 0, 1, ... in each method's list order."""
    return pd.DataFrame([{"method": key, "seed": seed, column: value}
                         for key, row in values.items() for seed, value in enumerate(row)])


def test_paired_matches_scipy_and_pairs_only_shared_seeds():
    frame = models({"1.1": [0.30, 0.25, 0.41, 0.33, 0.9], "2": [0.35, 0.31, 0.40, 0.38]}, "effective_density")
    gap = estimates.density_gap(frame)  # seed 4 has no GD twin: left out
    ci = scipy_stats.ttest_rel([0.30, 0.25, 0.41, 0.33], [0.35, 0.31, 0.40, 0.38]).confidence_interval(0.95)
    assert gap.n == 4 and gap.value == pytest.approx(np.mean([-0.05, -0.06, 0.01, -0.05]))
    assert (gap.low, gap.high) == pytest.approx((ci.low, ci.high))
    assert gap.sd == pytest.approx(np.std([-0.05, -0.06, 0.01, -0.05], ddof=1))
    t = scipy_stats.t
    assert gap.detectable == pytest.approx((t.ppf(0.975, 3) + t.ppf(0.8, 3)) * gap.sd / 2)


def test_entropy_gap_is_gd_minus_l11_and_keys_read_as_numbers_match():
    frame = models({1.1: [0.50, 0.52, 0.49], 2.0: [0.55, 0.56, 0.50]}, "entropy")  # a CSV read 1.1 as a number
    gap = estimates.entropy_gap(frame)
    assert gap.n == 3 and gap.value == pytest.approx((0.05 + 0.04 + 0.01) / 3)


def test_accuracy_gaps_per_depth_in_points_over_chosen_runs():
    rows = [{"layers": L, "method": key, "seed": s, "chosen": True, "last_test": acc, "best_test": acc + 0.01}
            for L, shift in ((3, 0.0), (6, 0.02)) for key, base in (("1.1", 0.70), ("2", 0.68))
            for s, acc in enumerate(np.array([base, base + 0.01, base - 0.005]) + shift * (key == "1.1"))]
    rows.append({"layers": 3, "method": "1.1", "seed": 0, "chosen": False, "last_test": 0.10, "best_test": 0.1})
    gaps = estimates.accuracy_gaps(pd.DataFrame(rows))
    assert list(gaps) == [3, 6]
    assert gaps[3].value == pytest.approx(2.0) and gaps[6].value == pytest.approx(4.0) and gaps[3].n == 3
    assert math.isnan(gaps[3].low)  # the same difference for every seed: no spread, no interval
    assert estimates.depths_text(gaps) == "+2.00 (no interval) (3 pairs) at 3 layers; +4.00 (no interval) (3 pairs) at 6 layers"


def test_win_rate_is_the_mean_of_the_per_seed_rates_over_non_tied_seeds():
    per_seed = pd.DataFrame({"seed": [0, 1, 2, 3], "wins": [6, 3, 0, 5], "losses": [2, 3, 0, 5], "ties": [1, 0, 9, 2]})
    rate = estimates.win_rate(per_seed)  # seed 2 has no non-tied sentence
    rates = [6 / 8, 3 / 6, 5 / 10]
    ci = scipy_stats.t.interval(0.95, 2, loc=np.mean(rates), scale=scipy_stats.sem(rates))
    assert rate.n == 3 and rate.value == pytest.approx(np.mean(rates))
    assert (rate.low, rate.high) == pytest.approx((max(ci[0], 0), min(ci[1], 1)))
    assert estimates.win_rate(per_seed.iloc[2:3]).n == 0


def test_pruned_gap_reads_the_requested_sparsity_only():
    curves = pd.DataFrame([{"method": key, "seed": s, "sparsity": x, "test_accuracy": acc}
                           for key, base in (("1.1", 0.8), ("2", 0.7)) for s in range(3)
                           for x, acc in ((0.0, 0.9), (0.5, base + 0.01 * s * (key == "2")))])
    gap = estimates.pruned_gap(curves, 0.5)
    assert gap.n == 3 and gap.value == pytest.approx(100 * (0.8 - 0.71))


def test_parity_gaps_per_method_against_adam():
    final = pd.DataFrame([{"key": key, "seed": s, "points": p + s * (key == "adam")}
                          for key, p in (("adam", 80.0), ("1.1", 79.0), ("3", 81.5)) for s in range(3)])
    gaps = estimates.parity_gaps(final)
    assert list(gaps) == ["1.1", "3"]
    assert gaps["1.1"].value == pytest.approx(-2.0) and gaps["3"].value == pytest.approx(0.5)


def test_gates_count_unreached_and_name_cells_below_the_floor():
    runs = pd.DataFrame({"layers": [3] * 6, "method": ["1.1", "1.1", "2", "2", "3", "3"], "seed": [0, 1] * 3,
                         "reached": [True, False, True, True, False, False],
                         "last_test": [0.60, 0.62, 0.75, 0.77, 0.5, 0.5]})
    assert estimates.unreached(runs) == 1  # ℓ3 runs are not compared
    below = estimates.below_floor(runs, baseline=0.80)  # floor 0.5 + 0.5 × 0.3 = 0.65
    assert below == "ℓ1.1 61.0 % < 65.0 % (baseline 80.0 %)"
    assert estimates.below_floor(runs, baseline=0.70) == ""


@pytest.mark.parametrize("estimate, args, text", [
    (Estimate(0.81, -0.4, 2.02, 3), (), "+0.81 [−0.40, +2.02]"),
    (Estimate(-0.0123, math.nan, math.nan, 1), (3,), "−0.012 (no interval)"),
    (Estimate(0.523, 0.4, 0.61, 5), (1, 100, False, " %"), "52.3 % [40.0 %, 61.0 %]"),
    (Estimate(math.nan, math.nan, math.nan, 0), (), "n/a (no interval)"),
])
def test_estimate_text(estimate, args, text):
    assert estimate.text(*args) == text


@pytest.mark.parametrize("x, args, kwargs, text", [
    (0.512, (1, 100), {"sign": False, "suffix": "%"}, "51.2%"),
    (-0.5, (), {}, "−0.50"),
    (0.0, (3,), {}, "+0.000"),
    (math.nan, (1, 100), {"missing": "–"}, "–"),
])
def test_number_is_the_books_one_formatter(x, args, kwargs, text):
    assert estimates.number(x, *args, **kwargs) == text
