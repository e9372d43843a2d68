"""What ``LpMirrorDescent`` (``mdlib.optim``) runs through ``torch.compile``.

- The fused implementation (``fused=True``, ``_fused_lpmirrordescent``): the whole update of a tensor,
  finiteness check included, as one compiled expression (``_fused_update``). Kernels are compiled once
  per layout and shared (``_KERNELS``: they are pure, the step size an argument); what one optimizer
  keeps (its lr tensors, why compiling failed) is its own ``_Fused``. If compiling fails: a one-time
  warning and None, and the optimizer runs the eager implementations (``mdlib.optim._steps``).
- The traced step (``_traced_update``): the step as ``torch.compile`` traces ``opt.step``, without a host
  read, so without a graph break; the edit check on the device (``_edit_checked``, as every route).
"""

from __future__ import annotations

import types
import warnings
from typing import Callable

import torch
from torch import Tensor

from mdlib import first_line
from mdlib.mirror import _fused_signed_power
from mdlib.optim._steps import _edit_checked, _sgd_direction

# --- the fused implementation ---------------------------------------------------------------------


def _fused_update(params: list[Tensor], grads: list[Tensor], duals: list[Tensor], spares: list[Tensor],
                  lr: Tensor, r: float, q: float, check: bool) -> Tensor:
    """The update as one expression per tensor, for torch.compile; returns the finite flags.

    ``check`` (a lazily checked step, which cannot ask the host): first the edit check into u, against
    m^-1(u) as the update computes it (the ``where`` computes m(w) everywhere: compute is cheap on a GPU).
    A tensor is finite iff max|w| is (the max propagates NaN), a float reduction in the update's loop.
    The sign of a maximizing step is in ``lr``."""
    extremes = []
    for w, g, u, s in zip(params, grads, duals, spares):
        if check:
            u.copy_(_edit_checked(w, u, _fused_signed_power(u, r).to(w.dtype), q, _fused_signed_power))
        s.copy_(u - g.to(u.dtype) * lr)
        w.copy_(_fused_signed_power(s, r).to(w.dtype))
        extremes.append(w.abs().amax().float() if w.numel() else w.new_zeros((), dtype=torch.float32))
    return torch.isfinite(torch.stack(extremes))


#: Compiled kernels by the layout they were compiled for (shapes, strides, dtypes, devices, r, check):
#: one code object each, so a kernel is compiled once and never recompiled or shared across layouts. The
#: kernels are pure (the step size is an argument), so optimizers that share one cannot interfere.
_KERNELS: dict[tuple, Callable] = {}


class _Fused:
    """What the fused implementation keeps for one optimizer: its step size as a 0-dim float64 tensor per
    device (a kernel argument, so a new lr does not recompile; each optimizer has its own) and why
    compiling failed, if it did (then the optimizer runs the eager implementations, warned once)."""

    def __init__(self) -> None:
        self.lr: dict[torch.device, Tensor] = {}
        self.failure: str | None = None


def _kernel(params: list[Tensor], grads: list[Tensor], duals: list[Tensor], spares: list[Tensor], lr: Tensor,
            r: float, q: float, check: bool) -> Callable:
    """The compiled :func:`_fused_update` for these tensors. ``realize_reads_threshold=1`` makes
    inductor store each new value once and run the finiteness reduction in the loop of the stores;
    kernels of at most two tensors each compile in parallel on CPU."""
    key = (r, q, check, lr.dtype, lr.device, *((t.shape, t.stride(), t.dtype, t.device)
                                               for ts in (params, grads, duals, spares) for t in ts))
    fn = _KERNELS.get(key)
    if fn is None:
        code = _fused_update.__code__.replace()  # torch caches compiled code per code object
        private = types.FunctionType(code, _fused_update.__globals__, _fused_update.__name__)
        fn = _KERNELS[key] = torch.compile(private, dynamic=False, fullgraph=True, options={
            "realize_reads_threshold": 1, "cpp.max_horizontal_fusion_size": 2})
    return fn


def _fused_lpmirrordescent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor], spares: list[Tensor],
                           *, lr: float | Tensor, p: float, maximize: bool, check: bool = False,
                           fused: _Fused | None = None) -> Tensor | None:
    """The compiled update (p != 2), or None if torch.compile fails (warned once per ``fused`` state; the
    caller then runs another implementation). A kernel fails when it is compiled, before it writes
    anything."""
    fused = _Fused() if fused is None else fused
    if fused.failure is not None:
        return None
    device = duals[0].device
    lr_t = fused.lr.get(device)
    if lr_t is None:
        lr_t = fused.lr[device] = torch.zeros((), dtype=torch.float64, device=device)
    if isinstance(lr, Tensor):
        lr_t.copy_(lr.detach().reshape(()))  # a kernel argument: no host read of a device lr
    else:
        lr_t.fill_(lr)
    if maximize:
        lr_t.neg_()
    r, q = 1.0 / (p - 1.0), p - 1.0
    try:
        return _kernel(params, grads, duals, spares, lr_t, r, q, check)(params, grads, duals, spares, lr_t, r, q,
                                                                        check)
    except Exception as error:  # noqa: BLE001  (any failure to compile or run the kernel: fall back)
        fused.failure = f"{type(error).__name__}: {first_line(error)}"
        warnings.warn(f"LpMirrorDescent(fused=True): torch.compile failed ({fused.failure}); using the "
                      "foreach/single-tensor implementation instead (same update, slower)", UserWarning, stacklevel=4)
        return None


# --- the step traced by torch.compile --------------------------------------------------------------


def _traced_update(params: list[Tensor], grads: list[Tensor], duals: list[Tensor], spares: list[Tensor],
                   buffers: list[Tensor | None], *, lr: float | Tensor, p: float, momentum: float, dampening: float,
                   weight_decay: float, nesterov: bool, maximize: bool, check_edits: bool,
                   refused: Tensor) -> list[Tensor | None]:
    """The update (p != 2) as ``torch.compile`` traces it, without a host read: with ``check_edits``,
    u <- u where w = m^-1(u) bit for bit, else m(w); s = u - lr d (d: the gradient after SGD's options);
    u <- s and w <- m^-1(s) only if every new parameter is finite, decided on the device (else u, w and
    the momentum buffers stay, and ``refused`` counts the step). Returns the momentum buffers to keep."""
    r = 1.0 / (p - 1.0)
    direction, new_buffers = _sgd_direction(params, grads, buffers, weight_decay=weight_decay, momentum=momentum,
                                            dampening=dampening, nesterov=nesterov, maximize=maximize, foreach=False)
    extremes = []
    for w, d, u, s in zip(params, direction, duals, spares):
        if check_edits:
            u.copy_(_edit_checked(w, u, _fused_signed_power(u, r).to(w.dtype), p - 1.0, _fused_signed_power))
        s.copy_(u - d.to(u.dtype) * lr)
        extremes.append(_fused_signed_power(s, r).abs().amax().float() if s.numel() else s.new_zeros(()).float())
    ok = torch.isfinite(torch.stack(extremes)).all()
    for w, u, s in zip(params, duals, spares):
        u.copy_(torch.where(ok, s, u))
        w.copy_(_fused_signed_power(u, r).to(w.dtype))
    refused.add_((~ok).to(refused.dtype))
    for b_old, b_new in zip(buffers, new_buffers):  # in place: the state keeps its tensors (no recompile)
        if b_old is not None and b_new is not None:
            b_old.copy_(torch.where(ok, b_new, b_old))
    return [b_new if b_old is None else b_old for b_old, b_new in zip(buffers, new_buffers)]
