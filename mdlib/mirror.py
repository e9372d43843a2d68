r"""The l_p mirror-descent geometry, entrywise, as plain torch functions.

Potential  psi(w) = ||w||_p^p / p  (entrywise l_p over every entry of a tensor; p = 2 is Frobenius,
not a Schatten norm). Mirror map and its inverse, coordinate-wise:

    m(w)      = sign(w) |w|^(p-1)
    m^-1(u)   = sign(u) |u|^(1/(p-1))        (= the mirror map of the conjugate exponent q = p/(p-1))

One mirror-descent step:  w <- m^-1( m(w) - lr * g ),  with g the gradient, or g / (||g||_q + eps)
for the normalized step of the synthetic experiments. p = 2 is exactly gradient descent.

Every function takes ``batch_dims``: the number of leading dimensions that index independent
problems (trials). Norms, potentials, divergences and the normalization are computed per problem
over the remaining dimensions.

Choosing lr for a given p
-------------------------
The step is not scale-free. Linearizing m^-1 at w (m'(w) = (p-1)|w|^(p-2)), one step moves an entry by

    |dw| ~ lr |g| |w|^(2-p) / (p-1)          (SGD at lr: lr |g|)

so the same lr moves entries of different magnitudes by different amounts unless p = 2, and good step
sizes differ across p by orders of magnitude. For p < 2, entries near zero barely move (a
zero-initialized bias or LayerNorm shift moves by (lr |g|)^(1/(p-1)) on its first step: 1e-10 at
p = 1.1 for lr |g| = 0.1) while entries of magnitude above 1 move more than under SGD; for p > 2 it is
the other way round. :func:`matched_lr` turns an SGD step size into the lr of the same first-step
movement for entries of a chosen magnitude: ``matched_lr(sgd_lr, p, scale) = sgd_lr (p-1)
scale^(p-2)``. Pick ``scale`` as the typical magnitude of the entries that should learn (e.g. the
median |w| of the weight matrices at initialization), and :func:`matched_param_groups` gives every
tensor its own such step, matched at its own magnitude; the book's guide "Step sizes for l_p mirror
descent" (chapter 09) measures how well it predicts the best lr of a small transformer.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import Tensor

__all__ = [
    "check_p",
    "dual_exponent",
    "mirror_map",
    "inverse_mirror_map",
    "lp_norm",
    "lp_normalize",
    "potential",
    "bregman_divergence",
    "directional_bregman",
    "normalized_gradient",
    "mirror_step",
    "matched_lr",
    "matched_param_groups",
]


def check_p(p: float) -> float:
    """Validate an exponent p > 1 (finite) and return it as a float."""
    p = float(p)
    if not math.isfinite(p) or p <= 1.0:
        raise ValueError(f"the l_p exponent must be a finite number > 1, got p={p!r}")
    return p


def dual_exponent(p: float) -> float:
    """The conjugate exponent q = p / (p - 1), so that 1/p + 1/q = 1."""
    p = check_p(p)
    return p / (p - 1.0)


def _power_kind(r: float, dtype: torch.dtype) -> tuple[str, int]:
    """How sign(u)|u|^r is computed, and its integer: ("copy", 1) for r = 1; ("integer", k) for
    r = k in 2..32 (binary powering; p = 1.1 gives 10); ("sqrt", 0) for r = 1/2 (p = 3); ("cube", n)
    for float32 r = n/3, 3 < n <= 96, n not a multiple of 3 (p = 1.75 gives 4: the fused paths' Newton
    cube root, exp/log eagerly); else ("general", 0): exp(r log|u|)."""
    k = round(r)
    if r == 1.0:
        return "copy", 1
    if abs(r - k) < 1e-12 and 2 <= k <= 32:
        return "integer", k
    if r == 0.5:
        return "sqrt", 0
    n = round(3 * r)
    if dtype == torch.float32 and abs(3 * r - n) <= 1e-9 and 3 < n <= 96 and n % 3:
        return "cube", n
    return "general", 0


def _power_steps(r: float, dtype: torch.dtype) -> tuple[tuple[str, ...], bool]:
    """The arithmetic of sign(s)|s|^r, defined once for every variant (in place, foreach, fused): the
    operations on an accumulator x that starts as s, and whether the sign of s is put back afterwards.

    Integer r = k (p = 1 + 1/k; p = 1.1 gives 10): left-to-right binary powering of the signed s, for
    each bit of k after the leading one "square" (x <- x x) and, for a 1 bit, "mul" (x <- x s): four
    passes for k = 10; an odd power keeps the sign of s. r = 1/2 (p = 3): "abs", "sqrt". Other r:
    |s|^r = exp(r log|s|) ("abs", "log", "scale" by r, "exp"; log 0 = -inf gives exp(-inf) = 0, as it
    should), also the float32 r = n/3 that :func:`_fused_signed_power` computes by a Newton cube root.
    r = 1: no operation (a copy)."""
    kind, k = _power_kind(r, dtype)
    if kind == "copy":
        return (), False
    if kind == "integer":
        return tuple(op for bit in bin(k)[3:] for op in (("square", "mul") if bit == "1" else ("square",))), k % 2 == 0
    if kind == "sqrt":
        return ("abs", "sqrt"), True
    return ("abs", "log", "scale", "exp"), True


#: The steps of :func:`_power_steps` as torch operations: (accumulator x, source s, exponent r, out).
_TENSOR_OPS = {
    "square": lambda x, s, r, out: torch.mul(x, x, out=out),
    "mul": lambda x, s, r, out: torch.mul(x, s, out=out),
    "abs": lambda x, s, r, out: torch.abs(x, out=out),
    "sqrt": lambda x, s, r, out: torch.sqrt(x, out=out),
    "log": lambda x, s, r, out: torch.log(x, out=out),
    "scale": lambda x, s, r, out: torch.mul(x, r, out=out),
    "exp": lambda x, s, r, out: torch.exp(x, out=out),
}
#: The same steps as torch's foreach kernels, in place on the list of accumulators xs.
_FOREACH_OPS = {
    "square": lambda xs, ss, r: torch._foreach_mul_(xs, xs),
    "mul": lambda xs, ss, r: torch._foreach_mul_(xs, ss),
    "abs": lambda xs, ss, r: torch._foreach_abs_(xs),
    "sqrt": lambda xs, ss, r: torch._foreach_sqrt_(xs),
    "log": lambda xs, ss, r: torch._foreach_log_(xs),
    "scale": lambda xs, ss, r: torch._foreach_mul_(xs, r),
    "exp": lambda xs, ss, r: torch._foreach_exp_(xs),
}


def _signed_power(u: Tensor, r: float, out: Tensor | None = None) -> Tensor:
    """sign(u) |u|^r by the steps of :func:`_power_steps`: written into ``out`` by ``out=`` operations
    (the first reads u; nothing else is allocated), or, with ``out=None``, out of place (one pointwise
    expression, as torch.compile wants it). ``out`` must not be u and has u's dtype."""
    steps, sign = _power_steps(r, u.dtype)
    if not steps:
        return u.clone() if out is None else out.copy_(u)
    x = u
    for step in steps:
        x = _TENSOR_OPS[step](x, u, r, out)
    return torch.copysign(x, u, out=out) if sign else x


