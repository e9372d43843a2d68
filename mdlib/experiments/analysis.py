"""Measurements on trained models: token selection, interventions, weight statistics, pruning.

- ``cls_attention``: the paper's token score: the last layer's attention row of the [CLS] query,
  averaged over heads and min-max normalized over the sequence's real tokens.
- ``win_loss_tie``: comparing two optimizers' scores on designated tokens (the intervals are in
  ``mdlib.experiments.stats``).
- ``delete_tokens`` and ``probability_drop``: does the prediction depend on a token? Remove it and
  measure the drop of the predicted class's probability.
- ``scaled_threshold``: the paper's |w| threshold carried to another width.
- ``count_above`` and ``magnitude_prune``: the weight-sparsity statistics and global magnitude
  pruning of the weight matrices (no retraining); ``top_share`` and ``effective_density``: scale-free
  sparsity of a change of weights W - W(0); ``relative_movement``: ||W - W(0)|| / ||W(0)|| per group
  of parameters.
- ``cls_row`` and ``concentration``: the [CLS] attention row itself, and how sharp it is.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
import torch
from torch import Tensor, nn

from mdlib.experiments import paper

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["cls_row", "cls_attention", "concentration", "win_loss_tie", "delete_tokens", "probability_drop",
           "magnitudes", "scaled_threshold", "count_above", "top_share", "effective_density", "late_means",
           "late_change", "late_share",
           "prunable_weights", "magnitude_prune", "pruning_curve", "relative_movement"]


@torch.no_grad()
def cls_row(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Attention probabilities (B, T) of the last layer from the [CLS] query (position 0) to every
    token, averaged over heads (rows sum to 1 over the real tokens; NaN at padding). The model must
    accept ``return_attention=True`` and return (logits, [maps (B, heads, T, T) per layer])."""
    was_training = model.training
    model.eval()
    try:
        _, maps = model(input_ids, attention_mask, return_attention=True)
    finally:
        model.train(was_training)
    return torch.where(attention_mask.bool(), maps[-1][:, :, 0, :].mean(dim=1), torch.nan)


