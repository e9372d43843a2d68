"""The reproduction scorecard: which of the paper's claims hold in a build, decided by stated rules.

``page(results_dir, profile=...)`` reads the ``<label>.csv`` files a book build wrote and returns a
MyST markdown page: one table row per claim, in the paper's order, with the paper's number, ours with
its interval or seeds, the profile, a verdict and a link to the figure or table. ``write_page`` writes
it atomically. A CSV counts only when its provenance record (``<label>.json``) names the build's
profile and holds the CSV's hash, and when the CSV keeps its table's rules (``mdlib.book.schema``).

Every verdict comes from a rule: a small pure function of numbers, whose ``sentence`` is printed on
the page exactly as applied. The outcomes are ``holds``, ``differs``, ``smaller than the paper's``
(the interval contains no effect but excludes the paper's), ``inconclusive`` (the interval spans no
effect and the paper's, or both answers where the paper gives no number) and ``not measured at this
profile`` (a CSV is missing, refused by its record or its table's rules, or lacks a value a verdict
uses, or the regime the claim is about was not reached; the cell says which). Every comparative row
also states the smallest effect its design detects (``stats.detectable_effect``).
"""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import numpy as np
import pandas as pd

from mdlib.book import provenance, schema
from mdlib.book.pages import md_text
from mdlib.experiments import methods, paper
from mdlib.experiments.stats import (GENERALIZATION, POWER, clustered_rate, detectable_effect, generalization_floor,
                                     paired_interval, seeds_for_half_width)
from mdlib.experiments.paths import atomic_write

__all__ = ["HOLDS", "DIFFERS", "SMALLER", "INCONCLUSIVE", "NOT_MEASURED", "GENERALIZATION", "Verdict", "Effect", "Row", "RULES",
           "CLAIMS", "reference", "generalization_floor", "interval_rule", "e1_rule", "e2_norm_rule", "e2_rate_rule",
           "e3_rule", "table1_rule", "token_rule", "concentration_rule", "sparser_rule", "pruning_rule",
           "parity_rule", "cost_rule", "rows", "verdicts", "page", "forest", "write_page",
           "KQV_PAPER_REDUCTION"]

HOLDS, DIFFERS, INCONCLUSIVE, NOT_MEASURED = "holds", "differs", "inconclusive", "not measured at this profile"
SMALLER = "smaller than the paper's"


@dataclass(frozen=True)
class Verdict:
    """An outcome and, for ``not measured``, why."""
    outcome: str
    why: str = ""

    def __str__(self) -> str:
        return f"**{self.outcome}**" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Effect:
    """A comparative claim's estimate as the forest plot draws it: the estimate and its interval, the
    ``null`` value (or band, e.g. parity's ±2 points) the claim is judged against, the side the claim
    predicts (+1: above it, -1: below, 0: inside the band), the unit, the paper's effect on the same
    scale (NaN: the paper gives none) and the smallest effect the design detects (``detectable``: its
    distance from the null, NaN when it cannot be computed)."""
    estimate: float
    low: float
    high: float
    null: tuple[float, float]
    direction: int
    unit: str
    paper: float = math.nan
    detectable: float = math.nan


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
    left_out: "LeftOut | None" = None  #: the verdict rebuilt without each seed in turn (None: not checked)

    @property
    def hinges(self) -> bool:
        """Whether leaving out one seed changes the verdict (a seed's numbers differ between machines)."""
        return bool(self.left_out and self.left_out.changes)

    @property
    def seeds_left_out(self) -> str:
        """What leaving out one seed does to the verdict, in words ("" where not checked)."""
        if self.left_out is None:
            return ""
        n, changes = self.left_out
        if not changes:
            return f"the verdict stays when any one of the {n} seeds is left out"
        moves = "; ".join(f"seed {seed}: {outcome}" for seed, outcome in changes)
        return f"leaving out {moves} (of {n} seeds): this verdict {HINGES}'s numbers, which differ between machines"


class LeftOut(NamedTuple):
    """A comparative verdict rebuilt without each of its ``seeds`` in turn: the (seed, outcome) pairs
    whose outcome differs from the verdict with every seed."""
    seeds: int
    changes: tuple[tuple[int, str], ...]


HINGES = "hinges on one seed"  #: the mark of a verdict that leaving out one seed changes


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


def interval_rule(low: float, high: float, paper: float = math.nan) -> Verdict:
    """On a scale where the claim predicts a positive value: holds when the interval lies above 0,
    differs when below; when it contains 0, smaller than the paper's when it lies wholly below
    ``paper`` (the paper's effect on the same scale), else inconclusive (NaN ``paper``: the paper gives
    no number). Not measured when the interval could not be computed (NaN: no spread, or a missing
    value)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return _not_measured("no interval (no spread over seeds, or a missing value)")
    if low > 0:
        return Verdict(HOLDS)
    if high < 0:
        return Verdict(DIFFERS)
    if math.isfinite(paper) and high < paper:
        return Verdict(SMALLER)
    return Verdict(INCONCLUSIVE)


#: How every interval rule with a paper effect reads an interval that contains no effect.
SMALLER_SENTENCE = (f"when it contains {{null}}, {SMALLER} when it excludes the paper's effect ({{paper}}), "
                    f"inconclusive when it contains both")


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
def e3_rule(divergences: Iterable[float]) -> Verdict:
    """``divergences``: every p's final W and v divergences."""
    values = [float(x) for x in divergences]
    if not values:
        return _not_measured("no runs")
    return _judge(differs=any(not x < E3_FAR for x in values),  # NaN counts as far
                  holds=all(x <= E3_CLOSE for x in values))




def _gates(paired: str = "paired seeds", accuracy: str = "mean test accuracy at the stop rule") -> str:
    """The gates' sentence: what makes a sentiment claim not measured (``_gated``)."""
    return (f"Not measured with fewer than 2 {paired}, when some ℓ1.1 or GD run did not reach the stop rule "
            f"({100 * paper.STOP_TRAIN_ACCURACY:g} % training accuracy: the claim is about trained models), or "
            f"when a compared method's {accuracy} is below 50 % + {GENERALIZATION:g} × (baseline − 50 %), the "
            f"baseline being the bag-of-words Naive Bayes on the same tokens and splits (models that do not "
            f"generalize say nothing about generalization).")


_DETECTABLE = (f"The row shows the smallest effect the design detects with {POWER:.0%} power at the 5 % level, at "
               f"the observed spread over seeds: (t₀.₉₇₅ + t₀.₈₀) s / √n.")


@_rule("Table 1", "Per depth and setup (the authors' replication, and each named variation): ℓ1.1 minus GD in test "
                  "accuracy at the stop rule (the last epoch), seed by seed (a seed gives both the same "
                  "initialization, data order and dropout), with the paired 95 % t interval. Holds when it lies "
                  "above 0, differs when below; " + SMALLER_SENTENCE.format(
                      null="0", paper=f"its ℓ1.1 − GD gap at that depth, e.g. {paper.TABLE_1_GAPS[3]:+.2f} points at 3 layers") + ". "
                  + _gates() + " The paper's metric, the best test accuracy over epochs, selects on the test set "
                  "and is shown, not judged. " + _DETECTABLE)
