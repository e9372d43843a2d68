"""The init-weighting null of a weight change (E6): how sparse ΔW = W - W(0) would be if training's dual
change had no structure, so that only the mirror map and the initial magnitudes shaped it.

ℓ_p mirror descent sums its plain steps in the dual, Δu = m(W) - m(W(0)) = -lr Σ_k g_k, and its weights
are W = m⁻¹(m(W(0)) + Δu); to first order ΔW = |W(0)|^(2-p) Δu / (p - 1), so at p = 1.1 the initial
magnitudes weight the change by |W(0)|^0.9 and make ΔW sparser than Δu whatever training learned. The
null keeps everything of a model but the structure of its dual change: its initialization, its
exponent, the exact map m⁻¹ (not the first-order weighting) and how far each matrix's dual moved (its
root mean square), and replaces each matrix's Δu by independent Gaussian noise at that scale,

    ΔW_null = m⁻¹(m(W(0)) + ξ) - W(0),   ξ_ij ~ N(0, mean(Δu²)) independently, per matrix.

Its effective density (``analysis.effective_density``, all matrices together; the mean over ``draws``
seeded draws) is what the weighting alone predicts for ΔW's: a model whose ΔW is sparser than its null
has a dual change that is itself concentrated within its matrices (on few entries, or on the entries
the weighting favours) beyond unstructured noise. Noise and not a permutation of Δu: a permutation
would keep the dual change's own concentration in the null, and so count it as the weighting's. Each
matrix keeps its scale, so that a layer or a kind (K, Q, V) that moved further than another is not read
as sparsity within the matrices. For GD, Adam and any method but ℓ_p mirror descent the map is the
identity (p = 2) and the null is unstructured noise at each matrix's scale of ΔW itself.

A module apart from ``sparsity``, which the vision runs' code imports (``vision.change_table``): their
store keys cover it, so an edit there would re-key every ViT run (``mdlib.runs.identity``).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from mdlib.experiments import analysis, methods, sparsity
from mdlib.mirror import inverse_mirror_map, mirror_map

__all__ = ["DRAWS", "null_density", "null_table", "noise", "weighting_null"]

#: How many draws of the noise each model's null averages (the density of one draw over n entries
#: varies by about 1/√n: ±0.003 at 3 x 2 layers of width 96, less at the book's sizes).
DRAWS = 8


def noise(shapes: Sequence[torch.Size], draws: int, seed: int) -> list[list[Tensor]]:
    """``draws`` lists of standard normal float64 tensors of ``shapes``, from ``numpy.random.default_rng(seed)``
    in order (draw by draw, then matrix by matrix): the same noise on every machine for one seed."""
    rng = np.random.default_rng(seed)
    return [[torch.from_numpy(rng.standard_normal(tuple(shape))) for shape in shapes] for _ in range(draws)]


def null_density(before: Sequence[Tensor], dual: Sequence[Tensor], p: float,
                 noises: Iterable[Sequence[Tensor]]) -> float:
    """The mean effective density, over ``noises`` (each a standard normal tensor per matrix), of the null
    change m⁻¹(m(W(0)) + ξ) - W(0), ξ = noise times the root mean square of the matrix's dual change, of the
    matrices ``before`` (W(0)) whose dual changes are ``dual`` at the exponent ``p`` (2: the identity map,
    ΔW_null = ξ). A matrix whose dual did not move adds zeros. NaN without noise."""
    w0 = [w.detach().double().cpu() for w in before]
    scales = [float(u.detach().double().pow(2).mean().sqrt()) for u in dual]
    start = [mirror_map(w, p) for w in w0] if p != 2.0 else w0
    densities = []
    for draw in noises:
        moved = [s + scale * z.double() for s, scale, z in zip(start, scales, draw)]
        change = [(inverse_mirror_map(m, p) if p != 2.0 else m) - w for m, w in zip(moved, w0)]
        densities.append(analysis.effective_density(change))
    return float(np.mean(densities)) if densities else float("nan")


def weighting_null(before: Sequence[Tensor], after: Sequence[Tensor], p: float, draws: int = DRAWS,
                   seed: int = 0) -> float:
    """``null_density`` of the matrices ``before`` (W(0)) trained to ``after`` (W) at the exponent ``p``:
    their dual change m(W) - m(W(0)) (at p = 2, W - W(0)) gives each matrix its scale, ``noise(..., draws,
    seed)`` the draws."""
    w0 = [w.detach().double().cpu() for w in before]
    w = [x.detach().double().cpu() for x in after]
    dual = [mirror_map(a, p) - mirror_map(b, p) for a, b in zip(w, w0)] if p != 2.0 else [a - b for a, b in zip(w, w0)]
    return null_density(w0, dual, p, noise([x.shape for x in w0], draws, seed))


def null_table(models: Mapping[tuple[str, int], nn.Module], initial: Mapping[int, nn.Module], draws: int = DRAWS,
               seed: int = 0) -> pd.DataFrame:
    """Per model (keyed (method key, seed)), ``weighting_null_density``: ``weighting_null`` of its K, Q and V
    matrices (all layers together, as ``sparsity.change_table`` measures ΔW) against its seed's
    initialization, at its method's exponent (ℓ_p mirror descent: p; any other method: 2), with noise seeded
    by ``seed`` and the model's seed: a column to pair with the model's ``effective_density``, row by row."""
    rows = []
    for (key, model_seed), model in models.items():
        start, now = initial[model_seed].attention_weights(), model.attention_weights()
        before = [w for kind in sparsity.KINDS for w in start[kind]]
        after = [w for kind in sparsity.KINDS for w in now[kind]]
        name, p = methods.method(key)
        rows.append({"method": key, "seed": model_seed, "weighting_null_density": weighting_null(
            before, after, float(p) if name == "md" else 2.0, draws, _seed(seed, model_seed))})
    return pd.DataFrame(rows)


def _seed(seed: int, model_seed: int) -> int:
    """One integer seed of the noise per (``seed``, model seed), the same on every machine."""
    return int(np.random.SeedSequence([seed, model_seed]).generate_state(1)[0])