def cls_attention(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Scores (B, T): the paper's token score, ``cls_row`` min-max normalized over each sequence's real
    tokens (NaN at padding)."""
    row = cls_row(model, input_ids, attention_mask)
    real = attention_mask.bool()
    low = torch.where(real, row, torch.inf).amin(dim=1, keepdim=True)
    high = torch.where(real, row, -torch.inf).amax(dim=1, keepdim=True)
    span = torch.where(high > low, high - low, torch.ones_like(high))
    return torch.where(real, (row - low) / span, torch.nan)


def concentration(row: ArrayLike) -> tuple[float, float]:
    """How concentrated one sequence's attention row (probabilities over its n real tokens) is:
    (normalized entropy H / log n, in [0, 1], lower: sharper; the largest probability, the top token's
    share)."""
    p = np.asarray(row, dtype=float)
    p = p[~np.isnan(p)]
    if p.size < 2 or np.any(p < 0) or not np.isclose(p.sum(), 1.0, atol=1e-4):
        raise ValueError(f"concentration needs a probability row over at least 2 tokens, got {p.tolist()[:8]}")
    nonzero = p[p > 0]
    return float(-(nonzero * np.log(nonzero)).sum() / math.log(p.size)), float(p.max())


def win_loss_tie(first: Tensor, second: Tensor, tol: float = 1e-6) -> tuple[int, int, int]:
    """How often ``first`` exceeds ``second`` by more than ``tol``, falls below it, or ties."""
    diff = torch.as_tensor(first, dtype=torch.float64) - torch.as_tensor(second, dtype=torch.float64)
    return int((diff > tol).sum()), int((diff < -tol).sum()), int((diff.abs() <= tol).sum())


def delete_tokens(input_ids: Tensor, attention_mask: Tensor, positions: Tensor, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Remove the token at ``positions[b]`` from sequence b (later tokens move one place left, a pad
    enters at the end). Returns new (input_ids, attention_mask)."""
    B, T = input_ids.shape
    index = torch.arange(T, device=input_ids.device).expand(B, T)
    source = index + (index >= positions[:, None]).long()  # skip the deleted position
    keep = source < T
    source = source.clamp(max=T - 1)
    ids = torch.where(keep, input_ids.gather(1, source), torch.full_like(input_ids, pad_id))
    mask = torch.where(keep, attention_mask.gather(1, source), torch.zeros_like(attention_mask))
    return ids, mask


@torch.no_grad()
def probability_drop(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, positions: Tensor,
                     pad_id: int = 0) -> Tensor:
    """For a binary classifier returning one logit per sequence: the predicted class's probability
    on the full sequence minus its probability after deleting the token at ``positions[b]``."""
    was_training = model.training
    model.eval()
    try:
        before = torch.sigmoid(model(input_ids, attention_mask))
        after = torch.sigmoid(model(*delete_tokens(input_ids, attention_mask, positions, pad_id)))
    finally:
        model.train(was_training)
    positive = before >= 0.5
    return torch.where(positive, before - after, after - before)


def magnitudes(tensors: Iterable[Tensor]) -> np.ndarray:
    """|w| of every entry of the given tensors, concatenated (float, on the CPU), e.g. for a histogram."""
    return torch.cat([w.detach().abs().flatten().float().cpu() for w in tensors]).numpy()


def scaled_threshold(width: int, paper_width: int, threshold: float = paper.WEIGHT_THRESHOLD) -> float:
    """The paper's |w| threshold at ``paper_width`` (``paper.KQV_WIDTH``: the IMDb encoder, Figure 9;
    ``paper.VIT_WIDTH``: the ViT, Figure 12) carried to a model of ``width``:
    threshold * sqrt(paper_width / width), the same multiple of the initialization's bound
    1/sqrt(width) (the paper's 0.06 lies above 1/sqrt(384) = 0.051 and 1/sqrt(512) = 0.044, so no
    entry starts above it, at any width)."""
    return threshold * (paper_width / width) ** 0.5


def count_above(tensors: Iterable[Tensor], threshold: float = 0.06) -> int:
    """Number of entries with |w| > threshold over the given tensors."""
    return int(sum((w.detach().abs() > threshold).sum().item() for w in tensors))


def _flat(tensors) -> Tensor:
    return torch.cat([w.detach().flatten().double().cpu() for w in tensors])


def top_share(tensors: Iterable[Tensor], fraction: float = 0.01) -> float:
    """The share of the squared l2 norm held by the largest ``fraction`` of the entries (at least one),
    over all the tensors together: 1 for a single nonzero entry, ``fraction`` when all are equal."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    squares = _flat(tensors) ** 2
    k = max(1, int(round(fraction * squares.numel())))
    total = squares.sum().item()
    return squares.topk(k).values.sum().item() / total if total > 0 else math.nan


def effective_density(tensors: Iterable[Tensor]) -> float:
    """||x||_1^2 / (n ||x||_2^2) of all entries x together: 1 when every entry has the same magnitude,
    1/n for a single nonzero entry (a scale-free share of entries in use)."""
    x = _flat(tensors)
    squares = (x ** 2).sum().item()
    return x.abs().sum().item() ** 2 / (x.numel() * squares) if squares > 0 else math.nan


def late_means(values: ArrayLike, fraction: float = 0.25, window: int | None = None) -> tuple[float, float]:
    """(before, last) of a per-epoch curve: the mean of its last ``window`` values and of the ``window``
    values ending ``fraction`` of the curve earlier (windows tame the epoch-to-epoch noise; default: a
    fifth of that span, at least 1); NaNs when the curve is shorter than the span plus the window."""
    values = np.asarray(values, dtype=float)
    span = max(1, int(len(values) * fraction))
    window = window or max(1, span // 5)
    if len(values) < span + window:
        return math.nan, math.nan
    return float(values[-span - window:-span].mean()), float(values[-window:].mean())


def late_change(values: ArrayLike, fraction: float = 0.25, window: int | None = None) -> float:
    """How much a per-epoch curve (e.g. the training loss) still moved at the end, relative to where it
    is: last / before - 1 of ``late_means``. A curve falling like a power of the epoch, c t^-a, gives the
    same (3/4)^-a - 1 at every length: this alone never says "flat"."""
    before, last = late_means(values, fraction, window)
    return last / before - 1


def late_share(values: ArrayLike, fraction: float = 0.25, window: int | None = None) -> float:
    """The share of a curve's total change (first value to the last window's mean) that came in its last
    ``fraction`` (windows of ``late_means``): near 0 for a curve that has flattened, ``fraction`` for a
    straight line."""
    before, last = late_means(values, fraction, window)
    first = float(np.asarray(values, dtype=float)[0])
    return (last - before) / (last - first) if last != first else math.nan


def prunable_weights(model: nn.Module, embeddings: bool = False) -> list[tuple[str, nn.Parameter]]:
    """The weight matrices of the model's Linear layers (no biases, no norms), and of its Embedding
    layers when ``embeddings``. Embedding tables are left out by default: a 30,522-row table drawn
    N(0, 1) holds most entries of a small model and is larger in magnitude than every matrix, so a
    global threshold over both would prune the matrices first and say nothing about them."""
    kinds = (nn.Linear, nn.Embedding) if embeddings else (nn.Linear,)
    return [(f"{name}.weight" if name else "weight", module.weight) for name, module in model.named_modules()
            if isinstance(module, kinds)]


@torch.no_grad()
def magnitude_prune(model: nn.Module, sparsity: float, embeddings: bool = False) -> nn.Module:
    """A copy of ``model`` with the fraction ``sparsity`` of its prunable weights (``prunable_weights``,
    all matrices together) of smallest magnitude set to zero: global magnitude pruning."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    pruned = copy.deepcopy(model)
    weights = [w for _, w in prunable_weights(pruned, embeddings)]
    if sparsity == 0 or not weights:
        return pruned
    magnitudes = torch.cat([w.abs().flatten() for w in weights])
    k = int(round(sparsity * magnitudes.numel()))
    if k == 0:
        return pruned
    order = magnitudes.argsort()  # ties broken by position, so exactly k entries go
    drop = torch.zeros(magnitudes.numel(), dtype=torch.bool)
    drop[order[:k]] = True
    start = 0
    for w in weights:
        w[drop[start:start + w.numel()].view_as(w)] = 0
        start += w.numel()
    return pruned


