"""Checkpoints and pickles of earlier versions of ``LpMirrorDescent`` (``mdlib.optim``): every special case
the optimizer keeps for them, each with why it exists. torch's optimizers keep theirs in ``__setstate__``
(``torch.optim.SGD`` back-fills ``nesterov``, ``maximize``, ``foreach``, ...); these are this one's.

- ``_GROUP_DEFAULTS``: param-group options added after the first versions (``normalize``, ``eps``; SGD's
  ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``; torch's ``maximize``, ``foreach``,
  ``differentiable``, ``fused``). A loaded or unpickled group that lacks one gets its default, the value
  under which the earlier version stepped, so it steps as it did (``_upgrade``, from ``__setstate__``,
  which torch's ``load_state_dict`` also calls).
- ``_ATTRIBUTE_DEFAULTS``: ``lazy_check`` and ``check_edits``, attributes (not param-group entries, since
  they say how this process runs the step) that a pickle of an earlier version lacks; the constructor's
  defaults (``_upgrade``).
- ``_DROPPED_STATE``: per-parameter entries ``"version"`` and ``"exact"``, in which earlier versions kept
  their bookkeeping of edits made outside the optimizer (through torch's version counters). Every step
  now verifies the parameters itself, so ``load_state_dict`` drops them.
"""

from __future__ import annotations

from typing import Any

#: The param-group options that checkpoints of earlier versions may lack, with their defaults.
_GROUP_DEFAULTS = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, normalize=False, eps=1e-12,
                       maximize=False, foreach=None, differentiable=False, fused=None)
#: The attributes that pickles of earlier versions lack, with the constructor's defaults.
_ATTRIBUTE_DEFAULTS = dict(lazy_check=None, check_edits=True)
#: Per-parameter entries of checkpoints written by earlier versions, dropped on loading.
_DROPPED_STATE = ("version", "exact")


def _upgrade(attributes: dict[str, Any], param_groups: list[dict[str, Any]]) -> None:
    """Fill in, in place, what an optimizer's pickled ``attributes`` (its ``__dict__``) and its param groups
    from an earlier version lack: ``_ATTRIBUTE_DEFAULTS`` and ``_GROUP_DEFAULTS``."""
    for key, value in _ATTRIBUTE_DEFAULTS.items():
        attributes.setdefault(key, value)
    for group in param_groups:
        for key, value in _GROUP_DEFAULTS.items():
            group.setdefault(key, value)
