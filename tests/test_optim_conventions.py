"""LpMirrorDescent follows torch.optim's conventions: lr >= 0 (also a tensor, also reached by every
scheduler), maximize, foreach/fused as param-group entries, state only in ``self.state``, parameters
edited outside the optimizer (through ``.data`` too) respected, deepcopy/pickle, low-precision
checkpoints, refused param groups, complex parameters, fused refusals, the lazy check's settle points.
Each on every implementation (single-tensor, foreach, fused by torch.compile: slow, it compiles)."""

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler
from torch.optim.swa_utils import SWALR

from mdlib import mirror, optim
from mdlib.mirror import _foreach_signed_power_into, _signed_power_into
from mdlib.optim import LpMirrorDescent, lp_mirror_descent
from tiny_model import loss_of, make_model  # tests/tiny_model.py (pytest puts tests/ on the path)

PATHS = {"single": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True),
         "lazy": dict(foreach=False, lazy_check=True), "lazy-foreach": dict(foreach=True, lazy_check=True),
         "lazy-fused": dict(fused=True, lazy_check=True)}
FAST = ("single", "foreach", "lazy", "lazy-foreach")
every_path = pytest.mark.parametrize("path", [*FAST, pytest.param("fused", marks=pytest.mark.slow)])
#: also the fused kernel's own (lazy) check
all_checks = pytest.mark.parametrize("path", [*FAST, *(pytest.param(p, marks=pytest.mark.slow)
                                                      for p in ("fused", "lazy-fused"))])
eager_paths = pytest.mark.parametrize("path", FAST)


def train(model, opt, steps, start=0, sign=1.0):
    for k in range(start, start + steps):
        opt.zero_grad()
        (sign * loss_of(model, k)).backward()
        opt.step()
    if isinstance(opt, LpMirrorDescent):
        opt.check()


def trained(steps, dtype=None, *, named=False, **kwargs):
    """A tiny model (of ``dtype``, else the default) and ``LpMirrorDescent(**kwargs)`` over its
    parameters (``named``: named ones) after ``steps`` training steps."""
    model = make_model() if dtype is None else make_model(dtype)
    opt = LpMirrorDescent(model.named_parameters() if named else model.parameters(), **kwargs)
    train(model, opt, steps)
    return model, opt


def params_of(model):
    return [w.detach().clone() for w in model.parameters()]


def assert_bitwise(xs, ys):
    for x, y in zip(xs, ys, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


def saved_state(opt):
    return copy.deepcopy(opt.state_dict())


def assert_same_state(a, b):
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert a["state"][key].keys() == b["state"][key].keys()
        for name, value in a["state"][key].items():
            assert torch.equal(value, b["state"][key][name])
    assert [{k: v for k, v in g.items()} for g in a["param_groups"]] == b["param_groups"]


# --- 1. lr -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("lr", [-1.0, -1e-30, float("nan"), float("inf"), torch.tensor(-0.1), torch.tensor(math.nan),
                                torch.tensor([0.1, 0.2]), "0.1", True])
def test_a_bad_lr_is_refused_at_construction_and_in_add_param_group(lr):
    model = make_model()
    with pytest.raises(ValueError, match="lr"):
        LpMirrorDescent(model.parameters(), lr=lr, p=1.5)
    opt = LpMirrorDescent(model[0].parameters(), lr=0.1, p=1.5)
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": model[2].parameters(), "lr": lr})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("p", [1.0, 0.5, -2.0, float("inf"), float("nan")])
def test_p_at_most_1_is_still_refused(p):
    with pytest.raises(ValueError, match="exponent"):
        LpMirrorDescent(make_model().parameters(), lr=0.1, p=p)


def test_the_default_lr_is_sgds():
    assert LpMirrorDescent(make_model().parameters()).defaults["lr"] == torch.optim.SGD(
        make_model().parameters()).defaults["lr"] == 1e-3


@every_path
@pytest.mark.parametrize("p", [2.0, 1.75])
def test_lr_zero_is_a_step_that_changes_nothing(p, path):
    """lr = 0 (where a schedule starts or ends) is accepted, at construction and at step(); once the
    dual exists, a step at lr 0 leaves the parameters bit for bit as they are."""
    model, opt = trained(1, lr=0.0, p=p, **PATHS[path])
    before = params_of(model)
    train(model, opt, 3, start=1)
    assert_bitwise(params_of(model), before)
    opt.param_groups[0]["lr"] = 0.05
    train(model, opt, 1, start=4)
    assert not all(torch.equal(a, b) for a, b in zip(params_of(model), before))


