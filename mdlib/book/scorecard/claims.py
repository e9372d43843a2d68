"""The scorecard's claims: each claim's rule applied to a build's results, one :class:`Row` per claim.

``rows(results_dir, profile=...)`` reads the ``<label>.csv`` files a book build wrote (through
``mdlib.book.scorecard.evidence``: only CSVs the pipeline vouches for) and returns one :class:`Row` per
claim, in the paper's order: the paper's number, ours with its interval or seeds, the profile, a verdict
and a link to the figure or table. ``mdlib.book.scorecard.page`` makes the page of them; a chapter prints
its own claims' verdicts (``chapter_rows``, ``verdicts_text``, ``verdicts``).

Each claim is a builder: it reads the claim's tables, takes its number from
``mdlib.experiments.estimates`` (the function its chapter glues, so the chapter and the scorecard show
one computation) and judges it by a rule of ``mdlib.book.scorecard.rules``. A comparative verdict also says
how stable it is: the probability that an independent rebuild of the same design (the same sentences, new
run noise, a step choice made again) reaches it again (``mdlib.experiments.stability``; ``Row.stability``,
``Row.fragile`` below ``STABLE_SHARE``). Every comparative row states the smallest effect its design
detects (``stats.detectable_effect``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
import pandas as pd

from mdlib.book import chapters, provenance
from mdlib.book.scorecard.evidence import Results, Unmeasured, complete
from mdlib.book.scorecard.rules import (COST_BAND, E2_MIN_POINTS, INCONCLUSIVE, KQV_PAPER_REDUCTION, NOT_MEASURED,
                                        PARITY_MARGIN, PRUNE_AT, SMALLER, Effect, Verdict, allocation_rule,
                                        concentration_rule, cost_rule, e1_rule, e2_norm_rule, e2_rate_rule, e3_rule,
                                        interval_rule, not_measured, parity_rule, pruning_rule, series_rule,
                                        sparser_rule, table1_rule, token_rule, weighting_rule)
from mdlib.experiments import estimates, methods, paper, stability
from mdlib.experiments.estimates import Estimate
from mdlib.experiments.stats import seeds_for_half_width

__all__ = ["CLAIMS", "DECOMPOSITION", "FRAGILE", "KQV_PARTS", "Row", "STABLE_SHARE", "Stability", "chapter_rows",
           "rebuild_text", "reference", "rows", "said", "verdicts", "verdicts_text"]


@dataclass(frozen=True)
class Row:
    """One claim: the paper's number, ours, the profile that produced ours, the verdict, the link, and
    the effect behind the verdict (None for a claim that is not a comparison)."""
    claim: str
    paper: str
    ours: str
    profile: str
    verdict: Verdict
    link: str
    effect: Effect | None = None
    short: str = ""  #: the claim's name without its statement, e.g. "Table 1 (3 layers)"
    headline: str = ""  #: ours in a few words (the short table's cell)
    stability: "Stability | None" = None  #: the probability that a rebuild reaches the verdict (None: not checked)

    @property
    def fragile(self) -> bool:
        """Whether an independent rebuild (a seed's numbers differ between machines, and a step choice may
        fall otherwise) would reach another verdict too often to call this one settled."""
        return self.stability is not None and self.stability.probability < STABLE_SHARE

    @property
    def stability_text(self) -> str:
        """How likely an independent rebuild reaches the same verdict, in words ("" where not checked)."""
        return "" if self.stability is None else rebuild_text(self.stability) + (
            f": {FRAGILE}, below {STABLE_SHARE:.2f}" if self.fragile else f"; {FRAGILE} below {STABLE_SHARE:.2f}")


#: A comparative verdict's stability: the probability that an independent rebuild of the same design reaches
#: it again, with its Monte Carlo error (``mdlib.experiments.stability.Agreement``).
Stability = stability.Agreement
FRAGILE = "fragile"  #: the mark of a verdict that a rebuild would too often not reach (``STABLE_SHARE``)
#: The probability of reaching a verdict again that makes it stable: one that an independent rebuild would
#: change once in five times or more is marked fragile, never settled.
STABLE_SHARE = 0.8


def rebuild_text(found: Stability) -> str:
    """A stability in words: "an independent rebuild reaches this verdict with probability 0.87 ± 0.01
    (new run noise, the step choice re-made: another step in 23 % of rebuilds)"."""
    if found.rechosen:
        how = f"new run noise, the step choice re-made: another step in {found.flips:.0%} of rebuilds"
        if found.bound:
            how += ("; the arm was trained at the chosen step only, so a rebuild that chooses another counts as a "
                    "change: a lower bound")
    else:
        how = "new run noise at the same steps and test sentences"
    return (f"an independent rebuild reaches this verdict with probability {'at least ' if found.bound else ''}"
            f"{found.probability:.2f} ± {found.error:.2f} ({how})")


def reference(notebook: str, label: str) -> str:
    """The cell that links a figure or table: a numbered cross-reference to its label (``:name:`` in the
    chapter ``notebook``), which the book renders as "Fig. 1.2" or "Table 4.1" and checks at build time."""
    return f"{{numref}}`{label}`"


# ---------------------------------------------------------------------------------------------
# the claims, in the paper's order. Each builder returns a list of _Part (one per depth, sentence
# set, data set or model; part None when the claim has one row); raising Unmeasured gives one
# "not measured" row. A comparative builder takes its number from mdlib.experiments.estimates, the
# function its chapter glues: the chapter and the scorecard show one computation.


class _Part(NamedTuple):
    part: str | None
    ours: str
    verdict: Verdict
    paper: str | None = None  # instead of the claim's own paper text
    effect: Effect | None = None
    headline: str = ""  # ours in a few words, for the short table (default: ``ours``)
    rebuild: "Callable[[str], Stability | None] | None" = None  # outcome -> its stability (``_stability``)


def _judge(rule: Callable[..., Verdict], *gates) -> stability.Judge:
    """A comparative rule as a function of its interval, every other argument (the gates) held as the build
    found them, over arrays of rebuilt intervals: the outcome of each."""
    def judge(low: np.ndarray, high: np.ndarray) -> np.ndarray:
        return np.array([rule(lo, hi, *gates).outcome for lo, hi in zip(low, high)], dtype=object)
    return judge


def _rebuilt(estimate: Estimate, judge: stability.Judge, bounds=(-math.inf, math.inf)
             ) -> Callable[[str], Stability | None]:
    """A part's stability without a step choice of its own: its interval rebuilt with new seeds
    (``stability.agreement``; None without an interval)."""
    def rebuild(outcome: str) -> Stability | None:
        interval = stability.Interval.of(estimate, bounds)
        return None if interval is None else stability.agreement(interval, judge, outcome)
    return rebuild


