r"""``LpMirrorDescent``: l_p mirror descent as a ``torch.optim`` optimizer, with torch's conventions.

The class gathers each parameter's state (the dual variable) and calls one of three implementations
of the same update, named as torch names its own:

- single-tensor (``_single_tensor_lpmirrordescent``): a loop over the parameters, in-place torch
  operations (the default on CPU);
- multi-tensor (``_multi_tensor_lpmirrordescent``, ``foreach=True``): torch's ``torch._foreach_*``
  kernels, one launch per operation for all tensors of a device and dtype (the default on CUDA);
- fused (``_fused_lpmirrordescent``, ``fused=True``): the whole update of a tensor, finiteness check
  included, as one expression compiled by ``torch.compile`` (opt-in; if compiling fails, a one-time
  warning and the other implementations).

Conventions (those of torch's optimizers, and where this one differs):

- ``lr``: a number or a 1-element tensor (as ``torch.optim.Adam`` accepts), >= 0, default 1e-3 (as
  ``torch.optim.SGD``). It is validated at construction and in ``add_param_group``, never at
  ``step()``: a scheduler may take it to 0 (``LambdaLR`` warmup, ``LinearLR(end_factor=0)``,
  ``CosineAnnealingLR`` at T_max). A step with a non-finite lr is refused like any step that would
  make a parameter non-finite. A tensor lr is read on the host by the eager implementations (as SGD
  does) and passed to the fused kernel as an argument.
- ``maximize``, ``foreach`` and ``fused`` are param-group entries (``__setstate__`` back-fills them for
  older checkpoints). ``load_state_dict`` keeps this optimizer's ``foreach``/``fused``: they say how
  this process runs the step, so a state saved with one implementation loads into another.
  ``lazy_check`` is an attribute for the same reason.
- p = 2 (without normalization) performs ``param.add_(grad, alpha=-lr)``: bit for bit
  ``torch.optim.SGD(lr=lr, maximize=...)`` (its single-tensor or foreach path), no per-parameter state.
- The dual variable u = m(w) is optimizer state (``state[param]["dual"]``), so the float round trip
  w -> m(w) -> m^-1 is not repeated every step (float32 weights would drift ~1e-4 relative per 1000
  steps at p = 1.75). Low-precision parameters (fp16/bf16) keep u in float32, also through
  ``state_dict``/``load_state_dict`` (torch would cast it to the parameter's dtype).
- Parameters changed outside the optimizer are respected, also through ``.data`` (``p.data.clamp_``,
  ``torch.nn.utils.vector_to_parameters``), which torch's version counter does not see: every step
  first verifies, bit for bit, that each parameter is still what the optimizer last wrote (the copy an
  immediately checked step keeps in its spare buffer, else m^-1(u) by the same implementation) and
  re-derives u = m(w) for the entries that are not. Without edits, nothing changes bit for bit. Cost
  per step (one CPU thread, 1M float32 parameters, median over rounds, against the step without the
  check): 1.2-1.4x immediately checked (a copy and a comparison; fused 1.6x); 2.2-4.4x lazily checked
  eager steps, which compute m^-1(u) and m(w) every step (the fused kernel does both in its one pass:
  2.5x on a CPU, where the extra powers cost compute; on a GPU the kernel's memory traffic grows 1.5x).
- A refused step changes nothing. The new dual is written into a spare buffer (u and the spare swap
  roles once the step is accepted: u plus one spare, the memory of Adam's two moments) and the new
  parameter in place, with a per-tensor flag of whether it is finite. A non-finite gradient or an
  inverse map that overflows clears a flag; the step is then undone, parameters rebuilt from the
  untouched dual by the same computation that made them (bit for bit; parameters that had no dual
  yet, or were edited outside the optimizer, are copied back from a backup), and FloatingPointError
  names the parameters. One exception: when the step is checked lazily (which cannot ask the host
  about an edit before the update), a parameter edited outside the optimizer since the previous step
  comes back as m^-1(m(w)), within one rounding of the edited value.
- ``lazy_check`` (the default on GPUs) reads the step's flags at the next ``step()`` instead of right
  away, so a step does not wait for the device; a refused step is then undone at that point.
  ``state_dict()``, ``check()`` and pickling/``deepcopy`` settle it too (``load_state_dict`` discards
  it: the loaded state replaces it); ``check()`` is the one call a training loop makes after its last
  step (``mdlib.experiments.train.fit`` does after every epoch). ``zero_grad()`` does not settle it: that would make
  the host wait for the device at every iteration. p = 2 checks the gradient before the step (SGD keeps
  no second copy to roll back to), which reads it on the host.
- Not supported, by design: complex parameters (an error at construction says to optimize
  ``torch.view_as_real(param)``), sparse gradients, ``weight_decay``/momentum, ``differentiable``.

"""

