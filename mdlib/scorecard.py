"""The reproduction scorecard: which of the paper's claims hold in a build, decided by stated rules.

``page(results_dir)`` reads the ``<label>.csv`` files a book build wrote (and the ``<label>.json``
next to each, for the profile) and returns a MyST markdown page: one table row per claim, in the
paper's order, with the paper's number, ours with its interval or seeds, the profile, a verdict and a
link to the figure or table. ``write_page`` writes it atomically.

Every verdict comes from a rule: a small pure function of numbers, whose ``sentence`` is printed on
the page exactly as applied. The outcomes are ``holds``, ``differs``, ``inconclusive`` (the interval
spans both answers) and ``not measured at this profile`` (a CSV is missing, or the regime the claim
is about was not reached; the cell says which).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from mdlib.analysis import difference_interval, wilson_interval
from mdlib.paths import atomic_write

__all__ = ["HOLDS", "DIFFERS", "INCONCLUSIVE", "NOT_MEASURED", "Verdict", "Row", "RULES", "CLAIMS", "reference",
           "interval_rule", "e1_rule", "e2_norm_rule", "e2_rate_rule", "e3_rule", "table1_rule", "token_rule",
           "fewer_rule", "pruning_rule", "parity_rule", "cost_rule", "rows", "page", "write_page"]

HOLDS, DIFFERS, INCONCLUSIVE, NOT_MEASURED = "holds", "differs", "inconclusive", "not measured at this profile"


@dataclass(frozen=True)
class Verdict:
    """An outcome and, for ``not measured``, why."""
    outcome: str
    why: str = ""

    def __str__(self) -> str:
        return f"**{self.outcome}**" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Row:
    """One claim: the paper's number, ours, the profile that produced ours, the verdict, the link."""
    claim: str
    paper: str
    ours: str
    profile: str
    verdict: Verdict
    link: str


def _rule(name: str, sentence: str):
    """Attach the rule's name and its sentence (printed on the page) to a rule function."""
    def attach(fn):
        fn.rule_name, fn.sentence = name, sentence
        return fn
    return attach


def _judge(*, differs: bool, holds: bool) -> Verdict:
    """The verdict of a rule's two tests: differs wins, then holds, else inconclusive."""
    return Verdict(DIFFERS if differs else HOLDS if holds else INCONCLUSIVE)


def _not_measured(why: str) -> Verdict:
    return Verdict(NOT_MEASURED, why)


# ---------------------------------------------------------------------------------------------
# the rules: pure functions of numbers


def interval_rule(low: float, high: float) -> Verdict:
    """holds when the interval lies above 0, differs when below, inconclusive when it contains 0 (or
    could not be computed: no spread)."""
    if low > 0:
        return Verdict(HOLDS)
    if high < 0:
        return Verdict(DIFFERS)
    return Verdict(INCONCLUSIVE)


@_rule("E1", "Per training exponent p, take the band of the directional divergence at the last step from the "
             "10th to the 90th percentile of the seeds, to each SVM. Holds when, for every p, the band to the "
             "path's own SVM lies wholly below the band to every other SVM; differs when, for some p, the band "
             "to another SVM lies wholly below the own band; inconclusive otherwise (bands overlap). Not "
             "measured with fewer than two SVM exponents per path.")
def e1_rule(bands: dict[float, dict[float, tuple[float, float]]]) -> Verdict:
    """``bands[train_p][svm_p] = (q10, q90)`` at the last step."""
    if not bands or any(len(row) < 2 or p not in row for p, row in bands.items()):
        return _not_measured("fewer than two SVM exponents per path, or no own-p SVM")
    return _judge(differs=any(row[q][1] < row[p][0] for p, row in bands.items() for q in row if q != p),
                  holds=all(row[p][1] < row[q][0] for p, row in bands.items() for q in row if q != p))


@_rule("E2 norm", "Fit the norm ||W(k)||_p against log k over each of the last two decades of steps (plain "
                  "steps): logarithmic growth keeps the slope. Holds when, for every p, the last decade's slope "
                  "is positive and within a factor 2 of the decade before; differs when, for some p, it is not "
                  "positive or off by more than a factor 4 (the norm stalls, or grows like a power of k); "
                  "inconclusive otherwise. Not measured when the run has fewer than 1000 steps (two decades "
                  "above step 10) or fewer than 3 recorded steps in a decade.")
