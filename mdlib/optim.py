r"""``LpMirrorDescent``: l_p mirror descent in the shape of ``torch.optim.Adam``.

The class gathers each parameter's state (the dual variable) and calls the functional
:func:`lp_mirror_descent`, which runs one of three implementations of the same update:

- single-tensor: a loop over the parameters, in-place torch operations (the default on CPU);
- multi-tensor (``foreach``): torch's documented ``torch._foreach_*`` kernels, one launch per
  operation for all tensors of a device and dtype (the default on CUDA, as for torch's optimizers);
- fused: the whole update of a tensor, finiteness check included, as one expression compiled by
  ``torch.compile`` (opt-in; if compiling fails, a one-time warning and the other implementations).

What holds on every implementation:

- p = 2 (without normalization) performs ``param.add_(grad, alpha=-lr)``: bit for bit
  ``torch.optim.SGD(lr=lr)`` (its single-tensor or foreach path).
- The dual variable u = m(w) is optimizer state, so the float round trip w -> m(w) -> m^-1 is not
  repeated every step (float32 weights would drift ~1e-4 relative per 1000 steps at p = 1.75). If a
  parameter is changed outside the optimizer (in-place edit, ``load_state_dict``), its version counter
  changes and u is resynchronized from it (kept when it still maps exactly onto w). Low-precision
  parameters (fp16/bf16) keep u in float32.
- A refused step changes nothing. The new dual is written into a spare buffer (u and the spare swap
  roles once the step is accepted: u plus one spare, the memory of Adam's two moments) and the new
  parameter in place, with a per-tensor flag of whether it is finite. A non-finite gradient or an
  inverse map that overflows clears a flag; the step is then undone, parameters rebuilt from the
  untouched dual by the same computation that made them (bit for bit; parameters that had no dual
  yet are copied back from a backup), and FloatingPointError names the parameters.
- ``lazy_check`` (the default on GPUs) reads the flags at the next ``step()``, ``state_dict()`` or
  ``check()`` instead of right away, so a step does not wait for the device; a refused step is then
  undone at that point (the spare still holds its starting dual). p = 2 checks the gradient before
  the step (SGD keeps no second copy to roll back to), which reads it on the host.

``make_optimizer(params, name, lr, p)`` builds the optimizer a run config names: ``"md"`` (this
class), ``"adam"`` or ``"sgd"``.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
import types
import warnings
from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.optim import Optimizer

from mdlib import first_line
from mdlib.mirror import _fused_signed_power, _power_kind, check_p, lp_norm, mirror_map

__all__ = ["LpMirrorDescent", "OPTIMIZERS", "lp_mirror_descent", "make_optimizer", "method", "method_key"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Devices whose tensors take the foreach implementation when ``foreach=None`` (torch's rule).
_FOREACH_DEVICES = ("cuda", "xpu")


def _finite(tensors: list[Tensor]) -> Tensor:
    """Whether each tensor is all finite (one min/max pass each: NaN and infinities propagate), as a
    bool tensor on the tensors' device (no host read)."""
    extremes = torch.stack([m for t in tensors for m in (t.aminmax() if t.numel() else (t.new_zeros(()),) * 2)])
    return torch.isfinite(extremes.reshape(-1, 2).double()).all(dim=1)


def _signed_power_into(s: Tensor, r: float, w: Tensor) -> None:
    """w <- sign(s)|s|^r by in-place operations on w, reading s, with no other buffer.

    Integer r (p = 1 + 1/r, e.g. 1.1 -> 10): s^r by left-to-right binary powering on w (p = 1.1: four
    passes), then the sign of s (copysign); r = 1/2 (p = 3): a square root; other r: exp(r log|s|)."""
    if w.dtype != s.dtype:  # a low-precision parameter: compute in the dual's precision, then round
        work = torch.empty_like(s)
        _signed_power_into(s, r, work)
        w.copy_(work)
        return
    kind, k = _power_kind(r, s.dtype)
    if kind == "copy":
        w.copy_(s)
        return
    if kind == "integer":  # bits of k after the leading one: s*s consumes the first of them
        bits = bin(k)[3:]
        torch.mul(s, s, out=w)
        if bits[0] == "1":
            w.mul_(s)
        for bit in bits[1:]:
            w.square_()
            if bit == "1":
                w.mul_(s)
    else:
        torch.abs(s, out=w)
        if kind == "sqrt":
            w.sqrt_()
        else:  # "general", and "cube" (float32 r = n/3: the fused path's Newton root; eagerly exp/log)
            w.log_().mul_(r).exp_()  # log(0) = -inf gives exp(-inf) = 0, as it should
    w.copysign_(s)


