"""The LpMirrorDescent contract, on each implementation (single-tensor, foreach, fused by torch.compile):
SGD at p = 2, an independent float64 reference elsewhere, refused steps that change nothing, state_dict
round trips (across implementations too), schedulers, param groups, no drift, the compile fallback."""

import copy
import warnings

import numpy as np
import pytest
import torch

from mdlib import mirror
from mdlib.optim import _compiled, _steps, mirror_descent

from mdlib.experiments import methods
from mdlib.optim import LpMirrorDescent, lp_mirror_descent
from tiny_model import loss_of, make_model  # tests/tiny_model.py (pytest puts tests/ on the path)

#: The implementations, as LpMirrorDescent arguments (fused: forced on CPU; it compiles, hence slow).
PATHS = {"single": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
every_path = pytest.mark.parametrize("path", [
    "single", "foreach", pytest.param("fused", marks=pytest.mark.slow)])


def train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, k).backward()
        opt.step()


def snapshot(model, opt):
    """Parameters and optimizer state, cloned."""
    return [w.detach().clone() for w in model.parameters()], copy.deepcopy(opt.state_dict()["state"])


def assert_same(model, opt, saved):
    params, state = saved
    for w, b in zip(model.parameters(), params):
        assert torch.equal(w, b)
    now = opt.state_dict()["state"]
    assert now.keys() == state.keys()
    for key in state:
        assert state[key].keys() == now[key].keys()
        for name, value in state[key].items():
            assert torch.equal(now[key][name], value) if torch.is_tensor(value) else now[key][name] == value


def assert_refused_unchanged(model, opt, poison, match, seed=7):
    """Backward on a fresh batch, ``poison`` the gradients, and check the step raises ``match`` while
    every parameter and every state entry stays bit for bit as it was."""
    saved = snapshot(model, opt)
    loss_of(model, seed).backward()
    poison(model)
    with pytest.raises(FloatingPointError, match=match):
        opt.step()
    assert_same(model, opt, saved)


# --- an independent float64 reference (numpy): the dual is carried, as the optimizer carries it -------

def reference_run(initial, gradients, lr, p, normalize=False, eps=1e-12):
    """w_t for every step t, in float64: u_0 = sign(w)|w|^(p-1), u <- u - lr g (g normalized by its
    dual norm when asked), w = sign(u)|u|^(1/(p-1))."""
    w = np.asarray(initial, dtype=np.float64)
    u = np.sign(w) * np.abs(w) ** (p - 1)
    out = []
    for g in gradients:
        g = np.asarray(g, dtype=np.float64)
        if normalize:
            q = p / (p - 1)
            g = g / ((np.abs(g) ** q).sum() ** (1 / q) + eps)
        u = u - lr * g
        out.append(np.sign(u) * np.abs(u) ** (1 / (p - 1)))
    return out


@every_path
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_matches_the_float64_reference(p, normalize, dtype, path):
    gen = torch.Generator().manual_seed(0)
    shapes = [(40,), (3, 7), (1,)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)) for s in shapes]
    initial = [w.detach().double().numpy().copy() for w in params]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes] for _ in range(10)]
    opt = LpMirrorDescent(params, lr=0.02, p=p, normalize=normalize, **PATHS[path])
    for step in grads:
        for w, g in zip(params, step):
            w.grad = g.clone()
        opt.step()
    rtol = 1e-12 if dtype == torch.float64 else 3e-5  # float32: the dual's rounding over 10 steps
    for k, w in enumerate(params):
        expected = reference_run(initial[k], [step[k].double().numpy() for step in grads], 0.02, p, normalize)[-1]
        np.testing.assert_allclose(w.detach().double().numpy(), expected, rtol=rtol, atol=1e-6 * rtol)


@every_path
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_p2_is_sgd_bit_for_bit(dtype, path):
    a, b = make_model(dtype), make_model(dtype)
    train(a, LpMirrorDescent(a.parameters(), lr=0.05, **PATHS[path]), 25)
    train(b, torch.optim.SGD(b.parameters(), lr=0.05, foreach=path != "single"), 25)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


