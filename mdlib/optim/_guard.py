"""What makes a step of ``LpMirrorDescent`` (``mdlib.optim``) safe to take and to take back: the edit check
before it, the finiteness check after it, and its undo. One ``_StepGuard`` per optimizer holds what lives
between two steps beside ``optimizer.state``:

- ``pending``: the param groups of the last step whose finiteness check is outstanding (``_Pending``:
  what undoing them needs); settled at once on CPU, at the next ``step()`` or ``check()`` with ``lazy_check``;
- ``refused``: the count of steps traced by ``torch.compile`` and refused on the device;
- ``fused``: the fused kernels' state of this optimizer (``mdlib.optim._compiled._Fused``).

Per parameter, ``state`` holds the dual ``u`` and a spare buffer: ``"spare"``, or ``"copy"`` (the
parameter as the last immediately checked step wrote it) with ``"p"``, the exponent of that copy.

The edit check: a step starts from u where the parameter is what the optimizer last wrote, bit for bit,
and from m(w) where it is not (:meth:`_StepGuard.open`). Checked immediately, it compares on the host and
gives an edited tensor a backup and a new dual beside u (u stays for a refusal to return to); checked
lazily, ``lp_mirror_descent(check_edits=True)`` compares on the device, into u.

A refused step is taken back here, on the host, in every eager route: the step writes the new dual into
the spare and the new parameters in place, and only a refusal pays (the parameters rebuilt from the
untouched dual). The step traced by ``torch.compile`` cannot read the host, so it decides on the device
instead (``mdlib.optim._compiled._traced_update``): it computes the new parameters twice, once to find
whether they are finite and once to write them, about twice the time of an eager fused step.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch
from torch import Tensor

from mdlib.mirror import _signed_power, mirror_map
from mdlib.optim._compiled import _Fused
from mdlib.optim._steps import _bits, _by_device_and_dtype, _edit_checked, _finite, _inverse, _same_bits

_LOW_PRECISION = (torch.float16, torch.bfloat16)

#: ``inverse(targets, duals, work, p, foreach, fused, fused_state)``: targets <- m^-1(u) by the very
#: computation of a step (``mdlib.optim``'s step with a zero gradient), ``work`` receiving copies of u.
Inverse = Callable[[list[Tensor], list[Tensor], list[Tensor], float, bool, bool, "_Fused | None"], None]


def _dual_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a parameter's dual: float32 for fp16/bf16 parameters, the real dtype of a complex
    parameter (its dual is that of its ``view_as_real``), else the parameter's."""
    if dtype.is_complex:
        return torch.empty((), dtype=dtype).real.dtype
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _exponent(state: dict, default: float | None) -> float | None:
    """The exponent recorded in a parameter's state (``state["p"]``, a 0-dim tensor), or ``default``."""
    return state["p"].item() if "p" in state else default


class _Pending:
    """One param group's step awaiting its finiteness check: what undoing it needs (``keys``: the
    parameters as ``state`` knows them; ``params``: the real tensors the step wrote, their
    ``view_as_real`` for complex ones)."""

    def __init__(self, keys: list[Tensor], params: list[Tensor], labels: list[str], states: list[dict],
                 old_duals: list[Tensor], new_duals: list[Tensor], backups: list[Tensor | None], flags: Tensor,
                 lr: float | Tensor, p: float, implementation: tuple[bool, bool], lazy: bool):
        self.keys, self.params, self.labels, self.states, self.lazy = keys, params, labels, states, lazy
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


class Opened(NamedTuple):
    """A group's step as :meth:`_StepGuard.open` prepared it: the state a refusal restores (``states``),
    the duals u, the duals the update starts from (``start``: u, or m(w) where edited), the spare buffers
    it writes the new duals into, the backups of parameters it cannot rebuild from u, and whether the
    update must check edits itself, on the device (``check_on_device``)."""

    states: list[dict]
    duals: list[Tensor]
    start: list[Tensor]
    spares: list[Tensor]
    backups: list[Tensor | None]
    check_on_device: bool


