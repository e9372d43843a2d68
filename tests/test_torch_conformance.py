"""LpMirrorDescent against torch's own optimizer contract: our tests in the style of torch's
``TestOptimRenewed`` (test/test_optim.py, not shipped in the wheel; these are ours, named after the torch
tests they mirror), iterating the configs of its ``OptimizerInfo`` (``tests/lpmd_optim_info.py``, torch's
machinery) with the implementations torch's helper adds (foreach, fused). On CPU; fused configs compile
(marked slow). Needs the ``expecttest`` package (torch's test helpers import it)."""

from __future__ import annotations

import copy
import functools
import math
import pickle
import tempfile
from unittest.mock import patch

import pytest
import torch
from torch.nn import Parameter
from torch.optim.lr_scheduler import ReduceLROnPlateau

pytest.importorskip("torch.testing._internal.common_optimizers",
                    reason="torch's optimizer test helpers need the expecttest package (pip install expecttest)")

from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook  # noqa: E402
from torch.testing._internal.common_optimizers import (  # noqa: E402
    OptimizerErrorEnum,
    _get_optim_inputs_including_global_cliquey_kwargs,
)

from lpmd_optim_info import LPMD_INFO  # noqa: E402
from mdlib.optim import mirror_descent  # noqa: E402

OPTIM = LPMD_INFO.optim_cls
DEVICE = "cpu"
FP16_REDUCED_PRECISION = {"atol": 1e-5, "rtol": 1e-4}


def configs(dtype=torch.float32, skip=(), plain=False):
    """The OptimizerInfo's configs as pytest params (fused ones slow: they compile), fresh kwargs each."""
    inputs = (LPMD_INFO.optim_inputs_func(device=DEVICE, dtype=dtype) if plain else
              _get_optim_inputs_including_global_cliquey_kwargs(DEVICE, dtype, LPMD_INFO, skip=skip))
    out = []
    for optim_input in inputs:
        marks = [pytest.mark.slow] if optim_input.kwargs.get("fused") else []
        ident = optim_input.desc.replace(" ", "").replace(",", "+") or "default"
        out.append(pytest.param(optim_input.kwargs, id=ident, marks=marks))
    return out


def fresh(kwargs):
    return copy.deepcopy(kwargs)  # a tensor lr is changed in place by schedulers: never share it


def weight_bias(dtype=torch.float32, contiguous=True, shape=(10, 5)):
    if contiguous:
        return Parameter(torch.randn(shape, dtype=dtype)), Parameter(torch.randn(shape[0], dtype=dtype))
    return (Parameter(torch.randn((*shape, 2), dtype=dtype)[..., 0]),
            Parameter(torch.randn((shape[0], 2), dtype=dtype)[..., 0]))


def assert_bitwise(a, b):
    assert torch.equal(a, b), (a - b).abs().max()


def fwd_bwd(optimizer, weight, bias, inpt):
    optimizer.zero_grad()
    loss = (weight.mv(inpt) + bias).pow(2).sum()
    loss.backward()
    return loss


def rosenbrock(xy):
    x, y = xy
    return (1 - x) ** 2 + 100 * (y - x ** 2) ** 2


def test_optim_infos_do_not_specify_global_cliquey_kwargs():
    for optim_input in LPMD_INFO.optim_inputs_func(device=DEVICE):
        assert not {"foreach", "fused", "differentiable"} & set(optim_input.kwargs)


@pytest.mark.parametrize("error_input", LPMD_INFO.optim_error_inputs_func(device=DEVICE, dtype=torch.float32),
                         ids=lambda e: e.optimizer_error_input.desc.replace(" ", "_"))
def test_errors(error_input):
    optim_input = error_input.optimizer_error_input
    assert error_input.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR
    if issubclass(error_input.error_type, Warning):
        with pytest.warns(error_input.error_type, match=error_input.error_regex):
            OPTIM(optim_input.params, **optim_input.kwargs)
    else:
        with pytest.raises(error_input.error_type, match=error_input.error_regex):
            OPTIM(optim_input.params, **optim_input.kwargs)


@pytest.mark.parametrize("kwargs", configs(plain=True))
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("with_lrsched", [False, True])
def test_forloop_goes_right_direction(kwargs, contiguous, with_lrsched):
    for schedulers_c in LPMD_INFO.scheduler_inputs if with_lrsched else [[]]:
        torch.manual_seed(0)
        kw = {**fresh(kwargs), "foreach": False}
        weight, bias = weight_bias(contiguous=contiguous)
        inpt = torch.randn(5)
        optimizer = OPTIM([weight, bias], **kw)
        schedulers = [s(optimizer) for s in schedulers_c]
        closure = functools.partial(fwd_bwd, optimizer, weight, bias, inpt)
        initial = closure().item()
        for _ in range(20):
            loss = closure()
            optimizer.step()
            for scheduler in schedulers:
                scheduler.step(loss.detach()) if isinstance(scheduler, ReduceLROnPlateau) else scheduler.step()
        final = closure().item()
        assert final > initial if kw.get("maximize") else final < initial