from __future__ import annotations

import math
import numbers
import types
import warnings
from itertools import chain
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import Tensor
from torch.optim import Optimizer

try:  # torch's lists of the devices with foreach and fused optimizer kernels (private helpers, torch >= 2.1)
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices, _get_fused_kernels_supported_devices
except ImportError:  # pragma: no cover
    def _get_foreach_kernels_supported_devices() -> list[str]:
        return ["cuda", "xpu"]

    def _get_fused_kernels_supported_devices() -> list[str]:
        return ["mps", "cuda", "xpu", "hpu", "cpu"]

from mdlib import first_line
from mdlib.mirror import (_foreach_signed_power_into, _fused_signed_power, _signed_power, _signed_power_into, check_p,
                          lp_norm, mirror_map)

__all__ = ["LpMirrorDescent", "lp_mirror_descent"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Per-parameter state that only serves the next step and is not saved by ``state_dict()``: the spare
#: dual buffer (``"copy"`` when it holds the parameter as the last immediately checked step left it) and
#: ``"p"``, the exponent that copy was made with (a 0-dim float64 CPU tensor).
_UNSAVED = ("spare", "copy", "p")
#: Per-parameter entries of checkpoints written by earlier versions, dropped on loading.
_LEGACY = ("version", "exact")


def _dual_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a parameter's dual: float32 for fp16/bf16 parameters, else the parameter's."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _finite(tensors: list[Tensor]) -> Tensor:
    """Whether each tensor is all finite (one min/max pass each: NaN and infinities propagate), as a
    bool tensor on the tensors' device (no host read)."""
    extremes = torch.stack([m for t in tensors for m in (t.aminmax() if t.numel() else (t.new_zeros(()),) * 2)])
    return torch.isfinite(extremes.reshape(-1, 2).double()).all(dim=1)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether two CPU tensors of one shape and dtype hold the same bits (numpy compares their integer
    views several times faster than ``torch.equal``, which would also call -0 and +0 equal)."""
    bits = _BITS[a.element_size()]
    return bool(np.array_equal(a.detach().view(bits).numpy(), b.detach().view(bits).numpy()))


def _by_device_and_dtype(*lists: list[Tensor]) -> list[list[int]]:
    """Indices of the tensors of ``lists`` (parallel lists), grouped by the device and dtype of each."""
    groups: dict[tuple, list[int]] = {}
    for i, tensors in enumerate(zip(*lists)):
        groups.setdefault(tuple((t.device, t.dtype) for t in tensors), []).append(i)
    return list(groups.values())


# --- the three implementations (p = 2 is SGD in each) ----------------------------------------------


def _single_tensor_lpmirrordescent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor],
                                   spares: list[Tensor], *, lr: float, p: float, maximize: bool) -> Tensor | None:
    """s <- u - lr g (u + lr g when maximizing) and w <- m^-1(s), tensor by tensor; the finite flags.
    p = 2: ``w.add_(g, alpha=-lr)``, SGD's single-tensor step (and None)."""
    alpha = lr if maximize else -lr  # (-lr)(-g) = lr g exactly: SGD's maximize, without negating g
    if p == 2.0:
        for w, g in zip(params, grads):
            w.add_(g, alpha=alpha)
        return None
    r = 1.0 / (p - 1.0)
    for w, g, u, s in zip(params, grads, duals, spares):
        torch.add(u, g, alpha=alpha, out=s)
        _signed_power_into(s, r, w)
    return _finite(params)


def _multi_tensor_lpmirrordescent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor],
                                  spares: list[Tensor], *, lr: float, p: float, maximize: bool) -> Tensor | None:
    """The same update with foreach kernels, per device and dtype. p = 2: SGD's foreach step."""
    alpha = lr if maximize else -lr
    if p == 2.0:
        torch._foreach_add_(params, grads, alpha=alpha)
        return None
    r = 1.0 / (p - 1.0)
    for index in _by_device_and_dtype(duals, params):
        ws, gs, us, ss = ([x[i] for i in index] for x in (params, grads, duals, spares))
        torch._foreach_copy_(ss, us)
        torch._foreach_add_(ss, gs, alpha=alpha)
        _foreach_signed_power_into(ss, r, ws)
    return _finite(params)