def table1_rule(low: float, high: float, seeds: int, unreached: int, below: str = "",
                paper_gap: float = math.nan) -> Verdict:
    """``seeds``: the pairs; ``unreached``: runs of the row that did not reach the stop; ``below``: why the
    models do not generalize ("" when they do); ``paper_gap``: the paper's ℓ1.1 − GD gap in points."""
    return _gated(low, high, seeds, unreached, below, paper_gap)


def _gated(low: float, high: float, seeds: int, unreached: int, below: str = "",
           paper_effect: float = math.nan) -> Verdict:
    """``interval_rule``, when there are 2 pairs or more, every run reached the stop rule and the models
    generalize."""
    if seeds < 2:
        return _not_measured(f"{seeds} paired seed(s)")
    links = ([f"{unreached} run(s) did not reach the stop rule"] if unreached else []) + ([below] if below else [])
    if links:
        return _not_measured("not in a generalizing regime: " + "; ".join(links))
    return interval_rule(low, high, paper_effect)


@_rule("Token selection", "Per sentence set: each seed's ℓ1.1 model against the same seed's GD model, the share "
                          "of the non-tied sentences that ℓ1.1 wins (puts more normalized [CLS] attention on the "
                          "pivotal word); the seeds are the units (the sentences are shared by every seed, so the "
                          "comparisons cluster by seed): the mean of the per-seed rates with its 95 % t interval. "
                          "Holds when it lies above 1/2, differs when below; " + SMALLER_SENTENCE.format(
                              null="1/2", paper=f"{100 * paper.token_win_rate():.1f} %, its "
                                                f"{paper.TOKEN_SELECTION['wins']} wins of "
                                                f"{paper.TOKEN_SELECTION['wins'] + paper.TOKEN_SELECTION['losses']} "
                                                "non-tied sentences") + ". "
                          + _gates("seeds with a non-tied sentence") + " " + _DETECTABLE)
def token_rule(low: float, high: float, seeds: int, unreached: int, below: str = "",
               paper_rate: float = math.nan) -> Verdict:
    return _gated(low - 0.5, high - 0.5, seeds, unreached, below, paper_rate - 0.5)


@_rule("Attention concentration", "Not a number of the paper: its rebuttal's reading that ℓ1.1 attention is "
                                  "sharper. Per seed, the mean normalized entropy H / log n of the last layer's "
                                  "[CLS] attention row (heads averaged) over the test sentences; GD minus ℓ1.1, "
                                  "seed by seed, with the paired 95 % t interval. Holds when it lies above 0 "
                                  "(ℓ1.1 sharper), differs when below, inconclusive when it contains 0 (the paper "
                                  "gives no effect to be smaller than). Not measured with fewer than 2 seeds or "
                                  "when a run did not reach the stop rule. " + _DETECTABLE)
def concentration_rule(low: float, high: float, seeds: int, unreached: int) -> Verdict:
    return _gated(low, high, seeds, unreached)


#: The paper's K/Q/V counts above 0.06 (Fig. 9), ℓ1.1's total over GD's, less 1: its relative reduction.
KQV_PAPER_REDUCTION = sum(paper.KQV_ABOVE["1.1"]) / sum(paper.KQV_ABOVE["2"]) - 1


@_rule("Sparsity (K/Q/V and ViT)",
       "Per seed, the effective density ||ΔW||₁² / (n ||ΔW||₂²) of the change ΔW = W − W(0) of the key, query and "
       "value matrices (all layers together): 1 when every entry moved alike, 1/n for one entry; scale-free, so "
       "neither the step size nor a threshold sets it. Small-p mirror descent (ℓ1.1) minus the baseline (GD; for "
       "the ViT, Adam), seed by seed (shared initializations), with the paired 95 % t interval. Holds when it lies "
       "below 0 (a sparser change), differs when above; " + SMALLER_SENTENCE.format(
           null="0", paper=f"for K/Q/V, its {-100 * KQV_PAPER_REDUCTION:.0f} % fewer entries above 0.06 read as "
                           "the same relative reduction of GD's density here; the ViT has no paper number, so "
                           "there it is inconclusive") + ". Not measured with fewer "
       "than 2 seeds, or when the models were not trained to the end (sentiment: a run did not reach the stop "
       "rule; ViT: a training loss had not levelled off). The paper's counts of entries above 0.06 are shown "
       "beside it, not judged: they follow the step size and the training length. " + _DETECTABLE)
def sparser_rule(low: float, high: float, seeds: int, unfinished: str = "", paper_effect: float = math.nan) -> Verdict:
    """``unfinished``: why the models are not trained to the end ("" when they are); ``paper_effect``: the
    paper's ℓ1.1 − baseline difference in density (negative: sparser), NaN when it gives none."""
    if seeds < 2:
        return _not_measured(f"{seeds} paired seed(s)")
    if unfinished:
        return _not_measured(unfinished)
    return interval_rule(-high, -low, -paper_effect)


PRUNE_AT = 0.5


@_rule("Pruning", f"Not a claim of the paper: the hypothesis its sparsity reading suggests. Per seed, the test "
                  f"accuracy after global magnitude pruning of {PRUNE_AT:.0%} of the attention, MLP and classifier "
                  f"matrices (not the embedding tables: most of the weights, on a scale of their own, they would be "
                  f"taken first or last whatever the training did), "
                  f"without retraining; ℓ1.1 minus GD, seed by seed, with the paired 95 % t interval. Holds when it "
                  f"lies above 0, differs when below, inconclusive when it contains 0 (no paper effect). "
                  + _gates(accuracy="mean test accuracy at the stop rule (unpruned)") + " " + _DETECTABLE)
def pruning_rule(low: float, high: float, seeds: int, unreached: int, below: str = "") -> Verdict:
    return _gated(low, high, seeds, unreached, below)


PARITY_MARGIN = 2.0


@_rule("ViT parity", f"Per mirror-descent exponent, the final test accuracy minus Adam's, in points, seed by seed "
                     f"(a seed gives every optimizer the same initialization and data order), with the paired 95 % "
                     f"t interval. Holds when every interval lies within ±{PARITY_MARGIN:g} points; "
                     f"differs when one lies wholly outside; inconclusive otherwise. Not measured with fewer "
                     f"than 2 seeds per method, or when some method's training loss had not levelled off (the "
                     f"chapter's rule): the claim is about end points, not speed. The row states each interval's "
                     f"half-width against the margin and the seeds that would fit it inside ±{PARITY_MARGIN:g} at "
                     f"the observed spread and estimate.")
def parity_rule(intervals: Iterable[tuple[float, float]], seeds: int, levelled: bool) -> Verdict:
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
def cost_rule(intervals: Iterable[tuple[float, float]]) -> Verdict:
    intervals = list(intervals)
    lo, hi = COST_BAND
    if not intervals:
        return _not_measured("no mirror-descent timing")
    return _judge(differs=any(high < lo or low > hi for low, high in intervals),
                  holds=all(lo <= low and high <= hi for low, high in intervals))


RULES = [e1_rule, e2_norm_rule, e2_rate_rule, e3_rule, table1_rule, token_rule, concentration_rule, sparser_rule,
         pruning_rule, parity_rule, cost_rule]


# ---------------------------------------------------------------------------------------------
# reading a results folder