def test_param_group_with_lrscheduler_goes_right_direction():
    for schedulers_c in LPMD_INFO.scheduler_inputs:
        torch.manual_seed(0)
        weight, bias = weight_bias()
        inpt = torch.randn(5)
        optimizer = OPTIM([{"params": [weight]}, {"params": [bias], "lr": 0.01, "p": 1.75}])
        schedulers = [s(optimizer) for s in schedulers_c]
        closure = functools.partial(fwd_bwd, optimizer, weight, bias, inpt)
        initial = closure().item()
        for _ in range(20):
            loss = optimizer.step(closure)
            for scheduler in schedulers:
                scheduler.step(loss.detach()) if isinstance(scheduler, ReduceLROnPlateau) else scheduler.step()
        assert closure().item() < initial


@pytest.mark.parametrize("kwargs", configs())
def test_tensor_lr(kwargs):
    torch.manual_seed(0)
    weight, bias = weight_bias()
    weight_c, bias_c = (Parameter(t.detach().clone()) for t in (weight, bias))
    inpt = torch.randn(5)
    kw = {**fresh(kwargs), "lr": 1e-3}
    optimizer_r = OPTIM([weight, bias], **kw)
    optimizer = OPTIM([weight_c, bias_c], **{**kw, "lr": torch.tensor(1e-3)})
    for _ in range(5):
        fwd_bwd(optimizer_r, weight, bias, inpt)
        fwd_bwd(optimizer, weight_c, bias_c, inpt)
        optimizer_r.step()
        optimizer.step()
        torch.testing.assert_close(weight_c, weight)
        torch.testing.assert_close(bias_c, bias)


@pytest.mark.parametrize("kwargs", [c for c in configs() if not c.values[0].get("fused")])
def test_complex(kwargs):
    """torch's test_complex: a complex parameter steps exactly as its view_as_real (a real tensor of
    its real and imaginary parts) would, state included, beside a real parameter."""
    torch.manual_seed(0)
    z = Parameter(torch.randn(10, 5, dtype=torch.complex64))
    x = Parameter(torch.randn(3))
    real = Parameter(torch.view_as_real(z).detach().clone())
    x_twin = Parameter(x.detach().clone())
    optimizer, twin = OPTIM([z, x], **fresh(kwargs)), OPTIM([real, x_twin], **fresh(kwargs))
    # p != 2 steps the real view itself: bit for bit; p = 2 is SGD's complex arithmetic, which rounds
    # differently from the real view's (torch's own test compares within its default tolerance)
    same = assert_bitwise if kwargs.get("p", 2.0) != 2.0 else torch.testing.assert_close
    for _ in range(4):
        z.grad, x.grad = torch.randn_like(z), torch.randn_like(x)
        real.grad, x_twin.grad = torch.view_as_real(z.grad).clone(), x.grad.clone()
        optimizer.step()
        twin.step()
        same(torch.view_as_real(z), real)
        assert torch.equal(x, x_twin)
    assert optimizer.state[z].keys() == twin.state[real].keys()
    for key, value in twin.state[real].items():
        mine = optimizer.state[z][key]
        same(torch.view_as_real(mine) if mine.is_complex() else mine, value)


@pytest.mark.parametrize("kwargs", [c for c in configs(torch.float64, plain=True)
                                    if not c.values[0].get("momentum") and not c.values[0].get("weight_decay")
                                    and not c.values[0].get("normalize")])
def test_rosenbrock_sparse(kwargs):
    """torch's test_rosenbrock_sparse: cyclic coordinate descent with an uncoalesced sparse gradient
    steps exactly as the dense gradient (p = 2 is SGD; p != 2 updates the entries it touches)."""
    params = Parameter(torch.tensor([1.5, 1.5], dtype=torch.float64))
    params_c = Parameter(params.detach().clone())
    kw = {**fresh(kwargs), "lr": 1e-4}
    optimizer, optimizer_c = OPTIM([params], **kw), OPTIM([params_c], **fresh(kw))
    for i in range(20 if kw.get("maximize") else 300):  # uphill it overflows further on
        w = i % 2
        for param, opt, sparse in ((params, optimizer, True), (params_c, optimizer_c, False)):
            opt.zero_grad()
            rosenbrock(param).backward()
            value = param.grad[w].item()
            grad = torch.sparse_coo_tensor(torch.tensor([[w, w]]), torch.tensor([value / 4, value - value / 4],
                                                                                dtype=torch.float64), (2,))
            param.grad = grad if sparse else grad.to_dense()
            opt.step()
        # not bit for bit: an entry never touched keeps w_0 where the dense step's first update writes
        # m^-1(m(w_0)), one rounding away; p = 2 is SGD, which adds the uncoalesced entries one by one
        torch.testing.assert_close(params, params_c, rtol=1e-12, atol=0)
    assert params.detach().dist(torch.ones(2, dtype=torch.float64)) < math.dist((1.5, 1.5), (1.0, 1.0)) or \
        kw.get("maximize")


