"""Faults lose nothing: checkpoints of another run or corrupt ones, killed store writes, killed parents of
worker processes, failed notebook re-executions."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import TensorDataset

from mdlib.book import execute
from mdlib.experiments import paths, train
from mdlib.optim import LpMirrorDescent
from mdlib.runs import files, lockfile, store
from mdlib.runs.files import atomic_write
from mdlib.runs.identity import RunId


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


def toy(seed=0, n=32, d=4):
    """A linear model and a binary data set of ``n`` points."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x[:, 0] > 0).float()
    torch.manual_seed(seed)
    return nn.Linear(d, 1), TensorDataset(x, y)


# ---------------------------------------------------------------------------------------------
# checkpoints


def fit_md(folder, lr, p, epochs, **kw):
    model, data = toy()
    optimizer = LpMirrorDescent(model.parameters(), lr=lr, p=p)
    return train.fit(model, optimizer, data, None, train.FitOptions(epochs=epochs, batch_size=8, seed=0, **kw),
                     checkpoint=folder, progress=False), optimizer


def test_a_checkpoint_of_other_optimizer_settings_is_refused_naming_both(tmp_path):
    fit_md(tmp_path, lr=0.05, p=1.75, epochs=1)
    # before: this resumed and went on at lr 0.05, p 1.75 (load_state_dict restores the param groups)
    with pytest.raises(ValueError, match=r"belongs to another run.*optimizer\.lr: 0\.05 vs 0\.5; "
                                         r"optimizer\.p: 1\.75 vs 3"):
        fit_md(tmp_path, lr=0.5, p=3.0, epochs=2)
    model, data = toy()
    with pytest.raises(ValueError, match=r"optimizer: 'LpMirrorDescent' vs 'Adam'"):
        train.fit(model, torch.optim.Adam(model.parameters(), lr=0.05), data, None,
                  train.FitOptions(epochs=2, batch_size=8, seed=0), checkpoint=tmp_path, progress=False)
    wider = nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"model\.weight: \[1, 4\] vs \[2, 4\]"):
        train.fit(wider, LpMirrorDescent(wider.parameters(), lr=0.05, p=1.75), data, None,
                  train.FitOptions(epochs=2, batch_size=8, seed=0, loss="binary"), checkpoint=tmp_path, progress=False)
    model, data = toy()
    with pytest.raises(ValueError, match=r"test_size: None vs 8"):
        train.fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.75), data, TensorDataset(*data[:8]),
                  train.FitOptions(epochs=2, batch_size=8, seed=0), checkpoint=tmp_path, progress=False)
    history, optimizer = fit_md(tmp_path, lr=0.05, p=1.75, epochs=3)  # the same settings resume
    assert history["epoch"].tolist() == [1, 2, 3] and optimizer.param_groups[0]["lr"] == 0.05


def test_a_corrupt_checkpoint_is_reported_moved_aside_and_the_run_starts_over(tmp_path, caplog):
    reference, _ = fit_md(tmp_path / "clean", lr=0.05, p=1.75, epochs=2)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "checkpoint.pt").write_bytes(b"\x00not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="mdlib.experiments.train"):
        history, _ = fit_md(folder, lr=0.05, p=1.75, epochs=2)
    assert str(folder / "checkpoint.pt") in caplog.text and "starting this run from scratch" in caplog.text
    assert (folder / "checkpoint.pt.corrupt").read_bytes() == b"\x00not a checkpoint"
    assert history["train_loss"].tolist() == reference["train_loss"].tolist()
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["history"][-1]["epoch"] == 2


def test_resuming_prints_no_path(tmp_path, capsys):
    fit_md(tmp_path, lr=0.05, p=1.75, epochs=1)
    model, data = toy()
    train.fit(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.75), data, None,
              train.FitOptions(epochs=2, batch_size=8, seed=0), checkpoint=tmp_path, progress=True)
    out = capsys.readouterr()
    assert "resumed from its checkpoint after epoch 1" in out.out + out.err
    assert str(tmp_path) not in out.out + out.err


