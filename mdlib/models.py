r"""The paper's models.

Single-head attention classifier (experiments E1-E3), for example i with tokens X_i (T x d), a
comparison token z_i (d) and label y_i in {-1, +1}:

    f(X_i, z_i) = v^T X_i^T softmax(X_i W z_i),    L(W, v) = mean_i log(1 + exp(-y_i f(X_i, z_i)))

(softmax over the T tokens, no 1/sqrt(d) scaling). Everything accepts leading batch dimensions that
index independent trials: W (*B, d, d), v (*B, d), X (*B, n, T, d), z (*B, n, d), y (*B, n).
The synthetic data generators of E1 (Gaussian, unit-norm tokens) and the fixed data of E3 are here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = [
    "SyntheticData",
    "attention_logits",
    "single_head_output",
    "logistic_loss",
    "SingleHeadAttention",
    "gaussian_instances",
    "joint_training_data",
]


@dataclass(frozen=True)
class SyntheticData:
    """A batch of single-head attention problems: X (B, n, T, d), z (B, n, d), y (B, n), v (B, d)."""

    X: Tensor
    z: Tensor
    y: Tensor
    v: Tensor

    @property
    def trials(self) -> int:
        return self.X.shape[0]

    def trial(self, b: int) -> "SyntheticData":
        """Trial ``b`` as a batch of one."""
        return SyntheticData(self.X[b:b + 1], self.z[b:b + 1], self.y[b:b + 1], self.v[b:b + 1])

    def numpy(self) -> dict:
        return {name: getattr(self, name).numpy() for name in ("X", "z", "y", "v")}


def attention_logits(W: Tensor, X: Tensor, z: Tensor) -> Tensor:
    """s_it = x_it^T W z_i, shape (*B, n, T)."""
    return torch.einsum("...ntd,...de,...ne->...nt", X, W, z)


def single_head_output(W: Tensor, v: Tensor, X: Tensor, z: Tensor) -> Tensor:
    """f_i = v^T X_i^T softmax(X_i W z_i), shape (*B, n)."""
    attention = torch.softmax(attention_logits(W, X, z), dim=-1)
    return torch.einsum("...nt,...ntd,...d->...n", attention, X, v)


def logistic_loss(W: Tensor, v: Tensor, X: Tensor, y: Tensor, z: Tensor) -> Tensor:
    """L = mean_i log(1 + exp(-y_i f_i)) per trial, shape (*B)."""
    return F.softplus(-y * single_head_output(W, v, X, z)).mean(dim=-1)


class SingleHeadAttention(nn.Module):
    """f(X, z) = v^T X^T softmax(X W z) as a torch module, for ``LpMirrorDescent`` and autograd.

    ``trials`` independent copies are held in one batched parameter (W: (trials, d, d)).
    With ``train_decoder=False`` the decoder v is a fixed buffer (experiments E1, E2).
    """

    def __init__(self, W: Tensor, v: Tensor, train_decoder: bool = False):
        super().__init__()
        if W.shape[-1] != W.shape[-2] or W.shape[:-1] != v.shape:
            raise ValueError(f"W must be (..., d, d) and v (..., d); got {tuple(W.shape)} and {tuple(v.shape)}")
        self.W = nn.Parameter(W.clone())
        if train_decoder:
            self.v = nn.Parameter(v.clone())
        else:
            self.register_buffer("v", v.clone())

    def forward(self, X: Tensor, z: Tensor) -> Tensor:
        return single_head_output(self.W, self.v, X, z)

    def loss(self, X: Tensor, y: Tensor, z: Tensor) -> Tensor:
        """Sum over trials of each trial's mean logistic loss (so each trial gets its own gradient)."""
        return logistic_loss(self.W, self.v, X, y, z).sum()


def _unit_gaussian(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True)).to(dtype)


def gaussian_instances(trials: int, n: int = 6, T: int = 8, d: int = 10, seed: int = 0,
                       dtype: torch.dtype = torch.float64) -> SyntheticData:
    """E1 data: every token x_it, every comparison token z_i and the decoder v drawn N(0, I_d) and
    scaled to unit l2 norm; labels uniform on {-1, +1}. Trial b is drawn from seed ``seed + b``
    alone, so a trial's data does not depend on how many trials are batched with it."""
    if min(trials, n, T, d) < 1 or T < 2:
        raise ValueError(f"need trials, n, d >= 1 and T >= 2; got trials={trials}, n={n}, T={T}, d={d}")
    parts = []
    for b in range(trials):
        g = torch.Generator().manual_seed(seed + b)
        X = _unit_gaussian((n, T, d), g, dtype)
        z = _unit_gaussian((n, d), g, dtype)
        v = _unit_gaussian((d,), g, dtype)
        y = (torch.randint(0, 2, (n,), generator=g) * 2 - 1).to(dtype)
        parts.append((X, z, y, v))
    X, z, y, v = (torch.stack(items) for items in zip(*parts))
    return SyntheticData(X=X, z=z, y=y, v=v)


def joint_training_data(dtype: torch.dtype = torch.float64) -> SyntheticData:
    """E3's fixed instance (n = 2, T = 3, d = 2), z_i = the first token of X_i, v = 0 (trained)."""
    X = torch.tensor([[[-2.7, 1.2], [1.4, 2.1], [1.3, -0.1]],
                      [[0.4, -2.2], [-1.1, -0.4], [0.9, 0.1]]], dtype=dtype)
    y = torch.tensor([1.0, -1.0], dtype=dtype)
    return SyntheticData(X=X[None], z=X[None, :, 0, :].clone(), y=y[None], v=torch.zeros(1, 2, dtype=dtype))
