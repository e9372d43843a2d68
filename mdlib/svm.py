"""l_p max-margin problems: ``min ||w||_p s.t. A w >= 1`` and the attention and decoder SVMs.

The solver works on the dual. With q = p / (p - 1), the problem ``min ||w||_p^p / p s.t. A w >= 1``
(same minimizer as ``min ||w||_p``) has the dual

    max_{lambda >= 0}  D(lambda) = 1^T lambda - ||A^T lambda||_q^q / q,

smooth and concave with only bound constraints. The primal is recovered through the mirror map of
the conjugate, ``w = sign(u) |u|^(q-1)`` with ``u = A^T lambda``; the dual gradient is ``1 - A w``
and the Hessian is ``-A diag((q-1)|u|^(q-2)) A^T``. Every returned solution carries a certificate:
w is rescaled to ``min(A w) = 1`` (exactly feasible), the duality gap ``||w||_p^p / p - D(lambda)``
(>= 0) bounds its suboptimality, and gap and violation must be below the tolerance.

Method, per problem, compiled with numba (a batch is a loop over its problems; the first call of a
fresh install compiles, cached on disk afterwards; without numba the same code runs as interpreted
Python, with the same results):

1. p = 2 first. The dual is a quadratic program in G = A A^T, solved by the primal-dual active-set
   iteration F = {i: lambda_i G_ii >= (G lambda)_i - 1}, lambda_F = G_FF^-1 1, lambda = 0 off F
   (about five solves on the E1 problems).
2. Other p start there (p < 2: from the least-squares fit of A^T lambda to sign(w_2)|w_2|^(p-1) on
   the p = 2 support) and take damped Newton steps with the same active-set rule on
   H = A diag(h) A^T. For p < 2: Newton on the dual with a Levenberg term, an Armijo line search
   along the projection max(0, lambda + t d), and the best multiple of lambda. For p > 2 the map
   u -> |u|^(q-1) is not differentiable at 0, and Newton in lambda crawls when an entry of u is near
   0; the iteration keeps its own primal iterate and linearizes sign(w)|w|^(p-1) = A^T lambda in w
   (primal-dual steps), kept while the certificate's gap stays within a slack of the best one so
   far and otherwise replaced by a line-searched dual step.
3. A problem without a certificate is checked for feasibility with a linear program (scipy's
   HiGHS, only on this failure path): InfeasibleError if none, else ConvergenceError.

Every problem is solved scaled by a power of two c (exact in floating point) to max |A| in [1/2, 1):
A = c A' gives w = w' / c, lambda = lambda' c^-p and gap = gap' c^-p (relative gap and violation
unchanged), so entries like 1e-200 or 1e200, whose Gram matrix would under- or overflow, solve (and
are tested for feasibility) like entries of order 1.

The Newton systems (at most m x m, on the free set) are solved by Cholesky, or by LU with pivoting
when a pivot is not positive. Powers |x|^e with e within 1e-9 of n/2 or n/3 (q = 11 for p = 1.1,
7/3 for p = 1.75, 3/2 for p = 3) are a square or cube root and repeated squaring, not pow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Iterable

import numpy as np
from numpy.typing import ArrayLike

try:
    from numba import njit
except ImportError:  # no numba: the same functions run as interpreted Python (same results, far slower)
    njit = None

__all__ = [
    "ConvergenceError",
    "InfeasibleError",
    "MarginSolution",
    "attention_constraints",
    "attention_svm",
    "decoder_svm",
    "globally_optimal_tokens",
    "is_locally_optimal",
    "lp_margin",
    "support_tokens",
    "token_scores",
]

_AIM = 1e-2  # iterate to a relative gap of tol * _AIM (see lp_margin)
_SIGMA = 1e-4  # Armijo sufficient-increase constant
_SPAN = 1e10  # Hessian weights |x|^(negative) are capped at this multiple of their smallest value
_BACKTRACKS = 40  # halvings of a dual step before its line search gives up
_PD_TRIES = 4  # halvings of a primal-dual step before it is rejected
_PD_SLACK = 10.0  # a primal-dual step may raise the relative gap up to this multiple of the best one,
_PD_PATIENCE = 3  # for this many iterations after the best one; then it must improve on the best


class InfeasibleError(ValueError):
    """No w satisfies A w >= 1 (confirmed by a linear-programming feasibility check).

    ``problems`` lists the infeasible problems' batch indices ((0,) for a single problem).
    """

    def __init__(self, message: str, problems: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(int(b) for b in problems)


class ConvergenceError(RuntimeError):
    """The solver did not reach the requested certificate (relative gap and violation <= tol)."""


@dataclass(frozen=True)
class MarginSolution:
    """Certified solution of ``min ||w||_p s.t. A w >= 1`` (leading batch axis when batched).

    ``w`` is exactly feasible up to rounding; ``dual`` is lambda >= 0 of the dual above (the
    multipliers of ``min ||w||_p^p / p``); ``norm = ||w||_p``; ``gap = ||w||_p^p / p - D(dual)``;
    ``rel_gap = gap / (||w||_p^p / p)``; ``violation = max(0, max_i 1 - (A w)_i)``; ``iterations``
    counts Newton steps (the p = 2 warm start included).
    """

    w: np.ndarray
    dual: np.ndarray
    norm: np.ndarray | float
    gap: np.ndarray | float
    rel_gap: np.ndarray | float
    violation: np.ndarray | float
    iterations: np.ndarray | int


def _check_p(p) -> float:
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"p must be a real number in (1, inf), got {p!r}") from None
    if not (np.isfinite(p) and p > 1):
        raise ValueError(f"p must be in (1, inf), got {p}; p = 1 and p = inf are linear programs, not supported")
    return p


def _check_array(name: str, x, ndims: tuple[int, ...]) -> np.ndarray:
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.number) and not np.issubdtype(x.dtype, np.complexfloating)):
        raise ValueError(f"{name} must be a real numeric array, got dtype {x.dtype}")
    x = x.astype(np.float64, copy=False)
    if x.ndim not in ndims:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def _compiled(**options):
    """numba's ``njit(**options)``; without numba, the function itself."""
    return njit(**options) if njit is not None else (lambda function: function)