@every_path
def test_param_groups_have_their_own_lr_and_p(path):
    model = make_model(torch.float64)
    first, second = model[0], model[2]
    opt = LpMirrorDescent([{"params": first.parameters(), "p": 1.5, "lr": 0.02},
                           {"params": second.parameters()}], lr=0.1, p=3.0, **PATHS[path])
    before = {n: w.detach().numpy().copy() for n, w in model.named_parameters()}
    loss_of(model, 0).backward()
    grads = {n: w.grad.numpy().copy() for n, w in model.named_parameters()}
    opt.step()
    for name, w in model.named_parameters():
        p, lr = (1.5, 0.02) if name.startswith("0.") else (3.0, 0.1)
        np.testing.assert_allclose(w.detach().numpy(), reference_run(before[name], [grads[name]], lr, p)[0],
                                   rtol=1e-12, atol=1e-15)


@every_path
def test_scheduler_drives_lr(path):
    model = make_model(torch.float64)
    opt = LpMirrorDescent(model.parameters(), lr=0.1, p=1.75, **PATHS[path])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    train(model, opt, 2)  # the first step (new duals) and the later ones (verified duals): two kernels
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    kernels = len(_compiled._KERNELS)
    before = [w.detach().clone() for w in model.parameters()]
    opt.zero_grad()
    loss_of(model, 2).backward()
    grads = [w.grad.clone() for w in model.parameters()]
    opt.step()
    for w, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(w.detach(), mirror.mirror_step(b, g, 0.05, 1.75), rtol=1e-12, atol=1e-15)
    assert len(_compiled._KERNELS) == kernels  # a new lr is an argument of the fused kernel, not a recompile


@every_path
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_state_dict_round_trip_resumes_exactly(p, path):
    straight = make_model()
    train(straight, LpMirrorDescent(straight.parameters(), lr=0.01, p=p, **PATHS[path]), 12)

    first = make_model()
    opt1 = LpMirrorDescent(first.parameters(), lr=0.01, p=p, **PATHS[path])
    train(first, opt1, 5)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt1.state_dict())
    resumed = make_model(seed=99)  # different weights, overwritten by the checkpoint
    resumed.load_state_dict(saved_model)
    opt2 = LpMirrorDescent(resumed.parameters(), lr=0.01, p=p, **PATHS[path])
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, 7, start=5)
    for x, y in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("saver, loader", [("single", "foreach"), ("foreach", "single"),
                                           pytest.param("fused", "single", marks=pytest.mark.slow),
                                           pytest.param("single", "fused", marks=pytest.mark.slow)])
def test_a_state_saved_by_one_implementation_loads_into_another(saver, loader):
    """The implementation is not part of the state: a checkpoint resumes on any other, which keeps the
    saved dual wherever it reproduces the parameters and otherwise resynchronizes from them."""
    model = make_model(torch.float64)
    initial = [w.detach().numpy().copy() for w in model.parameters()]
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=1.75, **PATHS[saver])
    grads = []
    for k in range(4):
        opt.zero_grad()
        loss_of(model, k).backward()
        grads.append([w.grad.numpy().copy() for w in model.parameters()])
        opt.step()
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    resumed = make_model(torch.float64, seed=5)
    resumed.load_state_dict(saved_model)
    opt2 = LpMirrorDescent(resumed.parameters(), lr=0.01, p=1.75, **PATHS[loader])
    opt2.load_state_dict(saved_opt)
    group = opt2.param_groups[0]  # the implementation is the loader's, not the checkpoint's
    assert group["foreach"] is PATHS[loader].get("foreach") and group["fused"] is PATHS[loader].get("fused")
    for k in range(4, 8):
        opt2.zero_grad()
        loss_of(resumed, k).backward()
        grads.append([w.grad.numpy().copy() for w in resumed.parameters()])
        opt2.step()
    for i, w in enumerate(resumed.parameters()):
        expected = reference_run(initial[i], [g[i] for g in grads], 0.01, 1.75)[-1]
        np.testing.assert_allclose(w.detach().numpy(), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kwargs", [dict(lr=-1.0), dict(lr=float("nan")), dict(lr=float("inf")),
                                    dict(lr=torch.tensor(-1.0)), dict(lr=torch.tensor([0.1, 0.1])),
                                    dict(lr="0.1"), dict(lr=0.1, p=1.0),
                                    dict(lr=0.1, p=0.5), dict(lr=0.1, p=float("inf")), dict(lr=0.1, p=float("nan")),
                                    dict(lr=0.1, eps=-1.0), dict(maximize=1), dict(lazy_check="yes")])
def test_bad_hyperparameters_raise(kwargs):
    with pytest.raises(ValueError):
        LpMirrorDescent(make_model().parameters(), **kwargs)


