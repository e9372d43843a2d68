"""The small regression model and its seeded batches that the optimizer's tests train."""

import torch


def make_model(dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """Linear(6, 5) -> tanh -> Linear(5, 1), initialized from ``seed``, in ``dtype``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).to(dtype)


def loss_of(model: torch.nn.Module, seed: int) -> torch.Tensor:
    """The mean squared error of ``model`` on batch ``seed`` (16 Gaussian inputs and targets)."""
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    x = torch.randn(16, 6, generator=g).to(dtype)
    y = torch.randn(16, 1, generator=g).to(dtype)
    return ((model(x) - y) ** 2).mean()
