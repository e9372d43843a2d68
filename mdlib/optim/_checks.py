"""What ``LpMirrorDescent`` (``mdlib.optim``) refuses, with torch's messages where torch's optimizers refuse
the same: a bad hyperparameter of a param group (``_check_group``: lr as ``_check_lr``, SGD's options as
``torch.optim.SGD``), a param-group key it would silently ignore (``_check_group_keys``), a sparse
gradient whose step would not be sparse (``_check_sparse``) and a parameter the fused kernels cannot
take (``_check_fused_param``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import warnings
from typing import Any, Iterable

import torch
from torch import Tensor
from torch.optim import Optimizer

try:  # torch's list of the devices with fused optimizer kernels (a private helper, torch >= 2.1)
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
except ImportError:  # pragma: no cover
    def _get_fused_kernels_supported_devices() -> list[str]:
        return ["mps", "cuda", "xpu", "hpu", "cpu"]

from mdlib.mirror import check_p


_LR_RULE = "lr must be a finite number >= 0, or a 1-element tensor holding one"


def _check_lr(lr: object) -> None:
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if lr.is_complex() or not math.isfinite(float(lr)) or float(lr) < 0:
            raise ValueError(f"Invalid learning rate: {lr} ({_LR_RULE})")
        return
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr) or lr < 0:
        raise ValueError(f"Invalid learning rate: {lr!r} ({_LR_RULE})")


def _check_group(group: dict[str, Any], params: Iterable[object] = ()) -> None:
    """Refuse a bad hyperparameter or parameter of ``group`` (ValueError, RuntimeError); normalize p.
    SGD's options are checked as ``torch.optim.SGD`` checks them, with its messages."""
    _check_lr(group["lr"])
    group["p"] = check_p(group["p"])
    for key in ("eps", "momentum", "dampening", "weight_decay"):
        value = group[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise ValueError(f"Invalid {key} value: {value!r} (a finite number >= 0)")
    for key in ("normalize", "maximize", "nesterov", "differentiable"):
        if not isinstance(group[key], bool):
            raise ValueError(f"{key} must be True or False, got {key}={group[key]!r}")
    if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    if group["differentiable"]:
        raise ValueError("LpMirrorDescent does not support differentiable=True: a step is checked on the host "
                         "and a refused step is undone in place, which autograd cannot follow; differentiate "
                         "through mdlib.mirror.mirror_step (a pure function) instead")
    for key in ("foreach", "fused"):
        if group[key] is not None and not isinstance(group[key], bool):
            raise ValueError(f"{key} must be None, True or False, got {key}={group[key]!r}")
    if group["foreach"] and group["fused"]:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    for param in params:
        if isinstance(param, Tensor) and param.is_complex() and group["fused"]:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors: "
                               f"got {param.dtype}; use fused=False for complex parameters")


def _check_sparse(group: dict[str, Any], p: float, param: Tensor, name: str) -> None:
    """Refuse a sparse gradient where its step would not be sparse or is not implemented (p = 2 takes
    what ``torch.optim.SGD`` takes)."""
    if group["fused"]:
        raise RuntimeError(f"`fused` does not support sparse gradients ({name}): use fused=False")
    if group["normalize"]:
        raise RuntimeError(f"normalize=True needs the dense gradient of {name}: use a dense gradient "
                           "(e.g. nn.Embedding(..., sparse=False))")
    if p != 2.0 and (group["weight_decay"] or group["momentum"]):
        raise RuntimeError(f"a sparse gradient ({name}) with weight_decay or momentum makes the step dense: use "
                           "a dense gradient, or put the sparse parameters in a group without them")
    if p != 2.0 and param.is_complex():
        raise RuntimeError(f"a sparse gradient of a complex parameter ({name}) is supported at p = 2 only")


def _check_fused_param(param: Tensor) -> None:
    """What torch's fused optimizers refuse, with their message: a parameter that is not floating point
    or not on a device with fused kernels (e.g. meta)."""
    devices = _get_fused_kernels_supported_devices()
    if not (param.device.type in devices and torch.is_floating_point(param)):
        raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of "
                           f"supported devices: {devices} but {param.dtype} and {param.device.type}")


#: Keys that torch itself puts into param groups (named parameters, lr schedulers, SWA): accepted as they are.
_TORCH_GROUP_KEYS = frozenset(("params", "param_names", "initial_lr", "max_lr", "min_lr", "base_lr", "max_momentum",
                               "base_momentum", "swa_lr"))


#: This optimizer's options that are attributes, not param-group entries.
_ATTRIBUTES = ("lazy_check", "check_edits")


@functools.cache
def _other_optimizers_options() -> frozenset[str]:
    """The hyperparameters of torch's other optimizers (their constructors' keywords), e.g. ``betas``."""
    names: set[str] = set()
    for value in vars(torch.optim).values():
        if isinstance(value, type) and issubclass(value, Optimizer) and value is not Optimizer:
            names.update(inspect.signature(value.__init__).parameters)
    return frozenset(names - {"self", "params", "args", "kwargs"})


def _check_group_keys(group: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse a param-group key that would be silently ignored: a misspelling of an option (``momentun``),
    another optimizer's hyperparameter (``betas``) or an attribute of this one (``lazy_check``); warn about
    any other key this optimizer does not read. Not every unknown key is refused because torch and the
    code around it store their own entries in param groups (schedulers, names, tags)."""
    for key in group:
        if key in defaults or key in _TORCH_GROUP_KEYS:
            continue
        if not isinstance(key, str):
            raise ValueError(f"param group keys must be strings, got {key!r}")
        if key in _ATTRIBUTES:
            raise ValueError(f"{key!r} is an LpMirrorDescent attribute, not a param-group entry: pass "
                             f"{key}=... to the constructor")
        close = difflib.get_close_matches(key, list(defaults), n=1, cutoff=0.75)
        if close:
            raise ValueError(f"unknown param-group option {key!r}: did you mean {close[0]!r}? (LpMirrorDescent "
                             f"reads {', '.join(sorted(defaults))})")
        if key in _other_optimizers_options():
            raise ValueError(f"param-group option {key!r} belongs to another torch optimizer; LpMirrorDescent would "
                             f"ignore it (it reads {', '.join(sorted(defaults))})")
        warnings.warn(f"LpMirrorDescent ignores the param-group entry {key!r} (not one of its options: "
                      f"{', '.join(sorted(defaults))})", UserWarning, stacklevel=4)
