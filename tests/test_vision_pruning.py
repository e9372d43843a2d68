"""Chapter 07's pruning table: every final run pruned through the stored ``vision.pruning``."""

from __future__ import annotations

import numpy as np

from mdlib.experiments import vision


def test_pruning_table_prunes_every_final_run_at_every_sparsity(monkeypatch):
    configs = {("cifar10", "adam", 0): {"run": "a"}, ("cifar10", "1.1", 1): {"run": "b"}}
    calls = []

    def pruning(config):
        calls.append(config)
        return {"accuracy": np.array([0.9, 0.5]) - (config["run"] == {"run": "b"}) * 0.1}
    monkeypatch.setattr(vision, "pruning", pruning)
    table = vision.pruning_table(configs, [0.0, 0.8])
    # the stored pruning's config as chapter 07 wrote it: its store key is unchanged
    assert calls == [{"run": run, "sparsities": [0.0, 0.8]} for run in configs.values()]
    assert list(table.columns) == ["dataset", "method", "seed", "sparsity", "test_accuracy"]
    assert list(table.method) == ["adam", "adam", "1.1", "1.1"] and list(table.seed) == [0, 0, 1, 1]
    assert list(table.sparsity) == [0.0, 0.8, 0.0, 0.8]
    assert np.allclose(table.test_accuracy, [0.9, 0.5, 0.8, 0.4])
