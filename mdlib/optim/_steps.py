"""The eager implementations of ``LpMirrorDescent``'s step (``mdlib.optim``), named as torch names its own,
and the tensor helpers the optimizer shares with them.

- single-tensor (``_single_tensor_lpmirrordescent``): a loop over the parameters, in-place torch
  operations; a sparse gradient steps the rows it holds (``_sparse_rows_step``);
- multi-tensor (``_multi_tensor_lpmirrordescent``): torch's ``torch._foreach_*`` kernels per device and
  dtype (on a CPU the single-tensor loop, which is faster there);
- SGD's direction (``_sgd_direction``): the gradient after weight decay and momentum, as
  ``torch.optim.SGD`` computes it; p = 2 is torch's functional SGD, entered through each
  implementation (torch's tests patch them by name to see which one ran).

For p != 2 a step writes s = u - lr g into the spare buffers and w = m^-1(s) into the parameters and
returns whether each new parameter is finite (``_finite``); the caller undoes a refused step.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor
from torch.optim.sgd import sgd as _torch_sgd  # torch's functional SGD: the step at p = 2

try:  # torch's list of the devices with foreach optimizer kernels (a private helper, torch >= 2.1)
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices
except ImportError:  # pragma: no cover
    def _get_foreach_kernels_supported_devices() -> list[str]:
        return ["cuda", "xpu"]

from mdlib.mirror import _foreach_signed_power_into, _signed_power, _signed_power_into, lp_norm


def _real(t: Tensor) -> Tensor:
    """A dense real tensor of the entries of ``t``: its ``view_as_real`` if complex, its values if sparse."""
    if t.is_sparse:
        t = t.coalesce().values()
    return torch.view_as_real(t) if t.is_complex() else t


def _finite(tensors: list[Tensor]) -> Tensor:
    """Whether each tensor is all finite (one min/max pass each: NaN and infinities propagate), as a
    bool tensor on the tensors' device (no host read). Complex and sparse tensors: their real entries."""
    tensors = [_real(t) for t in tensors]
    extremes = torch.stack([m for t in tensors for m in (t.aminmax() if t.numel() else (t.new_zeros(()),) * 2)])
    return torch.isfinite(extremes.reshape(-1, 2).double()).all(dim=1)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: Tensor) -> Tensor:
    """``t``'s entries as integers of its width: equal iff bit for bit equal (-0 is not +0, a NaN is the
    NaN it was), where comparing floats would call -0 and +0 equal and a NaN unequal to itself."""
    return t.detach().view(_BITS[t.element_size()])


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits, read on the host: numpy's ``array_equal`` of their
    integer views on CPU (several times faster there than ``torch.equal``), ``torch.equal`` elsewhere."""
    if a.device.type == "cpu":
        return bool(np.array_equal(_bits(a).numpy(), _bits(b).numpy()))
    return torch.equal(_bits(a), _bits(b))


def _edit_checked(w: Tensor, u: Tensor, written: Tensor, q: float, power: Callable[[Tensor, float], Tensor]) -> Tensor:
    """The edit check, the one every route runs: u where w holds the bits the optimizer last wrote
    (``written``, in w's dtype), else m(w) = sign(w) |w|^q (q = p - 1, by ``power``: the route's
    own signed power, eager or compiled)."""
    return torch.where(_bits(written) == _bits(w), u, power(w.detach().to(u.dtype), q))


def _by_device_and_dtype(*lists: list[Tensor]) -> list[list[int]]:
    """Indices of the tensors of ``lists`` (parallel lists), grouped by the device and dtype of each."""
    groups: dict[tuple, list[int]] = {}
    for i, tensors in enumerate(zip(*lists)):
        groups.setdefault(tuple((t.device, t.dtype) for t in tensors), []).append(i)
    return list(groups.values())


# --- the implementations (p = 2 is SGD in each) ----------------------------------------------------


def _single_tensor_lpmirrordescent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor] | None,
                                   spares: list[Tensor] | None, *, lr: float, p: float, maximize: bool,
                                   momentum_buffers: list[Tensor | None] | None = None,
                                   sgd: dict[str, Any] | None = None) -> Tensor | None:
    """s <- u - lr g (u + lr g when maximizing) and w <- m^-1(s), tensor by tensor; the finite flags.
    p = 2: torch's single-tensor SGD with its options ``sgd`` and ``momentum_buffers`` (and None)."""
    if p == 2.0:
        _torch_sgd(params, grads, momentum_buffers, foreach=False, fused=False, lr=lr, maximize=maximize, **sgd)
        return None
    alpha = lr if maximize else -lr  # (-lr)(-g) = lr g exactly: SGD's maximize, without negating g
    r = 1.0 / (p - 1.0)
    for w, g, u, s in zip(params, grads, duals, spares):
        if g.is_sparse:
            _sparse_rows_step(w, g, u, s, alpha, r)
        else:
            torch.add(u, g, alpha=alpha, out=s)
            _signed_power_into(s, r, w)
    return _finite(params)