@dataclass(frozen=True)
class _Claim:
    claim: str
    paper: str
    label: str  #: the figure or table the row links to, which names its chapter (``chapters.BY_CLAIM``)
    build: Callable

    @property
    def notebook(self) -> str:
        return chapters.BY_CLAIM[self.label]


def _e1(r: Results):
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


def _plain(r: Results) -> pd.DataFrame:
    curves = r.csv("fig-e2-norm-growth", ["p", "step", "norm", "divergence"])
    return curves[curves.method == "plain"]


def _e2_norm(r: Results):
    curves = _plain(r)
    steps = int(curves.step.max())
    slopes = {}
    for p, c in curves.groupby("p"):
        def slope(lo, hi):
            part = c[(c.step >= lo) & (c.step <= hi)]
            return float(np.polyfit(np.log(part.step), part.norm, 1)[0]) if len(part) >= E2_MIN_POINTS else math.nan
        slopes[float(p)] = (slope(steps / 100, steps / 10), slope(steps / 10, steps))
    ours = ("slope of ||W||_p per unit of log k, decade before the last → last: "
            + "; ".join(f"p = {p:g}: {a:.2f} → {b:.2f}" for p, (a, b) in slopes.items()) + f" ({steps} steps)")
    return [_Part(None, ours, e2_norm_rule(slopes, steps))]


def _e2_rate(r: Results):
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


def _e3(r: Results):
    final = r.csv("table-e3-final", ["p", "W_divergence", "v_divergence"])
    ours = "final divergence W / v: " + "; ".join(
        f"p = {p:g}: {w:.1e} / {v:.1e}" for p, w, v in zip(final.p, final.W_divergence, final.v_divergence))
    return [_Part(None, ours, e3_rule([*final.W_divergence, *final.v_divergence]))]


def _chosen_runs(r: Results, grid: str | None = None, extra=()) -> pd.DataFrame:
    """Chapter 04's chosen runs (``table-sentiment-runs``): of one ``grid`` ("replication" or
    "variation"), or, with None, of the grid the chapters that read chapter 04's models analyse. The
    grid is kept before its values are checked, so that a run of the other grid missing a value (a
    diverged one) leaves this grid's claims alone."""
    columns = ["method", "seed", "last_test", "reached", *extra]
    runs = r.csv("table-sentiment-runs", ["grid", "setup", "analysed", "chosen"])
    runs = runs[runs.chosen.astype(bool)]
    runs = complete(runs[runs.analysed.astype(bool)] if grid is None else runs[runs.grid == grid],
                    "table-sentiment-runs", columns)
    return runs.assign(method=estimates.keyed(runs.method))


def _predictions(r: Results, grid: str) -> pd.DataFrame:
    """Every chosen run's prediction on every test sentence (``table-sentiment-predictions``) of ``grid``
    ("replication", "variation" or "allocation")."""
    table = r.csv("table-sentiment-predictions", ["grid", "layers", "method", "seed", "example", "correct"])
    table = table[table.grid == grid]
    return table.assign(method=estimates.keyed(table.method))


def _baseline(r: Results) -> float:
    """The bag-of-words Naive Bayes test accuracy, from chapter 04's baseline table."""
    table = r.csv("table-sentiment-baseline", ["baseline", "test_accuracy"])
    return float(table[table.baseline == "naive_bayes"].test_accuracy.iloc[0])  # a row the schema requires


#: How the forest plot names the paper's effect drawn beside a variation's: its own setup's number.
AUTHORS_SETUP = "paper, authors' setup (IMDb)"


def _effect(e: Estimate, unit: str, null=(0.0, 0.0), direction=1, paper=math.nan, paper_label: str = "paper") -> Effect:
    return Effect(e.value, e.low, e.high, null, direction, unit, paper, e.detectable, paper_label)


def _headline(e: Estimate, unit: str, digits: int = 2) -> str:
    """A comparison as the scorecard's short table shows it: the estimate, its interval and the seeds."""
    return f"{e.text(digits)}{unit} (n = {e.n})"


def _accuracy_gap(runs: pd.DataFrame, gap: Estimate, name: str, paper_text: str | None, baseline: float,
                  paper_gap: float, edges: str = "", paper_label: str = "paper", cell: pd.DataFrame | None = None
                  ) -> _Part:
    means = runs.groupby("method").last_test.mean()
    best = runs.groupby("method").best_test.mean() if "best_test" in runs else None
    shown = [k for k in methods.PAPER_PS if k in means]
    seeds = runs.groupby("method").seed.nunique()
    ours = (f"test accuracy at the stop rule {' / '.join(f'{100 * means[k]:.2f}' for k in shown)} % "
            f"({' / '.join(_method(k) for k in shown)}; seeds {' / '.join(str(seeds[k]) for k in shown)}); "
            f"ℓ1.1 − GD {gap.both_text()} points (paired by seed, n = {gap.n})")
    if best is not None:
        ours += "; best over epochs " + " / ".join(f"{100 * best[k]:.2f}" for k in shown if k in best)
    ours += f"; baseline {100 * baseline:.1f} %" + (f"; step choice at its grid's edge: {edges}" if edges else "")
    gates = (gap.n, estimates.unreached(runs), estimates.below_floor(runs, baseline), paper_gap)
    verdict = table1_rule(gap.low, gap.high, *gates)
    rebuild = _chosen_again(cell, gap, _judge(table1_rule, *gates), *estimates.COMPARED) if cell is not None else None
    return _Part(name, ours, verdict, paper_text, _effect(gap, "points of test accuracy, ℓ1.1 − GD", paper=paper_gap,
                                                          paper_label=paper_label), _headline(gap, " points"), rebuild)


def _chosen_again(cell: pd.DataFrame, gap: Estimate, judge: stability.Judge, first: str, second: str,
                  arms: "Callable[[], pd.DataFrame] | None" = None) -> Callable[[str], Stability | None]:
    """A chapter 04 comparison's stability with its steps chosen again (``stability.choice_agreement``):
    ``cell``, every run of the grid's depth (``table-sentiment-runs``, every candidate step; methods keyed);
    ``arms()``, the 2 x 2's arms' runs, each following the choice of the method its steps are matched to
    (an arm key "a@b" follows b's). The example part of ``gap``'s interval is held for every pair."""
    def rebuild(outcome: str) -> Stability | None:
        interval = stability.Interval.of(gap)
        if interval is None:
            return None
        follows = {x: x.partition("@")[2] for x in (first, second) if "@" in x}
        frame = cell if arms is None else pd.concat([cell, arms()], ignore_index=True)
        choosing = _choosing(cell)
        runs = _procedure(frame, choosing, {first, second, *follows.values()})
        return stability.choice_agreement(runs, first, second, judge, outcome, example_var=interval.example_var,
                                          choosing=choosing, follows=follows)
    return rebuild


