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
- Check, then write: a non-finite gradient or an inverse map that would overflow raises
  FloatingPointError naming the parameter before anything is written, so parameters and state are
  exactly as before the step. Overflow is ruled out from max |g| (one pass over the gradients, which
  also finds non-finite entries) and an upper bound on max |u| carried in the state; the exact
  maximum of the new dual is computed only when that bound gets near the limit.
- The update then runs in place: ``compile=True`` fuses each tensor's update into one vectorized
  pass with torch.compile; the eager path uses in-place torch operations and one reused work buffer.
"""

from __future__ import annotations

import math
import types
from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.optim import Optimizer

from mdlib.mirror import _signed_power, check_p, lp_norm, mirror_map

__all__ = ["LpMirrorDescent"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _power_into(w: Tensor, u: Tensor, r: float, scratch: Tensor | None) -> None:
    """w <- sign(u)|u|^r, in place when w has u's dtype (``scratch``: a flat buffer of >= u.numel())."""
    if w.dtype == u.dtype:
        _signed_power(u, r, out=w, scratch=None if scratch is None else scratch[:u.numel()].view_as(u))
    else:
        w.copy_(_signed_power(u, r))


def _mirror_update(params: list[Tensor], duals: list[Tensor], grads: list[Tensor], lr: Tensor, r: float,
                   scratch: Tensor | None = None) -> None:
    """u <- u - lr g  and  w <- sign(u)|u|^r in place, r = 1/(p-1) (``scratch``: eager work buffer)."""
    for w, u, g in zip(params, duals, grads):
        if scratch is None:
            u.sub_(g.to(u.dtype) * lr)
        else:
            step = torch.mul(g.to(u.dtype), lr, out=scratch[:u.numel()].view_as(u))
            u.sub_(step)
        _power_into(w, u, r, scratch)


def _compiled(fn: Callable) -> Callable:
    """``fn`` under torch.compile, on a private copy of its code object: torch caches compiled
    variants (and counts recompilations) per code object, so each optimizer gets its own kernels,
    specialized to its tensors' shapes and p, instead of exhausting a shared recompilation limit."""
    code = fn.__code__.replace()
    return torch.compile(types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__), dynamic=False)


class LpMirrorDescent(Optimizer):
    """l_p mirror descent, w <- m^-1(m(w) - lr g), entrywise potential ||w||_p^p / p.

    Args:
        params: parameters or param groups (each group may set its own ``lr``, ``p``,
            ``normalize``, ``eps``); ``model.named_parameters()`` gives error messages with names.
        lr: step size > 0.
        p: the l_p exponent, p > 1 (p = 2 is SGD). The paper uses 1.1, 1.75, 2 and 3.
        normalize: divide each tensor's gradient by its dual norm ||g||_q (+ eps).
        eps: added to the dual norm when normalizing.
        compile: fuse the update with torch.compile (first step compiles; fastest for large models).
    """

    def __init__(self, params: Iterable, lr: float, p: float = 2.0, *, normalize: bool = False,
                 eps: float = 1e-12, compile: bool = False):
        defaults = dict(lr=lr, p=p, normalize=normalize, eps=eps)
        self._validate(defaults)
        self.compile = bool(compile)
        self._update = _compiled(_mirror_update) if compile else _mirror_update
        self._scratch: Tensor | None = None  # eager path: one flat work buffer, reused every step
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
    def _check_gradients(grads: list[Tensor], labels: list[str], lr: float) -> list[float]:
        """Raise if a gradient has a non-finite entry; else return max |g| per tensor."""
        extremes = torch.stack([m for g in grads for m in g.aminmax()]).reshape(-1, 2).double()
        finite = torch.isfinite(extremes).all(dim=1)
        if not bool(finite.all()):
            bad = [name for name, ok in zip(labels, finite.tolist()) if not ok]
            raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                     f"check the loss or reduce lr (now {lr})")
        return extremes.abs().amax(dim=1).tolist()

    def _gradient_step(self, params: list[Tensor], grads: list[Tensor], lr: float, labels: list[str]) -> None:
        """p = 2: the dual variable is the parameter itself; identical arithmetic to torch SGD."""
        self._check_gradients(grads, labels, lr)
        for w, g in zip(params, grads):
            w.add_(g, alpha=-lr)

    def _duals(self, params: list[Tensor], p: float) -> list[Tensor]:
        """The dual variable of each parameter, created or resynchronized from the parameter when
        it is new, when p changed, or when the parameter was modified outside this optimizer. With
        it, state["bound"] >= max |u|, kept up to date step by step (see :meth:`_mirror_step`)."""
        duals = []
        for w in params:
            state = self.state[w]
            dtype = torch.float32 if w.dtype in _LOW_PRECISION else w.dtype
            u = state.get("dual")
            stale = u is None or state.get("p") != p or u.shape != w.shape
            if not stale and state.get("version") != w._version:
                # Changed outside (or just loaded): keep u only if it still maps exactly onto w.
                u = u.to(device=w.device, dtype=dtype)
                stale = not torch.equal(_signed_power(u, 1.0 / (p - 1.0)).to(w.dtype), w)
            if stale or "bound" not in state:
                u = mirror_map(w.detach().to(dtype), p) if stale else u
                state["bound"] = float(u.abs().amax()) if u.numel() else 0.0
            state["dual"], state["p"] = u, p
            duals.append(u)
        return duals

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
        """Check first, then update in place: nothing is written unless every gradient is finite and
        every new dual provably stays where sign(u)|u|^r is finite. max |u - lr g| <= bound + lr max|g|
        with bound >= max |u| carried in the state; only when that bound reaches the limit is the
        exact maximum computed (an extra pass, rare)."""
        p, lr = group["p"], group["lr"]
        r = 1.0 / (p - 1.0)
        duals = self._duals(params, p)
        grad_max = self._check_gradients(grads, labels, lr)
        if r > 1:  # |u|^r overflows exactly when |u| > max^(1/r); p >= 2 cannot overflow
            for i, (u, g) in enumerate(zip(duals, grads)):
                state = self.state[params[i]]
                limit = torch.finfo(u.dtype).max ** (1.0 / r) * (1 - 1e-6)
                bound = (state["bound"] + lr * grad_max[i]) * (1 + 1e-6)
                if bound > limit:  # the bound is not enough: look at the new dual itself
                    bound = float((u - g.to(u.dtype) * lr).abs().amax())
                    if not bound <= limit:
                        raise FloatingPointError(
                            f"the inverse mirror map would overflow in {labels[i]} (|u|^{r:.3g} exceeds the float "
                            f"range): parameters left unchanged; reduce lr (now {lr}, p={p})")
                state["bound"] = bound
        else:
            for i, w in enumerate(params):
                self.state[w]["bound"] += lr * grad_max[i]
        scratch = None if self.compile else self._scratch_for(duals)
        self._update(params, duals, grads, torch.tensor(lr, dtype=duals[0].dtype), r, scratch)
        for w in params:
            self.state[w]["version"] = w._version