@every_path
@pytest.mark.parametrize("p", [2.0, 1.1, 1.75, 3.0])
def test_a_tensor_lr_is_the_same_step_as_its_value(p, path):
    """A 0-dim tensor lr (as Adam accepts) on every implementation: bit for bit the step of the float it
    holds (the scheduler changes it in place)."""
    a, b = make_model(), make_model()
    lr = torch.tensor(0.02)
    opt_a = LpMirrorDescent(a.parameters(), lr=lr, p=p, **PATHS[path])
    opt_b = LpMirrorDescent(b.parameters(), lr=float(lr), p=p, **PATHS[path])
    train(a, opt_a, 3)
    train(b, opt_b, 3)
    assert_bitwise(params_of(a), params_of(b))
    lr.fill_(0.01)
    opt_b.param_groups[0]["lr"] = float(lr)
    train(a, opt_a, 2, start=3)
    train(b, opt_b, 2, start=3)
    assert_bitwise(params_of(a), params_of(b))
    assert opt_a.param_groups[0]["lr"] is lr


@pytest.mark.parametrize("path", ["single", "foreach"])
def test_p2_with_a_tensor_lr_and_maximize_is_sgd_bit_for_bit(path):
    for kwargs in (dict(lr=torch.tensor(0.03)), dict(lr=0.03, maximize=True),
                   dict(lr=torch.tensor(0.03), maximize=True)):
        a, b = make_model(), make_model()
        train(a, LpMirrorDescent(a.parameters(), **kwargs, **PATHS[path]), 10)
        train(b, torch.optim.SGD(b.parameters(), **kwargs, foreach=path == "foreach"), 10)
        assert_bitwise(params_of(a), params_of(b))


@every_path
@pytest.mark.parametrize("p", [2.0, 1.75])
def test_a_non_finite_lr_at_step_is_refused_and_changes_nothing(p, path):
    model, opt = trained(2, lr=0.05, p=p, **PATHS[path])
    before, state = params_of(model), saved_state(opt)
    opt.param_groups[0]["lr"] = math.inf  # what no scheduler does
    loss_of(model, 5).backward()
    with pytest.raises(FloatingPointError, match="not finite|non-finite"):
        opt.step()
        opt.check()
    assert_bitwise(params_of(model), before)
    opt.param_groups[0]["lr"] = 0.05
    assert_same_state(saved_state(opt), state)


# --- 2. maximize -----------------------------------------------------------------------------------


@every_path
@pytest.mark.parametrize("p", [2.0, 1.1, 1.75, 3.0])
@pytest.mark.parametrize("normalize", [False, True])
def test_maximize_is_minimizing_the_negated_loss_bit_for_bit(p, normalize, path):
    a, b = make_model(), make_model()
    opt_a = LpMirrorDescent(a.parameters(), lr=0.01, p=p, normalize=normalize, maximize=True, **PATHS[path])
    opt_b = LpMirrorDescent(b.parameters(), lr=0.01, p=p, normalize=normalize, **PATHS[path])
    train(a, opt_a, 5)
    train(b, opt_b, 5, sign=-1.0)
    assert_bitwise(params_of(a), params_of(b))
    assert opt_a.param_groups[0]["maximize"] is True and opt_b.defaults["maximize"] is False


def test_maximize_goes_uphill():
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=1.75, maximize=True)
    start = loss_of(model, 0).item()
    for _ in range(20):
        opt.zero_grad()
        loss_of(model, 0).backward()
        opt.step()
    assert loss_of(model, 0).item() > start


# --- 3. foreach / fused / lazy_check ---------------------------------------------------------------


def test_foreach_and_fused_are_param_group_entries_back_filled_by_setstate():
    model = make_model()
    opt = LpMirrorDescent([{"params": model[0].parameters(), "foreach": True},
                           {"params": model[2].parameters(), "p": 3.0}], lr=0.05, p=1.5, fused=False)
    assert {k: opt.defaults[k] for k in ("foreach", "fused", "maximize")} == dict(foreach=None, fused=False,
                                                                                 maximize=False)
    assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [(True, False), (None, False)]
    train(model, opt, 2)
    older = saved_state(opt)  # as a checkpoint written before these entries existed
    for group in older["param_groups"]:
        for key in ("foreach", "fused", "maximize", "normalize", "eps"):
            del group[key]
    fresh = make_model(seed=3)
    fresh.load_state_dict(model.state_dict())
    again = LpMirrorDescent([{"params": fresh[0].parameters(), "foreach": True},
                             {"params": fresh[2].parameters(), "p": 3.0}], lr=0.05, p=1.5, fused=False)
    again.load_state_dict(older)
    assert [(g["foreach"], g["fused"], g["maximize"], g["normalize"], g["eps"]) for g in again.param_groups] == [
        (True, False, False, False, 1e-12), (None, False, False, False, 1e-12)]
    train(model, opt, 2, start=2)
    train(fresh, again, 2, start=2)
    assert_bitwise(params_of(model), params_of(fresh))