def _procedure(frame: pd.DataFrame, choosing: Mapping[str, stability.Choosing], arms: set[str]) -> stability.Runs:
    """The runs of ``arms`` a rebuild of a chapter 04 comparison draws from: ``frame``'s rows of every
    candidate of an arm whose step is chosen (``choosing``), the chosen runs of the others; accuracies in
    points."""
    frame = frame[frame.method.isin(arms) & (frame.method.isin(choosing) | frame.chosen.astype(bool))]
    return stability.Runs(list(frame.method), list(frame.multiple.astype(float)), list(frame.seed.astype(int)),
                          list(100 * frame.last_test.astype(float)), list(100 * frame.validation.astype(float)))


def _long_runs(r: Results, part: str | None = None) -> pd.DataFrame:
    """The long build's runs (``table-sentiment-overnight-runs``; only ``part``'s when given), methods keyed;
    a diverged run has no accuracies, which the rebuild's model leaves out."""
    table = r.csv("table-sentiment-overnight-runs", ["part", "embedding_std", "method", "multiple", "seed", "chosen"])
    table = table if part is None else table[table.part == part]
    return table.assign(method=table.method.map(estimates.key_of))


def _choosing(cell: pd.DataFrame) -> dict[str, stability.Choosing]:
    """How each method of a grid's depth with several candidate steps chose one (``sentiment.choose``): its
    candidates, the chosen one, the sweep's seeds (those of the candidates not chosen) and which candidates
    may be chosen (no sweep run diverged) and rank first (every sweep run reached the stop rule)."""
    out = {}
    for key, part in cell.assign(multiple=cell.multiple.astype(float)).groupby("method", sort=False):
        values = sorted(set(part.multiple))
        chosen = set(part.multiple[part.chosen.astype(bool)])
        if len(values) < 2 or len(chosen) != 1:
            continue
        value = chosen.pop()
        seeds = tuple(sorted(int(s) for s in set(part.seed[part.multiple != value])))
        sweep = part[part.seed.isin(seeds)]
        out[key] = stability.Choosing(
            tuple(values), value, seeds,
            tuple(not sweep.diverged[sweep.multiple == v].astype(bool).any() for v in values),
            tuple(bool(sweep.reached[sweep.multiple == v].astype(bool).all()) for v in values))
    return out


def _method(key: str) -> str:
    return methods.key_text(key)


def _embedding_step(r: Results, setup: str) -> str:
    """ℓ1.1's first-order embedding step over GD's in ``setup`` (chapter 04's effective-step table), in
    words; "" when the table has no such row."""
    try:
        steps = r.csv("table-sentiment-effective-steps", ["setup", "method", "group", "vs_gd"])
    except Unmeasured:
        return ""
    row = steps[(steps.setup == setup) & (steps.method.map(estimates.key_of) == methods.L1_1) & (steps.group == "embeddings")]
    return f"ℓ1.1's embedding step {row.vs_gd.iloc[0]:.2g}× GD's" if len(row) else ""


def _table1_rows(r: Results, grid: str) -> list[_Part]:
    """One row per depth of one of chapter 04's grids: ℓ1.1 − GD over seeds and test sentences."""
    runs = _chosen_runs(r, grid, extra=("layers", "best_test"))
    if runs.empty:
        raise Unmeasured(f"no {grid} runs at this profile")
    baseline = _baseline(r)
    gaps = estimates.accuracy_gaps(runs, predictions=_predictions(r, grid))
    setup = paper.SETUP_NAMES.get(str(runs.setup.iloc[0]), str(runs.setup.iloc[0]))
    sweep = r.csv("table-sentiment-runs", ["grid", "layers", "method", "multiple", "chosen"])
    sweep = sweep[sweep.grid == grid].assign(method=lambda t: t.method.map(estimates.key_of))
    edges = estimates.edges_text(sweep)
    step = _embedding_step(r, setup) if grid != "replication" else ""
    out = []
    for L in sorted(runs.layers.unique()):
        reported = paper.TABLE_1.get(int(L), {})
        gap = paper.TABLE_1_GAPS.get(int(L), math.nan)
        paper_text = (" / ".join(f"{reported.get(k, math.nan):.2f}" for k in methods.PAPER_PS)
                      + f" (ℓ1.1 / GD / ℓ3); ℓ1.1 − GD {estimates.number_text(gap)} points"
                      + ("" if grid == "replication" else " (IMDb, the authors' setup: not this variation's claim)"))
        name = f"{L} layers" if grid == "replication" else f"{setup}, {L} layers" + (f"; {step}" if step else "")
        row_runs = runs[runs.layers == L]
        if not set(estimates.COMPARED) <= set(row_runs.method):
            out.append(_Part(name, "no ℓ1.1 or GD runs", not_measured("no ℓ1.1 or GD runs"), paper_text))
            continue
        out.append(_accuracy_gap(row_runs, gaps[int(L)], name, paper_text, baseline, gap, edges,
                                 "paper" if grid == "replication" else AUTHORS_SETUP, sweep[sweep.layers == L]))
    return out


def _table1(r: Results):
    r.csv("table-1", ["setup", "layers", "method"])  # vouched for with the runs: one execution of chapter 04
    return _table1_rows(r, "replication")


def _variation(r: Results):
    """The variation's ℓ1.1 − GD (``_table1_rows``), its verdict qualified by the verdicts at every pair of
    steps tied with the choices (``table-sentiment-tied``, the long build's runs of every seed at each):
    "not settled" where one of them reads otherwise, or where a choice tied and the table is not measured."""
    r.csv("table-1-variation", ["setup", "layers", "method"])
    rows = _table1_rows(r, "variation")
    runs = r.csv("table-sentiment-runs", ["grid", "layers", "method", "multiple", "tied"])
    tied = runs[(runs.grid == "variation") & runs.tied.astype(bool)]
    ties = bool(tied.groupby(["layers", "method"]).multiple.nunique().gt(1).any())
    return [part._replace(verdict=_settled(r, part.verdict, "table-sentiment-tied", {}, ties)) for part in rows]


