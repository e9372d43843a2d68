"""LpMirrorDescent under torch.compile: a compiled training step (forward, backward, ``opt.step()``) with no
graph break in the optimizer and no recompilation after the first steps; ``fullgraph=True`` on the step;
a refused step skipped on the device and reported by ``check()``; an edit between steps respected. Each
test compiles (seconds on a CPU): marked slow."""

import pathlib

import pytest
import torch
import torch._dynamo

from mdlib.optim import LpMirrorDescent

pytestmark = pytest.mark.slow
OPTIM_FILE = str(pathlib.Path(LpMirrorDescent.__module__.replace(".", "/") + ".py"))


def setup(p, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = LpMirrorDescent(model.parameters(), lr=0.01, p=p, **kwargs)
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("p, kwargs", [(1.75, {}), (3.0, dict(momentum=0.9, weight_decay=0.01, nesterov=True)),
                                       (1.1, dict(momentum=0.9, maximize=True)), (2.0, dict(momentum=0.9)),
                                       (2.0, dict(normalize=True))])
def test_a_compiled_training_step_has_no_break_in_the_optimizer_and_no_recompile(p, kwargs):
    model, opt, step = setup(p, **kwargs)
    eager_model, eager_opt, eager_step = setup(p, **kwargs)
    compiled = torch.compile(step)
    for _ in range(2):  # the first steps compile (the momentum buffers appear at the first)
        compiled()
        eager_step()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(6):
            compiled()
            eager_step()
    opt.check()
    for a, b in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # the compiled power differs in the last bits
    explained = torch._dynamo.explain(step)()
    in_optimizer = [b for b in explained.break_reasons if any(OPTIM_FILE in frame.filename for frame in b.user_stack)]
    assert not in_optimizer, [str(b.reason) for b in in_optimizer]
    assert all("backward" in str(b.reason) for b in explained.break_reasons)  # dynamo does not trace backward
    assert torch._dynamo.explain(opt.step)().graph_break_count == 0


def test_the_step_compiles_with_fullgraph():
    model, opt, step = setup(1.75, momentum=0.5)
    compiled = torch.compile(opt.step, fullgraph=True)
    for k in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8, generator=torch.Generator().manual_seed(k))).sum().backward()
        compiled()
    opt.check()
    assert all(torch.isfinite(w).all() for w in model.parameters())


def test_a_refused_compiled_step_changes_nothing_and_check_reports_it():
    model, opt, step = setup(1.75, momentum=0.9)
    compiled = torch.compile(opt.step)
    for _ in range(2):
        opt.zero_grad()
        ((model(torch.ones(2, 8))) ** 2).sum().backward()
        compiled()
    before = [w.detach().clone() for w in model.parameters()]
    state = {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state.items()}
    model[2].bias.grad.fill_(float("inf"))
    compiled()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    for key, entry in state.items():
        for name in ("dual", "momentum_buffer"):
            assert torch.equal(opt.state[key][name], entry[name])
    with pytest.raises(FloatingPointError, match="1 step.*under torch.compile.*skipped"):
        opt.check()
    opt.check()  # reported once
    model[2].bias.grad.zero_()
    compiled()
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_an_edit_between_compiled_steps_is_stepped_from():
    """As the eager step does: the edited entries get a new dual u = m(w) (an edit through ``.data``,
    which torch's version counter does not see)."""
    runs = []
    for compile_it in (True, False):
        model, opt, step = setup(3.0)
        run = torch.compile(step) if compile_it else step
        for _ in range(3):
            run()
        with torch.no_grad():
            model[0].weight.data.clamp_(-0.05, 0.05)
        run()
        runs.append(model)
    for a, b in zip(runs[0].parameters(), runs[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    unedited, _, step = setup(3.0)
    for _ in range(4):
        step()
    assert (unedited[0].weight - runs[0][0].weight).abs().max() > 0.01  # the edit mattered