class _Unmeasured(Exception):
    """A claim cannot be measured from this folder (a CSV or a column is missing)."""


class _Results:
    """The results folder as one claim reads it. A CSV is judged only when its record (``<label>.json``,
    ``mdlib.book.provenance``) vouches for it, made by the pipeline at the build's ``profile`` and holding
    this very file's hash, and when it keeps its table's rules (``mdlib.book.schema``). The CSVs of one claim
    agree: one profile (with ``profile`` None, a caller that does not know the build's, the one its
    first record names); one run of each notebook (the same parameters); and a later chapter analysed
    only runs of a kind an earlier one's record lists among them. A label ``folder`` lacks is read from
    ``also`` when given (a variant's own results, then the book's for the chapters it builds on)."""

    def __init__(self, folder: Path, profile: str | None, also: Path | None = None, without_seed: int | None = None):
        self.folders = list(dict.fromkeys(Path(f) for f in (folder, also) if f is not None))
        self.profile = profile
        self.records: dict[str, dict] = {}  # label -> record, of the CSVs read so far
        self.without_seed = without_seed  # leave this seed's rows out of every table with a seed column
        self.seeds: set[int] = set()  # the seeds of the tables read so far

    def without(self, seed: int) -> "_Results":
        """The same results, read afresh with ``seed``'s rows left out of every table with a seed column."""
        return _Results(self.folders[0], self.profile, self.folders[-1], without_seed=seed)

    def csv(self, label: str, columns=(), where: str | None = None) -> pd.DataFrame:
        """The table ``label``, vouched for by its record and kept to its rules (only the rows where the
        flag column ``where`` is set, when given), every one of the ``columns`` a verdict uses holding
        a value in every row."""
        if label not in schema.TABLES:
            raise KeyError(f"{label} has no results schema: declare it in mdlib.book.schema.TABLES")
        path = next((f / f"{label}.csv" for f in self.folders if (f / f"{label}.csv").is_file()),
                    self.folders[0] / f"{label}.csv")
        if not path.is_file():
            raise _Unmeasured(f"{path.name} missing")
        self._vouch(label, path)
        try:
            frame = schema.read(path, label)
        except schema.SchemaError as error:
            raise _Unmeasured(str(error)) from None
        if schema.placeholder(frame):
            raise _Unmeasured(f"{path.name}: " + "; ".join(frame.note.astype(str)))
        if "seed" in frame:
            self.seeds.update(int(seed) for seed in frame.seed.dropna())
            frame = frame[frame.seed != self.without_seed] if self.without_seed is not None else frame
        return _complete(frame if where is None else frame[frame[where].astype(bool)], label, columns)

    def _vouch(self, label: str, path: Path) -> None:
        name = path.name
        try:
            record = json.loads((path.parent / f"{label}.json").read_text("utf-8"))
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise _Unmeasured(f"{name} has no readable record ({label}.json): made outside the pipeline, or its "
                              "save did not finish")
        profile = record.get("profile")
        if not profile:
            raise _Unmeasured(f"{name} was made outside the pipeline (no profile in its record)")
        wanted = self.profile or next((r["profile"] for r in self.records.values()), profile)
        if profile != wanted:
            raise _Unmeasured(f"{name} was made at profile {profile}, not {wanted}")
        digest = {Path(file).name: value for file, value in (record.get("sha256") or {}).items()}.get(name)
        if digest is None:
            raise _Unmeasured(f"{name}'s record holds no hash of it (an older record): run its chapter again")
        if provenance.sha256(path) != digest:
            raise _Unmeasured(f"{name} does not match its record: edited or from another run")
        for other, known in self.records.items():
            _agree((name, record), (f"{other}.csv", known))
        self.records[label] = record

    def shown(self) -> str:
        """The profile of the claim's results: its records', else the build's, else "unknown"."""
        return next((r["profile"] for r in self.records.values()), None) or self.profile or "unknown"


def _agree(one: tuple[str, dict], other: tuple[str, dict]) -> None:
    """Raise ``_Unmeasured`` unless two (CSV name, record) of one claim come from one run of each
    notebook: within a notebook, the same execution (the same parameters, for records without its id);
    across two, the later chapter's runs of every kind the earlier one's record lists are among those
    (it analysed the grid the earlier one built)."""
    (early, first), (late, second) = sorted((one, other), key=lambda item: str(item[1].get("notebook")))
    if first.get("notebook") == second.get("notebook"):
        both = bool(first.get("execution") and second.get("execution"))
        field = "execution" if both else "parameters"
        if first.get(field) != second.get(field):
            raise _Unmeasured(f"{early} and {late} come from different runs of {first.get('notebook')} "
                              f"(their {'execution ids' if both else 'parameters'} differ)")
        return
    listed = set(first.get("runs") or [])
    kinds = {run.partition("/")[0] for run in listed}
    if any(run.partition("/")[0] in kinds and run not in listed for run in second.get("runs") or []):
        raise _Unmeasured(f"{late} analysed runs that {early} does not list: its chapter ran again since, or "
                          "with other parameters")


def _complete(frame: pd.DataFrame, label: str, columns) -> pd.DataFrame:
    """``frame`` (rows of ``<label>.csv``); ``_Unmeasured`` when one of ``columns`` lacks a value in a row."""
    for column in columns:
        missing = frame[column].isna()
        if missing.any():
            raise _Unmeasured(f"{label}.csv row {missing.idxmax() + 2}: {column} is missing")
    return frame


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
    effect: Effect | None = None
    headline: str = ""  # ours in a few words, for the short table (default: ``ours``)


@dataclass(frozen=True)
class _Claim:
    claim: str
    paper: str
    notebook: str
    label: str
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
    return curves[curves.method == "plain"]


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


class _Pairs(NamedTuple):
    """A paired comparison: the mean difference, its 95 % t interval, the pairs, the smallest
    difference the design detects (``stats.detectable_effect``) and the differences' standard deviation."""
    difference: float
    low: float
    high: float
    pairs: int
    detectable: float
    sd: float = math.nan


def _paired(frame: pd.DataFrame, first, second, value: str, by: str = "method", unit: str = "seed") -> _Pairs:
    """``value``, ``first`` minus ``second`` (rows of ``by``), matched on ``unit``: the paired t interval over
    the units both have."""
    wide = frame.pivot_table(index=unit, columns=by, values=value)
    if first not in wide or second not in wide:
        return _Pairs(math.nan, math.nan, math.nan, 0, math.nan)
    wide = wide[[first, second]].dropna()
    if wide.empty:
        return _Pairs(math.nan, math.nan, math.nan, 0, math.nan)
    d, low, high = paired_interval(wide[first], wide[second])
    differences = wide[first] - wide[second]
    return _Pairs(d, low, high, len(wide), detectable_effect(differences),
                  float(differences.std(ddof=1)) if len(wide) > 1 else math.nan)


def _chosen_runs(r: _Results, grid: str | None = None, extra=()) -> pd.DataFrame:
    """Chapter 04's chosen runs (``table-sentiment-runs``): of one ``grid`` ("replication" or
    "variation"), or, with None, of the grid chapters 05 and 06 analyse."""
    runs = r.csv("table-sentiment-runs", ["grid", "setup", "analysed", "method", "seed", "last_test", "reached",
                                          *extra], where="chosen")
    runs = runs[runs.analysed.astype(bool)] if grid is None else runs[runs.grid == grid]
    return runs.assign(method=runs.method.map(_key))