def _foreach_signed_power_into(ss: list[Tensor], r: float, ws: list[Tensor]) -> None:
    """:func:`_signed_power_into` over lists of one device and dtype, with foreach kernels."""
    kind, k = _power_kind(r, ss[0].dtype)
    out = ws if ws[0].dtype == ss[0].dtype else [torch.empty_like(s) for s in ss]
    if kind == "integer":
        torch._foreach_copy_(out, ss)
        for bit in bin(k)[3:]:
            torch._foreach_mul_(out, out)
            if bit == "1":
                torch._foreach_mul_(out, ss)
        signs = None if k % 2 else torch._foreach_sign(ss)  # an odd power keeps the sign; an even one is >= 0
    else:
        torch._foreach_copy_(out, ss)
        torch._foreach_abs_(out)
        if kind == "sqrt":
            torch._foreach_sqrt_(out)
        elif kind != "copy":
            torch._foreach_log_(out)
            torch._foreach_mul_(out, r)
            torch._foreach_exp_(out)
        signs = None if kind == "copy" else torch._foreach_sign(ss)
    if signs is not None:
        torch._foreach_mul_(out, signs)
    if out is not ws:
        torch._foreach_copy_(ws, out)


def _single_tensor(params, grads, duals, spares, lr: float, r: float) -> Tensor:
    for w, g, u, s in zip(params, grads, duals, spares):
        torch.add(u, g, alpha=-lr, out=s)
        _signed_power_into(s, r, w)
    return _finite(params)


def _multi_tensor(params, grads, duals, spares, lr: float, r: float) -> Tensor:
    groups: dict[tuple, list[int]] = {}
    for i, (w, u) in enumerate(zip(params, duals)):
        groups.setdefault((u.device, u.dtype, w.dtype), []).append(i)
    for index in groups.values():
        ws, gs, us, ss = ([x[i] for i in index] for x in (params, grads, duals, spares))
        torch._foreach_copy_(ss, us)
        torch._foreach_add_(ss, gs, alpha=-lr)
        _foreach_signed_power_into(ss, r, ws)
    return _finite(params)


def _fused_update(params: list[Tensor], grads: list[Tensor], duals: list[Tensor], spares: list[Tensor],
                  lr: Tensor, r: float) -> Tensor:
    """The update as one expression per tensor, for torch.compile; returns the finite flags.

    A tensor is finite iff max|w| is (the max propagates NaN), a float reduction in the update's loop."""
    extremes = []
    for w, g, u, s in zip(params, grads, duals, spares):
        s.copy_(u - g.to(u.dtype) * lr)
        w.copy_(_fused_signed_power(s, r).to(w.dtype))
        extremes.append(w.abs().amax().float() if w.numel() else w.new_zeros((), dtype=torch.float32))
    return torch.isfinite(torch.stack(extremes))


#: Compiled kernels by the layout they were compiled for (shapes, strides, dtypes, devices, r): one
#: code object each, so a kernel is compiled once and never recompiled or shared across layouts.
_KERNELS: dict[tuple, Callable] = {}
#: Why the fused implementation is off in this process (set by the first failure to compile), or None.
_FUSED_FAILURE: str | None = None
#: The fused kernels' step size, one 0-dim tensor per device (a tensor, so a new lr does not recompile).
_LR: dict[torch.device, Tensor] = {}


def _kernel(params, grads, duals, spares, lr: Tensor, r: float) -> Callable:
    """The compiled :func:`_fused_update` for these tensors. ``realize_reads_threshold=1`` makes
    inductor store each new value once and run the finiteness reduction in the loop of the stores;
    kernels of at most two tensors each compile in parallel on CPU."""
    key = (r, lr.dtype, lr.device, *((t.shape, t.stride(), t.dtype, t.device)
                                    for ts in (params, grads, duals, spares) for t in ts))
    fn = _KERNELS.get(key)
    if fn is None:
        code = _fused_update.__code__.replace()  # torch caches compiled code per code object
        private = types.FunctionType(code, _fused_update.__globals__, _fused_update.__name__)
        fn = _KERNELS[key] = torch.compile(private, dynamic=False, fullgraph=True, options={
            "realize_reads_threshold": 1, "cpp.max_horizontal_fusion_size": 2})
    return fn


