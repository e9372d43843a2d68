r"""``LpMirrorDescent``: l_p mirror descent as a ``torch.optim`` optimizer, with torch's conventions.

The class gathers each parameter's state (the dual variable) and calls one of three implementations
of the same update, named as torch names its own (in ``mdlib._lp_steps`` and ``mdlib._lp_compiled``):

- single-tensor (``_single_tensor_lpmirrordescent``): a loop over the parameters, in-place torch
  operations (the default on CPU);
- multi-tensor (``_multi_tensor_lpmirrordescent``, ``foreach=True``): torch's ``torch._foreach_*``
  kernels, one launch per operation for all tensors of a device and dtype (the default on CUDA). On a
  CPU, where torch's foreach kernels are a loop over the tensors, it runs the single-tensor loop for
  those tensors: the same update with fewer passes (``python -m mdlib bench optimizer``);
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
  older checkpoints, ``mdlib._lp_compat``). ``load_state_dict`` keeps this optimizer's
  ``foreach``/``fused``: they say how this process runs the step, so a state saved with one
  implementation loads into another. ``lazy_check`` is an attribute for the same reason.
- SGD's options (``momentum``, ``dampening``, ``weight_decay``, ``nesterov``), validated as SGD validates
  them, act on the gradient as in ``torch.optim.SGD`` and their result on the dual: mirror descent on the
  loss plus weight_decay/2 ||w||_2^2, with heavy-ball or Nesterov momentum in the dual space. The momentum
  buffer is ``state[param]["momentum_buffer"]`` (saved, restored by a refused step).
- p = 2 (without normalization) is ``torch.optim.SGD`` bit for bit with every option, in each
  implementation (single-tensor, foreach; fused is torch's fused SGD); it keeps no state but SGD's
  momentum buffer.
- Complex parameters step as their ``torch.view_as_real`` (torch's convention; the dual is real). A
  sparse gradient (``nn.Embedding(sparse=True)``) updates only the entries it holds: a zero gradient
  leaves the dual, so the other rows keep their value exactly and the inverse map runs on the touched
  rows only (p = 2: as SGD; p != 2: without momentum, weight decay, normalize or fused, which would
  make the step dense, and refused there).
- A param-group key is refused when it would be silently ignored: a misspelt option (``momentun``),
  another torch optimizer's option (``betas``) or an attribute of this one (``lazy_check``); other keys
  (metadata such as ``name``) are kept with a warning; torch's own (``initial_lr``, ``max_lr``, ...)
  silently. ``differentiable=True`` is refused (a step is checked on the host and undone in place).
- The dual variable u = m(w) is optimizer state (``state[param]["dual"]``), so the float round trip
  w -> m(w) -> m^-1 is not repeated every step (float32 weights would drift ~1e-4 relative per 1000
  steps at p = 1.75). Low-precision parameters (fp16/bf16) keep u in float32, also through
  ``state_dict``/``load_state_dict`` (torch would cast it to the parameter's dtype).
- Parameters changed outside the optimizer are respected, also through ``.data`` (``p.data.clamp_``,
  ``torch.nn.utils.vector_to_parameters``), which torch's version counter does not see: every step
  first verifies, bit for bit, that each parameter is still what the optimizer last wrote (the copy an
  immediately checked step keeps in its spare buffer, else m^-1(u) by the same implementation) and
  re-derives u = m(w) for the entries that are not. Without edits, nothing changes bit for bit. It
  reads the parameter and a copy and writes the copy: four passes over memory beside the step's four.
  ``python -m mdlib bench optimizer`` (2026-12-03, a 2-core x86_64 CPU, torch 2.14.1, 10M float32
  parameters, p = 1.1, 1.75, 3): the default step 0.74-1.02x AdamW(foreach)'s time, 0.47-0.74x
  unchecked; fused 2.3x AdamW(fused)'s, 1.04-1.12x unchecked. ``check_edits=False``
  (an attribute) skips it: the same steps bit for bit, faster, but an edit made outside the optimizer
  is then overwritten from the dual at the next step unless :meth:`LpMirrorDescent.resync` is called
  after it. Keep the default unless the training loop never touches the parameters.
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
- Under ``torch.compile`` (of ``opt.step`` or of a whole training step) the step is traced without a
  host read, so without a graph break (``fullgraph=True`` works): the edit check is done on the device
  (as ``lazy_check`` does), and a step that would make a parameter non-finite is skipped on the device,
  parameters and state left as they were, and reported by the next eager ``check()``. p = 2 is torch's
  compiled SGD. A float lr is a constant of the compiled code (torch's rule): give a tensor lr to
  schedule it without recompiling.
- State of one optimizer is its own: the fused kernels' lr tensors and compile failure live on the
  instance; the compiled kernels are shared, keyed by layout (pure functions of their arguments).

This module is the optimizer (param groups, state, the step and its check and undo) and its functional
form ``lp_mirror_descent``; beside it, one job each: the eager steps (``mdlib._lp_steps``), what runs
through ``torch.compile`` (``mdlib._lp_compiled``), what the optimizer refuses (``mdlib._lp_checks``)
and what it keeps for checkpoints of earlier versions (``mdlib._lp_compat``).
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Callable, Iterable, NamedTuple

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.sgd import sgd as _torch_sgd  # torch's functional SGD: the step at p = 2

from mdlib._lp_checks import _check_fused_param, _check_group, _check_group_keys, _check_sparse
from mdlib._lp_compat import _DROPPED_STATE, _upgrade
from mdlib._lp_compiled import _Fused, _fused_lpmirrordescent, _traced_update
from mdlib._lp_steps import (_by_device_and_dtype, _default_foreach, _finite, _inverse,
                             _multi_tensor_lpmirrordescent, _normalized, _same_bits, _sgd_direction,
                             _single_tensor_lpmirrordescent)
from mdlib.mirror import _signed_power, check_p, mirror_map

__all__ = ["LpMirrorDescent", "lp_mirror_descent"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Per-parameter state that only serves the next step and is not saved by ``state_dict()``: the spare
#: dual buffer (``"copy"`` when it holds the parameter as the last immediately checked step left it) and
#: ``"p"``, the exponent that copy was made with (a 0-dim float64 CPU tensor).
_UNSAVED = ("spare", "copy", "p")


def _dual_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a parameter's dual: float32 for fp16/bf16 parameters, the real dtype of a complex
    parameter (its dual is that of its ``view_as_real``), else the parameter's."""
    if dtype.is_complex:
        return torch.empty((), dtype=dtype).real.dtype
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _eager(foreach: bool) -> Callable[..., Tensor | None]:
    """The eager implementation: multi-tensor with ``foreach``, else single-tensor (looked up here, by
    torch's names, where torch's tests patch them)."""
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
    """One param group's step awaiting its finiteness check: what undoing it needs (``keys``: the
    parameters as ``state`` knows them; ``params``: the real tensors the step wrote, their
    ``view_as_real`` for complex ones)."""

    def __init__(self, keys: list[Tensor], params: list[Tensor], labels: list[str], states: list[dict],
                 old_duals: list[Tensor], new_duals: list[Tensor], backups: list[Tensor | None], flags: Tensor,
                 lr: float | Tensor, p: float, implementation: tuple[bool, bool]):
        self.keys, self.params, self.labels, self.states = keys, params, labels, states
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


