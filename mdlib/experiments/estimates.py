"""One estimate per comparative claim, computed once: the chapter glues it, the scorecard judges it.

Each function reads the table a claim is measured from (one row per model or per (model, sentence
set): ``method``, ``seed`` and the measure) and returns an :class:`Estimate`: the value, its 95 %
interval, the units (seeds) behind it and the smallest effect the design detects. Runs that share a
seed share the initialization, the data order and the dropout stream, so methods are compared seed
by seed (``stats.paired_interval``); the token-selection rate is clustered by seed (the sentences are
shared by every seed: ``stats.clustered_rate``).

- ``accuracy_gaps``: Table 1, ℓ1.1 minus GD in points of test accuracy, per depth;
- ``win_rate``: token selection, ℓ1.1's share of the non-tied sentences, the mean of the per-seed rates;
- ``entropy_gap``: attention concentration, GD minus ℓ1.1 in normalized entropy of the [CLS] row;
- ``density_gap``: sparsity, ℓ1.1 minus the baseline in the effective density of ΔW;
- ``weighting_gap``: sparsity against its init-weighting null, ℓ1.1's ΔW minus its own null's density;
- ``pruned_gap``: pruning, ℓ1.1 minus GD in points after magnitude pruning at one sparsity;
- ``parity_gaps``: ViT parity, each mirror-descent exponent minus Adam in points.

The gates of the sentiment claims read the same runs: ``unreached`` (runs that missed the stop rule)
and ``below_floor`` (cells whose mean accuracy is under the generalization floor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from mdlib.experiments import methods
from mdlib.experiments.stats import (clustered_rate, crossed_interval, detectable_effect, detectable_from_se, slope_fit,
                                     generalization_floor, mean_interval, paired_interval, seeds_for_half_width)

__all__ = ["COMPARED", "CONTRASTS", "Estimate", "accuracy_gaps", "allocation_effects", "below_floor", "contrast", "crossed",
           "density_gap", "depths_text", "edges_text", "entropy_gap", "key_of", "keyed", "number_text", "PAIRED_SD_SEEN", "paired",
           "parity_gaps", "power_text", "TARGET_HALF_WIDTH", "pruned_gap", "scale_trend", "step_edges", "tied_contrasts",
           "unreached", "WEIGHTING_NULL", "weighting_gap", "win_rate"]

#: The two methods every sentiment claim compares: ℓ1.1 mirror descent and GD (ℓ2).
COMPARED = (methods.L1_1, methods.GD)


def multiple_text(multiple: float, suffix: str = "×") -> str:
    """A step's multiple as the book writes it: "1/3×", "1×", "3×", "1/9×" (a reciprocal of an integer to
    five significant digits, as a table's "0.333333" is)."""
    if 0 < multiple < 1 and abs(1 / multiple - round(1 / multiple)) < 1e-4 * (1 / multiple):
        return f"1/{round(1 / multiple)}{suffix}"
    return f"{multiple:g}{suffix}"


def number_text(x: float, digits: int = 2, scale: float = 1.0, sign: bool = True, suffix: str = "",
                missing: str = "n/a") -> str:
    """``scale * x`` as the book prints an estimate: ``digits`` decimals, "+" before a positive number when
    ``sign``, a true minus sign (−), ``suffix`` after it; ``missing`` for NaN. ``number_text(0.512, 1,
    100, sign=False, suffix="%")`` is "51.2%"."""
    if x != x:
        return missing
    return (f"{scale * x:+.{digits}f}" if sign else f"{scale * x:.{digits}f}").replace("-", "−") + suffix