_jit = _compiled(cache=True, error_model="numpy")
# the small dense linear algebra: reassociated sums (vectorized dot products) and fused multiply-adds
_linalg = _compiled(cache=True, error_model="numpy", fastmath={"reassoc", "contract"})


@_linalg
def _matvec(A, x):
    """A x."""
    m, N = A.shape
    out = np.empty(m)
    for i in range(m):
        acc = 0.0
        for j in range(N):
            acc += A[i, j] * x[j]
        out[i] = acc
    return out


@_linalg
def _rmatvec(A, y):
    """A^T y."""
    m, N = A.shape
    out = np.zeros(N)
    for i in range(m):
        yi = y[i]
        if yi != 0.0:
            for j in range(N):
                out[j] += yi * A[i, j]
    return out


@_linalg
def _weighted_gram(A, idx, h):
    """A_F diag(h) A_F^T for the rows idx (symmetric, k x k)."""
    k, N = idx.size, A.shape[1]
    B = np.empty((k, N))
    for a in range(k):
        for j in range(N):
            B[a, j] = A[idx[a], j] * h[j]
    M = np.empty((k, k))
    for a in range(k):
        for b in range(a + 1):
            acc = 0.0
            for j in range(N):
                acc += B[a, j] * A[idx[b], j]
            M[a, b] = acc
            M[b, a] = acc
    return M


@_linalg
def _cholesky_solve(M, r):
    """Solve M x = r for a symmetric positive definite M by Cholesky: (x, True), or (r, False) when a
    pivot is not positive (M not numerically positive definite)."""
    k = M.shape[0]
    L = M.copy()
    for j in range(k):
        d = L[j, j]
        for s in range(j):
            d -= L[j, s] * L[j, s]
        if not d > 0.0:
            return r, False
        d = np.sqrt(d)
        L[j, j] = d
        for i in range(j + 1, k):
            acc = L[i, j]
            for s in range(j):
                acc -= L[i, s] * L[j, s]
            L[i, j] = acc / d
    x = r.copy()
    for i in range(k):
        acc = x[i]
        for s in range(i):
            acc -= L[i, s] * x[s]
        x[i] = acc / L[i, i]
    for i in range(k - 1, -1, -1):
        acc = x[i]
        for s in range(i + 1, k):
            acc -= L[s, i] * x[s]
        x[i] = acc / L[i, i]
    return x, True


@_jit
def _exponent(e):
    """(root, n) with e = n / root for root 1, 2 or 3 (within 1e-9 relative), else (0, 0): use pow."""
    for root in (1, 2, 3):
        n = round(root * e)
        if abs(root * e - n) <= 1e-9 * max(1.0, abs(e)) and abs(n) <= 96:
            return root, int(n)
    return 0, 0


