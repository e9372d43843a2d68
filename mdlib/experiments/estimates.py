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
- ``pruned_gap``: pruning, ℓ1.1 minus GD in points after magnitude pruning at one sparsity;
- ``parity_gaps``: ViT parity, each mirror-descent exponent minus Adam in points.

The gates of the sentiment claims read the same runs: ``unreached`` (runs that missed the stop rule)
and ``below_floor`` (cells whose mean accuracy is under the generalization floor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mdlib.experiments import methods
from mdlib.experiments.stats import clustered_rate, detectable_effect, generalization_floor, paired_interval

__all__ = ["COMPARED", "Estimate", "accuracy_gaps", "below_floor", "density_gap", "depths_text", "entropy_gap", "key_of",
           "number", "paired", "parity_gaps", "pruned_gap", "unreached", "win_rate"]

#: The two methods every sentiment claim compares: ℓ1.1 mirror descent and GD (ℓ2).
COMPARED = ("1.1", "2")


def number(x: float, digits: int = 2, scale: float = 1.0, sign: bool = True, suffix: str = "",
           missing: str = "n/a") -> str:
    """``scale * x`` as the book prints an estimate: ``digits`` decimals, "+" before a positive number when
    ``sign``, a true minus sign (−), ``suffix`` after it; ``missing`` for NaN. ``number(0.512, 1, 100,
    sign=False, suffix="%")`` is "51.2%"."""
    if x != x:
        return missing
    return (f"{scale * x:+.{digits}f}" if sign else f"{scale * x:.{digits}f}").replace("-", "−") + suffix


@dataclass(frozen=True)
class Estimate:
    """A claim's number: ``value`` (a mean per-seed difference, or a mean per-seed rate) with its 95 % t
    interval [``low``, ``high``] (NaN: fewer than two seeds or no spread), the ``n`` seeds behind it, the
    smallest effect the design detects with 80 % power (``stats.detectable_effect``, a distance from the
    null; NaN without an interval) and the standard deviation of the per-seed values."""
    value: float
    low: float
    high: float
    n: int
    detectable: float = math.nan
    sd: float = math.nan

    def text(self, digits: int = 2, scale: float = 1.0, sign: bool = True, suffix: str = "") -> str:
        """"+0.81 [−0.40, +2.02]" (values times ``scale``, ``suffix`` after each, a true minus sign;
        "(no interval)" without one)."""
        def shown(x: float) -> str:
            return number(x, digits, scale, sign, suffix)

        if self.low != self.low:
            return f"{shown(self.value)} (no interval)"
        return f"{shown(self.value)} [{shown(self.low)}, {shown(self.high)}]"


NONE = Estimate(math.nan, math.nan, math.nan, 0)


def key_of(value) -> str:
    """A method key as the results tables write it: "1.1", "2", "3", "adam" (a CSV may read 1.1 as a number)."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


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


def accuracy_gaps(runs: pd.DataFrame, metric: str = "last_test") -> dict[int, Estimate]:
    """Table 1: per depth (``layers``), ℓ1.1 minus GD in points of ``metric`` (the test accuracy at the stop
    rule, or ``best_test``, the best over epochs) over the chosen runs of one grid, seed by seed."""
    chosen = runs[runs.chosen.astype(bool)] if "chosen" in runs else runs
    return {int(L): paired(part.assign(points=100 * part[metric]), *COMPARED, "points")
            for L, part in chosen.groupby("layers", sort=False)}


def depths_text(gaps: dict[int, Estimate]) -> str:
    """``accuracy_gaps`` in words: "+0.81 [−0.40, +2.02] (3 pairs) at 3 layers; ..."."""
    return "; ".join(f"{gap.text()} ({gap.n} pairs) at {L} layers" for L, gap in gaps.items()) or "not measured"


def win_rate(per_seed: pd.DataFrame) -> Estimate:
    """Token selection on one sentence set: ℓ1.1's win rate among the non-tied sentences, per seed
    (``wins``, ``losses``), its mean over the seeds with a non-tied sentence and the t interval over them
    (bounds cut to [0, 1]); ``detectable`` is the smallest distance from 1/2 the design detects."""
    kept = per_seed[(per_seed.wins + per_seed.losses) > 0]
    if kept.empty:
        return NONE
    rate, low, high = clustered_rate(kept.wins, kept.losses)
    rates = kept.wins / (kept.wins + kept.losses)
    return Estimate(rate, low, high, len(kept), detectable_effect(rates),
                    float(rates.std(ddof=1)) if len(kept) > 1 else math.nan)


def entropy_gap(table: pd.DataFrame) -> Estimate:
    """Attention concentration: GD minus ℓ1.1 in the normalized entropy of the [CLS] row, seed by seed
    (positive: ℓ1.1's attention is sharper)."""
    return paired(table, COMPARED[1], COMPARED[0], "entropy")


def density_gap(change: pd.DataFrame, baseline: str = "2") -> Estimate:
    """Sparsity: ℓ1.1 minus ``baseline`` ("2": GD, "adam") in the effective density of ΔW, seed by seed
    (negative: ℓ1.1's change is sparser)."""
    return paired(change, COMPARED[0], baseline, "effective_density")


def pruned_gap(curves: pd.DataFrame, sparsity: float) -> Estimate:
    """Pruning: ℓ1.1 minus GD in points of test accuracy after magnitude pruning of ``sparsity`` of the
    weights (rows of ``curves`` at that sparsity), seed by seed."""
    at = curves[np.isclose(curves.sparsity, sparsity)]
    return paired(at.assign(points=100 * at.test_accuracy), *COMPARED, "points")


def parity_gaps(final: pd.DataFrame) -> dict[str, Estimate]:
    """ViT parity on one data set: per method ``key`` other than Adam, its final test accuracy minus
    Adam's in points (``points``), seed by seed."""
    return {key: paired(final, key, "adam", "points", by="key") for key in dict.fromkeys(final.key) if key != "adam"}


def unreached(runs: pd.DataFrame) -> int:
    """ℓ1.1 and GD runs of ``runs`` that did not reach the stop rule."""
    compared = runs[runs.method.map(key_of).isin(COMPARED)]
    return int((~compared.reached.astype(bool)).sum())


def below_floor(runs: pd.DataFrame, baseline: float, by=("method",), column: str = "last_test") -> str:
    """Why the ℓ1.1 or GD models do not generalize: the cells (``by``) whose mean ``column`` is below
    ``stats.generalization_floor`` of the bag-of-words ``baseline``, in words ("" when none is)."""
    floor = generalization_floor(baseline)
    compared = runs[runs.method.map(key_of).isin(COMPARED)]
    means = compared.assign(method=compared.method.map(key_of)).groupby(list(by))[column].mean()
    low = means[means < floor]
    if low.empty:
        return ""
    shown = ", ".join(f"{_cell_name(k)} {100 * v:.1f} %" for k, v in low.items())
    return f"{shown} < {100 * floor:.1f} % (baseline {100 * baseline:.1f} %)"


def _cell_name(key) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    return " ".join(f"{p} layers" if isinstance(p, (int, np.integer)) else methods.method_text(*methods.method(p))
                    for p in parts)
