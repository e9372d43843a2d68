"""mdlib.svm against independent references: cvxpy + Clarabel, Hoelder's closed form, scipy NNLS."""

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import nnls

from mdlib.svm import (
    ConvergenceError,
    InfeasibleError,
    attention_constraints,
    attention_svm,
    decoder_svm,
    globally_optimal_tokens,
    is_locally_optimal,
    lp_margin,
    support_tokens,
    token_scores,
)

PS = [1.1, 1.5, 1.75, 2.0, 2.5, 3.0]


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def instance(seed, n=6, T=8, d=10, batch=()):
    """E1's synthetic data (unit-norm Gaussian tokens, z and v, random labels); alpha = optimal tokens."""
    rng = np.random.default_rng(seed)
    X = unit(rng.standard_normal((*batch, n, T, d)))
    z = unit(rng.standard_normal((*batch, n, d)))
    v = unit(rng.standard_normal((*batch, d)))
    y = rng.choice([-1.0, 1.0], size=(*batch, n))
    return X, y, z, v, globally_optimal_tokens(X, y, v)


def cvxpy_margin(A, p):
    w = cp.Variable(A.shape[1])
    problem = cp.Problem(cp.Minimize(cp.norm(w, p)), [A @ w >= 1])
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == cp.OPTIMAL
    return problem.value, w.value


def assert_certified(sol, tol=1e-8):
    assert np.all(sol.rel_gap <= tol) and np.all(sol.rel_gap >= -1e-12)
    assert np.all(sol.violation <= tol)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("size", [(6, 8, 10), (3, 4, 5)], ids=["E1", "small"])
def test_lp_margin_matches_cvxpy(p, size):
    X, y, z, v, alpha = instance(1, *size)
    A = attention_constraints(X, z, alpha)
    sol = lp_margin(A, p)
    value, w = cvxpy_margin(A, p)
    assert_certified(sol)
    assert sol.norm == pytest.approx(value, rel=1e-6)
    # for p > 2 an entry near 0 changes the objective like |delta|^p: w is pinned to ~ gap^(1/p)
    assert np.max(np.abs(sol.w - w)) <= (1e-4 if p <= 2 else 3e-4) * np.max(np.abs(w))
    assert np.linalg.norm(sol.w, ord=p) == pytest.approx(sol.norm, rel=1e-12)


@pytest.mark.parametrize("p", PS + [6.0])
def test_single_constraint_hoelder(p):
    """min ||w||_p s.t. a^T w >= 1 has value 1 / ||a||_q, attained at sign(a)|a|^(q-1) / ||a||_q^q."""
    a = np.random.default_rng(2).standard_normal(7)
    q = p / (p - 1)
    sol = lp_margin(a[None, :], p)
    assert sol.norm == pytest.approx(1 / np.linalg.norm(a, ord=q), rel=1e-9)
    np.testing.assert_allclose(sol.w, np.sign(a) * np.abs(a) ** (q - 1) / np.linalg.norm(a, ord=q) ** q,
                               rtol=1e-6, atol=1e-9)