@_jit
def _power(a, e):
    """a**e for a >= 0, elementwise: exponents n/2 and n/3 by a square or cube root and repeated squaring
    (within rounding of pow)."""
    root, n = _exponent(e)
    out = np.empty_like(a)
    if root == 0:
        for i in range(a.size):
            out[i] = a[i] ** e
        return out
    k = abs(n)
    for i in range(a.size):
        x = a[i]
        base = x if root == 1 else (math.sqrt(x) if root == 2 else np.cbrt(x))
        result = 1.0
        j = k
        while j:
            if j & 1:
                result *= base
            j >>= 1
            if j:
                base *= base
        out[i] = 1.0 / result if n < 0 else result
    return out


# The solver's own signed power, not mdlib.mirror's torch kernel: numba compiles only numpy and scalar
# code, and the solver runs in float64 with square and cube roots for exponents n/2 and n/3 (see
# _power), whose certified solutions (and the book's tables) come from this arithmetic. It is the one
# definition in this module: every sign(x)|x|^e here is _mirror, every |x|^e is _power.
@_jit
def _mirror(x, r):
    """sign(x) |x|^(r-1): the gradient of ||x||_r^r / r."""
    return np.sign(x) * _power(np.abs(x), r - 1)


@_jit
def _primal_value(Aw, wp, p):
    """||w / s||_p^p / p with s = min(A w) (inf where s <= 0), from ``Aw`` and ``wp = ||w||_p^p``."""
    s = Aw.min()
    return wp / (p * s**p) if s > 0 else np.inf


@_jit
def _certify(A, lam, u, wbar, use_wbar, p, q):
    """Certificate of an iterate: D(lambda+), the relative gap of the better primal candidate
    (mirror_q(A^T lambda+) or wbar), that candidate, A mirror_q(A^T lambda+) and A wbar."""
    if (lam < 0).any():
        lam = np.maximum(lam, 0.0)
        u = _rmatvec(A, lam)
    S = _power(np.abs(u), q).sum()  # = ||mirror_q(u)||_p^p
    D = lam.sum() - S / q
    w = _mirror(u, q)
    Aw = _matvec(A, w)
    P = _primal_value(Aw, S, p)
    Awbar = Aw
    if use_wbar:
        Awbar = _matvec(A, wbar)
        Pbar = _primal_value(Awbar, _power(np.abs(wbar), p).sum(), p)
        if Pbar < P:
            w, P = wbar.copy(), Pbar
    rel = (P - D) / P
    return D, (rel if np.isfinite(rel) else np.inf), w, Aw, Awbar


@_jit
def _solve_on(M, lam, free, rhs, mu):
    """Solve (M + mu diag M) d_F = rhs_F with M the free block (k x k); d = -lambda off F.
    Returns (d, ok)."""
    idx = np.flatnonzero(free)
    d = -lam.copy()
    k = idx.size
    if k == 0:
        return d, True
    for i in range(k):
        M[i, i] = max(M[i, i] * (1.0 + mu), 1e-300)
    r = np.empty(k)
    for i in range(k):
        r[i] = rhs[idx[i]]
    x, ok = _cholesky_solve(M, r)
    if not ok:  # not numerically positive definite: LU with pivoting
        try:
            x = np.linalg.solve(M, r)
        except Exception:
            return d, False
    for i in range(k):
        d[idx[i]] = x[i]
    return d, np.isfinite(x).all()


@_jit
def _gram_block(G, free):
    """G[F][:, F], the block of G on the free set."""
    idx = np.flatnonzero(free)
    k = idx.size
    M = np.empty((k, k))
    for i in range(k):
        for j in range(k):
            M[i, j] = G[idx[i], idx[j]]
    return M


@_jit
def _quadratic(G, tol, max_iter):
    """p = 2 by the primal-dual active-set method on G = A A^T, from lambda = G^-1 1 (every constraint
    free); stops at relative gap tol * _AIM. Returns (lambda+, iterations, ok)."""
    m = G.shape[0]
    ones = np.ones(m)
    lam, ok = _solve_on(G.copy(), np.zeros(m), ones > 0, ones, 1e-12)  # every constraint free
    if not ok:
        return ones, -1, False
    dG = np.diag(G).copy()
    for it in range(1, max_iter + 1):
        Glam = _matvec(G, lam)
        lp, Glp = lam, Glam
        if (lam < 0).any():
            lp = np.maximum(lam, 0.0)
            Glp = _matvec(G, lp)
        curv = lp @ Glp  # ||w||^2
        P = _primal_value(Glp, curv, 2.0)
        rel = (P - lp.sum() + curv / 2) / P
        if rel <= tol * _AIM:
            return lp, it, True
        if not np.isfinite(lam).all() or it == max_iter:
            break
        free = lam * dG >= Glam - 1
        lam, ok = _solve_on(_gram_block(G, free), np.zeros(m), free, ones, 1e-12)
        if not ok:
            break
    return lam, -1, False


