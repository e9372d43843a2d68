"""Weight sparsity (E6) of trained models: the paper's threshold counts, the scale-free measures of
the learned change W - W(0), and magnitude pruning of the weight matrices.

Every table has one row per (method, seed) model, so that methods compare seed by seed: a seed gives
every method the same initialization (``stats.paired_interval``).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd
from torch import nn

from mdlib.experiments import analysis

__all__ = ["KINDS", "counts_table", "change_table", "pruning_table"]

#: The attention matrices of the paper's count: key, query, value (as K, Q, V).
KINDS = {"key": "K", "query": "Q", "value": "V"}


def counts_table(models: Mapping[tuple[str, int], nn.Module], threshold: float,
                 absolute: float | None = None) -> pd.DataFrame:
    """Per model, the entries of the K, Q and V matrices (all layers) with |w| above ``threshold``
    (columns K, Q, V), and above ``absolute`` when given (columns "K > 0.06", ...)."""
    rows = []
    for (key, seed), model in models.items():
        weights = model.attention_weights()
        row = {"method": key, "seed": seed} | {short: analysis.count_above(weights[k], threshold)
                                                for k, short in KINDS.items()}
        if absolute is not None:
            row |= {f"{short} > {absolute:g}": analysis.count_above(weights[k], absolute) for k, short in KINDS.items()}
        rows.append(row)
    return pd.DataFrame(rows)


def change_table(models: Mapping[tuple[str, int], nn.Module], initial: Mapping[int, nn.Module],
                 top_fraction: float = 0.01) -> pd.DataFrame:
    """Per model, the change ΔW = W - W(0) of its K, Q and V matrices together against its seed's
    initialization: the share of ||ΔW||² in the largest ``top_fraction`` of the entries
    (``analysis.top_share``), the effective density ||ΔW||₁² / (n ||ΔW||₂²) and ||ΔW|| / ||W(0)||."""
    rows = []
    for (key, seed), model in models.items():
        start = initial[seed].attention_weights()
        now = model.attention_weights()
        delta = [w - w0 for kind in KINDS for w, w0 in zip(now[kind], start[kind])]
        size = sum(float(w.detach().pow(2).sum()) for kind in KINDS for w in start[kind]) ** 0.5
        rows.append({"method": key, "seed": seed, "top_share": analysis.top_share(delta, top_fraction),
                     "effective_density": analysis.effective_density(delta),
                     "relative_change": sum(float(d.detach().pow(2).sum()) for d in delta) ** 0.5 / size})
    return pd.DataFrame(rows)


def pruning_table(models: Mapping[tuple[str, int], nn.Module], sparsities: Sequence[float],
                  evaluate: Callable[[nn.Module], float]) -> pd.DataFrame:
    """Per model and sparsity, ``evaluate`` (e.g. test accuracy) after global magnitude pruning of the
    weight matrices (``analysis.pruning_curve``: attention, MLP and classifier; not the embedding tables),
    without retraining."""
    return pd.DataFrame([{"method": key, "seed": seed, "sparsity": s, "test_accuracy": a}
                         for (key, seed), model in models.items()
                         for s, a in analysis.pruning_curve(model, sparsities, evaluate)])