def _settled(r: Results, verdict: Verdict, label: str, where: Mapping[str, Any], ties: bool = True) -> Verdict:
    """``verdict`` qualified by the same rule's verdicts at every combination of tied steps of ``label``'s
    rows matching ``where`` (value, low, high, n per combination; the gates are the judged row's, so only
    the interval can differ): "holds at all k tied pairs", or "not settled" naming one that reads otherwise;
    where ``label`` is not measured, "not settled" when a choice ``ties`` with another step, else no
    qualifier; none where the table has no rows at ``where``."""
    if verdict.outcome in (NOT_MEASURED,):
        return verdict
    try:
        table = r.csv(label, [])
    except Unmeasured:
        return replace(verdict, why=(verdict.why + "; " if verdict.why else "") + "not settled: a chosen step ties with "
                       "another on validation and the verdict was not measured at the tied steps") if ties else verdict
    if "value" not in table:
        return replace(verdict, why=(verdict.why + "; " if verdict.why else "") + "its tied steps not measured")
    for key, value in where.items():
        table = table[np.isclose(table[key], value)] if table[key].dtype.kind == "f" else table[table[key] == value]
    if table.empty:
        return verdict
    steps = [c for c in table.columns if c.startswith("multiple_")]
    other = [row for _, row in table.iterrows()
             if interval_rule(row.low, row.high).outcome not in (verdict.outcome,)
             and not (verdict.outcome == SMALLER and interval_rule(row.low, row.high).outcome == INCONCLUSIVE)]
    if not other:
        qualifier = f"holds at all {len(table)} pairs of tied steps"
    else:
        row = other[0]
        at = "; ".join(f"{methods.arm_text(c.removeprefix('multiple_'))} {estimates.multiple_text(row[c])}"
                       for c in steps if row[c] == row[c])  # a column of the other contrast's arm is empty
        qualifier = (f"not settled: at the tied steps {at} the interval [{row.low:+.2f}, {row.high:+.2f}] reads "
                     f"{interval_rule(row.low, row.high).outcome} ({len(other)} of {len(table)} tied pairs read "
                     "otherwise)")
    return replace(verdict, why=(verdict.why + "; " if verdict.why else "") + qualifier)


#: The 2 x 2's judged contrasts (``estimates.CONTRASTS``: geometry at GD's allocation, allocation at GD's
#: geometry) and how the scorecard names them (chapter 04's sentences find their rows by these names).
DECOMPOSITION = {"geometry": ("geometry", "ℓ1.1 at GD's steps per tensor − GD"),
                 "allocation": ("initial step allocation", "GD at ℓ1.1's steps per tensor − GD")}


def _allocation(r: Results):
    """Chapter 04's 2 x 2 at each embedding scale it ran at: the geometry and the allocation effects, each
    against GD at its chosen global step, judged against zero over seeds and test sentences, as the
    chapter computed them (``table-sentiment-contrasts``), the gates from the 2 x 2's chosen runs
    (``table-sentiment-allocation``)."""
    runs = r.csv("table-sentiment-allocation", ["embedding_std", "layers", "method", "steps", "seed", "reached"])
    runs = runs.assign(method=runs.method.map(estimates.key_of))
    contrasts = r.csv("table-sentiment-contrasts", ["embedding_std", "contrast", "n", "value"])
    baseline = _baseline(r)
    out = []
    for std in sorted(set(contrasts.embedding_std)):
        at = runs[np.isclose(runs.embedding_std, std)]
        L = int(at.layers.iloc[0])
        for name, (factor, contrast) in DECOMPOSITION.items():
            row = contrasts[np.isclose(contrasts.embedding_std, std) & (contrasts.contrast == name)].iloc[0]
            gap = Estimate(row.value, row.low, row.high, int(row.n), row.get("detectable", math.nan),
                           row.get("sd", math.nan), row.get("seeds_low", math.nan), row.get("seeds_high", math.nan))
            arms = list(estimates.CONTRASTS[name])
            pair = at[at.method.isin(arms)]
            means = pair.groupby("method").last_test.mean()
            ours = (f"test accuracy at the stop rule {100 * means.get(arms[0], math.nan):.2f} % (the arm) against "
                    f"{100 * means.get(arms[1], math.nan):.2f} % (GD); arm − GD {gap.both_text()} points (paired by "
                    f"seed, n = {gap.n}; embeddings N(0, {std:g}²), {L} layers)")
            gates = (gap.n, estimates.unreached(pair, tuple(arms)), estimates.below_floor(pair, baseline,
                                                                                          compared=tuple(arms)))
            verdict = _settled(r, allocation_rule(gap.low, gap.high, *gates), "table-sentiment-tied-2x2",
                               {"embedding_std": std, "contrast": name})
            out.append(_Part(f"{factor} at σ {std:g}, {contrast}", ours, verdict,
                             "no such experiment: the paper compares one global step per method",
                             _effect(gap, f"points, {factor}: {contrast}"), _headline(gap, " points"),
                             _two_again(r, std, gap, _judge(allocation_rule, *gates), *arms)))
    if not out:
        raise Unmeasured("no 2 x 2 at this profile")
    return out


def _two_again(r: Results, std: float, gap: Estimate, judge: stability.Judge, arm: str, base: str
               ) -> Callable[[str], Stability | None]:
    """``_chosen_again`` for a contrast of the 2 x 2 at embedding std ``std``: the long build's runs there
    (``table-sentiment-overnight-runs``: the series' ℓ1.1 and GD at every candidate step, the arms at every
    candidate multiplier; read when the stability is computed), each step chosen again, an arm's matched
    steps following the method they are matched to."""
    def rebuild(outcome: str) -> Stability | None:
        table = _long_runs(r)
        return _chosen_again(table[np.isclose(table.embedding_std, std)], gap, judge, arm, base)(outcome)
    return rebuild


def _series(r: Results):
    """Chapter 04's embedding-scale series at the level its design randomizes (the std): the slope of
    ℓ1.1 − GD per tenfold embedding std over the stds whose chosen runs all reached the stop rule
    (``table-sentiment-series``, ``estimates.scale_trend``), judged against zero."""
    points = r.csv("table-sentiment-series", ["embedding_std", "reached", "value", "low", "high"])
    trend = estimates.scale_trend(points)
    kept = points[points.reached.astype(bool)]
    sides = {side: [f"{x:g}" for x, lo, hi in zip(kept.embedding_std, kept.low, kept.high)
                    if (hi < 0 if side == "GD" else lo > 0)] for side in ("GD", "ℓ1.1")}
    ours = (f"ℓ1.1 − GD {trend.text()} points per tenfold std over {trend.n} stds at the stop rule "
            f"(t on {max(trend.n - 2, 0)} degrees of freedom); ahead, interval excluding zero: "
            + "; ".join(f"{side} at σ {', '.join(stds)}" for side, stds in sides.items() if stds) if len(kept) else
            "no std at the stop rule")
    if not any(sides.values()):
        ours += "none"
    verdict = series_rule(trend.low, trend.high, trend.n)
    stds = list(kept.embedding_std.astype(float))

    def rebuild(outcome: str) -> Stability | None:
        """Each std's runs drawn again with its steps chosen again, the slope refitted
        (``stability.slope_agreement``)."""
        table = _long_runs(r, "series")
        cells = []
        for std in stds:
            cell = table[np.isclose(table.embedding_std, std)]
            if not set(estimates.COMPARED) <= set(cell.method[cell.chosen.astype(bool)]):
                return None  # the series table has this std, the long build's runs do not
            choosing = _choosing(cell)
            cells.append((_procedure(cell, choosing, set(estimates.COMPARED)), choosing))
        return stability.slope_agreement(cells, stds, *estimates.COMPARED, _judge(series_rule, trend.n), outcome)
    return [_Part(None, ours, verdict, "no such experiment: the paper fixes the embeddings at N(0, 1)",
                  _effect(trend, "points per tenfold std, ℓ1.1 − GD"), _headline(trend, " points per tenfold std"),
                  rebuild)]