def _fused(params, grads, duals, spares, lr: float, r: float) -> Tensor | None:
    """The compiled update, or None if torch.compile fails (warned once; the fallback then reruns the
    update from the untouched duals, so a kernel that failed halfway leaves nothing behind)."""
    global _FUSED_FAILURE
    if _FUSED_FAILURE is not None:
        return None
    device = duals[0].device
    lr_t = _LR.get(device)
    if lr_t is None:
        lr_t = _LR[device] = torch.zeros((), dtype=torch.float64, device=device)
    lr_t.fill_(lr)  # a kernel argument: no host-to-device copy to wait for
    try:
        return _kernel(params, grads, duals, spares, lr_t, r)(params, grads, duals, spares, lr_t, r)
    except Exception as error:  # noqa: BLE001  (any failure to compile or run the kernel: fall back)
        _FUSED_FAILURE = f"{type(error).__name__}: {first_line(error)}"
        warnings.warn(f"LpMirrorDescent(fused=True): torch.compile failed ({_FUSED_FAILURE}); using the "
                      "foreach/single-tensor implementation in this process instead (same update, slower)",
                      UserWarning, stacklevel=4)
        return None


def _default_foreach(tensors: list[Tensor]) -> bool:
    """torch's rule: foreach when every tensor is a plain tensor on a foreach-capable device (CUDA)."""
    return all(type(t) in (Tensor, torch.nn.Parameter) and t.device.type in _FOREACH_DEVICES for t in tensors)


def _normalized(grads: list[Tensor], p: float, eps: float) -> list[Tensor]:
    """g / (||g||_q + eps) per tensor, q = p/(p-1). A non-finite gradient gives a NaN entry (inf / inf),
    so the step's finiteness check refuses it; nothing is read on the host."""
    q = p / (p - 1.0)
    return [g / (lp_norm(g, q) + eps) for g in grads]


def lp_mirror_descent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor] | None,
                      spares: list[Tensor] | None, *, lr: float, p: float, normalize: bool = False,
                      eps: float = 1e-12, foreach: bool | None = None, fused: bool | None = None) -> Tensor | None:
    r"""Functional l_p mirror descent; see :class:`LpMirrorDescent` for the update.

    For p != 2 it writes u - lr g (u: ``duals``, left untouched) into ``spares`` and
    sign(.)|.|^(1/(p-1)) of it into ``params``, and returns a bool tensor on the parameters' device:
    whether each new parameter is finite (a refusal is the caller's to undo). For p = 2 it performs
    ``param.add_(grad, alpha=-lr)`` (SGD; ``duals``/``spares`` unused, the caller checks gradients first)
    and returns None. ``foreach``/``fused`` choose the implementation as in torch's optimizers:
    ``foreach=None`` means foreach on CUDA, ``fused=None`` means not fused.
    """
    if foreach and fused:
        raise RuntimeError("`foreach` and `fused` cannot be `True` together: choose one implementation")
    if not params:
        return None
    if normalize:
        grads = _normalized(grads, p, eps)
    if foreach is None and not fused:
        foreach = _default_foreach(params)
    if p == 2.0:
        if foreach or fused:
            torch._foreach_add_(params, grads, alpha=-lr)
        else:
            for w, g in zip(params, grads):
                w.add_(g, alpha=-lr)
        return None
    r = 1.0 / (p - 1.0)
    if fused:
        flags = _fused(params, grads, duals, spares, lr, r)
        if flags is not None:
            return flags
        foreach = _default_foreach(params)
    if foreach:
        return _multi_tensor(params, grads, duals, spares, lr, r)
    return _single_tensor(params, grads, duals, spares, lr, r)


class _Pending:
    """One param group's step awaiting its finiteness check: what undoing it needs."""

    def __init__(self, params, labels, states, old_duals, new_duals, backups, flags, lr, p):
        self.params, self.labels, self.states = params, labels, states
        self.old_duals, self.new_duals, self.backups, self.lr, self.p = old_duals, new_duals, backups, lr, p
        if flags.is_cuda:  # copy the flags to pinned host memory without waiting; read after the event
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


