"""The results store: roundtrip, cache hits, keys, atomicity; training runs through it, in processes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import TensorDataset

from mdlib.experiments import methods, paths, train
from mdlib.optim import LpMirrorDescent
from mdlib.runs import files, identity, pool, store
from mdlib.runs.identity import RunId
from test_train import Crashing, blobs, mlp, same_history


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


CONFIG = {"n": 6, "T": 8, "ps": (1.75, 2.0, 3.0), "lr": 0.1, "seed": np.int64(3), "nested": {"b": 1, "a": [1, 2]}}


def _result():
    return {
        "divergence": np.linspace(0.0, 1.0, 12).reshape(3, 4),
        "ints": np.arange(5, dtype=np.int32),
        "scalar0d": np.array(2.5),
        "table": pd.DataFrame({"p": [1.75, 2.0, 3.0], "final": [0.01, 0.02, np.nan], "tag": ["a", "b", "c"]}),
        "series": pd.Series([1.0, 2.0], name="loss"),
        "n_steps": 1500,
        "score": np.float64(0.25),
        "note": "converged",
        "flags": [True, False],
        "diverged_at": float("nan"),
    }


def test_roundtrip(build_dir):
    out = store.load_or_run(RunId.of("e1-test", CONFIG), _result)
    assert out.cached is False
    expected = _result()
    np.testing.assert_array_equal(out["divergence"], expected["divergence"])
    assert out["ints"].dtype == np.int32
    assert out["scalar0d"].shape == () and float(out["scalar0d"]) == 2.5
    pd.testing.assert_frame_equal(out["table"], expected["table"])
    pd.testing.assert_series_equal(out["series"], expected["series"])
    assert out["n_steps"] == 1500 and out["score"] == 0.25 and out["note"] == "converged"
    assert out["flags"] == [True, False] and np.isnan(out["diverged_at"])
    assert out.path.parent == build_dir / "runs" / "e1-test"
    assert out.path.name == identity.config_key("e1-test", CONFIG)
    names = sorted(p.name for p in out.path.iterdir())
    assert names == ["arrays.npz", "config.json", "meta.json", "series.parquet", "table.parquet"]
    assert json.loads((out.path / "config.json").read_text())["nested"] == {"a": [1, 2], "b": 1}
    # nothing temporary left next to the entry
    assert [p.name for p in out.path.parent.iterdir()] == [out.path.name]


def test_cache_hit_does_not_recompute():
    calls = []

    def compute():
        calls.append(1)
        return {"x": np.arange(3.0)}

    first = store.load_or_run(RunId.of("hit", {"a": 1}), compute)
    second = store.load_or_run(RunId.of("hit", {"a": 1}), compute)
    assert len(calls) == 1
    assert first.cached is False and second.cached is True
    np.testing.assert_array_equal(first["x"], second["x"])
    store.load_or_run(RunId.of("hit", {"a": 1}), compute, force=True)
    assert len(calls) == 2


def test_keys():
    base = {"lr": 0.1, "ps": [1.75, 2, 3], "seed": 0}
    key = identity.config_key("e1", base)
    assert len(key) == 64
    # key order and tuple/list or numpy/Python spelling do not matter
    assert identity.config_key("e1", {"seed": np.int64(0), "ps": (1.75, 2, 3), "lr": 0.1}) == key
    # any change of the config or of the kind does
    assert identity.config_key("e1", {**base, "lr": 0.2}) != key
    assert identity.config_key("e1", {**base, "seed": 1}) != key
    assert identity.config_key("e2", base) != key
    with pytest.raises(ValueError, match="not allowed"):
        identity.config_key("e1", {"lr": float("nan")})
    with pytest.raises(TypeError, match="JSON"):
        identity.config_key("e1", {"f": object()})
    with pytest.raises(ValueError, match="invalid run kind"):
        identity.config_key("../evil", base)


def test_different_config_different_entry():
    a = store.load_or_run(RunId.of("k", {"seed": 0}), lambda: {"v": np.zeros(2)})
    b = store.load_or_run(RunId.of("k", {"seed": 1}), lambda: {"v": np.ones(2)})
    assert a.path != b.path
    assert store.load(RunId.of("k", {"seed": 0}))["v"].sum() == 0
    assert store.load(RunId.of("k", {"seed": 1}))["v"].sum() == 2
    assert store.load(RunId.of("k", {"seed": 2})) is None


def test_compute_failure_leaves_no_entry(build_dir):
    def boom():
        raise RuntimeError("diverged")

    with pytest.raises(RuntimeError, match="diverged"):
        store.load_or_run(RunId.of("fail", {"a": 1}), boom)
    assert store.load(RunId.of("fail", {"a": 1})) is None


def test_write_failure_leaves_no_entry(build_dir):
    with pytest.raises(TypeError, match="object arrays"):
        store.load_or_run(RunId.of("bad", {"a": 1}), lambda: {"ok": np.zeros(3), "bad": np.array([{}, None])})
    folder = build_dir / "runs" / "bad"
    assert list(folder.iterdir()) == []  # neither the entry nor its temporary folder


def test_crash_mid_write_leaves_no_entry(build_dir):
    """A process killed while writing (os._exit inside np.savez) leaves nothing that reads as an entry."""
    script = textwrap.dedent("""
        import os, numpy as np
        from mdlib.runs import store
        from mdlib.runs.identity import RunId
        real = np.savez
        def dying(*args, **kwargs):
            real(*args, **kwargs)
            os._exit(3)
        np.savez = dying
        store.load_or_run(RunId.of("crash", {"a": 1}), lambda: {"x": np.arange(4.0), "s": 1})
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "MDLIB_BUILD_DIR": str(build_dir)})
    assert proc.returncode == 3
    key = identity.config_key("crash", {"a": 1})
    assert not (build_dir / "runs" / "crash" / key).exists()
    assert store.load(RunId.of("crash", {"a": 1})) is None
    calls = []
    out = store.load_or_run(RunId.of("crash", {"a": 1}), lambda: calls.append(1) or {"x": np.arange(4.0), "s": 1})
    assert calls == [1] and out["s"] == 1