def compare_between(models, optimizers, inpt, dtype, copy_back, reduced_precision=False):
    """torch's comparison of two implementations: 7 iterations, a frozen layer at 3-4, no gradients at 2;
    parameters and every state tensor compared after each step (and, with ``copy_back``, the reference's
    values copied into the other so that rounding does not accumulate: an edit it must respect)."""
    tolerance = FP16_REDUCED_PRECISION if reduced_precision else {}
    for i in range(7):
        for model, optimizer in zip(models, optimizers):
            optimizer.zero_grad()
            if i == 3:
                model[2].requires_grad_(False)
            if i == 5:
                model[2].requires_grad_(True)
            if i != 2:
                model(inpt).sum().backward()
            optimizer.step()
        (ref_model, model), (ref_opt, opt) = models, optimizers
        for ref_p, new_p in zip(ref_model.parameters(), model.parameters()):
            torch.testing.assert_close(new_p, ref_p, **tolerance)
            assert ref_opt.state[ref_p].keys() == opt.state[new_p].keys()
            for key, value in ref_opt.state[ref_p].items():
                torch.testing.assert_close(opt.state[new_p][key], value, **tolerance)
                if copy_back:
                    with torch.no_grad():
                        opt.state[new_p][key].copy_(value)
            if copy_back:
                with torch.no_grad():
                    new_p.copy_(ref_p)


def derived(kwargs, flag, dtype, copy_back, reduced_precision=False):
    models, optimizers = [], []
    for value in (False, True):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 1),
                                    torch.nn.Sigmoid()).to(dtype)
        empty = torch.empty((), dtype=dtype, requires_grad=True)  # a zero-size last param (torch issue 100701)
        empty.grad = torch.rand_like(empty)
        optimizers.append(OPTIM(list(model.parameters()) + [empty], **{**fresh(kwargs), flag: value}))
        models.append(model)
    inpt = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=dtype).reshape(3, 2)
    compare_between(models, optimizers, inpt, dtype, copy_back, reduced_precision)


@pytest.mark.parametrize("kwargs", configs(torch.float64, plain=True))
def test_foreach_matches_forloop(kwargs):
    derived(kwargs, "foreach", torch.float64, copy_back=False)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kwargs", configs(plain=True))
def test_fused_matches_forloop(kwargs, dtype):
    if (dtype == torch.bfloat16 and kwargs.get("p", 2.0) == 2.0 and kwargs.get("momentum")
            and torch.is_tensor(kwargs.get("lr"))):
        pytest.skip("p = 2 is torch's own SGD: torch.optim.SGD(fused=True) itself differs from its for-loop "
                    "here (a bf16 momentum buffer 5 ulps apart with a tensor lr), checked in a test below")
    derived(kwargs, "fused", dtype, copy_back=True)


@pytest.mark.slow
def test_torchs_own_fused_sgd_differs_from_its_forloop_where_ours_is_skipped():
    """The skip above is torch's behaviour, not ours: the same comparison fails for torch.optim.SGD."""
    global OPTIM
    kwargs = dict(lr=torch.tensor(0.001), momentum=0.9, weight_decay=0.1, maximize=True)
    saved, OPTIM = OPTIM, torch.optim.SGD
    try:
        with pytest.raises(AssertionError, match="not close"):
            derived(kwargs, "fused", torch.bfloat16, copy_back=True)
    finally:
        OPTIM = saved