def _floor(r: _Results) -> tuple[float, float]:
    """(baseline test accuracy, the generalization floor) from chapter 04's baseline table."""
    table = r.csv("table-sentiment-baseline", ["baseline", "test_accuracy"])
    baseline = float(table[table.baseline == "naive_bayes"].test_accuracy.iloc[0])  # a row the schema requires
    return baseline, generalization_floor(baseline)


def _below(runs: pd.DataFrame, floor: float, baseline: float, column: str = "last_test", by=("method",)) -> str:
    """Why the ℓ1.1 or GD models do not generalize ("" when every cell's mean is at the floor or above)."""
    compared = runs[runs.method.isin(["1.1", "2"])]
    means = compared.groupby(list(by))[column].mean()
    low = means[means < floor]
    if low.empty:
        return ""
    shown = ", ".join(f"{_cell_name(k)} {100 * v:.1f} %" for k, v in low.items())
    return f"{shown} < {100 * floor:.1f} % (baseline {100 * baseline:.1f} %)"


def _cell_name(key) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    return " ".join(f"{p} layers" if isinstance(p, (int, np.integer)) else methods.method_text(*methods.method(p))
                    for p in parts)


def _unreached(runs: pd.DataFrame) -> int:
    """ℓ1.1 and GD runs that did not reach the stop rule."""
    return int((~runs[runs.method.isin(["1.1", "2"])].reached.astype(bool)).sum())


def _effect(pairs: _Pairs, unit: str, null=(0.0, 0.0), direction=1, paper=math.nan) -> Effect:
    return Effect(pairs.difference, pairs.low, pairs.high, null, direction, unit, paper, pairs.detectable)


def _detectable(pairs: _Pairs, digits: int = 2, unit: str = "") -> str:
    """The detectable effect as a row shows it."""
    if pairs.detectable != pairs.detectable:
        return "detectable effect: n/a (fewer than 2 pairs or no spread)"
    return f"detectable effect ±{pairs.detectable:.{digits}f}{unit} (n = {pairs.pairs}, {POWER:.0%} power)"


def _headline(pairs: _Pairs, unit: str, digits: int = 2) -> str:
    """A comparison as the scorecard's short table shows it: the estimate, its interval and the seeds."""
    return f"{_interval(pairs.difference, pairs.low, pairs.high, digits)}{unit} (n = {pairs.pairs})"


def _accuracy_gap(runs: pd.DataFrame, name: str, paper_text: str | None, floor: tuple[float, float],
                  paper_gap: float) -> _Part:
    pairs = _paired(runs.assign(points=100 * runs.last_test), "1.1", "2", "points")
    means = runs.groupby("method").last_test.mean()
    best = runs.groupby("method").best_test.mean() if "best_test" in runs else None
    text = " / ".join(f"{100 * means[k]:.2f}" for k in ("1.1", "2", "3") if k in means)
    methods = " / ".join({"1.1": "ℓ1.1", "2": "GD", "3": "ℓ3"}[k] for k in ("1.1", "2", "3") if k in means)
    seeds = runs.groupby("method").seed.nunique()
    ours = (f"test accuracy at the stop rule {text} % ({methods}; seeds "
            + " / ".join(str(seeds[k]) for k in ("1.1", "2", "3") if k in seeds)
            + f"); ℓ1.1 − GD {_interval(pairs.difference, pairs.low, pairs.high)} points (paired, n = "
              f"{pairs.pairs} seeds); {_detectable(pairs, unit=' points')}")
    if best is not None:
        ours += "; best over epochs " + " / ".join(f"{100 * best[k]:.2f}" for k in ("1.1", "2", "3") if k in best)
    baseline, cut = floor
    ours += f"; baseline {100 * baseline:.1f} %"
    verdict = table1_rule(pairs.low, pairs.high, pairs.pairs, _unreached(runs), _below(runs, cut, baseline),
                          paper_gap)
    return _Part(name, ours, verdict, paper_text, _effect(pairs, "points of test accuracy, ℓ1.1 − GD",
                                                          paper=paper_gap),
                 _headline(pairs, " points"))


def _table1_rows(r: _Results, grid: str) -> list[_Part]:
    """One row per depth of one of chapter 04's grids."""
    runs = _chosen_runs(r, grid, extra=("layers", "best_test"))
    if runs.empty:
        raise _Unmeasured(f"no {grid} runs at this profile")
    floor = _floor(r)
    setup = paper.SETUP_NAMES.get(str(runs.setup.iloc[0]), str(runs.setup.iloc[0]))
    out = []
    for L in sorted(runs.layers.unique()):
        reported = paper.TABLE_1.get(int(L), {})
        gap = paper.TABLE_1_GAPS.get(int(L), math.nan)
        paper_text = (" / ".join(f"{reported.get(k, math.nan):.2f}" for k in ("1.1", "2", "3"))
                      + f" (ℓ1.1 / GD / ℓ3); ℓ1.1 − GD {_signed(gap)} points")
        name = f"{L} layers" if grid == "replication" else f"{setup}, {L} layers"
        row_runs = runs[runs.layers == L]
        if not {"1.1", "2"} <= set(row_runs.method):
            out.append(_Part(name, "no ℓ1.1 or GD runs", _not_measured("no ℓ1.1 or GD runs"), paper_text))
            continue
        out.append(_accuracy_gap(row_runs, name, paper_text, floor, gap))
    return out


def _table1(r: _Results):
    r.csv("table-1", ["setup", "layers", "method"])  # vouched for with the runs: one execution of chapter 04
    return _table1_rows(r, "replication")


def _variation(r: _Results):
    r.csv("table-1-variation", ["setup", "layers", "method"])
    return _table1_rows(r, "variation")


def _sentiment_gates(r: _Results) -> tuple[int, str, str]:
    """(unreached runs, why the models do not generalize, their setup's name) of the chapter 04 grid that
    chapters 05 and 06 analyse."""
    runs = _chosen_runs(r, extra=("layers",))
    if runs.empty:
        raise _Unmeasured("table-sentiment-runs.csv marks no grid as the one chapters 05 and 06 analyse")
    baseline, cut = _floor(r)
    setup = paper.SETUP_NAMES.get(str(runs.setup.iloc[0]), str(runs.setup.iloc[0]))
    return _unreached(runs), _below(runs, cut, baseline, by=("layers", "method")), setup