@pytest.mark.parametrize("lr", [0.0, 0, torch.tensor(0.0), torch.tensor([0.5])])
def test_lr_zero_and_tensor_lr_are_accepted(lr):
    LpMirrorDescent(make_model().parameters(), lr=lr, p=1.5)
    assert LpMirrorDescent(make_model().parameters()).defaults["lr"] == 1e-3  # torch SGD's default


def test_foreach_and_fused_together_are_refused():
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        LpMirrorDescent(make_model().parameters(), lr=0.1, foreach=True, fused=True)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        LpMirrorDescent([{"params": make_model().parameters(), "foreach": True}], lr=0.1, fused=True)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        lp_mirror_descent([torch.zeros(1)], [torch.zeros(1)], None, None, lr=0.1, p=2.0, foreach=True, fused=True)


def test_bad_group_hyperparameters_raise():
    model = make_model()
    opt = LpMirrorDescent(model[0].parameters(), lr=0.1, p=1.5)
    with pytest.raises(ValueError, match="exponent"):
        opt.add_param_group({"params": model[2].parameters(), "p": 0.9})


def test_defaults_follow_torch_single_tensor_on_cpu(monkeypatch):
    """foreach=None: foreach only when every parameter is on CUDA (torch's rule), so the single-tensor
    implementation on CPU; fused=None: not fused; the finiteness check is immediate on CPU."""
    calls = []
    for name in ("_single_tensor_lpmirrordescent", "_multi_tensor_lpmirrordescent", "_fused_lpmirrordescent"):
        real = getattr(mirror_descent, name)
        monkeypatch.setattr(mirror_descent, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=1.5)
    train(model, opt, 1)
    assert calls == ["_single_tensor_lpmirrordescent"] and not opt._lazy() and not opt._guard.pending
    assert _steps._default_foreach([torch.zeros(1)]) is False
    assert _steps._default_foreach([torch.zeros(1, device="meta")]) is False


@every_path
@pytest.mark.parametrize("p", [2.0, 1.75])
@pytest.mark.parametrize("warm", [False, True])
def test_non_finite_gradient_names_parameter_and_changes_nothing(p, warm, path):
    model = make_model()
    opt = LpMirrorDescent(model.named_parameters(), lr=0.01, p=p, **PATHS[path])
    if warm:
        train(model, opt, 3)
    assert_refused_unchanged(model, opt, lambda m: m[2].weight.grad.__setitem__((0, 1), float("inf")),
                             r"non-finite gradient in 2\.weight.*reduce lr")
    # the optimizer still works afterwards, from the untouched parameters
    opt.zero_grad()
    loss_of(model, 8).backward()
    opt.step()


@every_path
@pytest.mark.parametrize("warm", [False, True])
def test_overflow_raises_and_changes_nothing(warm, path):
    w = torch.nn.Parameter(torch.linspace(1.0, 50.0, 10))
    opt = LpMirrorDescent([w], lr=1e-3, p=1.1, **PATHS[path])
    if warm:
        for _ in range(3):
            w.grad = torch.ones_like(w) * 1e-3
            opt.step()
    before, state = w.detach().clone(), copy.deepcopy(opt.state_dict()["state"])
    w.grad = -torch.ones_like(w)
    opt.param_groups[0]["lr"] = 1e6  # u -> u + 1e6, then |u|^10 ~ 1e60 overflows float32
    with pytest.raises(FloatingPointError, match=r"overflow.*params'\]\[0\].*reduce lr"):
        opt.step()
    assert torch.equal(w, before)
    for key, value in state.get(0, {}).items():
        assert torch.equal(opt.state[w][key], value) if torch.is_tensor(value) else opt.state[w][key] == value


@every_path
def test_a_refusal_in_one_group_undoes_the_groups_before_it(path):
    model = make_model()
    opt = LpMirrorDescent([{"params": model[0].parameters()}, {"params": model[2].parameters(), "p": 3.0}],
                          lr=0.01, p=1.5, **PATHS[path])
    train(model, opt, 2)
    assert_refused_unchanged(model, opt, lambda m: m[2].bias.grad.__setitem__(0, float("nan")), "non-finite")