def test_corrupt_entry_is_recomputed(build_dir):
    first = store.load_or_run(RunId.of("c", {"a": 1}), lambda: {"x": np.arange(3.0), "t": pd.DataFrame({"a": [1]})})
    (first.path / "t.parquet").write_bytes(b"not parquet")
    calls = []
    with pytest.warns(store.StoreWarning, match="unreadable"):
        again = store.load_or_run(RunId.of("c", {"a": 1}), lambda: calls.append(1) or {"x": np.arange(3.0),
                                                                             "t": pd.DataFrame({"a": [1]})})
    assert calls == [1] and again.cached is False
    assert store.load(RunId.of("c", {"a": 1}))["t"]["a"].tolist() == [1]
    # a partial folder (no meta.json), e.g. copied by hand, is also replaced
    (again.path / "meta.json").unlink()
    with pytest.warns(store.StoreWarning):
        third = store.load_or_run(RunId.of("c", {"a": 1}), lambda: {"x": np.zeros(1)})
    assert third.cached is False and third["x"].tolist() == [0.0]
    assert sorted(p.name for p in third.path.parent.iterdir()) == [third.path.name]


def _edit_parquet(path, column, scale):
    frame = pd.read_parquet(path)
    frame[column] = frame[column] * scale
    frame.to_parquet(path)  # still a valid parquet file


@pytest.mark.parametrize("edit", ["a float in a parquet", "another run's parquet", "a value in meta.json",
                                  "a planted file", "a file removed"])
def test_an_entry_whose_content_changed_is_recomputed_never_served(build_dir, edit):
    """The store keeps the sha256 of an entry's content: an edit that leaves every file valid is caught."""
    def compute(value):
        return lambda: {"t": pd.DataFrame({"mean": [value]}), "x": np.arange(3.0), "note": {"mean": value}}

    first = store.load_or_run(RunId.of("c", {"a": 1}), compute(0.168))
    other = store.load_or_run(RunId.of("c", {"a": 2}), compute(0.5))
    if edit == "a float in a parquet":
        _edit_parquet(first.path / "t.parquet", "mean", 10)
    elif edit == "another run's parquet":
        (first.path / "t.parquet").write_bytes((other.path / "t.parquet").read_bytes())
    elif edit == "a value in meta.json":
        meta = json.loads((first.path / "meta.json").read_text())
        meta["values"]["note"]["mean"] = 1.68
        (first.path / "meta.json").write_text(json.dumps(meta))
    elif edit == "a planted file":
        (first.path / "extra.parquet").write_bytes((other.path / "t.parquet").read_bytes())
    else:
        (first.path / "arrays.npz").unlink()
    with pytest.warns(store.StoreWarning, match="content is not what was stored"):
        assert store.load(RunId.of("c", {"a": 1})) is None
    calls = []
    again = store.load_or_run(RunId.of("c", {"a": 1}), lambda: calls.append(1) or compute(0.168)())
    assert calls == [1] and again.cached is False
    assert store.load(RunId.of("c", {"a": 1}))["t"]["mean"].tolist() == [0.168] and store.load(RunId.of("c", {"a": 2})).cached


