"""The scorecard's rules: which outcome a claim's numbers give, and the sentence that says how.

Every verdict of the scorecard (``mdlib.book.scorecard``) comes from one of these rules: a small pure
function of numbers, whose ``sentence`` is printed on the scorecard page exactly as applied; the
thresholds are named constants, and each sentence is built from them (never edited as text). The
outcomes are ``holds``, ``differs``, ``smaller than the paper's`` (the interval contains no effect but
excludes the paper's), ``inconclusive`` (the interval spans no effect and the paper's, or both answers
where the paper gives no number) and ``not measured at this profile`` (a value is missing, or the regime
the claim is about was not reached; the verdict says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from mdlib.experiments import methods, paper
from mdlib.experiments.stats import GENERALIZATION, POWER

__all__ = ["COST_BAND", "DIFFERS", "E3_CLOSE", "E3_FAR", "Effect", "HOLDS", "INCONCLUSIVE", "KQV_PAPER_REDUCTION",
           "allocation_rule",
           "NOT_MEASURED", "PARITY_MARGIN", "PRUNE_AT", "RULES", "SMALLER", "Verdict", "concentration_rule",
           "cost_rule", "e1_rule", "e2_norm_rule", "e2_rate_rule", "e3_rule", "interval_rule", "not_measured",
           "parity_rule", "pruning_rule", "sparser_rule", "table1_rule", "token_rule", "WEIGHTING_READS",
           "weighting_rule"]

HOLDS, DIFFERS, INCONCLUSIVE, NOT_MEASURED = "holds", "differs", "inconclusive", "not measured at this profile"
SMALLER = "smaller than the paper's"


@dataclass(frozen=True)
class Verdict:
    """An outcome and, for ``not measured``, why (for another outcome, a clause that qualifies it)."""
    outcome: str
    why: str = ""

    def __str__(self) -> str:
        return f"**{self.outcome}**" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Effect:
    """A comparative claim's estimate as the forest plot draws it: the estimate and its interval, the
    ``null`` value (or band, e.g. parity's ±2 points) the claim is judged against, the side the claim
    predicts (+1: above it, -1: below, 0: inside the band), the unit, the paper's effect on the same
    scale (NaN: the paper gives none; ``paper_label`` names it, e.g. as another setup's number) and the
    smallest effect the design detects (``detectable``: its distance from the null, NaN when it cannot be
    computed)."""
    estimate: float
    low: float
    high: float
    null: tuple[float, float]
    direction: int
    unit: str
    paper: float = math.nan
    detectable: float = math.nan
    paper_label: str = "paper"  #: how the forest plot names the paper's effect ("paper, authors' setup")

    def detectable_text(self) -> str:
        """The smallest detectable effect in words: "±0.012 from 0 (unit; 80 % power, 5 % level)"."""
        if self.detectable != self.detectable:
            return "n/a (fewer than 2 seeds, or no spread)"
        return (f"±{self.detectable:.3g} from {(self.null[0] + self.null[1]) / 2:g} ({self.unit}; {100 * POWER:.0f} % power, "
                "5 % level)")



def _rule(name: str, sentence: str):
    """Attach the rule's name and its sentence (printed on the page) to a rule function."""
    def attach(fn):
        fn.rule_name, fn.sentence = name, sentence
        return fn
    return attach


def _judge(*, differs: bool, holds: bool) -> Verdict:
    """The verdict of a rule's two tests: differs wins, then holds, else inconclusive."""
    return Verdict(DIFFERS if differs else HOLDS if holds else INCONCLUSIVE)


def not_measured(why: str) -> Verdict:
    """The verdict ``not measured at this profile``, with why."""
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
        return not_measured("no interval (no spread over seeds, or a missing value)")
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
        return not_measured("fewer than two SVM exponents per path, or no own-p SVM")
    return _judge(differs=any(row[q][1] < row[p][0] for p, row in bands.items() for q in row if q != p),
                  holds=all(row[p][1] < row[q][0] for p, row in bands.items() for q in row if q != p))


#: The E2 rules need two decades of steps above step 10; the norm's slope holds within a factor
#: E2_HOLDS and differs beyond a factor E2_DIFFERS from one decade to the next.
E2_MIN_STEPS, E2_HOLDS, E2_DIFFERS, E2_MIN_POINTS = 1000, 2, 4, 3


@_rule("E2 norm", f"Fit the norm ||W(k)||_p against log k over each of the last two decades of steps (plain "
                  f"steps): logarithmic growth keeps the slope. Holds when, for every p, the last decade's slope "
                  f"is positive and within a factor {E2_HOLDS} of the decade before; differs when, for some p, it "
                  f"is not positive or off by more than a factor {E2_DIFFERS} (the norm stalls, or grows like a "
                  f"power of k); inconclusive otherwise. Not measured when the run has fewer than {E2_MIN_STEPS} "
                  f"steps (two decades above step 10) or fewer than {E2_MIN_POINTS} recorded steps in a decade.")
def e2_norm_rule(slopes: dict[float, tuple[float, float]], steps: int) -> Verdict:
    """``slopes[p] = (slope over the decade before the last, slope over the last decade)``."""
    if steps < E2_MIN_STEPS or not slopes:
        return not_measured(f"{steps} steps, fewer than {E2_MIN_STEPS}")
    if any(math.isnan(x) for pair in slopes.values() for x in pair):
        return not_measured(f"fewer than {E2_MIN_POINTS} recorded steps in a decade")
    ratios = [last / before if before > 0 else math.inf for before, last in slopes.values()]
    return _judge(differs=any(last <= 0 for _, last in slopes.values())
                  or any(not 1 / E2_DIFFERS <= r <= E2_DIFFERS for r in ratios),
                  holds=all(1 / E2_HOLDS <= r <= E2_HOLDS for r in ratios))


E2_RATE = ("Compare the directional divergence D to the own SVM at step K (the last) and K/10 (plain steps): a "
           "decay like 1/log k leaves D(K) = D(K/10) log(K/10) / log K. Holds when, for every p, D(K) is at most "
           "that (a decay at least as fast as the bound); differs when, for some p, D did not decrease over the "
           "last decade; inconclusive otherwise (decreasing, but slower than 1/log k). Not measured when the run "
           f"has fewer than {E2_MIN_STEPS} steps.")


@_rule("E2 rate", E2_RATE)
def e2_rate_rule(divergences: dict[float, tuple[float, float]], steps: int) -> Verdict:
    """``divergences[p] = (D(K/10), D(K))`` with K = ``steps``."""
    if steps < E2_MIN_STEPS or not divergences:
        return not_measured(f"{steps} steps, fewer than {E2_MIN_STEPS}")
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
        return not_measured("no runs")
    return _judge(differs=any(not x < E3_FAR for x in values),  # NaN counts as far
                  holds=all(x <= E3_CLOSE for x in values))




def _gates(paired: str = "paired seeds", accuracy: str = "mean test accuracy at the stop rule") -> str:
    """The gates' sentence: what makes a sentiment claim not measured (``_gated``)."""
    return (f"Not measured with fewer than 2 {paired}, when some ℓ1.1 or GD run did not reach the stop rule "
            f"({100 * paper.STOP_TRAIN_ACCURACY:g} % training accuracy: the claim is about trained models), or "
            f"when a compared method's {accuracy} is below 50 % + {GENERALIZATION:g} × (baseline − 50 %), the "
            f"baseline being the bag-of-words Naive Bayes on the same tokens and splits (models that do not "
            f"generalize say nothing about generalization).")


_DETECTABLE = (f"The row shows the smallest effect the design detects with {100 * POWER:.0f} % power at the 5 % level, at "
               f"the observed spread: (t₀.₉₇₅ + t₀.₈₀) times the estimate's standard error (s / √n over seeds; over "
               f"seeds and test sentences, the crossed interval's).")


#: How the sentiment accuracy rules take their interval: over seeds and test sentences together.
_CROSSED = ("with the 95 % interval over the seeds and the test sentences together (both are samples of what the "
            "claim is about: the seeds' variance of the mean plus the sentences', from every model's prediction on "
            "every test sentence; t quantile with the seeds' degrees of freedom; the paired t interval over seeds "
            "alone is shown beside it)")


@_rule("Table 1", "Per depth and setup (the authors' replication, and each named variation): ℓ1.1 minus GD in test "
                  "accuracy at the stop rule (the last epoch), seed by seed (a seed gives both the same "
                  "initialization, data order and dropout), " + _CROSSED + ". Holds when it lies "
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
        return not_measured(f"{seeds} paired seed(s)")
    links = ([f"{unreached} run(s) did not reach the stop rule"] if unreached else []) + ([below] if below else [])
    if links:
        return not_measured("not in a generalizing regime: " + "; ".join(links))
    return interval_rule(low, high, paper_effect)


@_rule("Table 1, taken apart", "Not an experiment of the paper's: at each embedding scale the 2 × 2 ran at, an arm "
                               "against GD at its chosen global step, in test accuracy at the stop rule, seed by "
                               "seed, " + _CROSSED + ". Geometry: ℓ1.1 with each tensor's step matched, at its "
                               "initial mean |w|, to GD's (what is left is the geometry of the step); allocation: GD "
                               "with each tensor's step matched to ℓ1.1's (what is left is how large a step each "
                               "tensor starts with); each arm at its own global multiplier of the matched steps, "
                               "chosen on validation as the methods' steps are. Holds when the interval lies above "
                               "0 (the factor alone raises the accuracy), differs when below, inconclusive when it "
                               "contains 0, judged against zero only (the paper's gap is another setup's number, not "
                               "this factor's). " + _gates() + " Where a step tied with a choice trained every "
                               "seed, the verdict says whether it holds at every tied pair. " + _DETECTABLE)
def allocation_rule(low: float, high: float, seeds: int, unreached: int, below: str = "") -> Verdict:
    """As ``table1_rule``, for a contrast of the 2 x 2 (the arm and GD's runs), against zero only."""
    return _gated(low, high, seeds, unreached, below)


@_rule("Table 1 across scales", "Not an experiment of the paper's: ℓ1.1 minus GD in test accuracy at the stop rule "
                                 "at each embedding std of the series, at that std's own chosen steps, with the std "
                                 "as the unit (its step choice is shared by its seed pairs): the least-squares slope "
                                 "of the per-std gaps against log10 of the std, over the stds whose chosen runs all "
                                 "reached the stop rule, with its 95 % t interval on (stds − 2) degrees of freedom. "
                                 "Holds when it lies above 0 (the gap rises with the scale), differs when below, "
                                 "inconclusive when it contains 0. Not measured with fewer than 3 stds at the stop "
                                 "rule. A change of sign is claimed only where a std on each side has an interval "
                                 "that excludes zero.")
def series_rule(low: float, high: float, stds: int) -> Verdict:
    """``stds``: the stds at the stop rule behind the slope."""
    if stds < 3:
        return not_measured(f"{stds} std(s) at the stop rule (3 needed for a slope with an interval)")
    return interval_rule(low, high)


@_rule("Token selection", "Per sentence set: each seed's ℓ1.1 model against the same seed's GD model, the share "
                          "of the non-tied sentences that ℓ1.1 wins (puts more normalized [CLS] attention on the "
                          "pivotal word); the seeds are the units (the sentences are shared by every seed, so the "
                          "comparisons cluster by seed): the mean of the per-seed rates, with the 95 % interval over "
                          "the seeds and the sentences together (each seed's rate linearized over its sentences; "
                          "the t interval over seeds alone is shown beside it). "
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
KQV_PAPER_REDUCTION = sum(paper.KQV_ABOVE[methods.L1_1]) / sum(paper.KQV_ABOVE[methods.GD]) - 1


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
       "beside it, not judged: they follow the step size and the training length. Against its null: mirror "
       "descent sums its steps in the dual, Δu = m(W) − m(W(0)), and ΔW ≈ |W(0)|^(2−p) Δu / (p − 1), so the "
       "initial magnitudes alone make ΔW sparser than Δu (for a uniform W(0) at p = 1.1, by a factor of about "
       "0.78 in effective density). For K/Q/V the row beside it judges ℓ1.1's ΔW against its own init-weighting "
       "null (the rule \"Sparsity beyond the init weighting\"); for the ViT the verdict says whether ℓ1.1's dual "
       "change is itself sparser than Adam's change (paired 95 % t interval below 0: sparser beyond the init "
       "weighting), and the row shows the density the weighting alone predicts. " + _DETECTABLE)
def sparser_rule(low: float, high: float, seeds: int, unfinished: str = "", paper_effect: float = math.nan,
                 beyond: str = "") -> Verdict:
    """``unfinished``: why the models are not trained to the end ("" when they are); ``paper_effect``: the
    paper's ℓ1.1 − baseline difference in density (negative: sparser), NaN when it gives none; ``beyond``:
    whether the change is sparser than the init weighting alone predicts, in words (the verdict's clause)."""
    if seeds < 2:
        return not_measured(f"{seeds} paired seed(s)")
    if unfinished:
        return not_measured(unfinished)
    verdict = interval_rule(-high, -low, -paper_effect)
    return verdict if verdict.outcome == NOT_MEASURED else Verdict(verdict.outcome, beyond)


#: How ``weighting_rule`` says each outcome in words (the verdict's clause).
WEIGHTING_READS = {HOLDS: "sparser than its init weighting predicts",
                   DIFFERS: "no sparser than its init weighting predicts: denser than its null",
                   SMALLER: "no sparser than its init weighting predicts by the paper's margin",
                   INCONCLUSIVE: "cannot tell whether it is sparser than its init weighting predicts"}


@_rule("Sparsity beyond the init weighting (K/Q/V)",
       "Mirror descent sums its steps in the dual, Δu = m(W) − m(W(0)), and W = m⁻¹(m(W(0)) + Δu): to first order "
       "ΔW = |W(0)|^(2−p) Δu / (p − 1), so the initial magnitudes alone make ℓ1.1's ΔW sparser than what it "
       "learned. The null of each ℓ1.1 model is its own change with the dual change replaced by unstructured "
       "noise, m⁻¹(m(W(0)) + ξ) − W(0), ξ independent Gaussian at each matrix's root-mean-square dual change "
       "(the mean over seeded draws): it keeps the initialization, the exact map and how "
       "far each matrix moved, and removes only the structure of the dual change within the matrices (its "
       "concentration on few entries, or on the entries the weighting favours: training's, not the "
       "initialization's). Per seed, the effective density of ℓ1.1's ΔW of the key, query and value matrices "
       "minus its null's (the same model, the same initialization), with the paired 95 % t interval. Holds ("
       f"{WEIGHTING_READS[HOLDS]}) when it lies below 0; differs ({WEIGHTING_READS[DIFFERS]}) when above; "
       + SMALLER_SENTENCE.format(null="0", paper=f"{WEIGHTING_READS[SMALLER]}: its {-100 * KQV_PAPER_REDUCTION:.0f} "
                                                 "% fewer entries above 0.06 read as the same relative reduction of "
                                                 "the null's density")
       + ". Not measured with fewer than 2 seeds, when a run did not reach the stop "
       "rule, or when the build has no null. " + _DETECTABLE)
def weighting_rule(low: float, high: float, seeds: int, unfinished: str = "",
                   paper_effect: float = math.nan) -> Verdict:
    """ℓ1.1's ΔW density minus its init-weighting null's, paired by seed: ``sparser_rule``'s outcome, said in
    the words of ``WEIGHTING_READS``. ``unfinished``: why the models are not trained to the end ("" when they
    are); ``paper_effect``: the paper's reduction on this scale (negative), NaN when none."""
    verdict = sparser_rule(low, high, seeds, unfinished, paper_effect)
    return verdict if verdict.outcome == NOT_MEASURED else Verdict(verdict.outcome, WEIGHTING_READS[verdict.outcome])


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
        return not_measured(f"{seeds} seed per method")
    if not levelled:
        return not_measured("a training loss had not levelled off")
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
        return not_measured("no mirror-descent timing")
    return _judge(differs=any(high < lo or low > hi for low, high in intervals),
                  holds=all(lo <= low and high <= hi for low, high in intervals))


RULES = [e1_rule, e2_norm_rule, e2_rate_rule, e3_rule, table1_rule, allocation_rule, series_rule, token_rule,
         concentration_rule, sparser_rule, weighting_rule, pruning_rule, parity_rule, cost_rule]
