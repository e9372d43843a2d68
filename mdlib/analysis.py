"""Measurements on trained models: token selection, interventions, weight statistics, pruning.

- ``cls_attention``: the paper's token score: the last layer's attention row of the [CLS] query,
  averaged over heads and min-max normalized over the sequence's real tokens.
- ``win_loss_tie`` and ``wilson_interval``: comparing two optimizers' scores on designated tokens;
  ``difference_interval``: the difference of two methods' mean accuracies over seeds.
- ``delete_tokens`` and ``probability_drop``: does the prediction depend on a token? Remove it and
  measure the drop of the predicted class's probability.
- ``count_above`` and ``magnitude_prune``: the weight-sparsity statistics and global magnitude
  pruning (no retraining); ``top_share`` and ``effective_density``: scale-free sparsity of a change
  of weights W - W(0).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["cls_attention", "win_loss_tie", "wilson_interval", "difference_interval", "delete_tokens", "probability_drop",
           "magnitudes", "count_above", "top_share", "effective_density", "late_means", "late_change", "late_share",
           "prunable_weights", "magnitude_prune", "pruning_curve"]


@torch.no_grad()
def cls_attention(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Scores (B, T): the last layer's attention from the [CLS] query (position 0) to every token,
    averaged over heads, min-max normalized over the real tokens (NaN at padding). The model must
    accept ``return_attention=True`` and return (logits, [maps (B, heads, T, T) per layer])."""
    was_training = model.training
    model.eval()
    try:
        _, maps = model(input_ids, attention_mask, return_attention=True)
    finally:
        model.train(was_training)
    row = maps[-1][:, :, 0, :].mean(dim=1)  # (B, T)
    real = attention_mask.bool()
    low = torch.where(real, row, torch.inf).amin(dim=1, keepdim=True)
    high = torch.where(real, row, -torch.inf).amax(dim=1, keepdim=True)
    span = torch.where(high > low, high - low, torch.ones_like(high))
    return torch.where(real, (row - low) / span, torch.nan)


def win_loss_tie(first: Tensor, second: Tensor, tol: float = 1e-6) -> tuple[int, int, int]:
    """How often ``first`` exceeds ``second`` by more than ``tol``, falls below it, or ties."""
    diff = torch.as_tensor(first, dtype=torch.float64) - torch.as_tensor(second, dtype=torch.float64)
    return int((diff > tol).sum()), int((diff < -tol).sum()), int((diff.abs() <= tol).sum())


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    from scipy.stats import norm

    z = norm.ppf(0.5 + confidence / 2)
    phat = successes / trials
    centre = (phat + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return centre - half, centre + half


def difference_interval(first, second, confidence: float = 0.95) -> tuple[float, float, float]:
    """mean(first) - mean(second) with Welch's t interval (unequal variances): (difference, low, high).
    With fewer than two values on a side, or no spread at all, the interval is (NaN, NaN)."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("difference_interval needs at least one value on each side")
    difference = float(a.mean() - b.mean())
    if min(a.size, b.size) < 2:
        return difference, math.nan, math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return difference, math.nan, math.nan
    from scipy.stats import t

    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = float(t.ppf(0.5 + confidence / 2, dof) * math.sqrt(va + vb))
    return difference, difference - half, difference + half


def delete_tokens(input_ids: Tensor, attention_mask: Tensor, positions: Tensor, pad_id: int = 0):
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


def magnitudes(tensors) -> np.ndarray:
    """|w| of every entry of the given tensors, concatenated (float, on the CPU), e.g. for a histogram."""
    return torch.cat([w.detach().abs().flatten().float().cpu() for w in tensors]).numpy()


def count_above(tensors, threshold: float = 0.06) -> int:
    """Number of entries with |w| > threshold over the given tensors."""
    return int(sum((w.detach().abs() > threshold).sum().item() for w in tensors))


def _flat(tensors) -> Tensor:
    return torch.cat([w.detach().flatten().double().cpu() for w in tensors])


def top_share(tensors, fraction: float = 0.01) -> float:
    """The share of the squared l2 norm held by the largest ``fraction`` of the entries (at least one),
    over all the tensors together: 1 for a single nonzero entry, ``fraction`` when all are equal."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    squares = _flat(tensors) ** 2
    k = max(1, int(round(fraction * squares.numel())))
    total = squares.sum().item()
    return squares.topk(k).values.sum().item() / total if total > 0 else math.nan


def effective_density(tensors) -> float:
    """||x||_1^2 / (n ||x||_2^2) of all entries x together: 1 when every entry has the same magnitude,
    1/n for a single nonzero entry (a scale-free share of entries in use)."""
    x = _flat(tensors)
    squares = (x ** 2).sum().item()
    return x.abs().sum().item() ** 2 / (x.numel() * squares) if squares > 0 else math.nan


def late_means(values, fraction: float = 0.25, window: int | None = None) -> tuple[float, float]:
    """(before, last) of a per-epoch curve: the mean of its last ``window`` values and of the ``window``
    values ending ``fraction`` of the curve earlier (windows tame the epoch-to-epoch noise; default: a
    fifth of that span, at least 1); NaNs when the curve is shorter than the span plus the window."""
    values = np.asarray(values, dtype=float)
    span = max(1, int(len(values) * fraction))
    window = window or max(1, span // 5)
    if len(values) < span + window:
        return math.nan, math.nan
    return float(values[-span - window:-span].mean()), float(values[-window:].mean())


def late_change(values, fraction: float = 0.25, window: int | None = None) -> float:
    """How much a per-epoch curve (e.g. the training loss) still moved at the end, relative to where it
    is: last / before - 1 of ``late_means``. A curve falling like a power of the epoch, c t^-a, gives the
    same (3/4)^-a - 1 at every length: this alone never says "flat"."""
    before, last = late_means(values, fraction, window)
    return last / before - 1


def late_share(values, fraction: float = 0.25, window: int | None = None) -> float:
    """The share of a curve's total change (first value to the last window's mean) that came in its last
    ``fraction`` (windows of ``late_means``): near 0 for a curve that has flattened, ``fraction`` for a
    straight line."""
    before, last = late_means(values, fraction, window)
    first = float(np.asarray(values, dtype=float)[0])
    return (last - before) / (last - first) if last != first else math.nan


def prunable_weights(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The weight matrices of the model's Linear and Embedding layers (no biases, no norms)."""
    return [(f"{name}.weight" if name else "weight", module.weight) for name, module in model.named_modules()
            if isinstance(module, (nn.Linear, nn.Embedding))]


@torch.no_grad()
def magnitude_prune(model: nn.Module, sparsity: float) -> nn.Module:
    """A copy of ``model`` with the fraction ``sparsity`` of its prunable weights (all Linear and
    Embedding matrices together) of smallest magnitude set to zero: global magnitude pruning."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    pruned = copy.deepcopy(model)
    weights = [w for _, w in prunable_weights(pruned)]
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


def pruning_curve(model: nn.Module, sparsities, evaluate) -> list[tuple[float, float]]:
    """``[(sparsity, evaluate(magnitude_prune(model, sparsity))), ...]``: a metric (e.g. test accuracy)
    against global magnitude-pruning sparsity, without retraining."""
    return [(float(s), float(evaluate(magnitude_prune(model, s)))) for s in sparsities]
