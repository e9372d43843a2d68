r"""``LpMirrorDescent``: l_p mirror descent as a ``torch.optim.Optimizer``.

Each step, for every parameter w with gradient g (entrywise, potential psi(w) = ||w||_p^p / p):

    u <- u - lr * g            (u = m(w) = sign(w)|w|^(p-1), the dual variable)
    w <- m^-1(u) = sign(u)|u|^(1/(p-1))

With ``normalize=True`` the gradient is replaced by g / (||g||_q + eps) per tensor, q = p/(p-1).
No momentum, weight decay or schedule of its own (torch lr schedulers work on ``lr``).

Design choices:
- p = 2 (without normalization) performs exactly ``param.add_(grad, alpha=-lr)``: bit-for-bit
  ``torch.optim.SGD(lr=lr)``.
- The dual variable u is optimizer state, so the float round trip w -> m(w) -> m^-1 is not repeated
  every step (it would shrink float32 weights by ~1e-4 relative per 1000 steps at p = 1.75). If a
  parameter is changed outside the optimizer (in-place edit, ``load_state_dict``), its version
  counter changes and u is resynchronized from it (kept when it still maps exactly onto w).
- Low-precision parameters (fp16/bf16) keep u in float32.
- One pass, then verify: each step writes the new dual into a second buffer (u and the spare swap
  roles after a successful step, so the state is u plus one spare, as much memory as Adam's two
  moments) and the new parameter in place, and reports whether every new entry is finite. A
  non-finite gradient or an inverse map that overflows makes some entry infinite or NaN: the step
  then rebuilds the parameters from the untouched dual u (the same computation that produced them,
  so bit for bit; parameters that had no such dual yet are copied back from a backup) and raises
  FloatingPointError naming them. So a failed step leaves parameters and state exactly as before.
- ``compile=True`` fuses each tensor's update, check included, into one vectorized pass. Contiguous
  float32/float64 CPU tensors use a hand-written C++ kernel (:mod:`mdlib.cpu_kernel`): it reads u and
  g and streams the spare and w to memory, 4 array transfers per entry against fused Adam's 7. Other
  tensors (GPU, low-precision parameters, non-contiguous ones) use torch.compile (6 transfers: a write
  to a line not read first costs a read and a write). A tensor always takes the same route, so a
  restore reruns the very kernel that made its parameters. The eager path uses in-place torch
  operations and one reused work buffer.
"""

from __future__ import annotations

import math
import types
from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.optim import Optimizer

from mdlib import cpu_kernel
from mdlib.mirror import _fused_signed_power, _signed_power, check_p, lp_norm, mirror_map

__all__ = ["LpMirrorDescent"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _finite(tensors: list[Tensor]) -> Tensor:
    """Whether each tensor is all finite (one min/max pass each: NaN and infinities propagate)."""
    extremes = torch.stack([m for t in tensors for m in (t.aminmax() if t.numel() else (t.new_zeros(()),) * 2)])
    return torch.isfinite(extremes.reshape(-1, 2).double()).all(dim=1)


def _eager_update(params: list[Tensor], duals: list[Tensor], spares: list[Tensor], grads: list[Tensor],
                  lr: Tensor, r: float, scratch: Tensor | None) -> Tensor:
    """spare <- u - lr g and w <- sign(spare)|spare|^r, by in-place torch operations (``scratch``: a flat
    work buffer of >= the largest numel, or None); returns, per tensor, whether the new w is finite."""
    for w, u, s, g in zip(params, duals, spares, grads):
        work = None if scratch is None else scratch[:u.numel()].view_as(u)
        torch.sub(u, torch.mul(g.to(u.dtype), lr, out=work), out=s)
        if w.dtype == s.dtype:
            _signed_power(s, r, out=w, scratch=work)
        else:
            w.copy_(_signed_power(s, r))
    return _finite(params)


def _fused_update(params: list[Tensor], duals: list[Tensor], spares: list[Tensor], grads: list[Tensor],
                  lr: Tensor, r: float) -> Tensor:
    """The same update as one expression per tensor, for torch.compile; returns the finite flags.

    A tensor is finite iff max|w| is (the max propagates NaN): a float max costs less inside the
    fused loop than isfinite(w).all(), whose boolean masks measured ~15 % of the step."""
    extremes = []
    for w, u, s, g in zip(params, duals, spares, grads):
        s.copy_(u - g.to(u.dtype) * lr)
        w.copy_(_fused_signed_power(s, r).to(w.dtype))
        extremes.append(w.abs().amax().float() if w.numel() else w.new_zeros((), dtype=torch.float32))
    return torch.isfinite(torch.stack(extremes))


def _compiled(fn: Callable) -> Callable:
    """``fn`` under torch.compile, on a private copy of its code object: torch caches compiled
    variants (and counts recompilations) per code object, so each optimizer gets its own kernels,
    specialized to its tensors' shapes and p, instead of exhausting a shared recompilation limit.
    ``realize_reads_threshold=1`` makes inductor store each new value once and run the finiteness
    reduction in the same loop as the stores (without it, the reduction recomputes the update in a
    loop of its own); kernels of at most two tensors each compile in parallel (a model of 80 tensors:
    about 20 s at p = 1.1 or 3, 80 s at p = 1.75, on two cores)."""
    code = fn.__code__.replace()
    return torch.compile(types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__), dynamic=False,
                         options={"realize_reads_threshold": 1, "cpp.max_horizontal_fusion_size": 2})