def _sentiment_gates(r: Results) -> tuple[int, str, str]:
    """(unreached runs, why the models do not generalize, their setup's name) of the chapter 04 grid that
    the later sentiment chapters analyse."""
    runs = _chosen_runs(r, extra=("layers",))
    if runs.empty:
        raise Unmeasured("table-sentiment-runs.csv marks no grid as the one the later chapters analyse")
    setup = paper.SETUP_NAMES.get(str(runs.setup.iloc[0]), str(runs.setup.iloc[0]))
    return (estimates.unreached(runs), estimates.below_floor(runs, _baseline(r), by=("layers", "method")), setup)


def _tokens(r: Results):
    unreached, below, setup = _sentiment_gates(r)
    table = r.csv("table-token-selection-sentences", ["sentences", "seed", "sentence", "wins", "losses", "ties"])
    paper_rate = paper.token_win_rate()
    out = []
    for sentences, part in table.groupby("sentences", sort=False):
        ours = (f"{int(part.wins.sum())} / {int(part.losses.sum())} / {int(part.ties.sum())} (ℓ1.1 / GD / ties, "
                f"{part.seed.nunique()} seeds; models: {setup})")
        rate = estimates.win_rate(part)
        if rate.n == 0:
            out.append(_Part(sentences, ours, not_measured("no non-tied comparison")))
            continue
        shown = rate.both_text(1, 100, sign=False, suffix="%")
        ours += f"; ℓ1.1's win rate, mean of the seeds {shown}"
        gates = (rate.n, unreached, below, paper_rate)
        out.append(_Part(sentences, ours, token_rule(rate.low, rate.high, *gates),
                         effect=_effect(rate, "ℓ1.1's win rate", (0.5, 0.5), paper=paper_rate),
                         headline=f"win rate {rate.text(1, 100, sign=False, suffix='%')} (n = {rate.n} seeds)",
                         rebuild=_rebuilt(rate, _judge(token_rule, *gates), (0.0, 1.0))))
    if not out:
        raise Unmeasured("table-token-selection-seeds.csv has no sentence set")
    return out


def _concentration(r: Results):
    unreached, _, setup = _sentiment_gates(r)
    table = r.csv("table-token-concentration", ["method", "seed", "entropy", "top_share"])
    table = table.assign(method=table.method.map(estimates.key_of))
    means = table.groupby("method")[["entropy", "top_share"]].mean()
    if not set(estimates.COMPARED) <= set(means.index):
        raise Unmeasured("no ℓ1.1 or GD models")
    gap = estimates.entropy_gap(table)
    ours = (f"normalized entropy of the [CLS] row ℓ1.1 {means.entropy[methods.L1_1]:.3f}, GD "
            f"{means.entropy[methods.GD]:.3f}; top-token share {means.top_share[methods.L1_1]:.3f}, "
            f"{means.top_share[methods.GD]:.3f}; GD − ℓ1.1 entropy "
            f"{gap.text(3)} (paired, n = {gap.n}; models: {setup})")
    return [_Part(None, ours, concentration_rule(gap.low, gap.high, gap.n, unreached),
                  effect=_effect(gap, "entropy, GD − ℓ1.1"), headline=_headline(gap, " entropy (GD − ℓ1.1)", 3),
                  rebuild=_rebuilt(gap, _judge(concentration_rule, gap.n, unreached)))]


def _kqv(r: Results):
    """K/Q/V: ℓ1.1 against GD, and ℓ1.1 against its own init-weighting null (``_weighting_part``)."""
    change = r.csv("table-weights-change", ["method", "seed", "effective_density"])
    change = change.assign(method=change.method.map(estimates.key_of))
    density = change.groupby("method").effective_density.mean()
    if not set(estimates.COMPARED) <= set(density.index):
        raise Unmeasured("no ℓ1.1 or GD models")
    gap = estimates.density_gap(change)
    paper_effect = KQV_PAPER_REDUCTION * density[methods.GD]
    unreached, _, setup = _sentiment_gates(r)
    ours = (f"effective density of ΔW: ℓ1.1 {density[methods.L1_1]:.3f}, GD {density[methods.GD]:.3f}; ℓ1.1 − GD "
            f"{gap.text(3)} (paired, n = {gap.n}; models: {setup}); the paper's {-100 * KQV_PAPER_REDUCTION:.0f} % "
            f"reduction here: {estimates.number_text(paper_effect, 3)}")
    counts = r.csv("table-weights-kqv", ["method", "seed", "K", "Q", "V"])
    counts = counts.assign(method=counts.method.map(estimates.key_of), total=counts.K + counts.Q + counts.V)
    totals = counts.groupby("method").total.mean()
    if set(estimates.COMPARED) <= set(totals.index):
        ours += (f"; K + Q + V above the scaled threshold (not judged): ℓ1.1 {totals[methods.L1_1]:.0f}, "
                 f"GD {totals[methods.GD]:.0f}")
    unfinished = f"{unreached} sentiment run(s) did not reach the stop rule" if unreached else ""
    gates = (gap.n, unfinished, paper_effect)
    return [_Part(KQV_PARTS["gd"], ours, sparser_rule(gap.low, gap.high, *gates),
                  effect=_effect(gap, "effective density, ℓ1.1 − GD", direction=-1, paper=paper_effect),
                  headline=_headline(gap, " density (ℓ1.1 − GD)", 3), rebuild=_rebuilt(gap, _judge(sparser_rule, *gates))),
            _weighting_part(change, unfinished, setup)]


#: The K/Q/V claim's rows: ℓ1.1 against GD, and against its own init-weighting null.
KQV_PARTS = {"gd": "against GD", "null": "against its init-weighting null"}
#: What the paper says on the init-weighting null's scale.
_NULL_PAPER = ("no such control: the paper's counts compare ℓ1.1's weights with GD's; its "
               f"{-100 * KQV_PAPER_REDUCTION:.0f} % fewer entries above 0.06 read as the same relative reduction "
               "of the null's density")