@pytest.mark.parametrize("default_dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("kwargs", configs(torch.float64, plain=True))
def test_set_default_dtype_works_with_foreach(kwargs, default_dtype):
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(default_dtype)
        derived(kwargs, "foreach", torch.float64, copy_back=False, reduced_precision=default_dtype == torch.float16)
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("kwargs", configs(plain=True))
@pytest.mark.parametrize("impl", ["foreach", pytest.param("fused", marks=pytest.mark.slow)])
def test_mixed_device_dtype(kwargs, impl):
    """torch's runs on two GPUs; here the dtypes mix on CPU (and an integer tensor without gradient)."""
    torch.manual_seed(0)
    params = [torch.rand(2, 3, dtype=dtype, requires_grad=True)
              for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
    grads = [torch.rand_like(p) for p in params]
    results = []
    for value in (False, True):
        clones = [p.detach().clone().requires_grad_() for p in params] + [torch.randint(1024, (2, 3))]
        optimizer = OPTIM(clones, **{**fresh(kwargs), impl: value})
        for _ in range(7 if impl == "foreach" else 2):
            for c, g in zip(clones, grads):
                c.grad = g.clone()
            optimizer.step()
        results.append((clones, optimizer))
    (ref, ref_opt), (new, new_opt) = results
    for a, b in zip(ref[:4], new[:4]):
        rtol, atol = torch.testing._comparison.get_tolerances(a.dtype, rtol=None, atol=None)
        torch.testing.assert_close(b, a, rtol=5 * rtol, atol=5 * atol)
        for key, value in ref_opt.state[a].items():
            torch.testing.assert_close(new_opt.state[b][key], value, rtol=5 * rtol, atol=5 * atol)


def count_allocated(step):
    """Bytes allocated during ``step()`` (torch.profiler, profile_memory; CPU has no peak counter)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0)


@pytest.mark.parametrize("kwargs", configs(plain=True))
def test_peak_memory_foreach(kwargs):
    """torch's test measures CUDA peak memory: foreach may use one intermediate (the params' size) more
    than the for-loop. On CPU, the bytes the steady-state step allocates, with the same budget."""
    allocated = []
    for foreach in (False, True):
        params = [torch.rand(16, 8) for _ in range(10)]
        optimizer = OPTIM(params, **{**fresh(kwargs), "foreach": foreach})
        for p in params:
            p.grad = torch.rand_like(p)
        optimizer.step()
        optimizer.step()
        allocated.append(count_allocated(optimizer.step))
    intermediate = 10 * 16 * 8 * 4
    assert allocated[1] <= allocated[0] + intermediate + 2048, allocated


def test_fused_error_on_params_on_meta():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 1),
                                    torch.nn.Sigmoid())
    optimizer = OPTIM(model.parameters(), fused=True)
    with torch.device("meta"):
        for p in model.parameters():
            p.grad = torch.rand_like(p)
    with pytest.raises(RuntimeError, match="`fused=True` requires all the params to be floating point Tensors"):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.to_empty(device=DEVICE)
    for p in model.parameters():
        p.grad = torch.rand_like(p)
    optimizer.step()


@pytest.mark.parametrize("kwargs", configs())
def test_fused_does_not_step_if_grad_not_finite(kwargs):
    """torch's test_fused_does_not_step_if_foundinf (AMP found_inf) for this optimizer's own guard: a
    non-finite gradient is refused, on every implementation, and nothing changes."""
    params = [torch.ones((1,)) for _ in range(5)]
    optimizer = OPTIM(params, **fresh(kwargs))
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    optimizer.check()
    params_c = [p.clone() for p in params]
    state = copy.deepcopy(optimizer.state_dict())
    params[2].grad = torch.full_like(params[2], math.inf)
    with pytest.raises(FloatingPointError, match=r"\['params'\]\[2\]"):
        optimizer.step()
        optimizer.check()
    assert all(torch.equal(a, b) for a, b in zip(params, params_c))
    now = optimizer.state_dict()["state"]
    assert now.keys() == state["state"].keys()
    assert all(torch.equal(now[k][key], value) for k, v in state["state"].items() for key, value in v.items())


@pytest.mark.parametrize("kwargs", configs())
def test_param_groups_lr(kwargs):
    torch.manual_seed(0)
    kw = fresh(kwargs)
    if "lr" not in kw or kw["lr"] == 0:
        kw["lr"] = 1e-3
    weight, bias = weight_bias()
    irrelevant = Parameter(torch.randn(2))
    irrelevant_clone = irrelevant.detach().clone()
    inpt = torch.randn(5)
    optimizer = OPTIM([dict(params=[weight, bias], **kw), dict(params=[irrelevant])], lr=1e-28)
    initial = (weight.mv(inpt) + bias).pow(2).sum().item()
    for _ in range(20):
        loss = fwd_bwd(optimizer, weight, bias, inpt)
        irrelevant.grad = torch.rand_like(irrelevant)
        optimizer.step()
    assert loss.item() > initial if kw.get("maximize") else loss.item() < initial
    torch.testing.assert_close(irrelevant.detach(), irrelevant_clone)


@pytest.mark.parametrize("kwargs", configs())
def test_step_is_noop_when_params_have_no_grad(kwargs):
    params = [torch.randn(2, 3, requires_grad=False) for _ in range(2)]
    old = [p.clone() for p in params]
    optimizer = OPTIM(params, **fresh(kwargs))
    assert optimizer.step(lambda: torch.tensor([1.0])).item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(params, old)) and len(optimizer.state) == 0


@pytest.mark.parametrize("kwargs", configs())
def test_step_is_noop_for_zero_grads(kwargs):
    """torch's: a zero gradient leaves the parameter as it was (within tolerance: the first step builds
    the dual and maps back); here also bit for bit from the second step on. As torch's, without weight
    decay (which moves the parameter whatever the gradient)."""
    if kwargs.get("weight_decay"):
        pytest.skip("weight decay moves a parameter with a zero gradient (torch's test skips it too)")
    param = torch.randn((5, 1), requires_grad=True)
    old = param.detach().clone()
    optimizer = OPTIM([param], **fresh(kwargs))
    param.grad = torch.zeros_like(param)
    optimizer.step(lambda: torch.tensor([1.0]))
    torch.testing.assert_close(param.detach(), old)
    after_first = param.detach().clone()
    for _ in range(3):
        optimizer.step()
    optimizer.check()
    assert torch.equal(param.detach(), after_first)


@pytest.mark.parametrize("kwargs", configs())
def test_optimizer_can_be_printed(kwargs):
    params = [Parameter(torch.randn(2, 3)) for _ in range(2)]
    text = repr(OPTIM(params, **fresh(kwargs)))
    assert text.startswith("LpMirrorDescent (") and "maximize" in text and "foreach" in text


def named(params, is_named):
    return [(f"name{i}", p) for i, p in enumerate(params)] if is_named else params


def without_param_names(state_dict):
    state_dict = copy.deepcopy(state_dict)
    for group in state_dict["param_groups"]:
        group.pop("param_names", None)
    return state_dict


def same(x, y):
    return torch.equal(x, y) if torch.is_tensor(x) and torch.is_tensor(y) else x == y


def assert_state_dicts_equal(a, b):
    assert len(a["param_groups"]) == len(b["param_groups"])
    for group_a, group_b in zip(a["param_groups"], b["param_groups"]):
        assert group_a.keys() == group_b.keys() and all(same(group_a[k], group_b[k]) for k in group_a)
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert a["state"][key].keys() == b["state"][key].keys()
        for name in a["state"][key]:
            assert torch.equal(a["state"][key][name], b["state"][key][name])


@pytest.mark.parametrize("kwargs", configs())
@pytest.mark.parametrize("is_named_optim0", [True, False])
@pytest.mark.parametrize("is_named_optim1", [True, False])
def test_state_dict_deterministic(kwargs, is_named_optim0, is_named_optim1):
    torch.manual_seed(0)
    weight, bias = weight_bias(shape=(2, 3))
    inpt = torch.randn(3)
    optimizer = OPTIM(named([weight, bias], is_named_optim0), **fresh(kwargs))
    closure = functools.partial(fwd_bwd, optimizer, weight, bias, inpt)
    for _ in range(10):
        closure()
        optimizer.step()
    weight_c, bias_c = (Parameter(t.detach().clone()) for t in (weight, bias))
    optimizer_c = OPTIM(named([weight_c, bias_c], is_named_optim1), **fresh(kwargs))
    closure_c = functools.partial(fwd_bwd, optimizer_c, weight_c, bias_c, inpt)
    optimizer_c.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for _ in range(10):
        closure()
        closure_c()
        optimizer.step()
        optimizer_c.step()
        assert torch.equal(weight, weight_c) and torch.equal(bias, bias_c)  # bit for bit
    assert_state_dicts_equal(without_param_names(optimizer.state_dict()),
                             without_param_names(optimizer_c.state_dict()))
    optimizer_c.param_groups.extend(optimizer_c.param_groups)  # repeated groups: identical representation
    a = without_param_names(optimizer.state_dict())["param_groups"][-1]
    b = without_param_names(optimizer_c.state_dict())["param_groups"][-1]
    assert a.keys() == b.keys() and a["params"] == b["params"]


def conv_bn():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Conv2d(4, 2, 1, stride=2), torch.nn.BatchNorm2d(2, eps=1e-05, momentum=0.1))


@pytest.mark.parametrize("kwargs", configs())
def test_can_load_older_state_dict(kwargs):
    model = conv_bn()
    inpt = torch.rand(1, 4, 16, 16)
    optimizer = OPTIM(model.parameters(), **fresh(kwargs))
    for _ in range(3):
        optimizer.zero_grad()
        model(inpt).sum().backward()
        optimizer.step()
    old = copy.deepcopy(optimizer.state_dict())
    for group in old["param_groups"]:
        for flag in LPMD_INFO.not_og_supported_flags:
            group.pop(flag, None)
    optimizer.load_state_dict(old)
    optimizer.zero_grad()
    model(inpt).sum().backward()
    optimizer.step()
    group = optimizer.param_groups[0]  # an old state: no maximize then; the implementation stays this one's
    assert (group["maximize"], group["foreach"], group["fused"]) == (False, kwargs.get("foreach"), kwargs.get("fused"))


@pytest.mark.parametrize("kwargs", configs())
@pytest.mark.parametrize("is_named_optim0", [True, False])
@pytest.mark.parametrize("is_named_optim1", [True, False])
def test_can_load_from_to_named_state_dict(kwargs, is_named_optim0, is_named_optim1):
    model = conv_bn()
    inpt = torch.rand(1, 4, 16, 16)
    optimizer = OPTIM(model.named_parameters() if is_named_optim0 else model.parameters(), **fresh(kwargs))
    for _ in range(3):
        optimizer.zero_grad()
        model(inpt).sum().backward()
        optimizer.step()
    optimizer2 = OPTIM(model.named_parameters() if is_named_optim1 else model.parameters(), **fresh(kwargs))
    optimizer2.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    optimizer2.zero_grad()
    model(inpt).sum().backward()
    optimizer2.step()
    if is_named_optim0 or is_named_optim1:
        assert optimizer2.state_dict()["param_groups"][0]["param_names"] == ["0.weight", "0.bias", "1.weight",
                                                                             "1.bias"]


@pytest.mark.parametrize("kwargs", configs())
@pytest.mark.parametrize("is_named_optim", [True, False])
def test_save_load_equality_with_weights_only(kwargs, is_named_optim):
    torch.manual_seed(0)
    weight, bias = weight_bias(shape=(2, 3))
    inpt = torch.randn(3)
    optimizer = OPTIM(named([weight, bias], is_named_optim), **fresh(kwargs))
    for _ in range(3):
        optimizer.step(functools.partial(fwd_bwd, optimizer, weight, bias, inpt))
    state_dict = optimizer.state_dict()
    with tempfile.TemporaryFile() as f:
        torch.save(state_dict, f)
        f.seek(0)
        assert_state_dicts_equal(torch.load(f), state_dict)
        f.seek(0)
        assert_state_dicts_equal(torch.load(f, weights_only=True), state_dict)


def stepped_three_times(kwargs, grad=torch.randn_like) -> tuple[list[Parameter], torch.optim.Optimizer]:
    """Two 2 x 3 parameters with gradients ``grad(p)`` and an optimizer of ``kwargs`` after three steps."""
    params = [Parameter(torch.randn(2, 3)) for _ in range(2)]
    for p in params:
        p.grad = grad(p)
    optimizer = OPTIM(params, **fresh(kwargs))
    for _ in range(3):
        optimizer.step()
    return params, optimizer


@pytest.mark.parametrize("kwargs", configs())
def test_load_nontensor_step(kwargs):
    """torch's: a state whose "step" is a Python number loads; this optimizer keeps no step counter, and a
    state with one (an unknown entry) still loads and steps."""
    params, optimizer = stepped_three_times(kwargs, grad=torch.rand_like)
    twin_params = [Parameter(w.detach().clone()) for w in params]
    for w, v in zip(params, twin_params):
        v.grad = w.grad.clone()
    twin = OPTIM(twin_params, **fresh(kwargs))
    twin.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    state_dict = copy.deepcopy(optimizer.state_dict())
    for entry in state_dict["state"].values():
        entry["step"] = 3.0
    optimizer.load_state_dict(state_dict)
    assert all(state["step"] == 3.0 for state in optimizer.state.values())  # kept, as torch keeps it
    optimizer.step()
    twin.step()
    assert all(torch.equal(w, v) for w, v in zip(params, twin_params))  # and ignored: the step is the same


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kwargs", configs())
def test_state_dict_with_cuda_params(kwargs):
    params, optimizer = stepped_three_times(kwargs)
    with torch.no_grad():
        params_cuda = [p.to("cuda") for p in params]
        for p, q in zip(params_cuda, params):
            p.grad = q.grad.to("cuda")
    optimizer_cuda = OPTIM(params_cuda, **fresh(kwargs))
    state_dict_cpu, state_dict_cuda = copy.deepcopy(optimizer.state_dict()), copy.deepcopy(optimizer.state_dict())
    optimizer_cuda.load_state_dict(state_dict_cuda)
    assert_state_dicts_equal(state_dict_cpu, state_dict_cuda)
    for _ in range(5):
        optimizer.step()
        optimizer_cuda.step()
        for a, b in zip(params, params_cuda):
            torch.testing.assert_close(b.cpu(), a)


def state_dict_pre_hook(optimizer):
    optimizer.state["test"] = 1


def state_dict_post_hook(optimizer, state_dict):
    if "test" in state_dict["state"]:
        state_dict["state"].pop("test")
        state_dict["ran_state_dict_pre_hook"] = True
    else:
        state_dict["ran_state_dict_pre_hook"] = False
    return state_dict


@pytest.mark.parametrize("kwargs", configs())
def test_state_dict_pre_hook(kwargs):
    optimizer = OPTIM([torch.rand(2, 3, requires_grad=True)], **fresh(kwargs))
    optimizer.register_state_dict_pre_hook(state_dict_pre_hook)
    assert optimizer.state_dict()["state"]["test"] == 1


@pytest.mark.parametrize("kwargs", configs())
def test_state_dict_post_hook(kwargs):
    optimizer = OPTIM([torch.rand(2, 3, requires_grad=True)], **fresh(kwargs))
    optimizer.register_state_dict_post_hook(state_dict_post_hook)
    assert optimizer.state_dict()["ran_state_dict_pre_hook"] is False


@pytest.mark.parametrize("kwargs", configs())
def test_state_dict_pre_post_hook(kwargs):
    optimizer = OPTIM([torch.rand(2, 3, requires_grad=True)], **fresh(kwargs))
    optimizer.register_state_dict_pre_hook(state_dict_pre_hook)
    optimizer.register_state_dict_post_hook(state_dict_post_hook)
    state_dict = optimizer.state_dict()
    assert "test" not in state_dict["state"] and state_dict["ran_state_dict_pre_hook"] is True


def load_pre_hook1(optimizer, state_dict):
    state_dict["param_groups"][0]["lr"] = 0.002


def load_pre_hook2(optimizer, state_dict):
    state_dict = copy.deepcopy(state_dict)
    state_dict["param_groups"][0]["lr"] = 0.003
    return state_dict


def load_post_hook(optimizer):
    optimizer.state["ran_load_state_dict_pre_hook2"] = optimizer.param_groups[0]["lr"] == 0.003
    optimizer.state["ran_load_state_dict_post_hook"] = True


@pytest.mark.parametrize("kwargs", configs())
def test_load_state_dict_pre_hook_and_prepend(kwargs):
    param = torch.rand(2, 3, requires_grad=True)
    optimizer = OPTIM([param], **fresh(kwargs))
    param.grad = torch.rand_like(param)
    optimizer.step()  # a state with a dual, so the hooks see (and keep) it
    state_dict = optimizer.state_dict()
    optimizer.register_load_state_dict_pre_hook(load_pre_hook1)
    optimizer.load_state_dict(state_dict)
    assert optimizer.param_groups[0]["lr"] == 0.002
    optimizer.register_load_state_dict_pre_hook(load_pre_hook2, prepend=True)
    optimizer.load_state_dict(state_dict)
    assert optimizer.param_groups[0]["lr"] == 0.002
    assert ("dual" in optimizer.state[param]) == (optimizer.param_groups[0]["p"] != 2.0)
    optimizer.step()


@pytest.mark.parametrize("kwargs", configs())
def test_load_state_dict_post_hook(kwargs):
    optimizer = OPTIM([torch.rand(2, 3, requires_grad=True)], **fresh(kwargs))
    optimizer.register_load_state_dict_post_hook(load_post_hook)
    optimizer.load_state_dict(optimizer.state_dict())
    assert not optimizer.state["ran_load_state_dict_pre_hook2"]
    assert optimizer.state["ran_load_state_dict_post_hook"] is True


@pytest.mark.parametrize("kwargs", configs())
def test_load_state_dict_pre_post_hook(kwargs):
    optimizer = OPTIM([torch.rand(2, 3, requires_grad=True)], **fresh(kwargs))
    optimizer.register_load_state_dict_pre_hook(load_pre_hook2)
    optimizer.register_load_state_dict_post_hook(load_post_hook)
    optimizer.load_state_dict(optimizer.state_dict())
    assert optimizer.state["ran_load_state_dict_pre_hook2"]
    assert optimizer.state["ran_load_state_dict_post_hook"] is True


@pytest.mark.parametrize("kwargs", configs())
@pytest.mark.parametrize("register,start", [("register_step_post_hook", 2), ("register_step_pre_hook", 5)])
def test_step_pre_and_post_hook(kwargs, register, start):
    """torch's test_step_post_hook and test_step_pre_hook: the hook runs at each step until removed."""
    data = [start]
    optimizer = OPTIM([torch.tensor([1.0, 1.0])], **fresh(kwargs))
    handle = getattr(optimizer, register)(lambda opt, args, kw: data.append(data.pop() + 2))
    optimizer.step()
    optimizer.step()
    assert data == [start + 4]
    handle.remove()
    optimizer.step()
    assert data == [start + 4]


