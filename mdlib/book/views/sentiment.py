"""How chapter 04's sentiment tables and sentences look: the step sizes of a Table 1 grid's sweep, Table 1,
the baselines, the pilots, the paper's Table 1, the movement per parameter group in words, the verdict at
every tied pair of steps, the 2 x 2 and the embedding-scale series; and what the scorecard's rows of the
sentiment models let a reader conclude (chapter 04's 2 x 2 and its verdicts' stability, chapter 06's
init-weighting null). The numbers come from ``mdlib.experiments.sentiment``, ``allocation`` and
``estimates``, the verdicts from ``mdlib.book.scorecard``; these functions only show them."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from mdlib.book.scorecard.claims import DECOMPOSITION, FRAGILE, KQV_PARTS, Row
from mdlib.book.scorecard.rules import DIFFERS, HOLDS, INCONCLUSIVE, SMALLER
from mdlib.book.views.step_grid import edge_clause
from mdlib.experiments import estimates, methods, paper
from mdlib.experiments.sentiment import allocation, chapter
from mdlib.experiments.estimates import Estimate, multiple_text, number_text
from mdlib.experiments.methods import method
from mdlib.experiments.sentiment import BASELINES

__all__ = ["CONTRAST_NAMES", "TABLE1_PARTS", "allocation_runs_view", "authors_pilots_view", "baseline_view",
           "contrasts_view", "edges_text", "effective_steps_view", "movement_text",
           "paper_table1_view", "pilots_view", "scale_of", "series_reading", "series_view", "source_text",
           "steps_view", "table1_parts", "table1_reading", "table1_stability", "table1_view", "tied_view",
           "timings_text", "weighting_reading"]


def movement_text(table: pd.DataFrame, names: Mapping[str, str]) -> str:
    """``movement``'s ``table`` in words for chapter 04's prose: the mean movement per group, "embeddings:
    a / b / c; ..." over the methods in the table's order (named by ``names``: key -> text), and ℓ1.1's
    over GD's per group ("not measured" without both)."""
    keys = list(dict.fromkeys(table.method))
    ratio = table.groupby(["group", "method"]).movement.mean().unstack().reindex(list(dict.fromkeys(table.group)))
    means = "; ".join(f"{g}: " + " / ".join(f"{ratio.loc[g, k]:.3g}" for k in keys) for g in ratio.index)
    over = (" / ".join(f"{g} {ratio.loc[g, methods.L1_1] / ratio.loc[g, methods.GD]:.1f}×" for g in ratio.index)
            if {methods.L1_1, methods.GD} <= set(keys) else "not measured")
    return f"{means} ({' / '.join(names[k] for k in keys)}); ℓ1.1 over GD: {over}"


def _method_name(key: str) -> str:
    """A method's label, or an arm's name (``methods.arm_text``: "ℓ1.1, GD's steps per tensor")."""
    return methods.arm_text(key) if "@" in str(key) else methods.method_label(*method(key))


def steps_view(steps: pd.DataFrame) -> pd.DataFrame:
    """The step-size table of grids' sweep runs (with their ``setup`` when given), as the book shows it."""
    lead = {"setup": steps.setup} if "setup" in steps else {}
    return pd.DataFrame(lead | {
        "layers": steps.layers, "method": [_method_name(k) for k in steps.method],
        "× paper": [multiple_text(m, "") for m in steps.multiple], "lr": [f"{lr:.3g}" for lr in steps.lr],
        "epochs": ["diverged" if d else f"{e:.0f}" + ("" if r else " (cap)")
                   for d, e, r in zip(steps.diverged, steps.epochs, steps.reached)],
        "training acc.": [f"{a:.1%}" if a == a else "–" for a in steps.train_accuracy],
        "validation acc.": [f"{a:.1%}" if a == a else "–" for a in steps.validation],
        "chosen": ["✓" if c else "tied" if t else "" for c, t in zip(steps.chosen, steps.get("tied", steps.chosen))]})


def _mean_std(mean: float, std: float) -> str:
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std == std else "")


