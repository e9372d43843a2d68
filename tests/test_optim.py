"""The LpMirrorDescent contract: SGD at p = 2, the functional reference elsewhere, errors, no drift."""

import copy

import pytest
import torch

from mdlib import mirror
from mdlib.optim import LpMirrorDescent


def make_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).to(dtype)


def loss_of(model, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    x = torch.randn(16, 6, generator=g).to(dtype)
    y = torch.randn(16, 1, generator=g).to(dtype)
    return ((model(x) - y) ** 2).mean()


def assert_refused_unchanged(model, opt, poison, match, seed=7):
    """Backward on a fresh batch, ``poison`` the gradients, and check the step raises ``match``
    while every parameter stays bit for bit as it was."""
    before = [w.detach().clone() for w in model.parameters()]
    loss_of(model, seed).backward()
    poison(model)
    with pytest.raises(FloatingPointError, match=match):
        opt.step()
    for w, b in zip(model.parameters(), before):
        assert torch.equal(w, b)


#: Run a test on both step implementations: eager torch operations, and the fused one (on CPU float
#: tensors, the C++ kernel of mdlib.cpu_kernel).
both_paths = pytest.mark.parametrize("compile", [False, True], ids=["eager", "fused"])


def train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, k).backward()
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("foreach", [None, True])
def test_p2_is_sgd_bit_for_bit(dtype, foreach):
    a, b = make_model(dtype), make_model(dtype)
    train(a, LpMirrorDescent(a.parameters(), lr=0.05), 25)
    train(b, torch.optim.SGD(b.parameters(), lr=0.05, foreach=foreach), 25)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
@pytest.mark.parametrize("normalize", [False, True])
@both_paths
def test_matches_functional_mirror_step(p, normalize, compile):
    model = make_model(torch.float64)
    reference = [w.detach().clone() for w in model.parameters()]
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=p, normalize=normalize, compile=compile)
    for k in range(10):
        opt.zero_grad()
        loss_of(model, k).backward()
        grads = [w.grad.clone() for w in model.parameters()]
        opt.step()
        # the functional reference, evaluated at the optimizer's parameters before the step
        reference = [mirror.mirror_step(r, g, 0.01, p, normalize=normalize) for r, g in zip(reference, grads)]
        for w, r in zip(model.parameters(), reference):
            torch.testing.assert_close(w.detach(), r, rtol=1e-12, atol=1e-15)
        reference = [w.detach().clone() for w in model.parameters()]


@both_paths
def test_param_groups_have_their_own_lr_and_p(compile):
    model = make_model(torch.float64)
    first, second = model[0], model[2]
    opt = LpMirrorDescent([{"params": first.parameters(), "p": 1.5, "lr": 0.02},
                           {"params": second.parameters()}], lr=0.1, p=3.0, compile=compile)
    before = {n: w.detach().clone() for n, w in model.named_parameters()}
    loss_of(model, 0).backward()
    grads = {n: w.grad.clone() for n, w in model.named_parameters()}
    opt.step()
    for name, w in model.named_parameters():
        p, lr = (1.5, 0.02) if name.startswith("0.") else (3.0, 0.1)
        torch.testing.assert_close(w.detach(), mirror.mirror_step(before[name], grads[name], lr, p), rtol=1e-12, atol=0)


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
@both_paths
def test_state_dict_round_trip_resumes_exactly(p, compile):
    straight = make_model()
    opt = LpMirrorDescent(straight.parameters(), lr=0.01, p=p, compile=compile)
    train(straight, opt, 12)

    first = make_model()
    opt1 = LpMirrorDescent(first.parameters(), lr=0.01, p=p, compile=compile)
    train(first, opt1, 5)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt1.state_dict())
    resumed = make_model(seed=99)  # different weights, overwritten by the checkpoint
    resumed.load_state_dict(saved_model)
    opt2 = LpMirrorDescent(resumed.parameters(), lr=0.01, p=p, compile=compile)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, 7, start=5)
    for x, y in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(x, y)