@pytest.mark.parametrize("kwargs", configs())
def test_step_all_hooks(kwargs):
    data = []
    params = [torch.tensor([1.0, 1.0])]
    optimizer, optimizer2 = OPTIM(params, **fresh(kwargs)), torch.optim.SGD(params)
    handles = [register_optimizer_step_pre_hook(lambda *a: data.append(0)),
               register_optimizer_step_post_hook(lambda *a: data.append(5))]
    try:
        for opt in (optimizer, optimizer2):
            handles.append(opt.register_step_pre_hook(lambda *a: data.append(1)))
            handles.append(opt.register_step_post_hook(lambda *a: data.append(2)))
        optimizer.step()
        optimizer2.step()
        optimizer.step()
        assert data == [0, 1, 2, 5] * 3
    finally:
        for handle in handles:
            handle.remove()
    optimizer.step()
    optimizer2.step()
    assert data == [0, 1, 2, 5] * 3


@pytest.mark.parametrize("kwargs", configs())
def test_deepcopy_copies_all_public_attrs(kwargs):
    params = [Parameter(torch.randn(2, 3)) for _ in range(2)]
    for p in params:
        p.grad = torch.rand_like(p)
    optimizer = OPTIM(params, **fresh(kwargs), lazy_check=True)
    for _ in range(3):
        optimizer.step()

    def public(obj):
        return {k for k in vars(obj) if not k.startswith("_")}

    twin = copy.deepcopy(optimizer)
    assert public(optimizer) == public(twin) == {"defaults", "state", "param_groups", "lazy_check", "check_edits"}
    again = pickle.loads(pickle.dumps(optimizer))
    for opt in (twin, again):  # and the copies step
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.rand_like(p)
        opt.step()
        opt.check()