def _sparse_rows_step(w: Tensor, g: Tensor, u: Tensor, s: Tensor, alpha: float, r: float) -> None:
    """The step of a sparse gradient: s <- u, then, at the entries it holds (rows of an embedding),
    s <- u + alpha g and w <- m^-1(s). Elsewhere w is left as it is: a zero gradient leaves u, so
    m^-1(u) = w there, and the inverse map (the step's cost) runs on the touched entries only."""
    g = g.coalesce()
    index = tuple(g.indices())
    s.copy_(u)
    rows = torch.add(u[index], g.values(), alpha=alpha)
    s[index] = rows
    w[index] = _signed_power(rows, r).to(w.dtype)


def _multi_tensor_lpmirrordescent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor] | None,
                                  spares: list[Tensor] | None, *, lr: float, p: float, maximize: bool,
                                  momentum_buffers: list[Tensor | None] | None = None,
                                  sgd: dict[str, Any] | None = None) -> Tensor | None:
    """The same update with foreach kernels, per device and dtype. p = 2: torch's foreach SGD."""
    if p == 2.0:
        _torch_sgd(params, grads, momentum_buffers, foreach=True, fused=False, lr=lr, maximize=maximize, **sgd)
        return None
    alpha = lr if maximize else -lr
    r = 1.0 / (p - 1.0)
    for index in _by_device_and_dtype(duals, params):
        ws, gs, us, ss = ([x[i] for i in index] for x in (params, grads, duals, spares))
        if us[0].device.type == "cpu":  # torch's foreach kernels loop over the tensors there: the loop is faster
            _single_tensor_lpmirrordescent(ws, gs, us, ss, lr=lr, p=p, maximize=maximize)
            continue
        torch._foreach_copy_(ss, us)
        torch._foreach_add_(ss, gs, alpha=alpha)
        _foreach_signed_power_into(ss, r, ws)
    return _finite(params)


def _sgd_direction(params: list[Tensor], grads: list[Tensor], buffers: list[Tensor | None], *,
                   weight_decay: float, momentum: float, dampening: float, nesterov: bool, maximize: bool,
                   foreach: bool) -> tuple[list[Tensor], list[Tensor | None]]:
    """SGD's direction d from the gradients, as ``torch.optim.SGD`` computes it before its update::

        g <- -g (maximize);  g <- g + weight_decay w;
        b <- g (first step), else momentum b + (1 - dampening) g;  d <- g + momentum b (nesterov), else b

    Out of place: the new momentum buffers are new tensors, so a refused step returns to the old ones.
    Returns (directions, buffers); foreach kernels per device and dtype with ``foreach``."""
    if foreach:
        out, new = list(grads), list(buffers)
        for index in _by_device_and_dtype(params, grads):
            ws, gs = [params[i] for i in index], [grads[i] for i in index]
            bs = [buffers[i] for i in index]
            ds, bs = _foreach_sgd_direction(ws, gs, bs, weight_decay, momentum, dampening, nesterov, maximize)
            for i, d, b in zip(index, ds, bs):
                out[i], new[i] = d, b
        return out, new
    out, new = [], []
    for w, g, b in zip(params, grads, buffers):
        d = -g if maximize else g
        if weight_decay:
            d = d.add(w, alpha=weight_decay)
        if momentum:
            b = d.clone() if b is None else b.mul(momentum).add_(d, alpha=1.0 - dampening)
            d = d.add(b, alpha=momentum) if nesterov else b
        out.append(d)
        new.append(b)
    return out, new


