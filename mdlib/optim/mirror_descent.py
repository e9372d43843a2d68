"""``LpMirrorDescent`` and its functional update ``lp_mirror_descent`` (the conventions they follow: the
package docstring, ``mdlib.optim``)."""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Callable, Iterable, NamedTuple

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.sgd import sgd as _torch_sgd  # torch's functional SGD: the step at p = 2

from mdlib.mirror import check_p
from mdlib.optim._checks import _check_fused_param, _check_group, _check_group_keys, _check_sparse
from mdlib.optim._compiled import _Fused, _fused_lpmirrordescent, _traced_update
from mdlib.optim._guard import _dual_dtype, _StepGuard
from mdlib.optim._steps import (_finite, _multi_tensor_lpmirrordescent, _normalized, _resolved_foreach, _resync,
                               _sgd_direction, _single_tensor_lpmirrordescent)

__all__ = ["LpMirrorDescent", "LpUpdate", "lp_mirror_descent"]

#: Per-parameter state that only serves the next step and is not saved by ``state_dict()``: the spare
#: dual buffer (``"copy"`` when it holds the parameter as the last immediately checked step left it) and
#: ``"p"``, the exponent that copy was made with (a 0-dim float64 CPU tensor).
_UNSAVED = ("spare", "copy", "p")

# What checkpoints and pickles of earlier versions lack or hold, kept where torch keeps its own (SGD's
# ``__setstate__`` back-fills ``nesterov``, ``maximize``, ...): ``__setstate__``, which torch's
# ``load_state_dict`` also calls, and ``load_state_dict``.

#: Param-group options added after the first versions, with the value under which those stepped.
_GROUP_DEFAULTS = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, normalize=False, eps=1e-12,
                       maximize=False, foreach=None, differentiable=False, fused=None)
#: Attributes (they say how this process runs the step) that pickles of earlier versions lack: the
#: constructor's defaults.
_ATTRIBUTE_DEFAULTS = dict(lazy_check=None, check_edits=True)
#: Per-parameter entries in which earlier versions kept their bookkeeping of edits (through torch's
#: version counters); every step now verifies the parameters itself, so loading drops them.
_DROPPED_STATE = ("version", "exact")


def _eager(foreach: bool) -> Callable[..., Tensor | None]:
    """The eager implementation: multi-tensor with ``foreach``, else single-tensor (looked up here, by
    torch's names, where torch's tests patch them)."""
    return _multi_tensor_lpmirrordescent if foreach else _single_tensor_lpmirrordescent


class LpUpdate(NamedTuple):
    """What one call of :func:`lp_mirror_descent` did: ``finite``, whether each new parameter is finite (a
    bool tensor on the parameters' device; None at p = 2, whose gradient the caller checks first, and for a
    step decided on the device, ``refused``); the momentum buffers after it (new tensors, so a refused
    step returns to the old ones); and the implementation that ran (``foreach``, ``fused``)."""

    finite: Tensor | None
    momentum_buffers: list[Tensor | None]
    foreach: bool
    fused: bool


