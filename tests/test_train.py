"""The training loop: bit-exact resume, early stop, losses, dict inputs, errors, DDP."""

from __future__ import annotations

import dataclasses
import logging
import os
import runpy
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from mdlib.experiments import train
from mdlib.optim import LpMirrorDescent


def fit(model, optimizer, train_set, test_set, **keywords):
    """``train.fit`` with its ``FitOptions`` given among its keywords, as these tests write them."""
    names = {f.name for f in dataclasses.fields(train.FitOptions)}
    options = train.FitOptions(**{k: v for k, v in keywords.items() if k in names})
    return train.fit(model, optimizer, train_set, test_set, options,
                     **{k: v for k, v in keywords.items() if k not in names})


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


def blobs(n, d=6, classes=2, seed=0, noise=1.0):
    """Gaussian blobs: (features, integer labels)."""
    g = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(classes, d, generator=g)
    y = torch.randint(classes, (n,), generator=g)
    return centers[y] + noise * torch.randn(n, d, generator=g), y


def mlp(seed, d=6, out=1, dropout=0.3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, out))


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "md1.5": lambda params: LpMirrorDescent(params, lr=0.05, p=1.5),
}


class Crashing(Dataset):
    """A dataset that raises after ``after`` item reads: a run killed in the middle of an epoch."""

    def __init__(self, base, after):
        self.base, self.reads, self.after = base, 0, after

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        self.reads += 1
        if self.reads > self.after:
            raise KeyboardInterrupt("simulated interruption")
        return self.base[index]


def same_history(a: pd.DataFrame, b: pd.DataFrame):
    cols = [c for c in train.COLUMNS if c != "seconds"]
    pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=True)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_interrupted_run_resumes_bit_for_bit(name, tmp_path, caplog):
    x, y = blobs(60)
    data, test = TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])
    kw = dict(epochs=3, batch_size=10, seed=7, progress=False)  # 48 = 4 x 10 + 8: a short last batch

    straight = mlp(0)
    reference = fit(straight, OPTIMIZERS[name](straight.parameters()), data, test, **kw)
    assert reference["epoch"].tolist() == [1, 2, 3] and reference.notna().all().all()

    folder = tmp_path / "ckpt"
    model = mlp(0)
    with pytest.raises(KeyboardInterrupt):  # killed in epoch 3, after the checkpoint of epoch 2
        fit(model, OPTIMIZERS[name](model.parameters()), Crashing(data, 2 * 48 + 20), test,
                  checkpoint=folder, **kw)
    assert [p.name for p in folder.iterdir()] == ["checkpoint.pt"]  # no temporary file left behind

    torch.manual_seed(12345)  # neither the global RNG state at the call ...
    resumed = mlp(99)         # ... nor the initialization matter: the checkpoint restores both
    with caplog.at_level(logging.INFO, logger="mdlib.experiments.train"):
        history = fit(resumed, OPTIMIZERS[name](resumed.parameters()), data, test, checkpoint=folder, **kw)
    assert "resumed" in caplog.text and "after epoch 2" in caplog.text
    same_history(history, reference)
    for a, b in zip(resumed.state_dict().values(), straight.state_dict().values()):
        assert torch.equal(a, b)

    # a finished checkpoint: fit returns its history and weights without reading any data
    done = mlp(5)
    history = fit(done, OPTIMIZERS[name](done.parameters()), Crashing(data, 0), test, checkpoint=folder, **kw)
    same_history(history, reference)
    for a, b in zip(done.state_dict().values(), straight.state_dict().values()):
        assert torch.equal(a, b)


def test_extending_a_finished_run_equals_the_longer_run(tmp_path):
    x, y = blobs(40)
    data = TensorDataset(x, y)
    kw = dict(batch_size=8, seed=1, progress=False)
    straight = mlp(0)
    reference = fit(straight, LpMirrorDescent(straight.parameters(), lr=0.05, p=1.5), data, None,
                          epochs=3, **kw)
    model = mlp(0)
    fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.5), data, None, epochs=2,
              checkpoint=tmp_path, **kw)
    model = mlp(0)
    history = fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.5), data, None, epochs=3,
                        checkpoint=tmp_path, **kw)
    same_history(history, reference)
    assert history["test_accuracy"].isna().all()
    for a, b in zip(model.parameters(), straight.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="holds 3 epochs, more than epochs=2"):
        fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.5), data, None, epochs=2,
                  checkpoint=tmp_path, **kw)
    with pytest.raises(ValueError, match="belongs to another run"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, None, epochs=4, checkpoint=tmp_path,
                  batch_size=4, seed=1, progress=False)