def baseline_view(table: pd.DataFrame) -> pd.DataFrame:
    """The baselines (``baseline``) as the book shows them."""
    return pd.DataFrame({"baseline": [BASELINES[b] for b in table.baseline],
                         "C": table.C.map(lambda c: "–" if pd.isna(c) else f"{c:g}"),
                         "validation acc.": table.validation_accuracy.map("{:.1%}".format),
                         "test acc.": table.test_accuracy.map("{:.1%}".format), "training sentences": table.train_size})


def table1_view(cells: pd.DataFrame, baseline: float | None = None) -> pd.DataFrame:
    """Table 1 (``cell_table``) as the book shows it: one row per cell, and the baseline's test accuracy
    (``baseline``, a fraction) as a last row when given."""
    view = pd.DataFrame({
        "layers": cells.layers, "method": [_method_name(k) for k in cells.method],
        "test acc. at the stop (%)": [_mean_std(m, s) for m, s in zip(cells.test, cells.test_std)],
        "best over epochs (%, selected on test)": [_mean_std(m, s) for m, s in zip(cells.best, cells.best_std)],
        "epochs (reached / runs)": [f"{e:.0f} ({r}/{n})" for e, r, n in zip(cells.epochs, cells.reached, cells.runs)],
        "paper (%, best over epochs)": [f"{p:.2f}" if p == p else "–" for p in cells.paper],
        "paper epochs": [f"{e:.0f}" if e == e else "–" for e in cells.paper_epochs]})
    if baseline is not None:
        row = dict.fromkeys(view.columns, "–") | {"layers": "", "method": "bag-of-words Naive Bayes",
                                                  "test acc. at the stop (%)": f"{100 * baseline:.2f}"}
        view = pd.concat([view, pd.DataFrame([row])], ignore_index=True)
    return view


def authors_pilots_view(table: pd.DataFrame) -> pd.DataFrame:
    """``sentiment.authors_pilots`` as the book shows them: one row per run, its readings joined by " / "."""
    rows = []
    for (size, width, key, multiple), run in table.groupby(["train_size", "width", "method", "multiple"], sort=False):
        end = run.event.iloc[-1]
        rows.append({"training set, width": f"{size:,}, {width}", "method, step": f"{_method_name(key)}, {multiple:g}×",
                     "epochs": " / ".join(map(str, run.epoch)) + (f" ({end})" if end else ""),
                     "training acc.": " / ".join(f"{a:.3f}" for a in run.train_accuracy),
                     "test acc.": " / ".join(f"{a:.2f}" for a in run.test_accuracy),
                     "s / epoch": f"{run.seconds_per_epoch.iloc[-1]:.1f}"})
    return pd.DataFrame(rows)


def pilots_view(table: pd.DataFrame) -> pd.DataFrame:
    """``pilots`` as the book shows them."""
    return pd.DataFrame({
        "setup": table.setup.map(lambda s: paper.SETUP_NAMES.get(s, s)), "method": [_method_name(k) for k in table.method],
        "× paper": table.multiple.map("{:g}".format), "seed": table.seed,
        "epochs": [f"{e}" + ("" if r else " (cap)") for e, r in zip(table.epochs, table.reached)],
        "training acc.": table.train_accuracy.map("{:.1%}".format),
        "test acc.": table.test_accuracy.map("{:.1%}".format),
        "validation acc.": table.validation_accuracy.map("{:.1%}".format),
        "s / epoch": table.seconds_per_epoch.map("{:.1f}".format)})


def paper_table1_view() -> pd.DataFrame:
    """The paper's Table 1 for display: per number of layers, the best test accuracy (%) of ℓ1.1, GD and
    ℓ3 and the reported ℓ1.1 − GD gap (points), from ``mdlib.experiments.paper``."""
    rows = paper.table1_rows()
    return pd.DataFrame({"layers": [r["layers"] for r in rows],
                         **{methods.key_text(key): [f"{r[key]:.2f}" for r in rows]
                            for key in ("1.1", "2", "3")},
                         "ℓ1.1 − GD": [f"{r['gap']:+.2f}" for r in rows]})