@_jit
def _weights(x, exponent, factor):
    """factor |x|^exponent per entry; for exponent < 0, |x| is floored so that the entries span <= _SPAN."""
    ax = np.abs(x)
    if exponent < 0:
        ax = np.maximum(ax, _SPAN ** (1 / exponent) * ax.max())
    return factor * _power(ax, exponent)


@_jit
def _dual_value(lam, u, q):
    """D(lambda) = 1^T lambda - ||u||_q^q / q with u = A^T lambda."""
    return lam.sum() - _power(np.abs(u), q).sum() / q


@_jit
def _best_multiple(lam, u, q):
    """argmax_c D(c lambda) = c 1^T lambda - c^q ||u||_q^q / q, i.e. c = (1^T lambda / ||u||_q^q)^(1/(q-1))."""
    return (lam.sum() / _power(np.abs(u), q).sum()) ** (1 / (q - 1))


@_jit
def _newton_system(A, A2, p, q, pd, lam, u, wbar, Aw, Awbar):
    """The Newton system at the current primal: mirror_q(u) for a dual step, wbar for a primal-dual
    step (``pd``). Returns (h, the stationarity residual, the gradient, the free set, the right-hand side
    g + H lambda_A, the damping mu)."""
    m, N = A.shape
    if pd:
        h = _weights(wbar, 2 - p, 1 / (p - 1))
        resid = u - _mirror(wbar, p)  # stationarity residual
        cons = Awbar
        grad = 1 - cons - _matvec(A, h * resid)
    else:
        h = _weights(u, q - 2, q - 1)
        resid = np.zeros(N)
        cons = Aw
        grad = 1 - Aw
    free = lam * _matvec(A2, h) >= cons - 1
    rhs = grad + _matvec(A, h * _rmatvec(A, np.where(free, 0.0, lam)))  # g + H lambda_A
    if pd:
        mu = 1e-12
    else:
        mu = 0.0
        for i in range(m):
            if free[i]:
                mu = max(mu, abs(grad[i]))
        mu = min(max(mu, 1e-12), 1e-2)
    return h, resid, grad, free, rhs, mu


@_jit
def _primal_dual_step(A, p, q, lam, u, wbar, step, h, resid, D, best, since_best):
    """The primal-dual move: (unprojected) steps t = 1, 1/2, ... accepted within the gap slack; if none
    is, back to lambda+ for a dual step. Returns (lambda, u, wbar, accepted)."""
    du = _rmatvec(A, step)
    dw = h * (resid + du)
    t = 1.0
    for _ in range(_PD_TRIES):
        lam_t, u_t, wbar_t = lam + t * step, u + t * du, wbar + t * dw
        D_t, rel_t, _, _, _ = _certify(A, lam_t, u_t, wbar_t, True, p, q)
        slack = _PD_SLACK if since_best < _PD_PATIENCE else 1.0
        if rel_t < slack * best and (np.isfinite(best) or D_t > D):
            return lam_t, u_t, wbar_t, True
        t /= 2
    lam = np.maximum(lam, 0.0)  # rejected: back to a dual step from lambda+
    return lam, _rmatvec(A, lam), wbar, False


@_jit
def _dual_step(A, q, lam, u, step, grad, D):
    """The dual move: Armijo along max(0, lambda + t d), t = 1, 1/2, ..., then the best multiple.
    Returns (lambda, u, found); not found (stalled): lambda and u unchanged."""
    t = 1.0
    for _ in range(_BACKTRACKS):
        trial = np.maximum(0.0, lam + t * step)
        u_t = _rmatvec(A, trial)
        gain = grad @ (trial - lam)  # first-order increase along the projection arc
        if _dual_value(trial, u_t, q) - D >= _SIGMA * gain - 1e-14 * abs(D):
            c = _best_multiple(trial, u_t, q)
            return trial * c, u_t * c, True
        t /= 2
    return lam, u, False