@pytest.mark.parametrize("kwargs", configs())
def test_non_empty_state(kwargs):
    """torch's: after a step no parameter has an empty state (p = 2, SGD, keeps none at all, as SGD)."""
    model = torch.nn.Linear(5, 5)
    optimizer = OPTIM(model.parameters(), **fresh(kwargs))
    model(torch.rand(2, 5)).sum().backward()
    optimizer.step()
    for state in optimizer.state.values():
        assert len(state) > 0
    group = optimizer.param_groups[0]
    assert (len(optimizer.state) == 0) == (group["p"] == 2.0 and not group["momentum"])  # SGD keeps its momentum


def test_defaults_changed_to_foreach():
    """torch's (CUDA): the default implementation is foreach there; on CPU it is the for-loop, through
    the function torch's test patches by its conventional name."""
    model = torch.nn.Linear(5, 5)
    for optim_input in LPMD_INFO.optim_inputs_func(device=DEVICE):
        optimizer = OPTIM(model.parameters(), **fresh(optim_input.kwargs))
        model(torch.rand(2, 5)).sum().backward()
        name = "_multi_tensor_lpmirrordescent" if torch.device(DEVICE).type == "cuda" else \
            "_single_tensor_lpmirrordescent"
        with patch.object(mirror_descent, name, wraps=getattr(mirror_descent, name)) as implementation:
            optimizer.step()
        assert implementation.called
        model.zero_grad()


