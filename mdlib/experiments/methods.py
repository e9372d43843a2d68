"""How the experiments name and build an optimizer: a method key ("1.1", "2", "adam", "adamw", "sgd"), the
optimizer it builds (``make_optimizer``) and how tables and legends write it: the one place a method's
name is written, and a data set's (``dataset_text``). Importing it imports no torch (the scorecard and
``paper`` use the names).
"""

from __future__ import annotations

import math
import numbers
import re
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import torch

__all__ = ["ADAM", "GD", "L1_1", "L3", "OPTIMIZERS", "PAPER_PS", "arm_key", "arm_text", "make_optimizer", "method", "method_key",
           "key_text", "method_label", "method_text", "p_label", "DATASET_CLASSES", "DATASET_NAMES", "dataset_text"]

OPTIMIZERS = ("md", "adam", "adamw", "sgd")

#: The keys of the paper's methods, as run configs and results tables write them (``method_key``): ℓ1.1
#: mirror descent (the paper's method), ℓ2 mirror descent, which is gradient descent, ℓ3, and Adam.
L1_1, GD, L3, ADAM = "1.1", "2", "3", "adam"
#: The paper's exponents p, Table 1's columns in its order: ℓ1.1, GD, ℓ3.
PAPER_PS = (L1_1, GD, L3)


def make_optimizer(params: Iterable[Any], name: str, lr: float, p: float | None = None,
                   matched_p: float | None = None) -> torch.optim.Optimizer:
    """The optimizer of a run config: ``"md"`` (``LpMirrorDescent`` with exponent ``p``), ``"adam"``
    (torch Adam, default betas), ``"adamw"`` (torch AdamW, its defaults: betas (0.9, 0.999), weight
    decay 0.01) or ``"sgd"`` (plain SGD; the same as md with p = 2).

    ``matched_p`` (``"md"`` only, over tensors): one step per tensor instead of ``lr`` for all,
    ``mirror.matched_param_groups(params, lr, p, reference_p=matched_p)``: each tensor moves, to first
    order, as far as it would under exponent ``matched_p`` at ``lr``.

    Implementations: torch's defaults (single-tensor on CPU, foreach on CUDA), except that mirror descent
    on CUDA takes its fused step (torch.compile; foreach, with a warning, where that does not compile).
    On CPU the optimizer is a small part of a chapter's training step (chapter 08): compiling it would
    buy little."""
    import torch

    from mdlib.optim import LpMirrorDescent

    params = [dict(x, params=list(x["params"])) if isinstance(x, dict) else x for x in params]
    tensors = [w for x in params for w in (x["params"] if isinstance(x, dict) else [x])]
    on_gpu = bool(tensors) and all(w.device.type == "cuda" for w in tensors)
    if matched_p is not None and (name != "md" or any(isinstance(x, dict) for x in params)):
        raise ValueError(f"matched_p is for optimizer 'md' over plain tensors (it makes the param groups), got "
                         f"optimizer {name!r}" + (" with param groups" if name == "md" else ""))
    if name == "md":
        if p is None:
            raise ValueError("optimizer 'md' needs the exponent p")
        if matched_p is not None:
            from mdlib.mirror import matched_param_groups

            params = matched_param_groups(params, lr, p, reference_p=matched_p)
        return LpMirrorDescent(params, lr=lr, p=p, fused=True if on_gpu and p != 2.0 else None)
    if p is not None:
        raise ValueError(f"optimizer {name!r} takes no exponent p (got p={p}); p is for 'md'")
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


_EXPONENT = re.compile(r"[0-9]+(\.[0-9]+)?")  #: an exponent in a method key: "1.1", "2", "3"


def method(key: str | float) -> tuple[str, float | None]:
    """A method key as (optimizer, p): ``"adam"`` -> ("adam", None), ``"1.1"`` -> ("md", 1.1). The keys:
    "adam", "adamw", "sgd", and an exponent p > 1 in decimal digits ("1.1", "2") or as a number (a YAML
    key 1.1)."""
    if key in ("adam", "adamw", "sgd"):
        return key, None
    number = isinstance(key, numbers.Real) and not isinstance(key, bool)
    if number or isinstance(key, str) and _EXPONENT.fullmatch(key):
        p = float(key)
        if math.isfinite(p) and p > 1.0:  # mdlib.mirror.check_p's rule, without importing torch
            return "md", p
    raise ValueError(f"unknown method {key!r}: an l_p exponent p > 1 in decimal digits such as '1.1' or '3', "
                     "or 'adam' / 'adamw' / 'sgd'")


def method_key(optimizer: str, p: float | None = None) -> str:
    """The inverse of ``method``: ("md", 2.0) -> "2", ("adam", None) -> "adam"."""
    return f"{p:g}" if optimizer == "md" else optimizer


def p_label(p: float) -> str:
    """Legend label of an exponent: ``$\\ell_{1.1}$`` ..., with p = 2 marked as gradient descent."""
    value = float(p)
    text = f"{value:g}"
    return rf"$\ell_{{{text}}}$ (GD)" if value == 2.0 else rf"$\ell_{{{text}}}$"


def method_label(optimizer: str, p: float | None = None) -> str:
    """Legend label of a real-data run's optimizer: ``p_label(p)`` for mirror descent ("md"), else
    the optimizer's name ("Adam", "SGD")."""
    return p_label(p) if optimizer == "md" else {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}.get(optimizer, optimizer)


def method_text(optimizer: str, p: float | None = None) -> str:
    """Plain-text name of a method for glued prose (no LaTeX): "ℓ1.1", "ℓ2 (GD)", "Adam"."""
    if optimizer != "md":
        return method_label(optimizer, p)
    return f"ℓ{float(p):g}" + (" (GD)" if float(p) == 2.0 else "")


def key_text(key: str | float) -> str:
    """Plain-text name of a method key (``method``): "1.1" -> "ℓ1.1", "2" -> "ℓ2 (GD)", "adam" -> "Adam"."""
    return method_text(*method(key))


def arm_key(trained: str, matched: str) -> str:
    """The key of an arm of chapter 04's 2 x 2: method ``trained`` with each tensor's step matched to method
    ``matched``'s, "a@b" (``arm_key(L1_1, GD)`` is "1.1@2")."""
    return f"{trained}@{matched}"


def arm_text(key: str) -> str:
    """How the book names a method key ("ℓ1.1", "ℓ2 (GD)") or an arm of chapter 04's 2 x 2, "a@b": method a
    with each tensor's step matched to method b's ("ℓ1.1, GD's steps per tensor")."""
    trained, at, matched = str(key).partition("@")
    if not at:
        return key_text(key)
    short = [key_text(k).replace("ℓ2 (GD)", "GD") for k in (trained, matched)]
    return f"{short[0]}, {short[1]}'s steps per tensor"


#: How the book writes a data set of the vision experiment (``vision.DATASETS``' keys).
DATASET_NAMES = {"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}
#: The number of classes of each data set: a chance-level accuracy is 1 / classes.
DATASET_CLASSES = {"fashion_mnist": 10, "cifar10": 10, "cifar100": 100}


def dataset_text(name: str) -> str:
    """Display name of a data set for tables, titles and glued prose: "cifar10" -> "CIFAR-10"; a name
    without one (``DATASET_NAMES``) is written as it is."""
    return DATASET_NAMES.get(name, name)
