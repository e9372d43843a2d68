"""l_p max-margin problems: ``min ||w||_p s.t. A w >= 1`` and the attention and decoder SVMs.

The solver works on the dual. With q = p / (p - 1), the problem ``min ||w||_p^p / p s.t. A w >= 1``
(same minimizer as ``min ||w||_p``) has the dual

    max_{lambda >= 0}  D(lambda) = 1^T lambda - ||A^T lambda||_q^q / q,

smooth and concave with only bound constraints. The primal is recovered through the mirror map of
the conjugate, ``w = sign(u) |u|^(q-1)`` with ``u = A^T lambda``; the dual gradient is ``1 - A w``
and the Hessian is ``-A diag((q-1)|u|^(q-2)) A^T``. Every returned solution carries a certificate:
w is rescaled to ``min(A w) = 1`` (exactly feasible), the duality gap ``||w||_p^p / p - D(lambda)``
(>= 0) bounds its suboptimality, and gap and violation must be below the tolerance.

Method, batched over a leading axis with numpy's stacked linear algebra (converged problems drop
out; the Newton systems of a batch are grouped by the size of their free sets):

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

Powers |x|^e with e within 1e-9 of a multiple of 1/2 (q = 11 for p = 1.1, q = 1.5 for p = 3) are
evaluated by repeated squaring and one sqrt (`_pow`) instead of np.power.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

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
_BACKTRACKS = 40  # halvings of a dual step before its line search gives up (a multiple of 8)
_PD_TRIES = 4  # halvings of a primal-dual step before it is rejected
_GROUPS = 3  # at most this many free-set-size groups per Newton solve
_PD_SLACK = 10.0  # a primal-dual step may raise the relative gap up to this multiple of the best one,
_PD_PATIENCE = 3  # for this many iterations after the best one; then it must improve on the best


class InfeasibleError(ValueError):
    """No w satisfies A w >= 1 (confirmed by a linear-programming feasibility check).

    ``problems`` lists the infeasible problems' batch indices ((0,) for a single problem).
    """

    def __init__(self, message: str, problems=()):
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


def _pow(a: np.ndarray, e: float) -> np.ndarray:
    """a^e for a >= 0. Exponents within 1e-9 of a multiple of 1/2 (q = 11 for p = 1.1, 1.5 for p = 3)
    use products of repeated squares and one sqrt, several times cheaper than np.power (and within
    rounding of it: the exponent moves by at most 1e-9 |e|, ~1e-15 for the q of a decimal p)."""
    twice = round(2 * e)
    if abs(2 * e - twice) > 1e-9 * max(1.0, abs(e)) or abs(twice) > 64:
        return a**e
    k = abs(twice) // 2
    out = np.sqrt(a) if twice % 2 else None
    square = a
    while k:
        if k & 1:
            out = square if out is None else out * square
        k >>= 1
        if k:
            square = square * square
    if out is None:
        out = np.ones_like(a)
    return 1 / out if twice < 0 else out


def _mirror(x: np.ndarray, r: float) -> np.ndarray:
    """sign(x) |x|^(r-1): the gradient of ||x||_r^r / r."""
    return np.copysign(_pow(np.abs(x), r - 1), x)


def _rowvec(lam: np.ndarray, A: np.ndarray) -> np.ndarray:
    """Batched A^T lambda: (b, m), (b, m, N) -> (b, N)."""
    return np.matmul(lam[:, None, :], A)[:, 0]


def _matvec(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Batched A x: (b, m, N), (b, N) -> (b, m)."""
    return np.matmul(A, x[:, :, None])[:, :, 0]


def _primal_value(Aw: np.ndarray, wp: np.ndarray, p: float) -> np.ndarray:
    """||w / s||_p^p / p with s = min(A w) (inf where s <= 0), from ``Aw`` and ``wp = ||w||_p^p``."""
    s = Aw.min(axis=1)
    value = wp / (p * _pow(s, p))
    return np.where(s > 0, value, np.inf)