@pytest.mark.parametrize("kwargs", [c for c in configs(torch.float64) if "p" in c.values[0]])
def test_rosenbrock(kwargs):
    """torch's test_rosenbrock_sparse without sparse gradients: cyclic coordinate descent on the
    Rosenbrock function from (1.5, 1.5) gets closer to the minimum (1, 1) in 1800 steps (with maximize,
    uphill for 20 steps: further on it overflows and is refused), and the for-loop and foreach/fused
    implementations agree along the way."""
    kw = {**fresh(kwargs), "lr": 1e-3 if kwargs.get("normalize") else 1e-4}
    params = Parameter(torch.tensor([1.5, 1.5], dtype=torch.float64))
    params_c = Parameter(params.detach().clone())
    optimizer = OPTIM([params], **kw)
    optimizer_c = OPTIM([params_c], **{**kw, "foreach": False, "fused": False})
    solution = torch.tensor([1.0, 1.0], dtype=torch.float64)
    initial = params.detach().dist(solution).item()

    def coordinate(param, opt, i):
        opt.zero_grad()
        loss = rosenbrock(param)
        loss.backward()
        with torch.no_grad():
            param.grad[1 - i % 2] = 0.0
        return loss

    for i in range((8 if kw.get("momentum") else 20) if kw.get("maximize") else 1800):
        optimizer.step(functools.partial(coordinate, params, optimizer, i))
        optimizer_c.step(functools.partial(coordinate, params_c, optimizer_c, i))
        if i % 300 == 0:
            torch.testing.assert_close(params, params_c, atol=5e-6, rtol=5e-6)
    if kw.get("maximize"):
        assert rosenbrock(params.detach()) > rosenbrock(torch.tensor([1.5, 1.5], dtype=torch.float64))
    else:
        assert params.detach().dist(solution).item() < initial