def _tokens(r: _Results):
    unreached, below, setup = _sentiment_gates(r)
    table = r.csv("table-token-selection-seeds", ["sentences", "seed", "wins", "losses", "ties"])
    paper_rate = paper.token_win_rate()
    out = []
    for sentences, part in table.groupby("sentences", sort=False):
        kept = part[(part.wins + part.losses) > 0]
        ours = (f"{int(part.wins.sum())} / {int(part.losses.sum())} / {int(part.ties.sum())} (ℓ1.1 / GD / ties, "
                f"{part.seed.nunique()} seeds; models: {setup})")
        if kept.empty:
            out.append(_Part(sentences, ours, _not_measured("no non-tied comparison")))
            continue
        rate, low, high = clustered_rate(kept.wins, kept.losses)
        rates = kept.wins / (kept.wins + kept.losses)
        pairs = _Pairs(rate - 0.5, low - 0.5, high - 0.5, len(kept), detectable_effect(rates))
        ours += (f"; ℓ1.1's win rate, mean of the seeds {rate:.1%} [{_pct(low)}, {_pct(high)}]; "
                 f"{_detectable(pairs, 3)} in the rate")
        out.append(_Part(sentences, ours, token_rule(low, high, len(kept), unreached, below, paper_rate),
                         effect=Effect(rate, low, high, (0.5, 0.5), 1, "ℓ1.1's win rate", paper_rate,
                                       pairs.detectable),
                         headline=f"win rate {rate:.1%} [{_pct(low)}, {_pct(high)}] (n = {len(kept)} seeds)"))
    if not out:
        raise _Unmeasured("table-token-selection-seeds.csv has no sentence set")
    return out


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.1%}"


def _concentration(r: _Results):
    unreached, _, setup = _sentiment_gates(r)
    table = r.csv("table-token-concentration", ["method", "seed", "entropy", "top_share"])
    table = table.assign(method=table.method.map(_key))
    pairs = _paired(table, "2", "1.1", "entropy")
    means = table.groupby("method")[["entropy", "top_share"]].mean()
    if not {"1.1", "2"} <= set(means.index):
        raise _Unmeasured("no ℓ1.1 or GD models")
    ours = (f"normalized entropy of the [CLS] row ℓ1.1 {means.entropy['1.1']:.3f}, GD {means.entropy['2']:.3f}; "
            f"top-token share {means.top_share['1.1']:.3f}, {means.top_share['2']:.3f}; GD − ℓ1.1 entropy "
            f"{_interval(pairs.difference, pairs.low, pairs.high, 3)} (paired, n = {pairs.pairs}; models: {setup}); "
            f"{_detectable(pairs, 3)}")
    return [_Part(None, ours, concentration_rule(pairs.low, pairs.high, pairs.pairs, unreached),
                  effect=_effect(pairs, "entropy, GD − ℓ1.1"), headline=_headline(pairs, " entropy (GD − ℓ1.1)", 3))]


def _kqv(r: _Results):
    change = r.csv("table-weights-change", ["method", "seed", "effective_density"])
    change = change.assign(method=change.method.map(_key))
    pairs = _paired(change, "1.1", "2", "effective_density")
    density = change.groupby("method").effective_density.mean()
    if not {"1.1", "2"} <= set(density.index):
        raise _Unmeasured("no ℓ1.1 or GD models")
    paper_effect = KQV_PAPER_REDUCTION * density["2"]
    unreached, _, setup = _sentiment_gates(r)
    ours = (f"effective density of ΔW: ℓ1.1 {density['1.1']:.3f}, GD {density['2']:.3f}; ℓ1.1 − GD "
            f"{_interval(pairs.difference, pairs.low, pairs.high, 3)} (paired, n = {pairs.pairs}; models: {setup}); "
            f"the paper's {-100 * KQV_PAPER_REDUCTION:.0f} % reduction here: {_signed(paper_effect, 3)}; "
            f"{_detectable(pairs, 3)}")
    counts = r.csv("table-weights-kqv", ["method", "seed", "K", "Q", "V"])
    counts = counts.assign(method=counts.method.map(_key), total=counts.K + counts.Q + counts.V)
    totals = counts.groupby("method").total.mean()
    if {"1.1", "2"} <= set(totals.index):
        ours += f"; K + Q + V above the scaled threshold (not judged): ℓ1.1 {totals['1.1']:.0f}, GD {totals['2']:.0f}"
    unfinished = f"{unreached} sentiment run(s) did not reach the stop rule" if unreached else ""
    return [_Part(None, ours, sparser_rule(pairs.low, pairs.high, pairs.pairs, unfinished, paper_effect),
                  effect=_effect(pairs, "effective density, ℓ1.1 − GD", direction=-1, paper=paper_effect),
                  headline=_headline(pairs, " density (ℓ1.1 − GD)", 3))]


def _pruning(r: _Results):
    curves = r.csv("fig-pruning", ["method", "seed", "sparsity", "test_accuracy"])
    curves = curves.assign(method=curves.method.map(_key))
    at = curves[np.isclose(curves.sparsity, PRUNE_AT)]
    if at.empty:
        raise _Unmeasured(f"sparsity {PRUNE_AT:g} not measured")
    pairs = _paired(at.assign(points=100 * at.test_accuracy), "1.1", "2", "points")
    kept = at.groupby("method").test_accuracy.mean()
    dense = curves[curves.sparsity == 0].groupby("method").test_accuracy.mean()
    if not {"1.1", "2"} <= set(kept.index):
        raise _Unmeasured("no ℓ1.1 or GD models")
    unreached, below, setup = _sentiment_gates(r)
    unpruned = [100 * dense.get(k, math.nan) for k in ("1.1", "2")]
    ours = (f"test accuracy with {PRUNE_AT:.0%} of the matrices pruned: ℓ1.1 {100 * kept['1.1']:.2f}, GD "
            f"{100 * kept['2']:.2f} (unpruned {unpruned[0]:.2f}, {unpruned[1]:.2f}); ℓ1.1 − GD "
            f"{_interval(pairs.difference, pairs.low, pairs.high)} points (paired, n = {pairs.pairs}; models: "
            f"{setup}); {_detectable(pairs, unit=' points')}")
    return [_Part(None, ours, pruning_rule(pairs.low, pairs.high, pairs.pairs, unreached, below),
                  effect=_effect(pairs, "points of test accuracy, ℓ1.1 − GD"), headline=_headline(pairs, " points"))]