def test_lazy_check_is_a_documented_attribute_not_a_param_group_entry():
    opt = LpMirrorDescent(make_model().parameters(), lr=0.1, p=1.5, lazy_check=True)
    assert opt.lazy_check is True and "lazy_check" not in opt.param_groups[0] and "lazy_check" not in opt.defaults
    assert "lazy_check" in LpMirrorDescent.__doc__ and "lazy_check" in optim.__doc__
    assert copy.deepcopy(opt).lazy_check is True


# --- 4. per-parameter state ------------------------------------------------------------------------


@every_path
@pytest.mark.parametrize("p", [1.1, 1.75])
def test_state_lives_in_self_state_as_tensors_and_state_dict_keeps_only_the_dual(p, path):
    model, opt = trained(3, named=True, lr=0.01, p=p, **PATHS[path])
    for w in model.parameters():
        state = opt.state[w]
        assert all(torch.is_tensor(v) for v in state.values()), state.keys()
        assert state["dual"].dtype == w.dtype and ("spare" in state or "copy" in state)
    for name, value in vars(opt).items():  # no per-parameter bookkeeping outside self.state
        if name != "state" and isinstance(value, dict):
            assert not any(torch.is_tensor(k) for k in value), name
    saved = opt.state_dict()
    assert all(set(entry) == {"dual"} for entry in saved["state"].values())
    # the spare is not saved, and not missed: a round trip resumes bit for bit
    other = make_model(seed=4)
    other.load_state_dict(model.state_dict())
    opt2 = LpMirrorDescent(other.named_parameters(), lr=0.01, p=p, **PATHS[path])
    opt2.load_state_dict(copy.deepcopy(saved))
    train(model, opt, 3, start=3)
    train(other, opt2, 3, start=3)
    assert_bitwise(params_of(model), params_of(other))


def test_p2_keeps_no_state():
    model, opt = trained(3, lr=0.05)
    assert len(opt.state) == 0 and opt.state_dict()["state"] == {}


# --- 5. parameters edited outside the optimizer ----------------------------------------------------


def todays_update(model, steps, lr, p, foreach, start=0):
    """The update as it was before the edit check (commit 2b22a66), for a bit-for-bit comparison: the dual
    carried from u_0 = m(w_0), u <- u - lr g, w <- m^-1(u), by the same primitive kernels."""
    r = 1.0 / (p - 1.0)
    params = list(model.parameters())
    duals = [mirror.mirror_map(w.detach().to(torch.float32 if w.dtype in (torch.float16, torch.bfloat16)
                                              else w.dtype), p) for w in params]
    for k in range(start, start + steps):
        for w in params:
            w.grad = None
        loss_of(model, k).backward()
        grads = [w.grad for w in params]
        with torch.no_grad():
            if foreach:
                torch._foreach_add_(duals, grads, alpha=-lr)
                _foreach_signed_power_into(duals, r, params)
            else:
                for w, g, u in zip(params, grads, duals):
                    u.add_(g, alpha=-lr)
                    _signed_power_into(u, r, w)


@pytest.mark.parametrize("path", FAST)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [1.1, 1.5, 1.75, 3.0])
def test_without_edits_training_is_bit_for_bit_todays_update(p, dtype, path):
    a, b = make_model(dtype), make_model(dtype)
    train(a, LpMirrorDescent(a.parameters(), lr=0.01, p=p, **PATHS[path]), 12)
    todays_update(b, 12, 0.01, p, foreach="foreach" in path)
    assert_bitwise(params_of(a), params_of(b))


