"""The claims' estimates (``mdlib.experiments.estimates``) against independent references: scipy's
paired t test, the per-seed rates by hand, and the gates' counts on crafted runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from mdlib.experiments import estimates, stats
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


def test_weighting_gap_pairs_each_l11_model_with_its_own_null():
    """ℓ1.1's ΔW density minus its own init-weighting null's, model by model (scipy's paired t); GD's rows and
    a model without a null value are left out."""
    frame = pd.DataFrame({"method": [1.1, 1.1, 1.1, 1.1, 2.0], "seed": [0, 1, 2, 3, 0],
                          "effective_density": [0.30, 0.25, 0.41, 0.33, 0.9],
                          "weighting_null_density": [0.35, 0.31, 0.40, float("nan"), 0.1]})
    gap = estimates.weighting_gap(frame)
    ci = scipy_stats.ttest_rel([0.30, 0.25, 0.41], [0.35, 0.31, 0.40]).confidence_interval(0.95)
    assert gap.n == 3 and gap.value == pytest.approx(np.mean([-0.05, -0.06, 0.01]))
    assert (gap.low, gap.high) == pytest.approx((ci.low, ci.high))
    assert estimates.weighting_gap(frame, method="2").n == 1


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
def test_number_text_is_the_books_one_formatter(x, args, kwargs, text):
    assert estimates.number_text(x, *args, **kwargs) == text


def predictions_of(accuracies: dict[str, list[float]], n: int = 1000, layers: int = 3) -> pd.DataFrame:
    """Per method and seed, ``round(a n)`` correct test examples out of ``n`` (the first ones, shifted by the
    seed so that seeds disagree on some examples)."""
    rows = []
    for key, values in accuracies.items():
        for seed, a in enumerate(values):
            correct = np.roll(np.arange(n) < round(a * n), 7 * seed)
            rows.append(pd.DataFrame({"layers": layers, "method": key, "seed": seed, "example": np.arange(n),
                                      "correct": correct.astype(int)}))
    return pd.concat(rows, ignore_index=True)


def test_crossed_gap_is_the_seeds_gap_with_a_wider_interval():
    first, second = [0.70, 0.72, 0.69, 0.71], [0.66, 0.69, 0.67, 0.66]
    preds = predictions_of({"1.1": first, "2": second})
    runs = pd.DataFrame([{"layers": 3, "method": k, "seed": s, "chosen": True, "last_test": a}
                         for k, values in (("1.1", first), ("2", second)) for s, a in enumerate(values)])
    seeds_only = estimates.accuracy_gaps(runs)[3]
    both = estimates.accuracy_gaps(runs, predictions=preds)[3]
    assert both.value == pytest.approx(seeds_only.value) and both.n == 4 and both.crossed and not seeds_only.crossed
    assert (both.seeds_low, both.seeds_high) == pytest.approx((seeds_only.low, seeds_only.high))
    assert both.low < seeds_only.low and both.high > seeds_only.high  # the examples add their variance
    assert both.detectable > seeds_only.detectable
    assert "over seeds and examples (seeds only [" in both.both_text() and both.both_text() != seeds_only.both_text()
    assert estimates.accuracy_gaps(runs, "best_test" if "best_test" in runs else "last_test")[3].n == 4
    with pytest.raises(ValueError, match="do not cover the same examples"):
        estimates.crossed(preds[~((preds.method == "2") & (preds.seed == 0) & (preds.example == 3))], "1.1", "2")


def test_allocation_effects_are_the_simple_effects_and_the_interaction_seed_by_seed():
    accuracies = {"1.1": [0.72, 0.73], "2": [0.76, 0.77], "1.1@2": [0.70, 0.72], "2@1.1": [0.76, 0.76]}
    runs = pd.DataFrame([{"method": k, "seed": s, "last_test": a} for k, v in accuracies.items()
                         for s, a in enumerate(v)])
    effects = estimates.allocation_effects(runs)
    assert list(effects) == ["gap", "geometry", "allocation", "geometry at ℓ1.1's allocation",
                             "allocation at ℓ1.1's geometry", "interaction"]
    assert effects["gap"].value == pytest.approx(-4.0) and effects["geometry"].value == pytest.approx(-5.5)
    assert effects["allocation"].value == pytest.approx(-0.5)
    assert effects["geometry at ℓ1.1's allocation"].value == pytest.approx(-3.5)  # 1.1 - 2@1.1
    assert effects["allocation at ℓ1.1's geometry"].value == pytest.approx(1.5)  # 1.1 - 1.1@2
    # the interaction: the geometry's effect at l_1.1's allocation minus at GD's, seed by seed
    assert effects["interaction"].value == pytest.approx(-3.5 - (-5.5))
    crossed = estimates.allocation_effects(runs, predictions_of(accuracies))
    assert crossed["geometry"].value == pytest.approx(-5.5) and crossed["geometry"].crossed
    assert crossed["interaction"].value == pytest.approx(2.0) and crossed["interaction"].n == 2


def test_a_contrast_of_four_arms_is_the_crossed_interval_of_their_weighted_table():
    rng = np.random.default_rng(5)
    seeds, n = 4, 300
    tables = {k: (rng.random((seeds, n)) < p).astype(int) for k, p in (("1.1", 0.7), ("2", 0.75), ("1.1@2", 0.72),
                                                                      ("2@1.1", 0.74))}
    predictions = pd.DataFrame([{"method": k, "seed": s, "example": e, "correct": int(t[s, e])}
                                for k, t in tables.items() for s in range(seeds) for e in range(n)])
    weights = estimates.CONTRASTS["interaction"]
    e = estimates.contrast(predictions, weights)
    table = 100.0 * sum(w * tables[k] for k, w in weights.items())
    mean, low, high, _, _ = stats.crossed_interval(table)
    assert (e.value, e.low, e.high, e.n) == pytest.approx((mean, low, high, seeds))
    with pytest.raises(ValueError, match="do not cover the same examples"):
        estimates.contrast(predictions[~((predictions.method == "2") & (predictions.example == 0))], weights)


def test_crossed_win_rate_keeps_the_per_seed_rates_and_widens_with_the_sentences():
    rng = np.random.default_rng(3)
    rows = [{"seed": s, "sentence": i, "wins": int(w), "losses": int(not w and i % 9), "ties": int(not w and not i % 9)}
            for s in range(5) for i, w in enumerate(rng.random(40) < [0.55, 0.6, 0.5, 0.65, 0.58][s])]
    table = pd.DataFrame(rows)
    per_seed = table.groupby("seed")[["wins", "losses", "ties"]].sum().reset_index()
    seeds_only, both = estimates.win_rate(per_seed), estimates.win_rate(table)
    assert both.value == pytest.approx(seeds_only.value) and both.n == seeds_only.n == 5
    assert (both.seeds_low, both.seeds_high) == pytest.approx((seeds_only.low, seeds_only.high))
    assert both.high - both.low >= seeds_only.high - seeds_only.low - 1e-12
    # the linearization: each seed's rate is its row mean
    assert both.value == pytest.approx(np.mean([w / (w + l) for w, l in zip(per_seed.wins, per_seed.losses)]))


def test_step_edges_say_where_each_choice_sits():
    runs = pd.DataFrame([{"layers": 3, "method": m, "multiple": x, "chosen": x == c}
                         for m, xs, c in (("1.1", [1], 1), ("2", [1, 3], 1), ("3", [100, 300, 1000], 300),
                                          ("adam", [0.3, 1], 1))
                         for x in xs])
    assert {k: v[0] for k, v in estimates.step_edges(runs).items()} == {
        (3, "1.1"): "the only", (3, "2"): "the smallest", (3, "3"): "", (3, "adam"): "the largest"}
    assert estimates.step_edges(runs)[3, "3"] == ("", 300, [100, 300, 1000])
    text = estimates.edges_text(runs)
    assert "ℓ1.1 at 3 layers: 1× is the only candidate" in text and "ℓ2 (GD) at 3 layers: 1× is the smallest of 1×, 3×" in text
    assert "ℓ3" not in text and "Adam at 3 layers: 1× is the largest of 0.3×, 1×" in text
    assert estimates.edges_text(runs[runs.method == "3"]) == ""


def test_scale_trend_is_the_least_squares_slope_per_decade_over_the_stds_at_the_stop_rule():
    points = pd.DataFrame({"embedding_std": [0.02, 0.05, 0.1, 0.2, 1.0], "value": [-3.0, -1.0, 0.5, 1.5, 9.0],
                           "embedding_ratio": [0.5, 1.1, 2.0, 3.8, 17.0], "reached": [True] * 4 + [False]})
    trend = estimates.scale_trend(points)
    fit = scipy_stats.linregress(np.log10(points.embedding_std[:4]), points.value[:4])
    half = scipy_stats.t.ppf(0.975, 2) * fit.stderr  # the stds are the units: 4 - 2 degrees of freedom
    assert trend.n == 4 and trend.value == pytest.approx(fit.slope)
    assert (trend.low, trend.high) == pytest.approx((fit.slope - half, fit.slope + half))
    # the smallest slope it detects: (t_0.975 + t_0.80) times its standard error, on the same 2 degrees of freedom
    assert trend.detectable == pytest.approx((scipy_stats.t.ppf(0.975, 2) + scipy_stats.t.ppf(0.8, 2)) * fit.stderr)
    assert trend.sd / math.sqrt(trend.n) == pytest.approx(fit.stderr)
    against = estimates.scale_trend(points, x="embedding_ratio")
    assert against.value == pytest.approx(scipy_stats.linregress(np.log10(points.embedding_ratio[:4]),
                                                                 points.value[:4]).slope)
    assert math.isnan(estimates.scale_trend(points.iloc[:2]).value) and estimates.scale_trend(points.iloc[:2]).n == 2


def test_tied_contrasts_cover_every_tied_pair_with_enough_seeds():
    runs = pd.DataFrame([{"method": k, "multiple": m, "seed": s, "chosen": c, "tied": t}
                         for k, m, c, t in (("1.1", 1.0, True, True), ("1.1", 3.0, False, True), ("1.1", 0.3, False, False),
                                            ("2", 1.0, True, True), ("2", 3.0, False, True)) for s in range(3)])
    rng = np.random.default_rng(1)
    predictions = pd.DataFrame([{"method": k, "multiple": m, "seed": s, "example": e, "correct": int(rng.random() < 0.7)}
                                for k, m, seeds in (("1.1", 1.0, 3), ("1.1", 3.0, 3), ("2", 1.0, 3), ("2", 3.0, 1))
                                for s in range(seeds) for e in range(50)])
    tied = estimates.tied_contrasts(runs, predictions, estimates.CONTRASTS["gap"])
    # GD at 3x has one seed: its pairs are left out; 0.3x is not tied
    assert sorted(zip(tied["multiple_1.1"], tied["multiple_2"])) == [(1.0, 1.0), (3.0, 1.0)]
    assert tied.chosen.tolist() == [True, False] and (tied.n == 3).all()
    at = predictions[((predictions.method == "1.1") & (predictions.multiple == 3.0)) | (
        (predictions.method == "2") & (predictions.multiple == 1.0))]
    assert tied.value.iloc[1] == pytest.approx(estimates.crossed(at, "1.1", "2").value)


def test_power_text_sizes_seeds_on_the_largest_spread_and_names_the_examples_floor():
    sd = 1.0
    gap = Estimate(-2.0, -3.5, -0.5, 8, 2.0, sd, -2.9, -1.1)
    text = estimates.power_text(gap, 0.9)
    needed = next(n for n in range(2, 100)
                  if scipy_stats.t.ppf(0.975, n - 1) * estimates.PAIRED_SD_SEEN / math.sqrt(n) <= 0.9)
    assert f"needs {needed} pairs at a paired sd of {estimates.PAIRED_SD_SEEN:.2f}" in text
    assert "±1.50 points over seeds and sentences (±0.90 over seeds only) with 8 pairs" in text
    t = scipy_stats.t.ppf(0.975, 7)
    floor = 1.96 * math.sqrt((1.5 / t) ** 2 - (0.9 / t) ** 2)
    assert f"the test sentences alone leave ±{floor:.2f}" in text
    assert estimates.power_text(estimates.NONE, 0.9).startswith("no interval")


def test_a_multiple_is_written_as_the_book_writes_it():
    """Thirds and ninths as fractions, also as a table's six digits ("0.333333") give them back."""
    assert [estimates.multiple_text(m) for m in (1 / 3, 0.333333, 1 / 9, 0.111111, 1.0, 3.0, 0.5, 27.0)] == [
        "1/3×", "1/3×", "1/9×", "1/9×", "1×", "3×", "1/2×", "27×"]
    assert estimates.multiple_text(1 / 3, "") == "1/3"