def test_an_entry_of_the_previous_format_is_recomputed(build_dir):
    first = store.load_or_run(RunId.of("c", {"a": 1}), lambda: {"x": np.arange(3.0)})
    meta = json.loads((first.path / "meta.json").read_text())
    del meta["sha256"]
    (first.path / "meta.json").write_text(json.dumps(meta | {"format": files.FORMAT - 1}))
    with pytest.warns(store.StoreWarning, match="format or kind mismatch"):
        assert store.load(RunId.of("c", {"a": 1})) is None


def test_bad_results_are_rejected():
    with pytest.raises(TypeError, match="dict"):
        store.load_or_run(RunId.of("r", {"a": 1}), lambda: [1, 2])
    with pytest.raises(ValueError, match="invalid result name"):
        store.load_or_run(RunId.of("r", {"a": 2}), lambda: {"a/b": 1})
    with pytest.raises(TypeError, match="JSON"):
        store.load_or_run(RunId.of("r", {"a": 3}), lambda: {"f": object()})


def test_a_name_points_at_the_run_recorded_last(build_dir):
    assert store.named("table1.default") is None
    store.set_name("table1.default", "e4-grid", {"seeds": 2, "layers": [3]})
    store.set_name("table1.default", "e4-grid", {"seeds": 5, "layers": [3]})  # a rebuild replaces it
    assert store.named("table1.default") == ("e4-grid", {"layers": [3], "seeds": 5})
    assert [p.name for p in (build_dir / "runs" / "_names").iterdir()] == ["table1.default.json"]  # no temporaries
    with pytest.raises(ValueError, match="invalid run name 'a/b'"):
        store.set_name("a/b", "e4-grid", {})
    with pytest.raises(ValueError, match=r"invalid run name 'tttttttt.*'\.\.\. \(5000 characters\): use at most 128"):
        store.named("t" * 5000)  # chapter 05's -p table1 of 5,000 characters: not "File name too long"


def test_check_keys_names_what_is_missing_and_unknown():
    identity.check_keys({"a": 1, "b": 2}, ("a", "b"), "a config")
    with pytest.raises(ValueError, match=r"a config has exactly the keys a, b; missing \['b'\], unknown \['c'\]"):
        identity.check_keys({"a": 1, "c": 2}, ("a", "b"), "a config")


@dataclasses.dataclass(frozen=True)
class ToyRun(identity.Config):
    OMIT_AT_DEFAULT = ("fit.reduction", "fit.stop_train_accuracy", "fit.eval_every", "fit.pool")

    data: dict
    model: dict
    fit: train.FitOptions