def lp_mirror_descent(params: list[Tensor], grads: list[Tensor], duals: list[Tensor] | None,
                      spares: list[Tensor] | None, momentum_buffers: list[Tensor | None] | None = None, *,
                      lr: float | Tensor, p: float, momentum: float = 0.0, dampening: float = 0.0,
                      weight_decay: float = 0.0, nesterov: bool = False, normalize: bool = False, eps: float = 1e-12,
                      maximize: bool = False, foreach: bool | None = None, fused: bool | None = None,
                      check_edits: bool = False, refused: Tensor | None = None,
                      fused_state: _Fused | None = None) -> LpUpdate:
    r"""Functional l_p mirror descent: the update of :class:`LpMirrorDescent`, which every route of its
    step calls (single-tensor, foreach, fused, traced by ``torch.compile``, and p = 2).

    The direction d is the gradient after ``normalize`` (g / (||g||_q + eps)), ``maximize`` and SGD's
    ``weight_decay`` and ``momentum`` (``momentum_buffers``, one per parameter, None before the first
    step). For p != 2 it writes :math:`s = u - \eta d` (:math:`\eta` = ``lr``; u: ``duals``) into
    ``spares`` and :math:`\operatorname{sign}(s)\,|s|^{1/(p-1)}` into ``params``, leaving u as it is;
    the caller swaps u and s once the step is accepted. ``check_edits``: first u <- m(w) where w is not
    m^-1(u) bit for bit (a parameter edited since the step that wrote it), on the device, into u. For
    p = 2 it is ``torch.optim.SGD``'s functional step (``duals``/``spares`` unused).

    ``foreach``/``fused`` choose the implementation as in torch's optimizers (``foreach=None``: foreach on
    CUDA; ``fused=None``: not fused); a fused kernel that fails to compile falls back, warned once per
    ``fused_state`` (the lr tensors and failure the caller keeps). ``refused`` (a 0-dim integer tensor):
    the form ``torch.compile`` traces, with no host read, where a step that would make a parameter
    non-finite is skipped on the device (p != 2) and counted in ``refused``.
    """
    if foreach and fused:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    buffers = list(momentum_buffers) if momentum_buffers is not None else [None] * len(params)
    if not params:
        return LpUpdate(None, buffers, bool(foreach), bool(fused))
    if normalize:
        grads = _normalized(grads, p, eps)
    sgd = dict(weight_decay=weight_decay, momentum=momentum, dampening=dampening, nesterov=nesterov)
    traced = refused is not None  # no host read
    sparse = any(g.is_sparse for g in grads)
    if not traced:
        foreach = _resolved_foreach(foreach, params, grads)
    if p == 2.0:  # torch's functional SGD: fused, as torch traces it, or through the eager implementation
        sgd.update(has_sparse_grad=sparse)
        if fused or traced:
            _torch_sgd(params, grads, buffers, foreach=foreach and not fused, fused=fused, lr=lr, maximize=maximize,
                       **sgd)
        else:
            _eager(foreach)(params, grads, None, None, lr=float(lr), p=p, maximize=maximize, momentum_buffers=buffers,
                            sgd=sgd)
        return LpUpdate(None, buffers, bool(foreach), bool(fused))
    if traced:
        buffers = _traced_update(params, grads, duals, spares, buffers, lr=lr, p=p, maximize=maximize,
                                 check_edits=check_edits, refused=refused, **sgd)
        return LpUpdate(None, buffers, False, False)
    if momentum or weight_decay:
        grads, buffers = _sgd_direction(params, grads, buffers, maximize=maximize, foreach=foreach, **sgd)
        maximize = False  # the direction has done it
    if fused:
        finite = _fused_lpmirrordescent(params, grads, duals, spares, lr=lr, p=p, maximize=maximize,
                                        check=check_edits, fused=fused_state)
        if finite is not None:
            return LpUpdate(finite, buffers, foreach, True)
    if check_edits:
        _resync(params, duals, spares, p, foreach)
    finite = _eager(foreach)(params, grads, duals, spares, lr=float(lr), p=p, maximize=maximize)
    return LpUpdate(finite, buffers, foreach, False)


def _inverse_into(targets: list[Tensor], duals: list[Tensor], work: list[Tensor], p: float, foreach: bool,
                  fused: bool, fused_state: _Fused | None = None) -> None:
    """targets <- m^-1(u) by the very computation of a step (:func:`lp_mirror_descent` with a zero gradient
    and the same implementation): bit for bit the parameters a step that ended at these duals wrote.
    ``work`` receives copies of u. The step guard's (``mdlib.optim._guard``) way back."""
    zeros = [torch.zeros_like(w) for w in targets]
    lp_mirror_descent(targets, zeros, duals, work, lr=1.0, p=p, foreach=foreach and not fused, fused=fused,
                      fused_state=fused_state)


class _Job(NamedTuple):
    """One param group's share of a step: the group, its p, the parameters with a gradient as ``state``
    knows them (``keys``) and as the step writes them (``params``: real views of complex ones), their
    gradients (real views likewise) and their names for messages."""

    group: dict[str, Any]
    p: float
    keys: list[Tensor]
    params: list[Tensor]
    grads: list[Tensor]
    labels: list[str]