def test_seed_fixes_the_run_and_changes_it():
    x, y = blobs(40)
    data = TensorDataset(x, y)

    def history(seed):
        model = mlp(0)
        return fit(model, torch.optim.SGD(model.parameters(), lr=0.1), data, None, epochs=2, batch_size=8,
                         seed=seed, progress=False)

    same_history(history(3), history(3))
    assert not history(3)["train_loss"].equals(history(4)["train_loss"])


def test_early_stop_after_the_first_epoch_reaching_the_training_accuracy():
    x, y = blobs(80, noise=0.5, seed=2)
    data, test = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    model = mlp(0, dropout=0.0)
    history = fit(model, torch.optim.SGD(model.parameters(), lr=0.05), data, test, epochs=100, batch_size=8,
                        seed=0, stop_train_accuracy=0.95, eval_every=1000, progress=False)
    accuracy = history["train_accuracy"].to_numpy()
    assert len(history) < 100 and accuracy[-1] >= 0.95 and (accuracy[:-1] < 0.95).all()
    assert history["test_accuracy"].iloc[:-1].isna().all()  # eval_every=1000 ...
    assert history["test_accuracy"].iloc[-1] > 0.8          # ... but the stopping epoch is evaluated
    assert (history["lr"] == 0.05).all() and (history["seconds"] > 0).all()


class Flat(nn.Module):
    """A logistic model returning (B,) or (B, 1) logits."""

    def __init__(self, keepdim):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.keepdim = nn.Linear(6, 1), keepdim

    def forward(self, x):
        out = self.linear(x)
        return out if self.keepdim else out[:, 0]


def test_binary_loss_is_bce_with_logits_for_both_logit_shapes():
    x, y = blobs(30)
    data = TensorDataset(x, y.float())  # float 0/1 labels are fine for "binary"
    histories = []
    for keepdim in (False, True):
        model = Flat(keepdim)
        before = Flat(keepdim)
        histories.append(fit(model, torch.optim.SGD(model.parameters(), lr=1e-9), data, data, epochs=1,
                                   batch_size=30, seed=0, progress=False))
    same_history(*histories)
    with torch.no_grad():
        logits = before(x).reshape(-1)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float()).item()
    row = histories[0].iloc[0]
    assert row["train_loss"] == pytest.approx(expected, rel=1e-6)
    assert row["test_loss"] == pytest.approx(expected, rel=1e-6)
    assert row["train_accuracy"] == pytest.approx(((logits > 0) == (y == 1)).float().mean().item())


def test_multiclass_loss_is_cross_entropy_and_learns():
    x, y = blobs(90, classes=3, noise=0.5)
    data, test = TensorDataset(x[:60], y[:60]), TensorDataset(x[60:], y[60:])
    model = mlp(0, out=3, dropout=0.0)
    with torch.no_grad():
        first = torch.nn.functional.cross_entropy(model(x[60:]), y[60:]).item()
    history = fit(model, torch.optim.Adam(model.parameters(), lr=0.02), data, test, epochs=15,
                        batch_size=10, seed=0, loss="multiclass", eval_every=5, progress=False)
    assert history["test_loss"].notna().tolist() == [k % 5 == 4 for k in range(15)]
    assert history["test_loss"].iloc[-1] < first / 2 and history["test_accuracy"].iloc[-1] > 0.9
    with torch.no_grad():
        final = torch.nn.functional.cross_entropy(model(x[60:]), y[60:]).item()
    assert history["test_loss"].iloc[-1] == pytest.approx(final, rel=1e-6)


class Tokens(Dataset):
    """Padded token sequences as dicts (input_ids, attention_mask); the label is whether token 1 occurs."""

    def __init__(self, n, pad_id, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(2, 9, (n,), generator=g)
        self.ids = torch.randint(1, 5, (n, 8), generator=g)
        self.mask = torch.arange(8) < self.lengths[:, None]
        self.ids[~self.mask] = pad_id
        self.labels = (self.mask & (self.ids == 1)).any(dim=1).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i]}, self.labels[i]