def _signed_power_into(s: Tensor, r: float, w: Tensor) -> None:
    """w <- sign(s)|s|^r in place, reading s (:func:`_signed_power` into w). A low-precision w (a
    fp16/bf16 parameter of a float32 dual) is computed in s's precision, then rounded into w."""
    if w.dtype != s.dtype:
        w.copy_(_signed_power(s, r))
    else:
        _signed_power(s, r, out=w)


def _foreach_signed_power_into(ss: list[Tensor], r: float, ws: list[Tensor]) -> None:
    """:func:`_signed_power_into` over lists of one device and dtype, by the same steps with foreach
    kernels (the sign put back as a product with sign(s): foreach has no copysign)."""
    steps, sign = _power_steps(r, ss[0].dtype)
    xs = ws if ws[0].dtype == ss[0].dtype else [torch.empty_like(s) for s in ss]
    torch._foreach_copy_(xs, ss)
    for step in steps:
        _FOREACH_OPS[step](xs, ss, r)
    if sign:
        torch._foreach_mul_(xs, torch._foreach_sign(ss))
    if xs is not ws:
        torch._foreach_copy_(ws, xs)


#: Bits of the float32 seed of |a|^(-1/3): y0 = bits(K - bits(a) / 3) is within 3.5 % of it for normal a.
_CUBE_ROOT_SEED = 0x54A23280


