"""LpMirrorDescent and the training loop on a CUDA GPU (skipped without one): each implementation
(single-tensor, foreach, fused by torch.compile) against a float64 CPU run of the same steps, p = 2 as
torch's SGD bit for bit, the lazy check (the GPU default) refusing and undoing a step, bfloat16
parameters and autocast, the edit check, and ``train.fit`` / ``pool.run_many`` on "cuda".

The CPU tests check the same contract on the CPU (``test_optim*.py``, ``test_train.py``,
``test_runs.py``); CI has no GPU, so these run where one is lent. Each test takes seconds; the fused
ones compile a kernel per layout on their first step."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from mdlib import mirror
from mdlib.experiments import methods
from mdlib.experiments.sentiment import tokens
from mdlib.models import EncoderClassifier
from mdlib.optim import LpMirrorDescent, _compiled, _steps
from mdlib.runs import identity, pool, store
from test_optim_conventions import edit_clamp, edit_no_grad, edit_vector
from test_runs import blobs_run, build_blobs
from test_train import Crashing, blobs, fit, mlp, same_history
from tiny_model import make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEVICE = "cuda"
#: The implementations, as LpMirrorDescent (and torch.optim.SGD) arguments; the lazy check is the default.
PATHS = {"single": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}
#: SGD's options, on the gradient (and their result on the dual).
OPTIONS = {"plain": {}, "momentum": dict(momentum=0.9), "weight_decay": dict(weight_decay=0.05),
           "nesterov": dict(momentum=0.9, nesterov=True, weight_decay=0.05)}


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


def loss_on(model: nn.Module, seed: int) -> torch.Tensor:
    """``tiny_model.loss_of`` on the model's device: the mean squared error on batch ``seed``."""
    g = torch.Generator().manual_seed(seed)
    w = next(model.parameters())
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
    return ((model(x.to(w.device, w.dtype)) - y.to(w.device, w.dtype)) ** 2).mean()


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: int, start: int = 0) -> None:
    for k in range(start, start + steps):
        opt.zero_grad()
        loss_on(model, k).backward()
        opt.step()


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (so NaN equals itself and -0 differs from +0)."""
    return t.detach().view(_steps._BITS[t.element_size()])


def assert_bitwise(xs, ys) -> None:
    for x, y in zip(xs, ys, strict=True):
        assert x.dtype == y.dtype and x.device == y.device and torch.equal(bits(x), bits(y))


def snapshot(model: nn.Module, opt: LpMirrorDescent):
    """Parameters and the saved optimizer state, cloned (``state_dict`` settles a pending step)."""
    return [w.detach().clone() for w in model.parameters()], copy.deepcopy(opt.state_dict()["state"])


def assert_same(model: nn.Module, opt: LpMirrorDescent, saved) -> None:
    params, state = saved
    assert_bitwise(list(model.parameters()), params)
    now = opt.state_dict()["state"]
    assert now.keys() == state.keys()
    for key in state:
        assert now[key].keys() == state[key].keys()
        assert_bitwise([now[key][name] for name in state[key]], list(state[key].values()))


def assert_ran_as_asked(opt: LpMirrorDescent, path: str) -> None:
    """The fused kernel compiled and ran (no silent fallback to the eager steps); nothing pending."""
    assert not opt._guard.pending
    if path == "fused" and any(group["p"] != 2.0 for group in opt.param_groups):  # p = 2: torch's fused SGD
        assert opt._guard.fused.failure is None, f"the fused kernel fell back: {opt._guard.fused.failure}"
        assert any(key[4].type == DEVICE for key in _compiled._KERNELS)


# --- 1. each implementation against a float64 CPU run ---------------------------------------------

SHAPES = [(40,), (3, 7), (1,), (300, 129)]


def run_steps(p: float, options: dict, implementation: dict, device: str, dtype: torch.dtype, steps: int = 8,
              lr: float = 0.02) -> tuple[list[nn.Parameter], LpMirrorDescent]:
    """``steps`` steps of LpMirrorDescent from seeded float32 parameters on seeded float32 gradients
    (independent of the parameters), in ``dtype`` on ``device``."""
    gen = torch.Generator().manual_seed(0)
    initial = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(steps)]
    params = [nn.Parameter(w.to(device, dtype)) for w in initial]
    opt = LpMirrorDescent(params, lr=lr, p=p, **options, **implementation)
    for step in grads:
        for w, g in zip(params, step):
            w.grad = g.to(device, dtype)
        opt.step()
    opt.check()
    return params, opt


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("p", [1.1, 1.75, 2.0, 3.0])
def test_each_implementation_on_cuda_matches_a_float64_cpu_run(p, options, path):
    params, opt = run_steps(p, OPTIONS[options], PATHS[path], DEVICE, torch.float32)
    assert opt._lazy()  # the default on a GPU
    assert_ran_as_asked(opt, path)
    reference, reference_opt = run_steps(p, OPTIONS[options], dict(foreach=False), "cpu", torch.float64)
    for w, expected in zip(params, reference):
        assert w.device.type == DEVICE and w.dtype == torch.float32
        if p == 2.0:  # SGD: float32 rounding of 8 steps, relative to the tensor's scale
            torch.testing.assert_close(w.detach().cpu().double(), expected.detach(), rtol=0,
                                       atol=1e-5 * float(expected.detach().abs().max()))
            continue
        # the dual is the reference's within float32 rounding of its steps (relative to the tensor's scale:
        # u - lr d cancels), and the parameter is its dual's inverse map within float32 rounding of the map
        # (the map's exponent 1 / (p - 1) would amplify the dual's error near 0 at p = 3 and at scale at p = 1.1)
        u = opt.state[w]["dual"]
        assert u.device == w.device and u.dtype == torch.float32
        u, expected_u = u.cpu().double(), reference_opt.state[expected]["dual"]
        torch.testing.assert_close(u, expected_u, rtol=0, atol=1e-5 * float(expected_u.abs().max()))
        torch.testing.assert_close(w.detach().cpu().double(), mirror.inverse_mirror_map(u, p), rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options", [{}, dict(momentum=0.9, dampening=0.5), dict(weight_decay=0.1, maximize=True),
                                     dict(momentum=0.9, nesterov=True, weight_decay=0.1)],
                         ids=["plain", "dampening", "weight_decay-maximize", "nesterov"])
def test_p2_is_torch_sgd_on_cuda_bit_for_bit(options, path):
    a, b = make_model().to(DEVICE), make_model().to(DEVICE)
    opt = LpMirrorDescent(a.parameters(), lr=0.05, **options, **PATHS[path])
    train_steps(a, opt, 20)
    train_steps(b, torch.optim.SGD(b.parameters(), lr=0.05, **options, **PATHS[path]), 20)
    assert_bitwise(list(a.parameters()), list(b.parameters()))
    assert not any("dual" in state for state in opt.state.values())


# --- 2. the lazy check (the GPU default): a refused step is undone at the next step() or check() ------

def _refuse(model: nn.Module, opt: LpMirrorDescent, cause: str) -> None:
    """A step that must be refused: an inverse map that overflows (p = 1.1 and a huge lr), or a NaN
    gradient."""
    loss_on(model, 7).backward()
    if cause == "overflow":
        opt.param_groups[0]["lr"] = 1e6  # |u| ~ 1e5, and |u|^10 overflows float32
    else:
        model[0].weight.grad[1, 2] = float("nan")
    try:
        opt.step()
    finally:
        opt.param_groups[0]["lr"] = 1e-3


@pytest.mark.parametrize("settle", ["step", "check", "immediate"])
@pytest.mark.parametrize("cause", ["overflow", "nan-gradient"])
@pytest.mark.parametrize("path", PATHS)
def test_a_refused_step_on_cuda_is_undone_bit_for_bit(path, cause, settle):
    """Lazily (the default) the step returns at once and the next step() or check() finds the refusal,
    restores parameters, duals and momentum buffers bit for bit and names the parameter; checked
    immediately (lazy_check=False) the step itself raises. Training goes on afterwards."""
    model = make_model().to(DEVICE)
    lazy = None if settle != "immediate" else False
    opt = LpMirrorDescent(model.named_parameters(), lr=1e-3, p=1.1, momentum=0.9, lazy_check=lazy, **PATHS[path])
    assert opt._lazy() is (settle != "immediate")
    train_steps(model, opt, 3)
    saved = snapshot(model, opt)
    where = r".*found at the next step: lazy_check" if lazy is None else ""
    message = (rf"the inverse mirror map overflowed in .*0\.weight{where}.*reduce lr \(now 1000000"
               if cause == "overflow" else rf"non-finite gradient in 0\.weight{where}")
    if settle == "immediate":
        with pytest.raises(FloatingPointError, match=message):
            _refuse(model, opt, cause)
    else:
        _refuse(model, opt, cause)  # no error yet: the flags are read at the next step
        assert opt._guard.pending
        assert not all(bool(torch.isfinite(w).all()) for w in model.parameters())  # visible until settled
        opt.zero_grad()
        with pytest.raises(FloatingPointError, match=message):
            if settle == "step":
                loss_on(model, 8).backward()
                opt.step()
            else:
                opt.check()
    assert not opt._guard.pending
    assert_same(model, opt, saved)
    opt.zero_grad()
    train_steps(model, opt, 3, start=9)
    opt.check()
    assert all(bool(torch.isfinite(w).all()) for w in model.parameters())
    assert_ran_as_asked(opt, path)


# --- 3. bfloat16 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("p", [1.1, 1.75, 3.0])
def test_bf16_parameters_keep_a_float32_dual_on_cuda(p, path):
    gen = torch.Generator().manual_seed(1)
    w = nn.Parameter(torch.randn(1000, generator=gen).to(DEVICE, torch.bfloat16))
    opt = LpMirrorDescent([w], lr=1e-3, p=p, **PATHS[path])
    for _ in range(20):
        w.grad = (1e-2 * torch.randn(1000, generator=gen)).to(DEVICE, torch.bfloat16)
        opt.step()
    opt.check()
    assert_ran_as_asked(opt, path)
    u = opt.state[w]["dual"]
    assert w.dtype == torch.bfloat16 and u.dtype == torch.float32 and u.device == w.device
    # the parameter is m^-1(u) rounded to bfloat16 (within one bfloat16 rounding of the eager map)
    torch.testing.assert_close(w.detach().float(), mirror.inverse_mirror_map(u, p).bfloat16().float(),
                               rtol=2 ** -7, atol=1e-30)
    # without edits the edit check keeps the float32 dual: zero-gradient steps change nothing, bit for bit
    before, dual = w.detach().clone(), u.clone()
    for _ in range(3):
        w.grad = torch.zeros_like(w)
        opt.step()
    opt.check()
    assert_bitwise([w, opt.state[w]["dual"]], [before, dual])


def _dual_path(model: nn.Module, precision: str, path: str, steps: int = 10, p: float = 1.75, lr: float = 0.05):
    """Train ``model`` (on the GPU) ``steps`` steps: "fp32", "autocast" (float32 parameters, the forward
    pass and loss under bfloat16 autocast) or "bf16" (bfloat16 parameters); returns the losses, the
    parameters and the duals, as float32."""
    opt = LpMirrorDescent(model.parameters(), lr=lr, p=p, **PATHS[path])
    losses = []
    for k in range(steps):
        opt.zero_grad()
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=precision == "autocast"):
            loss = loss_on(model, k % 2)
        loss.backward()
        opt.step()
        losses.append(loss.float())
    opt.check()
    assert_ran_as_asked(opt, path)
    params = list(model.parameters())
    return (torch.stack(losses).cpu(), [w.detach().float() for w in params],
            [opt.state[w]["dual"].float() for w in params])


@pytest.mark.parametrize("path", PATHS)
def test_bf16_training_on_cuda_matches_float32_approximately(path):
    """The same steps in float32, under bfloat16 autocast and with bfloat16 parameters (from the same
    bfloat16-representable start): the losses go down alike, and the parameters and duals move as the
    float32 run's, within bfloat16's precision (on the CPU the runs differ by about 1 % of the move)."""
    start = make_model(seed=3)
    with torch.no_grad():
        for w in start.parameters():
            w.copy_(w.bfloat16().float())
    runs = {}
    for precision in ("fp32", "autocast", "bf16"):
        model = copy.deepcopy(start).to(DEVICE, torch.bfloat16 if precision == "bf16" else torch.float32)
        runs[precision] = _dual_path(model, precision, path)
    initial = [w.detach().to(DEVICE) for w in start.parameters()]
    initial_duals = [mirror.mirror_map(w, 1.75) for w in initial]
    losses, params, duals = runs["fp32"]
    assert losses[-2:].mean() < 0.95 * losses[:2].mean()
    for precision in ("autocast", "bf16"):
        other_losses, other_params, other_duals = runs[precision]
        assert torch.isfinite(other_losses).all()
        torch.testing.assert_close(other_losses, losses, rtol=0.05, atol=1e-3)
        for name, ours, theirs, zero in (("parameters", params, other_params, initial),
                                         ("duals", duals, other_duals, initial_duals)):
            moved = math.sqrt(sum(float((a - z).square().sum()) for a, z in zip(ours, zero)))
            apart = math.sqrt(sum(float((a - b).square().sum()) for a, b in zip(ours, theirs)))
            assert moved > 0 and apart <= 0.1 * moved, (precision, name, apart, moved)


# --- 4. the edit check -------------------------------------------------------------------------------

@pytest.mark.parametrize("lazy", [None, False], ids=["lazy", "immediate"])
@pytest.mark.parametrize("edit", [edit_clamp, edit_vector, edit_no_grad], ids=["clamp", "vector", "no_grad"])
@pytest.mark.parametrize("path", PATHS)
def test_an_edit_outside_the_optimizer_is_stepped_from_on_cuda(path, edit, lazy):
    """After an edit (through ``.data`` too, which torch's version counter does not see) the next step
    starts from the edited parameter: m^-1(m(w_edited) - lr g), against ``mirror.mirror_step`` in float64
    on the same GPU."""
    model = make_model(torch.float64).to(DEVICE)
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=1.75, lazy_check=lazy, **PATHS[path])
    train_steps(model, opt, 3)
    edit(model)
    before = [w.detach().clone() for w in model.parameters()]
    opt.zero_grad()
    loss_on(model, 9).backward()
    grads = [w.grad.clone() for w in model.parameters()]
    opt.step()
    opt.check()
    assert_ran_as_asked(opt, path)
    for w, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(w.detach(), mirror.mirror_step(b, g, 0.01, 1.75), rtol=1e-10, atol=1e-13)
    if edit is edit_clamp:
        assert max(w.abs().max().item() for w in model.parameters()) < 0.2  # not the unclamped weights


# --- 5. the training loop and the pool on "cuda" -------------------------------------------------------

def token_data(n: int, seed: int, vocab: int = 50, longest: int = 12) -> tokens.TokenizedDataset:
    """Random token sequences of 3 to ``longest`` ids ([CLS] = 1 first), labelled by whether id 7 occurs."""
    g = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(n):
        length = int(torch.randint(3, longest + 1, (1,), generator=g))
        ids.append([1] + torch.randint(2, vocab, (length - 1,), generator=g).tolist())
    return tokens.TokenizedDataset(ids, [int(7 in x) for x in ids])


@pytest.mark.parametrize("optimizer", ["md-fused", "md-built-on-cpu", "gd"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fit_trains_an_encoder_on_cuda(precision, optimizer):
    """``train.fit`` on "cuda": the sentiment encoder (attention with padding masks), in float32 and
    under bfloat16 autocast, with mirror descent made over GPU parameters (fused, as ``make_optimizer``
    chooses there), over CPU parameters (the run builders make it before fit moves the model: foreach),
    and gradient descent (p = 2)."""
    data, test = token_data(120, 0), token_data(40, 1)
    torch.manual_seed(0)
    model = EncoderClassifier(vocab_size=50, max_length=16, width=24, layers=2, heads=2, mlp=48, dropout=0.1)
    if optimizer == "md-fused":
        model.to(DEVICE)
    p, lr = (2.0, 1e-3) if optimizer == "gd" else (1.1, 1e-3)
    opt = methods.make_optimizer(model.parameters(), "md", lr, p)
    assert opt.param_groups[0]["fused"] is (True if optimizer == "md-fused" else None)
    lengths = [len(x) for x in data.ids]
    history = fit(model, opt, data, test, epochs=3, batch_size=20, seed=0, loss="binary", reduction="sum",
                  precision=precision, collate_fn=tokens.collate, lengths=lengths, progress=False,
                  device=DEVICE)
    assert history["epoch"].tolist() == [1, 2, 3]
    assert history.drop(columns="lr").notna().all().all()
    assert all(0 <= a <= 1 for a in history["train_accuracy"].tolist() + history["test_accuracy"].tolist())
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    for w in model.parameters():
        assert w.device.type == DEVICE and w.dtype == torch.float32 and bool(torch.isfinite(w).all())
        if p != 2.0:
            assert opt.state[w]["dual"].device == w.device and opt.state[w]["dual"].dtype == torch.float32
    assert_ran_as_asked(opt, "fused" if optimizer == "md-fused" else "foreach")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_interrupted_run_on_cuda_resumes_bit_for_bit(precision, tmp_path):
    """A run killed in its third epoch resumes from its checkpoint (model, optimizer, CUDA RNG state) to
    the numbers and weights of the uninterrupted run on the same GPU (an MLP: its kernels are
    deterministic; dropout draws from the CUDA generator)."""
    x, y = blobs(60)
    data, test = TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])
    kw = dict(epochs=3, batch_size=10, seed=7, progress=False, device=DEVICE, precision=precision)

    def made(seed):
        model = mlp(seed).to(DEVICE)
        return model, methods.make_optimizer(model.parameters(), "md", 0.05, 1.5)  # fused on the GPU

    straight, opt = made(0)
    reference = fit(straight, opt, data, test, **kw)
    model, opt = made(0)
    with pytest.raises(KeyboardInterrupt):
        fit(model, opt, Crashing(data, 2 * 48 + 20), test, checkpoint=tmp_path / "ckpt", **kw)
    resumed, opt = made(99)
    history = fit(resumed, opt, data, test, checkpoint=tmp_path / "ckpt", **kw)
    same_history(history, reference)
    assert_bitwise(list(resumed.state_dict().values()), list(straight.state_dict().values()))
    assert_ran_as_asked(opt, "fused")


def device_of(model: nn.Module) -> dict:
    """``extras`` of the pool's runs (module level: sent to worker processes): where the model trained."""
    return {"device": next(model.parameters()).device.type}


def test_run_many_trains_one_run_per_gpu_and_reads_them_back():
    """``run_many(workers=<visible GPUs>)``: one worker process per GPU when there are several, the runs
    one after another in this process on one GPU; every run is stored, trained on a GPU, and read back."""
    gpus = torch.cuda.device_count()
    slots = pool._device_slots()
    assert len(slots) == gpus
    configs = [blobs_run(seed, epochs=2) for seed in range(max(2, gpus))]
    assert pool._pool_devices(gpus, len(configs), None) == (None if gpus == 1 else slots)
    results = pool.run_many("cuda-blobs", configs, build_blobs, extras=device_of, workers=gpus, progress=False)
    assert len(results) == len(configs) and all(r.cached for r in results)  # read back from the store
    for result, config in zip(results, configs):
        assert result["device"] == DEVICE
        assert result["history"]["epoch"].tolist() == [1, 2]
        assert result["history"].drop(columns="lr").notna().all().all()
        assert store.load(identity.RunId.of("cuda-blobs", config)) is not None
    again = pool.run_many("cuda-blobs", configs, build_blobs, extras=device_of, workers=gpus, progress=False)
    for a, b in zip(results, again):
        assert b.cached and b.key == a.key
        pd.testing.assert_frame_equal(a["history"], b["history"])
