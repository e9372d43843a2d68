"""The single-head model, its data generators, and the batched log-space MD trainer."""

import mpmath
import numpy as np
import pytest
import torch

from mdlib import mirror
from mdlib.models import (SingleHeadAttention, gaussian_instances, joint_training_data, logistic_loss,
                          single_head_output)
from mdlib.optim import LpMirrorDescent
from mdlib.experiments.synthetic import scaled_gradients, train


def full_gradients(W, v, data):
    (sW, DW), (sv, Dv) = scaled_gradients(W, v, data, with_decoder=True)
    return torch.exp(sW)[:, None, None] * DW, torch.exp(sv)[:, None] * Dv


def test_generator_is_seeded_unit_norm_and_batch_independent():
    a = gaussian_instances(5, n=3, T=4, d=6, seed=7)
    b = gaussian_instances(2, n=3, T=4, d=6, seed=10)  # trials 3 and 4 of the first batch
    torch.testing.assert_close(a.X[3:], b.X)
    torch.testing.assert_close(a.v[3:], b.v)
    np.testing.assert_allclose(a.X.norm(dim=-1).numpy(), 1.0, rtol=1e-14)
    np.testing.assert_allclose(a.z.norm(dim=-1).numpy(), 1.0, rtol=1e-14)
    np.testing.assert_allclose(a.v.norm(dim=-1).numpy(), 1.0, rtol=1e-14)
    assert set(a.y.unique().tolist()) <= {-1.0, 1.0}
    assert not torch.equal(a.X[0], a.X[1])
    with pytest.raises(ValueError):
        gaussian_instances(1, T=1)


def test_model_output_matches_numpy():
    data = gaussian_instances(1, n=3, T=4, d=5, seed=3)
    W = torch.randn(1, 5, 5, dtype=torch.float64)
    X, z, v = data.X[0].numpy(), data.z[0].numpy(), data.v[0].numpy()
    ref = []
    for i in range(3):
        s = X[i] @ W[0].numpy() @ z[i]
        a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        ref.append(v @ X[i].T @ a)
    np.testing.assert_allclose(single_head_output(W, data.v, data.X, data.z)[0].numpy(), ref, rtol=1e-13)


def test_gradients_match_autograd_and_finite_differences():
    data = gaussian_instances(3, seed=1)
    W = torch.randn(3, 10, 10, dtype=torch.float64, requires_grad=True)
    v = (data.v * 2).requires_grad_(True)
    logistic_loss(W, v, data.X, data.y, data.z).sum().backward()
    gW, gv = full_gradients(W.detach(), v.detach(), data)
    torch.testing.assert_close(gW, W.grad, rtol=1e-10, atol=1e-16)
    torch.testing.assert_close(gv, v.grad, rtol=1e-10, atol=1e-16)
    h = 1e-6
    E = torch.zeros_like(W)
    E[1, 2, 3] = h
    with torch.no_grad():
        fd = (logistic_loss(W + E, v, data.X, data.y, data.z) - logistic_loss(W - E, v, data.X, data.y, data.z))[1] / (2 * h)
    assert fd.item() == pytest.approx(gW[1, 2, 3].item(), rel=1e-6, abs=1e-12)


def mp_gradient_direction(W, data):
    """dL/dW of one trial by the textbook formula in enough digits to resolve every softmax weight
    (the spread of the logits in decimal digits, plus 50), scaled to max |entry| = 1."""
    X, z, y, v = (t[0].numpy() for t in (data.X, data.z, data.y, data.v))
    logits = np.einsum("ntd,de,ne->nt", X, W[0], z)
    mpmath.mp.dps = int(50 + np.ptp(logits) / np.log(10))
    n, T, d = X.shape
    G = mpmath.zeros(d, d)
    for i in range(n):
        s = [mpmath.fsum(mpmath.mpf(X[i, t, a]) * mpmath.mpf(W[0, a, b]) * mpmath.mpf(z[i, b])
                         for a in range(d) for b in range(d)) for t in range(T)]
        top = max(s)
        e = [mpmath.exp(x - top) for x in s]
        sig = [x / mpmath.fsum(e) for x in e]
        g = [mpmath.fsum(mpmath.mpf(v[a]) * mpmath.mpf(X[i, t, a]) for a in range(d)) for t in range(T)]
        f = mpmath.fsum(sig[t] * g[t] for t in range(T))
        slope = -1 / (1 + mpmath.exp(mpmath.mpf(y[i]) * f))
        for t in range(T):
            c = slope * mpmath.mpf(y[i]) * sig[t] * (g[t] - f) / n
            for a in range(d):
                for b in range(d):
                    G[a, b] += c * mpmath.mpf(X[i, t, a]) * mpmath.mpf(z[i, b])
    top = max(abs(G[a, b]) for a in range(d) for b in range(d))
    return np.array([[float(G[a, b] / top) for b in range(d)] for a in range(d)]), float(mpmath.log(top))