def test_p2_against_nnls():
    """p = 2: the dual min 1/2 ||A^T lambda||^2 - 1^T lambda over lambda >= 0 is an NNLS problem."""
    A = np.random.default_rng(3).standard_normal((12, 30)) + 0.5
    L = np.linalg.cholesky(A @ A.T)
    lam, _ = nnls(L.T, np.linalg.solve(L, np.ones(12)))
    sol = lp_margin(A, 2.0)
    np.testing.assert_allclose(sol.w, A.T @ lam, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sol.dual, lam, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_kkt(p):
    A = np.random.default_rng(4).standard_normal((20, 15)) + 0.3
    sol = lp_margin(A, p)
    q = p / (p - 1)
    slack = A @ sol.w - 1
    assert np.all(sol.dual >= 0) and np.all(slack >= -1e-12)
    assert np.max(sol.dual * slack) <= 1e-6 * np.max(sol.dual)  # complementarity
    assert 0 < np.sum(sol.dual > 1e-9 * sol.dual.max()) < 20  # some, not all, constraints are tight
    # stationarity of ||w||_p^p / p - lambda^T (A w - 1): sign(w)|w|^(p-1) = A^T lambda
    u = A.T @ sol.dual
    assert np.max(np.abs(np.sign(sol.w) * np.abs(sol.w) ** (p - 1) - u)) <= 1e-4 * np.max(np.abs(u))
    # strong duality: ||w||_p^p / p = 1^T lambda - ||A^T lambda||_q^q / q
    assert sol.norm**p / p == pytest.approx(sol.dual.sum() - np.sum(np.abs(u) ** q) / q, rel=1e-8)


@pytest.mark.parametrize("p", [1.1, 2.0, 3.0])
def test_batched_equals_single(p):
    X, y, z, v, alpha = instance(5, batch=(6,))
    A = attention_constraints(X, z, alpha)
    batch = lp_margin(A, p)
    assert batch.w.shape == (6, 100) and batch.dual.shape == (6, 42) and batch.norm.shape == (6,)
    assert_certified(batch)
    for b in range(6):
        single = lp_margin(A[b], p)
        assert isinstance(single.norm, float) and isinstance(single.iterations, int)
        assert single.norm == pytest.approx(batch.norm[b], rel=1e-9)
        np.testing.assert_allclose(single.w, batch.w[b], rtol=0, atol=1e-6 * np.abs(single.w).max())


def test_infeasible():
    a = np.array([1.0, -2.0, 0.5])
    with pytest.raises(InfeasibleError, match="infeasible") as err:
        lp_margin(np.stack([a, -a]), 1.5)
    assert isinstance(err.value, ValueError) and err.value.problems == (0,)
    with pytest.raises(InfeasibleError):  # a zero row: 0 >= 1
        lp_margin(np.array([[1.0, 2.0], [0.0, 0.0]]), 2.0)
    # in a batch, the error names the infeasible problem
    A = np.random.default_rng(6).standard_normal((4, 5, 8))
    A[2, 1] = -A[2, 0]
    with pytest.raises(InfeasibleError) as err:
        lp_margin(A, 3.0)
    assert err.value.problems == (2,)


def test_infeasible_attention_tokens():
    """A token equal to the selected one cannot be separated from it."""
    X, y, z, v, alpha = instance(7, 3, 4, 5)
    X[0, (alpha[0] + 1) % 4] = X[0, alpha[0]]
    with pytest.raises(InfeasibleError, match="alpha"):
        attention_svm(X, z, alpha, 2.0)
    assert is_locally_optimal(X, y, z, v, alpha, 2.0) is False


@pytest.mark.parametrize("p", [1.1, 1.75, 2.0, 3.0])
@pytest.mark.parametrize("s", [1e-200, 1.0, 1e200])
def test_attention_svm_is_scale_covariant(p, s):
    """X -> s X turns the constraints (x_alpha - x_t)^T W z >= 1 into (x_alpha - x_t)^T (s W) z >= 1, and
    ||s W||_p = s ||W||_p: so W_mm(s X) = W_mm(X) / s, and the same for z. Inputs at 1e-200 or 1e200 were
    called infeasible (their Gram matrix under- or overflowed)."""
    X, y, z, v, alpha = instance(5)
    W = attention_svm(X, z, alpha, p)
    np.testing.assert_allclose(attention_svm(X * s, z, alpha, p) * s, W, rtol=1e-12, atol=1e-12 * np.abs(W).max())
    np.testing.assert_allclose(attention_svm(X, z * s, alpha, p) * s, W, rtol=1e-12, atol=1e-12 * np.abs(W).max())


@pytest.mark.parametrize("p", [1.5, 3.0])
def test_lp_margin_rescales_every_output(p):
    """A -> s A: w / s, ||w|| / s, lambda s^-p, gap s^-p; relative gap and violation unchanged."""
    X, y, z, v, alpha = instance(6)
    A = attention_constraints(X, z, alpha)
    ref, sol = lp_margin(A, p), lp_margin(A * 1e50, p)
    np.testing.assert_allclose(sol.w * 1e50, ref.w, rtol=1e-12, atol=1e-12 * np.abs(ref.w).max())
    assert sol.norm * 1e50 == pytest.approx(ref.norm, rel=1e-12)
    np.testing.assert_allclose(sol.dual * 1e50**p, ref.dual, rtol=1e-10, atol=1e-12 * ref.dual.max())
    assert sol.gap * 1e50**p == pytest.approx(ref.gap, rel=1e-3, abs=1e-15)
    assert sol.rel_gap <= 1e-8 and sol.violation <= 1e-8
    with pytest.raises(ValueError, match="exceeds float64's range"):
        lp_margin(A * 1e-310, p)  # a w of 1e310


def test_no_silent_failure():
    X, y, z, v, alpha = instance(8)
    with pytest.raises(ConvergenceError, match="did not converge"):
        lp_margin(attention_constraints(X, z, alpha), 1.1, max_iter=2)


@pytest.mark.parametrize(
    "args, message",
    [
        ((np.ones((2, 3)), 1.0), "p must be in"),
        ((np.ones((2, 3)), 0.5), "p must be in"),
        ((np.ones((2, 3)), np.inf), "p must be in"),
        ((np.ones((2, 3)), "two"), "p must be a real number"),
        ((np.ones(3), 2.0), "dimensions"),
        ((np.ones((1, 2, 3, 4)), 2.0), "dimensions"),
        ((np.ones((0, 3)), 2.0), "empty"),
        ((np.array([[1.0, np.nan]]), 2.0), "NaN"),
        ((np.array([["a", "b"]]), 2.0), "numeric"),
    ],
)
def test_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        lp_margin(*args)


@pytest.mark.parametrize("kw, message", [({"tol": 0.0}, "tol"), ({"tol": "1e-8"}, "tol"), ({"max_iter": 0}, "max_iter"),
                                         ({"max_iter": 2.5}, "max_iter")])
def test_bad_solver_options(kw, message):
    with pytest.raises(ValueError, match=message):
        lp_margin(np.ones((2, 3)), 2.0, **kw)


def test_bad_token_input():
    X, y, z, v, alpha = instance(9, 3, 4, 5)
    with pytest.raises(ValueError, match="alpha must index"):
        attention_constraints(X, z, alpha + 4)
    with pytest.raises(ValueError, match="alpha must be an integer array"):
        attention_constraints(X, z, alpha.astype(float))
    with pytest.raises(ValueError, match="z must have shape"):
        attention_constraints(X, z[:, :3], alpha)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        attention_constraints(X[:, :1], z, np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="y must have shape"):
        token_scores(X, y[:2], v)


def test_attention_constraints_rows():
    X, y, z, v, alpha = instance(10, 3, 4, 5)
    A = attention_constraints(X, z, alpha)
    assert A.shape == (9, 25)
    W = np.random.default_rng(10).standard_normal((5, 5))
    expected = [(X[i, alpha[i]] - X[i, t]) @ W @ z[i] for i in range(3) for t in range(4) if t != alpha[i]]
    np.testing.assert_allclose(A @ W.ravel(), expected, rtol=1e-12)
    Xb, yb, zb, vb, alphab = instance(11, 3, 4, 5, batch=(2,))
    Ab = attention_constraints(Xb, zb, alphab)
    assert Ab.shape == (2, 9, 25)
    np.testing.assert_array_equal(Ab[1], attention_constraints(Xb[1], zb[1], alphab[1]))


@pytest.mark.parametrize("p", [1.75, 3.0])
def test_attention_svm_against_cvxpy_matrix_form(p):
    """The reference states the constraints (x_alpha - x_t)^T W z_i >= 1 directly on a matrix variable."""
    X, y, z, v, alpha = instance(12, 4, 5, 6)
    W = attention_svm(X, z, alpha, p)
    assert W.shape == (6, 6)
    Wc = cp.Variable((6, 6))
    constraints = [(X[i, alpha[i]] - X[i, t]) @ Wc @ z[i] >= 1 for i in range(4) for t in range(5) if t != alpha[i]]
    problem = cp.Problem(cp.Minimize(cp.norm(cp.vec(Wc, order="C"), p)), constraints)
    problem.solve(solver=cp.CLARABEL)
    assert np.sum(np.abs(W) ** p) ** (1 / p) == pytest.approx(problem.value, rel=1e-6)
    assert np.max(np.abs(W - Wc.value)) <= 1e-4 * np.max(np.abs(W))
    Wb = attention_svm(X[None].repeat(2, 0), z[None].repeat(2, 0), alpha[None].repeat(2, 0), p)
    assert Wb.shape == (2, 6, 6)
    np.testing.assert_allclose(Wb[1], W, atol=1e-8 * np.abs(W).max())


@pytest.mark.parametrize("p", [1.5, 2.0, 3.0])
def test_decoder_svm_against_cvxpy(p):
    X, y, z, v, alpha = instance(13, 6, 4, 10)
    vmm = decoder_svm(X, y, alpha, p)
    chosen = X[np.arange(6), alpha]
    vc = cp.Variable(10)
    problem = cp.Problem(cp.Minimize(cp.norm(vc, p)), [cp.multiply(y, chosen @ vc) >= 1])
    problem.solve(solver=cp.CLARABEL)
    assert np.linalg.norm(vmm, ord=p) == pytest.approx(problem.value, rel=1e-6)
    assert np.all(y * (chosen @ vmm) >= 1 - 1e-10)
    assert np.max(np.abs(vmm - vc.value)) <= 1e-4 * np.max(np.abs(vmm))


def test_token_scores_and_optimal_tokens():
    X, y, z, v, alpha = instance(14, 3, 4, 5)
    gamma = token_scores(X, y, v)
    np.testing.assert_allclose(gamma, [[y[i] * v @ X[i, t] for t in range(4)] for i in range(3)])
    np.testing.assert_array_equal(globally_optimal_tokens(X, y, v), gamma.argmax(axis=1))


# One example, d = 2, z = e_1: only the first column c = W e_1 matters and W_mm = [c, 0] with
# c = argmin ||c||_p s.t. c_1 >= 1 (token 1) and 2 c_1 - 5 c_2 >= 1 (token 2): c = (1, 0) for every p.
# Token 1 is tight (support), token 2 has margin 2.
HAND_X = np.array([[[0.0, 0.0], [-1.0, 0.0], [-2.0, 5.0]]])
HAND_Z = np.array([[1.0, 0.0]])
HAND_ALPHA = np.array([0])


@pytest.mark.parametrize("p", [1.5, 2.0, 3.0])
def test_support_tokens_hand_example(p):
    W = attention_svm(HAND_X, HAND_Z, HAND_ALPHA, p)
    np.testing.assert_allclose(W, [[1.0, 0.0], [0.0, 0.0]], atol=1e-7)
    np.testing.assert_array_equal(support_tokens(HAND_X, HAND_Z, HAND_ALPHA, W), [[False, True, False]])


@pytest.mark.parametrize(
    "v, locally, globally",
    [
        ((1.0, 0.0), True, True),  # gamma = (0, -1, -2): alpha = 0 is the best token
        ((1.0, 1.0), True, False),  # gamma = (0, -1, 3): beats its support token 1, not token 2
        ((-1.0, 0.0), False, False),  # gamma = (0, 1, 2): loses to its support token 1
    ],
)
def test_local_and_global_optimality_hand_example(v, locally, globally):
    y, v = np.array([1.0]), np.array(v)
    assert is_locally_optimal(HAND_X, y, HAND_Z, v, HAND_ALPHA, 2.0) is locally
    assert (globally_optimal_tokens(HAND_X, y, v) == HAND_ALPHA).all() == globally


@pytest.mark.parametrize("p", [1.75, 3.0])
def test_globally_optimal_tokens_are_locally_optimal(p):
    X, y, z, v, alpha = instance(15, batch=(4,))
    assert is_locally_optimal(X, y, z, v, alpha, p).tolist() == [True] * 4
    assert is_locally_optimal(X[0], y[0], z[0], v[0], alpha[0], p) is True
    # the E1 instance's worst token is not: it loses to every other token, support tokens included
    worst = token_scores(X[0], y[0], v[0]).argmin(axis=1)
    assert is_locally_optimal(X[0], y[0], z[0], v[0], worst, p) is False


@pytest.mark.parametrize("p", [1.5, 3.0])
def test_support_tokens_match_the_dual(p):
    """Tight constraints by margin are the constraints with positive multipliers (no degeneracy here)."""
    X, y, z, v, alpha = instance(16)
    A = attention_constraints(X, z, alpha)
    sol = lp_margin(A, p)
    support = support_tokens(X, z, alpha, sol.w.reshape(10, 10))
    others = np.array([[t for t in range(8) if t != alpha[i]] for i in range(6)])
    np.testing.assert_array_equal(support[np.arange(6)[:, None], others].ravel(), sol.dual > 1e-6 * sol.dual.max())


_WITHOUT_NUMBA = """
import json, sys
import numpy as np
sys.modules["numba"] = None  # import numba now raises ImportError: the interpreted fallback
from mdlib import svm
assert svm.njit is None
A = np.asarray(json.loads(sys.argv[1]))
print(json.dumps({str(p): svm.lp_margin(A, p).w.tolist() for p in (1.1, 1.75, 2.0, 3.0)}))
"""


def test_without_numba_the_interpreted_solver_gives_the_same_solutions():
    """numba is only for speed: with it missing, the same code runs interpreted and agrees."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    X, _, z, _, alpha = instance(3, n=3, T=4, d=5)
    A = attention_constraints(X, z, alpha).reshape(-1, 25)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _WITHOUT_NUMBA, json.dumps(A.tolist())], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    for p, w in json.loads(out).items():
        np.testing.assert_allclose(w, lp_margin(A, float(p)).w, rtol=1e-9, atol=1e-12)