@pytest.mark.slow
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_without_edits_fused_training_is_bit_for_bit_the_unchecked_kernel(p, dtype, lazy):
    """The fused step with its check (on the host, or in the kernel when lazy), against the functional
    fused update (the kernel as it was, no check) with the duals carried by hand."""
    a, b = make_model(dtype), make_model(dtype)
    train(a, LpMirrorDescent(a.parameters(), lr=0.01, p=p, fused=True, lazy_check=lazy), 8)
    params = list(b.parameters())
    duals = [mirror.mirror_map(w.detach().float() if dtype == torch.bfloat16 else w.detach(), p) for w in params]
    spares = [torch.empty_like(u) for u in duals]
    for k in range(8):
        b.zero_grad()
        loss_of(b, k).backward()
        with torch.no_grad():
            lp_mirror_descent(params, [w.grad for w in params], duals, spares, lr=0.01, p=p, fused=True)
        duals, spares = spares, duals
    assert_bitwise(params_of(a), params_of(b))


def edit_clamp(model):
    for w in model.parameters():
        w.data.clamp_(-0.1, 0.1)  # through .data: the version counter does not see it


def edit_vector(model):
    vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach() * 0.5
    torch.nn.utils.vector_to_parameters(vector, model.parameters())


def edit_no_grad(model):
    with torch.no_grad():
        model[0].weight[0].fill_(0.25)  # an ordinary in-place edit: part of one tensor


def assert_next_step_is_the_reference(model, opt, k, lr, p):
    """The next step (on the gradient of ``loss_of(model, k)``) takes each float64 parameter w to
    m^-1(m(w) - lr g), :func:`mdlib.mirror.mirror_step` from the parameters as they are now."""
    before = params_of(model)
    loss_of(model, k).backward()
    grads = [w.grad.clone() for w in model.parameters()]
    opt.step()
    opt.check()
    for w, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(w.detach(), mirror.mirror_step(b, g, lr, p), rtol=1e-12, atol=1e-15)


@all_checks
@pytest.mark.parametrize("edit", [edit_clamp, edit_vector, edit_no_grad])
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_an_edit_outside_the_optimizer_is_stepped_from(edit, p, path):
    """The step after an edit starts from the edited parameter: m^-1(m(w_edited) - lr g), entry by
    entry against the float64 reference (the dual of the unedited entries is kept as it was)."""
    model, opt = trained(3, torch.float64, lr=0.01, p=p, **PATHS[path])
    edit(model)
    assert_next_step_is_the_reference(model, opt, 9, 0.01, p)
    if edit is edit_clamp:
        assert max(w.abs().max().item() for w in model.parameters()) < 0.2  # not 1.18 as before


@eager_paths
def test_the_issues_clamped_weight_stays_near_its_clamp(path):
    w = torch.nn.Parameter(torch.tensor([1.2, -0.7, 0.05]))
    opt = LpMirrorDescent([w], lr=1e-3, p=1.75, **PATHS[path])
    w.grad = torch.full_like(w, 0.01)
    opt.step()
    w.data.clamp_(max=0.1)
    w.grad = torch.full_like(w, 0.01)
    opt.step()
    opt.check()
    assert w[0].item() == pytest.approx(0.1, abs=2e-3)


@all_checks
def test_changing_p_of_a_group_is_picked_up(path):
    model, opt = trained(3, torch.float64, lr=0.01, p=1.5, **PATHS[path])
    opt.param_groups[0]["p"] = 3.0
    assert_next_step_is_the_reference(model, opt, 7, 0.01, 3.0)