@dataclass(frozen=True)
class Estimate:
    """A claim's number: ``value`` (a mean per-seed difference, or a mean per-seed rate) with its 95 % t
    interval [``low``, ``high``] (NaN: fewer than two seeds or no spread), the ``n`` seeds behind it, the
    smallest effect the design detects with 80 % power (``stats.detectable_effect``, a distance from the
    null; NaN without an interval) and the standard deviation of the per-seed values. An estimate over
    seeds and test examples (``crossed``) has its interval over both, and the seeds-only interval in
    [``seeds_low``, ``seeds_high``] (NaN for a seeds-only estimate)."""
    value: float
    low: float
    high: float
    n: int
    detectable: float = math.nan
    sd: float = math.nan
    seeds_low: float = math.nan
    seeds_high: float = math.nan

    @property
    def crossed(self) -> bool:
        """Whether the interval counts the test examples as a sample too (``crossed``)."""
        return self.seeds_low == self.seeds_low

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, digits: int = 2, scale: float = 1.0, sign: bool = True, suffix: str = "") -> str:
        """"+0.81 [−0.40, +2.02]" (values times ``scale``, ``suffix`` after each, a true minus sign;
        "(no interval)" without one)."""
        def shown(x: float) -> str:
            return number_text(x, digits, scale, sign, suffix)

        if self.low != self.low:
            return f"{shown(self.value)} (no interval)"
        return f"{shown(self.value)} [{shown(self.low)}, {shown(self.high)}]"

    def both_text(self, digits: int = 2, scale: float = 1.0, sign: bool = True, suffix: str = "") -> str:
        """``text``, and for a crossed estimate the seeds-only interval after it: "+0.81 [−0.90, +2.52]
        over seeds and examples (seeds only [−0.40, +2.02])"."""
        if not self.crossed:
            return self.text(digits, scale, sign, suffix)
        def shown(x: float) -> str:
            return number_text(x, digits, scale, sign, suffix)

        return (f"{self.text(digits, scale, sign, suffix)} over seeds and examples (seeds only "
                f"[{shown(self.seeds_low)}, {shown(self.seeds_high)}])")


NONE = Estimate(math.nan, math.nan, math.nan, 0)