class LpMirrorDescent(Optimizer):
    r"""l_p mirror descent with the entrywise potential psi(w) = ||w||_p^p / p.

    For every parameter w with gradient g, starting from the dual variable u_0 = m(w_0)::

        g   <- g / (||g||_q + eps),   q = p / (p - 1)      (only with normalize=True)
        u_t <- u_{t-1} - lr * g
        w_t <- m^-1(u_t) = sign(u_t) |u_t|^(1 / (p - 1))

    with the mirror map m(w) = sign(w) |w|^(p - 1), entrywise. p = 2 is gradient descent (bit for bit
    ``torch.optim.SGD``). No momentum or weight decay; torch lr schedulers act on ``lr``. A step that
    would make a parameter non-finite (a non-finite gradient, or an inverse map beyond the float range)
    is undone and raises FloatingPointError naming the parameters.

    Args:
        params: parameters or param groups (each group may set its own ``lr``, ``p``,
            ``normalize``, ``eps``); ``model.named_parameters()`` gives error messages with names.
        lr: step size > 0.
        p: the l_p exponent, p > 1 (p = 2 is SGD). The paper uses 1.1, 1.75, 2 and 3.
        normalize: divide each tensor's gradient by its dual norm ||g||_q (+ eps).
        eps: added to the dual norm when normalizing.
        foreach: use the multi-tensor implementation (torch's ``_foreach`` kernels). None (default):
            when every parameter is on CUDA, as torch's optimizers decide.
        fused: use the implementation compiled with ``torch.compile`` (the first step compiles it).
            None (default) means False. Falls back, with a warning, to the others if compiling fails.
            Not together with ``foreach=True``.
        lazy_check: read the step's finiteness flags at the next ``step()``/``state_dict()``/``check()``
            rather than at once, so the host does not wait for the device every step; a refused step is
            then undone and reported there. None (default): lazily when the parameters are not on CPU.

    Unlike torch's optimizers, ``foreach``, ``fused`` and ``lazy_check`` are not param-group entries: they
    say how this process runs the step, so a state saved with one implementation loads into another.
    """

    def __init__(self, params: Iterable, lr: float, p: float = 2.0, *, normalize: bool = False,
                 eps: float = 1e-12, foreach: bool | None = None, fused: bool | None = None,
                 lazy_check: bool | None = None):
        if foreach and fused:
            raise RuntimeError("`foreach` and `fused` cannot be `True` together: choose one implementation")
        defaults = dict(lr=lr, p=p, normalize=normalize, eps=eps)
        self._validate(defaults)
        self.foreach, self.fused, self.lazy_check = foreach, fused, lazy_check
        self._spares: dict[Tensor, Tensor] = {}  # per parameter: the buffer the next dual is written to
        self._synced: dict[Tensor, int] = {}  # per parameter: its version when it was m^-1(dual) bit for bit
        self._pending: list[_Pending] = []  # the last step's groups, while their check is outstanding
        super().__init__(params, defaults)
        self.register_state_dict_pre_hook(LpMirrorDescent._before_save)
        self.register_load_state_dict_pre_hook(LpMirrorDescent._before_load)
        self.register_load_state_dict_post_hook(LpMirrorDescent._after_load)

    @staticmethod
    def _validate(group: dict) -> None:
        lr = group["lr"]
        if isinstance(lr, Tensor) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"lr must be a finite number > 0, got lr={lr!r}")
        group["p"] = check_p(group["p"])
        if not (isinstance(group["eps"], (int, float)) and group["eps"] >= 0):
            raise ValueError(f"eps must be a number >= 0, got eps={group['eps']!r}")

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._validate(self.param_groups[-1])

    @staticmethod
    def _before_save(optimizer: "LpMirrorDescent") -> None:
        optimizer.check()  # never save a step that is still to be refused

    @staticmethod
    def _before_load(optimizer: "LpMirrorDescent", state_dict: dict) -> None:
        optimizer._pending = []  # the loaded state replaces whatever the last step did

    @staticmethod
    def _after_load(optimizer: "LpMirrorDescent") -> None:
        optimizer._synced.clear()  # loaded duals are verified against their parameters at the next step
        for state in optimizer.state.values():
            for key in ("version", "exact"):  # bookkeeping of checkpoints written by earlier versions
                state.pop(key, None)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        """Perform one mirror-descent step (after settling a lazily checked previous one); returns the
        closure's loss if a closure is given."""
        self.check()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for index, group in enumerate(self.param_groups):  # everything that can refuse, before any update
            self._validate(group)
            names = group.get("param_names") or [
                f"param_groups[{index}]['params'][{j}]" for j in range(len(group["params"]))]
            live = [(w, name) for w, name in zip(group["params"], names) if w.grad is not None]
            if not live:
                continue
            params, labels = [w for w, _ in live], [name for _, name in live]
            for w, name in live:
                if w.grad.is_sparse:
                    raise RuntimeError(f"LpMirrorDescent does not support sparse gradients ({name}); "
                                       "use dense gradients (e.g. nn.Embedding(..., sparse=False))")
            grads = [w.grad for w in params]
            if group["p"] == 2.0:  # SGD: the gradient is checked before the step
                if group["normalize"]:
                    grads = _normalized(grads, 2.0, group["eps"])
                bad = [name for name, ok in zip(labels, _finite(grads).tolist()) if not ok]
                if bad:
                    raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                             f"check the loss or reduce lr (now {group['lr']})")
            work.append((group, params, grads, labels))
        try:
            for group, params, grads, labels in work:
                if group["p"] != 2.0:
                    self._mirror_step(params, grads, group, labels)
        except BaseException:
            self._undo_pending()  # the groups this step already updated
            raise
        if not self._lazy():
            self.check()
        # p = 2 last: SGD's update has no dual to return to (with lazy_check it is not undone with the
        # mirror-descent groups of a step refused later)
        for group, params, grads, labels in work:
            if group["p"] == 2.0:
                lp_mirror_descent(params, grads, None, None, lr=group["lr"], p=2.0, foreach=self.foreach,
                                  fused=self.fused)
        return loss

    def _lazy(self) -> bool:
        if self.lazy_check is not None:
            return bool(self.lazy_check)
        return any(w.device.type != "cpu" for group in self.param_groups for w in group["params"])

    def _spares_for(self, params: list[Tensor], duals: list[Tensor]) -> list[Tensor]:
        """Each parameter's spare dual buffer (allocated on first use, like the dual)."""
        spares = []
        for w, u in zip(params, duals):
            s = self._spares.get(w)
            if s is None or s.shape != u.shape or s.dtype != u.dtype or s.device != u.device or s is u:
                s = self._spares[w] = torch.empty_like(u)
            spares.append(s)
        return spares

    def _inverse_into(self, targets: list[Tensor], duals: list[Tensor], work: list[Tensor], p: float) -> None:
        """targets <- m^-1(u) by the very computation of a step (a zero gradient, the same implementation):
        bit for bit the parameters a step that ended at these duals wrote. ``work`` receives copies of u."""
        lp_mirror_descent(targets, [torch.zeros_like(w) for w in targets], duals, work, lr=1.0, p=p,
                          foreach=self.foreach, fused=self.fused)

    def _duals(self, params: list[Tensor], p: float) -> tuple[list[Tensor], list[bool]]:
        """The dual variable of each parameter, and whether the parameter is this optimizer's inverse map
        of it bit for bit. A dual is created, or resynchronized from its parameter, when the parameter is
        new, when p changed, or when the parameter was modified outside this optimizer and no longer
        maps exactly (checked with :meth:`_inverse_into`, into temporary buffers)."""
        duals, changed = [], []
        for i, w in enumerate(params):
            state = self.state[w]
            dtype = torch.float32 if w.dtype in _LOW_PRECISION else w.dtype
            u = state.get("dual")
            if u is None or state.get("p") != p or u.shape != w.shape:
                u = mirror_map(w.detach().to(dtype), p)
                self._synced.pop(w, None)
            elif self._synced.get(w) != w._version:
                u = u.to(device=w.device, dtype=dtype)
                changed.append(i)
            state["dual"], state["p"] = u, p
            duals.append(u)
        if changed:  # edited, or loaded with the optimizer: keep u where it still reproduces w exactly
            probes = [torch.empty_like(w) for w in params]
            self._inverse_into(probes, duals, [torch.empty_like(u) for u in duals], p)
            for i in changed:
                w = params[i]
                if torch.equal(probes[i], w):
                    self._synced[w] = w._version
                else:
                    self.state[w]["dual"] = duals[i] = mirror_map(w.detach().to(duals[i].dtype), p)
        return duals, [self._synced.get(w) == w._version for w in params]

    def _mirror_step(self, params: list[Tensor], grads: list[Tensor], group: dict, labels: list[str]) -> None:
        """One pass into the spare duals; the step is accepted (duals and spares swap) pending its check."""
        p, lr = group["p"], group["lr"]
        states = [dict(self.state[w]) for w in params]  # what a refusal restores (the tensors stay untouched)
        duals, exact = self._duals(params, p)
        spares = self._spares_for(params, duals)
        backups = [None if ok else w.detach().clone() for w, ok in zip(params, exact)]
        flags = lp_mirror_descent(params, grads, duals, spares, lr=lr, p=p, normalize=group["normalize"],
                                  eps=group["eps"], foreach=self.foreach, fused=self.fused)
        self._pending.append(_Pending(params, labels, states, duals, spares, backups, flags, lr, p))
        for w, s in zip(params, spares):
            state = self.state[w]
            state["dual"], self._spares[w] = s, state["dual"]
            self._synced[w] = w._version

    @torch.no_grad()
    def _undo_pending(self) -> None:
        """Undo the pending groups' steps: duals back, parameters rebuilt from them (or from backups)."""
        pending, self._pending = self._pending, []
        for entry in reversed(pending):
            self._inverse_into(entry.params, entry.old_duals, entry.new_duals, entry.p)
            for w, s, state, backup in zip(entry.params, entry.new_duals, entry.states, entry.backups):
                if backup is not None:
                    w.copy_(backup)
                self._spares[w] = s
                if state:
                    self.state[w] = state
                else:  # the step had created it
                    del self.state[w]
                if backup is None:  # w is m^-1 of its restored dual again, bit for bit
                    self._synced[w] = w._version
                else:
                    self._synced.pop(w, None)

    @torch.no_grad()
    def check(self) -> None:
        """Settle the last step if its finiteness check is outstanding (``lazy_check``): if a new
        parameter is not finite, undo that step and raise FloatingPointError naming the parameters.
        ``step()`` and ``state_dict()`` call it; call it after a run's last step."""
        if not self._pending:
            return
        verdicts = [(entry, entry.finite()) for entry in self._pending]
        if all(all(finite) for _, finite in verdicts):
            self._pending = []
            return
        gradient, overflow, lr, p = [], [], None, None
        for entry, finite in verdicts:
            bad = [i for i, ok in enumerate(finite) if not ok]
            if bad:
                lr, p = entry.lr, entry.p
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


