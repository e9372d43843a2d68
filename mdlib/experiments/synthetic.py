r"""Batched l_p mirror descent on the single-head model: the engine of experiments E1-E3.

All trials of a setting train as one tensor program (leading batch dimension B), each with its own
normalized step. The gradient of L(W, v) = mean_i l(y_i f_i), l(s) = log(1 + e^-s), is

    dL/dW = sum_{i,t} c_it x_it z_i^T,   c_it = (1/n) l'(y_i f_i) y_i sigma_it (g_it - f_i)
    dL/dv = sum_{i,t} e_it x_it,         e_it = (1/n) l'(y_i f_i) y_i sigma_it

with sigma_i = softmax(X_i W z_i), g_it = v^T x_it and f_i = sum_t sigma_it g_it. Once the softmax
saturates, these coefficients fall below 1e-300 and a float64 gradient underflows to rounding noise
(the authors' runs stall there, the step g / (||g||_q + eps) shrinking to nothing). We therefore
compute log|c_it| exactly in log space (log-softmax; g_it - f_i = sum_u sigma_iu (g_it - g_iu)
summed with the largest weight factored out) and form the gradient as exp(max log|c|) * D with
D = sum sign(c) exp(log|c| - max log|c|) x z^T. The normalized step uses D / ||D||_q, which equals
grad / ||grad||_q exactly (no eps) at any saturation; the plain step uses exp(max log|c|) * D.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, overload

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from tqdm.auto import tqdm

from mdlib import mirror, svm
from mdlib.models import SyntheticData, attention_logits, gaussian_instances, joint_training_data, logistic_loss
from mdlib.runs import identity, store
from mdlib.runs.identity import RunId

if TYPE_CHECKING:  # pandas loads lazily, in the functions that build tables
    import pandas as pd

__all__ = ["E1Config", "E1_KIND", "E2Config", "E2_KIND", "E3Config", "E3_KIND", "Path", "fixed_decoder_experiment",
           "joint_training_experiment", "record_steps", "scaled_gradients", "selected_tokens",
           "single_instance_experiment", "svm_divergences", "train"]


def _signed_log_sum(log_weights: Tensor, values: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """(log|S|, sign S) for S = sum exp(log_weights) * values along ``dim``, without underflow:
    the largest weight among terms with a non-zero value is factored out."""
    masked = torch.where(values != 0, log_weights, torch.full_like(log_weights, -torch.inf))
    top = masked.amax(dim=dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = (torch.exp(masked - top) * values).sum(dim=dim)
    return torch.log(total.abs()) + top.squeeze(dim), torch.sign(total)


def _factor_out(log_abs: Tensor, sign: Tensor, sum_dims: int) -> tuple[Tensor, Tensor]:
    """Split coefficients sign * exp(log_abs) into exp(scale) * rel with max |rel| = 1 per trial
    (the trailing ``sum_dims`` dimensions). A trial whose coefficients are all zero gets scale -inf
    and rel = 0."""
    dims = tuple(range(log_abs.dim() - sum_dims, log_abs.dim()))
    scale = log_abs.amax(dim=dims, keepdim=True)
    safe = torch.where(torch.isfinite(scale), scale, torch.zeros_like(scale))
    rel = torch.where(torch.isfinite(scale), sign * torch.exp(log_abs - safe), torch.zeros_like(log_abs))
    return scale.reshape(scale.shape[:-sum_dims]), rel


@overload
def scaled_gradients(W: Tensor, v: Tensor, data: SyntheticData,
                     with_decoder: Literal[False] = False) -> tuple[Tensor, Tensor]: ...
@overload
def scaled_gradients(W: Tensor, v: Tensor, data: SyntheticData,
                     with_decoder: Literal[True]) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]: ...
@overload
def scaled_gradients(W: Tensor, v: Tensor, data: SyntheticData, with_decoder: bool = False
                     ) -> tuple[Tensor, Tensor] | tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]: ...
def scaled_gradients(W: Tensor, v: Tensor, data: SyntheticData, with_decoder: bool = False
                     ) -> tuple[Tensor, Tensor] | tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Gradients of the mean logistic loss as (log_scale, direction) pairs, grad = exp(log_scale) * D.

    Returns ``(sW, DW)`` (shapes (B,), (B, d, d)) and, with ``with_decoder``, also ``(sv, Dv)``.
    ``D`` has its largest coefficient scaled to 1, so it never underflows; a trial with an exactly
    zero gradient has log_scale = -inf and D = 0.
    """
    X, z, y = data.X, data.z, data.y
    n = X.shape[-3]
    log_attention = torch.log_softmax(attention_logits(W, X, z), dim=-1)  # (B, n, T)
    scores = torch.einsum("bntd,bd->bnt", X, v)  # g_it = v^T x_it
    f = (log_attention.exp() * scores).sum(-1)  # (B, n)
    log_loss_slope = -F.softplus(y * f) - np.log(n)  # log|l'(y f)| / n, l'(s) = -sigmoid(-s)
    sign_example = -torch.sign(y)

    # g_it - f_i = sum_u sigma_iu (g_it - g_iu)
    differences = scores[..., :, None] - scores[..., None, :]  # (B, n, T, T)
    log_gap, sign_gap = _signed_log_sum(log_attention[..., None, :].expand_as(differences), differences, dim=-1)
    log_c = log_loss_slope[..., None] + log_attention + log_gap
    sW, rel = _factor_out(log_c, sign_example[..., None] * sign_gap, sum_dims=2)
    DW = torch.einsum("bnt,bntd,bne->bde", rel, X, z)
    if not with_decoder:
        return sW, DW
    sv, rel_v = _factor_out(log_loss_slope[..., None] + log_attention,
                            sign_example[..., None].expand_as(log_attention), sum_dims=2)
    Dv = torch.einsum("bnt,bntd->bd", rel_v, X)
    return (sW, DW), (sv, Dv)


