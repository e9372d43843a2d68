"""mdlib: l_p mirror descent for attention, the companion library of the book.

The public API, importable from ``mdlib`` itself (loaded on first use, so ``import mdlib`` alone
imports neither torch nor numpy)::

    from mdlib import LpMirrorDescent, attention_svm, SingleHeadAttention

- the optimizer: :class:`LpMirrorDescent` (a ``torch.optim.Optimizer``) and its functional step
  :func:`lp_mirror_descent`;
- the geometry of the potential psi(w) = ||w||_p^p / p: :func:`mirror_map`,
  :func:`inverse_mirror_map`, :func:`mirror_step`, :func:`potential`, :func:`bregman_divergence`,
  :func:`lp_norm`, :func:`matched_lr` (a step size for a given p), :func:`matched_param_groups` (one per
  tensor) and the rest of ``mdlib.mirror``;
- the max-margin problems, solved with a certificate: :func:`lp_margin`, :func:`attention_svm`,
  :func:`decoder_svm` and the token-selection helpers of ``mdlib.svm``;
- the models: :class:`SingleHeadAttention` (the paper's single-head model), :class:`EncoderClassifier`
  (the sentiment encoder), :class:`VisionTransformer`, and the synthetic data.

These need torch, numpy and scipy only. The package has three tiers, each importing only itself and
the tiers below it:

- the library, ``mdlib.mirror``, ``mdlib.optim``, ``mdlib.svm``, ``mdlib.models``;
- ``mdlib.experiments`` (extra ``[experiments]``): training (``train``), the data (``fetch``, ``data``),
  where things live (``paths``), the experiments (``synthetic``, ``sentiment``: chapter 04's package,
  ``vision``, ``selection``, ``sparsity``, ``step_size_guide``), their statistics and analyses
  (``stats``, ``analysis``), each claim's estimate (``estimates``), method and data set names
  (``methods``), what a step costs (``cost``); and beside it, in the same tier, ``mdlib.runs``: how runs
  are named, filed, locked and scheduled (``identity``, ``files``, ``lockfile``, ``store``, no torch,
  ``pool``, ``progress``);
- ``mdlib.book`` (extra ``[book]``): the chapters (``chapters``, the one registry), their parameters
  (``profiles``), their execution (``execute``), the generated pages and the build (``pages``,
  ``book``), figures and tables (``plots``), records (``provenance``), the scorecard (``scorecard``:
  the tables' schema, the evidence, the rules, the claims' rows and the page; no torch), benchmarks
  (``bench``), the command line (``cli``: ``python -m mdlib``).
"""

from __future__ import annotations

import importlib
import math
import os
from typing import TYPE_CHECKING

__version__ = "0.4.0"

#: Each public name and the module that defines it.
_EXPORTS = {
    "mdlib.optim": ("LpMirrorDescent", "lp_mirror_descent"),
    "mdlib.mirror": ("mirror_map", "inverse_mirror_map", "mirror_step", "potential", "bregman_divergence",
                     "directional_bregman", "lp_norm", "lp_normalize", "normalized_gradient", "dual_exponent",
                     "check_p", "matched_lr", "matched_param_groups"),
    "mdlib.svm": ("lp_margin", "attention_svm", "decoder_svm", "attention_constraints", "MarginSolution",
                  "InfeasibleError", "ConvergenceError", "token_scores", "globally_optimal_tokens",
                  "support_tokens", "is_locally_optimal"),
    "mdlib.models": ("SingleHeadAttention", "EncoderClassifier", "VisionTransformer", "SelfAttention",
                     "SyntheticData", "attention_logits", "single_head_output", "logistic_loss",
                     "gaussian_instances", "joint_training_data"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [name for names in _EXPORTS.values() for name in names]

if TYPE_CHECKING:  # what static type checkers see; at run time the names load on first use
    from mdlib.mirror import (bregman_divergence, check_p, directional_bregman, dual_exponent,
                              inverse_mirror_map, lp_norm, lp_normalize, matched_lr, matched_param_groups, mirror_map,
                              mirror_step,
                              normalized_gradient, potential)
    from mdlib.models import (EncoderClassifier, SelfAttention, SingleHeadAttention, SyntheticData,
                              VisionTransformer, attention_logits, gaussian_instances, joint_training_data,
                              logistic_loss, single_head_output)
    from mdlib.optim import LpMirrorDescent, lp_mirror_descent
    from mdlib.svm import (ConvergenceError, InfeasibleError, MarginSolution, attention_constraints,
                           attention_svm, decoder_svm, globally_optimal_tokens, is_locally_optimal, lp_margin,
                           support_tokens, token_scores)


def __getattr__(name: str) -> object:
    """Load a public name from its module on first access (PEP 562) and keep it here."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'mdlib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def first_line(text: object) -> str:
    """The first line of ``str(text)`` (e.g. an exception) without surrounding blanks; "" when empty."""
    return (str(text).strip().splitlines() or [""])[0]


def positive_env(name: str, default: float, means: str) -> float:
    """The number in the environment variable ``name`` (``default`` when unset or blank); a ValueError
    that says what to give (``means``) unless it is a finite number > 0."""
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"${name} is {text!r}: give {means}, a number > 0 (default {default:g})")
    return value