#: How the book names the 2 x 2's contrasts (``estimates.CONTRASTS``).
CONTRAST_NAMES = {
    "gap": "ℓ1.1 − GD, one global step each",
    "geometry": "geometry at GD's allocation: ℓ1.1 at GD's steps per tensor − GD",
    "allocation": "allocation at GD's geometry: GD at ℓ1.1's steps per tensor − GD",
    "geometry at ℓ1.1's allocation": "geometry at ℓ1.1's allocation: ℓ1.1 − GD at ℓ1.1's steps per tensor",
    "allocation at ℓ1.1's geometry": "allocation at ℓ1.1's geometry: ℓ1.1 − ℓ1.1 at GD's steps per tensor",
    "interaction": "interaction: the geometry's effect at ℓ1.1's allocation − at GD's"}


def _interval(row: Mapping[str, Any]) -> str:
    e = Estimate(row["value"], row["low"], row["high"], int(row["n"]), seeds_low=row.get("seeds_low", math.nan),
                 seeds_high=row.get("seeds_high", math.nan))
    return e.text() + (f" (seeds only [{number_text(e.seeds_low)}, {number_text(e.seeds_high)}])" if e.crossed else "")


def tied_view(tied: pd.DataFrame, weights: Mapping[str, float]) -> pd.DataFrame:
    """``estimates.tied_contrasts`` as the book shows it: one row per combination of tied steps, the
    multiple of each method, whether it is the choices' own, the seeds and the contrast with its
    intervals (points)."""
    return pd.DataFrame({**{methods.arm_text(k): [multiple_text(m) for m in tied[f"multiple_{k}"]] for k in weights},
                         "the choices": ["✓" if c else "" for c in tied.chosen],
                         "seeds": tied.n.astype(int),
                         "points (over seeds and sentences; seeds only)": [_interval(r) for _, r in tied.iterrows()]})


def series_view(points: pd.DataFrame) -> pd.DataFrame:
    """``chapter.series_points`` as the book shows it: one row per embedding std."""
    first, second = estimates.COMPARED
    return pd.DataFrame({
        "σ": [f"{x:g}" for x in points.embedding_std],
        "ℓ1.1 × (tied)": [f"{multiple_text(m)} ({', '.join(multiple_text(float(t)) for t in ties.split())})"
                          for m, ties in zip(points[f"multiple_{first}"], points[f"tied_{first}"])],
        "GD × (tied)": [f"{multiple_text(m)} ({', '.join(multiple_text(float(t)) for t in ties.split())})"
                        for m, ties in zip(points[f"multiple_{second}"], points[f"tied_{second}"])],
        "embedding steps, ℓ1.1 / GD": [f"{r:.2g}" for r in points.embedding_ratio],
        "at the stop rule": [f"{r}/{n}" for r, n in zip(points.reached_runs, points.runs)],
        "ℓ1.1 − GD (points)": [_interval(r) for _, r in points.iterrows()]})


def series_reading(points: pd.DataFrame, trend: Estimate, against_ratio: Estimate) -> str:
    """What the series says about the sign of ℓ1.1 − GD, in words that follow its numbers: where the
    interval at a std in the regime excludes zero and on which side, whether the sign changes (only when a
    std on each side excludes zero), and the std-level slopes against log10 of the std and of the
    embedding-step ratio."""
    if points.empty:
        return "not measured: no std of the series in this build"
    kept = points[points.reached.astype(bool)]
    capped = points[~points.reached.astype(bool)]
    below = [f"{x:g}" for x, h in zip(kept.embedding_std, kept.high) if h < 0]
    above = [f"{x:g}" for x, lo in zip(kept.embedding_std, kept.low) if lo > 0]
    if below and above:
        sign = (f"the sign of ℓ1.1 − GD changes with the embedding scale: GD is ahead at σ {' and '.join(below)} and "
                f"ℓ1.1 at σ {' and '.join(above)}, each interval excluding zero")
    else:
        sides = ([f"GD is ahead at σ {' and '.join(below)}"] if below else []) + (
            [f"ℓ1.1 is ahead at σ {' and '.join(above)}"] if above else [])
        sign = ("no change of sign is shown: " + ("; ".join(sides) + ", and no std on the other side has an interval "
                                                  "that excludes zero" if sides else
                                                  "no std's interval excludes zero"))
    slope = ("too few stds in the regime for a slope" if trend.low != trend.low else
             f"the gap moves {trend.text()} points per tenfold std and {against_ratio.text()} per tenfold ratio of "
             f"embedding steps (the stds as units, {trend.n} in the regime, t on {trend.n - 2} degrees of freedom), "
             + ("a slope that excludes zero" if trend.low > 0 or trend.high < 0 else "a slope this design cannot tell "
                "from zero"))
    apart = (f"; at σ {' and '.join(f'{x:g}' for x in capped.embedding_std)} a chosen run stopped at the epoch cap, "
             "out of the regime and not judged" if len(capped) else "")
    return f"{sign}; {slope}{apart}"


