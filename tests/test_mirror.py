"""mdlib.mirror against independent numpy float64 references and finite differences."""

import numpy as np
import pytest
import torch

from mdlib import mirror

PS = [1.1, 1.5, 1.75, 2.0, 2.5, 3.0]


def np_mirror(w, p):
    return np.sign(w) * np.abs(w) ** (p - 1)


def np_potential(w, p):
    return np.sum(np.abs(w) ** p) / p


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("p", PS + [1.25, 4.0, 11.0])
def test_maps_match_numpy_and_invert(rng, p):
    w = rng.standard_normal((7, 5)) * 3
    w[0, 0] = 0.0
    m = mirror.mirror_map(torch.from_numpy(w), p)
    np.testing.assert_allclose(m.numpy(), np_mirror(w, p), rtol=1e-13, atol=0)
    back = mirror.inverse_mirror_map(m, p).numpy()
    np.testing.assert_allclose(back, w, rtol=1e-12, atol=0)
    q = mirror.dual_exponent(p)
    np.testing.assert_allclose(mirror.inverse_mirror_map(torch.from_numpy(w), p).numpy(), np_mirror(w, q), rtol=1e-12)


@pytest.mark.parametrize("p", PS)
def test_mirror_map_is_gradient_of_potential(p):
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    mirror.potential(w, p).backward()
    torch.testing.assert_close(w.grad, mirror.mirror_map(w.detach(), p), rtol=1e-12, atol=1e-14)
    # and a central finite difference on one coordinate, independent of autograd
    x = w.detach().numpy().copy()
    h = 1e-6
    e = np.zeros_like(x)
    e[1, 2] = h
    fd = (np_potential(x + e, p) - np_potential(x - e, p)) / (2 * h)
    assert fd == pytest.approx(np_mirror(x, p)[1, 2], rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("p", PS)
def test_lp_norm_batched_and_scale_safe(rng, p):
    w = rng.standard_normal((3, 4, 5))
    norms = mirror.lp_norm(torch.from_numpy(w), p, batch_dims=1).numpy()
    ref = [np.sum(np.abs(x) ** p) ** (1 / p) for x in w]
    np.testing.assert_allclose(norms, ref, rtol=1e-13)
    big = torch.from_numpy(w * 1e250)
    np.testing.assert_allclose(mirror.lp_norm(big, p, batch_dims=1).numpy() / 1e250, ref, rtol=1e-12)
    tiny = torch.from_numpy(w * 1e-300)
    np.testing.assert_allclose(mirror.lp_norm(tiny, p, batch_dims=1).numpy() / 1e-300, ref, rtol=1e-10)
    normalized = mirror.lp_normalize(torch.from_numpy(w), p, batch_dims=1)
    np.testing.assert_allclose(mirror.lp_norm(normalized, p, batch_dims=1).numpy(), 1.0, rtol=1e-13)


def test_lp_normalize_zero_raises_or_gives_nan():
    with pytest.raises(ValueError, match="all-zero"):
        mirror.lp_normalize(torch.zeros(2, 3), 2.0, batch_dims=1)
    w = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    out = mirror.lp_normalize(w, 2.0, batch_dims=1, zero="nan")
    assert torch.isnan(out[0]).all()
    torch.testing.assert_close(out[1], torch.tensor([0.6, 0.8]))
    assert torch.isnan(mirror.directional_bregman(torch.ones(2), w, 1.5, batch_dims=1)[0])


@pytest.mark.parametrize("p", PS)
def test_bregman_matches_definition_and_order(rng, p):
    a, b = rng.standard_normal((2, 6, 4))
    ref = np_potential(a, p) - np_potential(b, p) - np.sum(np_mirror(b, p) * (a - b))
    got = mirror.bregman_divergence(torch.from_numpy(a), torch.from_numpy(b), p).item()
    assert got == pytest.approx(ref, rel=1e-12)
    assert got > 0
    assert mirror.bregman_divergence(torch.from_numpy(a), torch.from_numpy(a), p).item() == pytest.approx(0, abs=1e-14)
    if p != 2:  # not symmetric: the argument order is part of the definition
        swapped = mirror.bregman_divergence(torch.from_numpy(b), torch.from_numpy(a), p).item()
        assert abs(swapped - got) > 1e-6


def test_bregman_p2_is_half_squared_distance(rng):
    a, b = rng.standard_normal((2, 5, 5))
    got = mirror.bregman_divergence(torch.from_numpy(a), torch.from_numpy(b), 2.0).item()
    assert got == pytest.approx(0.5 * np.sum((a - b) ** 2), rel=1e-13)


@pytest.mark.parametrize("p", [1.75, 3.0])
def test_directional_bregman(rng, p):
    ref = torch.from_numpy(rng.standard_normal((4, 4)))
    path = torch.stack([ref * 3.0, ref * 1e-3, torch.from_numpy(rng.standard_normal((4, 4)))])
    d = mirror.directional_bregman(ref, path, p, batch_dims=1)
    assert d.shape == (3,)
    assert d[0].item() == pytest.approx(0, abs=1e-13) and d[1].item() == pytest.approx(0, abs=1e-13)
    expected = mirror.bregman_divergence(mirror.lp_normalize(ref, p), mirror.lp_normalize(path[2], p), p)
    assert d[2].item() == pytest.approx(expected.item(), rel=1e-13)
    assert d[2].item() > 1e-3


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_normalized_step_batched_equals_individual(rng, p):
    w = torch.from_numpy(rng.standard_normal((5, 3, 3)))
    g = torch.from_numpy(rng.standard_normal((5, 3, 3))) * torch.logspace(-8, 3, 5, dtype=torch.float64)[:, None, None]
    batched = mirror.mirror_step(w, g, 0.1, p, normalize=True, eps=0.0, batch_dims=1)
    for i in range(5):
        single = mirror.mirror_step(w[i], g[i], 0.1, p, normalize=True, eps=0.0)
        torch.testing.assert_close(batched[i], single, rtol=1e-14, atol=0)
        # the step is a unit-size move in the dual norm, whatever the gradient's scale
        dual_move = mirror.mirror_map(w[i], p) - mirror.mirror_map(single, p)
        assert mirror.lp_norm(dual_move, mirror.dual_exponent(p)).item() == pytest.approx(0.1, rel=1e-9)


@pytest.mark.parametrize("p", PS)
def test_mirror_step_matches_numpy(rng, p):
    w, g = rng.standard_normal((2, 4, 4))
    got = mirror.mirror_step(torch.from_numpy(w), torch.from_numpy(g), 0.05, p).numpy()
    q = p / (p - 1)
    ref = np_mirror(np_mirror(w, p) - 0.05 * g, q)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    if p == 2.0:
        np.testing.assert_allclose(got, w - 0.05 * g, rtol=1e-15)


def test_mirror_step_errors():
    w = torch.full((3,), 1e3, dtype=torch.float32)
    with pytest.raises(FloatingPointError, match="reduce lr"):
        mirror.mirror_step(w, -torch.ones(3), 1e4, 1.1)
    with pytest.raises(FloatingPointError, match="gradient is not finite"):
        mirror.mirror_step(w, torch.tensor([1.0, float("nan"), 0.0]), 0.1, 1.75)
    for bad_p in [1.0, 0.5, float("inf"), float("nan")]:
        with pytest.raises(ValueError, match="exponent"):
            mirror.mirror_map(w, bad_p)
    for bad_lr in [0.0, -1.0, float("nan")]:
        with pytest.raises(ValueError, match="step size"):
            mirror.mirror_step(w, w, bad_lr, 2.0)


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
@pytest.mark.parametrize("scale", [0.02, 0.3, 1.0, 5.0])
def test_matched_lr_moves_an_entry_as_far_as_sgd_to_first_order(p, scale):
    """One mirror step at matched_lr(sgd_lr, p, scale) moves entries of magnitude ``scale`` (either sign,
    gradients of either sign) as far as SGD at sgd_lr: the relative error of the movement shrinks in
    proportion to sgd_lr (first order) and is below 1e-3 for small steps. Checked on mirror_step and on
    an independent numpy float64 step m^-1(m(w) - lr g)."""
    w = np.array([scale, -scale, scale, -scale])
    g = np.array([1.0, 1.0, -0.5, -2.0])
    errors = []
    for sgd_lr in [1e-2 * scale, 1e-4 * scale, 1e-6 * scale]:
        lr = mirror.matched_lr(sgd_lr, p, scale)
        reference = np_mirror(np_mirror(w, p) - lr * g, p / (p - 1)) - w
        moved = (mirror.mirror_step(torch.from_numpy(w), torch.from_numpy(g), lr, p).numpy() - w)
        np.testing.assert_allclose(moved, reference, rtol=1e-6)
        errors.append(np.max(np.abs(reference / (-sgd_lr * g) - 1)))
    assert errors[-1] < 1e-3 and errors[1] < 1e-2, errors
    assert errors[1] < 0.03 * errors[0] + 1e-12 and errors[2] < 0.03 * errors[1] + 1e-9, errors  # ~100x per 100x


def test_matched_lr_values_and_errors():
    assert mirror.matched_lr(0.1, 2.0, 0.37) == 0.1  # p = 2 is SGD at any scale
    assert mirror.matched_lr(0.1, 3.0, 0.02) == pytest.approx(0.1 * 2 * 0.02)
    assert mirror.matched_lr(0.1, 1.1, 1.0) == pytest.approx(0.01)
    assert mirror.matched_lr(0.0, 1.75, 0.5) == 0.0
    for bad_p in [1.0, 0.5, float("inf"), float("nan")]:
        with pytest.raises(ValueError, match="exponent"):
            mirror.matched_lr(0.1, bad_p, 1.0)
    for bad_scale in [0.0, -1.0, float("inf"), float("nan")]:
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            mirror.matched_lr(0.1, 1.75, bad_scale)
    for bad_lr in [-1e-3, float("inf"), float("nan")]:
        with pytest.raises(ValueError, match="sgd_lr must be a finite number >= 0"):
            mirror.matched_lr(bad_lr, 1.75, 1.0)
    with pytest.raises(TypeError, match="real numbers"):
        mirror.matched_lr("0.1x", 1.75, 1.0)
    with pytest.raises(ValueError, match="overflows"):
        mirror.matched_lr(1e300, 1.1, 1e-300)
    with pytest.raises(ValueError, match="overflows"):
        mirror.matched_lr(1.0, 4.0, 1e200)


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_a_zero_entry_moves_by_a_power_of_the_step_not_in_proportion(p):
    """What matched_lr's docstring says of scale 0: from w = 0 one step moves by (lr |g|)^(1/(p-1))."""
    for step in [1e-1, 1e-3]:
        moved = mirror.mirror_step(torch.zeros(2, dtype=torch.float64), torch.tensor([-1.0, 1.0], dtype=torch.float64),
                                   step, p).numpy()
        np.testing.assert_allclose(moved, [step ** (1 / (p - 1)), -step ** (1 / (p - 1))], rtol=1e-12)


@pytest.mark.parametrize("p", [1.75, 1.6, 1.375])  # r = 4/3, 5/3, 8/3: the cube-root Newton branch
def test_fused_power_cube_root_branch_matches_float64(p):
    r = 1.0 / (p - 1.0)
    a = np.logspace(-25, 25, 20001)
    u = np.concatenate([a, -a]).astype(np.float32)
    exact = np.sign(u.astype(np.float64)) * np.abs(u.astype(np.float64)) ** r
    finfo = np.finfo(np.float32)
    keep = (np.abs(exact) < finfo.max) & (np.abs(exact) >= finfo.tiny)  # results in the normal range
    got = mirror._fused_signed_power(torch.from_numpy(u), r).double().numpy()
    rel = np.abs(got[keep] - exact[keep]) / np.abs(exact[keep])
    assert rel.max() < 1e-6  # float32 precision; exp(r log|u|) in float32 errs up to ~1e-5 here
    assert np.all(np.isinf(got[np.abs(exact) >= finfo.max]))  # a true overflow stays one (the optimizer refuses it)
    specials = torch.tensor([0.0, -0.0, 1e-41, -1e-41, float("inf"), -float("inf"), float("nan")])
    out = mirror._fused_signed_power(specials, r)
    assert out[:4].eq(0).all() and torch.equal(out[:4].signbit(), specials[:4].signbit())
    assert out[4] == float("inf") and out[5] == -float("inf") and out[6].isnan()


@pytest.mark.parametrize("dtype,p", [(torch.float64, 1.75), (torch.float32, 1.1), (torch.float32, 3.0),
                                     (torch.float32, 2.5)])
def test_fused_power_elsewhere_is_the_eager_power(dtype, p):
    u = torch.randn(1000, dtype=dtype) * 5
    r = 1.0 / (p - 1.0)
    assert torch.equal(mirror._fused_signed_power(u, r), mirror._signed_power(u, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("r", [10.0, 5.0, 4.0, 3.0, 2.0, 0.5, 0.75, 1.0 / 0.75, 0.1, 1.0])
def test_signed_power_variants_are_one_kernel(dtype, r):
    """The in-place, out-of-place, foreach and low-precision variants give the same bits (one definition
    of the arithmetic: left-to-right binary powering of the signed value for integer r), each within a
    few roundings of the float64 value."""
    torch.manual_seed(0)
    u = torch.randn(4000, dtype=dtype) * torch.exp(torch.randn(4000, dtype=dtype))
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    out = mirror._signed_power(u, r)
    into, listed = torch.empty_like(u), [torch.empty_like(u)]
    mirror._signed_power_into(u, r, into)
    mirror._foreach_signed_power_into([u], r, listed)
    assert torch.equal(out.view(bits), into.view(bits)) and torch.equal(out.view(bits), listed[0].view(bits))
    exact = u.double().sign() * u.double().abs() ** r
    rel = ((out.double() - exact).abs() / exact.abs()).max().item()
    assert rel < (30 if r == 10.0 else 8) * torch.finfo(dtype).eps  # exp/log and k-fold products
    half = torch.empty(4000, dtype=torch.bfloat16)
    mirror._signed_power_into(u, r, half)  # a bf16 parameter of a dual in u's dtype: rounded once
    assert torch.equal(half, out.to(torch.bfloat16))
    # the left-to-right order, by hand for r = 10: ((u^2)^2 u)^2, then the sign of u
    if r == 10.0:
        assert torch.equal(out, torch.copysign(((u * u).square() * u).square(), u))


@pytest.mark.parametrize("p, reference_p", [(2.0, 1.1), (1.1, 3.0), (1.75, 1.1)])
@pytest.mark.parametrize("scale", [0.02, 0.3, 1.0])
def test_matched_lr_matches_another_exponent_to_first_order(p, reference_p, scale):
    """With reference_p, a step at p moves entries of magnitude ``scale`` as far as the step ``lr`` at
    reference_p does (independent numpy float64 steps of both), with an error shrinking with the step."""
    w = np.array([scale, -scale, scale])
    g = np.array([1.0, -0.5, 2.0])
    errors = []
    for lr_ref in [1e-3 * scale ** (reference_p - 1), 1e-5 * scale ** (reference_p - 1)]:
        lr = mirror.matched_lr(lr_ref, p, scale, reference_p=reference_p)
        moved = np_mirror(np_mirror(w, p) - lr * g, p / (p - 1)) - w
        target = np_mirror(np_mirror(w, reference_p) - lr_ref * g, reference_p / (reference_p - 1)) - w
        errors.append(np.max(np.abs(moved / target - 1)))
    assert errors[-1] < 1e-3 and errors[1] < 0.05 * errors[0] + 1e-9, errors
    assert mirror.matched_lr(0.1, p, scale, reference_p=p) == pytest.approx(0.1)  # an exponent matches itself
    inverse = mirror.matched_lr(mirror.matched_lr(0.1, p, scale, reference_p=reference_p), reference_p, scale,
                                reference_p=p)
    assert inverse == pytest.approx(0.1)  # matching back returns the step
    with pytest.raises(ValueError, match="exponent"):
        mirror.matched_lr(0.1, p, scale, reference_p=1.0)


def test_matched_param_groups_give_each_tensor_its_matched_step():
    """One group per tensor at matched_lr(lr, p, mean |w|, reference_p); an all-zero tensor gets zero_lr
    (default lr); a tensor passed twice is kept once; the groups drive LpMirrorDescent."""
    from mdlib.optim import LpMirrorDescent

    torch.manual_seed(0)
    big, small, zero = torch.randn(50, 4), 0.02 * torch.randn(30), torch.zeros(3)
    groups = mirror.matched_param_groups([big, small, zero, big], 1e-3, 1.1)
    assert [g["params"][0] is w for g, w in zip(groups, [big, small, zero])] == [True] * 3 and len(groups) == 3
    for g, w in zip(groups[:2], [big, small]):
        scale = float(np.abs(w.double().numpy()).mean())
        assert g["lr"] == pytest.approx(1e-3 * 0.1 * scale ** -0.9, rel=1e-12)
    assert groups[2]["lr"] == 1e-3
    assert mirror.matched_param_groups([zero], 1e-3, 1.1, zero_lr=5e-4)[0]["lr"] == 5e-4
    back = mirror.matched_param_groups([big, small], 8e-4, 2.0, reference_p=1.1)  # GD with l_1.1's effective steps
    assert back[1]["lr"] == pytest.approx(8e-4 * 10 * float(np.abs(small.double().numpy()).mean()) ** 0.9)
    params = [torch.nn.Parameter(w.clone()) for w in (big, small)]
    opt = LpMirrorDescent(mirror.matched_param_groups(params, 1e-3, 1.1), lr=1e-3, p=1.1)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in groups[:2]]
    with pytest.raises(TypeError, match="takes tensors"):
        mirror.matched_param_groups([1.0], 1e-3, 1.1)
    with pytest.raises(ValueError, match="no tensors"):
        mirror.matched_param_groups([], 1e-3, 1.1)
