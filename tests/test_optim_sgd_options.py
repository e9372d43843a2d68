"""LpMirrorDescent with torch.optim.SGD's options (weight decay, momentum, dampening, nesterov): SGD bit
for bit at p = 2 in every combination, an independent float64 reference in the mirror geometry, refusals
that restore the momentum buffers, the schedulers that need momentum; sparse gradients; the param-group
keys it refuses or warns about; no state shared between optimizers; ``check_edits=False``."""

import copy
import itertools
import warnings

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler

from mdlib.optim import LpMirrorDescent
from tiny_model import loss_of, make_model  # tests/tiny_model.py (pytest puts tests/ on the path)

PATHS = {"single": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
every_path = pytest.mark.parametrize("path", ["single", "foreach", pytest.param("fused", marks=pytest.mark.slow)])


def sgd_options():
    """Every valid combination of SGD's options (nesterov needs momentum and no dampening), and maximize."""
    out = []
    for momentum, dampening, weight_decay, nesterov, maximize in itertools.product(
            (0.0, 0.9), (0.0, 0.5), (0.0, 0.1), (False, True), (False, True)):
        if nesterov and (not momentum or dampening):
            continue
        if dampening and not momentum:
            continue
        out.append(dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize))
    return out


def option_id(options):
    return "-".join(f"{k}={v}" for k, v in options.items() if v) or "plain"


def train(model, opt, steps, start=0):
    for k in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, k).backward()
        opt.step()


@every_path
@pytest.mark.parametrize("lr", [0.05, "tensor"])
@pytest.mark.parametrize("options", sgd_options(), ids=option_id)
def test_p2_is_sgd_bit_for_bit_with_every_option(options, lr, path):
    a, b = make_model(), make_model()
    lr_a, lr_b = (torch.tensor(0.05), torch.tensor(0.05)) if lr == "tensor" else (lr, lr)
    ours = LpMirrorDescent(a.parameters(), lr=lr_a, p=2.0, **options, **PATHS[path])
    torchs = torch.optim.SGD(b.parameters(), lr=lr_b, **options, **PATHS[path])
    train(a, ours, 12)
    train(b, torchs, 12)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
        if options["momentum"]:
            assert torch.equal(ours.state[x]["momentum_buffer"], torchs.state[y]["momentum_buffer"])
    assert ours.state_dict()["state"].keys() == torchs.state_dict()["state"].keys()


def reference_run(initial, gradients, lr, p, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                  maximize=False):
    """w_t for every step, in float64 numpy: d = -g (maximize), d += weight_decay w, b = d (first step) or
    momentum b + (1 - dampening) d, d = d + momentum b (nesterov) or b; u <- u - lr d; w = m^-1(u)."""
    w = np.asarray(initial, dtype=np.float64)
    u = np.sign(w) * np.abs(w) ** (p - 1)
    buffer, out = None, []
    for g in gradients:
        d = -np.asarray(g, dtype=np.float64) if maximize else np.asarray(g, dtype=np.float64)
        d = d + weight_decay * w
        if momentum:
            buffer = d.copy() if buffer is None else momentum * buffer + (1 - dampening) * d
            d = d + momentum * buffer if nesterov else buffer
        u = u - lr * d
        w = np.sign(u) * np.abs(u) ** (1 / (p - 1))
        out.append(w)
    return out


@every_path
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
@pytest.mark.parametrize("options", [o for o in sgd_options() if o["momentum"] or o["weight_decay"]], ids=option_id)
def test_options_in_the_mirror_geometry_match_the_float64_reference(options, p, path):
    """The gradient's transformations are SGD's; the step applies their result to the dual."""
    gen = torch.Generator().manual_seed(3)
    initial = torch.randn(40, generator=gen, dtype=torch.float64)
    grads = [torch.randn(40, generator=gen, dtype=torch.float64) for _ in range(8)]
    w = torch.nn.Parameter(initial.clone())
    opt = LpMirrorDescent([w], lr=0.01, p=p, **options, **PATHS[path])
    expected = reference_run(initial.numpy(), [g.numpy() for g in grads], 0.01, p, **options)
    for g, want in zip(grads, expected):
        w.grad = g.clone()
        opt.step()
        np.testing.assert_allclose(w.detach().numpy(), want, rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("path", ["single", "foreach"])
@pytest.mark.parametrize("p", [1.75, 2.0])
def test_a_refused_step_restores_the_momentum_buffers(p, path):
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=p, momentum=0.9, weight_decay=0.01, **PATHS[path])
    train(model, opt, 3)
    params = [w.detach().clone() for w in model.parameters()]
    state = copy.deepcopy(opt.state_dict())
    opt.zero_grad()
    loss_of(model, 3).backward()
    model[2].bias.grad[0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"non-finite gradient in param_groups\[0\]\['params'\]\[3\]"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), params))
    now = opt.state_dict()["state"]
    assert now.keys() == state["state"].keys()
    for key, entry in state["state"].items():
        assert now[key].keys() == entry.keys() and all(torch.equal(now[key][k], v) for k, v in entry.items())