@every_path
def test_lazy_check_undoes_a_refused_step_at_the_next_call(path):
    """lazy_check=True (the GPU default, forced here on CPU): the step returns without reading its flags;
    the next step() (or check(), or state_dict()) finds the refusal, restores parameters and state as they
    were before the refused step, and raises naming the parameter; training then goes on."""
    model = make_model()
    opt = LpMirrorDescent(model.named_parameters(), lr=0.01, p=1.75, lazy_check=True, **PATHS[path])
    train(model, opt, 3)
    saved = snapshot(model, opt)  # state_dict() settles the last step first
    loss_of(model, 7).backward()
    model[0].weight.grad[1, 2] = float("nan")
    opt.step()  # no error yet
    assert not torch.isfinite(model[0].weight).all()  # the refused step is visible until it is settled
    opt.zero_grad()
    loss_of(model, 8).backward()
    with pytest.raises(FloatingPointError, match=r"non-finite gradient in 0\.weight \(found at the next step"):
        opt.step()
    assert_same(model, opt, saved)
    train(model, opt, 2, start=9)
    opt.check()
    for settle in ("check", "state_dict"):
        loss_of(model, 20).backward()
        model[2].bias.grad[0] = float("inf")
        opt.step()
        with pytest.raises(FloatingPointError, match=r"2\.bias"):
            getattr(opt, settle)()
        opt.zero_grad()


@every_path
def test_large_step_near_the_float_limit_is_checked_exactly_not_refused(path):
    limit = torch.finfo(torch.float32).max ** 0.1  # |u|^10 overflows float32 beyond this
    w = torch.nn.Parameter(torch.tensor([(0.9 * limit) ** 10, 1.0]))
    opt = LpMirrorDescent([w], lr=0.2 * limit, p=1.1, **PATHS[path])
    w.grad = torch.tensor([1.0, 0.0])  # the crude bound 0.9 + 0.2 > 1 of the limit, the new dual 0.7
    opt.step()
    expected = mirror.mirror_step(torch.tensor([(0.9 * limit) ** 10, 1.0], dtype=torch.float64),
                                  torch.tensor([1.0, 0.0], dtype=torch.float64), 0.2 * limit, 1.1)
    torch.testing.assert_close(w.detach().double(), expected, rtol=1e-5, atol=0)


@every_path
@pytest.mark.parametrize("p", [2.0, 1.5])
def test_an_empty_parameter_is_fine(p, path):
    empty, w = torch.nn.Parameter(torch.zeros(0, 3)), torch.nn.Parameter(torch.ones(2))
    opt = LpMirrorDescent([empty, w], lr=0.1, p=p, **PATHS[path])
    empty.grad, w.grad = torch.zeros(0, 3), torch.ones(2)
    opt.step()
    torch.testing.assert_close(w.detach(), mirror.mirror_step(torch.ones(2), torch.ones(2), 0.1, p))


@every_path
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_no_drift_over_1000_zero_gradient_steps(p, path):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5000))
    start = w.detach().clone()
    opt = LpMirrorDescent([w], lr=0.1, p=p, **PATHS[path])
    for _ in range(1000):
        w.grad = torch.zeros_like(w)
        opt.step()
    assert ((w.detach() - start).norm() / start.norm()).item() < 1e-6


@every_path
def test_outside_modification_is_picked_up(path):
    w = torch.nn.Parameter(torch.randn(20, dtype=torch.float64))
    opt = LpMirrorDescent([w], lr=0.1, p=1.5, **PATHS[path])
    w.grad = torch.randn_like(w)
    opt.step()
    with torch.no_grad():
        w.mul_(0.5)  # e.g. a user's re-scaling or a checkpoint load
    edited = w.detach().clone()
    w.grad = torch.randn_like(w)
    opt.step()
    torch.testing.assert_close(w.detach(), mirror.mirror_step(edited, w.grad, 0.1, 1.5), rtol=1e-12, atol=0)


@every_path
def test_low_precision_parameters_keep_a_float32_dual(path):
    w = torch.nn.Parameter(torch.randn(100).to(torch.bfloat16))
    opt = LpMirrorDescent([w], lr=1e-3, p=1.75, **PATHS[path])
    for _ in range(50):
        w.grad = torch.full_like(w, 1e-2)
        opt.step()
    assert opt.state[w]["dual"].dtype == torch.float32
    assert w.dtype == torch.bfloat16
    torch.testing.assert_close(w.detach().float(), mirror.inverse_mirror_map(opt.state[w]["dual"], 1.75).bfloat16()
                               .float())