def e2_norm_rule(slopes: dict[float, tuple[float, float]], steps: int) -> Verdict:
    """``slopes[p] = (slope over the decade before the last, slope over the last decade)``."""
    if steps < 1000 or not slopes:
        return _not_measured(f"{steps} steps, fewer than 1000")
    if any(math.isnan(x) for pair in slopes.values() for x in pair):
        return _not_measured("fewer than 3 recorded steps in a decade")
    ratios = [last / before if before > 0 else math.inf for before, last in slopes.values()]
    return _judge(differs=any(last <= 0 for _, last in slopes.values()) or any(not 1 / 4 <= r <= 4 for r in ratios),
                  holds=all(1 / 2 <= r <= 2 for r in ratios))


E2_RATE = ("Compare the directional divergence D to the own SVM at step K (the last) and K/10 (plain steps): a "
           "decay like 1/log k leaves D(K) = D(K/10) log(K/10) / log K. Holds when, for every p, D(K) is at most "
           "that (a decay at least as fast as the bound); differs when, for some p, D did not decrease over the "
           "last decade; inconclusive otherwise (decreasing, but slower than 1/log k). Not measured when the run "
           "has fewer than 1000 steps.")


@_rule("E2 rate", E2_RATE)
def e2_rate_rule(divergences: dict[float, tuple[float, float]], steps: int) -> Verdict:
    """``divergences[p] = (D(K/10), D(K))`` with K = ``steps``."""
    if steps < 1000 or not divergences:
        return _not_measured(f"{steps} steps, fewer than 1000")
    factor = math.log(steps / 10) / math.log(steps)
    return _judge(differs=any(end >= before for before, end in divergences.values()),
                  holds=all(end <= before * factor for before, end in divergences.values()))


E3_CLOSE, E3_FAR = 0.01, 0.1


@_rule("E3", f"One fixed instance per p (no seeds, no interval). Holds when, for every p, the directional "
             f"Bregman divergences of W to the attention SVM and of v to the decoder SVM at the last step are "
             f"at most {E3_CLOSE:g}; differs when one of them is at least {E3_FAR:g}; inconclusive between.")
def e3_rule(divergences) -> Verdict:
    """``divergences``: every p's final W and v divergences."""
    values = [float(x) for x in divergences]
    if not values:
        return _not_measured("no runs")
    return _judge(differs=any(not x < E3_FAR for x in values),  # NaN counts as far
                  holds=all(x <= E3_CLOSE for x in values))


@_rule("Table 1", "Per depth: the Welch 95 % interval of mean best test accuracy, ℓ1.1 minus GD, over seeds. "
                  "Holds when it lies above 0, differs when below, inconclusive when it contains 0. Not measured "
                  "with fewer than 2 seeds per cell, or when some ℓ1.1 or GD run did not reach the stop rule (99.5 % "
                  "training accuracy): the table compares models trained to that point.")
def table1_rule(low: float, high: float, seeds: int, unreached: int) -> Verdict:
    """``seeds``: the fewest seeds of the two cells; ``unreached``: runs of the row that did not reach the stop."""
    return _trained_interval(low, high, seeds, unreached, "cell", "run(s)")


def _trained_interval(low: float, high: float, seeds: int, unreached: int, per: str, runs: str) -> Verdict:
    """``interval_rule``, when each side has 2 seeds or more and every run reached the stop rule."""
    if seeds < 2:
        return _not_measured(f"{seeds} seed per {per}")
    if unreached:
        return _not_measured(f"{unreached} {runs} did not reach the stop rule")
    return interval_rule(low, high)


@_rule("Token selection", "The share of non-tied sentence comparisons (each seed's ℓ1.1 model against the same "
                          "seed's GD model) that ℓ1.1 wins, with its 95 % Wilson interval. Holds when the interval "
                          "lies above 1/2, differs when below, inconclusive when it contains 1/2. Not measured "
                          "without a non-tied comparison, or when a sentiment run of chapter 04 did not reach the "
                          "stop rule (the claim is about trained models). (Comparisons of one sentence across seeds "
                          "are not independent: the interval is optimistic.)")