# ---------------------------------------------------------------------------------------------
# the results store


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "table.csv"
    target.write_text("old")

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]
    assert atomic_write(target, lambda tmp: tmp.write_text("new")) == target
    assert target.read_text() == "new" and sorted(tmp_path.iterdir()) == [target]


KILLED_WRITE = textwrap.dedent("""
    import sys, time
    from mdlib.runs import files, store
    from mdlib.runs.identity import RunId

    def stuck(folder, *args):  # a write that is killed half way
        (folder / "config.json").write_text("{}")
        print("writing", flush=True)
        time.sleep(600)

    files.write_entry = stuck
    store.save(RunId.of("killed", {"a": 1}), {"x": 1})
""")


def test_the_temporary_file_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """``.<stem>.<pid>@<host>.<tag><suffix>`` of a writer killed mid-write (an executing notebook) used to
    pile up; the next write of that file removes those whose pid no longer runs on this host."""
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    target = tmp_path / "03_joint_training.ipynb"
    left = tmp_path / f".03_joint_training.{dead.pid}@{lockfile.host()}.executing.ipynb"
    live = tmp_path / f".03_joint_training.{os.getppid()}@{lockfile.host()}.executing.ipynb"  # a write in progress
    elsewhere = tmp_path / f".03_joint_training.{dead.pid}@another_host.executing.ipynb"  # its pid means nothing here
    for path in (left, live, elsewhere):
        path.write_text("{}")
    atomic_write(target, lambda tmp: tmp.write_text("done"), tag="executing")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, elsewhere.name])
    assert target.read_text() == "done"


def test_a_killed_store_write_is_cleaned_up_by_the_next_load(build_dir, tmp_path):
    script = tmp_path / "write.py"
    script.write_text(KILLED_WRITE)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)})
    assert proc.stdout.readline() == "writing\n"
    folder = build_dir / "runs" / "killed"
    (left,) = folder.glob(".tmp-*")
    proc.kill()
    proc.wait()
    live = folder / f".tmp-{'0' * 16}-{os.getpid()}@{lockfile.host()}-x"  # a write in progress (this process)
    live.mkdir()
    old = folder / ".tmp-0123456789abcdef-x"  # no writer named: removed by age
    old.mkdir()
    os.utime(old, (time.time() - files.STALE_SECONDS - 60,) * 2)
    assert store.load(RunId.of("killed", {"a": 1})) is None
    assert not left.exists() and not old.exists() and live.exists()
    assert store.load_or_run(RunId.of("killed", {"a": 1}), lambda: {"x": 1})["x"] == 1


# ---------------------------------------------------------------------------------------------
# worker processes


SLOW_BUILD = textwrap.dedent("""
    import os, time
    from dataclasses import dataclass
    import torch
    from torch import nn
    from torch.utils.data import Dataset
    from mdlib.experiments import train
    from mdlib.runs import identity, pool, store

    @dataclass(frozen=True)
    class Run(identity.Config):
        fit: train.FitOptions

    class Slow(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            time.sleep(0.05)
            return torch.full((4,), float(i % 3)), float(i % 2)

    def build(config):
        (__import__("pathlib").Path(os.environ["PIDS"]) / str(os.getpid())).touch()
        model = nn.Linear(4, 1)
        return train.Setup(model, torch.optim.SGD(model.parameters(), lr=0.01), Slow())
""")

PARENT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from slowbuild import Run, build
    from mdlib.experiments import train
    from mdlib.runs import pool

    if __name__ == "__main__":
        configs = [Run(train.FitOptions(epochs=50, batch_size=8, seed=seed)) for seed in range(3)]
        pool.run_many("fault", configs, build, workers=2, progress=False)
""")


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting to be reaped counts as ended)."""
    try:
        import psutil

        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except ImportError:
        stat = Path(f"/proc/{pid}/stat")
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True
    except Exception:  # psutil.NoSuchProcess
        return True