def test_scheduler_drives_lr():
    model = make_model(torch.float64)
    opt = LpMirrorDescent(model.parameters(), lr=0.1, p=1.75)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    train(model, opt, 1)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    before = [w.detach().clone() for w in model.parameters()]
    opt.zero_grad()
    loss_of(model, 1).backward()
    grads = [w.grad.clone() for w in model.parameters()]
    opt.step()
    for w, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(w.detach(), mirror.mirror_step(b, g, 0.05, 1.75), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kwargs", [dict(lr=0.0), dict(lr=-1.0), dict(lr=float("nan")), dict(lr=0.1, p=1.0),
                                    dict(lr=0.1, p=0.5), dict(lr=0.1, p=float("inf")), dict(lr=0.1, p=float("nan")),
                                    dict(lr=0.1, eps=-1.0)])
def test_bad_hyperparameters_raise(kwargs):
    with pytest.raises(ValueError):
        LpMirrorDescent(make_model().parameters(), **kwargs)


def test_bad_group_hyperparameters_raise():
    model = make_model()
    opt = LpMirrorDescent(model[0].parameters(), lr=0.1, p=1.5)
    with pytest.raises(ValueError, match="exponent"):
        opt.add_param_group({"params": model[2].parameters(), "p": 0.9})


@pytest.mark.parametrize("p", [2.0, 1.75])
@pytest.mark.parametrize("warm", [False, True])
@both_paths
def test_non_finite_gradient_names_parameter_and_changes_nothing(p, warm, compile):
    model = make_model()
    opt = LpMirrorDescent(model.named_parameters(), lr=0.01, p=p, compile=compile)
    if warm:
        train(model, opt, 3)
    assert_refused_unchanged(model, opt, lambda m: m[2].weight.grad.__setitem__((0, 1), float("inf")),
                             r"non-finite gradient in 2\.weight.*reduce lr")
    # the optimizer still works afterwards, from the untouched parameters
    opt.zero_grad()
    loss_of(model, 8).backward()
    opt.step()


@pytest.mark.parametrize("warm", [False, True])
@both_paths
def test_overflow_raises_and_changes_nothing(warm, compile):
    w = torch.nn.Parameter(torch.linspace(1.0, 50.0, 10))
    opt = LpMirrorDescent([w], lr=1e-3, p=1.1, compile=compile)
    if warm:
        for _ in range(3):
            w.grad = torch.ones_like(w) * 1e-3
            opt.step()
    before = w.detach().clone()
    w.grad = -torch.ones_like(w)
    opt.param_groups[0]["lr"] = 1e6  # u -> u + 1e6, then |u|^10 ~ 1e60 overflows float32
    with pytest.raises(FloatingPointError, match="overflow.*reduce lr"):
        opt.step()
    assert torch.equal(w, before)


@both_paths
def test_large_step_near_the_float_limit_is_checked_exactly_not_refused(compile):
    limit = torch.finfo(torch.float32).max ** 0.1  # |u|^10 overflows float32 beyond this
    w = torch.nn.Parameter(torch.tensor([(0.9 * limit) ** 10, 1.0]))
    opt = LpMirrorDescent([w], lr=0.2 * limit, p=1.1, compile=compile)
    w.grad = torch.tensor([1.0, 0.0])  # the crude bound 0.9 + 0.2 > 1 of the limit, the new dual 0.7
    opt.step()
    expected = mirror.mirror_step(torch.tensor([(0.9 * limit) ** 10, 1.0], dtype=torch.float64),
                                  torch.tensor([1.0, 0.0], dtype=torch.float64), 0.2 * limit, 1.1)
    torch.testing.assert_close(w.detach().double(), expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("p", [2.0, 1.5])
@both_paths
def test_an_empty_parameter_is_fine(p, compile):
    empty, w = torch.nn.Parameter(torch.zeros(0, 3)), torch.nn.Parameter(torch.ones(2))
    opt = LpMirrorDescent([empty, w], lr=0.1, p=p, compile=compile)
    empty.grad, w.grad = torch.zeros(0, 3), torch.ones(2)
    opt.step()
    torch.testing.assert_close(w.detach(), mirror.mirror_step(torch.ones(2), torch.ones(2), 0.1, p))


def test_sparse_gradient_is_refused():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = LpMirrorDescent(emb.parameters(), lr=0.1, p=1.5)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
@both_paths
def test_no_drift_over_1000_zero_gradient_steps(p, compile):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5000))
    start = w.detach().clone()
    opt = LpMirrorDescent([w], lr=0.1, p=p, compile=compile)
    for _ in range(1000):
        w.grad = torch.zeros_like(w)
        opt.step()
    assert ((w.detach() - start).norm() / start.norm()).item() < 1e-6