class LpMirrorDescent(Optimizer):
    """l_p mirror descent, w <- m^-1(m(w) - lr g), entrywise potential ||w||_p^p / p.

    Args:
        params: parameters or param groups (each group may set its own ``lr``, ``p``,
            ``normalize``, ``eps``); ``model.named_parameters()`` gives error messages with names.
        lr: step size > 0.
        p: the l_p exponent, p > 1 (p = 2 is SGD). The paper uses 1.1, 1.75, 2 and 3.
        normalize: divide each tensor's gradient by its dual norm ||g||_q (+ eps).
        eps: added to the dual norm when normalizing.
        compile: fuse the update into one pass per tensor (fastest for large models): a C++ kernel for
            float32/float64 CPU tensors (built once per machine, ~10 s, then cached on disk), torch.compile
            for the others (GPU: compiled at the first step).
    """

    def __init__(self, params: Iterable, lr: float, p: float = 2.0, *, normalize: bool = False,
                 eps: float = 1e-12, compile: bool = False):
        defaults = dict(lr=lr, p=p, normalize=normalize, eps=eps)
        self._validate(defaults)
        self.compile = bool(compile)
        self._fused = _compiled(_fused_update) if compile else None
        self._scratch: Tensor | None = None  # eager path: one flat work buffer, reused every step
        self._spares: dict[Tensor, Tensor] = {}  # per parameter: the buffer the next dual is written to
        super().__init__(params, defaults)
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
    def _after_load(optimizer: "LpMirrorDescent") -> None:
        # Versions recorded by another process mean nothing here: verify each dual at the next step.
        for state in optimizer.state.values():
            if "version" in state:
                state["version"] = -1

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        """Perform one mirror-descent step; returns the closure's loss if a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
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
            if group["normalize"]:
                grads = self._normalized(grads, group["p"], group["eps"], labels)
            if group["p"] == 2.0:
                self._gradient_step(params, grads, group["lr"], labels)
            else:
                self._mirror_step(params, grads, group, labels)
        return loss

    @staticmethod
    def _normalized(grads: list[Tensor], p: float, eps: float, labels: list[str]) -> list[Tensor]:
        q = p / (p - 1.0)
        out = []
        for g, name in zip(grads, labels):
            norm = lp_norm(g, q)
            if not bool(torch.isfinite(norm)):
                raise FloatingPointError(f"non-finite gradient in {name}: check the loss, or reduce lr")
            out.append(g / (norm + eps))
        return out

    @staticmethod
    def _check_gradients(grads: list[Tensor], labels: list[str], lr: float) -> None:
        """Raise FloatingPointError if a gradient has a non-finite entry."""
        bad = [name for name, ok in zip(labels, _finite(grads).tolist()) if not ok]
        if bad:
            raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                     f"check the loss or reduce lr (now {lr})")

    def _gradient_step(self, params: list[Tensor], grads: list[Tensor], lr: float, labels: list[str]) -> None:
        """p = 2: the dual variable is the parameter itself; identical arithmetic to torch SGD."""
        self._check_gradients(grads, labels, lr)
        for w, g in zip(params, grads):
            w.add_(g, alpha=-lr)

    def _spares_for(self, params: list[Tensor], duals: list[Tensor]) -> list[Tensor]:
        """Each parameter's spare dual buffer (allocated on first use, like the dual)."""
        spares = []
        for w, u in zip(params, duals):
            s = self._spares.get(w)
            if s is None or s.shape != u.shape or s.dtype != u.dtype or s.device != u.device:
                s = self._spares[w] = torch.empty_like(u)
            spares.append(s)
        return spares

    def _update(self, params: list[Tensor], duals: list[Tensor], spares: list[Tensor], grads: list[Tensor],
                lr: float, r: float) -> list[bool]:
        """Write m^-1(u - lr g) into ``params`` and u - lr g into ``spares`` (duals untouched); returns,
        per parameter, whether its new value is finite."""
        if not self.compile:
            lr_t = torch.tensor(lr, dtype=torch.float64, device=duals[0].device)
            return _eager_update(params, duals, spares, grads, lr_t, r, self._scratch_for(duals)).tolist()
        finite, rest = [True] * len(params), []
        for i, (w, u, s, g) in enumerate(zip(params, duals, spares, grads)):
            if cpu_kernel.supports(w, u):
                finite[i] = math.isfinite(cpu_kernel.update(w, u, s, g, lr, r))
            else:
                rest.append(i)
        if rest:  # the same route for a tensor every time: it depends on w and u only
            lr_t = torch.tensor(lr, dtype=torch.float64, device=duals[rest[0]].device)
            flags = self._fused(*([x[i] for i in rest] for x in (params, duals, spares, grads)), lr_t, r).tolist()
            for i, ok in zip(rest, flags):
                finite[i] = ok
        return finite

    def _inverse_into(self, targets: list[Tensor], duals: list[Tensor], spares: list[Tensor], lr: float,
                      r: float) -> None:
        """targets <- m^-1(u) by the very computation of a step (a zero gradient, the same kernel): bit
        for bit the parameters a step that ended at these duals wrote."""
        self._update(targets, duals, spares, [torch.zeros_like(w) for w in targets], lr, r)

    def _duals(self, params: list[Tensor], p: float, lr: float, r: float) -> tuple[list[Tensor], list[bool]]:
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
                state["exact"] = False
            elif state.get("version") != w._version:
                u = u.to(device=w.device, dtype=dtype)
                changed.append(i)
            state["dual"], state["p"] = u, p
            duals.append(u)
        if changed:  # edited, or loaded with the optimizer: keep u where it still reproduces w exactly
            probes = [torch.empty_like(w) for w in params]
            self._inverse_into(probes, duals, [torch.empty_like(u) for u in duals], lr, r)
            for i in changed:
                state = self.state[params[i]]
                state["exact"] = torch.equal(probes[i], params[i])
                if not state["exact"]:
                    state["dual"] = duals[i] = mirror_map(params[i].detach().to(duals[i].dtype), p)
        return duals, [self.state[w]["exact"] for w in params]

    def _scratch_for(self, duals: list[Tensor]) -> Tensor | None:
        """A flat buffer as large as the largest dual, when the duals share a dtype and device."""
        if len({(u.dtype, u.device) for u in duals}) != 1:
            return None
        size = max(u.numel() for u in duals)
        s = self._scratch
        if s is None or s.numel() < size or s.dtype != duals[0].dtype or s.device != duals[0].device:
            self._scratch = torch.empty(size, dtype=duals[0].dtype, device=duals[0].device)
        return self._scratch

    def _mirror_step(self, params: list[Tensor], grads: list[Tensor], group: dict, labels: list[str]) -> None:
        """One pass, then verify (see the module docstring): on a non-finite result, restore and raise."""
        p, lr = group["p"], group["lr"]
        r = 1.0 / (p - 1.0)
        duals, exact = self._duals(params, p, lr, r)
        spares = self._spares_for(params, duals)
        backups = [None if ok else w.detach().clone() for w, ok in zip(params, exact)]
        finite = self._update(params, duals, spares, grads, lr, r)
        if not all(finite):
            self._inverse_into(params, duals, spares, lr, r)  # the parameters as the last step left them
            for w, backup in zip(params, backups):
                if backup is not None:
                    w.copy_(backup)
                self.state[w]["version"] = w._version
            self._check_gradients(grads, labels, lr)
            bad = [name for name, ok in zip(labels, finite) if not ok]
            raise FloatingPointError(
                f"the inverse mirror map overflowed in {', '.join(bad)} (|u|^{r:.3g} exceeds the float range): "
                f"parameters left unchanged; reduce lr (now {lr}, p={p})")
        for w, s in zip(params, spares):
            state = self.state[w]
            state["dual"], self._spares[w] = s, state["dual"]
            state["exact"], state["version"] = True, w._version