class LpMirrorDescent(Optimizer):
    r""":math:`\ell_p` mirror descent with the entrywise potential :math:`\psi(w) = \|w\|_p^p / p`.

    For every parameter :math:`w` with gradient :math:`g`, starting from the dual variable
    :math:`u_0 = m(w_0)`::

        g   <- g / (||g||_q + eps),   q = p / (p - 1)      (only with normalize=True)
        g   <- -g                                          (only with maximize=True)
        g   <- g + weight_decay * w_{t-1}
        b_t <- g (t = 1), else momentum * b_{t-1} + (1 - dampening) * g      (only with momentum > 0)
        g   <- g + momentum * b_t (nesterov), else b_t                       (only with momentum > 0)
        u_t <- u_{t-1} - lr * g
        w_t <- m^-1(u_t) = sign(u_t) |u_t|^(1 / (p - 1))

    with the mirror map :math:`m(w) = \operatorname{sign}(w)\,|w|^{p-1}`, entrywise. p = 2 is
    ``torch.optim.SGD`` bit for bit, with every option; torch lr schedulers act on ``lr`` (and
    ``OneCycleLR``/``CyclicLR`` on ``momentum``). A step that would make a parameter non-finite (a non-finite gradient or lr, or an inverse
    map beyond the float range) is undone and raises FloatingPointError naming the parameters. A
    parameter changed outside the optimizer (in place, through ``.data``, by ``load_state_dict``) is
    stepped from its new value.
    The module docstring states the conventions in full.

    Args:
        params: parameters or param groups (each group may set its own value of every option below but
            ``lazy_check`` and ``check_edits``); ``model.named_parameters()`` gives error messages with
            names. Complex parameters step as their ``torch.view_as_real``.
        lr: step size >= 0, a number or a 1-element tensor (default 1e-3, as SGD). An entry moves by
            about ``lr |g| |w|^(2-p) / (p - 1)``: good steps differ by orders of magnitude across p (the
            book's page on step sizes; ``mdlib.mirror`` has the rule of thumb).
        p: the l_p exponent, p > 1 (p = 2 is SGD). The paper uses 1.1, 1.75, 2 and 3.
        momentum, dampening, weight_decay, nesterov: ``torch.optim.SGD``'s, on the gradient (above).
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
        check_edits: verify every step that the parameters are what the optimizer last wrote (default
            True). False: faster; an edit outside the optimizer then needs :meth:`resync`. An attribute.
        differentiable: must be False (torch's flag; refused when True).

    ``state[param]`` holds ``"dual"`` and, with momentum, ``"momentum_buffer"`` (saved by ``state_dict``)
    and, between steps, the spare buffer (``"spare"``, or ``"copy"`` with ``"p"``), which ``state_dict``
    leaves out.
    """

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3, p: float = 2.0, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *, normalize: bool = False,
                 eps: float = 1e-12, maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None, lazy_check: bool | None = None,
                 check_edits: bool = True):
        defaults = dict(lr=lr, p=p, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, normalize=normalize, eps=eps, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        _check_group(defaults)
        for name, value in (("lazy_check", lazy_check), ("check_edits", check_edits)):
            if value is not None and not isinstance(value, bool) or name == "check_edits" and value is None:
                raise ValueError(f"{name} must be {'None, ' if name == 'lazy_check' else ''}True or False, "
                                 f"got {value!r}")
        self.lazy_check, self.check_edits = lazy_check, check_edits
        self._guard = _StepGuard(_inverse_into)  # pending steps, refused traced steps, fused kernels' state
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, after validating the group as it will be (defaults filled in): a
        refused group (bad lr, p <= 1, an unknown option, ...) leaves the optimizer as it was."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        _check_group_keys(param_group, self.defaults)
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif not isinstance(params, set):  # a set: torch's add_param_group refuses it
            params = list(params)  # a generator is read once, here
        param_group["params"] = params
        group = {**self.defaults, **param_group}
        _check_group(group, (x[1] if isinstance(x, tuple) and len(x) == 2 else x for x in params))
        super().add_param_group(param_group)
        self.param_groups[-1]["p"] = group["p"]

    def __getstate__(self) -> dict[str, Any]:
        """torch's pickled state, plus ``lazy_check`` and ``check_edits``; a lazily checked step is settled
        first. The fused kernels' lr tensors and failure are this process's: not pickled."""
        self.check()
        return {**super().__getstate__(), "lazy_check": self.lazy_check, "check_edits": self.check_edits}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for key, value in _ATTRIBUTE_DEFAULTS.items():  # pickles of earlier versions
            self.__dict__.setdefault(key, value)
        for group in self.param_groups:  # pickles and checkpoints of earlier versions
            for key, value in _GROUP_DEFAULTS.items():
                group.setdefault(key, value)
        self._guard = _StepGuard(_inverse_into)

    @staticmethod
    def _cast_loaded_state(param: Tensor, value: Tensor, param_id: int | None, param_groups: list[dict[str, Any]] | None,
                           key: str | None = None) -> Tensor:
        """A loaded state tensor as this optimizer keeps it: the dual as a copy in the dual's dtype (float32
        for fp16/bf16 parameters), anything else by torch's rule (floating state takes the parameter's
        dtype). Not an override: torch's ``load_state_dict`` calls ``Optimizer``'s rule by name, so
        ``load_state_dict`` sets the duals aside from it and applies this to them."""
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
                    value = {k: v for k, v in value.items() if k not in _UNSAVED + _DROPPED_STATE + ("dual",)}
                    dual = loaded["state"][key].get("dual")
                    if isinstance(dual, Tensor):
                        duals.append((by_id[key], dual))
                state[key] = value
            return {**loaded, "state": state}

        def restore(optimizer: Optimizer) -> None:  # before every other post-hook
            for param, dual in duals:
                optimizer.state[param]["dual"] = self._cast_loaded_state(
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
        closure's loss if a closure is given. Parameters without a gradient are left alone. Under
        ``torch.compile`` the step is :meth:`_traced_step`."""
        if torch.compiler.is_compiling():
            return self._traced_step(closure)
        self.check()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []  # everything that can refuse, before any update
        for index, group in enumerate(self.param_groups):
            job = self._prepare_group(index, group)
            if job is not None:
                work.append(job)
        lazy = self._lazy()
        try:
            for job in work:
                if job.p != 2.0:
                    self._mirror_step(job, lazy)
        except BaseException:
            self._guard.undo(self.state)  # the groups this step already updated
            raise
        if not lazy:
            self._guard.settle(self.state, keep_copies=self.check_edits)
        # p = 2 last: SGD's update has no dual to return to (with lazy_check it is not undone with the
        # mirror-descent groups of a step refused later)
        for job in work:
            if job.p == 2.0:
                self._update(job, None, None)
        return loss

    def _init_group(self, group: dict[str, Any], index: int, keys: list[Tensor], params: list[Tensor],
                    grads: list[Tensor], labels: list[str], duals: list[Tensor] | None = None,
                    spares: list[Tensor] | None = None) -> None:
        """Fill the lists with the group's parameters that have a gradient (``keys``, as ``state`` knows
        them), those as the step writes them and their gradients (``params``, ``grads``: real views of
        complex ones but at p = 2) and their names, refusing what the step cannot take (a sparse gradient whose step
        would not be sparse, a parameter the fused kernels cannot take). The traced step passes ``duals``
        and ``spares``: it takes no sparse gradient, and its state is made here (as m(w) where missing),
        because ``torch.compile`` runs this method eagerly by its name, as it runs torch's optimizers'
        (and guards on the state it finds); the eager step makes it in its guard, which can undo it."""
        traced = duals is not None
        names = group.get("param_names") or [
            f"param_groups[{index}]['params'][{j}]" for j in range(len(group["params"]))]
        for w, name in zip(group["params"], names):
            if w.grad is None:
                continue
            if w.grad.is_sparse and traced:
                raise RuntimeError("LpMirrorDescent under torch.compile takes dense gradients only: use "
                                   "nn.Embedding(..., sparse=False) or step outside the compiled function")
            if w.grad.is_sparse:
                _check_sparse(group, group["p"], w, name)
            if group["fused"]:
                _check_fused_param(w)
            keys.append(w)
            labels.append(name)
            real = w.is_complex() and group["p"] != 2.0  # torch's SGD takes complex tensors as they are
            params.append(torch.view_as_real(w) if real else w)
            grads.append(torch.view_as_real(w.grad) if real else w.grad)
        if traced and group["p"] != 2.0:
            duals.extend(self._guard.duals(self.state, keys, params, group["p"], self.check_edits)[0])
            spares.extend(self._guard.spares(self.state, keys, duals, group["p"])[0])

    def _traced_step(self, closure: Callable[[], Any] | None) -> Any:
        """The step as ``torch.compile`` traces it: :func:`lp_mirror_descent` with ``refused``, so no host
        read and no graph break. Per group with p != 2 (with ``check_edits``) u <- u where w = m^-1(u) bit
        for bit, else m(w), as a lazily checked step does; the step is kept only if every new parameter of
        the group is finite, decided on the device; a refused step is counted and :meth:`check` (eager)
        raises FloatingPointError for it. p = 2 is torch's SGD as torch compiles it (without the
        finiteness check: it would read the host)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            keys: list[Tensor] = []
            params: list[Tensor] = []
            grads: list[Tensor] = []
            labels: list[str] = []
            duals: list[Tensor] = []
            spares: list[Tensor] = []
            self._init_group(group, index, keys, params, grads, labels, duals, spares)
            if params:
                self._update(_Job(group, group["p"], keys, params, grads, labels), duals, spares,
                             check_edits=self.check_edits, refused=self._guard.refused)
        return loss

    def _prepare_group(self, index: int, group: dict[str, Any]) -> _Job | None:
        """The group's share of an eager step (None if no parameter has a gradient), after refusing a
        non-finite lr and, at p = 2, a non-finite gradient (SGD keeps no dual to return to): host reads
        the traced step does not make."""
        keys: list[Tensor] = []
        params: list[Tensor] = []
        grads: list[Tensor] = []
        labels: list[str] = []
        self._init_group(group, index, keys, params, grads, labels)
        if not keys:
            return None
        p, lr = check_p(group["p"]), group["lr"]
        fused_lr = group["fused"] and p != 2.0 and isinstance(lr, Tensor)  # a kernel argument: not read
        if not fused_lr and not math.isfinite(float(lr)):
            raise FloatingPointError(f"lr is not finite ({float(lr)}) in param_groups[{index}]: parameters "
                                     "left unchanged")
        if p == 2.0:  # normalizing keeps the gradient finite or not
            bad = [name for name, ok in zip(labels, _finite(grads).tolist()) if not ok]
            if bad:
                raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                         f"check the loss or reduce lr (now {float(lr)})")
        return _Job(group, p, keys, params, grads, labels)

    @staticmethod
    def _options(group: dict[str, Any]) -> dict[str, Any]:
        """The group's options as :func:`lp_mirror_descent` takes them."""
        return {name: group[name] for name in ("lr", "p", "momentum", "dampening", "weight_decay", "nesterov",
                                               "normalize", "eps", "maximize", "foreach", "fused")}

    def _update(self, job: _Job, duals: list[Tensor] | None, spares: list[Tensor] | None, **how: Any) -> LpUpdate:
        """:func:`lp_mirror_descent` on the job's parameters, from ``duals`` into ``spares`` (p != 2), with the
        group's options and ``how`` (``check_edits``, ``refused``); the momentum buffers it returns are kept
        in the state (``state[param]["momentum_buffer"]``, as SGD keeps them). Every step route calls it."""
        group = job.group
        momentum = group["momentum"]
        buffers = [self.state[key].get("momentum_buffer") for key in job.keys] if momentum else None
        update = lp_mirror_descent(job.params, job.grads, duals, spares, buffers, **self._options(group),
                                   fused_state=self._guard.fused, **how)
        if momentum:
            for key, buffer in zip(job.keys, update.momentum_buffers):
                self.state[key]["momentum_buffer"] = buffer
        return update

    def _mirror_step(self, job: _Job, lazy: bool) -> None:
        """One group's step (p != 2): the edit check, the update into the spare duals, and its acceptance
        (duals and spares swap) pending its finiteness check (``mdlib.optim._guard``)."""
        group = job.group
        opened = self._guard.open(self.state, job.keys, job.params, job.p, check_edits=self.check_edits, lazy=lazy,
                                  foreach=_resolved_foreach(group["foreach"], job.params, job.grads),
                                  fused=bool(group["fused"]))
        update = self._update(job, opened.start, opened.spares, check_edits=opened.check_on_device)
        self._guard.hold(self.state, job.keys, job.params, job.labels, opened, update.finite,
                         (update.foreach, update.fused), group["lr"], job.p, check_edits=self.check_edits, lazy=lazy)

    def _lazy(self) -> bool:
        if self.lazy_check is not None:
            return bool(self.lazy_check)
        return any(w.device.type != "cpu" for group in self.param_groups for w in group["params"])

    def resync(self) -> None:
        """Re-derive every dual from its parameter at the next step (u = m(w)): what to call after editing
        parameters outside the optimizer when ``check_edits=False``."""
        self.check()
        for state in self.state.values():
            for key in ("dual", "copy", "p"):
                state.pop(key, None)

    def check(self) -> None:
        """Settle the last step if its finiteness check is outstanding (``lazy_check``): if a new
        parameter is not finite, undo that step and raise FloatingPointError naming the parameters.
        ``step()``, ``state_dict()`` and pickling call it; a training loop calls it after its last step.
        Also raises if steps traced by ``torch.compile`` were refused (left undone) since the last call."""
        self._guard.check(self.state)
