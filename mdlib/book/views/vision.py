"""How chapter 07's vision tables and sentences look: the summary table (table-vit) for reading and the
chapter's prose on accuracies, the training loss and pruning. The numbers come from
``mdlib.experiments.vision``; these functions only show them."""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import pandas as pd

from mdlib.book.views.step_grid import edge_clause, tie_clause
from mdlib.experiments import methods

__all__ = ["by_dataset", "pruning_contrast_text", "pruning_levels_text", "summary_texts", "summary_view", "sweep_texts"]


def summary_view(table: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """``summary_table`` for reading: accuracies as mean ± std, the loss's late share with its change
    (marked when not levelled off), the K / Q / V counts above ``threshold``, the paper's accuracy."""
    return pd.DataFrame({
        "data": table.dataset, "optimizer": table.optimizer, "step size": table.lr.map("{:g}".format),
        "step size from": table["lr from"],
        "final test acc. (%)": [f"{a:.2f} ± {b:.2f}" for a, b in zip(table.final_mean, table.final_std)],
        "best test acc. (%)": [f"{a:.2f} ± {b:.2f}" for a, b in zip(table.best_mean, table.best_std)],
        "training loss, last epoch": table.train_loss.map("{:.3f}".format),
        "last quarter: share of the loss's decrease (its change)": [
            f"{a:.1%} ({b:+.1%})" + ("" if ok else ": not levelled off")
            for a, b, ok in zip(table.loss_share, table.loss_change, table.levelled)],
        "last quarter: test acc. change (points)": table.accuracy_change.map("{:+.2f}".format),
        f"K / Q / V entries > {threshold:.3g}": [f"{k:,.0f} / {q:,.0f} / {v:,.0f}" for k, q, v in
                                                 zip(table.key_above, table.query_above, table.value_above)],
        "paper (%)": table.paper.map(lambda a: f"≈ {a:.0f}" if a == a else "not run")})


def sweep_texts(grid, names: Mapping[str, str], datasets: Mapping[str, str]) -> dict[str, str]:
    """Chapter 07's words on its sweep (``grid``: a ``vision.Grid``; ``names``: method key -> text;
    ``datasets``: data set key -> text), as glue texts: ``vit-edge``, where each swept method's choice sits
    among the steps it tried (grown ones included) and, for one at an end, what was tried and why the
    grid stopped there (``views.step_grid.edge_clause``); ``vit-ties``, the candidates tied with each
    choice; ``vit-tried``, how many steps each swept method tried."""
    config, ends, ties, tried = grid.config, [], [], []
    for (d, key), choice in grid.choices.items():
        first = config.step_sizes[key]
        if len(first) < 2:
            continue
        name = f"{names[key]} on {datasets[d]}"
        steps = grid.candidates.get((d, key)) or first
        ends.append(edge_clause(name, choice.value, steps, first, config.grow, "{:g}".format))
        ties.append(tie_clause(name, choice, "{:g}".format))
        tried.append(f"{name} {len(steps)}" + (f" ({len(steps) - len(first)} grown)" if len(steps) > len(first) else ""))
    ends, ties = [e for e in ends if e], [t for t in ties if t]
    return {"vit-edge": ("Every chosen step size lies strictly inside the steps its method tried." if not ends else
                         "A chosen step size at an end of the steps tried: " + "; ".join(ends) + "."),
            "vit-ties": "; ".join(ties) or "none", "vit-tried": ", ".join(tried) or "none (no method was swept)"}


def by_dataset(datasets: Mapping[str, str], text: Callable[[str], str]) -> str:
    """One clause per data set for the chapter's prose: "<name>: <text(key)>", joined by "; ", for the
    keys and names of ``datasets`` in order."""
    return "; ".join(f"{shown}: {text(key)}" for key, shown in datasets.items())


def pruning_levels_text(dataset: str, accuracy: pd.Series, names: Mapping[str, str], levels: list[float]) -> str:
    """Chapter 07's pruning prose on ``dataset``: per method (``names``: key -> text, in order) its mean
    test accuracy (%) at each pruned fraction of ``levels``, "ℓ1.1 a / b / c, Adam ..." (``accuracy``: the
    mean by (dataset, method key, sparsity))."""
    return ", ".join(f"{shown} " + " / ".join(f"{100 * accuracy[(dataset, key, x)]:.1f}" for x in levels)
                     for key, shown in names.items())


def pruning_contrast_text(dataset: str, accuracy: pd.Series, counts: pd.Series, names: Mapping[str, str], *,
                          kinds: tuple[str, ...], key: str, sparsity: float) -> str:
    """The paper's Figure 12 contrast on ``dataset`` in words: mirror descent at ``key`` (the smallest p)
    against Adam, its key/query/value entries above the threshold (``counts``: the mean count by
    (dataset, method name, matrix) over ``kinds``) and its test accuracy with ``sparsity`` of the weights
    pruned (``accuracy``: the mean by (dataset, method key, sparsity)). ``names``: method key -> text."""
    above = {m: sum(counts[(dataset, names[m], kind)] for kind in kinds) for m in (key, methods.ADAM)}
    more = {1: "more", 0: "as many", -1: "fewer"}[int(np.sign(above[key] - above[methods.ADAM]))]
    return (f"{names[key]} has {more} entries above the threshold than Adam ({above[key]:,.0f} against "
            f"{above[methods.ADAM]:,.0f}) and keeps {100 * accuracy[(dataset, key, sparsity)]:.1f} % test accuracy "
            f"with {100 * sparsity:.0f} % of the weights pruned, against "
            f"{100 * accuracy[(dataset, methods.ADAM, sparsity)]:.1f} % for Adam")


def summary_texts(table: pd.DataFrame, chosen: Mapping[tuple[str, str], float], *, names: Mapping[str, str],
                  datasets: Mapping[str, str], swept: list[str], flat_share: float) -> dict[str, str]:
    """The prose of chapter 07 from ``summary_table``'s ``table`` (data sets under their names
    ``datasets[key]``, methods under ``names[key]``): per data set, the final and best accuracies, their
    spread and the chosen step sizes of the ``swept`` methods (from ``chosen``); whether every training
    loss levelled off (at most ``flat_share`` of its decrease in the last quarter); the ranges of the
    late loss and accuracy changes. Keys are the chapter's glue names."""
    def per_dataset(text: Callable[[str], str]) -> str:
        return by_dataset(datasets, text)

    def rows(key: str) -> pd.DataFrame:
        return table[table.dataset == datasets[key]]

    def accuracies(column: str) -> str:
        return per_dataset(lambda d: ", ".join(f"{r.optimizer} {r[column + '_mean']:.1f} ± {r[column + '_std']:.1f}"
                                               for _, r in rows(d).iterrows()))

    rule = (f"the rule: the last quarter of the epochs brought at most {flat_share:.0%} of the training loss's "
            "decrease since the first epoch, for every seed")
    unlevelled = table[~table.levelled]
    levelled = (f"every method's training loss has levelled off ({rule}; the largest share, a method's mean over "
                f"seeds, is {table.loss_share.max():.1%})") if unlevelled.empty else (
        "the training loss has not levelled off for " + ", ".join(
            f"{r.optimizer} on {r.dataset} ({r.loss_share:.1%} of its decrease in the last quarter)"
            for _, r in unlevelled.iterrows()) + f" ({rule}): for these the comparison is one of speed, not of "
        "end points")
    return {"vit-final": accuracies("final"), "vit-levelled": levelled,
            "vit-loss-change": f"{table.loss_change.min():+.1%} to {table.loss_change.max():+.1%}",
            "vit-accuracy-change": f"{table.accuracy_change.min():+.2f} to {table.accuracy_change.max():+.2f}",
            "vit-best": accuracies("best"),
            "vit-spread": per_dataset(lambda d: f"{np.ptp(rows(d).final_mean):.1f} points"),
            "vit-lrs": per_dataset(lambda d: ", ".join(f"{names[m]}: {chosen[d, m]:g}" for m in swept))}