@pytest.mark.parametrize("path", ["single", "foreach", pytest.param("fused", marks=pytest.mark.slow)])
@pytest.mark.parametrize("p", [1.75, 2.0])
def test_a_refused_step_after_an_edit_restores_the_edited_parameters_bit_for_bit(p, path):
    model, opt = trained(3, named=True, lr=0.01, p=p, **PATHS[path])
    edit_clamp(model)
    edited, state = params_of(model), saved_state(opt)
    loss_of(model, 5).backward()
    model[0].bias.grad[0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"0\.bias"):
        opt.step()
    assert_bitwise(params_of(model), edited)
    assert_same_state(saved_state(opt), state)
    model.zero_grad()
    loss_of(model, 6).backward()
    grads = [w.grad.clone() for w in model.parameters()]
    opt.step()  # and the next step starts from the edit
    for w, e, g in zip(model.parameters(), edited, grads):
        torch.testing.assert_close(w.detach().double(), mirror.mirror_step(e.double(), g.double(), 0.01, p),
                                   rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("path", ["lazy", "lazy-foreach", pytest.param("lazy-fused", marks=pytest.mark.slow)])
def test_a_lazily_refused_step_after_an_edit_restores_it_within_one_rounding(path):
    """The documented exception: a lazily checked step re-derives the dual of an edited entry before it
    updates, so its refusal restores m^-1(m(w)) there (and everything else bit for bit)."""
    model, opt = trained(3, named=True, lr=0.01, p=1.75, **PATHS[path])
    edit_clamp(model)
    edited = params_of(model)
    loss_of(model, 5).backward()
    model[0].bias.grad[0] = float("nan")
    opt.step()
    with pytest.raises(FloatingPointError, match=r"0\.bias.*lazy_check"):
        opt.check()
    for w, e in zip(model.parameters(), edited):
        torch.testing.assert_close(w.detach(), e, rtol=1e-6, atol=0)


# --- 6. deepcopy and pickle ------------------------------------------------------------------------


@every_path
@pytest.mark.parametrize("clone", ["deepcopy", "pickle"])
def test_a_copy_of_the_optimizer_steps_as_the_original(clone, path):
    model, opt = trained(3, lr=0.01, p=1.75, **PATHS[path])
    twin = copy.deepcopy(opt) if clone == "deepcopy" else pickle.loads(pickle.dumps(opt))
    assert {k for k in vars(twin) if not k.startswith("_")} == {k for k in vars(opt) if not k.startswith("_")}
    twin_params = twin.param_groups[0]["params"]
    assert all(a is not b and torch.equal(a, b) for a, b in zip(twin_params, model.parameters()))
    for k in range(3, 6):
        opt.zero_grad()
        loss_of(model, k).backward()
        for a, b in zip(twin_params, model.parameters()):
            a.grad = b.grad.clone()
        opt.step()
        twin.step()
    twin.check()
    assert_bitwise([w.detach() for w in twin_params], params_of(model))


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda opt: pickle.loads(pickle.dumps(opt))])
def test_copying_settles_a_lazily_checked_step(clone):
    model, opt = trained(2, named=True, lr=0.01, p=1.75, lazy_check=True)
    before = params_of(model)
    loss_of(model, 5).backward()
    model[2].weight.grad[0, 0] = float("inf")
    opt.step()
    with pytest.raises(FloatingPointError, match=r"2\.weight"):
        clone(opt)
    assert_bitwise(params_of(model), before)
    assert clone(opt).param_groups[0]["p"] == 1.75


# --- 7. low-precision checkpoints ------------------------------------------------------------------


@every_path
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_checkpoint_resumes_exactly(dtype, path):
    """bf16/fp16 parameters keep a float32 dual, also through torch.save/load_state_dict (torch's
    load_state_dict would cast it to the parameter's dtype): train 5, save, train 5; or load into a fresh
    model and optimizer and train 5: bit for bit the same."""
    model, opt = trained(5, dtype, lr=0.01, p=1.75, **PATHS[path])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
    train(model, opt, 5, start=5)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    assert all(entry["dual"].dtype == torch.float32 for entry in checkpoint["optimizer"]["state"].values())
    fresh = make_model(dtype, seed=7)
    fresh.load_state_dict(checkpoint["model"])
    opt2 = LpMirrorDescent(fresh.parameters(), lr=0.01, p=1.75, **PATHS[path])
    opt2.load_state_dict(checkpoint["optimizer"])
    assert all(opt2.state[w]["dual"].dtype == torch.float32 for w in fresh.parameters())
    train(fresh, opt2, 5, start=5)
    assert_bitwise(params_of(fresh), params_of(model))


def test_loaded_duals_are_copies_in_the_dual_dtype():
    model, opt = trained(2, torch.bfloat16, lr=0.01, p=1.75)
    saved = opt.state_dict()  # references the live duals, as torch's state_dict does
    opt2 = LpMirrorDescent(model.parameters(), lr=0.01, p=1.75)
    opt2.load_state_dict(saved)
    w = next(model.parameters())
    assert opt2.state[w]["dual"] is not opt.state[w]["dual"]
    assert torch.equal(opt2.state[w]["dual"], opt.state[w]["dual"])
    dual = torch.ones(3, dtype=torch.float64)
    assert LpMirrorDescent._cast_loaded_state(
        torch.zeros(3, dtype=torch.float16), dual, 0, opt.param_groups, key="dual").dtype == torch.float32
    assert LpMirrorDescent._cast_loaded_state(
        torch.zeros(3, dtype=torch.float16), dual, 0, [{"params": [0]}], key="other").dtype == torch.float16