@_jit
def _newton(A, p, lam, tol, max_iter):
    """Damped Newton from ``lam`` >= 0 until the relative gap is <= tol * _AIM (see the module
    docstring): for p > 2 primal-dual steps alternating with dual steps, else dual steps with a line
    search. Returns (lambda+, w, iterations, converged)."""
    N = A.shape[1]
    q = p / (p - 1)
    primal_dual = p > 2.0
    A2 = A * A
    u = _rmatvec(A, lam)
    c = _best_multiple(lam, u, q)
    lam, u = lam * c, u * c
    wbar = _mirror(u, q) if primal_dual else np.zeros(N)
    pd = primal_dual  # next step is primal-dual (else dual with line search)
    best = np.inf  # smallest relative gap so far
    since_best = 0  # iterations since the best one
    for it in range(max_iter + 1):
        D, rel, w, Aw, Awbar = _certify(A, lam, u, wbar, primal_dual, p, q)
        since_best = 0 if rel < best else since_best + 1
        best = min(best, rel)
        if rel <= tol * _AIM and np.isfinite(D):
            return np.maximum(lam, 0.0), w, it, True
        if not np.isfinite(D) or it == max_iter:
            break
        h, resid, grad, free, rhs, mu = _newton_system(A, A2, p, q, pd, lam, u, wbar, Aw, Awbar)
        step, ok = _solve_on(_weighted_gram(A, np.flatnonzero(free), h), lam, free, rhs, mu)
        if not ok:
            break
        accepted = False
        if pd:
            lam, u, wbar, accepted = _primal_dual_step(A, p, q, lam, u, wbar, step, h, resid, D, best, since_best)
        else:
            lam, u, found = _dual_step(A, q, lam, u, step, grad, D)
            if not found:
                break  # stalled
        if primal_dual:
            if not accepted:  # after a dual step or a rejected primal-dual step: resynchronize wbar
                wbar = _mirror(u, q)
            pd = (not pd) or accepted
    return np.maximum(lam, 0.0), np.zeros(N), -1, False


@_jit
def _solve_all(A3, p, tol, max_iter):
    """Every problem of A3 (b, m, N): the p = 2 active-set start, then Newton for p != 2.
    Returns (lambda (b, m), w (b, N), iterations (b,), converged (b,))."""
    b, m, N = A3.shape
    lams = np.zeros((b, m))
    ws = np.zeros((b, N))
    its = np.full(b, -1)
    oks = np.zeros(b, dtype=np.bool_)
    for k in range(b):
        A = np.ascontiguousarray(A3[k])
        G = _weighted_gram(A, np.arange(m), np.ones(N))  # A A^T
        lam, it, ok = _quadratic(G, tol if p == 2.0 else max(tol, 1e-6), max_iter)
        if not ok:  # the active-set iteration can stall on singular A A^T; the damped one cannot
            lam, _, it2, ok = _newton(A, 2.0, np.ones(m), tol, max_iter)
            it = max_iter + it2
            if not ok:
                continue
        if p < 2.0:  # start from the least-squares fit of A^T lambda to mirror_p(w_2) on the p = 2 support
            free = lam > 0
            target = _matvec(A, _mirror(_rmatvec(A, lam), p))
            fit, fit_ok = _solve_on(_gram_block(G, free), np.zeros(m), free, target, 1e-12)
            if fit_ok and (fit > 0).any():
                lam = np.maximum(fit, 0.0)
        if p == 2.0:
            w = _rmatvec(A, lam)
        else:
            lam, w, it3, ok = _newton(A, p, lam, tol, max_iter)
            it += it3
        lams[k], ws[k], its[k], oks[k] = lam, w, it, ok
    return lams, ws, its, oks


def _feasible(A: np.ndarray) -> bool | None:
    """Whether some w has A w >= 1, by a linear program (None if the LP solver cannot tell)."""
    from scipy.optimize import linprog

    m, N = A.shape
    status = linprog(np.zeros(N), A_ub=-A, b_ub=-np.ones(m), bounds=(None, None), method="highs").status
    return {0: True, 2: False}.get(status)


def _fail(A: np.ndarray, failed: np.ndarray, batched: bool, p: float, reason: str):
    """Raise InfeasibleError for the failed problems an LP proves infeasible, else ConvergenceError."""
    verdict = {int(b): _feasible(A[b]) for b in failed}
    where = (lambda bs: f"problems {bs} of the batch") if batched else (lambda bs: "the problem")
    infeasible = [b for b, ok in verdict.items() if ok is False]
    if infeasible:
        raise InfeasibleError(
            f"A w >= 1 has no solution for {where(infeasible)}: the constraints are infeasible (a linear "
            "program confirms it), e.g. a zero row or rows a and -a. For an attention SVM, the selected "
            "tokens alpha cannot be separated from the others (duplicate tokens, or T - 1 > d with n "
            "examples sharing too few dimensions); choose other tokens.",
            problems=infeasible,
        )
    raise ConvergenceError(f"l_{p:g} margin solver did not converge for {where(sorted(verdict))}: {reason}")