def failing_compile(fn, **kwargs):
    """torch.compile as on a machine where it cannot build kernels (no C++ compiler, unsupported Python)."""
    def compiled(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
    return compiled


def test_fused_falls_back_with_one_warning_when_compiling_fails(monkeypatch):
    monkeypatch.setattr(_compiled, "_KERNELS", {})
    monkeypatch.setattr(torch, "compile", failing_compile)
    fused, single = make_model(), make_model()
    opt = LpMirrorDescent(fused.parameters(), lr=0.01, p=1.75, fused=True)
    with pytest.warns(UserWarning, match="torch.compile failed.*No working C\\+\\+ compiler"):
        train(fused, opt, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per optimizer, not per step
        train(fused, opt, 4, start=1)
    other = make_model()
    with pytest.warns(UserWarning, match="torch.compile failed"):  # the failure is that optimizer's own
        train(other, LpMirrorDescent(other.parameters(), lr=0.01, p=1.75, fused=True), 1)
    train(single, LpMirrorDescent(single.parameters(), lr=0.01, p=1.75), 5)
    for x, y in zip(fused.parameters(), single.parameters()):
        assert torch.equal(x, y)  # the fallback is the single-tensor implementation on CPU
    assert_refused_unchanged(fused, opt, lambda m: m[0].bias.grad.__setitem__(1, float("nan")), "non-finite")


def test_fused_failing_halfway_leaves_the_fallback_a_clean_start(monkeypatch):
    """A kernel that dies after writing some outputs: the fallback recomputes every output from the
    untouched duals and gradients, so the step is exactly the single-tensor one."""

    def half_written(*tensors, **kwargs):
        def run(params, grads, duals, spares, lr, *static):
            params[0].fill_(float("nan"))
            spares[0].fill_(123.0)
            raise RuntimeError("kernel died")
        return run

    monkeypatch.setattr(_compiled, "_kernel", half_written)
    fused, single = make_model(), make_model()
    with pytest.warns(UserWarning, match="kernel died"):
        train(fused, LpMirrorDescent(fused.parameters(), lr=0.01, p=1.1, fused=True), 3)
    train(single, LpMirrorDescent(single.parameters(), lr=0.01, p=1.1), 3)
    for x, y in zip(fused.parameters(), single.parameters()):
        assert torch.equal(x, y)


@pytest.mark.slow
def test_fused_finiteness_flag_sees_one_bad_entry_anywhere():
    """The compiled kernel's flag (max |w|, vectorized and split across threads) catches a single NaN,
    +inf or -inf in any lane, in the vector tail, and an overflow of |u|^r, in its own tensor only."""
    sizes = (1, 17, 4099)
    duals = [torch.linspace(-1, 1, n) for n in sizes]
    params = [torch.empty(n) for n in sizes]
    spares = [torch.empty(n) for n in sizes]
    flags = lp_mirror_descent(params, [torch.zeros(n) for n in sizes], duals, spares, lr=1e-3, p=1.1, fused=True).finite
    assert flags.all()
    for bad in (float("nan"), float("inf"), -float("inf"), 1e30):  # 1e30: |u - lr g|^10 overflows
        for k, n in enumerate(sizes):
            for position in sorted({0, n // 2, n - 2, n - 1} - {-1}):
                grads = [torch.zeros(m) for m in sizes]
                grads[k][position] = bad
                flags = lp_mirror_descent(params, grads, duals, spares, lr=1e-3, p=1.1, fused=True).finite
                assert flags.tolist() == [j != k for j in range(len(sizes))], (bad, n, position)


def test_make_optimizer_by_name():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert isinstance(methods.make_optimizer(params, "adam", 1e-3), torch.optim.Adam)
    assert isinstance(methods.make_optimizer(params, "sgd", 1e-1), torch.optim.SGD)
    assert methods.make_optimizer(params, "md", 1e-1, p=3.0).defaults["p"] == 3.0
    with pytest.raises(ValueError, match="needs the exponent p"):
        methods.make_optimizer(params, "md", 1e-1)
    with pytest.raises(ValueError, match="takes no exponent"):
        methods.make_optimizer(params, "adam", 1e-3, p=2.0)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        methods.make_optimizer(params, "lion", 1e-3)
    # CPU: torch's defaults (single-tensor, checked at once); parameters may come as generators or groups
    md = methods.make_optimizer(iter(params), "md", 1e-1, p=1.5)
    group = md.param_groups[0]
    assert (group["foreach"], group["fused"], md._lazy()) == (None, None, False) and group["params"] == params
    md = methods.make_optimizer([{"params": iter(params), "lr": 0.5}], "md", 1e-1, p=1.5)
    assert md.param_groups[0]["params"] == params and md.param_groups[0]["lr"] == 0.5