def _scale(lam: np.ndarray, u: np.ndarray, q: float) -> np.ndarray:
    """Best multiple c of each row of lambda: argmax_c c 1^T lambda - c^q ||u||_q^q / q, as (b, 1)."""
    return ((lam.sum(axis=1) / np.sum(_pow(np.abs(u), q), axis=1)) ** (1 / (q - 1)))[:, None]


def _weights(x: np.ndarray, exponent: float, factor: float) -> np.ndarray:
    """factor |x|^exponent per entry; for exponent < 0, |x| is floored so that a row spans <= _SPAN."""
    ax = np.abs(x)
    if exponent < 0:
        ax = np.maximum(ax, _SPAN ** (1 / exponent) * ax.max(axis=1, keepdims=True))
    return factor * _pow(ax, exponent)


def _certify(A, lam, u, wbar, p: float, q: float):
    """Certificate of an iterate: D(lambda+), the relative gap of the better primal candidate
    (mirror_q(A^T lambda+) or wbar), that candidate, A mirror_q(A^T lambda+) and A wbar.

    ``u = A^T lambda``; rows with negative entries (primal-dual iterates) are projected first.
    """
    if (lam < 0).any():
        lam = np.maximum(lam, 0.0)
        u = _rowvec(lam, A)
    S = np.sum(_pow(np.abs(u), q), axis=1)  # = ||mirror_q(u)||_p^p
    D = lam.sum(axis=1) - S / q
    w = _mirror(u, q)
    Aw = _matvec(A, w)
    P = _primal_value(Aw, S, p)
    Awbar = None
    if wbar is not None:
        Awbar = _matvec(A, wbar)
        Pbar = _primal_value(Awbar, np.sum(_pow(np.abs(wbar), p), axis=1), p)
        w = np.where((Pbar < P)[:, None], wbar, w)
        P = np.minimum(P, Pbar)
    rel = (P - D) / P
    return D, np.where(np.isfinite(rel), rel, np.inf), w, Aw, Awbar


