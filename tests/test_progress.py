"""Progress of the training runs for the command that shows it: the status files ``run_many`` writes
and the reader of a run's checkpoint (``mdlib.experiments.progress``)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from mdlib.experiments import paths, pool, train
from mdlib.experiments import progress as status_files
from test_runs import blobs_run, build_blobs


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv(status_files.PROGRESS_ENV, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


HISTORY = [{"epoch": e, "train_loss": 0.5 / e, "train_accuracy": 0.8 + e / 100, "test_loss": 0.6,
            "test_accuracy": 0.7, "seconds": 3.0, "lr": 0.1} for e in range(1, 5)]


def _checkpoint(path: Path, history: list[dict]) -> Path:
    """A checkpoint as ``train.fit`` writes it: tensors (model, optimizer, RNG states) beside the history."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"settings": {"seed": 0, "model.weight": [4, 3]}, "model": {"weight": torch.ones(4, 3)},
                "optimizer": {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": [{"lr": 0.1}]},
                "history": history, "stopped": False, "rng": [{"torch": torch.get_rng_state()}]}, path)
    return path


# ---------------------------------------------------------------------------------------------
# reading a checkpoint


def test_a_checkpoint_is_read_without_its_tensors_as_fit_wrote_it(tmp_path):
    from test_train import blobs, mlp
    from torch.utils.data import TensorDataset

    x, y = blobs(32)
    model = mlp(0)
    history = train.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), TensorDataset(x, y), None,
                        train.FitOptions(epochs=2, batch_size=8, seed=0), checkpoint=tmp_path / "ck", progress=False)
    found = status_files.read_checkpoint(tmp_path / "ck" / status_files.CHECKPOINT)
    assert [row["epoch"] for row in found["history"]] == [1, 2] and found["stopped"] is False
    assert [row["train_accuracy"] for row in found["history"]] == list(history["train_accuracy"])
    assert status_files.CHECKPOINT == train.CHECKPOINT


def test_the_reader_falls_back_to_torch_and_gives_none_for_what_it_cannot_read(tmp_path, monkeypatch):
    path = _checkpoint(tmp_path / "checkpoint.pt", HISTORY)
    assert status_files.read_checkpoint(path)["history"] == HISTORY
    monkeypatch.setattr(status_files, "_structure", lambda path: 1 / 0)  # the fast path fails: torch.load
    assert status_files.read_checkpoint(path)["history"] == HISTORY
    monkeypatch.undo()
    (tmp_path / "bad.pt").write_bytes(b"not a zip")
    assert status_files.read_checkpoint(tmp_path / "bad.pt") is None
    assert status_files.read_checkpoint(tmp_path / "missing.pt") is None


class _Runs:
    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_the_reader_runs_no_code_from_the_file(tmp_path):
    """A checkpoint's pickle that would call os.system: the restricted reader builds nothing of it."""
    payload = _Runs()
    payload.target = tmp_path / "ran"
    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"history": [{"epoch": 1}], "x": payload}, protocol=2))
    found = status_files._structure(tmp_path / "evil.pt")
    assert found["history"] == [{"epoch": 1}] and not (tmp_path / "ran").exists()


# ---------------------------------------------------------------------------------------------
# what run_many writes


def test_labels_name_the_method_what_differs_and_the_seed():
    configs = [{"optimizer": {"name": "md", "lr": lr, "p": 1.1}, "model": {"layers": 2}, "fit": {"seed": s}}
               for lr in (1e-3, 3e-3) for s in (0, 1)]
    configs.append({"optimizer": {"name": "adam", "lr": 1e-3, "p": None}, "model": {"layers": 2}, "fit": {"seed": 0}})
    labels = status_files.describe(configs)
    assert labels[:2] == ["md p=1.1 lr=0.001 seed 0", "md p=1.1 lr=0.001 seed 1"]
    assert labels[2] == "md p=1.1 lr=0.003 seed 0" and labels[-1] == "adam lr=0.001 seed 0"
    assert status_files.describe([{"a": {"x": 1}, "b": {"x": 2}}, {"a": {"x": 2}, "b": {"x": 2}}]) == ["x=1", "x=2"]
    assert status_files.describe([{"a": {"x": 1}, "b": {"x": 2}}, {"a": {"x": 2}, "b": {"x": 1}}]) == [
        "a.x=1 b.x=2", "a.x=2 b.x=1"]  # one last name for two settings: their paths


def _status(folder: Path) -> dict:
    (found,) = [p for p in folder.glob("*.json") if not p.name.startswith(".")]
    return json.loads(found.read_text())


@pytest.mark.parametrize("where", ["here", "executor"])
def test_run_many_writes_its_status_for_the_command_that_watches(build_dir, tmp_path, monkeypatch, where):
    pool.run_many("blobs", [blobs_run(0)], build_blobs, progress=False)  # stored before the call
    configs = [blobs_run(seed, epochs=2) for seed in (0, 1, 2)] + [blobs_run(0)]
    pool.run_many("blobs", configs[:1], build_blobs, progress=False)
    assert not (tmp_path / "progress").exists()  # nothing without $MDLIB_PROGRESS_DIR
    monkeypatch.setenv(status_files.PROGRESS_ENV, str(tmp_path / "progress"))
    executor = concurrent.futures.ThreadPoolExecutor(2) if where == "executor" else None
    pool.run_many("blobs", configs, build_blobs, progress=False, executor=executor)
    record = _status(tmp_path / "progress")
    assert record["finished"] and record["kind"] == "blobs" and record["pid"] == os.getpid()
    runs = record["runs"]
    assert [run["state"] for run in runs] == ["stored", "done", "done", "stored"]
    assert [run["label"] for run in runs] == ["epochs=2 seed 0", "epochs=2 seed 1", "epochs=2 seed 2",
                                              "epochs=1 seed 0"]
    assert runs[1]["epochs"] == 2 and runs[1]["seconds"] > 0 and runs[1]["cap"] == 2
    assert runs[1]["checkpoint"] == str(paths.checkpoints_dir() / "blobs" / runs[1]["key"] / "checkpoint.pt")
    assert runs[1]["entry"] == str(paths.runs_dir() / "blobs" / runs[1]["key"])
    assert Path(runs[1]["lock"]).parent == paths.runs_dir() / ".locks" / "blobs"