def test_a_typed_config_is_its_dict_to_the_store():
    typed = ToyRun({"n": 40}, {"seed": 0}, train.FitOptions(epochs=3, batch_size=8, seed=0, loss="multiclass"))
    plain = {"data": {"n": 40}, "model": {"seed": 0}, "fit": {"epochs": 3, "batch_size": 8, "seed": 0,
                                                              "loss": "multiclass"}}
    assert typed.to_dict() == plain
    assert identity.config_key("toy", typed) == identity.config_key("toy", plain)
    store.save(RunId.of("toy", typed), {"x": np.arange(3)})
    assert store.load(RunId.of("toy", plain)) is not None and json.loads(
        (store.entry_dir(RunId.of("toy", plain)) / "config.json").read_text("utf-8")) == plain
    assert ToyRun.from_dict(plain) == typed
    with pytest.raises(ValueError, match=r"the fit settings of a run config has exactly the keys epochs, batch_size, "
                                         r"seed, loss, .*; missing \['loss'\], unknown \['lr'\]"):
        ToyRun.from_dict(plain | {"fit": {"epochs": 3, "batch_size": 8, "seed": 0, "lr": 1.0}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.fit.epochs = 4


# ---------------------------------------------------------------------------------------------
# training runs through the store


def test_run_stores_the_result_and_returns_it_without_training_again(build_dir):
    x, y = blobs(40, classes=3)
    config = ToyRun({"n": 40}, {"seed": 0}, train.FitOptions(epochs=3, batch_size=8, seed=0, loss="multiclass"))
    builds = []

    def build(cfg):
        builds.append(cfg)
        model = mlp(cfg.fit.seed, out=3)
        return train.Setup(model, LpMirrorDescent(model.parameters(), lr=0.05, p=1.5), TensorDataset(x, y),
                          TensorDataset(x[:10], y[:10]))

    def extras(model):
        trained.append(model)
        return {**train.model_state(model), "accuracy_note": "final"}

    trained = []
    first = pool.run("toy-train", config, build, extras=extras, progress=False)
    assert not first.cached and len(builds) == 1
    assert list(first["history"].columns) == train.COLUMNS and len(first["history"]) == 3
    assert first["accuracy_note"] == "final"
    assert not (paths.checkpoints_dir() / "toy-train").exists() or not any(
        (paths.checkpoints_dir() / "toy-train").iterdir())  # the checkpoint is gone once stored

    second = pool.run("toy-train", config, build, extras=extras, progress=False)
    assert second.cached and len(builds) == 1 and len(trained) == 1
    pd.testing.assert_frame_equal(second["history"], first["history"])
    restored = train.load_model_state(mlp(42, out=3), second)
    for a, b in zip(restored.state_dict().values(), trained[0].state_dict().values()):
        assert torch.equal(a, b)

    with pytest.raises(TypeError, match="typed run config"):
        pool.run("toy-train", {"data": 1, "fit": {"epochs": 3, "batch_size": 8, "seed": 0}}, build)

    plain = ToyRun.from_dict(config.to_dict())  # the same run, read back
    third = pool.run("toy-train", plain, build, extras=extras, progress=False)
    assert third.cached and third.key == first.key and len(builds) == 1
    many, = pool.run_many("toy-train", [plain], build, extras=extras, progress=False)
    assert many.cached and many.key == first.key and len(builds) == 1


def test_run_resumes_an_interrupted_training(build_dir):
    x, y = blobs(40)
    config = ToyRun({}, {}, train.FitOptions(epochs=3, batch_size=8, seed=0, loss="binary"))
    crash = {"after": 2 * 40 + 5}

    def build(cfg):
        model = mlp(0)
        data = Crashing(TensorDataset(x, y), crash["after"])
        return train.Setup(model, torch.optim.Adam(model.parameters(), lr=0.01), data)

    with pytest.raises(KeyboardInterrupt):
        pool.run("toy-resume", config, build, progress=False)
    folder = paths.checkpoints_dir() / "toy-resume"
    assert len(list(folder.glob("*/checkpoint.pt"))) == 1
    crash["after"] = math.inf
    result = pool.run("toy-resume", config, build, progress=True)  # the bar hides outside terminals
    model = mlp(0)
    reference = train.fit(model, torch.optim.Adam(model.parameters(), lr=0.01), TensorDataset(x, y), None,
                          config.fit, progress=False)
    same_history(result["history"], reference)
    assert not list(folder.glob("*/checkpoint.pt"))


@dataclasses.dataclass(frozen=True)
class BlobsRun(identity.Config):
    """A run of ``build_blobs`` at step size ``lr``; ``diverge``: at one that overflows (``build_either``);
    ``count``: a file ``test_cluster``'s builders append a line to."""

    OMIT_AT_DEFAULT = ("fit.loss", "fit.reduction", "fit.stop_train_accuracy", "fit.eval_every", "fit.pool")

    lr: float
    fit: train.FitOptions
    diverge: bool = False
    count: str | None = None


def blobs_run(seed: int, epochs: int = 1, lr: float = 0.05, **rest) -> BlobsRun:
    """A ``BlobsRun`` in batches of 16."""
    return BlobsRun(lr, train.FitOptions(epochs=epochs, batch_size=16, seed=seed), **rest)


def build_blobs(config: BlobsRun):
    """A module-level builder (run_many sends it to other processes)."""
    x, y = blobs(64, seed=1)
    model = mlp(config.fit.seed, dropout=0.0)
    return train.Setup(model, methods.make_optimizer(model.parameters(), "md", config.lr, p=1.5),
                      TensorDataset(x, y.float()), TensorDataset(x[:16], y[:16].float()))


def test_run_many_in_processes_gives_the_runs_one_by_one_gives(build_dir, tmp_path, monkeypatch):
    configs = [blobs_run(seed, epochs=2) for seed in (0, 1, 2)]
    parallel = pool.run_many("blobs", configs + configs[:1], build_blobs, workers=2, progress=False)
    assert len(parallel) == 4 and parallel[3].key == parallel[0].key
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "serial"))
    serial = pool.run_many("blobs", configs, build_blobs, workers=1, progress=False)
    for a, b in zip(parallel, serial):
        pd.testing.assert_frame_equal(a["history"].drop(columns="seconds"), b["history"].drop(columns="seconds"),
                                      rtol=1e-6)
    with pytest.raises(ValueError, match="module-level function"):
        pool.run_many("blobs", [blobs_run(5, lr=0.1), blobs_run(5, lr=0.2)],
                      lambda config: build_blobs(config), workers=2, progress=False)