def _exponent(state: dict[str, Any], default: float | None) -> float | None:
    """The exponent recorded in a parameter's state (``state["p"]``, a 0-dim tensor), or ``default``."""
    return state["p"].item() if "p" in state else default


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
        self._pending: list[_Pending] = []  # the last step's groups, while their check is outstanding
        self._fused = _Fused()  # the fused kernels' lr tensors and failure: this optimizer's own
        self._refused = torch.zeros((), dtype=torch.int64)  # steps traced by torch.compile and refused
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
        _upgrade(self.__dict__, self.param_groups)  # pickles and checkpoints of earlier versions
        self._pending, self._fused = [], _Fused()
        self._refused = torch.zeros((), dtype=torch.int64)

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
                    value = {k: v for k, v in value.items() if k not in _UNSAVED + _DROPPED_STATE + ("dual",)}
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
            self._undo_pending()  # the groups this step already updated
            raise
        if not lazy:
            self._settle(keep_copies=self.check_edits)
        # p = 2 last: SGD's update has no dual to return to (with lazy_check it is not undone with the
        # mirror-descent groups of a step refused later)
        for job in work:
            if job.p == 2.0:
                self._sgd_step(job)
        return loss

    def _init_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], duals: list[Tensor],
                    spares: list[Tensor], buffers: list[Tensor | None]) -> None:
        """Fill the lists with the group's parameters that have a gradient (real views of complex ones),
        their gradients, duals (made as m(w) where missing), spare buffers and momentum buffers: the
        state a traced step reads. ``torch.compile`` runs this method eagerly by its name, as it runs
        torch's optimizers' (and guards on the state it finds)."""
        p = group["p"]
        keys = [w for w in group["params"] if w.grad is not None]
        for w in keys:
            if w.grad.is_sparse:
                raise RuntimeError("LpMirrorDescent under torch.compile takes dense gradients only: use "
                                   "nn.Embedding(..., sparse=False) or step outside the compiled function")
            if group["fused"]:
                _check_fused_param(w)
        real = [torch.view_as_real(w) if w.is_complex() else w for w in keys]
        params.extend(real)
        grads.extend(torch.view_as_real(w.grad) if w.is_complex() else w.grad for w in keys)
        buffers.extend(self.state[w].get("momentum_buffer") for w in keys)
        if p == 2.0:
            return
        duals.extend(self._duals(keys, real, p)[0])
        spares.extend(self._spares(keys, duals, p)[0])

    def _traced_step(self, closure: Callable[[], Any] | None) -> Any:
        """The step as ``torch.compile`` traces it: no host read, so no graph break. Per group with p != 2
        (with ``check_edits``) u <- u where w = m^-1(u) bit for bit, else m(w), as a lazily checked step
        does; s = u - lr d (d: the gradient after normalize and SGD's options, :func:`_sgd_direction`);
        the step is kept only if every new parameter of the group is finite (u <- s, w <- m^-1(s); else u
        and w stay, and the momentum buffers), decided on the device; a refused step is counted and
        :meth:`check` (eager) raises FloatingPointError for it. p = 2 is torch's SGD as torch compiles it
        (without the finiteness check: it would read the host)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            duals: list[Tensor] = []
            spares: list[Tensor] = []
            buffers: list[Tensor | None] = []
            self._init_group(group, params, grads, duals, spares, buffers)
            if not params:
                continue
            p, momentum = group["p"], group["momentum"]
            if p == 2.0:
                _torch_sgd(params, grads, buffers, foreach=group["foreach"], fused=group["fused"],
                           weight_decay=group["weight_decay"], momentum=momentum, lr=group["lr"],
                           dampening=group["dampening"], nesterov=group["nesterov"], maximize=group["maximize"])
            else:
                buffers = _traced_update(group, params, grads, duals, spares, buffers,
                                         check_edits=self.check_edits, refused=self._refused)
            if momentum:
                keys = [w for w in group["params"] if w.grad is not None]
                for key, buffer in zip(keys, buffers):
                    self.state[key]["momentum_buffer"] = buffer
        return loss

    def _prepare_group(self, index: int, group: dict[str, Any]) -> _Job | None:
        p = check_p(group["p"])
        names = group.get("param_names") or [
            f"param_groups[{index}]['params'][{j}]" for j in range(len(group["params"]))]
        keys, labels = [], []
        for w, name in zip(group["params"], names):
            if w.grad is not None:
                keys.append(w)
                labels.append(name)
        if not keys:
            return None
        for w, name in zip(keys, labels):
            if w.grad.is_sparse:
                _check_sparse(group, p, w, name)
            if group["fused"]:
                _check_fused_param(w)
        lr = group["lr"]
        fused_lr = group["fused"] and p != 2.0 and isinstance(lr, Tensor)  # a kernel argument: not read
        if not fused_lr and not math.isfinite(float(lr)):
            raise FloatingPointError(f"lr is not finite ({float(lr)}) in param_groups[{index}]: parameters "
                                     "left unchanged")
        grads = [w.grad for w in keys]
        if p == 2.0:  # SGD: the gradient is checked before the step
            if group["normalize"]:
                grads = _normalized(grads, 2.0, group["eps"])
            bad = [name for name, ok in zip(labels, _finite(grads).tolist()) if not ok]
            if bad:
                raise FloatingPointError(f"non-finite gradient in {', '.join(bad)}: parameters left unchanged; "
                                         f"check the loss or reduce lr (now {float(lr)})")
            return _Job(group, p, keys, keys, grads, labels)
        params = [torch.view_as_real(w) if w.is_complex() else w for w in keys]
        grads = [torch.view_as_real(g) if g.is_complex() else g for g in grads]
        return _Job(group, p, keys, params, grads, labels)

    def _sgd_step(self, job: _Job) -> None:
        """p = 2: ``torch.optim.SGD``'s step, by the p = 2 case of the single-tensor or foreach
        implementation (with momentum or weight decay: torch's own SGD, its momentum buffers in
        ``state[param]["momentum_buffer"]`` as SGD keeps them); fused: torch's fused SGD."""
        group, params = job.group, job.params
        momentum, sparse = group["momentum"], any(g.is_sparse for g in job.grads)
        buffers = [self.state[w].get("momentum_buffer") for w in params] if momentum else [None] * len(params)
        sgd = None
        if momentum or group["weight_decay"]:
            sgd = dict(has_sparse_grad=sparse, weight_decay=group["weight_decay"], momentum=momentum,
                       dampening=group["dampening"], nesterov=group["nesterov"])
        if group["fused"]:
            _torch_sgd(params, job.grads, buffers, fused=True, lr=group["lr"], maximize=group["maximize"],
                       **(sgd or dict(has_sparse_grad=sparse, weight_decay=0.0, momentum=0.0, dampening=0.0,
                                      nesterov=False)))
        else:
            foreach = self._foreach(group, params) and not sparse
            _eager(foreach)(params, job.grads, buffers, None, lr=float(group["lr"]), p=2.0,
                            maximize=group["maximize"], sgd=sgd)
        if momentum:
            for w, buffer in zip(params, buffers):
                self.state[w]["momentum_buffer"] = buffer

    def _lazy(self) -> bool:
        if self.lazy_check is not None:
            return bool(self.lazy_check)
        return any(w.device.type != "cpu" for group in self.param_groups for w in group["params"])

    @staticmethod
    def _foreach(group: dict[str, Any], params: list[Tensor]) -> bool:
        """Whether the group's eager implementation is foreach: its ``foreach``, else torch's default."""
        return _default_foreach(params) if group["foreach"] is None else bool(group["foreach"])

    def _duals(self, keys: list[Tensor], params: list[Tensor], p: float) -> tuple[list[Tensor], list[bool]]:
        """Each parameter's dual (created as m(w), in the dual's dtype, for a parameter that has none, whose
        shape changed or, when edits are not checked, whose dual was made with another p; moved to the
        parameter's device and dtype if it is elsewhere), and whether it was created now."""
        duals, fresh = [], []
        for key, w in zip(keys, params):
            state = self.state[key]
            dtype = _dual_dtype(w.dtype)
            u = state.get("dual")
            new = u is None or u.shape != w.shape or not self.check_edits and _exponent(state, p) != p
            if new:
                u = mirror_map(w.detach().to(dtype), p)
            elif u.dtype != dtype or u.device != w.device:
                u = u.to(device=w.device, dtype=dtype)
            state["dual"] = u
            duals.append(u)
            fresh.append(new)
        return duals, fresh

    def _spares(self, keys: list[Tensor], duals: list[Tensor], p: float) -> tuple[list[Tensor], list[bool]]:
        """Each parameter's spare dual buffer (allocated on first use, like the dual; ``state["spare"]``),
        and whether it holds a copy of the parameter as the last immediately checked step, with this p,
        left it."""
        spares, copies = [], []
        for key, u in zip(keys, duals):
            state = self.state[key]
            s = state.pop("copy", None)
            copy = s is not None and _exponent(state, None) == p
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
                                      [spares[i] for i in probed], lr=1.0, p=p, maximize=False,
                                      fused=self._fused) is None:
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

    def _direction(self, job: _Job, grads: list[Tensor], foreach: bool) -> tuple[list[Tensor], bool]:
        """The gradients after SGD's weight decay and momentum (:func:`_sgd_direction`; the new momentum
        buffers go into the state, which a refused step restores), and whether the update still has to
        maximize (the direction has done it)."""
        group = job.group
        if not group["weight_decay"] and not group["momentum"]:
            return grads, group["maximize"]
        buffers = [self.state[key].get("momentum_buffer") for key in job.keys]
        direction, buffers = _sgd_direction(job.params, grads, buffers, weight_decay=group["weight_decay"],
                                            momentum=group["momentum"], dampening=group["dampening"],
                                            nesterov=group["nesterov"], maximize=group["maximize"], foreach=foreach)
        if group["momentum"]:
            for key, buffer in zip(job.keys, buffers):
                self.state[key]["momentum_buffer"] = buffer
        return direction, False

    def _mirror_step(self, job: _Job, lazy: bool) -> None:
        """One pass into the spare duals; the step is accepted (duals and spares swap) pending its check."""
        group, p, keys, params = job.group, job.p, job.keys, job.params
        lr = group["lr"]
        states = [dict(self.state[key]) for key in keys]  # what a refusal restores (the tensors stay untouched)
        duals, fresh = self._duals(keys, params, p)
        spares, copies = self._spares(keys, duals, p)
        backups: list[Tensor | None] = [w.detach().clone() if new else None for w, new in zip(params, fresh)]
        grads = job.grads
        if group["normalize"]:
            grads = _normalized(grads, p, group["eps"])
        foreach = self._foreach(group, params) and not any(g.is_sparse for g in grads)
        grads, maximize = self._direction(job, grads, foreach)
        fused = bool(group["fused"]) and self._fused.failure is None
        flags = None
        if fused and lazy:  # the kernel verifies the parameters itself, on the device
            flags = _fused_lpmirrordescent(params, grads, duals, spares, lr=lr, p=p, maximize=maximize,
                                           check=self.check_edits and not all(fresh), fused=self._fused)
            fused = flags is not None
        if flags is None:
            start = duals
            if self.check_edits:
                start, fused = self._synchronize(params, duals, spares, fresh, copies, backups, p, foreach, fused,
                                                 lazy)
            if fused:
                flags = _fused_lpmirrordescent(params, grads, start, spares, lr=lr, p=p, maximize=maximize,
                                               fused=self._fused)
                fused = flags is not None
            if flags is None:
                flags = _eager(foreach)(params, grads, start, spares, lr=float(lr), p=p, maximize=maximize)
        self._pending.append(_Pending(keys, params, job.labels, states, duals, spares, backups, flags, lr, p,
                                      (foreach, fused)))
        for key, s in zip(keys, spares):
            state = self.state[key]
            state["spare"], state["dual"] = state["dual"], s
            if not self.check_edits and _exponent(state, None) != p:  # the dual's exponent, edits not checked
                state["p"] = torch.tensor(p, dtype=torch.float64)  # a new tensor: a refusal restores the old

    @torch.no_grad()
    def _undo_pending(self) -> None:
        """Undo the pending groups' steps: duals back, parameters rebuilt from them (or from backups)."""
        pending, self._pending = self._pending, []
        for entry in reversed(pending):
            _inverse_into(entry.params, entry.old_duals, entry.new_duals, entry.p, *entry.implementation,
                          fused_state=self._fused)
            for key, w, state, backup in zip(entry.keys, entry.params, entry.states, entry.backups):
                if backup is not None:
                    w.copy_(backup)
                if state:
                    if "copy" in state:  # its buffer received the refused dual: a spare again
                        state["spare"] = state.pop("copy")
                    self.state[key] = state
                else:  # the step had created it
                    del self.state[key]

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
                    self._keep_copies(entry.keys, entry.params, entry.p, entry.implementation[0])
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

    def _keep_copies(self, keys: list[Tensor], params: list[Tensor], p: float, foreach: bool) -> None:
        """Copy each parameter into its spare buffer (``state["copy"]``, made with exponent ``state["p"]``)."""
        spares = []
        for key in keys:
            state = self.state[key]
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
        self._settle(keep_copies=False)
        refused = int(self._refused.item()) if self._refused.any() else 0
        if refused:
            self._refused.zero_()
            raise FloatingPointError(f"{refused} step(s) under torch.compile would have made a parameter "
                                     "non-finite and were skipped (parameters and state left as they were); "
                                     "check the loss or reduce lr")


def _inverse_into(targets: list[Tensor], duals: list[Tensor], work: list[Tensor], p: float, foreach: bool,
                  fused: bool, fused_state: _Fused | None = None) -> None:
    """targets <- m^-1(u) by the very computation of a step (a zero gradient, the same implementation):
    bit for bit the parameters a step that ended at these duals wrote. ``work`` receives copies of u."""
    zeros = [torch.zeros_like(w) for w in targets]
    if fused and _fused_lpmirrordescent(targets, zeros, duals, work, lr=1.0, p=p, maximize=False,
                                        fused=fused_state) is not None:
        return
    _eager(foreach)(targets, zeros, duals, work, lr=1.0, p=p, maximize=False)