def _fused_signed_power(u: Tensor, r: float) -> Tensor:
    """sign(u) |u|^r as one pointwise expression, written for torch.compile to fuse into one pass.

    The steps of :func:`_power_steps`, out of place, plus one: in float32, r = n/3 with n > 3 (p = 1.75 gives
    r = 4/3) avoids exp/log. y = |u|^(-1/3) is seeded from the exponent bits (y0 = bits(K - bits(|u|)/3),
    within 3.5 %) and refined by three division-free Newton steps y <- y (4/3 - |u| y^3 / 3); then
    |u|^(1/3) = |u| y^2, |u|^(2/3) = |u| y, times an integer power of |u|. More accurate than
    exp(r log|u|) (max relative error 5e-7 instead of 1e-5 over 1e-28 <= |u| <= 1e28). Inputs below
    the normal range give 0, as the true value underflows for n > 3.
    Every read of a value is re-evaluated inside the compiled expression, so the iteration reads y
    only twice per step (y^3 as one power); otherwise compiling grows like 4^steps.
    Written for torch.compile; eager code uses :func:`_signed_power`.
    """
    kind, n = _power_kind(r, u.dtype)
    if kind != "cube":
        return _signed_power(u, r)
    a = u.abs()
    b = a.clamp_min(torch.finfo(torch.float32).tiny)  # the seed needs a normal number (a = 0: see below)
    y = (float(_CUBE_ROOT_SEED) - b.view(torch.int32).to(torch.float32) * (1.0 / 3.0)).to(torch.int32).view(
        torch.float32)
    third = b * (1.0 / 3.0)
    for _ in range(3):  # y is read twice per step: torch.compile re-evaluates an expression at every read
        y = y * (4.0 / 3.0 - third * y.pow(3))
    out = a * y.square() if n % 3 == 1 else a * y  # the true |u|: 0 and subnormals end at 0 (n > 3)
    for _ in range(n // 3):
        out = out * a
    return out.copysign(u)


def mirror_map(w: Tensor, p: float) -> Tensor:
    r"""The mirror map :math:`m(w) = \operatorname{sign}(w)\,|w|^{p-1}` (entrywise), the gradient of the
    potential :math:`\psi(w) = \|w\|_p^p / p`."""
    return _signed_power(w, check_p(p) - 1.0)


def inverse_mirror_map(u: Tensor, p: float) -> Tensor:
    r"""The inverse mirror map :math:`m^{-1}(u) = \operatorname{sign}(u)\,|u|^{1/(p-1)}` (entrywise), the
    inverse of :func:`mirror_map` and the mirror map of the conjugate exponent :math:`q = p/(p-1)`."""
    return _signed_power(u, 1.0 / (check_p(p) - 1.0))


def _reduce_dims(x: Tensor, batch_dims: int) -> tuple[int, ...]:
    if not 0 <= batch_dims <= x.dim():
        raise ValueError(f"batch_dims={batch_dims} is out of range for a tensor of dimension {x.dim()}")
    return tuple(range(batch_dims, x.dim()))


def lp_norm(w: Tensor, p: float, batch_dims: int = 0) -> Tensor:
    r""":math:`\|w\|_p = (\sum_j |w_j|^p)^{1/p}` over all non-batch dimensions, computed with the
    max-abs entry factored out (no overflow or underflow for large :math:`|w|` or large p)."""
    p = check_p(p)
    dims = _reduce_dims(w, batch_dims)
    if not dims:
        return w.abs()
    scale = w.abs().amax(dim=dims, keepdim=True)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    norm = ((w / safe).abs() ** p).sum(dim=dims, keepdim=True) ** (1.0 / p) * scale
    return norm.reshape(w.shape[:batch_dims])


def _expand(batch_values: Tensor, like: Tensor) -> Tensor:
    """Reshape per-problem values (batch shape) to broadcast against ``like``."""
    return batch_values.reshape(batch_values.shape + (1,) * (like.dim() - batch_values.dim()))


def lp_normalize(w: Tensor, p: float, batch_dims: int = 0, *, zero: str = "raise") -> Tensor:
    r""":math:`w / \|w\|_p` per problem. An all-zero problem has no direction: it raises, or with
    ``zero="nan"`` comes back as NaN (e.g. a path that starts at W(0) = 0)."""
    if zero not in ("raise", "nan"):
        raise ValueError(f"zero must be 'raise' or 'nan', got {zero!r}")
    norm = lp_norm(w, p, batch_dims)
    if zero == "raise" and bool((norm == 0).any()):
        raise ValueError("cannot l_p-normalize an all-zero tensor: it has no direction")
    return w / _expand(torch.where(norm == 0, torch.full_like(norm, torch.nan), norm), w)


def potential(w: Tensor, p: float, batch_dims: int = 0) -> Tensor:
    r"""The potential :math:`\psi(w) = \|w\|_p^p / p` per problem."""
    p = check_p(p)
    return (w.abs() ** p).sum(dim=_reduce_dims(w, batch_dims)) / p


def bregman_divergence(a: Tensor, b: Tensor, p: float, batch_dims: int = 0) -> Tensor:
    r"""The Bregman divergence of the potential, per problem:

    .. math:: D_\psi(a, b) = \psi(a) - \psi(b) - \langle m(b),\, a - b \rangle.

    The order matters (D is not symmetric): the first argument is the point measured, the second
    the point whose tangent plane is used. The paper's directional divergence puts the SVM
    solution first and the iterate second; see :func:`directional_bregman`.
    """
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    dims = _reduce_dims(a, batch_dims)
    inner = (mirror_map(b, p) * (a - b)).sum(dim=dims)
    return potential(a, p, batch_dims) - potential(b, p, batch_dims) - inner


def directional_bregman(reference: Tensor, w: Tensor, p: float, batch_dims: int = 0) -> Tensor:
    r""":math:`D_\psi(\bar w / \|\bar w\|_p,\ w / \|w\|_p)` with :math:`\bar w` = ``reference``: how far the
    direction of ``w`` is from the direction of ``reference`` (the SVM solution) in the
    :math:`\ell_p` geometry. Zero iff the directions agree.

    ``reference`` may have fewer batch dimensions than ``w`` (one SVM solution against a whole
    recorded path ``w`` of shape ``(steps, *batch, ...)``); it is broadcast. An all-zero ``w`` (no
    direction yet, as at W(0) = 0) gives NaN.
    """
    ref = lp_normalize(reference, p, reference.dim() - (w.dim() - batch_dims))
    return bregman_divergence(ref.expand_as(w), lp_normalize(w, p, batch_dims, zero="nan"), p, batch_dims)


def normalized_gradient(g: Tensor, p: float, eps: float = 1e-12, batch_dims: int = 0) -> Tensor:
    r""":math:`g / (\|g\|_q + \epsilon)` per problem, with q = p/(p-1) the dual exponent: the paper's normalized step
    direction (a unit-size step in the dual norm, whatever the gradient's scale)."""
    q = dual_exponent(p)
    return g / _expand(lp_norm(g, q, batch_dims) + eps, g)


def mirror_step(w: Tensor, grad: Tensor, lr: float, p: float, *, normalize: bool = False,
                eps: float = 1e-12, batch_dims: int = 0) -> Tensor:
    r"""One mirror-descent step :math:`w^+ = m^{-1}(m(w) - \eta\, g)` with :math:`\eta` = ``lr`` and
    g = ``grad`` or, with ``normalize``, :func:`normalized_gradient` (per problem when ``batch_dims`` > 0). Raises FloatingPointError rather than returning
    infinities when the inverse map overflows (p near 1 with a large step)."""
    if lr <= 0 or not math.isfinite(lr):
        raise ValueError(f"the step size must be a finite number > 0, got lr={lr!r}")
    if w.shape != grad.shape:
        raise ValueError(f"w and grad shapes differ: {tuple(w.shape)} vs {tuple(grad.shape)}")
    step = normalized_gradient(grad, p, eps, batch_dims) if normalize else grad
    new = inverse_mirror_map(mirror_map(w, p) - lr * step, p)
    if not bool(torch.isfinite(new).all()):
        cause = "the gradient is not finite" if not bool(torch.isfinite(grad).all()) else (
            f"the inverse mirror map overflowed (p={p}, exponent {1 / (p - 1):.3g})")
        raise FloatingPointError(f"mirror step produced non-finite values: {cause}; reduce lr (now {lr})")
    return new


def matched_lr(sgd_lr: float, p: float, scale: float, reference_p: float = 2.0) -> float:
    r"""The mirror-descent step size whose first step moves an entry of magnitude ``scale`` as far as a
    gradient-descent step at ``sgd_lr`` does:

    .. math:: \eta_p = \eta_{\mathrm{SGD}}\,(p - 1)\,\mathrm{scale}^{\,p-2}.

    The mirror map :math:`m(w) = \operatorname{sign}(w)|w|^{p-1}` has derivative
    :math:`m'(w) = (p-1)|w|^{p-2}`, so to first order the step :math:`w^+ = m^{-1}(m(w) - \eta g)` moves
    :math:`w` by :math:`-\eta g / m'(w) = -\eta g\,|w|^{2-p}/(p-1)`; equating that with SGD's
    :math:`-\eta_{\mathrm{SGD}}\, g` gives the formula (exact at p = 2, where it returns ``sgd_lr``).
    The linearization is accurate while the dual step :math:`\eta |g|` is small against
    :math:`|m(w)| = |w|^{p-1}`, i.e. while the step moves the entry by a small fraction of its
    magnitude: the relative error of the matched movement is of order ``sgd_lr * |g| / scale``.

    ``reference_p`` matches another exponent's step instead of SGD's (``sgd_lr`` is then the step size
    at ``reference_p``): equating the two first-order movements,

    .. math:: \eta_p = \eta_{r}\,\frac{p - 1}{r - 1}\,\mathrm{scale}^{\,p-r}.

    So ``matched_lr(lr, 2.0, scale, reference_p=1.1)`` is the SGD step that moves entries of that
    magnitude as far as ``lr`` at p = 1.1 does.

    It holds for one magnitude: entries smaller than ``scale`` move less than under SGD for p < 2 and
    more for p > 2, larger ones the other way round. At scale 0 (a zero-initialized bias) no step size
    matches: from w = 0 one step moves an entry by :math:`(\eta |g|)^{1/(p-1)}`, not in proportion to
    :math:`\eta |g|` (at p = 1.1, :math:`(\eta|g|)^{10}`: such entries barely move; at p = 3,
    :math:`\sqrt{\eta |g|}`), so ``scale`` must be > 0.

    Args:
        sgd_lr: the step size to match (of SGD, or of exponent ``reference_p``), finite and >= 0.
        p: the l_p exponent, finite and > 1 (:func:`check_p`).
        scale: the magnitude :math:`|w|` of the entries whose movement is matched, finite and > 0.
        reference_p: the exponent whose step ``sgd_lr`` is (2: SGD), finite and > 1.
    """
    p, reference_p = check_p(p), check_p(reference_p)
    try:
        sgd_lr, scale = float(sgd_lr), float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"sgd_lr and scale must be real numbers, got sgd_lr={sgd_lr!r}, scale={scale!r}") from None
    if not math.isfinite(sgd_lr) or sgd_lr < 0:
        raise ValueError(f"sgd_lr must be a finite number >= 0, got sgd_lr={sgd_lr!r}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0 (the magnitude |w| of the entries to match; at 0 no "
                         f"step size matches SGD, see the docstring), got scale={scale!r}")
    try:
        lr = sgd_lr * (p - 1.0) / (reference_p - 1.0) * scale ** (p - reference_p)
    except OverflowError:
        lr = math.inf
    if not math.isfinite(lr):
        raise ValueError(f"matched_lr overflows for sgd_lr={sgd_lr!r}, p={p!r}, scale={scale!r}: use a scale nearer 1")
    return lr