# --- 8. and 9. refused param groups, complex parameters --------------------------------------------


@pytest.mark.parametrize("group", [
    dict(lr=-0.1), dict(lr=torch.tensor([0.1, 0.1])), dict(p=1.0), dict(eps=-1.0), dict(maximize="yes"),
    dict(foreach=True, fused=True), dict(complex=True, fused=True), dict(duplicate=True), dict(momentun=0.9),
    dict(betas=(0.9, 0.999)), dict(nesterov=True), dict(momentum=-0.1), dict(differentiable=True)])
def test_a_refused_param_group_changes_nothing(group):
    model = make_model()
    opt = LpMirrorDescent(model[0].parameters(), lr=0.05, p=1.5)
    train(model, opt, 2)
    before = (copy.deepcopy(opt.param_groups), saved_state(opt), len(opt.state))
    params = list(model[2].parameters())
    if group.pop("complex", False):
        params.append(torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64)))
    if group.pop("duplicate", False):
        params.append(model[0].weight)
    with pytest.raises((ValueError, RuntimeError)):
        opt.add_param_group({"params": iter(params), **group})
    assert len(opt.param_groups) == 1 and len(opt.state) == before[2]
    assert_same_state(saved_state(opt), before[1])
    train(model, opt, 1, start=2)  # still works


def test_add_param_group_after_construction_trains_with_its_own_settings():
    model = make_model(torch.float64)
    opt = LpMirrorDescent(model[0].parameters(), lr=0.05, p=1.5)
    opt.add_param_group({"params": model[2].parameters(), "p": 3.0, "lr": torch.tensor(0.01)})
    assert opt.param_groups[1]["p"] == 3.0 and opt.param_groups[1]["maximize"] is False
    before = params_of(model)
    loss_of(model, 0).backward()
    grads = [w.grad.clone() for w in model.parameters()]
    opt.step()
    for (name, w), b, g in zip(model.named_parameters(), before, grads):
        p, lr = (1.5, 0.05) if name.startswith("0.") else (3.0, float(torch.tensor(0.01)))
        torch.testing.assert_close(w.detach(), mirror.mirror_step(b, g, lr, p), rtol=1e-12, atol=1e-15)


def test_complex_parameters_step_as_their_real_view_and_fused_refuses_them():
    z = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    real = torch.nn.Parameter(torch.view_as_real(z).detach().clone())
    opt = LpMirrorDescent(make_model().parameters(), lr=0.1, p=1.5)
    opt.add_param_group({"params": [z]})
    twin = LpMirrorDescent([real], lr=0.1, p=1.5)
    z.grad = torch.randn_like(z)
    real.grad = torch.view_as_real(z.grad).clone()
    opt.step()
    twin.step()
    assert torch.equal(torch.view_as_real(z), real) and opt.state[z]["dual"].dtype == torch.float32
    with pytest.raises(RuntimeError, match="floating point Tensors.*complex"):
        LpMirrorDescent([z], lr=0.1, p=1.5, fused=True)


# --- 10. fused refusals ----------------------------------------------------------------------------


def test_fused_refuses_what_torchs_fused_optimizers_refuse():
    with torch.device("meta"):
        model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=1.75, fused=True)  # construction is fine
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, fused=True)
    for w in model.parameters():
        w.grad = torch.ones_like(w)
    with pytest.raises(RuntimeError, match="`fused=True` requires all the params to be floating point Tensors") as ours:
        opt.step()
    with pytest.raises(RuntimeError) as torchs:
        sgd.step()
    assert str(ours.value) == str(torchs.value)
    assert len(opt.state) == 0
    integer = torch.zeros(3, dtype=torch.int64)
    integer.grad = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="floating point Tensors"):
        LpMirrorDescent([integer], lr=0.01, p=2.0, fused=True).step()


# --- 11. zero_grad, empty steps, closures, loading before the first step ---------------------------


@every_path
@pytest.mark.parametrize("p", [2.0, 1.75])
def test_zero_grad_without_none_and_zero_gradients_leave_parameters_alone(p, path):
    model, opt = trained(2, lr=0.05, p=p, **PATHS[path])
    before = params_of(model)
    opt.zero_grad(set_to_none=False)
    assert all(torch.equal(w.grad, torch.zeros_like(w)) for w in model.parameters())
    opt.step()
    opt.step()
    opt.check()
    assert_bitwise(params_of(model), before)