@pytest.mark.parametrize("scale", [1.0, 40.0, 40000.0])
def test_saturated_direction_matches_high_precision(scale):
    """Far into saturation the float64 gradient underflows; the log-space one stays exact."""
    data = gaussian_instances(1, n=2, T=3, d=3, seed=5)
    W = torch.randn(1, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * scale
    ref, log_scale = mp_gradient_direction(W.numpy(), data)
    mpmath.mp.dps = 15
    sW, DW = scaled_gradients(W, data.v, data)
    got = (DW[0] / DW[0].abs().max()).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
    assert sW.item() + np.log(DW[0].abs().max().item()) == pytest.approx(log_scale, rel=1e-9)
    if scale == 40000.0:  # the true gradient is below the float64 range: the naive one is lost
        assert log_scale < np.log(1e-320)
        Wg = W.clone().requires_grad_(True)
        logistic_loss(Wg, data.v, data.X, data.y, data.z).sum().backward()
        assert Wg.grad.abs().max().item() < 1e-300


def test_trainer_matches_torch_optimizer_in_the_unsaturated_regime():
    data = gaussian_instances(1, seed=2)
    W0 = torch.randn(1, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    path = train(data, 1.75, 20, 0.1, W0, normalize=True, points=40)
    model = SingleHeadAttention(W0, data.v)
    opt = LpMirrorDescent(model.parameters(), lr=0.1, p=1.75, normalize=True, eps=0.0)
    for _ in range(20):
        opt.zero_grad()
        model.loss(data.X, data.y, data.z).backward()
        opt.step()
    torch.testing.assert_close(model.W.detach(), path.final_W, rtol=1e-9, atol=1e-12)


def test_batched_training_equals_single_trials():
    data = gaussian_instances(3, n=4, T=5, d=4, seed=11)
    W0 = torch.randn(3, 4, 4, dtype=torch.float64)
    batched = train(data, 3.0, 60, 0.1, W0, points=20)
    for b in range(3):
        single = train(data.trial(b), 3.0, 60, 0.1, W0[b:b + 1], points=20)
        torch.testing.assert_close(batched.W[:, b], single.W[:, 0], rtol=1e-12, atol=1e-14)


def test_normalized_step_moves_the_dual_by_lr():
    data = gaussian_instances(2, seed=4)
    W0 = torch.randn(2, 10, 10, dtype=torch.float64)
    path = train(data, 1.75, 1, 0.1, W0, points=2)
    move = mirror.mirror_map(path.W[0], 1.75) - mirror.mirror_map(path.W[-1], 1.75)
    np.testing.assert_allclose(mirror.lp_norm(move, mirror.dual_exponent(1.75), batch_dims=1).numpy(), 0.1, rtol=1e-10)


def test_joint_training_starts_from_zero():
    data = joint_training_data()
    assert data.X.shape == (1, 2, 3, 2)
    torch.testing.assert_close(data.z[0], data.X[0, :, 0])
    path = train(data, 2.0, 3, 0.1, torch.zeros(1, 2, 2, dtype=torch.float64), train_decoder=True, points=4)
    # v = 0 at the start: the W gradient is exactly zero, so only v moves on the first step
    assert torch.equal(path.W[1], torch.zeros_like(path.W[1]))
    assert path.v[1].abs().sum() > 0 and path.W[2].abs().sum() > 0
    assert path.loss[-1].item() < path.loss[0].item()


def test_authors_normalization_agrees_before_saturation_and_stalls_after():
    data = gaussian_instances(2, seed=6)
    W0 = torch.randn(2, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    exact = train(data, 2.0, 30, 0.1, W0, points=5)
    authors = train(data, 2.0, 30, 0.1, W0, eps=1e-12, points=5)
    torch.testing.assert_close(authors.final_W, exact.final_W, rtol=1e-8, atol=1e-10)
    # deep in saturation the eps-normalized step no longer moves W, the exact one still does
    far = (W0 * 1e4)
    stalled = train(data, 2.0, 5, 0.1, far, eps=1e-12, points=2)
    moving = train(data, 2.0, 5, 0.1, far, points=2)
    assert (stalled.final_W - far).abs().max() < 1e-20
    assert (moving.final_W - far).abs().max() > 0.1