@both_paths
def test_outside_modification_is_picked_up(compile):
    w = torch.nn.Parameter(torch.randn(20, dtype=torch.float64))
    opt = LpMirrorDescent([w], lr=0.1, p=1.5, compile=compile)
    w.grad = torch.randn_like(w)
    opt.step()
    with torch.no_grad():
        w.mul_(0.5)  # e.g. a user's re-scaling or a checkpoint load
    edited = w.detach().clone()
    w.grad = torch.randn_like(w)
    opt.step()
    torch.testing.assert_close(w.detach(), mirror.mirror_step(edited, w.grad, 0.1, 1.5), rtol=1e-12, atol=0)


def test_low_precision_parameters_keep_a_float32_dual():
    w = torch.nn.Parameter(torch.randn(100).to(torch.bfloat16))
    opt = LpMirrorDescent([w], lr=1e-3, p=1.75)
    for _ in range(50):
        w.grad = torch.full_like(w, 1e-2)
        opt.step()
    assert opt.state[w]["dual"].dtype == torch.float32
    assert w.dtype == torch.bfloat16


@pytest.fixture(params=["cpu_kernel", "torch_compile"])
def compiled_route(request, monkeypatch):
    """The two routes of compile=True: the C++ kernel (CPU float tensors), and torch.compile (which
    GPU, low-precision and non-contiguous tensors take), forced here by declining the kernel."""
    if request.param == "torch_compile":
        from mdlib import cpu_kernel

        monkeypatch.setattr(cpu_kernel, "supports", lambda w, u: False)
    return request.param


@pytest.mark.slow
def test_compiled_path_matches_eager_and_restores_exactly(compiled_route):
    eager, fused = make_model(), make_model()
    train(eager, LpMirrorDescent(eager.parameters(), lr=0.01, p=1.75), 5)
    opt = LpMirrorDescent(fused.parameters(), lr=0.01, p=1.75, compile=True)
    train(fused, opt, 5)
    for x, y in zip(eager.parameters(), fused.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)
    assert_refused_unchanged(fused, opt, lambda m: m[0].weight.grad.__setitem__((0, 0), float("nan")),
                             r"params'\]\[0\]", seed=9)


@pytest.mark.slow
def test_compiled_path_restores_a_first_step_and_resumes_exactly(compiled_route):
    """A failure on the very first step (parameters not yet produced by the optimizer) is undone
    from a backup; a checkpoint taken in compiled mode resumes bit for bit."""
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=1.75, compile=True)
    assert_refused_unchanged(model, opt, lambda m: m[2].bias.grad.__setitem__(0, float("inf")), "non-finite")
    train(model, opt, 4)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    train(model, opt, 3, start=4)
    resumed = make_model(seed=99)
    resumed.load_state_dict(saved_model)
    opt2 = LpMirrorDescent(resumed.parameters(), lr=0.01, p=1.75, compile=True)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, 3, start=4)
    for x, y in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(x, y)


@pytest.mark.slow
def test_compiled_finiteness_flag_sees_one_bad_entry_anywhere():
    """The fused kernel's flag (max |w|, vectorized and split across threads) catches a single NaN,
    +inf or -inf in any lane, in the vector tail, and an overflow of |u|^r, in its own tensor only."""
    from mdlib.optim import _compiled, _fused_update

    sizes = (1, 17, 4099)
    fused = _compiled(_fused_update)
    lr = torch.tensor(1e-3, dtype=torch.float64)
    duals = [torch.linspace(-1, 1, n) for n in sizes]
    params = [torch.empty(n) for n in sizes]
    spares = [torch.empty(n) for n in sizes]
    assert fused(params, duals, spares, [torch.zeros(n) for n in sizes], lr, 10.0).all()
    for bad in (float("nan"), float("inf"), -float("inf"), 1e30):  # 1e30: |u - lr g|^10 overflows
        for k, n in enumerate(sizes):
            for position in sorted({0, n // 2, n - 2, n - 1} - {-1}):
                grads = [torch.zeros(m) for m in sizes]
                grads[k][position] = bad
                flags = fused(params, duals, spares, grads, lr, 10.0)
                assert flags.tolist() == [j != k for j in range(len(sizes))], (bad, n, position)