def _certificate(A: np.ndarray, lam: np.ndarray, w: np.ndarray, p: float):
    """Rescale w to min(A w) = 1; return (w, ||w||_p, gap, relative gap, violation) per problem.

    Plain numpy over the batch, independent of the compiled solver that proposed (lambda, w)."""
    q = p / (p - 1)
    w = w / np.einsum("bmn,bn->bm", A, w).min(axis=1)[:, None]
    norm = np.sum(np.abs(w) ** p, axis=1) ** (1 / p)
    primal = norm**p / p
    gap = primal - (lam.sum(axis=1) - np.sum(np.abs(np.einsum("bm,bmn->bn", lam, A)) ** q, axis=1) / q)
    violation = np.maximum(0.0, np.max(1 - np.einsum("bmn,bn->bm", A, w), axis=1))
    return w, norm, gap, gap / primal, violation


def lp_margin(A: ArrayLike, p: float, *, tol: float = 1e-8, max_iter: int = 200) -> MarginSolution:
    r"""Solve :math:`\min \|w\|_p` subject to :math:`A w \ge 1` for A of shape (m, N), or B problems at
    once for (B, m, N).

    Solves the dual, with :math:`q = p / (p - 1)`,

    .. math:: \max_{\lambda \ge 0}\ D(\lambda) = \mathbf 1^\top \lambda - \|A^\top \lambda\|_q^q / q,

    and recovers :math:`w = \operatorname{sign}(u)|u|^{q-1}`, :math:`u = A^\top \lambda` (see the module docstring). The returned w
    satisfies ``min(A w) = 1`` and its relative duality gap and violation are <= tol, else
    ConvergenceError; the iteration aims at tol / 100 because the gap pins w less tightly (an entry
    near 0 moves the objective like :math:`|\delta|^{\max(p, 2)}`). Raises InfeasibleError (a ValueError) when no
    w satisfies the constraints, ValueError for bad input or a w beyond float64's range. More
    constraints than unknowns (A A^T singular) is supported but slow, and for p >= 4 may need a
    larger max_iter. Any scale of A solves alike (see the module docstring); ``dual`` and ``gap``
    scale like max|A|^-p and may under- or overflow at extreme scales where w does not.
    """
    A = _check_array("A", A, (2, 3))
    p = _check_p(p)
    if not (isinstance(tol, Real) and 0 < tol < 1):
        raise ValueError(f"tol must be a number in (0, 1), got {tol!r}")
    if not (isinstance(max_iter, Integral) and max_iter >= 1):
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    batched = A.ndim == 3
    A3 = np.ascontiguousarray(A if batched else A[None])
    zero = np.flatnonzero(~np.any(A3 != 0, axis=2).all(axis=1))
    if len(zero):
        _fail(A3, zero, batched, p, "a zero row")
    _, exponent = np.frexp(np.abs(A3).max(axis=(1, 2)))  # max |A| = m 2^e with m in [1/2, 1)
    A3 = np.ldexp(A3, -exponent[:, None, None])
    lam, w, iterations, ok = _solve_all(A3, p, tol, max_iter)
    if not ok.all():
        _fail(A3, np.flatnonzero(~ok), batched, p, f"relative gap still above {tol:g} (iteration limit "
              f"{max_iter}, or the line search stalled at the limit of float64)")
    w, norm, gap, rel_gap, violation = _certificate(A3, lam, w, p)
    bad = np.flatnonzero(~((rel_gap <= tol) & (violation <= tol)))
    if len(bad):
        _fail(A3, bad, batched, p, f"final relative gap {rel_gap[bad].max():.2e}, violation {violation[bad].max():.2e}")
    with np.errstate(over="ignore"):
        w, norm = np.ldexp(w, -exponent[:, None]), np.ldexp(norm, -exponent)
    if not np.isfinite(w).all():
        raise ValueError(f"the solution exceeds float64's range (w is about 1 / max|A|, and max|A| < "
                         f"2^{exponent.min()}); scale A up")
    power = -p * exponent  # lambda and the gap scale by 2^power: ldexp for the integer part (0 stays 0)
    whole = np.round(power)
    with np.errstate(over="ignore", under="ignore"):  # documented: they may leave float64's range
        lam = np.ldexp(lam * np.exp2(power - whole)[:, None], whole.astype(int)[:, None])
        gap = np.ldexp(gap * np.exp2(power - whole), whole.astype(int))
    if batched:
        return MarginSolution(w, lam, norm, gap, rel_gap, violation, iterations)
    return MarginSolution(w[0], lam[0], float(norm[0]), float(gap[0]), float(rel_gap[0]), float(violation[0]),
                          int(iterations[0]))