def contrasts_view(effects: Mapping[float, Mapping[str, Estimate]], names: Mapping[str, str]) -> pd.DataFrame:
    """The 2 x 2's contrasts at each embedding std (``estimates.allocation_effects``), as the book shows them:
    one row per contrast (``names``: key -> how the book names it), one column per std."""
    rows = []
    for key, name in names.items():
        rows.append({"contrast": name} | {f"σ {std:g}": (f"{e[key].both_text()} (n = {e[key].n})" if e[key].n else "–")
                                          for std, e in effects.items()})
    return pd.DataFrame(rows)


def effective_steps_view(table: pd.DataFrame) -> pd.DataFrame:
    """``allocation.step_table`` as the book shows it: one row per (setup, method or arm), one column per
    parameter group, each cell the effective step and, in brackets, its ratio to GD's in the same setup."""
    cells = table.assign(cell=[f"{step:.2g} ({ratio:.2g}×)" if ratio == ratio else f"{step:.2g}"
                               for step, ratio in zip(table.effective_step, table.vs_gd)])
    wide = cells.pivot_table(index=["setup", "method"], columns="group", values="cell", aggfunc="first", sort=False)
    wide = wide[list(dict.fromkeys(table.group))].reset_index()
    lrs = table.groupby(["setup", "method"], sort=False).lr.first()
    return pd.concat([pd.DataFrame({"setup": wide.setup, "method": [methods.arm_text(k) for k in wide.method],
                                    "lr": [f"{lrs[s, k]:.2g}" for s, k in zip(wide.setup, wide.method)]}),
                      wide.drop(columns=["setup", "method"])], axis=1)