class Pool(nn.Module):
    """Max-pooled embedding over the unmasked tokens, one logit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.drop, self.out = nn.Embedding(10, 8), nn.Dropout(0.2), nn.Linear(8, 1)

    def forward(self, input_ids, attention_mask):
        h = self.drop(self.embed(input_ids)).masked_fill(~attention_mask[..., None], -1e9)
        return self.out(h.amax(dim=1))


def test_dict_inputs_are_passed_as_keywords_and_the_mask_is_honoured():
    def history(pad_id):
        model = Pool()
        return fit(model, torch.optim.Adam(model.parameters(), lr=0.05), Tokens(64, pad_id),
                         Tokens(32, pad_id, seed=1), epochs=8, batch_size=16, seed=0, progress=False)

    zero = history(0)
    same_history(zero, history(9))  # what sits in the padded positions changes nothing
    assert zero["test_accuracy"].iloc[-1] > 0.8


class Items(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_clear_errors():
    x, y = blobs(8)
    model = mlp(0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = dict(epochs=1, batch_size=4, seed=0, progress=False)
    cases = [
        (TensorDataset(x, y[:, None]), {}, r"labels of shape \(4,\).*got \(4, 1\)"),
        (TensorDataset(x, 2 * y), {}, "loss='binary' needs labels 0 or 1"),
        (TensorDataset(x, y.float()), {"loss": "multiclass"}, "integer class labels"),
        (TensorDataset(x), {}, r"\(inputs, label\) pairs"),
        (Items([([1.0], 0)] * 8), {}, "inputs must be a tensor or a dict of tensors"),
        (TensorDataset(x, y), {"loss": "hinge"}, "loss must be one of"),
        (TensorDataset(x, y), {"epochs": 0}, "epochs must be an integer >= 1"),
        (TensorDataset(x, y), {"stop_train_accuracy": 99.5}, "stop_train_accuracy must be in"),
    ]
    for data, extra, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            fit(model, sgd, data, None, **{**kw, **extra})
    two = mlp(0, out=2)
    with pytest.raises(ValueError, match=r"one logit per example.*returned \(4, 2\)"):
        fit(two, torch.optim.SGD(two.parameters(), lr=0.1), TensorDataset(x, y), None, **kw)
    with pytest.raises(ValueError, match=r"logits of shape \(4, classes\)"):
        flat = Flat(False)
        fit(flat, torch.optim.SGD(flat.parameters(), lr=0.1), TensorDataset(x, y), None,
                  **{**kw, "loss": "multiclass"})


# ---------------------------------------------------------------------------------------------
# data parallel


DDP_SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    from mdlib.experiments import train
    from mdlib.optim import LpMirrorDescent

    def make():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(90, 6, generator=g)
        y = (x[:, 0] + 0.5 * torch.randn(90, generator=g) > 0).long()
        torch.manual_seed(0)  # a different initialization on every rank: DDP broadcasts rank 0's
        if int(os.environ.get("RANK", "0")) > 0:
            torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        # 69 = 4 x 16 + 5: the last global batch splits 3 / 2
        return model, LpMirrorDescent(model.parameters(), lr=0.2, p=1.5), TensorDataset(x[:69], y[:69]), \
            TensorDataset(x[69:], y[69:])

    if __name__ == "__main__":
        out = sys.argv[1]
        model, opt, data, test = make()
        try:
            train.fit(model, opt, data, test, train.FitOptions(epochs=1, batch_size=15, seed=0), progress=False)
        except ValueError as exc:
            assert "not divisible by the 2 processes" in str(exc), exc
        else:
            raise AssertionError("batch_size 15 over 2 processes was accepted")
        history = train.fit(model, opt, data, test, train.FitOptions(epochs=4, batch_size=16, seed=3), progress=False,
                            checkpoint=os.path.join(out, "ckpt"))
        torch.save({"history": history.to_dict("list"), "state": model.state_dict()},
                   os.path.join(out, f"rank{os.environ['RANK']}.pt"))
""")