def _weighting_part(change: pd.DataFrame, unfinished: str, setup: str) -> _Part:
    """ℓ1.1's ΔW against its own init-weighting null (``estimates.weighting_gap``), judged by ``weighting_rule``;
    the dual change and the weighting's density beside it (not judged)."""
    name, column = KQV_PARTS["null"], estimates.WEIGHTING_NULL
    own = change[change.method == methods.L1_1]
    if column not in change or own[column].isna().all():
        why = f"table-weights-change.csv has no init-weighting null ({column}): a build from before it was measured"
        return _Part(name, "the init-weighting null is not measured", not_measured(why), _NULL_PAPER)
    gap = estimates.weighting_gap(change)
    null = float(own[column].mean())
    paper_effect = KQV_PAPER_REDUCTION * null
    ours = (f"effective density of ℓ1.1's ΔW {own.effective_density.mean():.3f}, of its init-weighting null "
            f"{null:.3f} (the same models' ΔW with the dual change replaced by unstructured noise at each matrix's "
            f"scale); ΔW − null {gap.text(3)} (paired, n = {gap.n}; models: {setup}); the paper's "
            f"{-100 * KQV_PAPER_REDUCTION:.0f} % reduction of the null here: {estimates.number_text(paper_effect, 3)}")
    if {"dual_density", "weighting_density"} <= set(change) and own.dual_density.notna().any():
        dual = estimates.density_gap(change, methods.GD, "dual_density")
        ours += (f"; not judged: ℓ1.1's dual change m(W) − m(W(0)) has density {own.dual_density.mean():.3f} "
                 f"(unstructured Gaussian noise: {2 / math.pi:.3f}; ℓ1.1 − GD's ΔW {dual.text(3)}, paired), its "
                 f"weighting |W(0)|^0.9 {own.weighting_density.mean():.3f}")
    gates = (gap.n, unfinished, paper_effect)
    return _Part(name, ours, weighting_rule(gap.low, gap.high, *gates), _NULL_PAPER,
                 _effect(gap, "effective density, ℓ1.1's ΔW − its init-weighting null", direction=-1, paper=paper_effect),
                 _headline(gap, " density (ℓ1.1's ΔW − its null)", 3), _rebuilt(gap, _judge(weighting_rule, *gates)))


def _null_text(change: pd.DataFrame, baseline: str, name: str) -> tuple[str, str]:
    """ℓ1.1's sparsity against its null, the weighting of the dual change by |W(0)|^0.9 (``sparsity.change_table``):
    the words for the row, and the verdict's clause on whether the change is sparser beyond it ("" when the
    table lacks the dual densities)."""
    if "dual_density" not in change or change.dual_density.isna().all():
        return "the dual change is not measured", ""
    dual = estimates.density_gap(change, baseline, "dual_density")
    means = change.groupby("method")[["dual_density", "weighting_density"]].mean()
    predicted = means.weighting_density[methods.L1_1] * change[change.method == baseline].effective_density.mean()
    if dual.low != dual.low:
        beyond = "beyond the init weighting: not measured (the dual change has no interval)"
    elif dual.high < 0:
        beyond = f"sparser beyond the init weighting: ℓ1.1's dual change is sparser than {name}'s too"
    else:
        beyond = (f"not sparser beyond the init weighting: ℓ1.1's dual change is not shown sparser than {name}'s, so "
                  "the weighting by the initial magnitudes may account for the sparser ΔW")
    return (f"against the null: ℓ1.1's dual change m(W) − m(W(0)) has density {means.dual_density[methods.L1_1]:.3f} "
            f"(ℓ1.1 − {name} {dual.text(3)}, paired), its weighting |W(0)|^0.9 {means.weighting_density[methods.L1_1]:.3f}; "
            f"the init weighting alone predicts ℓ1.1's ΔW density {predicted:.3f} ({name}'s ΔW density × ℓ1.1's "
            "weighting)"), beyond


def _pruning(r: Results):
    curves = r.csv("fig-pruning", ["method", "seed", "sparsity", "test_accuracy"])
    curves = curves.assign(method=curves.method.map(estimates.key_of))
    at = curves[np.isclose(curves.sparsity, PRUNE_AT)]
    if at.empty:
        raise Unmeasured(f"sparsity {PRUNE_AT:g} not measured")
    kept = at.groupby("method").test_accuracy.mean()
    dense = curves[curves.sparsity == 0].groupby("method").test_accuracy.mean()
    if not set(estimates.COMPARED) <= set(kept.index):
        raise Unmeasured("no ℓ1.1 or GD models")
    gap = estimates.pruned_gap(curves, PRUNE_AT)
    unreached, below, setup = _sentiment_gates(r)
    unpruned = [100 * dense.get(k, math.nan) for k in estimates.COMPARED]
    ours = (f"test accuracy with {PRUNE_AT:.0%} of the matrices pruned: ℓ1.1 {100 * kept[methods.L1_1]:.2f}, GD "
            f"{100 * kept[methods.GD]:.2f} (unpruned {unpruned[0]:.2f}, {unpruned[1]:.2f}); ℓ1.1 − GD {gap.text()} points "
            f"(paired, n = {gap.n}; models: {setup})")
    return [_Part(None, ours, pruning_rule(gap.low, gap.high, gap.n, unreached, below),
                  effect=_effect(gap, "points of test accuracy, ℓ1.1 − GD"), headline=_headline(gap, " points"),
                  rebuild=_rebuilt(gap, _judge(pruning_rule, gap.n, unreached, below)))]


def _parity_power(gap: Estimate) -> str:
    """What a parity interval can say: its half-width against the margin, and the seeds that would put
    the interval inside ±PARITY_MARGIN at this spread and estimate."""
    if gap.low != gap.low:
        return "no interval"
    half = (gap.high - gap.low) / 2
    room = PARITY_MARGIN - abs(gap.value)
    if room <= 0:
        return f"half-width {half:.2f}; the estimate lies outside ±{PARITY_MARGIN:g}: no number of seeds shows parity"
    return f"half-width {half:.2f}; ±{PARITY_MARGIN:g} would need n ≥ {seeds_for_half_width(gap.sd, room)} seeds here"