class _StepGuard:
    """The pending steps, the refused traced steps and the fused kernels' state of one optimizer; the edit
    check (:meth:`open`), the acceptance (:meth:`hold`), the finiteness check (:meth:`settle`) and the undo
    (:meth:`undo`) of its steps. ``inverse`` rebuilds parameters from duals as a step computes them."""

    def __init__(self, inverse: Inverse) -> None:
        self.inverse = inverse
        self.pending: list[_Pending] = []
        self.refused = torch.zeros((), dtype=torch.int64)
        self.fused = _Fused()

    # --- before the update ---------------------------------------------------------------------------

    def duals(self, state: dict, keys: list[Tensor], params: list[Tensor], p: float,
              check_edits: bool) -> tuple[list[Tensor], list[bool]]:
        """Each parameter's dual (created as m(w), in the dual's dtype, for a parameter that has none, whose
        shape changed or, when edits are not checked, whose dual was made with another p; moved to the
        parameter's device and dtype if it is elsewhere), and whether it was created now."""
        duals, fresh = [], []
        for key, w in zip(keys, params):
            entry = state[key]
            dtype = _dual_dtype(w.dtype)
            u = entry.get("dual")
            new = u is None or u.shape != w.shape or not check_edits and _exponent(entry, p) != p
            if new:
                u = mirror_map(w.detach().to(dtype), p)
            elif u.dtype != dtype or u.device != w.device:
                u = u.to(device=w.device, dtype=dtype)
            entry["dual"] = u
            duals.append(u)
            fresh.append(new)
        return duals, fresh

    @staticmethod
    def spares(state: dict, keys: list[Tensor], duals: list[Tensor], p: float) -> tuple[list[Tensor], list[bool]]:
        """Each parameter's spare dual buffer (allocated on first use, like the dual; ``state["spare"]``),
        and whether it holds a copy of the parameter as the last immediately checked step, with this p,
        left it."""
        spares, copies = [], []
        for key, u in zip(keys, duals):
            entry = state[key]
            s = entry.pop("copy", None)
            copy = s is not None and _exponent(entry, None) == p
            if s is None:
                s = entry.pop("spare", None)
            if s is None or s.shape != u.shape or s.dtype != u.dtype or s.device != u.device or s is u:
                s, copy = torch.empty_like(u), False
            entry["spare"] = s
            spares.append(s)
            copies.append(copy)
        return spares, copies

    def open(self, state: dict, keys: list[Tensor], params: list[Tensor], p: float, *, check_edits: bool,
             lazy: bool, foreach: bool, fused: bool) -> Opened:
        """Prepare a group's step: snapshot its state, find its duals and spares, and check edits (on the
        host when checked immediately; lazily, the update does it on the device)."""
        states = [dict(state[key]) for key in keys]  # what a refusal restores (the tensors stay untouched)
        duals, fresh = self.duals(state, keys, params, p, check_edits)
        spares, copies = self.spares(state, keys, duals, p)
        backups: list[Tensor | None] = [w.detach().clone() if new else None for w, new in zip(params, fresh)]
        if not check_edits or all(fresh):
            return Opened(states, duals, duals, spares, backups, False)
        if lazy:
            return Opened(states, duals, duals, spares, backups, True)
        start = self._synchronize(params, duals, spares, fresh, copies, backups, p, foreach, fused)
        return Opened(states, duals, start, spares, backups, False)

    def _synchronize(self, params: list[Tensor], duals: list[Tensor], spares: list[Tensor], fresh: list[bool],
                     copies: list[bool], backups: list[Tensor | None], p: float, foreach: bool,
                     fused: bool) -> list[Tensor]:
        """The edit check on the host: the duals a step starts from, u where the parameter is what this
        optimizer last wrote, bit for bit, and m(w) beside u where it is not (with a backup of w). What it
        last wrote: the spare's copy (kept by an immediately checked step), or m^-1(u) as the step's
        implementation computes it (into the spare; the fused kernel into new buffers)."""
        checked = [i for i, new in enumerate(fresh) if not new]
        refs = {i: spares[i] for i in checked if copies[i]}
        probed = [i for i in checked if not copies[i]]
        if probed and fused and self.fused.failure is None:
            targets = [torch.empty_like(params[i]) for i in probed]
            self.inverse(targets, [duals[i] for i in probed], [spares[i] for i in probed], p, foreach, True, self.fused)
            refs.update(zip(probed, targets))
        elif probed:
            _inverse([duals[i] for i in probed], [spares[i] for i in probed], 1.0 / (p - 1.0), foreach)
            refs.update((i, spares[i]) for i in probed)
        refs = {i: ref.to(params[i].dtype) for i, ref in refs.items()}
        out = list(duals)
        for i in checked:
            if not _same_bits(refs[i], params[i]):  # the host asks first: m(w) only if edited
                backups[i] = params[i].detach().clone()
                out[i] = _edit_checked(params[i], duals[i], refs[i], p - 1.0, _signed_power)
        return out

    # --- after the update ----------------------------------------------------------------------------

    def hold(self, state: dict, keys: list[Tensor], params: list[Tensor], labels: list[str], opened: Opened,
             finite: Tensor, implementation: tuple[bool, bool], lr: float | Tensor, p: float, *,
             check_edits: bool, lazy: bool) -> None:
        """Accept a group's step pending its finiteness check (``lazy``: at the next step): its new duals (the
        spares) become the duals."""
        self.pending.append(_Pending(keys, params, labels, opened.states, opened.duals, opened.spares,
                                     opened.backups, finite, lr, p, implementation, lazy))
        for key, s in zip(keys, opened.spares):
            entry = state[key]
            entry["spare"], entry["dual"] = entry["dual"], s
            if not check_edits and _exponent(entry, None) != p:  # the dual's exponent, edits not checked
                entry["p"] = torch.tensor(p, dtype=torch.float64)  # a new tensor: a refusal restores the old

    @torch.no_grad()
    def undo(self, state: dict) -> None:
        """Undo the pending groups' steps: duals back, parameters rebuilt from them (or from backups)."""
        pending, self.pending = self.pending, []
        for entry in reversed(pending):
            self.inverse(entry.params, entry.old_duals, entry.new_duals, entry.p, *entry.implementation, self.fused)
            for key, w, saved, backup in zip(entry.keys, entry.params, entry.states, entry.backups):
                if backup is not None:
                    w.copy_(backup)
                if saved:
                    if "copy" in saved:  # its buffer received the refused dual: a spare again
                        saved["spare"] = saved.pop("copy")
                    state[key] = saved
                else:  # the step had created it
                    del state[key]

    @torch.no_grad()
    def settle(self, state: dict, keep_copies: bool) -> None:
        """Read the pending steps' finiteness flags: accept them (``keep_copies``, a step checked right after
        its update: the parameters are also copied into their spare buffers, the reference of the next
        step's edit check), or undo them all and raise FloatingPointError naming the parameters."""
        if not self.pending:
            return
        verdicts = [(entry, entry.finite()) for entry in self.pending]
        if all(all(finite) for _, finite in verdicts):
            pending, self.pending = self.pending, []
            if keep_copies:
                for entry in pending:
                    self._keep_copies(state, entry.keys, entry.params, entry.p, entry.implementation[0])
            return
        gradient, overflow, lr, p, lazy = [], [], None, None, False
        for entry, finite in verdicts:
            bad = [i for i, ok in enumerate(finite) if not ok]
            if bad:
                lr, p, lazy = float(entry.lr), entry.p, entry.lazy
                duals_ok = _finite([entry.new_duals[i] for i in bad]).tolist()  # u - lr g itself not finite?
                for i, ok in zip(bad, duals_ok):
                    (overflow if ok else gradient).append(entry.labels[i])
        self.undo(state)
        where = " (found at the next step: lazy_check)" if lazy else ""
        if gradient:
            raise FloatingPointError(f"non-finite gradient in {', '.join(gradient)}{where}: parameters left "
                                     f"unchanged; check the loss or reduce lr (now {lr})")
        r = 1.0 / (p - 1.0)
        raise FloatingPointError(
            f"the inverse mirror map overflowed in {', '.join(overflow)}{where} (|u|^{r:.3g} exceeds the float "
            f"range): parameters left unchanged; reduce lr (now {lr}, p={p})")

    @staticmethod
    def _keep_copies(state: dict, keys: list[Tensor], params: list[Tensor], p: float, foreach: bool) -> None:
        """Copy each parameter into its spare buffer (``state["copy"]``, made with exponent ``state["p"]``).
        A CPU tensor of the spare's dtype is copied by numpy, through integer views: on a 2-core CPU, 10M
        float32 entries in 7 tensors took 3.4 ms against torch's 7.5 ms (``copy_``) and 4.5 ms
        (``_foreach_copy_``) on one thread, and 14 ms against 80 ms on two threads of a loaded CPU."""
        spares = []
        for key in keys:
            entry = state[key]
            spares.append(entry.pop("spare"))
            entry["copy"] = spares[-1]
            if "p" in entry:
                entry["p"].fill_(p)
            else:
                entry["p"] = torch.tensor(p, dtype=torch.float64)
        for index in _by_device_and_dtype(spares, params):
            ss, ws = [spares[i] for i in index], [params[i] for i in index]
            if ss[0].device.type == "cpu" and ss[0].dtype == ws[0].dtype:  # numpy's copy: see below
                for s, w in zip(ss, ws):
                    np.copyto(_bits(s).numpy(), _bits(w).numpy())
            elif foreach:
                torch._foreach_copy_(ss, ws)
            else:
                for s, w in zip(ss, ws):
                    s.copy_(w)

    def check(self, state: dict) -> None:
        """:meth:`settle` a pending step; then raise FloatingPointError if steps traced by ``torch.compile``
        were refused since the last call."""
        self.settle(state, keep_copies=False)
        refused = int(self.refused.item()) if self.refused.any() else 0
        if refused:
            self.refused.zero_()
            raise FloatingPointError(f"{refused} step(s) under torch.compile would have made a parameter "
                                     "non-finite and were skipped (parameters and state left as they were); "
                                     "check the loss or reduce lr")