@every_path
def test_a_step_without_gradients_is_a_no_op(path):
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=1.75, **PATHS[path])
    before = params_of(model)
    opt.step()
    assert_bitwise(params_of(model), before)
    assert len(opt.state) == 0
    model[2].bias.grad = torch.ones(1)  # only one parameter has a gradient: only it moves
    opt.step()
    opt.check()
    moved = [not torch.equal(a, b) for a, b in zip(params_of(model), before)]
    assert moved == [False, False, False, True] and list(opt.state) == [model[2].bias]


@every_path
def test_a_closure_is_evaluated_with_grad_and_its_loss_returned(path):
    model = make_model(torch.float64)
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=1.75, **PATHS[path])
    reference = make_model(torch.float64)
    ref_opt = LpMirrorDescent(reference.parameters(), lr=0.05, p=1.75, **PATHS[path])

    def closure():
        opt.zero_grad()
        loss = loss_of(model, 0)
        loss.backward()
        return loss

    for k in range(3):
        loss = opt.step(closure)
        assert torch.is_tensor(loss) and loss.requires_grad
        train(reference, ref_opt, 1, start=0)
    opt.check()
    assert_bitwise(params_of(model), params_of(reference))


@every_path
def test_load_state_dict_before_the_first_step(path):
    model = make_model()
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=1.75, **PATHS[path])
    empty = opt.state_dict()
    opt.load_state_dict(copy.deepcopy(empty))  # a fresh optimizer's state: nothing to load, and fine
    train(model, opt, 3)
    fresh = make_model(seed=2)
    fresh.load_state_dict(model.state_dict())
    opt2 = LpMirrorDescent(fresh.parameters(), lr=0.05, p=1.75, **PATHS[path])
    opt2.load_state_dict(saved_state(opt))
    train(model, opt, 3, start=3)
    train(fresh, opt2, 3, start=3)
    assert_bitwise(params_of(fresh), params_of(model))


# --- 12. the lazy check's settle points ------------------------------------------------------------


def refused_lazy_step(model, opt):
    loss_of(model, 11).backward()
    model[0].weight.grad[0, 0] = float("nan")
    opt.step()


@pytest.mark.parametrize("settle", ["check", "state_dict", "step", "deepcopy"])
def test_the_lazy_check_is_settled_by_the_documented_calls(settle):
    model, opt = trained(2, named=True, lr=0.01, p=1.75, lazy_check=True)
    before = params_of(model)
    refused_lazy_step(model, opt)
    opt.zero_grad()  # not a settle point: it would make the host wait for the device every iteration
    assert opt._guard.pending
    with pytest.raises(FloatingPointError, match=r"0\.weight.*lazy_check"):
        {"check": opt.check, "state_dict": opt.state_dict, "step": opt.step,
         "deepcopy": lambda: copy.deepcopy(opt)}[settle]()
    assert_bitwise(params_of(model), before)
    assert "check()" in optim.__doc__ and "zero_grad()" in optim.__doc__


def test_load_state_dict_discards_a_pending_lazy_step():
    model, opt = trained(2, named=True, lr=0.01, p=1.75, lazy_check=True)
    saved = saved_state(opt)
    good = copy.deepcopy(model.state_dict())
    refused_lazy_step(model, opt)
    opt.load_state_dict(saved)
    model.load_state_dict(good)
    assert not opt._guard.pending
    train(model, opt, 1, start=3)


# --- 13. every scheduler, through lr 0 -------------------------------------------------------------


def _constant(metric):
    return 1.0  # a loss that never improves: ReduceLROnPlateau cuts lr every step