def _vit_parity(r: Results):
    history = r.csv("fig-vit-accuracy", ["dataset", "key", "method", "seed", "epoch"])
    table = r.csv("table-vit", ["dataset", "optimizer", "levelled"])
    last = complete(history.loc[history.groupby(["dataset", "key", "seed"]).epoch.idxmax()], "fig-vit-accuracy",
                    ["test_accuracy"])  # training evaluates after the last epoch
    final = last.assign(points=100 * last.test_accuracy)
    lost = r.csv("table-vit-diverged", ["dataset", "method", "seed"])  # final runs mirror descent refused
    lost = lost.assign(key=lost.method.map(estimates.key_of),
                       points=[100 / methods.DATASET_CLASSES[d] for d in lost.dataset])
    out = []
    for dataset, frame in pd.concat([final, lost], ignore_index=True).groupby("dataset", sort=False):
        name = methods.dataset_text(dataset)
        finished = frame[frame.test_accuracy.notna()]
        shown = {k: methods.arm_text(k) for k in frame.key} | dict(zip(finished.key, finished.method))  # key -> name
        diverged = len(frame) - len(finished)
        if methods.ADAM not in shown:
            out.append(_Part(name, "no Adam runs", not_measured("no Adam runs")))
            continue
        gaps = estimates.parity_gaps(frame)
        parts = [f"{shown[methods.ADAM]} {frame[frame.key == methods.ADAM].points.mean():.2f}"]
        parts += [f"{shown[key]}: {gap.text()} ({_parity_power(gap)})" for key, gap in gaps.items()]
        levelled = _levelled(table, name)
        seeds = min((g.n for g in gaps.values()), default=0)
        ours = (f"{name}, final test accuracy (%), MD minus Adam, paired by seed: " + "; ".join(parts)
                + f" (n ≥ {seeds} seeds" + ("" if levelled else "; loss not levelled off")
                + (f"; {diverged} final run(s) diverged, paired at chance accuracy, "
                   f"{100 / methods.DATASET_CLASSES[dataset]:g} %" if diverged else "") + ")")
        worst = max(gaps.values(), key=lambda g: max(abs(g.low), abs(g.high)) if g.low == g.low else math.inf,
                    default=estimates.NONE)
        out.append(_Part(name, ours, parity_rule([(g.low, g.high) for g in gaps.values()], seeds, levelled),
                         effect=_effect(worst, "points, MD − Adam (the widest)", (-PARITY_MARGIN, PARITY_MARGIN), 0),
                         headline=f"widest MD − Adam {worst.text()} points (n = {seeds})",
                         rebuild=_parity_again(list(gaps.values()), seeds, levelled)))
    if not out:
        raise Unmeasured("fig-vit-accuracy.csv has no runs")
    return out


