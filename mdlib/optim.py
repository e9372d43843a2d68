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
- A non-finite gradient or an overflowing inverse map raises FloatingPointError naming the
  parameter, with the parameters left exactly as before the step.
- ``compile=True`` fuses each tensor's update into one vectorized loop with torch.compile (no
  intermediate tensors); the eager path uses the same formulas with torch ops.
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


def _mirror_update(params: list[Tensor], duals: list[Tensor], spares: list[Tensor], grads: list[Tensor],
                   lr: Tensor, r: float, scratch: Tensor | None = None) -> None:
    """spare <- u - lr g  and  w <- sign(spare)|spare|^r, r = 1/(p-1). The old dual u is kept, so
    the old parameters can be restored bit for bit (w_old = sign(u)|u|^r) if the step fails."""
    for w, u, v, g in zip(params, duals, spares, grads):
        torch.mul(g.to(u.dtype), lr, out=v)
        torch.sub(u, v, out=v)
        _power_into(w, v, r, scratch)


def _primal_update(params: list[Tensor], duals: list[Tensor], r: float, scratch: Tensor | None = None) -> None:
    """w <- sign(u)|u|^r in place."""
    for w, u in zip(params, duals):
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
        self._kernels = ({"update": _compiled(_mirror_update), "primal": _compiled(_primal_update)} if compile
                         else {"update": _mirror_update, "primal": _primal_update})
        self._spare: dict[Tensor, Tensor] = {}  # scratch for the next dual (not optimizer state)
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
    def _check_gradients(grads: list[Tensor], labels: list[str], lr: float) -> None:
        bad = [name for g, name in zip(grads, labels) if not bool(torch.isfinite(g.abs().amax()))]
        if bad:
            raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                     f"check the loss or reduce lr (now {lr})")

    def _gradient_step(self, params: list[Tensor], grads: list[Tensor], lr: float, labels: list[str]) -> None:
        """p = 2: the dual variable is the parameter itself; identical arithmetic to torch SGD."""
        self._check_gradients(grads, labels, lr)
        for w, g in zip(params, grads):
            w.add_(g, alpha=-lr)

    def _duals(self, params: list[Tensor], p: float) -> tuple[list[Tensor], dict[int, Tensor]]:
        """The dual variable of each parameter, created or resynchronized from the parameter when
        it is new, when p changed, or when the parameter was modified outside this optimizer.
        Also returns copies of the parameters whose dual was just (re)created: for those,
        sign(u)|u|^r may differ from w in the last bit, so a failed step restores them from the copy."""
        duals, originals = [], {}
        for w in params:
            state = self.state[w]
            dtype = torch.float32 if w.dtype in _LOW_PRECISION else w.dtype
            u = state.get("dual")
            stale = u is None or state.get("p") != p or u.shape != w.shape
            if not stale and state.get("version") != w._version:
                # Changed outside (or just loaded): keep u only if it still maps exactly onto w.
                u = u.to(device=w.device, dtype=dtype)
                stale = not torch.equal(_signed_power(u, 1.0 / (p - 1.0)).to(w.dtype), w)
            if stale:
                u = mirror_map(w.detach().to(dtype), p)
                originals[len(duals)] = w.detach().clone()
            state["dual"], state["p"] = u, p
            duals.append(u)
        return duals, originals

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
        p, lr = group["p"], group["lr"]
        r = 1.0 / (p - 1.0)
        duals, originals = self._duals(params, p)
        spares = [self._spare.setdefault(w, torch.empty_like(u)) for w, u in zip(params, duals)]
        scratch = None if self.compile else self._scratch_for(duals)
        self._kernels["update"](params, duals, spares, grads, torch.tensor(lr, dtype=duals[0].dtype), r, scratch)
        extremes = torch.stack([m for w in params for m in w.aminmax()])
        finite = torch.isfinite(extremes).reshape(-1, 2).all(dim=1)
        if not bool(finite.all()):
            bad = [name for name, ok in zip(labels, finite.tolist()) if not ok]
            self._kernels["primal"](params, duals, r, scratch)  # the old parameters, bit for bit
            for w in params:
                self.state[w]["version"] = w._version
            for i, original in originals.items():
                params[i].copy_(original)
                self.state[params[i]]["version"] = -1  # w != sign(u)|u|^r here: verify at the next step
            if any(not bool(torch.isfinite(g).all()) for g in grads):
                cause = "non-finite gradient"
            else:
                cause = f"the inverse mirror map overflowed (|u|^{r:.3g} exceeds the float range)"
            raise FloatingPointError(f"{cause} in {', '.join(bad)}: parameters left unchanged; "
                                     f"reduce lr (now {lr}, p={p})")
        for w, u, v in zip(params, duals, spares):
            state = self.state[w]
            state["dual"], self._spare[w] = v, u
            state["version"] = w._version