def pruning_curve(model: nn.Module, sparsities: Iterable[float], evaluate: Callable[[nn.Module], float],
                  embeddings: bool = False) -> list[tuple[float, float]]:
    """``[(sparsity, evaluate(magnitude_prune(model, sparsity, embeddings))), ...]``: a metric (e.g. test
    accuracy) against global magnitude-pruning sparsity, without retraining."""
    return [(float(s), float(evaluate(magnitude_prune(model, s, embeddings)))) for s in sparsities]


def relative_movement(model: nn.Module, initial: nn.Module, groups: dict[str, list[str]]) -> dict[str, float]:
    """||W - W(0)||_F / ||W(0)||_F of each group of parameters (``groups``: name -> parameter names, e.g.
    ``EncoderClassifier.parameter_groups()``), the group's tensors taken together: how far training
    moved each part of the model relative to its initial size."""
    now, start = dict(model.named_parameters()), dict(initial.named_parameters())
    out = {}
    for group, names in groups.items():
        if not names:
            raise ValueError(f"parameter group {group!r} is empty")
        moved = sum(float((now[n].detach().double() - start[n].detach().double()).pow(2).sum()) for n in names)
        size = sum(float(start[n].detach().double().pow(2).sum()) for n in names)
        out[group] = math.sqrt(moved / size) if size > 0 else math.nan
    return out
