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
    """The constructor configs (no ``foreach``/``fused``: the tests add those): p = 2 with torch SGD's own
    option sets (momentum, dampening, weight decay, nesterov, maximize), the same options in the mirror
    geometry at p = 1.75 and 3, and the paper's exponents 1.1, 1.75 and 3 with a tensor lr, maximize,
    normalize."""
    return [
        OptimizerInput(params=None, kwargs={}, desc="default (p = 2: SGD)"),
        OptimizerInput(params=None, kwargs={"lr": 1e-2}, desc="non-default lr"),
        OptimizerInput(params=None, kwargs={"lr": torch.tensor(0.001)}, desc="tensor lr"),
        OptimizerInput(params=None, kwargs={"maximize": True}, desc="maximize"),
    ] + [
        OptimizerInput(params=None, kwargs={**options, "p": p}, desc=f"p = {p:g}, {desc}")
        for p in (2.0, 1.75, 3.0) for options, desc in SGD_OPTIONS
    ] + [
        OptimizerInput(params=None, kwargs={"p": 1.75}, desc="p = 1.75"),
        OptimizerInput(params=None, kwargs={"p": 1.75, "lr": torch.tensor(0.002), "maximize": True},
                       desc="p = 1.75, tensor lr, maximize"),
        OptimizerInput(params=None, kwargs={"p": 3.0, "normalize": True, "lr": 1e-2}, desc="p = 3, normalize"),
        OptimizerInput(params=None, kwargs={"p": 1.1, "lr": 1e-4}, desc="p = 1.1"),
    ]


#: torch.optim.SGD's option sets (its OptimizerInfo's), each with a description.
SGD_OPTIONS = (
    (dict(momentum=0.9), "momentum"),
    (dict(momentum=0.9, dampening=0.5), "dampening"),
    (dict(momentum=0.9, weight_decay=0.1), "weight_decay"),
    (dict(weight_decay=0.1, maximize=True), "weight_decay, maximize"),
    (dict(momentum=0.9, nesterov=True, weight_decay=0.1), "nesterov"),
    (dict(lr=torch.tensor(0.001), momentum=0.9, weight_decay=0.1, maximize=True), "tensor lr, all, maximize"),
)


def optim_error_inputs_func_lpmd(device: str | torch.device, dtype: torch.dtype) -> list[ErrorOptimizerInput]:
    """torch's error inputs for every optimizer, and LpMirrorDescent's own refusals."""
    error_inputs = get_error_inputs_for_all_optims(device, dtype)
    if _get_device_type(device) != "cpu":
        return error_inputs
    param = Parameter(torch.randn(1, 1, device=device, dtype=dtype))

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
        construction(dict(eps=-1.0), "eps must be >= 0", ValueError, "Invalid eps value: -1.0"),
        construction(dict(momentum=-0.5), "momentum must be >= 0", ValueError, "Invalid momentum value: -0.5"),
        construction(dict(weight_decay=-0.5), "weight_decay must be >= 0", ValueError,
                     "Invalid weight_decay value: -0.5"),
        construction(dict(nesterov=True), "nesterov needs momentum", ValueError,
                     "Nesterov momentum requires a momentum and zero dampening"),
        construction(dict(momentum=0.9, dampening=0.1, nesterov=True), "nesterov needs zero dampening", ValueError,
                     "Nesterov momentum requires a momentum and zero dampening"),
        construction(dict(differentiable=True), "differentiable is refused", ValueError,
                     "does not support differentiable=True"),
        construction(dict(foreach=True, fused=True), "one implementation", RuntimeError,
                     "`fused` and `foreach` cannot be `True` together"),
        construction({}, "a misspelt group option is refused", ValueError, "did you mean 'momentum'",
                     params=[{"params": [param], "momentun": 0.9}]),
        construction({}, "another optimizer's option is refused", ValueError, "belongs to another torch optimizer",
                     params=[{"params": [param], "betas": (0.9, 0.99)}]),
    ]


def _skip(reason: str, test: str, **kwargs) -> DecorateInfo:
    return DecorateInfo(unittest.skip(f"LpMirrorDescent, by design: {reason}"), "TestOptimRenewed", test, **kwargs)


#: The by-design differences, as named skips of torch's TestOptimRenewed tests.
SKIPS = (
    _skip("normalize=True divides a complex tensor's gradient by one dual norm over its real and imaginary "
          "parts, where the test's real twin is two tensors with a norm each (the other configs: our "
          "test_complex compares a complex parameter with its view_as_real)", "test_complex_2d"),
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
    supports_sparse=True,  # p = 2 as SGD; p != 2 without momentum or weight decay (rows it touches only)
    # torch's test_rosenbrock_sparse: 2000 cyclic steps, sparse against dense (measured here within 1.5e-6)
    metadata_for_sparse=({"lr": 1e-3, "p": 1.75}, [lambda opt: StepLR(opt, gamma=0.99999, step_size=300)]),
    supports_complex=True,  # stepped as its torch.view_as_real, torch's convention
    supports_fused_on=("cpu", "cuda"),
    skips=SKIPS,
)