def matched_param_groups(params: Iterable[Tensor], lr: float, p: float, reference_p: float = 2.0,
                         zero_lr: float | None = None) -> list[dict]:
    r"""Param groups for :class:`~mdlib.optim.LpMirrorDescent` at exponent ``p``, one per tensor, each with
    the step size whose first step moves the tensor's entries of mean magnitude
    :math:`s = \operatorname{mean}|w|` (now, e.g. at initialization) as far as a step ``lr`` at exponent
    ``reference_p`` does (2: SGD): ``matched_lr(lr, p, s, reference_p)``.

    One global step size under mirror descent is a different effective step per tensor (an entry moves by
    about :math:`\eta |g| |w|^{2-p}/(p-1)`): at p = 1.1 a tensor of N(0, 1) entries moves about 8 times as
    far as under SGD at the same step, one of N(0, 0.02^2) entries a quarter as far. These groups give
    every tensor the movement that ``lr`` gives it at ``reference_p``, so that what is left between the
    two exponents is the geometry of the step, not how large a step each tensor gets. Porting an SGD
    script: ``LpMirrorDescent(matched_param_groups(model.parameters(), sgd_lr, p), lr=sgd_lr, p=p)``.

    A tensor whose entries are all zero (a zero-initialized bias) has no matching step (see
    :func:`matched_lr`): it gets ``zero_lr``, by default ``lr`` itself. Repeated tensors are kept once.

    Args:
        params: the tensors (e.g. ``model.parameters()``).
        lr: the step size at ``reference_p`` to match, finite and >= 0.
        p: the exponent of the optimizer the groups are for, finite and > 1.
        reference_p: the exponent whose step ``lr`` is, finite and > 1.
        zero_lr: the step of an all-zero tensor (None: ``lr``).
    """
    groups, seen = [], set()
    for w in params:
        if not isinstance(w, Tensor):
            raise TypeError(f"matched_param_groups takes tensors (e.g. model.parameters()), got {type(w).__name__}")
        if id(w) in seen:
            continue
        seen.add(id(w))
        scale = float(w.detach().abs().double().mean()) if w.numel() else 0.0
        step = matched_lr(lr, p, scale, reference_p) if scale > 0 else float(lr if zero_lr is None else zero_lr)
        groups.append({"params": [w], "lr": step})
    if not groups:
        raise ValueError("matched_param_groups got no tensors")
    return groups
