"""How chapter 09's step-size guide looks: the first step's table, the chosen step sizes, the movement per
parameter group, and the chapter's words on the sweep. The numbers come from
``mdlib.experiments.step_size_guide``; these functions only show them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mdlib.book.views.step_grid import edge_clause, tie_clause
from mdlib.experiments import methods
from mdlib.experiments.step_size_guide import MOVEMENT_GROUPS, StepSizeGrid, StepSizes

__all__ = ["best_view", "edges_text", "first_step_view", "movement_view", "summary_texts", "task_text", "ties_text"]


def _lr_text(lr: float) -> str:
    return f"{lr:.2g}"


def summary_texts(result: StepSizes, moved: pd.DataFrame | None = None) -> dict[str, str]:
    """What chapter 09's prose quotes from a sweep, as glue texts: ``best`` (each method's chosen lr),
    ``agreement`` (how many exponents other than 2 chose the lr matched_lr predicts from p = 2's, within
    one step of the grid), ``ratios`` (chosen / predicted per exponent), ``implied`` (the scale at which
    the prediction would be exact), ``spread`` (how far apart the exponents' choices lie, in lr and in
    matched SGD steps), ``edges`` (where each choice sits among the multiples tried, and for one at an end
    what was tried: ``edges_text``), ``ties`` (the candidates tied with each choice: ``ties_text``),
    ``overflows`` (the diverged runs),
    the best losses and accuracies, ``sgd-check`` (torch SGD against mirror descent at p = 2, same lr and
    seeds), ``seeds``, and with ``moved`` (``StepSizes.movement()``) ``movement`` (the LayerNorm gains'
    movement over the position embeddings' per exponent)."""
    grid, best, runs = result.config, result.best.set_index("method"), result.runs
    ordered = sorted(grid.multiples)
    step = max((b / a for a, b in zip(ordered, ordered[1:])), default=math.inf)
    others = [k for k in grid.methods if k not in ("2", "adamw")]
    agree = [k for k in others if 1 / step / 1.001 <= best.ratio[k] <= step * 1.001]
    texts = {"best": ", ".join(f"{_lr_text(best.lr[k])} at p = {k}" for k in grid.methods if k != "adamw")
             + f", and {_lr_text(best.lr['adamw'])} for AdamW"}
    texts["agreement"] = f"{len(agree)} of {len(others)}" + (f" ({', '.join('p = ' + k for k in agree)})" if agree else "")
    texts["ratios"] = ", ".join(f"{best.ratio[k]:.2g} at p = {k}" for k in others)
    texts["implied"] = ", ".join(f"{best.implied_scale[k]:.2g} at p = {k}" for k in others)
    md = [k for k in grid.methods if k != "adamw"]
    lrs = best.lr[md]
    matched = [grid.sgd_equivalent(k, best.lr[k]) for k in md]
    raw, rescaled = lrs.max() / lrs.min(), max(matched) / min(matched)
    verdict = "matched_lr narrows the spread" if rescaled < raw / 1.001 else "matched_lr does not narrow the spread"
    texts["spread"] = (f"the exponents' chosen step sizes span a factor of {raw:.3g} in lr, and of {rescaled:.3g} "
                       f"in the SGD steps matched to them: {verdict}")
    texts["edges"] = edges_text(result)
    texts["ties"] = ties_text(result)
    bad = runs[runs.diverged.astype(bool)]
    if bad.empty:
        texts["overflows"] = "No run diverged"
    else:
        parts = [f"{methods.key_text(key)} at lr {', '.join(_lr_text(x) for x in sorted(g.lr.unique()))}"
                 f" ({', '.join(sorted(g.outcome.unique()))})" for key, g in bad.groupby("method", sort=False)]
        texts["overflows"] = f"{len(bad)} of {len(runs)} runs diverged: " + "; ".join(parts)
    top = best.validation_loss[md].idxmin()
    texts["best-md"] = f"{methods.key_text(top)} at lr {_lr_text(best.lr[top])}"
    texts["best-md-loss"] = f"{best.validation_loss[top]:.3f}"
    texts["best-md-accuracy"] = f"{best.validation_accuracy[top]:.1%}"
    texts["adamw-loss"] = f"{best.validation_loss['adamw']:.3f}"
    texts["adamw-accuracy"] = f"{best.validation_accuracy['adamw']:.1%}"
    sgd = runs[runs.method == "sgd"].sort_values("seed")
    twin = runs[(runs.method == "2") & runs.chosen.astype(bool)].sort_values("seed")
    gap = np.abs(sgd.validation_loss.to_numpy() - twin.validation_loss.to_numpy()) if len(sgd) == len(twin) else []
    texts["sgd-check"] = "not measured (a run diverged)" if not len(gap) or np.isnan(gap).any() else f"{gap.max():.2g}"
    texts["seeds"] = "one seed per step size" if grid.seeds == 1 else f"{grid.seeds} seeds per step size"
    if moved is not None:
        wide = moved.groupby(["method", "group"]).movement.mean().unstack()
        ratio = (wide["norms"] / wide["positions"]).reindex(md)
        trend = "falls" if bool(np.all(np.diff(ratio.to_numpy()) < 0)) else "does not fall steadily"
        texts["movement"] = (", ".join(f"{r:.2g} at p = {k}" for k, r in ratio.items())
                             + f": it {trend} as p grows")
    return texts


def _name(key: str) -> str:
    return methods.key_text(key)


def _multiple(m: float) -> str:
    return f"{m:.2g}×"


def edges_text(result: StepSizes) -> str:
    """Where each method's choice sits among the multiples it tried (``StepSizes.candidates``, grown ones
    included): "inside its grid for every method", or "inside its grid for ℓ1.1, ...; at an end for
    AdamW: 27× is the largest of 0.33×, ..., 27×, after the grid grew twice on that side (its most);
    the best step may lie beyond it" (``views.step_grid.edge_clause``: what was tried, why it stopped)."""
    grid = result.config
    inside, ends = [], []
    for key in grid.methods:
        clause = edge_clause(_name(key), result.chosen[key], result.candidates.get(key) or grid.candidates(key),
                             grid.candidates(key), grid.grow, _multiple)
        (ends if clause else inside).append(clause or _name(key))
    if not ends:
        return "inside its grid for every method"
    return "; ".join(([f"inside its grid for {', '.join(inside)}"] if inside else []) + [f"at an end for {ends[0]}"]
                     + ends[1:])


def ties_text(result: StepSizes) -> str:
    """The candidates tied with each method's choice (within ``step_grid.TIE_Z`` paired standard errors of
    the best validation loss), for the methods with a tie: "ℓ1.1: 1×, 3× (chosen: 3×, the better of the
    middle two)", or "no choice was tied"."""
    parts = [tie_clause(_name(key), result.choices[key], _multiple) for key in result.config.methods
             if key in result.choices]
    return "; ".join(p for p in parts if p) or "no choice was tied"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def task_text(grid: StepSizeGrid) -> str:
    """The sweep's task in one sentence, for the chapter's prose."""
    from mdlib.experiments.workload import SPLITS

    available = SPLITS.get(grid.dataset, (None,))[0]
    sentences = (f"all {available:,} training sentences" if available is not None and grid.train_size >= available
                 else f"a seeded, stratified subset of {_count(grid.train_size, 'training sentence')}")
    model = grid.model
    return (f"A sentiment encoder (EncoderClassifier) of {_count(model.layers, 'layer')}, width {model.width}, "
            f"{_count(model.heads, 'head')}, initialization \"{model.setup}\", dropout {model.dropout:g}, trained "
            f"{_count(grid.epochs, 'epoch')} on {sentences} of {grid.dataset} in batches of {grid.batch_size} (the "
            f"batch's mean binary cross-entropy), {_count(grid.seeds, 'seed')} per step size, and evaluated once, "
            f"at the end, on the validation split; each p's grid is centred on matched_lr({grid.sgd_lr:g}, p, "
            f"{grid.scale:g})")


def first_step_view(table: pd.DataFrame) -> pd.DataFrame:
    """``first_step_table`` as the book shows it: one row per magnitude |w|, one column per p, each cell
    "exact (linearized)" movement over gradient descent's."""
    def cell(row: pd.Series) -> str:
        return f"{row.vs_sgd:.2g} ({row.linearized_vs_sgd:.2g})"

    view = table.assign(cell=table.apply(cell, axis=1), column=[f"p = {p:g}" for p in table.p])
    wide = view.pivot(index="magnitude", columns="column", values="cell")
    wide.index = [f"{m:g}" for m in wide.index]
    wide.index.name = "|w|"
    return wide[[f"p = {p:g}" for p in dict.fromkeys(table.p)]]


def best_view(best: pd.DataFrame) -> pd.DataFrame:
    """``StepSizes.best`` as the book shows it."""
    def number(x: float, spec: str = ".2g") -> str:
        return "–" if x != x else format(x, spec)

    return pd.DataFrame({
        "method": [methods.key_text(k) for k in best.method],
        "chosen lr": [number(x) + (" (grid end)" if edge else "") for x, edge in zip(best.lr, best.at_edge)],
        "multiples tried (× centre)": best.tried, "tied with the choice": best.tied,
        "matched_lr prediction": best.predicted_lr.map(number), "chosen / predicted": best.ratio.map(number),
        "exact at scale": best.implied_scale.map(number),
        "validation loss": best.validation_loss.map(lambda x: number(x, ".3f")),
        "validation acc.": best.validation_accuracy.map(lambda x: "–" if x != x else f"{x:.1%}")})


def movement_view(moved: pd.DataFrame) -> pd.DataFrame:
    """``StepSizes.movement()`` as the book shows it: one row per method (mean over seeds), one column per
    group of ``MOVEMENT_GROUPS``."""
    wide = moved.groupby(["method", "group"], sort=False).movement.mean().unstack()[list(MOVEMENT_GROUPS)]
    wide.index = [methods.key_text(k) for k in wide.index]
    wide.index.name = "method"
    return wide.map(lambda x: f"{x:.2g}")