def _fused_update(params: list[Tensor], grads: list[Tensor], duals: list[Tensor], spares: list[Tensor],
                  lr: Tensor, r: float, q: float, check: bool) -> Tensor:
    """The update as one expression per tensor, for torch.compile; returns the finite flags.

    ``check`` (a lazily checked step, which cannot ask the host): first keep u where w is what the
    optimizer last wrote, m^-1(u) as the update computes it, and write u = m(w) (exponent q = p - 1)
    where it is not, into u itself (the ``where`` computes m(w) everywhere: compute is cheap on a GPU).
    A tensor is finite iff max|w| is (the max propagates NaN), a float reduction in the update's loop.
    The sign of a maximizing step is in ``lr``."""
    extremes = []
    for w, g, u, s in zip(params, grads, duals, spares):
        if check:
            if w.dtype == u.dtype:
                synced = _fused_signed_power(u, r) == w
            else:  # fp16/bf16: compare the bits, or inductor elides the rounding to w's precision
                synced = _fused_signed_power(u, r).to(w.dtype).view(torch.int16) == w.view(torch.int16)
            u.copy_(torch.where(synced, u, _fused_signed_power(w.to(u.dtype), q)))
        s.copy_(u - g.to(u.dtype) * lr)
        w.copy_(_fused_signed_power(s, r).to(w.dtype))
        extremes.append(w.abs().amax().float() if w.numel() else w.new_zeros((), dtype=torch.float32))
    return torch.isfinite(torch.stack(extremes))


#: Compiled kernels by the layout they were compiled for (shapes, strides, dtypes, devices, r, check):
#: one code object each, so a kernel is compiled once and never recompiled or shared across layouts.
_KERNELS: dict[tuple, Callable] = {}
#: Why the fused implementation is off in this process (set by the first failure to compile), or None.
_FUSED_FAILURE: str | None = None
#: The fused kernels' step size, one 0-dim tensor per device (a tensor, so a new lr does not recompile).
_LR: dict[torch.device, Tensor] = {}


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
                           *, lr: float | Tensor, p: float, maximize: bool, check: bool = False) -> Tensor | None:
    """The compiled update (p != 2), or None if torch.compile fails (warned once; the caller then runs
    another implementation). A kernel fails when it is compiled, before it writes anything."""
    global _FUSED_FAILURE
    if _FUSED_FAILURE is not None:
        return None
    device = duals[0].device
    lr_t = _LR.get(device)
    if lr_t is None:
        lr_t = _LR[device] = torch.zeros((), dtype=torch.float64, device=device)
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
        _FUSED_FAILURE = f"{type(error).__name__}: {first_line(error)}"
        warnings.warn(f"LpMirrorDescent(fused=True): torch.compile failed ({_FUSED_FAILURE}); using the "
                      "foreach/single-tensor implementation in this process instead (same update, slower)",
                      UserWarning, stacklevel=4)
        return None


#: Tensor types the foreach kernels take (torch's ``_foreach_supported_types``).
_FOREACH_TYPES = (Tensor, torch.nn.Parameter, torch.nn.Buffer) if hasattr(torch.nn, "Buffer") else (
    Tensor, torch.nn.Parameter)


def _default_foreach(tensors: list[Tensor]) -> bool:
    """torch's rule: foreach when every tensor is a plain tensor on a foreach-capable device (CUDA)."""
    devices = _get_foreach_kernels_supported_devices()
    return all(type(t) in _FOREACH_TYPES and t.device.type in devices for t in tensors)


def _check_fused_param(param: Tensor) -> None:
    """What torch's fused optimizers refuse, with their message: a parameter that is not floating point
    or not on a device with fused kernels (e.g. meta)."""
    devices = _get_fused_kernels_supported_devices()
    if not (param.device.type in devices and torch.is_floating_point(param)):
        raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of "
                           f"supported devices: {devices} but {param.dtype} and {param.device.type}")


def _normalized(grads: list[Tensor], p: float, eps: float) -> list[Tensor]:
    """g / (||g||_q + eps) per tensor, q = p/(p-1). A non-finite gradient gives a NaN entry (inf / inf),
    so the step's finiteness check refuses it; nothing is read on the host."""
    q = p / (p - 1.0)
    return [g / (lp_norm(g, q) + eps) for g in grads]


def _eager(foreach: bool) -> Callable[..., Tensor | None]:
    return _multi_tensor_lpmirrordescent if foreach else _single_tensor_lpmirrordescent


def lp_mirror_descent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor] | None,
                      spares: list[Tensor] | None, *, lr: float | Tensor, p: float, maximize: bool = False,
                      normalize: bool = False, eps: float = 1e-12, foreach: bool | None = None,
                      fused: bool | None = None) -> Tensor | None:
    r"""Functional l_p mirror descent; see :class:`LpMirrorDescent` for the update.

    For p != 2 it writes :math:`s = u - \eta g` (:math:`\eta` = ``lr``; :math:`u + \eta g` with
    ``maximize``; u: ``duals``, left untouched) into ``spares`` and
    :math:`\operatorname{sign}(s)\,|s|^{1/(p-1)}` into ``params``, and returns a bool tensor on the
    parameters' device: whether each new parameter is finite (a refusal is the caller's to undo). For
    p = 2 it performs ``param.add_(grad, alpha=-lr)`` (SGD; ``duals``/``spares`` unused, the caller checks
    gradients first) and returns None. The duals are the caller's to keep in step with the parameters
    (:class:`LpMirrorDescent` verifies them every step). ``foreach``/``fused`` choose the implementation
    as in torch's optimizers: ``foreach=None`` means foreach on CUDA, ``fused=None`` means not fused.
    """
    if foreach and fused:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    if not params:
        return None
    if normalize:
        grads = _normalized(grads, p, eps)
    if foreach is None:
        foreach = _default_foreach(params)
    if fused and p != 2.0:
        flags = _fused_lpmirrordescent(params, grads, duals, spares, lr=lr, p=p, maximize=maximize)
        if flags is not None:
            return flags
    return _eager(foreach or bool(fused and p == 2.0))(params, grads, duals, spares, lr=float(lr), p=p,
                                                        maximize=maximize)