def token_rule(wins: int, losses: int, unreached: int) -> Verdict:
    """``unreached``: sentiment runs (ℓ1.1 or GD) that did not reach the stop rule."""
    if wins + losses == 0:
        return _not_measured("no non-tied comparison")
    if unreached:
        return _not_measured(f"{unreached} sentiment run(s) did not reach the stop rule")
    low, high = wilson_interval(wins, wins + losses)
    return interval_rule(low - 0.5, high - 0.5)


@_rule("Sparsity (K/Q/V and ViT)",
       "Per seed, the number of key, query and value entries above the threshold (the paper's 0.06, scaled with "
       "the initialization bound 1/sqrt(width)); the Welch 95 % interval of the mean count, small-p mirror descent "
       "(ℓ1.1) minus the baseline (GD; for the ViT, Adam). Holds when it lies below 0 (fewer large entries), "
       "differs when above, inconclusive when it contains 0. Not measured with fewer than 2 seeds per method, when "
       "no entry of either method passes the threshold, or when the models were not trained to the end "
       "(sentiment: a run of chapter 04 did not reach the stop rule; ViT: a training loss had not levelled off).")
def fewer_rule(low: float, high: float, seeds: int, above: float, unfinished: str = "") -> Verdict:
    """``above``: the entries above the threshold, both methods together; ``unfinished``: why the models
    are not trained to the end ("" when they are)."""
    if seeds < 2:
        return _not_measured(f"{seeds} seed per method")
    if above == 0:
        return _not_measured("no entry above the threshold")
    if unfinished:
        return _not_measured(unfinished)
    return interval_rule(-high, -low)


PRUNE_AT = 0.5


@_rule("Pruning", f"Not a claim of the paper: the hypothesis its sparsity reading suggests. Per seed, the test "
                  f"accuracy after global magnitude pruning of {PRUNE_AT:.0%} of all weight matrices and "
                  f"embeddings, without retraining; the Welch 95 % interval of ℓ1.1 minus GD. Holds when it "
                  f"lies above 0, differs when below, inconclusive when it contains 0. Not measured with fewer "
                  f"than 2 seeds per method, without that sparsity level, or when a sentiment run of chapter 04 "
                  f"did not reach the stop rule.")
def pruning_rule(low: float, high: float, seeds: int, unreached: int) -> Verdict:
    return _trained_interval(low, high, seeds, unreached, "method", "sentiment run(s)")


PARITY_MARGIN = 2.0


@_rule("ViT parity", f"Per mirror-descent exponent, the Welch 95 % interval of the final test accuracy minus "
                     f"Adam's, in points. Holds when every interval lies within ±{PARITY_MARGIN:g} points; "
                     f"differs when one lies wholly outside; inconclusive otherwise. Not measured with fewer "
                     f"than 2 seeds per method, or when some method's training loss had not levelled off (the "
                     f"chapter's rule): the claim is about end points, not speed.")
def parity_rule(intervals, seeds: int, levelled: bool) -> Verdict:
    """``intervals``: (low, high) of MD minus Adam per exponent, in points."""
    if seeds < 2:
        return _not_measured(f"{seeds} seed per method")
    if not levelled:
        return _not_measured("a training loss had not levelled off")
    intervals = list(intervals)
    return _judge(differs=any(low > PARITY_MARGIN or high < -PARITY_MARGIN for low, high in intervals),
                  holds=bool(intervals) and all(-PARITY_MARGIN <= low <= high <= PARITY_MARGIN
                                                for low, high in intervals))


COST_BAND = (0.8, 1.25)


@_rule("Cost", f"Per model, the 95 % bootstrap interval of the median ratio of a mirror-descent training step's "
               f"time to Adam's (chapter 08). Holds when every exponent's interval lies within "
               f"{COST_BAND[0]:g} to {COST_BAND[1]:g}; differs when one lies wholly outside; inconclusive "
               f"otherwise.")
def cost_rule(intervals) -> Verdict:
    intervals = list(intervals)
    lo, hi = COST_BAND
    if not intervals:
        return _not_measured("no mirror-descent timing")
    return _judge(differs=any(high < lo or low > hi for low, high in intervals),
                  holds=all(lo <= low and high <= hi for low, high in intervals))


RULES = [e1_rule, e2_norm_rule, e2_rate_rule, e3_rule, table1_rule, token_rule, fewer_rule, pruning_rule,
         parity_rule, cost_rule]


# ---------------------------------------------------------------------------------------------
# reading a results folder