def _step_direction(scale: Tensor, D: Tensor, p: float, normalize: bool) -> Tensor:
    """The move in the dual space per unit step size: D / ||D||_q (normalized) or exp(scale) D."""
    if normalize:
        norm = mirror.lp_norm(D, mirror.dual_exponent(p), batch_dims=1)
        norm = torch.where(norm > 0, norm, torch.ones_like(norm))  # zero gradient: no move
        return D / norm.reshape(-1, *([1] * (D.dim() - 1)))
    return torch.exp(scale).reshape(-1, *([1] * (D.dim() - 1))) * D


def record_steps(steps: int, points: int = 250) -> np.ndarray:
    """Steps at which to record the iterate: 0, a geometric grid (for log axes) and a linear grid."""
    grid = np.concatenate([[0], np.geomspace(1, steps, points // 2), np.linspace(0, steps, points // 2)])
    return np.unique(np.round(grid).astype(int))


@dataclass
class Path:
    """A recorded training path. Arrays have the recorded steps first: W (R, B, d, d), v (R, B, d),
    loss (R, B), selected_probability (R, B, n): the softmax weight of each example's currently
    most-attended token."""

    p: float
    steps: np.ndarray
    W: Tensor
    v: Tensor
    loss: Tensor
    selected_probability: Tensor
    final_W: Tensor
    final_v: Tensor
    info: dict = field(default_factory=dict)


@contextlib.contextmanager
def _one_thread():
    """These tensors are tiny: one thread avoids OpenMP hand-offs, which cost more than the work
    (and spin when another process holds the second core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train(data: SyntheticData, p: float, steps: int, lr: float, W0: Tensor, *, train_decoder: bool = False,
          v0: Tensor | None = None, normalize: bool = True, eps: float | None = None, points: int = 250,
          progress: bool = False) -> Path:
    """Mirror descent (potential ||.||_p^p / p) on W, and on v too when ``train_decoder``, for every
    trial at once. Each trial takes the step W <- m^-1(m(W) - lr * dir), dir = grad / ||grad||_q
    (``normalize``) or grad, with grad computed exactly in log space (module docstring).

    ``eps`` (a number) switches to the authors' scheme instead: the float64 autograd gradient and the
    step grad / (||grad||_q + eps), which stalls once the gradient underflows towards eps."""
    p = mirror.check_p(p)
    if steps < 1 or lr <= 0:
        raise ValueError(f"need steps >= 1 and lr > 0, got steps={steps}, lr={lr}")
    with _one_thread():
        return _train(data, p, steps, lr, W0, train_decoder, v0, normalize, eps, points, progress)


def _moves(W: Tensor, v: Tensor, data: SyntheticData, p: float, normalize: bool, train_decoder: bool,
           eps: float | None) -> list[Tensor]:
    """The moves of the dual variables per unit step: [for W] or [for W, for v]."""
    if eps is None:
        grads = scaled_gradients(W, v, data, with_decoder=train_decoder)
        pairs = grads if train_decoder else (grads,)
        return [_step_direction(scale, D, p, normalize) for scale, D in pairs]
    params = [W.detach().requires_grad_(True)] + ([v.detach().requires_grad_(True)] if train_decoder else [])
    with torch.enable_grad():
        loss = logistic_loss(params[0], params[1] if train_decoder else v, data.X, data.y, data.z).sum()
        grads = torch.autograd.grad(loss, params)
    return [mirror.normalized_gradient(g, p, eps, batch_dims=1) if normalize else g for g in grads]


def _train(data, p, steps, lr, W0, train_decoder, v0, normalize, eps, points, progress) -> Path:
    W = W0.clone()
    v = (v0 if v0 is not None else data.v).clone()
    uW, uv = mirror.mirror_map(W, p), mirror.mirror_map(v, p)
    at = record_steps(steps, points)
    keep = set(at.tolist())
    rec: dict[str, list[Tensor]] = {"W": [], "v": [], "loss": [], "sel": []}

    def record():
        rec["W"].append(W.clone())
        rec["v"].append(v.clone())
        rec["loss"].append(logistic_loss(W, v, data.X, data.y, data.z))
        rec["sel"].append(torch.softmax(attention_logits(W, data.X, data.z), dim=-1).amax(dim=-1))

    for k in tqdm(range(steps + 1), disable=None if progress else True, desc=f"p={p:g}", leave=False):
        if k in keep:
            record()
        if k == steps:
            break
        moves = _moves(W, v, data, p, normalize, train_decoder, eps)
        uW = uW - lr * moves[0]
        if train_decoder:
            uv = uv - lr * moves[1]
            v = mirror.inverse_mirror_map(uv, p)
        W = mirror.inverse_mirror_map(uW, p)
        if not bool(torch.isfinite(W).all()):
            raise FloatingPointError(f"W overflowed at step {k} (p={p}, lr={lr}): reduce lr")
    return Path(p=p, steps=at, W=torch.stack(rec["W"]), v=torch.stack(rec["v"]), loss=torch.stack(rec["loss"]),
                selected_probability=torch.stack(rec["sel"]), final_W=W, final_v=v)


def selected_tokens(W: Tensor, data: SyntheticData) -> Tensor:
    """alpha_i = argmax_t softmax(X_i W z_i)_t, shape (B, n): the token each example selects."""
    return attention_logits(W, data.X, data.z).argmax(dim=-1)


def svm_divergences(path: Path, data: SyntheticData, svm_ps: Iterable[float], tol: float = 1e-8) -> dict:
    """For each SVM exponent p', the l_p' attention SVM W_mm for the path's final selected tokens and
    the directional Bregman divergence D_psi_p(W_mm / ||W_mm||_p, W_k / ||W_k||_p) along the path, in
    the training exponent's geometry (p = path.p). Returns {p': (divergence (R, B), W_mm (B, d, d))}."""
    alpha = selected_tokens(path.final_W, data).numpy()
    X, z = data.X.numpy(), data.z.numpy()
    out = {}
    for q in svm_ps:
        W_mm = torch.from_numpy(svm.attention_svm(X, z, alpha, q, tol=tol)).to(path.W.dtype)
        out[float(q)] = (mirror.directional_bregman(W_mm, path.W, path.p, batch_dims=2), W_mm)
    return out


def initial_weights(trials: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """W(0) ~ N(0, 1) entrywise for each trial, from its own stream (independent of the data)."""
    g = torch.Generator().manual_seed(10_000_019 + seed)
    return torch.randn((trials, d, d), generator=g, dtype=dtype)


def _stored(kind: str, config_type: type[identity.Config], compute: Callable[..., dict],
            config: identity.Config | Mapping[str, Any], progress: bool, cache: bool) -> Mapping[str, Any]:
    """``compute(**config)`` through the results store (``cache=False``: computed, not stored); a
    mapping is taken as ``config_type`` (exactly its fields)."""
    typed = config_type.of(config)
    if not cache:
        return compute(**typed.to_dict(), progress=progress)
    return store.load_or_run(RunId.of(kind, typed), lambda: compute(**typed.to_dict(), progress=progress))


E1_KIND = identity.kind("e1-fixed-decoder", __name__)


@dataclass(frozen=True)
class E1Config(identity.Config):
    """An E1 config (``fixed_decoder_experiment``); ``steps``: {p as a string: steps}."""

    WHAT = f"an {E1_KIND} config"

    seeds: int
    steps: Mapping[str, int]
    lr: float
    n: int
    T: int
    d: int
    svm_ps: list[float]
    seed: int
    eps: float | None
    points: int


def fixed_decoder_experiment(config: E1Config | Mapping[str, Any], *, progress: bool = False,
                             cache: bool = True) -> Mapping[str, Any]:
    """Experiment E1, stored under ``config`` (an ``E1Config``, or a mapping with exactly its fields):
    for each training exponent p (``steps`` maps p -> number of steps), train W with normalized l_p MD
    (step ``lr``) from W(0) ~ N(0, 1) on ``seeds`` Gaussian instances (n examples, T tokens, dimension
    d, instance seeds from ``seed``; fixed unit decoder v), then measure the directional Bregman
    divergence (in the training p's geometry) between the path and the l_p' attention SVM of the final
    selected tokens, for every p' in ``svm_ps``, at ``points`` recorded steps. ``eps``: None for the
    exact normalized step, a number for the authors' g / (||g||_q + eps) (see :func:`train`).

    Returns tidy tables: ``curves`` (train_p, svm_p, step, mean, std, q10, q90 over seeds),
    ``final`` (train_p, svm_p, seed, divergence at the last step), and ``tokens`` (train_p, seed,
    the fraction of examples whose selected token is the globally optimal one, final loss).
    """
    return _stored(E1_KIND, E1Config, _fixed_decoder, config, progress, cache)


def _fixed_decoder(*, seeds, steps, lr, n, T, d, svm_ps, seed, eps, points, progress) -> dict:
    import pandas as pd

    data = gaussian_instances(seeds, n, T, d, seed=seed)
    W0 = initial_weights(seeds, d, seed)
    optimal = svm.globally_optimal_tokens(data.X.numpy(), data.y.numpy(), data.v.numpy())
    curves, final, tokens = [], [], []
    for p, p_steps in steps.items():
        path = train(data, float(p), int(p_steps), lr, W0, eps=eps, points=points, progress=progress)
        chosen = selected_tokens(path.final_W, data).numpy()
        tokens.append(pd.DataFrame({"train_p": float(p), "seed": seed + np.arange(seeds),
                                    "optimal_fraction": (chosen == optimal).mean(axis=1),
                                    "final_loss": path.loss[-1].numpy()}))
        for q, (div, _) in svm_divergences(path, data, svm_ps).items():
            div = div.numpy()
            curves.append(pd.DataFrame({"train_p": float(p), "svm_p": q, "step": path.steps,
                                        "mean": div.mean(axis=1), "std": div.std(axis=1),
                                        "q10": np.quantile(div, 0.1, axis=1), "q90": np.quantile(div, 0.9, axis=1)}))
            final.append(pd.DataFrame({"train_p": float(p), "svm_p": q, "seed": seed + np.arange(seeds),
                                       "divergence": div[-1]}))
    return {"curves": pd.concat(curves, ignore_index=True), "final": pd.concat(final, ignore_index=True),
            "tokens": pd.concat(tokens, ignore_index=True)}


def _entries(matrix_path: Tensor, reference: Tensor, p: float, step: np.ndarray, kind: str) -> pd.DataFrame:
    """Tidy table of every entry of an l_p-normalized path (R, *shape) next to the normalized
    reference (*shape): columns step, entry (e.g. 'W[0,1]'), value, svm."""
    import pandas as pd

    R = matrix_path.shape[0]
    path = mirror.lp_normalize(matrix_path.reshape(R, -1), p, batch_dims=1, zero="nan").numpy()
    ref = mirror.lp_normalize(reference.reshape(-1), p).numpy()
    shape = reference.shape
    names = [f"{kind}[{','.join(map(str, np.unravel_index(j, shape)))}]" for j in range(ref.size)]
    return pd.concat([pd.DataFrame({"step": step, "entry": name, "value": path[:, j], "svm": ref[j]})
                      for j, name in enumerate(names)], ignore_index=True)


E2_KIND = identity.kind("e2-single-instance", __name__)


@dataclass(frozen=True)
class E2Config(identity.Config):
    """An E2 config (``single_instance_experiment``)."""

    WHAT = f"an {E2_KIND} config"

    ps: list[float]
    normalized_steps: int
    lr: float
    plain_steps: int
    plain_lr: float
    n: int
    T: int
    d: int
    seed: int
    points: int


def single_instance_experiment(config: E2Config | Mapping[str, Any], *, progress: bool = False,
                               cache: bool = True) -> Mapping[str, Any]:
    """Experiment E2, stored under ``config`` (an ``E2Config``, or a mapping with exactly its fields),
    on one Gaussian instance (n examples, T tokens, dimension d, from ``seed``; fixed decoder), W(0) =
    0, for each exponent p in ``ps``: the paper's normalized MD (``normalized_steps`` at ``lr``) and
    plain MD with a constant small step (``plain_steps`` at ``plain_lr``, the setting of Theorems 8 and
    11).

    Returns ``paths`` (p, method, step, entry, value, svm: every entry of W(k)/||W(k)||_p with the
    l_p SVM's), ``curves`` (p, method, step, norm ||W(k)||_p, selected softmax probability (min over
    examples), own-SVM directional divergence, loss) and ``svm`` (p, the selected tokens, whether they
    are globally optimal)."""
    return _stored(E2_KIND, E2Config, _single_instance, config, progress, cache)


def _single_instance(*, ps, normalized_steps, lr, plain_steps, plain_lr, n, T, d, seed, points, progress) -> dict:
    import pandas as pd

    data = gaussian_instances(1, n, T, d, seed=seed)
    zero = torch.zeros(1, d, d, dtype=data.X.dtype)
    optimal = svm.globally_optimal_tokens(data.X.numpy(), data.y.numpy(), data.v.numpy())[0]
    paths, curves, solutions = [], [], []
    for p in ps:
        for method, k, eta, normalize in (("normalized", normalized_steps, lr, True),
                                          ("plain", plain_steps, plain_lr, False)):
            path = train(data, float(p), int(k), eta, zero, normalize=normalize, points=points, progress=progress)
            (div, W_mm), = svm_divergences(path, data, [p]).values()
            alpha = selected_tokens(path.final_W, data)[0].numpy()
            paths.append(_entries(path.W[:, 0], W_mm[0], float(p), path.steps, "W").assign(p=float(p), method=method))
            curves.append(pd.DataFrame({
                "p": float(p), "method": method, "step": path.steps,
                "norm": mirror.lp_norm(path.W[:, 0], float(p), batch_dims=1).numpy(),
                "selected_probability": path.selected_probability[:, 0].amin(dim=-1).numpy(),
                "divergence": div[:, 0].numpy(), "loss": path.loss[:, 0].numpy()}))
            solutions.append({"p": float(p), "method": method, "selected": alpha.tolist(),
                              "globally_optimal": bool((alpha == optimal).all())})
    return {"paths": pd.concat(paths, ignore_index=True), "curves": pd.concat(curves, ignore_index=True),
            "svm": pd.DataFrame(solutions).astype({"selected": str})}


E3_KIND = identity.kind("e3-joint", __name__)


@dataclass(frozen=True)
class E3Config(identity.Config):
    """An E3 config (``joint_training_experiment``); ``steps``: {p as a string: steps}."""

    WHAT = f"an {E3_KIND} config"

    steps: Mapping[str, int]
    lr: float
    points: int


def joint_training_experiment(config: E3Config | Mapping[str, Any], *, progress: bool = False,
                              cache: bool = True) -> Mapping[str, Any]:
    """Experiment E3, stored under ``config`` (an ``E3Config``, or a mapping with exactly its
    fields): W and v trained together by
    normalized l_p MD (step ``lr``) from W(0) = 0, v(0) = 0 on the fixed two-example instance, for each
    p in ``steps`` (p -> number of steps), recorded at ``points`` steps. The attention SVM
    uses the final selected tokens alpha; the decoder SVM is min ||v||_p s.t. y_i x_{i alpha_i}^T v >= 1.

    Returns ``probabilities`` (p, step, example, attention on the finally selected token, classifier
    probability sigmoid(y_i f_i)), ``W`` and ``v`` (every normalized entry with the SVM's) and
    ``summary`` (p, selected tokens, final directional divergences of W and v to their SVMs)."""
    return _stored(E3_KIND, E3Config, _joint_training, config, progress, cache)


def _joint_training(*, steps, lr, points, progress) -> dict:
    import pandas as pd

    data = joint_training_data()
    X, y, z = data.X.numpy(), data.y.numpy(), data.z.numpy()
    probabilities, W_rows, v_rows, summary = [], [], [], []
    for p, k in steps.items():
        p = float(p)
        path = train(data, p, int(k), lr, torch.zeros(1, 2, 2, dtype=data.X.dtype), train_decoder=True,
                     v0=torch.zeros(1, 2, dtype=data.X.dtype), points=points, progress=progress)
        alpha = selected_tokens(path.final_W, data)
        W_mm = torch.from_numpy(svm.attention_svm(X, z, alpha.numpy(), p))[0]
        v_mm = torch.from_numpy(svm.decoder_svm(X, y, alpha.numpy(), p))[0]
        attention = torch.softmax(attention_logits(path.W[:, 0][:, None], data.X, data.z), dim=-1)[:, 0]  # (R, n, T)
        chosen = attention.gather(-1, alpha[0][None, :, None].expand(len(path.steps), -1, 1))[..., 0]
        f = torch.einsum("rnt,ntd,rd->rn", attention, data.X[0], path.v[:, 0])
        classifier = torch.sigmoid(data.y[0] * f)
        for i in range(chosen.shape[1]):
            probabilities.append(pd.DataFrame({"p": p, "step": path.steps, "example": i + 1,
                                               "attention_selected": chosen[:, i].numpy(),
                                               "classifier": classifier[:, i].numpy()}))
        W_rows.append(_entries(path.W[:, 0], W_mm, p, path.steps, "W").assign(p=p))
        v_rows.append(_entries(path.v[:, 0], v_mm, p, path.steps, "v").assign(p=p))
        summary.append({"p": p, "steps": int(k), "selected": str((alpha[0] + 1).tolist()),
                        "W_divergence": mirror.directional_bregman(W_mm, path.final_W[0], p).item(),
                        "v_divergence": mirror.directional_bregman(v_mm, path.final_v[0], p).item(),
                        "final_loss": path.loss[-1, 0].item()})
    return {"probabilities": pd.concat(probabilities, ignore_index=True), "W": pd.concat(W_rows, ignore_index=True),
            "v": pd.concat(v_rows, ignore_index=True), "summary": pd.DataFrame(summary)}