#: Every scheduler of torch.optim.lr_scheduler, set up to reach lr 0 (exactly, or as close as it can:
#: CosineAnnealingWarmRestarts restarts at the step it would reach 0), and SWALR; 24 steps each.
SCHEDULERS = {
    "LambdaLR": lambda opt: lr_scheduler.LambdaLR(opt, lambda epoch: min(1.0, epoch / 6)),  # warmup from 0
    "MultiplicativeLR": lambda opt: lr_scheduler.MultiplicativeLR(opt, lambda epoch: 0.0 if epoch >= 4 else 0.9),
    "StepLR": lambda opt: lr_scheduler.StepLR(opt, step_size=5, gamma=0.0),
    "MultiStepLR": lambda opt: lr_scheduler.MultiStepLR(opt, milestones=[3, 8], gamma=0.0),
    # factor 0 is accepted, but torch's ConstantLR divides by it when it ends: it stays at lr 0 here
    "ConstantLR": lambda opt: lr_scheduler.ConstantLR(opt, factor=0.0, total_iters=100),
    "LinearLR": lambda opt: lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=10),
    "ExponentialLR": lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.0),
    "SequentialLR": lambda opt: lr_scheduler.SequentialLR(opt, [
        lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=6),
        lr_scheduler.LambdaLR(opt, lambda epoch: min(1.0, epoch / 6))], milestones=[8]),
    "PolynomialLR": lambda opt: lr_scheduler.PolynomialLR(opt, total_iters=10, power=2.0),
    "CosineAnnealingLR": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.0),  # and past T_max
    "ChainedScheduler": lambda opt: lr_scheduler.ChainedScheduler([
        lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=3), lr_scheduler.StepLR(opt, step_size=6, gamma=0.0)]),
    "ReduceLROnPlateau": lambda opt: lr_scheduler.ReduceLROnPlateau(opt, factor=0.0, patience=0),
    "CyclicLR": lambda opt: lr_scheduler.CyclicLR(opt, base_lr=0.0, max_lr=0.05, step_size_up=3,
                                                  cycle_momentum=False),
    "CosineAnnealingWarmRestarts": lambda opt: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=5, eta_min=0.0),
    "OneCycleLR": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=24, cycle_momentum=False,
                                                      final_div_factor=math.inf),
    "SWALR": lambda opt: SWALR(opt, swa_lr=0.0, anneal_epochs=5),
}
NEAR_ZERO = {"CosineAnnealingWarmRestarts": 0.05 * 0.1}


def test_the_scheduler_table_covers_every_scheduler_of_torch():
    schedulers = {name for name, cls in vars(lr_scheduler).items() if isinstance(cls, type) and issubclass(
        cls, lr_scheduler.LRScheduler) and cls not in (lr_scheduler.LRScheduler, lr_scheduler._LRScheduler)}
    assert schedulers - set(SCHEDULERS) == set(), "add the new scheduler to SCHEDULERS"


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float-lr", "tensor-lr"])
@pytest.mark.parametrize("path", ["single", "foreach", "lazy", pytest.param("fused", marks=pytest.mark.slow)])
def test_every_scheduler_runs_through_lr_zero(name, tensor_lr, path):
    model = make_model()
    lr = torch.tensor(0.05) if tensor_lr else 0.05
    opt = LpMirrorDescent(model.parameters(), lr=lr, p=1.75, **PATHS[path])
    scheduler = SCHEDULERS[name](opt)
    lrs, losses = [], []
    for k in range(24):
        lrs.append(float(opt.param_groups[0]["lr"]))
        opt.zero_grad()
        loss = loss_of(model, k)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        scheduler.step(_constant(loss)) if name == "ReduceLROnPlateau" else scheduler.step()
    opt.check()
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) == tensor_lr
    assert min(lrs) <= NEAR_ZERO.get(name, 0.0) and (max(lrs) > 0 or name == "ConstantLR")
    assert all(math.isfinite(x) for x in losses) and all(torch.isfinite(w).all() for w in model.parameters())
    assert math.isfinite(loss_of(model, 99).item())


def test_schedulers_do_not_make_a_bad_lr_or_p_acceptable():
    model = make_model()
    for kwargs in (dict(lr=-0.01), dict(lr=0.01, p=1.0)):
        with pytest.raises(ValueError):
            LpMirrorDescent(model.parameters(), **kwargs)
    opt = LpMirrorDescent(model.parameters(), lr=0.05, p=1.75)
    lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=2)
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))], "lr": -1.0})


def test_a_schedule_to_zero_converges_like_the_reference():
    """A cosine schedule to 0 against the float64 reference with the same lrs."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(30, dtype=torch.float64))
    opt = LpMirrorDescent([w], lr=0.05, p=1.5)
    scheduler = lr_scheduler.CosineAnnealingLR(opt, T_max=8)
    u = np.sign(w.detach().numpy()) * np.abs(w.detach().numpy()) ** 0.5
    for _ in range(12):
        lr = opt.param_groups[0]["lr"]
        g = torch.randn(30, dtype=torch.float64)
        w.grad = g.clone()
        opt.step()
        scheduler.step()
        u = u - lr * g.numpy()
    np.testing.assert_allclose(w.detach().numpy(), np.sign(u) * np.abs(u) ** 2, rtol=1e-12, atol=1e-15)