def build_either(config: BlobsRun):
    """build_blobs, or with ``config.diverge`` a step size that overflows the inverse mirror map."""
    setup = build_blobs(config)
    if config.diverge:
        setup.optimizer = methods.make_optimizer(setup.model.parameters(), "md", 1e38, p=1.1)
    return setup


@pytest.fixture
def ids_made(monkeypatch) -> list[str]:
    """The kinds of the run ids made (``RunId.of`` asks ``code_of`` once per id), in order."""
    made = []
    real = identity.code_of
    monkeypatch.setattr(identity, "code_of", lambda kind: made.append(kind) or real(kind))
    return made


def test_the_store_makes_a_runs_id_once_for_all_its_visits(ids_made):
    """load_or_run of a missing run finds, locks, finds again, writes and reads back one run id."""
    assert store.load_or_run(RunId.of("once", {"a": 1}), lambda: {"x": 1})["x"] == 1 and ids_made == ["once"]
    assert store.load_or_run(RunId.of("once", {"a": 1}), lambda: {"x": 2})["x"] == 1 and ids_made == ["once"] * 2


def test_the_pool_makes_a_runs_id_once_for_all_its_visits(ids_made):
    """A run's key and code are computed once per run asked for, however often the pool and the store
    visit it (find, sort by lock, train, lock, store, read back)."""
    configs = [blobs_run(seed) for seed in (0, 1)]
    trained = pool.run_many("once", configs, build_blobs, progress=False)  # both trained in this process
    assert [r.cached for r in trained] == [True, True] and ids_made == ["once", "once"]
    ids_made.clear()
    assert pool.run("once", configs[0], build_blobs, progress=False).cached and ids_made == ["once"]


def test_exists_reads_the_metadata_alone_and_load_checks_the_whole_entry(build_dir):
    """``exists`` says an entry is there from its meta.json (kind, key, code), ``load`` reads and checks it:
    a damaged entry exists and does not load; another code's entry does not exist."""
    run = RunId.of("there", {"a": 1})
    assert not store.exists(run)
    store.save(run, {"x": np.arange(3.0)})
    assert store.exists(run) and store.load(run)["x"].sum() == 3
    (store.entry_dir(run) / "arrays.npz").write_bytes(b"damaged")
    assert store.exists(run)
    with pytest.warns(store.StoreWarning):
        assert store.load(run) is None
    other = dataclasses.replace(run, code="0" * 64)
    assert not store.exists(other)


def test_the_pool_reads_and_checks_a_stored_run_once(monkeypatch):
    """On its way through ``run_many`` a stored run is read back (and its content hash-checked) once: the
    missing runs are told by their metadata alone."""
    configs = [blobs_run(seed) for seed in (0, 1)]
    pool.run_many("read", configs, build_blobs, progress=False)
    reads = []
    real = files.read_entry
    monkeypatch.setattr(files, "read_entry", lambda path, run: reads.append(path.name) or real(path, run))
    again = pool.run_many("read", configs, build_blobs, progress=False)
    assert [r.cached for r in again] == [True, True]
    assert sorted(reads) == sorted(r.key for r in again)  # each once


def test_a_worker_that_keys_a_run_otherwise_refuses_to_train_it(tmp_path):
    config = blobs_run(0, count=str(tmp_path / "count"))
    launcher = dataclasses.replace(identity.RunId.of("other", config), key="0" * 64)  # the launcher's other code
    with pytest.raises(RuntimeError, match="runs other mdlib code than the launcher"):
        pool._train_job(str(paths.build_dir()), launcher, config, build_blobs, None, "cpu")
    assert not (tmp_path / "count").exists() and store.load(RunId.of("other", config)) is None


@pytest.mark.parametrize("workers", [1, 2])
def test_run_many_skips_runs_that_raise_the_named_errors(build_dir, workers):
    good, bad = blobs_run(0), blobs_run(0, diverge=True)
    results = pool.run_many("skip", [good, bad], build_either, workers=workers, skip=(FloatingPointError,),
                            progress=False)
    assert results[1] is None and list(results[0]["history"].epoch) == [1]
    with pytest.raises(FloatingPointError, match="reduce lr"):
        pool.run_many("skip", [bad], build_either, workers=workers, progress=False)