class _Unmeasured(Exception):
    """A claim cannot be measured from this folder (a CSV or a column is missing)."""


class _Results:
    def __init__(self, folder: Path, profile: str | None):
        self.folder, self.profile = Path(folder), profile

    def csv(self, label: str, columns=()) -> pd.DataFrame:
        path = self.folder / f"{label}.csv"
        if not path.is_file():
            raise _Unmeasured(f"{label}.csv missing")
        frame = pd.read_csv(path)
        lacking = [c for c in columns if c not in frame.columns]
        if lacking:
            raise _Unmeasured(f"{label}.csv lacks {', '.join(lacking)}")
        return frame

    def profile_of(self, label: str) -> str:
        """The profile in ``<label>.json``, else the one given, else "unknown"."""
        path = self.folder / f"{label}.json"
        if path.is_file():
            profile = json.loads(path.read_text("utf-8")).get("profile")
            if profile:
                return str(profile)
        return self.profile or "unknown"


def reference(notebook: str, label: str) -> str:
    """The cell that links a figure or table: a numbered cross-reference to its label (``:name:`` in the
    chapter ``notebook``), which the book renders as "Fig. 1.2" or "Table 4.1" and checks at build time."""
    return f"{{numref}}`{label}`"


def _signed(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:+.{digits}f}".replace("-", "−")


def _interval(d: float, low: float, high: float, digits: int = 2) -> str:
    if low != low:
        return f"{_signed(d, digits)} (no interval)"
    return f"{_signed(d, digits)} [{_signed(low, digits)}, {_signed(high, digits)}]"