def _parity_again(gaps: list[Estimate], seeds: int, levelled: bool) -> Callable[[str], Stability | None]:
    """Parity's stability: every MD − Adam interval rebuilt with new seeds, each independently (they share
    Adam's runs: a simplification), judged together by ``parity_rule``."""
    def judge(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
        return np.array([parity_rule(list(zip(low, high)), seeds, levelled).outcome for low, high in zip(lows.T, highs.T)],
                        dtype=object)

    def rebuild(outcome: str) -> Stability | None:
        intervals = [stability.Interval.of(g) for g in gaps]
        return None if not intervals or None in intervals else stability.agreement(intervals, judge, outcome)
    return rebuild


def _levelled(table: pd.DataFrame, name: str) -> bool:
    """Has every method's training loss levelled off on the data set (chapter 07's rule)?"""
    rows = table[table.dataset == name]
    return not rows.empty and bool(rows.levelled.astype(bool).all())


def _vit_sparsity(r: Results):
    change = r.csv("table-vit-change", ["steps", "dataset", "method", "seed", "effective_density", "levelled"])
    change = change.assign(method=change.method.map(estimates.key_of))
    counts = r.csv("fig-vit-weights", ["dataset", "key", "seed", "count"])
    out = []
    for (steps, dataset), frame in change.groupby(["steps", "dataset"], sort=False):
        name = f"{methods.dataset_text(dataset)}, {steps} step sizes"
        if not {methods.L1_1, methods.ADAM} <= set(frame.method):
            out.append(_Part(name, "no Adam or ℓ1.1 models", not_measured("no Adam or ℓ1.1 models")))
            continue
        gap = estimates.density_gap(frame, methods.ADAM)
        density = frame.groupby("method").effective_density.mean()
        lrs = frame.groupby("method").lr.first()
        null, beyond = _null_text(frame, methods.ADAM, "Adam")
        ours = (f"effective density of ΔW, ℓ1.1 (lr {lrs[methods.L1_1]:g}) {density[methods.L1_1]:.3f}, Adam "
                f"(lr {lrs[methods.ADAM]:g}) {density[methods.ADAM]:.3f}; ℓ1.1 − Adam {gap.text(3)} (paired, "
                f"n = {gap.n}); {null}")
        if steps == "swept":
            raw = counts[counts.dataset == dataset].groupby("key")["count"].sum() / max(1, counts.seed.nunique())
            if {methods.L1_1, methods.ADAM} <= set(raw.index):
                ours += (f"; K + Q + V above the scaled threshold (not judged): ℓ1.1 {raw[methods.L1_1]:.0f}, "
                         f"Adam {raw[methods.ADAM]:.0f}")
        unfinished = "" if frame.levelled.astype(bool).all() else "a training loss had not levelled off"
        out.append(_Part(name, ours, sparser_rule(gap.low, gap.high, gap.n, unfinished, beyond=beyond),
                         effect=_effect(gap, "effective density, ℓ1.1 − Adam", direction=-1),
                         headline=_headline(gap, " density (ℓ1.1 − Adam)", 3),
                         rebuild=_rebuilt(gap, _judge(sparser_rule, gap.n, unfinished, math.nan, beyond))))
    if not out:
        raise Unmeasured("table-vit-change.csv has no models")
    return out


def _cost(r: Results):
    table = r.csv("table-cost-training", ["model", "method", "vs Adam (median ratio)", "ci_low", "ci_high"])
    table = table.assign(method=table.method.map(estimates.key_of))
    out = []
    for model, frame in table.groupby("model", sort=False):
        md = frame[frame.method != methods.ADAM]
        intervals = list(zip(md.ci_low, md.ci_high))
        ours = "MD step time / Adam's, median [95 %]: " + "; ".join(
            f"{_method(key)}: {ratio:.2f} [{low:.2f}, {high:.2f}]"
            for key, ratio, (low, high) in zip(md.method, md["vs Adam (median ratio)"], intervals))
        widest = max(intervals, key=lambda lh: max(abs(lh[0] - 1), abs(lh[1] - 1)), default=(math.nan, math.nan))
        out.append(_Part(model, ours, cost_rule(intervals), effect=Effect(
            (widest[0] + widest[1]) / 2, *widest, COST_BAND, 0, "MD / Adam step time (the widest)"),
            headline=f"widest MD / Adam [{widest[0]:.2f}, {widest[1]:.2f}]"))
    if not out:
        raise Unmeasured("table-cost-training.csv has no rows")
    return out


CLAIMS = [
    _Claim("E1: each ℓp path approaches its own ℓp attention SVM direction, the nearest of the SVMs",
           f"own-SVM divergence → ≈ 0; other SVMs plateau (≈ {paper.E1_PLATEAU:g} on the p = 3 path); "
           f"{paper.E1_SEEDS} seeds", "fig-e1-paths", _e1),
    _Claim("E2, norm: ||W(k)|| grows without bound, logarithmically in k (Thm 8)",
           "norm linear in log k", "fig-e2-norm-growth", _e2_norm),
    _Claim("E2, rate: the directional divergence to the SVM decays at least like 1/log k (Thm 11)",
           "O(1 / log k)", "fig-e2-norm-growth", _e2_rate),
    _Claim("E3: joint training: W and v converge in direction to the attention and decoder SVMs",
           "both directions reach their SVMs (empirical)", "table-e3-final", _e3),
    _Claim("Table 1: ℓ1.1 reaches a higher test accuracy than GD (paper: ℓ1.1 best in every row)",
           paper.CLAIMS["table-1"], "table-1", _table1),
    _Claim("Table 1, a variation: from the authors' setup with one factor changed (named in the row), ℓ1.1 "
           "reaches a higher test accuracy than GD", paper.CLAIMS["table-1"], "table-1-variation", _variation),
    _Claim("Table 1, taken apart: ℓ1.1's geometry and its initial per-tensor step allocation each against GD",
           "no such experiment: the paper compares one global step per method", "table-sentiment-allocation",
           _allocation),
    _Claim("Table 1 across embedding scales: ℓ1.1 − GD rises with the embeddings' std",
           "no such experiment: the paper fixes the embeddings at N(0, 1)", "fig-sentiment-scale-series", _series),
    _Claim("Token selection: ℓ1.1 puts more attention on the pivotal word than GD in more sentences",
           paper.CLAIMS["table-token-selection"], "table-token-selection", _tokens),
    _Claim("Attention concentration: ℓ1.1's [CLS] attention is sharper than GD's",
           "sharper, less diffuse attention (the rebuttal; no number)", "fig-token-concentration", _concentration),
    _Claim("K/Q/V sparsity: ℓ1.1 changes the key, query and value weights more sparsely than GD, and than its "
           "init weighting alone predicts",
           paper.CLAIMS["table-weights-change"], "table-weights-change", _kqv),
    _Claim("Pruning (new analysis): ℓ1.1 keeps more test accuracy than GD when half the matrices are pruned",
           "not in the paper", "fig-pruning", _pruning),
    _Claim("ViT parity: every optimizer reaches about the same final test accuracy",
           paper.CLAIMS["table-vit"], "table-vit", _vit_parity),
    _Claim("ViT sparsity: ℓ1.1 changes the attention weights more sparsely than Adam",
           "MD weights more concentrated near zero (Fig 12)", "table-vit-change", _vit_sparsity),
    _Claim("Cost: a mirror-descent step costs about as much as the baseline's",
           paper.CLAIMS["table-cost-training"], "table-cost-training", _cost),
]


def rows(results_dir: Path | str, *, profile: str | None = None, link: Callable[[str, str], str] = reference,
         notebook: str | None = None, also: Path | str | None = None) -> list[Row]:
    """One ``Row`` per claim (and per depth, sentence set, data set or model within a claim), in the
    paper's order (only ``notebook``'s claims when given). Only results the build's ``profile`` made
    are judged (``evidence.Results``); with ``profile`` None (a caller that does not know it), each claim's
    results must come from one profile, whichever it is, and its row shows it. ``also``: the results
    folder that holds the labels ``results_dir`` lacks."""
    out, read = [], {}
    for claim in CLAIMS:
        if notebook is not None and claim.notebook != notebook:
            continue
        results = Results(Path(results_dir), profile, Path(also) if also is not None else None, _read=read)
        target = link(claim.notebook, claim.label)
        try:
            built = claim.build(results)
        except Unmeasured as missing:
            out.append(Row(claim.claim, claim.paper, "–", results.shown(), not_measured(str(missing)), target,
                           short=_short(claim.claim), headline="–"))
            continue
        shown = results.shown()  # the profile every record of the claim names
        for part in built:
            name = claim.claim if part.part is None else f"{claim.claim} ({part.part})"
            short = _short(claim.claim) + ("" if part.part is None else f" ({part.part})")
            out.append(Row(name, part.paper or claim.paper, part.ours, shown, part.verdict, target, part.effect, short,
                           part.headline or part.ours, _stability(part)))
    return out


def _stability(part: _Part) -> Stability | None:
    """A comparative part's stability (one with an effect, a way to rebuild it and a verdict other than not
    measured): the probability that an independent rebuild of the same design, the test sentences shared,
    the run noise new and a step choice made again, reaches its outcome (``mdlib.experiments.stability``,
    seeded: the same results give the same number). None where not checked (a table its rebuild reads is
    not measured, or the runs give no posterior)."""
    if part.effect is None or part.rebuild is None or part.verdict.outcome == NOT_MEASURED:
        return None
    try:
        return part.rebuild(part.verdict.outcome)
    except Unmeasured:
        return None


def chapter_rows(notebook: str, results_dir: Path | str | None = None) -> list[Row]:
    """The scorecard's rows of ``notebook``'s claims, from the results the chapter has just written
    (``<output>/results``, ``paths.output_dir``: the book's own, a variant's or the scratch folder; the
    book's ``paths.results_dir`` for the earlier chapters' tables a claim also reads), at its own profile
    (``provenance.notebook_run``; outside the pipeline its results have none, so each claim reads not
    measured)."""
    from mdlib.experiments import paths

    return rows(results_dir or paths.results_dir(paths.output_dir()), also=None if results_dir else paths.results_dir(),
                profile=provenance.notebook_run()["profile"], notebook=notebook)


def verdicts_text(found: list[Row]) -> str:
    """Rows' verdicts as one line of text per row, each comparative one with the smallest effect its design
    detects, and marked where fragile: a chapter prints these, so that it and the scorecard cannot
    disagree."""
    return "; ".join(f"{r.short}: {said(r)}" + (f" ({r.verdict.why})" if r.verdict.why else "")
                     + (f" [smallest detectable effect {r.effect.detectable_text()}]" if r.effect else "")
                     for r in found)


def said(row: Row) -> str:
    """A row's outcome in words, with how stable it is where it is fragile: "holds", "differs (fragile: a
    rebuild reaches it with probability 0.62)"."""
    if not row.fragile:
        return row.verdict.outcome
    found = row.stability
    return (f"{row.verdict.outcome} ({FRAGILE}: a rebuild reaches it with probability "
            f"{'at least ' if found.bound else ''}{found.probability:.2f})")


def verdicts(notebook: str, results_dir: Path | str | None = None) -> str:
    """``verdicts_text`` of ``chapter_rows``: the verdicts a chapter prints."""
    return verdicts_text(chapter_rows(notebook, results_dir))


def _short(claim: str) -> str:
    """A claim's name without its statement: "Table 1" from "Table 1: ℓ1.1 reaches ..."."""
    return claim.partition(":")[0]