def _foreach_sgd_direction(ws: list[Tensor], gs: list[Tensor], bs: list[Tensor | None], weight_decay: float,
                           momentum: float, dampening: float, nesterov: bool,
                           maximize: bool) -> tuple[list[Tensor], list[Tensor | None]]:
    """:func:`_sgd_direction` for tensors of one device and dtype, with foreach kernels."""
    ds = torch._foreach_neg(gs) if maximize else list(gs)
    if weight_decay:
        ds = torch._foreach_add(ds, ws, alpha=weight_decay)
    if not momentum:
        return ds, bs
    old = [i for i, b in enumerate(bs) if b is not None]
    new: list[Tensor | None] = [d.clone() if b is None else None for d, b in zip(ds, bs)]
    if old:
        moved = torch._foreach_mul([bs[i] for i in old], momentum)
        torch._foreach_add_(moved, [ds[i] for i in old], alpha=1.0 - dampening)
        for i, b in zip(old, moved):
            new[i] = b
    if nesterov:
        return torch._foreach_add(ds, new, alpha=momentum), new
    return list(new), new


# --- the implementation's defaults, the gradient's normalization, the inverse map -----------------


#: Tensor types the foreach kernels take (torch's ``_foreach_supported_types``).
_FOREACH_TYPES = (Tensor, torch.nn.Parameter, torch.nn.Buffer) if hasattr(torch.nn, "Buffer") else (
    Tensor, torch.nn.Parameter)


def _default_foreach(tensors: list[Tensor]) -> bool:
    """torch's rule: foreach when every tensor is a plain tensor on a foreach-capable device (CUDA)."""
    devices = _get_foreach_kernels_supported_devices()
    return all(type(t) in _FOREACH_TYPES and t.device.type in devices for t in tensors)


def _resolved_foreach(foreach: bool | None, params: list[Tensor], grads: list[Tensor]) -> bool:
    """Whether the eager implementation is foreach: ``foreach``, else torch's default; never with a
    sparse gradient (the single-tensor loop steps its rows)."""
    chosen = _default_foreach(params) if foreach is None else bool(foreach)
    return chosen and not any(g.is_sparse for g in grads)


def _normalized(grads: list[Tensor], p: float, eps: float) -> list[Tensor]:
    """g / (||g||_q + eps) per tensor, q = p/(p-1). A non-finite gradient gives a NaN entry (inf / inf),
    so the step's finiteness check refuses it; nothing is read on the host."""
    q = p / (p - 1.0)
    return [g / (lp_norm(g, q) + eps) for g in grads]


def _inverse(duals: list[Tensor], outs: list[Tensor], r: float, foreach: bool) -> None:
    """outs <- m^-1(u) by the eager implementation's own kernels, in the duals' dtype (``outs`` have it)."""
    for index in _by_device_and_dtype(duals):
        if foreach and duals[index[0]].device.type != "cpu":  # on CPU, as the step: the loop
            _foreach_signed_power_into([duals[i] for i in index], r, [outs[i] for i in index])
        else:
            for i in index:
                _signed_power_into(duals[i], r, outs[i])


def _resync(params: list[Tensor], duals: list[Tensor], spares: list[Tensor], p: float, foreach: bool) -> None:
    """The edit check on the device for the eager implementations (no host read), into u: what they
    last wrote is m^-1(u) as they compute it (into ``spares``, scratch)."""
    _inverse(duals, spares, 1.0 / (p - 1.0), foreach)
    for w, u, s in zip(params, duals, spares):
        u.copy_(_edit_checked(w, u, s.to(w.dtype), p - 1.0, _signed_power))