@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_momentum_state_round_trips_and_resumes_bit_for_bit(p):
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=p, momentum=0.9, nesterov=True)
    train(model, opt, 3)
    assert all(set(entry) == {"dual", "momentum_buffer"} for entry in opt.state_dict()["state"].values())
    other = make_model(seed=5)
    other.load_state_dict(model.state_dict())
    twin = LpMirrorDescent(other.parameters(), lr=0.01, p=p, momentum=0.9, nesterov=True)
    twin.load_state_dict(copy.deepcopy(opt.state_dict()))
    train(model, opt, 3, start=3)
    train(other, twin, 3, start=3)
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), other.parameters()))


@pytest.mark.parametrize("scheduler", [
    lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20),
    lambda opt: lr_scheduler.CyclicLR(opt, base_lr=0.001, max_lr=0.05, step_size_up=5),
], ids=["OneCycleLR", "CyclicLR"])
@pytest.mark.parametrize("p", [1.75, 2.0])
def test_schedulers_that_cycle_momentum_run_with_their_defaults(scheduler, p):
    """OneCycleLR and CyclicLR cycle the momentum by default: they need the group's ``momentum``."""
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=p, momentum=0.9)
    sched = scheduler(opt)
    momenta = []
    for k in range(15):
        train(model, opt, 1, start=k)
        sched.step()
        momenta.append(opt.param_groups[0]["momentum"])
    assert len(set(momenta)) > 1 and all(0.8 <= m <= 0.95 for m in momenta)
    assert all(torch.isfinite(w).all() for w in model.parameters())


# --- param-group keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, match", [
    ("weight_decy", 0.1, "did you mean 'weight_decay'"),
    ("momentun", 0.9, "did you mean 'momentum'"),
    ("betas", (0.9, 0.999), "belongs to another torch optimizer"),
    ("amsgrad", True, "belongs to another torch optimizer"),
    ("lazy_check", True, "attribute, not a param-group entry"),
])
def test_a_group_key_that_would_be_ignored_is_refused_by_name(key, value, match):
    w = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match=match):
        LpMirrorDescent([{"params": [w], key: value}], lr=0.1, p=1.5)


def test_a_metadata_key_is_kept_with_a_warning_and_torchs_own_keys_silently():
    w, v = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    with pytest.warns(UserWarning, match="ignores the param-group entry 'name'"):
        opt = LpMirrorDescent([{"params": [w], "name": "decoder"}], lr=0.1, p=1.5)
    assert opt.param_groups[0]["name"] == "decoder"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.add_param_group({"params": [v], "initial_lr": 0.1, "weight_decay": 0.5})


def test_weight_decay_in_a_group_is_applied_not_ignored():
    """The issue's trap: an AdamW-style group with weight_decay moved nothing at a zero gradient."""
    w = torch.nn.Parameter(torch.ones(4))
    opt = LpMirrorDescent([{"params": [w], "weight_decay": 0.5}], lr=0.1, p=1.75)
    w.grad = torch.zeros_like(w)
    opt.step()
    assert (w.detach() < 1).all()


# --- sparse gradients ------------------------------------------------------------------------------


def embeddings(p, sparse, seed=0):
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(50, 4, sparse=sparse).double()
    return emb, LpMirrorDescent(emb.parameters(), lr=0.05, p=p)