def _solve_free(H, lam, free, rhs_free, mu):
    """Solve (H_FF + mu diag H_FF) d_F = rhs_F on each row's free set F; d = -lambda off F.

    ``H(rows, idx)`` returns the (len(rows), k, k) blocks of the given batch rows at indices ``idx``.
    Rows are grouped by free-set size (a group's blocks are padded to its largest set with identity
    rows), so that a few large free sets do not inflate every problem's solve.
    """
    nfree = free.sum(axis=1)
    order = np.argsort(nfree, kind="stable")
    step = -lam
    for rows in np.array_split(order, max(1, min(_GROUPS, len(order) // 32))):
        k = max(int(nfree[rows[-1]]), 1)
        idx = np.argsort(~free[rows], axis=1, kind="stable")[:, :k]  # free indices first, then padding
        isfree = np.take_along_axis(free[rows], idx, axis=1)
        M = H(rows, idx)
        diag = np.arange(k)
        Mdiag = M[:, diag, diag]
        M *= isfree[:, :, None] & isfree[:, None, :]
        M[:, diag, diag] = np.where(isfree, np.maximum(Mdiag * (1 + mu[rows, None]), 1e-300), 1.0)  # > 0
        rhs = np.where(isfree, np.take_along_axis(rhs_free[rows], idx, axis=1),
                       -np.take_along_axis(lam[rows], idx, axis=1))
        step[rows[:, None], idx] = np.linalg.solve(M, rhs[:, :, None])[:, :, 0]
    return step


def _block_of(G: np.ndarray):
    """The `_solve_free` block function of a stack of matrices G (b, m, m): G[rows][:, idx][:, :, idx]."""
    b, m, _ = G.shape
    flat = G.reshape(-1)
    return lambda rows, idx: flat.take(((rows * m)[:, None, None] + idx[:, :, None]) * m + idx[:, None, :])


def _quadratic(A: np.ndarray, tol: float, max_iter: int):
    """p = 2 by the primal-dual active-set method on G = A A^T.

    From lambda = G^-1 1 (every constraint free), iterates F = {i: lambda_i G_ii >= (G lambda)_i - 1},
    lambda_F = G_FF^-1 1, lambda_A = 0; the certificate uses w = A^T lambda+. Returns (lambda+, G,
    iterations, converged), iterations -1 where it did not converge; it stops at relative gap
    tol * _AIM.
    """
    b, m, _ = A.shape
    G = np.matmul(A, A.transpose(0, 2, 1))
    out_lam, out_it = np.ones((b, m)), np.full(b, -1)
    live, Gl, dG = np.arange(b), G, np.einsum("bii->bi", G)
    ones = np.ones((b, m))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        reg = G.copy()
        reg[:, np.arange(m), np.arange(m)] *= 1 + 1e-12
        lam = np.linalg.solve(reg, ones[:, :, None])[:, :, 0]
        for it in range(1, max_iter + 1):
            Glam = _matvec(Gl, lam)
            lp, Glp = lam, Glam  # A w for w = A^T lambda+
            if (lam < 0).any():
                lp = np.maximum(lam, 0.0)
                Glp = _matvec(Gl, lp)
            curv = np.sum(lp * Glp, axis=1)  # ||w||^2
            P = _primal_value(Glp, curv, 2.0)
            rel = (P - lp.sum(axis=1) + curv / 2) / P
            done = rel <= tol * _AIM
            out_lam[live[done]], out_it[live[done]] = lp[done], it
            keep = ~done & np.all(np.isfinite(lam), axis=1)
            if it == max_iter or not keep.any():
                break
            if not keep.all():
                live, Gl, dG, lam, Glam, ones = (x[keep] for x in (live, Gl, dG, lam, Glam, ones))
            free = lam * dG >= Glam - 1
            lam = _solve_free(_block_of(Gl), np.zeros_like(lam), free, ones, np.full(len(live), 1e-12))
    return out_lam, G, out_it, out_it >= 0


def _armijo(trial, u_trial, lam, grad, D, q: float) -> np.ndarray:
    """Armijo test of D(trial) >= D(lambda) + sigma * (first-order increase), any leading shape."""
    gain = np.sum(grad * (trial - lam), axis=-1)  # first-order increase along the projection arc
    D_trial = trial.sum(axis=-1) - np.sum(_pow(np.abs(u_trial), q), axis=-1) / q
    return D_trial - D >= _SIGMA * gain - 1e-14 * np.abs(D)


def _newton(A: np.ndarray, p: float, lam: np.ndarray, tol: float, max_iter: int):
    """Batched damped Newton from ``lam`` >= 0 (b, m) until the relative gap is <= tol * _AIM.

    Each step linearizes the primal w(lambda) and solves an active-set Newton system: with h the
    derivative of the linearized map u -> w, H = A diag(h) A^T and g = 1 - A w_lin (the dual
    gradient when w_lin = mirror_q(A^T lambda)), the free set is F = {i: lambda_i H_ii >= (A w)_i - 1},
    lambda_A -> 0 and (H_FF + mu diag H_FF) d_F = g_F + H_FA lambda_A. Dual steps (p <= 2, and p > 2
    after a rejected primal-dual step) linearize u -> mirror_q(u), use mu = min(1e-2, |g_F|_inf) and
    an Armijo search on D along max(0, lambda + t d), then take the best multiple of lambda.
    Primal-dual steps (p > 2) keep a primal iterate wbar (from mirror_q(A^T lambda)), linearize
    w -> mirror_p(w) = A^T lambda there and take t = 1, 1/2, ... once the relative gap stays below
    _PD_SLACK times the best so far (below the best after _PD_PATIENCE iterations without a new
    best). Returns (lambda+, w, iterations, converged); w is the certified primal before rescaling;
    problems that stall, overflow or run out of iterations come back with converged False.
    """
    b, _, N = A.shape
    q = p / (p - 1)
    primal_dual = p > 2.0
    out_lam, out_w, out_it = lam.copy(), np.zeros((b, N)), np.full(b, -1)
    live = np.arange(b)  # working row -> problem
    A2 = A * A
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        u = _rowvec(lam, A)
        c = _scale(lam, u, q)
        lam, u = lam * c, u * c
        wbar = _mirror(u, q) if primal_dual else None
        pd = np.full(b, primal_dual)  # next step is primal-dual (else dual with line search)
        stalled = np.zeros(b, dtype=bool)
        best = np.full(b, np.inf)  # smallest relative gap so far
        since_best = np.zeros(b, dtype=int)  # iterations since the best one
        for it in range(max_iter + 1):
            D, rel, w, Aw, Awbar = _certify(A, lam, u, wbar if primal_dual else None, p, q)
            since_best = np.where(rel < best, 0, since_best + 1)
            best = np.minimum(best, rel)
            done = (rel <= tol * _AIM) & np.isfinite(D)
            out_lam[live[done]], out_w[live[done]], out_it[live[done]] = np.maximum(lam[done], 0.0), w[done], it
            keep = ~done & np.isfinite(D) & ~stalled
            if it == max_iter or not keep.any():
                break
            if not keep.all():
                live, A, A2, lam, u, D, Aw, best, since_best, pd, stalled = (
                    x[keep] for x in (live, A, A2, lam, u, D, Aw, best, since_best, pd, stalled))
                if primal_dual:
                    wbar, Awbar = wbar[keep], Awbar[keep]
            b = len(live)
            # Newton system at the current primal: mirror_q(u) (dual steps) or wbar (primal-dual steps)
            h = _weights(u, q - 2, q - 1)
            cons = Aw
            grad = 1 - Aw
            if primal_dual:
                h = np.where(pd[:, None], _weights(wbar, 2 - p, 1 / (p - 1)), h)
                resid = np.where(pd[:, None], u - _mirror(wbar, p), 0.0)  # stationarity residual
                cons = np.where(pd[:, None], Awbar, Aw)
                grad = 1 - cons - _matvec(A, h * resid)
            free = lam * _matvec(A2, h) >= cons - 1
            rhs = grad + _matvec(A, h * _rowvec(np.where(free, 0.0, lam), A))  # g + H lambda_A
            mu = np.where(pd, 1e-12, np.clip(np.abs(np.where(free, grad, 0.0)).max(axis=1), 1e-12, 1e-2))

            def block(rows, idx):
                AF = A.reshape(-1, A.shape[2]).take(rows[:, None] * A.shape[1] + idx, axis=0)
                return np.matmul(AF * h[rows, None, :], AF.transpose(0, 2, 1))

            step = _solve_free(block, lam, free, rhs, mu)
            new_lam, new_u = lam.copy(), u.copy()
            accepted = np.zeros(b, dtype=bool)
            j = np.flatnonzero(pd)
            if len(j):  # primal-dual: (unprojected) steps t = 1, 1/2, ... within the gap slack
                Aj = A if len(j) == b else A[j]
                du = _rowvec(step[j], Aj)
                dw = h[j] * (resid[j] + du)
                t = 1.0
                for _ in range(_PD_TRIES):
                    lam_t, u_t, wbar_t = lam[j] + t * step[j], u[j] + t * du, wbar[j] + t * dw
                    D_t, rel_t, *_ = _certify(Aj, lam_t, u_t, wbar_t, p, q)
                    slack = np.where(since_best[j] < _PD_PATIENCE, _PD_SLACK, 1.0)
                    ok = (rel_t < slack * best[j]) & (np.isfinite(best[j]) | (D_t > D[j]))
                    new_lam[j[ok]], new_u[j[ok]], wbar[j[ok]] = lam_t[ok], u_t[ok], wbar_t[ok]
                    accepted[j[ok]] = True
                    if ok.all():
                        break
                    j, Aj, du, dw, t = j[~ok], Aj[~ok], du[~ok], dw[~ok], t / 2
                else:  # rejected: back to a dual step from lambda+
                    new_lam[j] = np.maximum(lam[j], 0.0)
                    new_u[j] = _rowvec(new_lam[j], Aj)
            j = np.flatnonzero(~pd)
            if len(j):  # dual: Armijo along max(0, lambda + t d), t = 1 then 8 halvings at a time; rescale
                Aj = A if len(j) == b else A[j]
                trial = np.maximum(0.0, lam[j] + step[j])
                u_t = _rowvec(trial, Aj)
                ok = _armijo(trial, u_t, lam[j], grad[j], D[j], q)
                for first in range(1, _BACKTRACKS, 8):
                    f = np.flatnonzero(~ok)
                    if not len(f):
                        break
                    t = 0.5 ** np.arange(first, first + 8)[:, None]
                    trials = np.maximum(0.0, lam[j[f], None, :] + t * step[j[f], None, :])  # (f, 8, m)
                    u_trials = np.matmul(trials, Aj[f])
                    passed = _armijo(trials, u_trials, lam[j[f], None, :], grad[j[f], None, :], D[j[f], None], q)
                    hit = np.flatnonzero(passed.any(axis=1))
                    longest = passed[hit].argmax(axis=1)
                    trial[f[hit]], u_t[f[hit]], ok[f[hit]] = trials[hit, longest], u_trials[hit, longest], True
                c = _scale(trial[ok], u_t[ok], q)
                new_lam[j[ok]], new_u[j[ok]] = trial[ok] * c, u_t[ok] * c
                stalled[j[~ok]] = True
            lam, u = new_lam, new_u
            if primal_dual:  # after a dual step or a rejected primal-dual step: resynchronize wbar
                sync = ~accepted
                wbar[sync] = _mirror(u[sync], q)
                pd = ~pd | accepted
    return out_lam, out_w, out_it, out_it >= 0


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
    """Rescale w to min(A w) = 1; return (w, ||w||_p, gap, relative gap, violation) per problem."""
    q = p / (p - 1)
    w = w / _matvec(A, w).min(axis=1)[:, None]
    norm = np.sum(np.abs(w) ** p, axis=1) ** (1 / p)
    primal = norm**p / p
    gap = primal - (lam.sum(axis=1) - np.sum(np.abs(_rowvec(lam, A)) ** q, axis=1) / q)
    violation = np.maximum(0.0, np.max(1 - _matvec(A, w), axis=1))
    return w, norm, gap, gap / primal, violation


def lp_margin(A, p, *, tol: float = 1e-8, max_iter: int = 200) -> MarginSolution:
    """Solve ``min ||w||_p s.t. A w >= 1`` for A of shape (m, N), or B problems at once for (B, m, N).

    Solves the dual ``max_{lambda >= 0} 1^T lambda - ||A^T lambda||_q^q / q`` (q = p / (p - 1)) and
    recovers ``w = sign(u)|u|^(q-1)``, ``u = A^T lambda`` (see the module docstring). The returned w
    satisfies ``min(A w) = 1`` and its relative duality gap and violation are <= tol, else
    ConvergenceError; the iteration aims at tol / 100 because the gap pins w less tightly (an entry
    near 0 moves the objective like |delta|^max(p, 2)). Raises InfeasibleError (a ValueError) when no
    w satisfies the constraints, ValueError for bad input. More constraints than unknowns (A A^T
    singular) is supported but slow, and for p >= 4 may need a larger max_iter.
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
    lam, G, iterations, ok = _quadratic(A3, tol if p == 2 else max(tol, 1e-6), max_iter)
    if not ok.all():  # the active-set iteration can stall on singular A A^T; the damped one cannot
        redo = np.flatnonzero(~ok)
        lam[redo], _, it2, ok2 = _newton(A3[redo], 2.0, np.ones((len(redo), A3.shape[1])), tol, max_iter)
        iterations[redo] = max_iter + it2
        if not ok2.all():
            _fail(A3, redo[~ok2], batched, p, f"no certificate after {max_iter} iterations")
    if p < 2:  # start from the least-squares fit of A^T lambda to mirror_p(w_2) on the p = 2 support
        fit = _solve_free(_block_of(G), np.zeros_like(lam), lam > 0, _matvec(A3, _mirror(_rowvec(lam, A3), p)),
                          np.full(len(lam), 1e-12))
        usable = np.any(fit > 0, axis=1) & np.all(np.isfinite(fit), axis=1)
        lam[usable] = np.maximum(fit[usable], 0.0)
    if p == 2:
        w = _rowvec(lam, A3)
    else:
        lam, w, it, ok = _newton(A3, p, lam, tol, max_iter)
        if not ok.all():
            _fail(A3, np.flatnonzero(~ok), batched, p, f"relative gap still above {tol:g} (iteration limit "
                  f"{max_iter}, or the line search stalled at the limit of float64)")
        iterations = iterations + it
    w, norm, gap, rel_gap, violation = _certificate(A3, lam, w, p)
    bad = np.flatnonzero(~((rel_gap <= tol) & (violation <= tol)))
    if len(bad):
        _fail(A3, bad, batched, p, f"final relative gap {rel_gap[bad].max():.2e}, violation {violation[bad].max():.2e}")
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


def attention_constraints(X, z, alpha) -> np.ndarray:
    """Constraint matrix of the attention SVM: rows vec((x_{i,alpha_i} - x_it) z_i^T), t != alpha_i.

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


def attention_svm(X, z, alpha, p, **solver_kw) -> np.ndarray:
    """W_mm = argmin ||W||_p (entrywise) s.t. (x_{i,alpha_i} - x_it)^T W z_i >= 1 for all t != alpha_i.

    Shapes as in `attention_constraints`; returns W (d, d), or (B, d, d) for batched input.
    ``solver_kw`` goes to `lp_margin` (tol, max_iter).
    """
    A = attention_constraints(X, z, alpha)
    d = np.shape(X)[-1]
    return lp_margin(A, p, **solver_kw).w.reshape(*A.shape[:-2], d, d)


def decoder_svm(X, y, alpha, p, **solver_kw) -> np.ndarray:
    """v_mm = argmin ||v||_p s.t. y_i x_{i,alpha_i}^T v >= 1: (d,), or (B, d) for batched input."""
    X, alpha, (y,) = _check_tokens(X, alpha, ("y", y, np.shape(alpha)))
    chosen = np.take_along_axis(X, alpha[..., None, None], axis=-2)[..., 0, :]  # (..., n, d)
    return lp_margin(y[..., None] * chosen, p, **solver_kw).w


def token_scores(X, y, v) -> np.ndarray:
    """gamma_it = y_i v^T x_it: (n, T), or (B, n, T) for batched X (B, n, T, d), y (B, n), v (B, d)."""
    X = _check_array("X", X, (3, 4))
    *lead, n, _, d = X.shape
    y = _check_array("y", y, (len(lead) + 1,))
    v = _check_array("v", v, (len(lead) + 1,))
    if y.shape != (*lead, n) or v.shape != (*lead, d):
        raise ValueError(f"y must have shape {(*lead, n)} and v {(*lead, d)} for X {X.shape}; got {y.shape}, {v.shape}")
    return y[..., None] * np.einsum("...ntd,...d->...nt", X, v)


def globally_optimal_tokens(X, y, v) -> np.ndarray:
    """opt_i = argmax_t gamma_it, the globally optimal token of each example: (n,) or (B, n) ints."""
    return np.argmax(token_scores(X, y, v), axis=-1)


def support_tokens(X, z, alpha, W, tol: float = 1e-6) -> np.ndarray:
    """Tokens whose attention-SVM constraint is tight at W: |(x_{i,alpha_i} - x_it)^T W z_i - 1| <= tol.

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


def is_locally_optimal(X, y, z, v, alpha, p, **solver_kw) -> bool | np.ndarray:
    """Definition 3 of the paper: alpha is locally optimal for (X, y, z, v) in the l_p geometry.

    True when the attention SVM for alpha is feasible and every example's selected token scores
    above its support tokens: gamma_{i,alpha_i} > gamma_it for every support token t of W_mm.
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