_DATASETS = {"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def _parity_power(pairs: _Pairs) -> str:
    """What a parity interval can say: its half-width against the margin, and the seeds that would put
    the interval inside ±PARITY_MARGIN at this spread and estimate."""
    if pairs.low != pairs.low:
        return "no interval"
    half = (pairs.high - pairs.low) / 2
    room = PARITY_MARGIN - abs(pairs.difference)
    if room <= 0:
        return f"half-width {half:.2f}; the estimate lies outside ±{PARITY_MARGIN:g}: no number of seeds shows parity"
    return f"half-width {half:.2f}; ±{PARITY_MARGIN:g} would need n ≥ {seeds_for_half_width(pairs.sd, room)} seeds here"


def _vit_parity(r: _Results):
    history = r.csv("fig-vit-accuracy", ["dataset", "key", "method", "seed", "epoch"])
    table = r.csv("table-vit", ["dataset", "optimizer", "levelled"])
    last = _complete(history.loc[history.groupby(["dataset", "key", "seed"]).epoch.idxmax()], "fig-vit-accuracy",
                     ["test_accuracy"])  # training evaluates after the last epoch
    final = last.assign(points=100 * last.test_accuracy)
    out = []
    for dataset, frame in final.groupby("dataset", sort=False):
        name = _DATASETS.get(dataset, dataset)
        shown = dict(zip(frame.key, frame.method))  # method key -> the chapter's name for it
        if "adam" not in shown:
            out.append(_Part(name, "no Adam runs", _not_measured("no Adam runs")))
            continue
        compared, parts = [], [f"{shown['adam']} {frame[frame.key == 'adam'].points.mean():.2f}"]
        for key in shown:
            if key == "adam":
                continue
            pairs = _paired(frame, key, "adam", "points", by="key")
            compared.append(pairs)
            parts.append(f"{shown[key]}: {_interval(pairs.difference, pairs.low, pairs.high)} "
                         f"({_parity_power(pairs)})")
        levelled = _levelled(table, name)
        seeds = min(p.pairs for p in compared) if compared else 0
        ours = (f"{name}, final test accuracy (%), MD minus Adam, paired by seed: " + "; ".join(parts)
                + f" (n ≥ {seeds} seeds" + ("" if levelled else "; loss not levelled off") + ")")
        worst = max(compared, key=lambda p: max(abs(p.low), abs(p.high)) if p.low == p.low else math.inf,
                    default=_Pairs(math.nan, math.nan, math.nan, 0, math.nan))
        out.append(_Part(name, ours, parity_rule([(p.low, p.high) for p in compared], seeds, levelled),
                         effect=Effect(worst.difference, worst.low, worst.high, (-PARITY_MARGIN, PARITY_MARGIN), 0,
                                       "points, MD − Adam (the widest)", detectable=worst.detectable),
                         headline=f"widest MD − Adam {_interval(worst.difference, worst.low, worst.high)} points "
                                  f"(n = {seeds})"))
    if not out:
        raise _Unmeasured("fig-vit-accuracy.csv has no runs")
    return out


def _levelled(table: pd.DataFrame, name: str) -> bool:
    """Has every method's training loss levelled off on the data set (chapter 07's rule)?"""
    rows = table[table.dataset == name]
    return not rows.empty and bool(rows.levelled.astype(bool).all())


def _vit_sparsity(r: _Results):
    change = r.csv("table-vit-change", ["steps", "dataset", "method", "seed", "effective_density", "levelled"])
    change = change.assign(method=change.method.map(_key))
    counts = r.csv("fig-vit-weights", ["dataset", "key", "seed", "count"])
    out = []
    for (steps, dataset), frame in change.groupby(["steps", "dataset"], sort=False):
        name = f"{_DATASETS.get(dataset, dataset)}, {steps} step sizes"
        if not {"1.1", "adam"} <= set(frame.method):
            out.append(_Part(name, "no Adam or ℓ1.1 models", _not_measured("no Adam or ℓ1.1 models")))
            continue
        pairs = _paired(frame, "1.1", "adam", "effective_density")
        density = frame.groupby("method").effective_density.mean()
        lrs = frame.groupby("method").lr.first()
        ours = (f"effective density of ΔW, ℓ1.1 (lr {lrs['1.1']:g}) {density['1.1']:.3f}, Adam (lr {lrs['adam']:g}) "
                f"{density['adam']:.3f}; ℓ1.1 − Adam {_interval(pairs.difference, pairs.low, pairs.high, 3)} "
                f"(paired, n = {pairs.pairs}); {_detectable(pairs, 3)}")
        if steps == "swept":
            raw = counts[counts.dataset == dataset].groupby("key")["count"].sum() / max(1, counts.seed.nunique())
            if {"1.1", "adam"} <= set(raw.index):
                ours += (f"; K + Q + V above the scaled threshold (not judged): ℓ1.1 {raw['1.1']:.0f}, "
                         f"Adam {raw['adam']:.0f}")
        unfinished = "" if frame.levelled.astype(bool).all() else "a training loss had not levelled off"
        out.append(_Part(name, ours, sparser_rule(pairs.low, pairs.high, pairs.pairs, unfinished),
                         effect=_effect(pairs, "effective density, ℓ1.1 − Adam", direction=-1),
                         headline=_headline(pairs, " density (ℓ1.1 − Adam)", 3)))
    if not out:
        raise _Unmeasured("table-vit-change.csv has no models")
    return out


def _cost(r: _Results):
    table = r.csv("table-cost-training", ["model", "method", "vs Adam (median ratio)", "ci_low", "ci_high"])
    table = table.assign(method=table.method.map(_key))
    out = []
    for model, frame in table.groupby("model", sort=False):
        md = frame[frame.method != "adam"]
        intervals = list(zip(md.ci_low, md.ci_high))
        ours = "MD step time / Adam's, median [95 %]: " + "; ".join(
            f"{methods.method_text(*methods.method(key))}: {ratio:.2f} [{low:.2f}, {high:.2f}]"
            for key, ratio, (low, high) in zip(md.method, md["vs Adam (median ratio)"], intervals))
        widest = max(intervals, key=lambda lh: max(abs(lh[0] - 1), abs(lh[1] - 1)), default=(math.nan, math.nan))
        out.append(_Part(model, ours, cost_rule(intervals), effect=Effect(
            (widest[0] + widest[1]) / 2, *widest, COST_BAND, 0, "MD / Adam step time (the widest)"),
            headline=f"widest MD / Adam [{widest[0]:.2f}, {widest[1]:.2f}]"))
    if not out:
        raise _Unmeasured("table-cost-training.csv has no rows")
    return out


def _paper_table1() -> str:
    """Table 1's cells and gaps, as the scorecard's paper column shows them."""
    rows = [f"{' / '.join(f'{row[k]:.2f}' for k in ('1.1', '2', '3'))} (L = {row['layers']})"
            for row in paper.table1_rows()]
    gaps = " / ".join(f"{row['gap']:.2f}" for row in paper.table1_rows())
    return ", ".join(rows) + f"; ℓ1.1 − GD {gaps} (best over epochs)"


def _paper_tokens() -> str:
    t = paper.TOKEN_SELECTION
    return (f"ℓ1.1 wins {t['wins']} of {t['sentences']}, GD {t['losses']}, {t['ties']} ties "
            f"({100 * paper.token_win_rate():.1f} % of non-ties); one model each")


def _paper_kqv() -> str:
    counts = {key: " / ".join(map(str, paper.KQV_ABOVE[key])) for key in ("1.1", "2")}
    return f"entries > {paper.WEIGHT_THRESHOLD:g}, K / Q / V: {counts['1.1']} (ℓ1.1) vs {counts['2']} (GD)"


def _paper_vit() -> str:
    return ", ".join(f"≈ {accuracy:.0f} % ({_DATASETS[name]})" for name, accuracy in paper.VIT_ACCURACY.items()) \
        + " for Adam and every MD exponent"


def _paper_cost() -> str:
    ops = ", ".join(f"{name} {n}" for name, n in paper.OPS_PER_PARAMETER.items())
    return f"ops per parameter {ops}; small time differences between the five methods"


CLAIMS = [
    _Claim("E1: each ℓp path approaches its own ℓp attention SVM direction, the nearest of the SVMs",
           f"own-SVM divergence → ≈ 0; other SVMs plateau (≈ {paper.E1_PLATEAU:g} on the p = 3 path); "
           f"{paper.E1_SEEDS} seeds",
           "01_fixed_decoder_paths", "fig-e1-paths", _e1),
    _Claim("E2, norm: ||W(k)|| grows without bound, logarithmically in k (Thm 8)",
           "norm linear in log k", "02_single_instance_path", "fig-e2-norm-growth", _e2_norm),
    _Claim("E2, rate: the directional divergence to the SVM decays at least like 1/log k (Thm 11)",
           "O(1 / log k)", "02_single_instance_path", "fig-e2-norm-growth", _e2_rate),
    _Claim("E3: joint training: W and v converge in direction to the attention and decoder SVMs",
           "both directions reach their SVMs (empirical)", "03_joint_training", "table-e3-final", _e3),
    _Claim("Table 1: ℓ1.1 reaches a higher test accuracy than GD (paper: ℓ1.1 best in every row)",
           _paper_table1(),
           "04_sentiment", "table-1", _table1),
    _Claim("Table 1, a variation: from the authors' setup with one factor changed (named in the row), ℓ1.1 "
           "reaches a higher test accuracy than GD", _paper_table1(), "04_sentiment", "table-1-variation", _variation),
    _Claim("Token selection: ℓ1.1 puts more attention on the pivotal word than GD in more sentences",
           _paper_tokens(), "05_token_selection",
           "table-token-selection", _tokens),
    _Claim("Attention concentration: ℓ1.1's [CLS] attention is sharper than GD's",
           "sharper, less diffuse attention (the rebuttal; no number)", "05_token_selection",
           "fig-token-concentration", _concentration),
    _Claim("K/Q/V sparsity: ℓ1.1 changes the key, query and value weights more sparsely than GD",
           _paper_kqv(),
           "06_weights", "table-weights-change", _kqv),
    _Claim("Pruning (new analysis): ℓ1.1 keeps more test accuracy than GD when half the matrices are pruned",
           "not in the paper", "06_weights", "fig-pruning", _pruning),
    _Claim("ViT parity: every optimizer reaches about the same final test accuracy",
           _paper_vit(), "07_vision", "table-vit",
           _vit_parity),
    _Claim("ViT sparsity: ℓ1.1 changes the attention weights more sparsely than Adam",
           "MD weights more concentrated near zero (Fig 12)", "07_vision", "table-vit-change", _vit_sparsity),
    _Claim("Cost: a mirror-descent step costs about as much as the baseline's",
           _paper_cost(),
           "08_cost", "table-cost-training", _cost),
]


def rows(results_dir: Path | str, *, profile: str | None = None, link: Callable[[str, str], str] = reference,
         notebook: str | None = None, also: Path | str | None = None) -> list[Row]:
    """One ``Row`` per claim (and per depth, sentence set, data set or model within a claim), in the
    paper's order (only ``notebook``'s claims when given). Only results the build's ``profile`` made
    are judged (``_Results``); with ``profile`` None (a caller that does not know it), each claim's
    results must come from one profile, whichever it is, and its row shows it. ``also``: the results
    folder that holds the labels ``results_dir`` lacks."""
    out = []
    for claim in CLAIMS:
        if notebook is not None and claim.notebook != notebook:
            continue
        results = _Results(Path(results_dir), profile, Path(also) if also is not None else None)
        target = link(claim.notebook, claim.label)
        try:
            built = claim.build(results)
        except _Unmeasured as missing:
            out.append(Row(claim.claim, claim.paper, "–", results.shown(), _not_measured(str(missing)), target,
                           short=_short(claim.claim), headline="–"))
            continue
        shown = results.shown()  # the profile every record of the claim names
        left_out = _leave_one_seed_out(claim, built, results)
        for part in built:
            name = claim.claim if part.part is None else f"{claim.claim} ({part.part})"
            short = _short(claim.claim) + ("" if part.part is None else f" ({part.part})")
            out.append(Row(name, part.paper or claim.paper, part.ours, shown, part.verdict, target, part.effect, short,
                           part.headline or part.ours, left_out.get(part.part)))
    return out


LEAVE_OUT_SEEDS = 30  #: the most seeds a comparative claim is rebuilt without, one at a time


def _leave_one_seed_out(claim: "_Claim", built: list[_Part], results: _Results) -> dict[str | None, LeftOut]:
    """Per comparative part of ``claim`` (one with an effect, judged on 3 to ``LEAVE_OUT_SEEDS`` seeds),
    what its verdict becomes when the claim is rebuilt from its results without one seed, each seed in
    turn: a seed's numbers differ between machines, so a verdict that changes without one of them
    would not be reproduced elsewhere."""
    parts = {p.part: p.verdict.outcome for p in built if p.effect is not None and p.verdict.outcome != NOT_MEASURED}
    if not parts or not 3 <= len(results.seeds) <= LEAVE_OUT_SEEDS:
        return {}
    changes: dict[str | None, list[tuple[int, str]]] = {part: [] for part in parts}
    for seed in sorted(results.seeds):
        try:
            again = {p.part: p.verdict.outcome for p in claim.build(results.without(seed))}
        except _Unmeasured:
            again = {}
        for part, outcome in parts.items():
            if again.get(part, NOT_MEASURED) != outcome:
                changes[part].append((seed, again.get(part, NOT_MEASURED)))
    return {part: LeftOut(len(results.seeds), tuple(moves)) for part, moves in changes.items()}


def verdicts(notebook: str, results_dir: Path | str | None = None) -> str:
    """The scorecard's verdicts on ``notebook``'s claims, as one line of text per claim row, from the
    results the chapter has just written (``<output>/results``, ``paths.output_dir``: the book's own, a
    variant's or the scratch folder; the book's ``paths.results_dir`` for the earlier chapters' tables a
    claim also reads), at its own profile (``provenance.notebook_run``; outside the pipeline its results
    have none, so each claim reads not measured), each comparative one with the smallest effect its design
    detects: a chapter prints these, so that it and the scorecard cannot disagree."""
    from mdlib.experiments import paths

    found = rows(results_dir or paths.output_dir() / "results", also=None if results_dir else paths.results_dir(),
                 profile=provenance.notebook_run()["profile"], notebook=notebook)
    return "; ".join(f"{r.short}: {r.verdict.outcome}" + (f" ({r.verdict.why})" if r.verdict.why else "")
                     + (f" ({HINGES})" if r.hinges else "")
                     + (f" [smallest detectable effect {_detectable_text(r.effect)}]" if r.effect else "")
                     for r in found)


def _short(claim: str) -> str:
    """A claim's name without its statement: "Table 1" from "Table 1: ℓ1.1 reaches ..."."""
    return claim.partition(":")[0]


_COLOURS = {HOLDS: "#1b7837", DIFFERS: "#b2182b", SMALLER: "#5e3c99", INCONCLUSIVE: "#e08214",
            NOT_MEASURED: "#8c8c8c"}


def forest(table: list[Row], target: Path | str) -> Path | None:
    """The forest plot of every comparative claim of ``table`` (rows with an ``effect``), saved as a PNG
    at ``target``: per row its own axis, the estimate and its 95 % interval coloured by the verdict,
    the null value or band (grey), the side the claim predicts shaded, the verdict word at the right.
    None when no row has an effect."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in table if r.effect is not None]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 1, figsize=(9.5, 0.62 * len(shown) + 0.9), squeeze=False)
    for ax, r in zip(axes[:, 0], shown):
        e = r.effect
        colour = _COLOURS[r.verdict.outcome]
        values = [v for v in (e.estimate, e.low, e.high, *e.null, e.paper) if math.isfinite(v)]
        lo, hi = min(values), max(values)
        pad = 0.15 * (hi - lo) if hi > lo else max(abs(hi), 1.0) * 0.5
        lo, hi = lo - pad, hi + pad
        if e.direction > 0:
            ax.axvspan(e.null[1], hi, color="#d9f0d3", lw=0)
        elif e.direction < 0:
            ax.axvspan(lo, e.null[0], color="#d9f0d3", lw=0)
        else:
            ax.axvspan(*e.null, color="#d9f0d3", lw=0)
        ax.axvline(e.null[0], color="0.4", lw=1)
        if e.null[1] != e.null[0]:
            ax.axvline(e.null[1], color="0.4", lw=1)
        if math.isfinite(e.low) and math.isfinite(e.high):
            ax.plot([e.low, e.high], [0, 0], color=colour, lw=3, solid_capstyle="butt")
        if math.isfinite(e.estimate):
            hollow = r.verdict.outcome == NOT_MEASURED
            ax.plot([e.estimate], [0], "o", ms=7, color=colour, mfc="white" if hollow else colour)
        if math.isfinite(e.paper):  # the paper's effect: a black diamond above the axis
            ax.plot([e.paper], [0.55], "D", ms=5, color="black")
            ax.text(e.paper, 0.55, " paper", fontsize=6, va="center", ha="left")
        ax.set_xlim(lo, hi)
        ax.set_ylim(-1, 1)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=7, pad=1)
        ax.set_xlabel(e.unit, fontsize=7, labelpad=1)
        ax.text(-0.01, 0.5, textwrap.fill(r.short, 42), transform=ax.transAxes, ha="right", va="center", fontsize=8)
        ax.text(1.01, 0.5, _SHORT_OUTCOME.get(r.verdict.outcome, r.verdict.outcome), transform=ax.transAxes,
                ha="left", va="center", fontsize=8, color=colour, fontweight="bold")
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
    fig.tight_layout(h_pad=0.6)
    fig.subplots_adjust(left=0.32, right=0.82)
    target = Path(target)
    atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=130, metadata={"Software": None}))
    plt.close(fig)
    return target


_SHORT_OUTCOME = {NOT_MEASURED: "not measured", SMALLER: "smaller than\nthe paper's"}

FOREST = "scorecard-forest.png"


def page(results_dir: Path | str, *, profile: str | None = None, archive_link: str | None = None,
         link: Callable[[str, str], str] = reference, forest_image: str | None = None) -> str:
    """The scorecard page (MyST markdown) for the results in ``results_dir``; ``forest_image``: the file
    name of the forest plot (``forest``) to lead with."""
    return _page(rows(results_dir, profile=profile, link=link), archive_link, forest_image)


def _page(table: list[Row], archive_link: str | None, forest_image: str | None) -> str:
    lines = [
        "# Scorecard: which claims hold here",
        "",
        "This page is generated by `mdlib.book.scorecard` from the results (CSV files) of this build; edit the "
        "rules in that module, not this page. Each row is one of the paper's claims, in the paper's order: the "
        "paper's number, ours in a few words, and a verdict; each row's details (ours in full, the interval, the "
        "gates, the smallest effect the design detects, the profile and the figure or table) open below the "
        "table. A verdict is computed by the rule stated at the end, never typed: **holds**, **differs**, "
        f"**{SMALLER}** (the interval contains no effect but excludes the paper's), **inconclusive** (the "
        "interval contains both), or **not measured at this profile** (a result is missing, the run did not "
        "reach the regime the claim is about, or the models do not generalize; the details say which). A "
        "comparative verdict is also recomputed with each seed left out in turn; one that changes is marked "
        f"*{HINGES}*, since a seed's numbers differ between machines and such a verdict may not be "
        "reproduced on another. Our "
        "real data are smaller stand-ins for the paper's (see each chapter), so accuracies are not comparable "
        "in level, only in the direction and size of a difference.",
    ]
    if forest_image:
        lines += ["", "```{figure} " + forest_image, ":name: fig-scorecard-forest", ":width: 100%",
                  ":alt: forest plot of every comparative claim", "",
                  "Every comparative claim at a glance: the estimate (dot) and its 95 % interval (bar), coloured "
                  f"by the verdict (green holds, red differs, purple {SMALLER}, orange inconclusive, grey not "
                  "measured: hollow dot), against the value or band the rule judges it by (grey lines); the "
                  "shaded side is what the paper's claim predicts, and the black diamond is the paper's own "
                  "effect where it gives one. Each row has its own scale and unit (below its axis).", "```"]
    if archive_link:
        lines += ["", f'Every figure, table and provenance record of this build, in one file: '
                      f'<a href="{archive_link}" download>artifacts.zip</a>.']
    lines += ["", "| Claim | Paper | Ours | Verdict |", "|---|---|---|---|"]
    lines += ["| " + " | ".join([md_text(r.short or r.claim), md_text(_paper_short(r)), md_text(r.headline or r.ours),
                                 f"**{md_text(r.verdict.outcome)}**" + (f" ({HINGES})" if r.hinges else "")])
              + " |" for r in table]
    lines += ["", "## Details", ""]
    for r in table:
        lines += [f":::{{dropdown}} {md_text(r.short or r.claim)}: {md_text(r.verdict.outcome)}",
                  f"**Claim.** {md_text(r.claim)}", "",
                  f"**Paper.** {md_text(r.paper)}", "",
                  f"**Ours** (profile {md_text(r.profile)}). {md_text(r.ours)}", "",
                  f"**Verdict.** {md_text(str(r.verdict))}"
                  + (f" Smallest detectable effect: {_detectable_text(r.effect)}." if r.effect else "")
                  + (f" One seed left out: {md_text(r.seeds_left_out)}." if r.seeds_left_out else ""), "",
                  f"**From** {r.link}.", ":::", ""]
    lines += ["## The verdict rules", ""]
    lines += [f"- **{rule.rule_name}.** {rule.sentence}" for rule in RULES]
    return "\n".join(lines) + "\n"


def _paper_short(r: Row) -> str:
    """The paper's side of a row in the short table: its effect where the row has one, else its text."""
    e = r.effect
    if e is not None and math.isfinite(e.paper):
        value = f"{e.paper:+.3g}".replace("-", "−") if e.null == (0.0, 0.0) else f"{e.paper:.3g}"
        return f"{value} ({e.unit})"
    return r.paper if len(r.paper) <= 120 else r.paper[:117].rstrip() + "…"


def _detectable_text(e: Effect) -> str:
    return "n/a (fewer than 2 seeds, or no spread)" if e.detectable != e.detectable else \
        f"±{e.detectable:.3g} from {(e.null[0] + e.null[1]) / 2:g} ({e.unit}; {POWER:.0%} power, 5 % level)"


def write_page(target: Path | str, results_dir: Path | str, *, profile: str | None = None,
               archive_link: str | None = None, link: Callable[[str, str], str] = reference) -> Path:
    """Write the page (``page``) to ``target`` atomically, led by the forest plot (``FOREST``, written
    beside it)."""
    target = Path(target)
    table = rows(results_dir, profile=profile, link=link)
    image = forest(table, target.parent / FOREST)
    text = _page(table, archive_link, image.name if image else None)
    return atomic_write(target, lambda tmp: tmp.write_text(text, "utf-8"))