def allocation_runs_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The 2 x 2s' chosen runs (``chapter.two_by_two``, with ``embedding_std``) as the book shows them: one
    row per std and method or arm, with its steps, the test accuracy at the stop rule and the best over
    epochs (mean ± sd over seeds, %), the epochs (mean, and how many runs reached the stop rule) and the
    validation accuracy."""
    def shown(x: pd.Series) -> str:
        return f"{100 * x.mean():.2f}" + (f" ± {100 * x.std():.2f}" if len(x) > 1 else "")

    rows = []
    for (std, key, steps), part in runs.groupby(["embedding_std", "method", "steps"], sort=False):
        matched = (f"{multiple_text(part.multiple.iloc[0])} per tensor, matched to {methods.arm_text(allocation.ARMS[key][1])}'s"
                   if key in allocation.ARMS else "")
        rows.append({"σ": f"{std:g}", "method": methods.arm_text(key),
                     "steps": matched or f"one global step, {multiple_text(part.multiple.iloc[0])} ({part.lr.iloc[0]:.2g})",
                     "test acc. at the stop (%)": shown(part.last_test.dropna()),
                     "best over epochs (%)": shown(part.best_test.dropna()),
                     "epochs (reached / runs)": f"{part.epochs.mean():.0f} ({int(part.reached.sum())}/{len(part)})",
                     "validation acc. (%)": shown(part.validation.dropna())})
    return pd.DataFrame(rows)


def source_text(record: Mapping[str, Any] | None, profile: str) -> str:
    """Where the long profile's runs a page shows come from: trained by this execution (``record`` None), or
    measured once by the build a committed record describes (its command, commit, time and CPU), or in
    neither (``chapter.absent``)."""
    if record is None:
        return f"here they were trained by this execution (profile {profile}), from its own runs"
    if chapter.absent(record):
        return (f"not in this build (profile {profile}): the overnight profile's runs are not committed under data/ "
                "yet (long_committed off), so this page shows none of them and the scorecard reads their verdicts "
                "as not measured")
    commit = (record.get("git") or {}).get("commit") or "an unknown commit"
    machine = (record.get("hardware") or {}).get("cpu") or "an unrecorded CPU"
    values = record.get("parameters") or {}
    layers = values.get("layers")
    layers = " / ".join(map(str, layers)) if isinstance(layers, list) else layers
    files = ", ".join(f"data/{name}" for name in chapter.COMMITTED.values())  # plain text: glued as such
    command = str(record.get("command")).replace(" --profile ", " with the profile ")  # "--" would print as a dash
    return (f"this page reads them as measured once by {command} at commit {commit[:12]} "
            f"({str(record.get('time', ''))[:10]}, {machine}; {values.get('dataset')}, width {values.get('width')}, "
            f"{layers} layers), committed as {files}; the overnight profile trains them again from its own runs")


def edges_text(runs: pd.DataFrame, first: Mapping[str, list[float]], grow: int, by: tuple[str, ...] = ("layers",)) -> str:
    """Where each choice of a grid's (or the long part's) runs sits among the steps it tried
    (``views.step_grid.edge_clause``), "" when every one is strictly inside: ``runs`` with ``method``,
    ``multiple`` and ``chosen`` and the columns ``by`` that tell its cells apart (an arm's first candidates
    are those of ``first`` under its key, else its method's)."""
    keyed = runs.assign(method=estimates.keyed(runs.method))
    clauses = []
    for cell, part in keyed.groupby([*by, "method"], sort=False):
        cell = cell if isinstance(cell, tuple) else (cell,)
        chosen = set(part.multiple[part.chosen.astype(bool)])
        if len(chosen) != 1:
            continue
        key = cell[-1]
        where = ", ".join(f"σ {value:g}" if name == "embedding_std" else f"{value}" if name == "part"
                          else f"{value} {name}" for name, value in zip(by, cell[:-1]))
        clauses.append(edge_clause(f"{methods.arm_text(key)}" + (f" ({where})" if where else ""), chosen.pop(),
                                   sorted(set(part.multiple)), first.get(key, first.get(key.partition("@")[0], [])),
                                   grow, multiple_text))
    return "; ".join(c for c in clauses if c)


def timings_text(long_runs: pd.DataFrame, runs: pd.DataFrame, workers: int) -> str:
    """How long the long part's runs and this page's own trained (their ``seconds``, summed over their epochs,
    one core each), and about how long that is on ``workers`` cores at once."""
    def hours(seconds: float) -> str:
        return f"{seconds / 3600:.1f} h"

    parts = []
    for name, table in (("the long part's", long_runs), ("this page's", runs)):
        if "seconds" in table and table.seconds.notna().any():
            total = float(table.seconds.fillna(0).sum())
            parts.append(f"{name} {int(table.seconds.notna().sum())} runs trained for {hours(total)} of one core each, "
                         f"about {hours(total / workers)} on {workers} cores")
    return "; ".join(parts) or "not recorded"


#: Chapter 04's comparisons: name -> the start of its rows' short names (``scorecard.rows``).
TABLE1_PARTS = {"variation": "Table 1, a variation", **{name: f"Table 1, taken apart ({factor} at"
                                                         for name, (factor, _) in DECOMPOSITION.items()},
                "series": "Table 1 across embedding scales"}


def table1_parts(found: list[Row]) -> dict[str, list[Row]]:
    """Chapter 04's rows by ``TABLE1_PARTS`` name: the variation's gap, the geometry and the allocation effects
    (one row per embedding scale of the 2 x 2) and the series ([] where the build has no such row)."""
    return {name: [r for r in found if r.short.startswith(start)] for name, start in TABLE1_PARTS.items()}


_GEOMETRY_READS = {
    HOLDS: "with the steps matched, ℓ1.1's geometry trains the more accurate model",
    DIFFERS: "with the steps matched, ℓ1.1's geometry trains the less accurate model",
    INCONCLUSIVE: "with the steps matched, the geometry's effect cannot be told from zero by this design",
}
_ALLOCATION_READS = {
    HOLDS: "ℓ1.1's initial per-tensor step allocation raises GD's accuracy",
    DIFFERS: "ℓ1.1's initial per-tensor step allocation costs GD accuracy",
    INCONCLUSIVE: "ℓ1.1's initial per-tensor step allocation does not move GD measurably (the smallest move "
                  "this design detects is in the row)",
}


def scale_of(row: Row) -> str:
    """The embedding std a 2 x 2 row is at, as its name writes it ("σ 0.02")."""
    return row.short.split(" at ", 1)[1].split(",", 1)[0] if " at " in row.short else ""


def table1_reading(found: list[Row]) -> str:
    """What chapter 04's 2 x 2 lets a reader conclude, in words that follow the build's outcomes (the
    geometry and the allocation effects at each scale; a fragile or unsettled outcome is read as a lean,
    an unmeasured one as nothing): the page's sentence under the verdicts."""
    parts = table1_parts(found)
    sentences = []
    for name, reads in (("geometry", _GEOMETRY_READS), ("allocation", _ALLOCATION_READS)):
        if not parts[name]:
            sentences.append(f"the {name} effect is not measured at this profile")
        for row in parts[name]:
            if row.verdict.outcome not in reads:
                sentences.append(f"at {scale_of(row)} the {name} effect is {row.verdict.outcome}")
                continue
            lean = row.fragile or "not settled" in row.verdict.why
            sentences.append(f"at {scale_of(row)}, {reads[row.verdict.outcome]}"
                             + (" (a lean, not settled: the verdict is fragile or turns at a tied step)" if lean else ""))
    text = "; ".join(sentences)
    return text[:1].upper() + text[1:] + "."


_WEIGHTING_READS = {
    HOLDS: "ℓ1.1's change of the key, query and value weights is sparser than its init weighting predicts: its "
           "dual change (the summed gradients) is itself concentrated within the matrices, on few entries or on "
           "those the weighting favours, so the initial magnitudes do not account for all of its sparsity (whether "
           "GD's summed gradients are as concentrated is not judged: the dual change's density is shown beside it)",
    DIFFERS: "ℓ1.1's change is denser than its init-weighting null: its dual change is spread more evenly than "
             "unstructured noise, so the weighting by the initial magnitudes accounts for all of its sparsity",
    SMALLER: "ℓ1.1's change is no sparser than its init weighting predicts, by the paper's margin: any sparsity "
             "beyond the weighting by the initial magnitudes is smaller than the paper's effect",
    INCONCLUSIVE: "this design cannot tell whether ℓ1.1's change is sparser than its init weighting predicts",
}


def weighting_reading(found: list[Row]) -> str:
    """What chapter 06's comparison of ℓ1.1's ΔW with its init-weighting null lets a reader conclude, in words
    that follow the row's outcome (a fragile one read as a lean, an unmeasured one as nothing)."""
    row = next((r for r in found if r.short.endswith(f"({KQV_PARTS['null']})")), None)
    if row is None or row.verdict.outcome not in _WEIGHTING_READS:
        return "ℓ1.1's change against its init-weighting null is not measured at this profile."
    text = _WEIGHTING_READS[row.verdict.outcome]
    return text[:1].upper() + text[1:] + (f" (a lean, not settled: the verdict is {FRAGILE})" if row.fragile else "") + "."


def table1_stability(found: list[Row]) -> str:
    """How likely an independent rebuild reaches each of chapter 04's verdicts, in words: "the variation's gap
    0.87, the geometry at σ 0.02 at least 0.55, the allocation at σ 0.02 0.91 (each ± 0.01 or less; the step
    choice re-made: another step in 23 % of rebuilds)"."""
    named = {"variation": "the variation's gap", "geometry": "the geometry", "allocation": "the allocation",
             "series": "the series' slope"}
    checked = [(f"{named[name]}" + (f" at {scale_of(row)}" if scale_of(row) else ""), row.stability)
               for name, rows in table1_parts(found).items() for row in rows if row.stability]
    if not checked:
        return "not checked at this profile"
    text = ", ".join(f"{name} {'at least ' if s.bound else ''}{s.probability:.2f}" for name, s in checked)
    text += f" (each ± {max(s.error for _, s in checked):.2f} or less"
    flips = [s.flips for _, s in checked if s.rechosen]
    return text + (f"; the step choice re-made: another step in {max(flips):.0%} of rebuilds)" if flips else ")")
