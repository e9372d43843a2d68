"""Weight sparsity (E6) of trained models: the paper's threshold counts, the scale-free measures of
the learned change W - W(0), and magnitude pruning of the weight matrices.

Every table has one row per (method, seed) model, so that methods compare seed by seed: a seed gives
every method the same initialization (``stats.paired_interval``).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd
from torch import nn

from mdlib.experiments import analysis, methods
from mdlib.mirror import mirror_map

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
    """Per model (keyed (method key, seed)), the change ΔW = W - W(0) of its K, Q and V matrices together
    against its seed's initialization: the share of ||ΔW||² in the largest ``top_fraction`` of the entries
    (``analysis.top_share``), the effective density ||ΔW||₁² / (n ||ΔW||₂²) and ||ΔW|| / ||W(0)||; and
    against its null, the initialization's weighting (``dual_density``, ``weighting_density``,
    ``null_density``).

    Mirror descent at p accumulates its steps in the dual: Δu = m(W) - m(W(0)) = -lr Σ_k g_k exactly
    (plain steps), and to first order ΔW = |W(0)|^(2-p) Δu / (p-1), so even gradients of uniform
    density give a ΔW weighted by the initial magnitudes. ``dual_density`` is the effective density of Δu
    (GD, Adam and any method but ℓ_p mirror descent: of ΔW itself), ``weighting_density`` that of
    |W(0)|^(2-p) (1 at p = 2; about 0.78 for uniform W(0) at p = 1.1), and ``null_density`` their product:
    the density ΔW would have if the weighting were independent of Δu (the density of a product of
    independent factors is the product of theirs). It keeps Δu's own concentration: the null of "sparser
    than the init weighting predicts", with Δu replaced by unstructured noise, is ``sparsity_null``'s."""
    rows = []
    for (key, seed), model in models.items():
        start = initial[seed].attention_weights()
        now = model.attention_weights()
        before = [w0.detach().double() for kind in KINDS for w0 in start[kind]]
        after = [w.detach().double() for kind in KINDS for w in now[kind]]
        delta = [w - w0 for w, w0 in zip(after, before)]
        size = sum(float(w.pow(2).sum()) for w in before) ** 0.5
        p = _exponent(key)
        dual = [mirror_map(w, p) - mirror_map(w0, p) for w, w0 in zip(after, before)] if p != 2.0 else delta
        weighting = analysis.effective_density([w0.abs() ** (2.0 - p) for w0 in before]) if p != 2.0 else 1.0
        dual_density = analysis.effective_density(dual)
        rows.append({"method": key, "seed": seed, "top_share": analysis.top_share(delta, top_fraction),
                     "effective_density": analysis.effective_density(delta),
                     "relative_change": sum(float(d.pow(2).sum()) for d in delta) ** 0.5 / size,
                     "dual_density": dual_density, "weighting_density": weighting,
                     "null_density": dual_density * weighting})
    return pd.DataFrame(rows)


def _exponent(key: str) -> float:
    """The l_p exponent of a method key's mirror map: p for ℓ_p mirror descent, 2 (the identity) otherwise."""
    name, p = methods.method(key)
    return float(p) if name == "md" else 2.0


def pruning_table(models: Mapping[tuple[str, int], nn.Module], sparsities: Sequence[float],
                  evaluate: Callable[[nn.Module], float]) -> pd.DataFrame:
    """Per model and sparsity, ``evaluate`` (e.g. test accuracy) after global magnitude pruning of the
    weight matrices (``analysis.pruning_curve``: attention, MLP and classifier; not the embedding tables),
    without retraining."""
    return pd.DataFrame([{"method": key, "seed": seed, "sparsity": s, "test_accuracy": a}
                         for (key, seed), model in models.items()
                         for s, a in analysis.pruning_curve(model, sparsities, evaluate)])