def _check_tokens(X, alpha, *extra):
    """Validate X (..., n, T, d) and alpha (..., n) ints in [0, T); return them with the extras."""
    X = _check_array("X", X, (3, 4))
    *lead, n, T, _ = X.shape
    if T < 2:
        raise ValueError(f"X needs at least 2 tokens per example (shape {X.shape})")
    alpha = np.asarray(alpha)
    if alpha.shape != (*lead, n) or not np.issubdtype(alpha.dtype, np.integer):
        raise ValueError(f"alpha must be an integer array of shape {(*lead, n)}, got {alpha.dtype} {alpha.shape}")
    if alpha.min() < 0 or alpha.max() >= T:
        raise ValueError(f"alpha must index tokens 0..{T - 1}, got values in [{alpha.min()}, {alpha.max()}]")
    checked = []
    for name, value, shape in extra:
        value = _check_array(name, value, (len(shape),))
        if value.shape != shape:
            raise ValueError(f"{name} must have shape {shape} to match X {X.shape}, got {value.shape}")
        checked.append(value)
    return X, alpha, checked


def _others(alpha: np.ndarray, T: int) -> np.ndarray:
    """Indices of the T - 1 tokens t != alpha_i, ascending: (..., n, T-1)."""
    t = np.arange(T - 1)
    return t + (t >= alpha[..., None])


def attention_constraints(X: ArrayLike, z: ArrayLike, alpha: ArrayLike) -> np.ndarray:
    r"""Constraint matrix of the attention SVM: rows :math:`\operatorname{vec}((x_{i\alpha_i} - x_{it}) z_i^\top)`, :math:`t \ne \alpha_i`.

    X (n, T, d) tokens, z (n, d) comparison tokens, alpha (n,) selected tokens; vec is row-major, so
    row (i, t) times vec(W) is (x_{i,alpha_i} - x_it)^T W z_i. Returns (n (T-1), d d), rows ordered
    by example then token; leading batch dimensions (B, n, T, d) give (B, n (T-1), d d).
    """
    X, alpha, _ = _check_tokens(X, alpha)
    *lead, n, T, d = X.shape
    z = _check_array("z", z, (len(lead) + 2,))
    if z.shape != (*lead, n, d):
        raise ValueError(f"z must have shape {(*lead, n, d)} to match X {X.shape}, got {z.shape}")
    chosen = np.take_along_axis(X, alpha[..., None, None], axis=-2)  # (..., n, 1, d)
    others = np.take_along_axis(X, _others(alpha, T)[..., None], axis=-2)  # (..., n, T-1, d)
    rows = (chosen - others)[..., :, None] * z[..., None, None, :]  # (..., n, T-1, d, d)
    return rows.reshape(*lead, n * (T - 1), d * d)


def attention_svm(X: ArrayLike, z: ArrayLike, alpha: ArrayLike, p: float, **solver_kw: float) -> np.ndarray:
    r"""The attention SVM of the :math:`\ell_p` geometry:

    .. math:: W^{mm}_p = \arg\min_W \|W\|_p \quad\text{s.t.}\quad (x_{i\alpha_i} - x_{it})^\top W z_i \ge 1
              \ \text{for all } i \text{ and } t \ne \alpha_i

    (entrywise norm). Shapes as in :func:`attention_constraints`; returns W (d, d), or (B, d, d) for batched input.
    ``solver_kw`` goes to `lp_margin` (tol, max_iter).
    """
    A = attention_constraints(X, z, alpha)
    d = np.shape(X)[-1]
    return lp_margin(A, p, **solver_kw).w.reshape(*A.shape[:-2], d, d)


def decoder_svm(X: ArrayLike, y: ArrayLike, alpha: ArrayLike, p: float, **solver_kw: float) -> np.ndarray:
    r"""The decoder SVM :math:`v^{mm}_p = \arg\min_v \|v\|_p` s.t. :math:`y_i x_{i\alpha_i}^\top v \ge 1`:
    shape (d,), or (B, d) for batched input."""
    X, alpha, (y,) = _check_tokens(X, alpha, ("y", y, np.shape(alpha)))
    chosen = np.take_along_axis(X, alpha[..., None, None], axis=-2)[..., 0, :]  # (..., n, d)
    return lp_margin(y[..., None] * chosen, p, **solver_kw).w