@pytest.mark.parametrize("p", [1.1, 1.75, 2.0, 3.0])
def test_a_sparse_gradient_updates_only_the_rows_it_touches(p):
    sparse, opt = embeddings(p, True)
    dense, opt_dense = embeddings(p, False)
    initial = sparse.weight.detach().clone()
    touched = set()
    for k in range(6):
        ids = torch.tensor([[k, k + 1, 7], [7, 2 * k, 3]])
        touched.update(ids.flatten().tolist())
        for emb, o in ((sparse, opt), (dense, opt_dense)):
            o.zero_grad()
            (emb(ids) ** 2).sum().backward()
            o.step()
    assert sparse.weight.grad.is_sparse and not dense.weight.grad.is_sparse
    rows = sorted(touched)
    untouched = sorted(set(range(50)) - touched)
    assert torch.equal(sparse.weight[untouched], initial[untouched])  # exactly: the dual is left alone there
    torch.testing.assert_close(sparse.weight[rows], dense.weight[rows], rtol=1e-13, atol=0)


@pytest.mark.parametrize("options, match", [
    (dict(momentum=0.9), "makes the step dense"), (dict(weight_decay=0.1), "makes the step dense"),
    (dict(normalize=True), "dense gradient"), (dict(fused=True), "`fused` does not support sparse")])
def test_sparse_gradients_with_options_that_make_the_step_dense_are_refused(options, match):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = LpMirrorDescent(emb.parameters(), lr=0.1, p=1.5, **options)
    emb(torch.tensor([1, 2])).sum().backward()
    before = emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match=match):
        opt.step()
    assert torch.equal(emb.weight, before) and len(opt.state) == 0


# --- no state shared between optimizers ------------------------------------------------------------


@every_path
def test_two_optimizers_with_different_lrs_interleaved_do_not_interfere(path):
    """Each optimizer keeps its own lr tensors and failure state (the fused kernels are shared: pure
    functions of their arguments)."""
    a1, b1, a2, b2 = make_model(seed=1), make_model(seed=2), make_model(seed=1), make_model(seed=2)
    opt_a1 = LpMirrorDescent(a1.parameters(), lr=0.02, p=1.75, **PATHS[path])
    opt_b1 = LpMirrorDescent(b1.parameters(), lr=0.005, p=1.75, **PATHS[path])
    for k in range(4):  # interleaved step by step
        train(a1, opt_a1, 1, start=k)
        train(b1, opt_b1, 1, start=k)
    train(a2, LpMirrorDescent(a2.parameters(), lr=0.02, p=1.75, **PATHS[path]), 4)  # alone
    train(b2, LpMirrorDescent(b2.parameters(), lr=0.005, p=1.75, **PATHS[path]), 4)
    for x, y in itertools.chain(zip(a1.parameters(), a2.parameters()), zip(b1.parameters(), b2.parameters())):
        assert torch.equal(x, y)


# --- check_edits=False -----------------------------------------------------------------------------


@every_path
@pytest.mark.parametrize("p", [1.1, 3.0])
def test_without_the_edit_check_the_steps_are_the_same_and_edits_need_resync(p, path):
    checked, unchecked = make_model(), make_model()
    opt = LpMirrorDescent(checked.parameters(), lr=0.01, p=p, momentum=0.5, **PATHS[path])
    fast = LpMirrorDescent(unchecked.parameters(), lr=0.01, p=p, momentum=0.5, check_edits=False, **PATHS[path])
    train(checked, opt, 4)
    train(unchecked, fast, 4)
    assert all(torch.equal(x, y) for x, y in zip(checked.parameters(), unchecked.parameters()))
    assert not any("copy" in state for state in fast.state.values())
    with torch.no_grad():
        unchecked[0].weight.data.clamp_(-0.1, 0.1)  # an edit the unchecked optimizer does not see
    train(unchecked, fast, 1, start=4)
    assert unchecked[0].weight.abs().max() > 0.1  # overwritten from the dual: what the docstring warns of
    with torch.no_grad():
        unchecked[0].weight.data.clamp_(-0.1, 0.1)
    fast.resync()
    train(unchecked, fast, 1, start=5)
    assert unchecked[0].weight.abs().max() < 0.1 + 0.05  # stepped from the edited weights


def test_check_edits_must_be_a_bool_and_survives_pickling():
    import pickle
    model = make_model()
    with pytest.raises(ValueError, match="check_edits must be True or False"):
        LpMirrorDescent(model.parameters(), check_edits=None)
    opt = LpMirrorDescent(model.parameters(), p=1.5, check_edits=False)
    assert pickle.loads(pickle.dumps(opt)).check_edits is False
