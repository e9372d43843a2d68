"""How chapter 04's sentiment tables and sentences look: the step sizes of a Table 1 grid's sweep, Table 1,
the baselines, the pilots, the paper's Table 1 and the movement per parameter group in words. The
numbers come from ``mdlib.experiments.sentiment``; these functions only show them."""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from mdlib.experiments import methods, paper
from mdlib.experiments.methods import method
from mdlib.experiments.sentiment import BASELINES

__all__ = ["baseline_view", "movement_text", "paper_table1_view", "pilots_view", "steps_view", "table1_view"]


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
        "× paper": [f"{m:g}" for m in steps.multiple], "lr": [f"{lr:.3g}" for lr in steps.lr],
        "epochs": ["diverged" if d else f"{e:.0f}" + ("" if r else " (cap)")
                   for d, e, r in zip(steps.diverged, steps.epochs, steps.reached)],
        "training acc.": [f"{a:.1%}" if a == a else "–" for a in steps.train_accuracy],
        "validation acc.": [f"{a:.1%}" if a == a else "–" for a in steps.validation],
        "chosen": ["✓" if c else "" for c in steps.chosen]})


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
                         **{methods.method_text(*methods.method(key)): [f"{r[key]:.2f}" for r in rows]
                            for key in ("1.1", "2", "3")},
                         "ℓ1.1 − GD": [f"{r['gap']:+.2f}" for r in rows]})
