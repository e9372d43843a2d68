"""The config is the call: every experiment is one function of one config, and the results store keeps
exactly that config (no second copy of the settings that could drift from what ran)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mdlib.experiments import methods, paths, sentiment, synthetic, vision
from mdlib.experiments.sentiment import grids
from mdlib.runs import identity, store
from mdlib.runs.identity import RunId
from test_step_grid import fake_correct  # tests/test_step_grid.py


@pytest.fixture(autouse=True)
def build_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))


def stored_configs(kind: str) -> list[dict]:
    folder = paths.runs_dir() / kind
    return [json.loads((entry / "config.json").read_text("utf-8")) for entry in sorted(folder.iterdir())
            if not entry.name.startswith(".")] if folder.is_dir() else []


def plain(config) -> dict:
    return json.loads(identity.canonical_json(config))


SYNTHETIC = [
    (synthetic.fixed_decoder_experiment, synthetic.E1_KIND, synthetic.E1Config,
     dict(seeds=2, steps={"1.75": 4, "3": 5}, lr=0.1, n=3, T=4, d=3, svm_ps=[1.75, 3.0], seed=0, eps=None, points=3)),
    (synthetic.single_instance_experiment, synthetic.E2_KIND, synthetic.E2Config,
     dict(ps=[1.75, 2.0], normalized_steps=4, lr=0.1, plain_steps=6, plain_lr=0.5, n=2, T=3, d=3, seed=1, points=3)),
    (synthetic.joint_training_experiment, synthetic.E3_KIND, synthetic.E3Config, dict(steps={"2": 4, "3": 5}, lr=0.1, points=3)),
]


@pytest.mark.parametrize("experiment,kind,config_type,config", SYNTHETIC, ids=["E1", "E2", "E3"])
def test_a_synthetic_experiment_stores_exactly_its_argument(experiment, kind, config_type, config):
    first = experiment(config)
    assert stored_configs(kind) == [plain(config)]
    again = experiment(dict(config))
    assert again.cached and not first.cached and again.key == first.key
    typed = config_type.of(config)  # the typed config is the same run
    assert typed.to_dict() == config and experiment(typed).key == first.key and stored_configs(kind) == [plain(config)]
    with pytest.raises(ValueError, match=r"missing \['lr'\], unknown \['version'\]"):
        experiment({k: v for k, v in config.items() if k != "lr"} | {"version": 1})


def fake_history(config, accuracy: float) -> dict:
    epochs = config.fit.epochs
    return {"history": pd.DataFrame({"epoch": np.arange(1, epochs + 1), "train_loss": np.linspace(1, 0.5, epochs),
                                     "train_accuracy": np.linspace(0.5, 1.0, epochs),
                                     "test_accuracy": np.full(epochs, accuracy),
                                     "seconds": np.ones(epochs)}),
            "validation_accuracy": accuracy, "validation_n": 1000, "state.x": np.zeros(1)}


def recording_runs(kind, given):
    """A stand-in for a module's ``train_runs`` that stores what it is given (no training)."""
    def train_runs(configs, workers=1, progress=True, skip=()):
        given.extend(configs)
        out = []
        for c in configs:
            store.save(RunId.of(kind, c), fake_history(c, 0.5 + c.optimizer.lr))
            out.append(store.load(RunId.of(kind, c)))
        return out
    return train_runs


def test_the_table_1_grid_stores_exactly_its_argument_and_runs_what_it_names(monkeypatch):
    given = []
    monkeypatch.setattr(grids, "train_runs", recording_runs(sentiment.KIND, given))
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    config = dict(dataset="rotten_tomatoes", max_length=16, train_size=None, width=6, setup="authors", epochs=3,
                  layers=[3], methods=["1.1", "2"], seeds=2, multiples={"1.1": [1, 3], "2": [3]})
    grid = sentiment.grid(config)
    assert stored_configs(sentiment.GRID_KIND) == [plain(config)]
    assert sorted(map(identity.canonical_json, stored_configs(sentiment.KIND))) == sorted(
        {identity.canonical_json(c) for c in given})
    for run in grid.configs.values():  # every run is the grid's settings at one cell, step and seed
        assert (run.dataset, run.max_length, run.train_size) == (config["dataset"], config["max_length"],
                                                                 config["train_size"])
        assert run.model.width == config["width"] and run.fit.epochs == config["epochs"]


def test_the_vision_grid_stores_exactly_its_argument(monkeypatch):
    given = []
    monkeypatch.setattr(vision, "train_runs", recording_runs(vision.KIND, given))
    monkeypatch.setattr(vision, "validation_correct",  # the choice's per-image predictions, without a model
                        lambda c, r: np.arange(1000) < round(1000 * r["history"].test_accuracy.iloc[-1]))
    config = dict(datasets=["fashion_mnist"], image_size=28, train_size=200, validation=100,
                  model={"patch": 7, "width": 8, "depth": 1, "heads": 2, "mlp": 8, "dropout": 0.1,
                         "embedding_dropout": 0.1}, setup="authors", batch_size=50,
                  root="", epochs=2, eval_every=1, seeds=2, methods=["adam", "1.1"],
                  step_sizes={"adam": [1e-3], "1.1": [0.05, 0.15]}, sweep_seeds=1, sweep_epochs=2, sweep_window=1)
    grid = vision.grid(config)
    assert stored_configs(vision.GRID_KIND) == [plain(config)]
    assert grid.chosen == {("fashion_mnist", "adam"): 1e-3, ("fashion_mnist", "1.1"): 0.15}  # higher validation
    sweep_runs = [c for c in given if c.data.validation]
    assert [c.optimizer.lr for c in sweep_runs] == [0.05, 0.15]
    assert sorted(grid.configs) == [("fashion_mnist", m, s) for m in ("1.1", "adam") for s in (0, 1)]
    assert all(methods.method_key(c.optimizer.name, c.optimizer.p) == key[1]
               for key, c in grid.configs.items())
    with pytest.raises(ValueError, match=r"needs a non-empty list of candidates for each of the methods"):
        vision.grid(dict(config, step_sizes={"adam": [1e-3]}))
    typed = vision.VisionGrid.of(config)  # the typed config is the same grid, read back
    assert store.load(RunId.of(vision.GRID_KIND, typed)) is not None and vision.grid(typed).chosen == grid.chosen
    assert stored_configs(vision.GRID_KIND) == [plain(config)]