class _Pending:
    """One param group's step awaiting its finiteness check: what undoing it needs."""

    def __init__(self, params: list[Tensor], labels: list[str], states: list[dict], old_duals: list[Tensor],
                 new_duals: list[Tensor], backups: list[Tensor | None], flags: Tensor, lr: float | Tensor,
                 p: float, implementation: tuple[bool, bool]):
        self.params, self.labels, self.states = params, labels, states
        self.old_duals, self.new_duals, self.backups, self.lr, self.p = old_duals, new_duals, backups, lr, p
        self.implementation = implementation  # (foreach, fused) as the step ran
        if isinstance(flags, Tensor) and flags.is_cuda:  # to pinned host memory without waiting; read after the event
            self.host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            self.host.copy_(flags, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = flags, None

    def finite(self) -> list[bool]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


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


class LpMirrorDescent(Optimizer):
    r""":math:`\ell_p` mirror descent with the entrywise potential :math:`\psi(w) = \|w\|_p^p / p`.

    For every parameter :math:`w` with gradient :math:`g`, starting from the dual variable
    :math:`u_0 = m(w_0)`::

        g   <- g / (||g||_q + eps),   q = p / (p - 1)      (only with normalize=True)
        g   <- -g                                          (only with maximize=True)
        u_t <- u_{t-1} - lr * g
        w_t <- m^-1(u_t) = sign(u_t) |u_t|^(1 / (p - 1))

    with the mirror map :math:`m(w) = \operatorname{sign}(w)\,|w|^{p-1}`, entrywise. p = 2 is gradient
    descent (bit for bit ``torch.optim.SGD``). No momentum or weight decay; torch lr schedulers act on
    ``lr``. A step that would make a parameter non-finite (a non-finite gradient or lr, or an inverse
    map beyond the float range) is undone and raises FloatingPointError naming the parameters. A
    parameter changed outside the optimizer (in place, through ``.data``, by ``load_state_dict``) is
    stepped from its new value.
    The module docstring states the conventions in full.

    Args:
        params: parameters or param groups (each group may set its own ``lr``, ``p``, ``normalize``,
            ``eps``, ``maximize``, ``foreach``, ``fused``); ``model.named_parameters()`` gives error
            messages with names. Complex parameters are refused: optimize ``torch.view_as_real(param)``.
        lr: step size >= 0, a number or a 1-element tensor (default 1e-3, as SGD).
        p: the l_p exponent, p > 1 (p = 2 is SGD). The paper uses 1.1, 1.75, 2 and 3.
        normalize: divide each tensor's gradient by its dual norm :math:`\|g\|_q` (+ ``eps``).
        eps: added to the dual norm when normalizing.
        maximize: maximize the objective (step along +g).
        foreach: use the multi-tensor implementation (torch's ``_foreach`` kernels). None (default):
            when every parameter is on CUDA, as torch's optimizers decide.
        fused: use the implementation compiled with ``torch.compile`` (the first step compiles it); it
            refuses, at the step, parameters that are not floating point or not on a device with fused
            kernels, as torch's fused optimizers do. None (default) means False. Falls back, with a
            warning, to the others if compiling fails. Not together with ``foreach=True``.
        lazy_check: read the step's finiteness flags at the next ``step()`` (or ``check()``,
            ``state_dict()``, pickling) rather than at once, so the host does not wait for the device
            every step; a refused step is then undone and reported there. None (default): lazily when
            the parameters are not on CPU. An attribute, not a param-group entry.

    ``state[param]`` holds ``"dual"`` (saved by ``state_dict``) and, between steps, the spare buffer
    (``"spare"``, or ``"copy"`` with ``"p"``), which ``state_dict`` leaves out.
    """

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3, p: float = 2.0, *, normalize: bool = False,
                 eps: float = 1e-12, maximize: bool = False, foreach: bool | None = None, fused: bool | None = None,
                 lazy_check: bool | None = None):
        defaults = dict(lr=lr, p=p, normalize=normalize, eps=eps, maximize=maximize, foreach=foreach, fused=fused)
        self._validate(defaults)
        if lazy_check is not None and not isinstance(lazy_check, bool):
            raise ValueError(f"lazy_check must be None, True or False, got {lazy_check!r}")
        self.lazy_check = lazy_check
        self._pending: list[_Pending] = []  # the last step's groups, while their check is outstanding
        super().__init__(params, defaults)

    @staticmethod
    def _validate(group: dict[str, Any], params: Iterable[object] = ()) -> None:
        """Refuse a bad hyperparameter or parameter of ``group`` (ValueError, RuntimeError); normalize p."""
        _check_lr(group["lr"])
        group["p"] = check_p(group["p"])
        eps = group["eps"]
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 <= eps < math.inf:
            raise ValueError(f"eps must be a finite number >= 0, got eps={eps!r}")
        for key in ("normalize", "maximize"):
            if not isinstance(group[key], bool):
                raise ValueError(f"{key} must be True or False, got {key}={group[key]!r}")
        for key in ("foreach", "fused"):
            if group[key] is not None and not isinstance(group[key], bool):
                raise ValueError(f"{key} must be None, True or False, got {key}={group[key]!r}")
        if group["foreach"] and group["fused"]:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        for param in params:
            if isinstance(param, Tensor) and param.is_complex():
                raise ValueError(f"LpMirrorDescent does not support complex parameters (got {param.dtype}): the "
                                 "entrywise l_p geometry is over real numbers; optimize torch.view_as_real(param) "
                                 "(a real view of its real and imaginary parts) instead")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, after validating the group as it will be (defaults filled in): a
        refused group (bad lr, p <= 1, complex parameters, ...) leaves the optimizer as it was."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif not isinstance(params, set):  # a set: torch's add_param_group refuses it
            params = list(params)  # a generator is read once, here
        param_group["params"] = params
        group = {**self.defaults, **param_group}
        self._validate(group, (x[1] if isinstance(x, tuple) and len(x) == 2 else x for x in params))
        super().add_param_group(param_group)
        self.param_groups[-1]["p"] = group["p"]

    def __getstate__(self) -> dict[str, Any]:
        """torch's pickled state, plus ``lazy_check``; a lazily checked step is settled first."""
        self.check()
        return {**super().__getstate__(), "lazy_check": self.lazy_check}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("lazy_check", None)
        self._pending = []
        for group in self.param_groups:  # checkpoints and pickles of earlier versions lack these
            group.setdefault("normalize", False)
            group.setdefault("eps", 1e-12)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("fused", None)

    @staticmethod
    def _process_value_according_to_param_policy(param: Tensor, value: Tensor, param_id: int | None,
                                                 param_groups: list[dict[str, Any]] | None,
                                                 key: str | None = None) -> Tensor:
        """torch's rule for a loaded state tensor (floating state takes the parameter's dtype), except the
        dual: a copy in the dual's dtype (float32 for fp16/bf16 parameters). torch's ``load_state_dict``
        calls ``Optimizer``'s rule by name, so ``load_state_dict`` applies this one to the duals itself."""
        if key == "dual":
            return value.to(device=param.device, dtype=_dual_dtype(param.dtype), copy=True)
        return Optimizer._process_value_according_to_param_policy(param, value, param_id, param_groups, key)

    def state_dict(self) -> dict[str, Any]:
        """torch's ``state_dict`` after settling a lazily checked step (never save a step still to be
        refused), without the spare buffers (``_UNSAVED``): per parameter, only its dual."""
        self.check()
        state_dict = super().state_dict()
        state_dict["state"] = {
            key: {k: v for k, v in value.items() if k not in _UNSAVED} if isinstance(value, dict) else value
            for key, value in state_dict["state"].items()}
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, with two differences: the duals keep their dtype (float32 for
        fp16/bf16 parameters) and are copies; this optimizer keeps its ``foreach``/``fused``. A lazily
        checked step still pending is discarded (the loaded state replaces it); loaded duals that do not
        reproduce their parameters are re-derived from them at the next step."""
        implementation = [(group["foreach"], group["fused"]) for group in self.param_groups]
        duals: list[tuple[Tensor, Tensor]] = []

        def set_duals_aside(optimizer: Optimizer, loaded: dict[str, Any]) -> dict[str, Any]:
            # after every other pre-hook: the duals bypass torch's cast to the parameter dtype
            ids = chain.from_iterable(group["params"] for group in loaded["param_groups"])
            by_id = dict(zip(ids, chain.from_iterable(group["params"] for group in optimizer.param_groups)))
            state = {}
            for key, value in loaded["state"].items():
                if key in by_id and isinstance(value, dict):
                    value = {k: v for k, v in value.items() if k not in _UNSAVED + _LEGACY + ("dual",)}
                    dual = loaded["state"][key].get("dual")
                    if isinstance(dual, Tensor):
                        duals.append((by_id[key], dual))
                state[key] = value
            return {**loaded, "state": state}

        def restore(optimizer: Optimizer) -> None:  # before every other post-hook
            for param, dual in duals:
                optimizer.state[param]["dual"] = self._process_value_according_to_param_policy(
                    param, dual, None, optimizer.param_groups, key="dual")
            for group, (foreach, fused) in zip(optimizer.param_groups, implementation):
                group["foreach"], group["fused"] = foreach, fused

        handles = (self.register_load_state_dict_pre_hook(set_duals_aside),
                   self.register_load_state_dict_post_hook(restore, prepend=True))
        try:
            super().load_state_dict(state_dict)
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one mirror-descent step (after settling a lazily checked previous one); returns the
        closure's loss if a closure is given. Parameters without a gradient are left alone."""
        self.check()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # everything that can refuse, before any update
        work = [job for index, group in enumerate(self.param_groups)
                if (job := self._prepare_group(index, group)) is not None]
        lazy = self._lazy()
        try:
            for group, p, params, grads, labels in work:
                if p != 2.0:
                    self._mirror_step(params, grads, group, p, labels, lazy)
        except BaseException:
            self._undo_pending()  # the groups this step already updated
            raise
        if not lazy:
            self._settle(keep_copies=True)
        # p = 2 last: SGD's update has no dual to return to (with lazy_check it is not undone with the
        # mirror-descent groups of a step refused later)
        for group, p, params, grads, labels in work:
            if p == 2.0:
                foreach = self._foreach(group, params)
                _eager(foreach or bool(group["fused"]))(params, grads, None, None, lr=float(group["lr"]), p=2.0,
                                                         maximize=group["maximize"])
        return loss

    def _prepare_group(self, index: int, group: dict[str, Any]) -> tuple | None:
        """Validate param group ``index`` before any update (sparse gradients, fused support, a finite lr;
        p = 2 also checks its gradients, SGD keeping no dual to return to) and return its work
        (group, p, params, grads, labels) for the parameters with a gradient, or None if it has none."""
        p = check_p(group["p"])
        names = group.get("param_names") or [
            f"param_groups[{index}]['params'][{j}]" for j in range(len(group["params"]))]
        live = [(w, name) for w, name in zip(group["params"], names) if w.grad is not None]
        if not live:
            return None
        params, labels = [w for w, _ in live], [name for _, name in live]
        for w, name in live:
            if w.grad.is_sparse:
                raise RuntimeError(f"LpMirrorDescent does not support sparse gradients ({name}); "
                                   "use dense gradients (e.g. nn.Embedding(..., sparse=False))")
            if group["fused"]:
                _check_fused_param(w)
        lr = group["lr"]
        fused_lr = group["fused"] and p != 2.0 and isinstance(lr, Tensor)  # a kernel argument: not read
        if not fused_lr and not math.isfinite(float(lr)):
            raise FloatingPointError(f"lr is not finite ({float(lr)}) in param_groups[{index}]: parameters "
                                     "left unchanged")
        grads = [w.grad for w in params]
        if p == 2.0:  # SGD: the gradient is checked before the step
            if group["normalize"]:
                grads = _normalized(grads, 2.0, group["eps"])
            bad = [name for name, ok in zip(labels, _finite(grads).tolist()) if not ok]
            if bad:
                raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                         f"check the loss or reduce lr (now {float(lr)})")
        return group, p, params, grads, labels

    def _lazy(self) -> bool:
        if self.lazy_check is not None:
            return bool(self.lazy_check)
        return any(w.device.type != "cpu" for group in self.param_groups for w in group["params"])

    @staticmethod
    def _foreach(group: dict[str, Any], params: list[Tensor]) -> bool:
        """Whether the group's eager implementation is foreach: its ``foreach``, else torch's default."""
        return _default_foreach(params) if group["foreach"] is None else bool(group["foreach"])

    def _duals(self, params: list[Tensor], p: float) -> tuple[list[Tensor], list[bool]]:
        """Each parameter's dual (created as m(w), in the dual's dtype, for a parameter that has none or
        whose shape changed; moved to the parameter's device and dtype if it is elsewhere), and whether
        it was created now."""
        duals, fresh = [], []
        for w in params:
            state = self.state[w]
            dtype = _dual_dtype(w.dtype)
            u = state.get("dual")
            new = u is None or u.shape != w.shape
            if new:
                u = mirror_map(w.detach().to(dtype), p)
            elif u.dtype != dtype or u.device != w.device:
                u = u.to(device=w.device, dtype=dtype)
            state["dual"] = u
            duals.append(u)
            fresh.append(new)
        return duals, fresh

    def _spares(self, params: list[Tensor], duals: list[Tensor], p: float) -> tuple[list[Tensor], list[bool]]:
        """Each parameter's spare dual buffer (allocated on first use, like the dual; ``state["spare"]``),
        and whether it holds a copy of the parameter as the last immediately checked step, with this p,
        left it."""
        spares, copies = [], []
        for w, u in zip(params, duals):
            state = self.state[w]
            s = state.pop("copy", None)
            copy = s is not None and "p" in state and state["p"].item() == p
            if s is None:
                s = state.pop("spare", None)
            if s is None or s.shape != u.shape or s.dtype != u.dtype or s.device != u.device or s is u:
                s, copy = torch.empty_like(u), False
            state["spare"] = s
            spares.append(s)
            copies.append(copy)
        return spares, copies

    def _synchronize(self, params: list[Tensor], duals: list[Tensor], spares: list[Tensor], fresh: list[bool],
                     copies: list[bool], backups: list[Tensor | None], p: float, foreach: bool, fused: bool,
                     lazy: bool) -> tuple[list[Tensor], bool]:
        """The duals this step starts from: u where the parameter is what this optimizer last wrote, bit for
        bit, and m(w) where it is not (edited outside the optimizer, loaded, p changed); and whether the
        fused kernel still compiles. What it last wrote: the spare's copy (kept by an immediately checked
        step), or m^-1(u) as the implementation computes it (into the spare; the fused kernel into new
        buffers). Immediately checked: per tensor on the host; an edited tensor gets a backup and a new dual
        beside u (u stays for a refusal to return to). Lazily checked (eager implementations; the fused
        kernel checks itself): on the device, into u."""
        checked = [i for i, new in enumerate(fresh) if not new]
        if not checked:
            return duals, fused
        refs = {i: spares[i] for i in checked if copies[i]}
        probed = [i for i in checked if not copies[i]]
        if probed and fused:
            targets = [torch.empty_like(params[i]) for i in probed]
            if _fused_lpmirrordescent(targets, [torch.zeros_like(t) for t in targets], [duals[i] for i in probed],
                                      [spares[i] for i in probed], lr=1.0, p=p, maximize=False) is None:
                fused = False
            else:
                refs.update(zip(probed, targets))
        if probed and not fused:
            _inverse([duals[i] for i in probed], [spares[i] for i in probed], 1.0 / (p - 1.0), foreach)
            refs.update((i, spares[i]) for i in probed)
        refs = {i: ref if ref.dtype == params[i].dtype else ref.to(params[i].dtype) for i, ref in refs.items()}
        if lazy:
            for i in checked:
                w, u, s = params[i], duals[i], spares[i]
                synced = refs[i] == w
                _signed_power(w.detach().to(u.dtype), p - 1.0, out=s)  # m(w), as mirror_map computes it
                torch.where(synced, u, s, out=u)
            return duals, fused
        if all(params[i].device.type == "cpu" for i in checked):
            equal = [_same_bits(refs[i], params[i]) for i in checked]
        else:  # one host read for all tensors
            equal = torch.stack([torch.eq(refs[i], params[i]).all() for i in checked]).tolist()
        out = list(duals)
        for i, ok in zip(checked, equal):
            if not ok:
                w, u = params[i], duals[i]
                backups[i] = w.detach().clone()
                out[i] = torch.where(refs[i] == w, u, mirror_map(w.detach().to(u.dtype), p))
        return out, fused

    def _mirror_step(self, params: list[Tensor], grads: list[Tensor], group: dict[str, Any], p: float,
                     labels: list[str], lazy: bool) -> None:
        """One pass into the spare duals; the step is accepted (duals and spares swap) pending its check."""
        lr, maximize = group["lr"], group["maximize"]
        states = [dict(self.state[w]) for w in params]  # what a refusal restores (the tensors stay untouched)
        duals, fresh = self._duals(params, p)
        spares, copies = self._spares(params, duals, p)
        backups: list[Tensor | None] = [w.detach().clone() if new else None for w, new in zip(params, fresh)]
        if group["normalize"]:
            grads = _normalized(grads, p, group["eps"])
        foreach, fused = self._foreach(group, params), bool(group["fused"]) and _FUSED_FAILURE is None
        flags = None
        if fused and lazy:  # the kernel verifies the parameters itself, on the device
            flags = _fused_lpmirrordescent(params, grads, duals, spares, lr=lr, p=p, maximize=maximize,
                                           check=not all(fresh))
            fused = flags is not None
        if flags is None:
            start, fused = self._synchronize(params, duals, spares, fresh, copies, backups, p, foreach, fused, lazy)
            if fused:
                flags = _fused_lpmirrordescent(params, grads, start, spares, lr=lr, p=p, maximize=maximize)
                fused = flags is not None
            if flags is None:
                flags = _eager(foreach)(params, grads, start, spares, lr=float(lr), p=p, maximize=maximize)
        self._pending.append(_Pending(params, labels, states, duals, spares, backups, flags, lr, p, (foreach, fused)))
        for w, s in zip(params, spares):
            state = self.state[w]
            state["spare"], state["dual"] = state["dual"], s

    @torch.no_grad()
    def _undo_pending(self) -> None:
        """Undo the pending groups' steps: duals back, parameters rebuilt from them (or from backups)."""
        pending, self._pending = self._pending, []
        for entry in reversed(pending):
            _inverse_into(entry.params, entry.old_duals, entry.new_duals, entry.p, *entry.implementation)
            for w, state, backup in zip(entry.params, entry.states, entry.backups):
                if backup is not None:
                    w.copy_(backup)
                if state:
                    if "copy" in state:  # its buffer received the refused dual: a spare again
                        state["spare"] = state.pop("copy")
                    self.state[w] = state
                else:  # the step had created it
                    del self.state[w]

    @torch.no_grad()
    def _settle(self, keep_copies: bool) -> None:
        """:meth:`check`; ``keep_copies`` (a step checked right after its update): an accepted step's
        parameters are also copied into their spare buffers, the reference of the next step's check."""
        if not self._pending:
            return
        verdicts = [(entry, entry.finite()) for entry in self._pending]
        if all(all(finite) for _, finite in verdicts):
            pending, self._pending = self._pending, []
            if keep_copies:
                for entry in pending:
                    self._keep_copies(entry.params, entry.p, entry.implementation[0])
            return
        gradient, overflow, lr, p = [], [], None, None
        for entry, finite in verdicts:
            bad = [i for i, ok in enumerate(finite) if not ok]
            if bad:
                lr, p = float(entry.lr), entry.p
                duals_ok = _finite([entry.new_duals[i] for i in bad]).tolist()  # u - lr g itself not finite?
                for i, ok in zip(bad, duals_ok):
                    (overflow if ok else gradient).append(entry.labels[i])
        self._undo_pending()
        where = " (found at the next step: lazy_check)" if self._lazy() else ""
        if gradient:
            raise FloatingPointError(f"non-finite gradient in {', '.join(gradient)}{where}: parameters left "
                                     f"unchanged; check the loss or reduce lr (now {lr})")
        r = 1.0 / (p - 1.0)
        raise FloatingPointError(
            f"the inverse mirror map overflowed in {', '.join(overflow)}{where} (|u|^{r:.3g} exceeds the float "
            f"range): parameters left unchanged; reduce lr (now {lr}, p={p})")

    def _keep_copies(self, params: list[Tensor], p: float, foreach: bool) -> None:
        """Copy each parameter into its spare buffer (``state["copy"]``, made with exponent ``state["p"]``)."""
        spares = []
        for w in params:
            state = self.state[w]
            spares.append(state.pop("spare"))
            state["copy"] = spares[-1]
            if "p" in state:
                state["p"].fill_(p)
            else:
                state["p"] = torch.tensor(p, dtype=torch.float64)
        if foreach:
            for index in _by_device_and_dtype(spares, params):
                torch._foreach_copy_([spares[i] for i in index], [params[i] for i in index])
        else:
            for s, w in zip(spares, params):
                s.copy_(w)

    def check(self) -> None:
        """Settle the last step if its finiteness check is outstanding (``lazy_check``): if a new
        parameter is not finite, undo that step and raise FloatingPointError naming the parameters.
        ``step()``, ``state_dict()`` and pickling call it; a training loop calls it after its last step."""
        self._settle(keep_copies=False)


def _inverse(duals: list[Tensor], outs: list[Tensor], r: float, foreach: bool) -> None:
    """outs <- m^-1(u) by the eager implementation's own kernels, in the duals' dtype (``outs`` have it)."""
    if foreach:
        for index in _by_device_and_dtype(duals):
            _foreach_signed_power_into([duals[i] for i in index], r, [outs[i] for i in index])
    else:
        for u, s in zip(duals, outs):
            _signed_power_into(u, r, s)


def _inverse_into(targets: list[Tensor], duals: list[Tensor], work: list[Tensor], p: float, foreach: bool,
                  fused: bool) -> None:
    """targets <- m^-1(u) by the very computation of a step (a zero gradient, the same implementation):
    bit for bit the parameters a step that ended at these duals wrote. ``work`` receives copies of u."""
    zeros = [torch.zeros_like(w) for w in targets]
    if fused and _fused_lpmirrordescent(targets, zeros, duals, work, lr=1.0, p=p, maximize=False) is not None:
        return
    _eager(foreach)(targets, zeros, duals, work, lr=1.0, p=p, maximize=False)


#: The optimizers of the real-data chapters, by name: ``make_optimizer(params, name, lr, p)``.