@pytest.mark.slow  # 6-10 s: a parent and two spawned workers, each importing torch
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_end_with_a_killed_parent(tmp_path, build_dir, sig):
    (tmp_path / "slowbuild.py").write_text(SLOW_BUILD)
    (tmp_path / "parent.py").write_text(PARENT)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "PIDS": str(pids), "PYTHONPATH": str(paths.PACKAGE_DIR.parent)}
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path)], env=env,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2:
        assert parent.poll() is None, parent.stderr.read()
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.2)
    workers = [int(p.name) for p in pids.iterdir()]
    parent.send_signal(sig)
    _, err = parent.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in workers if not _gone(pid)] == []
    if sig == signal.SIGTERM:
        assert parent.returncode == 128 + signal.SIGTERM
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines == ["interrupted: 0 of 3 fault runs finished and are stored; the running ones keep their "
                         "checkpoint of their last finished epoch; run the same command again to resume"]


# ---------------------------------------------------------------------------------------------
# executed notebooks (a real failing re-execution: tests/test_book.py)


def executed(path, outputs=(), **papermill):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("x = 1", execution_count=3, outputs=list(outputs)))
    nb.metadata["papermill"] = {"end_time": "2026-01-01T00:00:00", "exception": None, **papermill}
    nbformat.write(nb, path)


def test_the_book_refuses_failed_or_unfinished_notebooks_naming_them(tmp_path):
    executed(tmp_path / "01_good.ipynb")
    execute.check_executed(["01_good"], tmp_path)
    error = nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero\nmore", traceback=[])
    executed(tmp_path / "02_bad.ipynb", [error], exception=True)
    executed(tmp_path / "03_cut.ipynb", end_time=None)
    with pytest.raises(execute.BookError) as refused:
        execute.check_executed(["01_good", "02_bad", "03_cut"], tmp_path)
    assert str(refused.value) == (
        "notebooks/02_bad.ipynb failed: cell [3] raised ZeroDivisionError: division by zero; "
        "notebooks/03_cut.ipynb failed: its execution did not finish; execute again with "
        "`python -m mdlib run <notebook>` for each (or `python -m mdlib book` without --skip-execute)")
    with pytest.raises(execute.BookError, match="not executed yet: 04_none"):
        execute.check_executed(["01_good", "04_none"], tmp_path)


def test_failed_and_partial_notebooks_are_ignored_by_git_and_the_book():
    config = yaml.safe_load((paths.root() / "_config.yml").read_text())
    assert {"**.failed.ipynb", "**/.*.executing.ipynb"} <= set(config["exclude_patterns"])
    names = ["notebooks/03_joint_training.failed.ipynb", "notebooks/.03_joint_training.12@host.executing.ipynb"]
    ignored = subprocess.run(["git", "check-ignore", *names], cwd=paths.root(), capture_output=True, text=True)
    assert ignored.stdout.split() == names


def test_an_entry_the_kernel_recomputed_is_named_on_the_terminal(build_dir, tmp_path, capsys):
    """The store's warning, as a kernel prints it in a cell's stderr, becomes one line on the terminal."""
    import warnings

    import numpy as np

    first = store.load_or_run(RunId.of("c", {"a": 1}), lambda: {"x": np.arange(3.0)})
    (first.path / "arrays.npz").write_bytes(b"edited")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.load(RunId.of("c", {"a": 1})) is None
    text = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1", outputs=[
        nbformat.v4.new_output("stream", name="stderr", text="some other line\n" + text)])])
    nbformat.write(nb, str(tmp_path / "n.ipynb"))
    execute._echo_store_warnings(tmp_path / "n.ipynb", "04_sentiment")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"  04_sentiment: ignoring unreadable run entry {first.path} ")
    assert "content is not what was stored (edited or replaced: arrays.npz)" in err[0]