def _key(value) -> str:
    """A method key as the sentiment CSVs write it: "1.1", "2", "3", "adam"."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return str(value)


# ---------------------------------------------------------------------------------------------
# the claims, in the paper's order. Each builder returns a list of _Part (one per depth, sentence
# set, data set or model; part None when the claim has one row); raising _Unmeasured gives one
# "not measured" row.


class _Part(NamedTuple):
    part: str | None
    ours: str
    verdict: Verdict
    paper: str | None = None  # instead of the claim's own paper text


@dataclass(frozen=True)
class _Claim:
    claim: str
    paper: str
    notebook: str
    label: str
    csvs: tuple[str, ...]
    build: Callable


def _e1(r: _Results):
    curves = r.csv("fig-e1-paths", ["train_p", "svm_p", "step", "mean", "q10", "q90"])
    last = curves.loc[curves.groupby(["train_p", "svm_p"]).step.idxmax()]
    bands = {float(p): {float(q): (g.q10, g.q90) for q, g in rows.set_index("svm_p").iterrows()}
             for p, rows in last.groupby("train_p")}
    means = last.set_index(["train_p", "svm_p"])["mean"]
    parts = []
    for p, row in bands.items():
        others = [q for q in row if q != p]
        nearest = min(others, key=lambda q: means[p, q]) if others else None
        text = f"p = {p:g}: own {means[p, p]:.4f}" if p in row else f"p = {p:g}: no own SVM"
        if nearest is not None:
            text += f", nearest other (p = {nearest:g}) {means[p, nearest]:.4f}"
        parts.append(text)
    ours = "divergence at the last step, mean over seeds: " + "; ".join(parts)
    return [_Part(None, ours, e1_rule(bands))]


def _plain(r: _Results) -> pd.DataFrame:
    curves = r.csv("fig-e2-norm-growth", ["p", "step", "norm", "divergence"])
    return curves[curves.method == "plain"] if "method" in curves else curves


def _e2_norm(r: _Results):
    curves = _plain(r)
    steps = int(curves.step.max())
    slopes = {}
    for p, c in curves.groupby("p"):
        def slope(lo, hi):
            part = c[(c.step >= lo) & (c.step <= hi)]
            return float(np.polyfit(np.log(part.step), part.norm, 1)[0]) if len(part) >= 3 else math.nan
        slopes[float(p)] = (slope(steps / 100, steps / 10), slope(steps / 10, steps))
    ours = ("slope of ||W||_p per unit of log k, decade before the last → last: "
            + "; ".join(f"p = {p:g}: {a:.2f} → {b:.2f}" for p, (a, b) in slopes.items()) + f" ({steps} steps)")
    return [_Part(None, ours, e2_norm_rule(slopes, steps))]


def _e2_rate(r: _Results):
    curves = _plain(r)
    steps = int(curves.step.max())
    divergences = {}
    for p, c in curves.groupby("p"):
        c = c.set_index("step").divergence
        divergences[float(p)] = (float(c.iloc[np.abs(c.index - steps / 10).argmin()]), float(c.loc[steps]))
    factor = math.log(steps / 10) / math.log(steps) if steps > 10 else math.nan
    ours = (f"D(K/10) → D(K), K = {steps} (1/log k would leave ×{factor:.2f}): "
            + "; ".join(f"p = {p:g}: {a:.3f} → {b:.3f}" + (f" (×{b / a:.2f})" if a else "")
                       for p, (a, b) in divergences.items()))
    return [_Part(None, ours, e2_rate_rule(divergences, steps))]


def _e3(r: _Results):
    final = r.csv("table-e3-final", ["p", "W_divergence", "v_divergence"])
    ours = "final divergence W / v: " + "; ".join(
        f"p = {p:g}: {w:.1e} / {v:.1e}" for p, w, v in zip(final.p, final.W_divergence, final.v_divergence))
    return [_Part(None, ours, e3_rule([*final.W_divergence, *final.v_divergence]))]


def _table1(r: _Results):
    cells = r.csv("table-1", ["layers", "method", "paper"])
    runs = r.csv("table-sentiment-runs", ["layers", "method", "seed", "best_test", "reached", "chosen"])
    runs = runs[runs.chosen.astype(bool)].assign(method=runs.method.map(_key))
    cells = cells.assign(method=cells.method.map(_key))
    out = []
    for L in sorted(cells.layers.unique()):
        paper = cells[cells.layers == L].set_index("method")["paper"]
        row_runs = runs[runs.layers == L]
        acc = {k: 100 * row_runs[row_runs.method == k].best_test.to_numpy() for k in ("1.1", "2", "3")}
        paper_text = " / ".join(f"{paper.get(k, math.nan):.2f}" for k in ("1.1", "2", "3")) + " (ℓ1.1 / GD / ℓ3)"
        if acc["1.1"].size == 0 or acc["2"].size == 0:
            out.append(_Part(f"{L} layers", "no ℓ1.1 or GD runs", _not_measured("no ℓ1.1 or GD runs"), paper_text))
            continue
        parts = [f"{a.mean():.2f} ± {a.std(ddof=1) if a.size > 1 else math.nan:.2f}" for a in acc.values() if a.size]
        seeds = min(acc["1.1"].size, acc["2"].size)
        d, low, high = difference_interval(acc["1.1"], acc["2"])
        unreached = int((~row_runs[row_runs.method.isin(["1.1", "2"])].reached.astype(bool)).sum())
        ours = (" / ".join(parts) + f" (n = {', '.join(str(a.size) for a in acc.values() if a.size)} seeds); "
                f"ℓ1.1 − GD {_interval(d, low, high)} points")
        out.append(_Part(f"{L} layers", ours, table1_rule(low, high, seeds, unreached), paper_text))
    if not out:
        raise _Unmeasured("table-1.csv has no rows")
    return out


def _unreached(r: _Results) -> int:
    """Chosen sentiment runs of chapter 04 (ℓ1.1 and GD, every depth) that did not reach the stop rule:
    chapters 05 and 06 analyze these models."""
    runs = r.csv("table-sentiment-runs", ["method", "reached", "chosen"])
    runs = runs[runs.chosen.astype(bool) & runs.method.map(_key).isin(["1.1", "2"])]
    return int((~runs.reached.astype(bool)).sum())


def _tokens(r: _Results):
    unreached = _unreached(r)
    table = r.csv("table-token-selection", ["sentences", "l1.1 wins", "GD wins", "ties"])
    out = []
    for _, row in table[~table.sentences.str.startswith("paper")].iterrows():
        wins, losses, ties = int(row["l1.1 wins"]), int(row["GD wins"]), int(row["ties"])
        ours = f"{wins} / {losses} / {ties} (ℓ1.1 / GD / ties)"
        if wins + losses:
            low, high = wilson_interval(wins, wins + losses)
            ours += f"; win rate {wins / (wins + losses):.1%} [{low:.1%}, {high:.1%}]"
        out.append(_Part(row.sentences, ours, token_rule(wins, losses, unreached)))
    if not out:
        raise _Unmeasured("table-token-selection.csv has no sentence set")
    return out


def _counts(frame: pd.DataFrame, method, group="seed") -> np.ndarray:
    return frame[frame.method == method].groupby(group)["total"].sum().to_numpy(dtype=float)


def _kqv(r: _Results):
    counts = r.csv("table-weights-kqv", ["method", "seed", "K", "Q", "V"])
    counts = counts.assign(method=counts.method.map(_key), total=counts.K + counts.Q + counts.V)
    small, gd = _counts(counts, "1.1"), _counts(counts, "2")
    if not small.size or not gd.size:
        raise _Unmeasured("no ℓ1.1 or GD models")
    d, low, high = difference_interval(small, gd)
    ours = (f"K + Q + V above the scaled threshold: ℓ1.1 {small.mean():.0f}, GD {gd.mean():.0f} "
            f"(n = {small.size}, {gd.size}); ℓ1.1 − GD {_interval(d, low, high, 0)}")
    unreached = _unreached(r)
    unfinished = f"{unreached} sentiment run(s) did not reach the stop rule" if unreached else ""
    return [_Part(None, ours, fewer_rule(low, high, min(small.size, gd.size), small.sum() + gd.sum(), unfinished))]


def _pruning(r: _Results):
    curves = r.csv("fig-pruning", ["method", "seed", "sparsity", "test_accuracy"])
    curves = curves.assign(method=curves.method.map(_key))
    at = curves[np.isclose(curves.sparsity, PRUNE_AT)]
    if at.empty:
        raise _Unmeasured(f"sparsity {PRUNE_AT:g} not measured")
    small = 100 * at[at.method == "1.1"].test_accuracy.to_numpy()
    gd = 100 * at[at.method == "2"].test_accuracy.to_numpy()
    dense = curves[curves.sparsity == 0].groupby("method").test_accuracy.mean()
    if not small.size or not gd.size:
        raise _Unmeasured("no ℓ1.1 or GD models")
    d, low, high = difference_interval(small, gd)
    ours = (f"test accuracy at {PRUNE_AT:.0%} pruned: ℓ1.1 {small.mean():.2f}, GD {gd.mean():.2f} "
            f"(unpruned {100 * dense.get('1.1', math.nan):.2f}, {100 * dense.get('2', math.nan):.2f}; "
            f"n = {small.size}, {gd.size}); ℓ1.1 − GD {_interval(d, low, high)} points")
    return [_Part(None, ours, pruning_rule(low, high, min(small.size, gd.size), _unreached(r)))]


_DATASETS = {"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def _vit_parity(r: _Results):
    history = r.csv("fig-vit-accuracy", ["dataset", "method", "seed", "test_accuracy"])
    table = r.csv("table-vit", ["dataset", "optimizer", "levelled"])
    final = (history.dropna(subset=["test_accuracy"]).groupby(["dataset", "method", "seed"]).test_accuracy.last()
             * 100)
    out = []
    for dataset in final.index.get_level_values("dataset").unique():
        name = _DATASETS.get(dataset, dataset)
        per = final.loc[dataset]
        methods = list(per.index.get_level_values("method").unique())
        if "Adam" not in methods:
            out.append(_Part(name, "no Adam runs", _not_measured("no Adam runs")))
            continue
        adam = per.loc["Adam"].to_numpy()
        seeds = min(per.loc[m].size for m in methods)
        intervals, parts = [], [f"Adam {adam.mean():.2f}"]
        for m in methods:
            if m == "Adam":
                continue
            d, low, high = difference_interval(per.loc[m].to_numpy(), adam)
            intervals.append((low, high))
            parts.append(f"{m}: {_interval(d, low, high)}")
        levelled = _levelled(table, name)
        ours = (f"{name}, final test accuracy (%), MD minus Adam: " + "; ".join(parts)
                + f" (n ≥ {seeds} seeds" + ("" if levelled else "; loss not levelled off") + ")")
        out.append(_Part(name, ours, parity_rule(intervals, seeds, levelled)))
    if not out:
        raise _Unmeasured("fig-vit-accuracy.csv has no runs")
    return out


def _levelled(table: pd.DataFrame, name: str) -> bool:
    """Has every method's training loss levelled off on the data set (chapter 07's rule)?"""
    rows = table[table.dataset == name]
    return not rows.empty and bool(rows.levelled.astype(bool).all())


def _smallest_md(methods) -> str | None:
    """The mirror-descent method ("p = 1.1", ...) of the smallest exponent."""
    ps = {m: float(m.split("=")[1]) for m in methods if str(m).startswith("p =")}
    return min(ps, key=ps.get) if ps else None


def _vit_sparsity(r: _Results):
    counts = r.csv("fig-vit-weights", ["dataset", "method", "seed", "count"]).rename(columns={"count": "total"})
    table = r.csv("table-vit", ["dataset", "levelled"])
    out = []
    for dataset, frame in counts.groupby("dataset", sort=False):
        name = _DATASETS.get(dataset, dataset)
        small = _smallest_md(frame.method.unique())
        if small is None or "Adam" not in set(frame.method):
            out.append(_Part(name, "no Adam or mirror-descent models", _not_measured("no Adam or MD models")))
            continue
        md, adam = _counts(frame, small), _counts(frame, "Adam")
        d, low, high = difference_interval(md, adam)
        ours = (f"{name}, K + Q + V above the scaled threshold: {small} {md.mean():.0f}, Adam {adam.mean():.0f} "
                f"(n = {md.size}, {adam.size}); difference {_interval(d, low, high, 0)}")
        unfinished = "" if _levelled(table, name) else "a training loss had not levelled off"
        out.append(_Part(name, ours, fewer_rule(low, high, min(md.size, adam.size), md.sum() + adam.sum(), unfinished)))
    if not out:
        raise _Unmeasured("fig-vit-weights.csv has no models")
    return out


def _cost(r: _Results):
    table = r.csv("table-cost-training", ["model", "optimizer", "vs Adam (median ratio)", "ci95"])
    out = []
    for model, frame in table.groupby("model", sort=False):
        md = frame[frame.optimizer != "Adam"]
        intervals = [tuple(float(x) for x in str(ci).split("-")) for ci in md.ci95]
        ours = "MD step time / Adam's, median [95 %]: " + "; ".join(
            f"{o.removeprefix('MD ')}: {ratio:.2f} [{low:.2f}, {high:.2f}]"
            for o, ratio, (low, high) in zip(md.optimizer, md["vs Adam (median ratio)"], intervals))
        out.append(_Part(model, ours, cost_rule(intervals)))
    if not out:
        raise _Unmeasured("table-cost-training.csv has no rows")
    return out


CLAIMS = [
    _Claim("E1: each ℓp path approaches its own ℓp attention SVM direction, the nearest of the SVMs",
           "own-SVM divergence → ≈ 0; other SVMs plateau (≈ 0.2 on the p = 3 path); 100 seeds",
           "01_fixed_decoder_paths", "fig-e1-paths", ("fig-e1-paths",), _e1),
    _Claim("E2: ||W(k)|| grows without bound, logarithmically in k (Thm 8)",
           "norm linear in log k", "02_single_instance_path", "fig-e2-norm-growth", ("fig-e2-norm-growth",),
           _e2_norm),
    _Claim("E2: the directional divergence to the SVM decays at least like 1/log k (Thm 11)",
           "O(1 / log k)", "02_single_instance_path", "fig-e2-norm-growth", ("fig-e2-norm-growth",), _e2_rate),
    _Claim("E3: joint training: W and v converge in direction to the attention and decoder SVMs",
           "both directions reach their SVMs (empirical)", "03_joint_training", "table-e3-final",
           ("table-e3-final",), _e3),
    _Claim("Table 1: ℓ1.1 reaches a higher best test accuracy than GD (paper: ℓ1.1 best in every row)",
           "83.47 / 81.66 / 82.57 (L = 3), 83.36 / 81.05 / 82.40 (L = 4), 83.65 / 82.23 / 81.98 (L = 6); "
           "ℓ1.1 − GD 1.81 / 2.31 / 1.43",
           "04_sentiment", "table-1", ("table-1", "table-sentiment-runs"), _table1),
    _Claim("Token selection: ℓ1.1 puts more attention on the pivotal word than GD in more sentences",
           "ℓ1.1 wins 22 of 40, GD 16, 2 ties (57.9 % of non-ties); one model each", "05_token_selection",
           "table-token-selection", ("table-token-selection",), _tokens),
    _Claim("K/Q/V sparsity: ℓ1.1 leaves fewer large key, query and value entries than GD",
           "entries > 0.06, K / Q / V: 18206 / 13964 / 7643 (ℓ1.1) vs 27224 / 14654 / 10127 (GD)",
           "06_weights", "table-weights-kqv", ("table-weights-kqv",), _kqv),
    _Claim("Pruning (new analysis): ℓ1.1 keeps more test accuracy than GD when half the weights are pruned",
           "not in the paper", "06_weights", "fig-pruning", ("fig-pruning",), _pruning),
    _Claim("ViT parity: every optimizer reaches about the same final test accuracy",
           "≈ 82 % (CIFAR-10), ≈ 55 % (CIFAR-100) for Adam and every MD exponent", "07_vision", "table-vit",
           ("fig-vit-accuracy", "table-vit"), _vit_parity),
    _Claim("ViT sparsity: small-p mirror descent leaves fewer large attention weights than Adam",
           "MD weights more concentrated near zero (Fig 12)", "07_vision", "fig-vit-weights",
           ("fig-vit-weights",), _vit_sparsity),
    _Claim("Cost: a mirror-descent step costs about as much as the baseline's",
           "ops per parameter GD 2, MD 10, Adam 14; small time differences between the five methods",
           "08_cost", "table-cost-training", ("table-cost-training",), _cost),
]


def rows(results_dir, *, profile: str | None = None,
         link: Callable[[str, str], str] = reference) -> list[Row]:
    """One ``Row`` per claim (and per depth, sentence set, data set or model within a claim), in the
    paper's order. ``profile`` stands in where no ``<label>.json`` names one."""
    results = _Results(Path(results_dir), profile)
    out = []
    for claim in CLAIMS:
        shown = results.profile_of(claim.csvs[0])
        target = link(claim.notebook, claim.label)
        try:
            built = claim.build(results)
        except _Unmeasured as missing:
            out.append(Row(claim.claim, claim.paper, "–", shown, _not_measured(str(missing)), target))
            continue
        for part in built:
            name = claim.claim if part.part is None else f"{claim.claim} ({part.part})"
            out.append(Row(name, part.paper or claim.paper, part.ours, shown, part.verdict, target))
    return out


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def page(results_dir, *, profile: str | None = None, archive_link: str | None = None,
         link: Callable[[str, str], str] = reference) -> str:
    """The scorecard page (MyST markdown) for the results in ``results_dir``."""
    table = rows(results_dir, profile=profile, link=link)
    lines = [
        "# Scorecard: which claims hold here",
        "",
        "This page is generated by `mdlib.scorecard` from the results (CSV files) of this build; edit the "
        "rules in that module, not this page. Each row is one of the paper's claims, in the paper's order: "
        "the paper's number, ours with its interval or seed count, the profile that produced ours, a verdict "
        "and the figure or table it comes from. A verdict is computed by the rule stated below, never typed: "
        "**holds**, **differs**, **inconclusive** (the interval spans both answers), or **not measured at "
        "this profile** (a result is missing, or the run did not reach the regime the claim is about; the "
        "cell says which). Small profiles (few seeds, short runs, small data) make inconclusive and not "
        "measured verdicts common: they say how sure the book can be, not that the paper is wrong. Our real "
        "data are smaller stand-ins for the paper's (see each chapter), so accuracies are not comparable in "
        "level, only in the direction of a difference.",
    ]
    if archive_link:
        lines += ["", f'Every figure, table and provenance record of this build, in one file: '
                      f'<a href="{archive_link}" download>artifacts.zip</a>.']
    lines += ["", "| Claim | Paper | Ours | Profile | Verdict | Figure / table |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(c) for c in (r.claim, r.paper, r.ours, r.profile, str(r.verdict), r.link)) + " |"
              for r in table]
    lines += ["", "## The verdict rules", ""]
    lines += [f"- **{rule.rule_name}.** {rule.sentence}" for rule in RULES]
    return "\n".join(lines) + "\n"


def write_page(target, results_dir, **kwargs) -> Path:
    """Write ``page(results_dir, **kwargs)`` to ``target`` atomically."""
    text = page(results_dir, **kwargs)
    return atomic_write(Path(target), lambda tmp: tmp.write_text(text, "utf-8"))