def token_scores(X: ArrayLike, y: ArrayLike, v: ArrayLike) -> np.ndarray:
    r"""The token scores :math:`\gamma_{it} = y_i v^\top x_{it}`: (n, T), or (B, n, T) for batched X (B, n, T, d), y (B, n), v (B, d)."""
    X = _check_array("X", X, (3, 4))
    *lead, n, _, d = X.shape
    y = _check_array("y", y, (len(lead) + 1,))
    v = _check_array("v", v, (len(lead) + 1,))
    if y.shape != (*lead, n) or v.shape != (*lead, d):
        raise ValueError(f"y must have shape {(*lead, n)} and v {(*lead, d)} for X {X.shape}; got {y.shape}, {v.shape}")
    return y[..., None] * np.einsum("...ntd,...d->...nt", X, v)


def globally_optimal_tokens(X: ArrayLike, y: ArrayLike, v: ArrayLike) -> np.ndarray:
    r""":math:`\mathrm{opt}_i = \arg\max_t \gamma_{it}`, the globally optimal token of each example: (n,) or (B, n) ints."""
    return np.argmax(token_scores(X, y, v), axis=-1)


def support_tokens(X: ArrayLike, z: ArrayLike, alpha: ArrayLike, W: ArrayLike, tol: float = 1e-6) -> np.ndarray:
    r"""Tokens whose attention-SVM constraint is tight at W: :math:`|(x_{i\alpha_i} - x_{it})^\top W z_i - 1| \le` ``tol``.

    W must be scaled as W_mm (smallest margin 1). Returns a boolean mask (n, T) (or (B, n, T));
    the selected tokens alpha_i are never support tokens.
    """
    X, alpha, _ = _check_tokens(X, alpha)
    *lead, n, _, d = X.shape
    W = _check_array("W", W, (len(lead) + 2,))
    if W.shape != (*lead, d, d):
        raise ValueError(f"W must have shape {(*lead, d, d)} for X {X.shape}, got {W.shape}")
    z = _check_array("z", z, (len(lead) + 2,))
    if z.shape != (*lead, n, d):
        raise ValueError(f"z must have shape {(*lead, n, d)} to match X {X.shape}, got {z.shape}")
    chosen = np.take_along_axis(X, alpha[..., None, None], axis=-2)  # (..., n, 1, d)
    margins = np.einsum("...ntk,...kl,...nl->...nt", chosen - X, W, z)
    tight = np.abs(margins - 1) <= tol
    np.put_along_axis(tight, alpha[..., None], False, axis=-1)
    return tight


def is_locally_optimal(X: ArrayLike, y: ArrayLike, z: ArrayLike, v: ArrayLike, alpha: ArrayLike, p: float,
                       **solver_kw: float) -> bool | np.ndarray:
    r"""Definition 3 of the paper: alpha is locally optimal for (X, y, z, v) in the l_p geometry.

    True when the attention SVM for alpha is feasible and every example's selected token scores
    above its support tokens: :math:`\gamma_{i\alpha_i} > \gamma_{it}` for every support token t of :math:`W^{mm}_p`.
    Returns a bool, or a (B,) bool array for batched input.
    """
    X, alpha, _ = _check_tokens(X, alpha)
    batched = X.ndim == 4
    gamma = token_scores(X, y, v)
    A = attention_constraints(X, z, alpha)
    feasible = np.ones(X.shape[0] if batched else 1, dtype=bool)
    try:
        W = lp_margin(A, p, **solver_kw).w
    except InfeasibleError as err:
        feasible[list(err.problems)] = False
        if not feasible.any():
            return feasible if batched else False
        keep = np.flatnonzero(feasible)
        W = np.zeros((len(feasible), A.shape[-1]))
        W[keep] = lp_margin(A[keep], p, **solver_kw).w
    d = X.shape[-1]
    W = W.reshape(*X.shape[:-3], d, d)
    support = support_tokens(X, z, alpha, W)
    chosen = np.take_along_axis(gamma, alpha[..., None], axis=-1)
    ok = feasible & np.all(~support | (gamma < chosen), axis=(-2, -1)).reshape(feasible.shape)
    return ok if batched else bool(ok[0])