def key_of(value) -> str:
    """A method key as the results tables write it: "1.1", "2", "3", "adam" (a CSV may read 1.1 as a number)."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


def keyed(methods_column: pd.Series) -> pd.Series:
    """``key_of`` of every value of a column (computed once per distinct value: a table of predictions has
    thousands of rows and a few methods)."""
    return methods_column.map({value: key_of(value) for value in pd.unique(methods_column)})


def paired(frame: pd.DataFrame, first: str, second: str, value: str, by: str = "method",
           unit: str = "seed") -> Estimate:
    """``value`` of ``first`` minus that of ``second`` (rows told apart by ``by``), matched on ``unit``:
    the paired t interval over the units both have."""
    wide = frame.assign(**{by: frame[by].map(key_of)}).pivot_table(index=unit, columns=by, values=value)
    if first not in wide or second not in wide:
        return NONE
    wide = wide[[first, second]].dropna()
    if wide.empty:
        return NONE
    d, low, high = paired_interval(wide[first], wide[second])
    differences = wide[first] - wide[second]
    return Estimate(d, low, high, len(wide), detectable_effect(differences),
                    float(differences.std(ddof=1)) if len(wide) > 1 else math.nan)


def crossed(predictions: pd.DataFrame, first: str, second: str, value: str = "correct", by: str = "method",
            unit: str = "seed", example: str = "example", scale: float = 100.0) -> Estimate:
    """``value`` of ``first`` minus that of ``second`` per (unit, example), times ``scale`` (points), over the
    units both have (each with every example): the mean with the interval over units and examples
    (``stats.crossed_interval``), the seeds-only interval beside it and the detectable effect of the
    crossed standard error (``contrast`` with weights +1 and -1)."""
    return contrast(predictions, {first: 1.0, second: -1.0}, value, by, unit, example, scale)


def contrast(predictions: pd.DataFrame, weights: Mapping[str, float], value: str = "correct", by: str = "method",
             unit: str = "seed", example: str = "example", scale: float = 100.0) -> Estimate:
    """The weighted sum of the ``value`` of the methods (or arms) of ``weights`` per (unit, example), times
    ``scale``, over the units all of them have (each with every example), as ``crossed``: e.g. the 2 x 2's
    interaction {"1.1": 1, "2@1.1": -1, "1.1@2": -1, "2": 1}."""
    keys = keyed(predictions[by]).to_numpy()
    sides = {k: _matrix(predictions[keys == k], unit, example, value) for k in weights}
    units = sorted(set.intersection(*(set(side[0]) for side in sides.values())))
    if not units:
        return NONE
    examples = {tuple(side[1]) for side in sides.values()}
    rows = {k: np.stack([side[2][side[0].index(u)] for u in units]) for k, side in sides.items()}
    if len(examples) != 1 or any(np.isnan(r).any() for r in rows.values()):
        raise ValueError(f"contrast: the predictions of {', '.join(weights)} do not cover the same examples")
    table = scale * sum(w * rows[k] for k, w in weights.items())
    mean, low, high, se, _ = crossed_interval(table)
    means = table.mean(axis=1)
    _, seeds_low, seeds_high = mean_interval(means)
    return Estimate(mean, low, high, len(units), detectable_from_se(se, len(units)),
                    float(means.std(ddof=1)) if len(units) > 1 else math.nan, seeds_low, seeds_high)


def _matrix(frame: pd.DataFrame, unit: str, example: str, value: str) -> tuple[list, list, np.ndarray]:
    """(units, examples, a units x examples array of ``value``, NaN where a unit lacks an example)."""
    units, row = np.unique(frame[unit].to_numpy(), return_inverse=True)
    examples, column = np.unique(frame[example].to_numpy(), return_inverse=True)
    table = np.full((len(units), len(examples)), np.nan)
    table[row, column] = frame[value].to_numpy(float)
    return units.tolist(), examples.tolist(), table


def accuracy_gaps(runs: pd.DataFrame, metric: str = "last_test",
                  predictions: pd.DataFrame | None = None) -> dict[int, Estimate]:
    """Table 1: per depth (``layers``), ℓ1.1 minus GD in points of ``metric`` (the test accuracy at the stop
    rule, or ``best_test``, the best over epochs) over the chosen runs of one grid, seed by seed. With the
    runs' per-example ``predictions`` (``sentiment.predictions``; the stop rule's accuracy only), the
    interval counts the test sentences as a sample too (``crossed``)."""
    chosen = runs[runs.chosen.astype(bool)] if "chosen" in runs else runs
    if predictions is not None and metric == "last_test":
        return {int(L): crossed(predictions[predictions.layers == L], *COMPARED)
                for L in dict.fromkeys(chosen.layers)}
    return {int(L): paired(part.assign(points=100 * part[metric]), *COMPARED, "points")
            for L, part in chosen.groupby("layers", sort=False)}


#: The contrasts of chapter 04's 2 x 2 (``allocation.ARMS``), as weights on its four arms, seed by seed: the
#: gap at one global step each (ℓ1.1 − GD); the geometry's simple effects, at GD's allocation (ℓ1.1 at GD's
#: steps per tensor − GD) and at ℓ1.1's (ℓ1.1 − GD at ℓ1.1's steps per tensor); the allocation's, at GD's
#: geometry (GD at ℓ1.1's steps per tensor − GD) and at ℓ1.1's (ℓ1.1 − ℓ1.1 at GD's steps per tensor); and
#: the interaction, the geometry's effect at ℓ1.1's allocation minus at GD's.
_L11_AT_GD, _GD_AT_L11 = methods.arm_key(methods.L1_1, methods.GD), methods.arm_key(methods.GD, methods.L1_1)
CONTRASTS = {"gap": {methods.L1_1: 1.0, methods.GD: -1.0},
             "geometry": {_L11_AT_GD: 1.0, methods.GD: -1.0},
             "allocation": {_GD_AT_L11: 1.0, methods.GD: -1.0},
             "geometry at ℓ1.1's allocation": {methods.L1_1: 1.0, _GD_AT_L11: -1.0},
             "allocation at ℓ1.1's geometry": {methods.L1_1: 1.0, _L11_AT_GD: -1.0},
             "interaction": {methods.L1_1: 1.0, _GD_AT_L11: -1.0, _L11_AT_GD: -1.0, methods.GD: 1.0}}


def allocation_effects(runs: pd.DataFrame, predictions: pd.DataFrame | None = None) -> dict[str, Estimate]:
    """The contrasts of the 2 x 2 (``CONTRASTS``) in points of test accuracy at the stop rule, from its runs
    (``method``: a method or arm key, ``last_test``, ``seed``) or, when given, their per-example
    ``predictions`` (``contrast``: over seeds and test sentences)."""
    if predictions is not None:
        return {name: contrast(predictions, weights) for name, weights in CONTRASTS.items()}
    wide = runs.assign(method=runs.method.map(key_of), points=100 * runs.last_test).pivot_table(
        index="seed", columns="method", values="points")
    out = {}
    for name, weights in CONTRASTS.items():
        if not set(weights) <= set(wide):
            out[name] = NONE
            continue
        values = sum(w * wide[k] for k, w in weights.items()).dropna()
        d, low, high = mean_interval(values) if len(values) else (math.nan, math.nan, math.nan)
        out[name] = Estimate(d, low, high, len(values), detectable_effect(values) if len(values) > 1 else math.nan,
                             float(values.std(ddof=1)) if len(values) > 1 else math.nan)
    return out


#: The largest standard deviation of the paired ℓ1.1 − GD differences (points) a default build of chapter
#: 04's variation has measured: 1.70, on a second machine of the project's kind (2026-12-04, 11 seeds,
#: GD at 3×; the first machine measured 0.95). Seeds are sized on it, not on one machine's spread.
PAIRED_SD_SEEN = 1.70
#: The half-width (points) chapter 04's comparisons are sized for: what a referee asked of the 2 x 2.
TARGET_HALF_WIDTH = 0.9


def power_text(gap: Estimate, target: float = TARGET_HALF_WIDTH, largest_sd: float = PAIRED_SD_SEEN) -> str:
    """What a gap's design can resolve, in words: its half-widths (over seeds and examples, and over seeds
    only), the seeds a seeds-only interval of half-width ``target`` needs at the larger of this build's
    paired sd and ``largest_sd``, and the half-width the test examples alone leave however many seeds
    (the crossed interval's example part, with normal quantiles)."""
    if gap.low != gap.low:
        return "no interval (fewer than two seeds, or no spread)"
    sd = max(gap.sd, largest_sd) if gap.sd == gap.sd else largest_sd
    text = (f"the interval is ±{gap.half_width:.2f} points over seeds and sentences"
            + (f" (±{(gap.seeds_high - gap.seeds_low) / 2:.2f} over seeds only)" if gap.crossed else "")
            + f" with {gap.n} pairs; a seeds-only interval of ±{target:g} needs {seeds_for_half_width(sd, target)} "
            f"pairs at a paired sd of {sd:.2f} points (the larger of this build's {gap.sd:.2f} and the largest "
            f"a build has measured, {largest_sd:.2f})")
    if gap.crossed:
        seeds_se = (gap.seeds_high - gap.seeds_low) / 2 / _t(gap.n)
        examples_se = max(0.0, (gap.half_width / _t(gap.n)) ** 2 - seeds_se ** 2) ** 0.5
        text += (f"; the test sentences alone leave ±{1.96 * examples_se:.2f} however many seeds"
                 + (f", so ±{target:g} over seeds and sentences is out of reach with this test set"
                    if 1.96 * examples_se >= target else ""))
    return text


def _t(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def depths_text(gaps: dict[int, Estimate]) -> str:
    """``accuracy_gaps`` in words: "+0.81 [−0.40, +2.02] (3 pairs) at 3 layers; ..."."""
    return "; ".join(f"{gap.text()} ({gap.n} pairs) at {L} layers" for L, gap in gaps.items()) or "not measured"


def scale_trend(points: pd.DataFrame, x: str = "embedding_std") -> Estimate:
    """The embedding-scale series at the level its design randomizes, the std (a std's step choice is shared
    by its seed pairs): the least-squares slope of the per-std gaps (``value``, points of ℓ1.1 − GD, as
    ``chapter.series_points`` gives them) against log10 of ``x`` (the std, or ``embedding_ratio``),
    over the stds whose runs all reached the stop rule (``reached``), with its 95 % t interval on k - 2
    degrees of freedom (k stds): the points the gap moves per tenfold ``x``. ``n`` counts the stds; ``sd``
    is the slope's standard error times sqrt(k) (so that sd / sqrt(n) is its standard error, as for a
    mean); ``detectable`` the smallest slope the design detects on k - 2 degrees of freedom. No interval
    with fewer than three."""
    kept = points[points.reached.astype(bool) & points.value.notna()]
    if len(kept) < 3 or kept[x].nunique() < 2:
        return Estimate(math.nan, math.nan, math.nan, len(kept))
    from scipy.stats import t

    k = len(kept)
    slope, se = map(float, slope_fit(np.log10(kept[x].to_numpy(float)), kept.value.to_numpy(float)))
    half = float(t.ppf(0.975, k - 2)) * se
    return Estimate(slope, slope - half, slope + half, k, detectable_from_se(se, k, dof=k - 2), se * math.sqrt(k))


def tied_contrasts(runs: pd.DataFrame, predictions: pd.DataFrame, weights: Mapping[str, float],
                   least: int = 2) -> pd.DataFrame:
    """A contrast (``contrast``'s ``weights`` on methods or arms) at every combination of the steps tied with
    each method's choice: ``runs`` marks them (``method``, ``multiple``, ``chosen``, ``tied``: one grid's or
    2 x 2's runs), ``predictions`` holds the per-example predictions (``method``, ``multiple``, ``seed``,
    ``example``, ``correct``) of the runs that have them. One row per combination with predictions at
    ``least`` common seeds or more: the multiple of each method (``multiple_<key>``), ``chosen`` (the
    choices' own combination), n and the estimate (value, low, high, seeds_low, seeds_high)."""
    keyed_runs = runs.assign(method=keyed(runs.method))
    keyed_predictions = predictions.assign(method=keyed(predictions.method))
    tied = {k: sorted(set(keyed_runs[(keyed_runs.method == k) & keyed_runs.tied.astype(bool)].multiple)) for k in weights}
    chosen = {k: set(keyed_runs[(keyed_runs.method == k) & keyed_runs.chosen.astype(bool)].multiple) for k in weights}
    rows = []
    for combination in _product([tied[k] for k in weights]):
        at = dict(zip(weights, combination))
        parts = [keyed_predictions[(keyed_predictions.method == k) & np.isclose(keyed_predictions.multiple, m)]
                 for k, m in at.items()]
        seeds = set.intersection(*(set(part.seed) for part in parts)) if parts else set()
        if len(seeds) < least:
            continue
        both = pd.concat([part[part.seed.isin(seeds)] for part in parts], ignore_index=True)
        e = contrast(both, weights)
        rows.append({f"multiple_{k}": m for k, m in at.items()}
                    | {"chosen": all(m in chosen[k] for k, m in at.items()), "n": e.n, "value": e.value,
                       "low": e.low, "high": e.high, "seeds_low": e.seeds_low, "seeds_high": e.seeds_high})
    return pd.DataFrame(rows)


def _product(lists: list[list[float]]) -> list[tuple[float, ...]]:
    out: list[tuple[float, ...]] = [()]
    for values in lists:
        out = [prefix + (v,) for prefix in out for v in values]
    return out


def step_edges(runs: pd.DataFrame, cell: tuple[str, ...] = ("layers", "method"), candidate: str = "multiple",
               ) -> dict[tuple, tuple[str, float, list[float]]]:
    """Where each cell's chosen step sits among the candidates its grid tried (a grid's runs, with
    ``chosen``): (where, the chosen value, the values tried), where is "" between a smaller and a larger
    one, "the smallest" or "the largest" at an end of the grid (the best step may lie beyond it), "the
    only" when nothing else was tried."""
    out = {}
    for key, part in runs.groupby(list(cell), sort=False):
        tried = sorted(set(part[candidate]))
        chosen = set(part[candidate][part.chosen.astype(bool)])
        if len(chosen) != 1:
            continue
        value = chosen.pop()
        where = ("the only" if len(tried) == 1 else "the smallest" if value == tried[0]
                 else "the largest" if value == tried[-1] else "")
        out[key if isinstance(key, tuple) else (key,)] = (where, value, tried)
    return out


def edges_text(runs: pd.DataFrame, cell: tuple[str, ...] = ("layers", "method"), candidate: str = "multiple") -> str:
    """``step_edges`` in words, the choices at an end of their grid only ("" when every choice is inside):
    "ℓ1.1 at 3 layers: 1× is the only candidate; ℓ2 (GD) at 3 layers: 1× is the smallest of 1×, 3×"."""
    parts = []
    for key, (where, chosen, tried) in step_edges(runs, cell, candidate).items():
        name = _cell_name(key if len(key) > 1 else key[0])
        if where == "the only":
            parts.append(f"{name}: {chosen:g}× is the only candidate")
        elif where:
            parts.append(f"{name}: {chosen:g}× is {where} of {', '.join(f'{x:g}×' for x in tried)}")
    return "; ".join(parts)


def win_rate(table: pd.DataFrame) -> Estimate:
    """Token selection on one sentence set: ℓ1.1's win rate among the non-tied sentences, per seed, its mean
    over the seeds with a non-tied sentence and the t interval over them (bounds cut to [0, 1]);
    ``detectable`` is the smallest distance from 1/2 the design detects. ``table``: one row per seed
    (``wins``, ``losses``), or one per (seed, ``sentence``) with 0/1 ``wins`` and ``losses`` (a tie: both
    0), whose interval then counts the sentences as a sample too (``crossed``, on each seed's rate
    linearized over its sentences: r_s + (w_si - r_s t_si) N / T_s, t_si = 1 for a non-tied sentence)."""
    per_seed = table.groupby("seed")[["wins", "losses"]].sum() if "sentence" in table else table.set_index("seed")
    kept = per_seed[(per_seed.wins + per_seed.losses) > 0]
    if kept.empty:
        return NONE
    rate, seeds_low, seeds_high = clustered_rate(kept.wins, kept.losses)
    rates = kept.wins / (kept.wins + kept.losses)
    sd = float(rates.std(ddof=1)) if len(kept) > 1 else math.nan
    if "sentence" not in table:
        return Estimate(rate, seeds_low, seeds_high, len(kept), detectable_effect(rates), sd)
    rows = table[table.seed.isin(kept.index)]
    wins = rows.pivot_table(index="seed", columns="sentence", values="wins").loc[kept.index]
    untied = wins + rows.pivot_table(index="seed", columns="sentence", values="losses").loc[kept.index]
    r, counts = rates.to_numpy()[:, None], untied.sum(axis=1).to_numpy()[:, None]
    linear = r + (wins.to_numpy() - r * untied.to_numpy()) * untied.shape[1] / counts
    value, low, high, se, _ = crossed_interval(linear)
    return Estimate(value, max(low, 0.0) if low == low else low, min(high, 1.0) if high == high else high,
                    len(kept), detectable_from_se(se, len(kept)), sd, seeds_low, seeds_high)


def entropy_gap(table: pd.DataFrame) -> Estimate:
    """Attention concentration: GD minus ℓ1.1 in the normalized entropy of the [CLS] row, seed by seed
    (positive: ℓ1.1's attention is sharper)."""
    return paired(table, COMPARED[1], COMPARED[0], "entropy")


def density_gap(change: pd.DataFrame, baseline: str = methods.GD, column: str = "effective_density") -> Estimate:
    """Sparsity: ℓ1.1 minus ``baseline`` ("2": GD, "adam") in the effective density of ΔW, seed by seed
    (negative: ℓ1.1's change is sparser); ``column="dual_density"``: of the dual change m(W) - m(W(0))
    (``sparsity.change_table``; the baseline's is its ΔW): whether ℓ1.1's summed gradients are sparser
    themselves, beyond the weighting by the initial magnitudes that turns them into ΔW."""
    return paired(change, COMPARED[0], baseline, column)


#: The column of ``sparsity.change_table``'s rows that holds each model's init-weighting null
#: (``sparsity_null.null_table``).
WEIGHTING_NULL = "weighting_null_density"


def weighting_gap(change: pd.DataFrame, method: str = COMPARED[0], null: str = WEIGHTING_NULL) -> Estimate:
    """Sparsity beyond the init weighting: ``method``'s (ℓ1.1's) effective density of ΔW minus that of its own
    null (``sparsity_null.null_table``: the same model's ΔW with the dual change replaced by unstructured
    noise at each matrix's scale), model by model (the same seed, the same initialization), with the paired t
    interval over the seeds (negative: ΔW is sparser than the init weighting predicts). Models without a
    null value are left out."""
    rows = change[keyed(change.method) == method]
    sides = pd.concat([rows.assign(side="change", density=rows.effective_density),
                       rows.assign(side="null", density=rows[null])], ignore_index=True)
    return paired(sides.dropna(subset=["density"]), "change", "null", "density", by="side")


def pruned_gap(curves: pd.DataFrame, sparsity: float) -> Estimate:
    """Pruning: ℓ1.1 minus GD in points of test accuracy after magnitude pruning of ``sparsity`` of the
    weights (rows of ``curves`` at that sparsity), seed by seed."""
    at = curves[np.isclose(curves.sparsity, sparsity)]
    return paired(at.assign(points=100 * at.test_accuracy), *COMPARED, "points")


def parity_gaps(final: pd.DataFrame) -> dict[str, Estimate]:
    """ViT parity on one data set: per method ``key`` other than Adam, its final test accuracy minus
    Adam's in points (``points``), seed by seed."""
    return {key: paired(final, key, methods.ADAM, "points", by="key") for key in dict.fromkeys(final.key)
            if key != methods.ADAM}


def unreached(runs: pd.DataFrame, compared: tuple[str, ...] = COMPARED) -> int:
    """Runs of the ``compared`` methods (ℓ1.1 and GD) of ``runs`` that did not reach the stop rule."""
    compared = runs[runs.method.map(key_of).isin(compared)]
    return int((~compared.reached.astype(bool)).sum())


def below_floor(runs: pd.DataFrame, baseline: float, by=("method",), column: str = "last_test",
                compared: tuple[str, ...] = COMPARED) -> str:
    """Why the models of the ``compared`` methods (ℓ1.1 and GD) do not generalize: the cells (``by``) whose
    mean ``column`` is below ``stats.generalization_floor`` of the bag-of-words ``baseline``, in words
    ("" when none is)."""
    floor = generalization_floor(baseline)
    compared = runs[runs.method.map(key_of).isin(compared)]
    means = compared.assign(method=compared.method.map(key_of)).groupby(list(by))[column].mean()
    low = means[means < floor]
    if low.empty:
        return ""
    shown = ", ".join(f"{_cell_name(k)} {100 * v:.1f} %" for k, v in low.items())
    return f"{shown} < {100 * floor:.1f} % (baseline {100 * baseline:.1f} %)"


def _cell_name(key) -> str:
    """A cell in words, the method first: "ℓ1.1", "ℓ1.1 at 3 layers"."""
    parts = key if isinstance(key, tuple) else (key,)
    depths = [f"{p} layers" for p in parts if isinstance(p, (int, np.integer))]
    names = [methods.arm_text(key_of(p)) for p in parts if not isinstance(p, (int, np.integer))]
    return " ".join(names) + (f" at {', '.join(depths)}" if depths else "")
