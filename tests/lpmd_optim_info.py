"""``LPMD_INFO``: the ``OptimizerInfo`` of ``mdlib.optim.LpMirrorDescent``, written with torch's own test
machinery (``torch.testing._internal.common_optimizers``, which needs the ``expecttest`` package), as torch
writes the entries of its optimizers. ``tests/test_torch_conformance.py`` iterates its configs in tests of
our own; ``tests/test_torch_suite.py`` runs torch's real ``TestOptimRenewed`` with it.

Every way LpMirrorDescent differs from torch's optimizers by design is a named skip with its reason."""

from __future__ import annotations

import unittest

import torch
from torch.nn import Parameter
from torch.optim.lr_scheduler import ConstantLR, ExponentialLR, LambdaLR, LinearLR, PolynomialLR, ReduceLROnPlateau, \
    StepLR
from torch.testing._internal.common_methods_invocations import DecorateInfo
from torch.testing._internal.common_optimizers import (
    ErrorOptimizerInput,
    OptimizerErrorEnum,
    OptimizerInfo,
    OptimizerInput,
    _get_device_type,
    get_error_inputs_for_all_optims,
)

from mdlib.optim import LpMirrorDescent

__all__ = ["LPMD_INFO", "SKIPS", "optim_inputs_func_lpmd", "optim_error_inputs_func_lpmd"]


def optim_inputs_func_lpmd(device: str | torch.device, dtype: torch.dtype | None = None) -> list[OptimizerInput]:
    """The constructor configs (no ``foreach``/``fused``: the tests add those): p = 2 (SGD) with torch's
    usual variations, and the paper's exponents 1.1, 1.75 and 3 with a tensor lr, maximize, normalize."""
    return [
        OptimizerInput(params=None, kwargs={}, desc="default (p = 2: SGD)"),
        OptimizerInput(params=None, kwargs={"lr": 1e-2}, desc="non-default lr"),
        OptimizerInput(params=None, kwargs={"lr": torch.tensor(0.001)}, desc="tensor lr"),
        OptimizerInput(params=None, kwargs={"maximize": True}, desc="maximize"),
        OptimizerInput(params=None, kwargs={"p": 1.75}, desc="p = 1.75"),
        OptimizerInput(params=None, kwargs={"p": 1.75, "lr": torch.tensor(0.002), "maximize": True},
                       desc="p = 1.75, tensor lr, maximize"),
        OptimizerInput(params=None, kwargs={"p": 3.0, "normalize": True, "lr": 1e-2}, desc="p = 3, normalize"),
        OptimizerInput(params=None, kwargs={"p": 1.1, "lr": 1e-4}, desc="p = 1.1"),
    ]


def optim_error_inputs_func_lpmd(device: str | torch.device, dtype: torch.dtype) -> list[ErrorOptimizerInput]:
    """torch's error inputs for every optimizer, and LpMirrorDescent's own refusals."""
    error_inputs = get_error_inputs_for_all_optims(device, dtype)
    if _get_device_type(device) != "cpu":
        return error_inputs
    param = Parameter(torch.randn(1, 1, device=device, dtype=dtype))
    complex_param = Parameter(torch.randn(2, dtype=torch.complex64, device=device))

    def construction(kwargs: dict, desc: str, error_type: type, error_regex: str, params=None) -> ErrorOptimizerInput:
        return ErrorOptimizerInput(OptimizerInput(params=[param] if params is None else params, kwargs=kwargs,
                                                  desc=desc),
                                   error_on=OptimizerErrorEnum.CONSTRUCTION_ERROR, error_type=error_type,
                                   error_regex=error_regex)

    return error_inputs + [
        construction(dict(lr=-0.5), "lr must be >= 0", ValueError, "Invalid learning rate: -0.5"),
        construction(dict(lr=float("nan")), "lr must be finite", ValueError, "Invalid learning rate: nan"),
        construction(dict(lr=torch.tensor(-1.0)), "a tensor lr must be >= 0", ValueError, "Invalid learning rate"),
        construction(dict(p=1.0), "p must be > 1", ValueError, "exponent must be a finite number > 1"),
        construction(dict(eps=-1.0), "eps must be >= 0", ValueError, "eps must be a finite number >= 0"),
        construction(dict(foreach=True, fused=True), "one implementation", RuntimeError,
                     "`fused` and `foreach` cannot be `True` together"),
        construction({}, "complex parameters: a clear error", ValueError,
                     "does not support complex parameters.*torch.view_as_real", params=[complex_param]),
    ]


def _skip(reason: str, test: str, **kwargs) -> DecorateInfo:
    return DecorateInfo(unittest.skip(f"LpMirrorDescent, by design: {reason}"), "TestOptimRenewed", test, **kwargs)


#: The by-design differences, as named skips of torch's TestOptimRenewed tests.
SKIPS = (
    _skip("no weight_decay (nor momentum, dampening, nesterov): the update is plain mirror descent in the "
          "l_p geometry, whose regularizer would be the potential, not an L2 penalty",
          "test_param_groups_weight_decay"),
    _skip("no AMP grad_scale/found_inf protocol: a non-finite gradient is refused with FloatingPointError "
          "(parameters left unchanged) where torch's optimizers propagate NaN or skip by found_inf",
          "test_fused_does_not_step_if_foundinf"),
    _skip("no capturable (CUDA graph) mode", "test_cpu_load_state_dict",
          active_if=lambda kwargs: kwargs.get("impl") == "capturable"),
)

#: Schedulers of torch's SGD entry, and warmups from lr 0 and decays to lr 0.
SCHEDULER_INPUTS = (
    [lambda opt: StepLR(opt, gamma=0.9, step_size=10)],
    [lambda opt: LinearLR(opt, start_factor=0.4, end_factor=0.8, total_iters=4)],
    [lambda opt: StepLR(opt, gamma=0.99, step_size=10), lambda opt: ExponentialLR(opt, gamma=0.99),
     lambda opt: ReduceLROnPlateau(opt)],
    [lambda opt: ConstantLR(opt, factor=0.4, total_iters=4)],
    [lambda opt: PolynomialLR(opt, power=0.9, total_iters=4)],
    [lambda opt: LambdaLR(opt, lambda epoch: min(1.0, epoch / 5))],  # warmup from lr 0
    [lambda opt: LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=15)],  # down to lr 0
)

LPMD_INFO = OptimizerInfo(
    LpMirrorDescent,
    optim_inputs_func=optim_inputs_func_lpmd,
    optim_error_inputs_func=optim_error_inputs_func_lpmd,
    scheduler_inputs=SCHEDULER_INPUTS,
    supported_impls=("foreach", "fused"),
    not_og_supported_flags=("foreach", "fused", "maximize"),
    supports_sparse=False,
    supports_complex=False,  # refused at construction with a clear error: optimize torch.view_as_real(param)
    supports_fused_on=("cpu", "cuda"),
    skips=SKIPS,
)