@pytest.mark.slow  # 6-14 s: launches torchrun with two processes
def test_two_process_data_parallel_equals_one_process(tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(script), str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    make = runpy.run_path(str(script), run_name="reference")["make"]
    model, opt, data, test = make()
    reference = fit(model, opt, data, test, epochs=4, batch_size=16, seed=3, progress=False)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for got in ranks:
        for column in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
            np.testing.assert_allclose(got["history"][column], reference[column], rtol=1e-5, atol=1e-7)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(got["state"][name], value, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "ckpt" / "checkpoint.pt").exists()


def test_length_pools_put_similar_lengths_together_and_cover_the_epoch():
    world = train.World(0, 1, torch.device("cpu"))
    lengths = torch.randint(1, 100, (1000,), generator=torch.Generator().manual_seed(0))
    parts = train.train_batches(1000, 10, seed=3, epoch=0, world=world, lengths=lengths, pool=50)
    assert sorted(i for batch, _ in parts for i in batch) == list(range(1000))
    spread = np.mean([lengths[batch].max().item() - lengths[batch].min().item() for batch, _ in parts])
    shuffled = np.mean([lengths[batch].max().item() - lengths[batch].min().item()
                        for batch, _ in train.train_batches(1000, 10, 3, 0, world)])
    assert spread < 0.1 * shuffled  # about 2 against about 88
    assert parts == train.train_batches(1000, 10, 3, 0, world, lengths, 50)
    assert parts != train.train_batches(1000, 10, 3, 1, world, lengths, 50)
    # one pool per epoch: the same length deciles every epoch; small pools: batches change
    whole, small = train.batching(lengths, 10, pool=100, seed=3), train.batching(lengths, 10, pool=4, seed=3)
    assert whole["again"] > 0.4 and small["again"] < 3 * small["random_again"]
    assert whole["padding"] < small["padding"] < train.batching(lengths, 10, pool=1, seed=3)["padding"]
    assert small["random_again"] == pytest.approx(9 / 999)
    with pytest.raises(ValueError, match="one length per training example"):
        x, y = blobs(20)
        model = mlp(0)
        fit(model, OPTIMIZERS["md1.5"](model.parameters()), TensorDataset(x, y.float()), None, epochs=1,
                  batch_size=5, seed=0, lengths=[3] * 19, progress=False)


def test_fit_reports_a_lazily_checked_refusal_of_the_last_step():
    """An optimizer that reads its finiteness flags lazily (LpMirrorDescent on a GPU; forced here) has
    its last step of an epoch settled by fit, so a refused step is not left in the model."""
    x, y = blobs(32)
    model = mlp(0)
    optimizer = LpMirrorDescent(model.parameters(), lr=1e38, p=1.1, lazy_check=True)
    with pytest.raises(FloatingPointError, match="reduce lr"):
        fit(model, optimizer, TensorDataset(x, y), None, epochs=1, batch_size=32, seed=0, progress=False)
    assert all(torch.isfinite(w).all() for w in model.parameters())


def linear_dtypes(model):
    """The dtypes of the outputs of ``model``'s Linear layers, as a list that grows with every call."""
    seen = []
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    return seen


def test_fp32_is_the_default_and_a_plain_float32_loop():
    """``fit``'s default steps exactly as a hand-written float32 loop over its batches (no autocast)."""
    x, y = blobs(60, classes=3, noise=0.5)
    model = mlp(0, out=3, dropout=0.0)
    seen = linear_dtypes(model)
    fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.5), TensorDataset(x, y), None, epochs=2,
              batch_size=16, seed=0, loss="multiclass", progress=False)
    assert set(seen) == {torch.float32}
    reference = mlp(0, out=3, dropout=0.0)
    optimizer = LpMirrorDescent(reference.parameters(), lr=0.05, p=1.5)
    world = train.World(0, 1, torch.device("cpu"))
    for epoch in range(2):
        for indices, _ in train.train_batches(60, 16, 0, epoch, world):
            loss = nn.functional.cross_entropy(reference(x[indices]), y[indices])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_bf16_autocast_keeps_float32_state_and_stays_near_the_fp32_run():
    """``precision="bf16"``: the layers compute in bfloat16 (training and evaluation), while every
    parameter, gradient and mirror-descent state tensor stays float32; the loss decreases and the run
    is close to, not equal to, the float32 one."""
    x, y = blobs(120, classes=3, noise=0.5)
    data, test = TensorDataset(x[:90], y[:90]), TensorDataset(x[90:], y[90:])
    runs = {}
    for precision in train.PRECISIONS:
        model = mlp(0, out=3, dropout=0.0)
        optimizer = LpMirrorDescent(model.parameters(), lr=0.05, p=1.5)
        seen = linear_dtypes(model)
        history = fit(model, optimizer, data, test, epochs=6, batch_size=15, seed=0, loss="multiclass",
                            progress=False, precision=precision)
        runs[precision] = model, optimizer, history, seen
    model, optimizer, history, seen = runs["bf16"]
    assert set(seen) == {torch.bfloat16}
    assert history.train_loss.iloc[-1] < history.train_loss.iloc[0] / 2
    assert all("dual" in optimizer.state[p] for p in model.parameters())
    state = [value for p in model.parameters() for value in optimizer.state[p].values()  # dual, spare buffer
             if isinstance(value, torch.Tensor) and value.shape == p.shape]
    assert {t.dtype for t in state} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {p.grad.dtype for p in model.parameters()} == {torch.float32}
    fp32_model, _, fp32_history, _ = runs["fp32"]
    assert not fp32_history.train_loss.equals(history.train_loss)
    np.testing.assert_allclose(history.test_loss, fp32_history.test_loss, rtol=0.05)
    for a, b in zip(model.parameters(), fp32_model.parameters()):
        assert not torch.equal(a, b)
        torch.testing.assert_close(a, b, rtol=0, atol=0.05)


def test_a_bf16_checkpoint_resumes_only_a_bf16_run(tmp_path):
    x, y = blobs(40)
    data = TensorDataset(x, y.float())

    def run(precision, epochs):
        model = mlp(0)
        return fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.5), data, None, epochs=epochs,
                         batch_size=10, seed=0, checkpoint=tmp_path, progress=False, precision=precision)

    run("bf16", 1)
    assert len(run("bf16", 2)) == 2
    with pytest.raises(ValueError, match="precision: 'bf16' vs None"):
        run("fp32", 3)
    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'bf16'\).*got 'fp16'"):
        run("fp16", 3)