#: The optimizers of the real-data chapters, by name: ``make_optimizer(params, name, lr, p)``.
OPTIMIZERS = ("md", "adam", "sgd")


def make_optimizer(params, name: str, lr: float, p: float | None = None) -> torch.optim.Optimizer:
    """The optimizer of a run config: ``"md"`` (``LpMirrorDescent`` with exponent ``p``), ``"adam"``
    (torch Adam, default betas) or ``"sgd"`` (plain SGD; the same as md with p = 2).

    Implementations: torch's defaults (single-tensor on CPU, foreach on CUDA), except that mirror descent
    on CUDA takes its fused step (torch.compile; foreach, with a warning, where that does not compile).
    On CPU the optimizer is a small part of a chapter's training step (chapter 08): compiling it would
    buy little."""
    params = [dict(x, params=list(x["params"])) if isinstance(x, dict) else x for x in params]
    tensors = [w for x in params for w in (x["params"] if isinstance(x, dict) else [x])]
    on_gpu = bool(tensors) and all(w.device.type == "cuda" for w in tensors)
    if name == "md":
        if p is None:
            raise ValueError("optimizer 'md' needs the exponent p")
        return LpMirrorDescent(params, lr=lr, p=p, fused=True if on_gpu and p != 2.0 else None)
    if p is not None:
        raise ValueError(f"optimizer {name!r} takes no exponent p (got p={p}); p is for 'md'")
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


# --- method keys: how the experiments name an optimizer -------------------------------------------


_EXPONENT = re.compile(r"[0-9]+(\.[0-9]+)?")  #: an exponent in a method key: "1.1", "2", "3"


def method(key: str | float) -> tuple[str, float | None]:
    """A method key as (optimizer, p): ``"adam"`` -> ("adam", None), ``"1.1"`` -> ("md", 1.1). The keys:
    "adam", "sgd", and an exponent p > 1 in decimal digits ("1.1", "2") or as a number (a YAML key 1.1)."""
    if key in ("adam", "sgd"):
        return key, None
    number = isinstance(key, numbers.Real) and not isinstance(key, bool)
    if number or isinstance(key, str) and _EXPONENT.fullmatch(key):
        with contextlib.suppress(ValueError):
            return "md", check_p(key)
    raise ValueError(f"unknown method {key!r}: an l_p exponent p > 1 in decimal digits such as '1.1' or '3', "
                     "or 'adam' / 'sgd'")


def method_key(optimizer: str, p: float | None = None) -> str:
    """The inverse of ``method``: ("md", 2.0) -> "2", ("adam", None) -> "adam"."""
    return f"{p:g}" if optimizer == "md" else optimizer
