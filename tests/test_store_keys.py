"""The store keys of the book's default-profile runs stay what they were: a change of how a config is
built or serialized (a typed config, a field renamed, a default dropped) would silently orphan every
stored run. The keys are held with the code fingerprint fixed, so only the kind and the canonical
config count; ``fixtures/store_keys.json`` holds them as the code computed them before the configs
were typed (regenerate it only for a change that means to re-key runs)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from mdlib.book import profiles
from mdlib.experiments import sentiment, step_size_guide, synthetic, vision
from mdlib.experiments.sentiment import allocation
from mdlib.runs import identity

FIXTURE = Path(__file__).parent / "fixtures" / "store_keys.json"


def _design_runs(design) -> list:
    """(kind, config) of every run a grid can train: the sweep's, and the final runs at every candidate."""
    runs = [(design.run_kind, design.sweep_config(*item)) for item in design.sweep_items()]
    runs += [(design.run_kind, design.final_config(cell, candidate, seed)) for cell in design.cells
             for candidate in design.candidates(cell) for seed in range(design.seeds(cell))]
    return [(design.kind, design.config)] + runs


def _synthetic_runs() -> list:
    """(kind, config) of chapters 01-03's experiments, built as their notebooks build them."""
    e1 = profiles.executed_parameters("01_fixed_decoder_paths")
    e2 = profiles.executed_parameters("02_single_instance_path")
    e3 = profiles.executed_parameters("03_joint_training")
    steps1 = {f"{p:g}": s for p, s in zip(e1["train_ps"], e1["steps"])}
    first = dict(seeds=e1["seeds"], steps=steps1, lr=e1["lr"], n=e1["n"], T=e1["T"], d=e1["d"], svm_ps=e1["svm_ps"],
                 seed=e1["seed"], eps=None, points=250)
    stall = dict(first, seeds=e1["stall_seeds"], svm_ps=e1["train_ps"], eps=e1["stall_eps"])
    second = dict(ps=e2["ps"], normalized_steps=e2["normalized_steps"], lr=e2["lr"], plain_steps=e2["plain_steps"],
                  plain_lr=e2["plain_lr"], n=e2["n"], T=e2["T"], d=e2["d"], seed=e2["seed"], points=300)
    third = dict(steps={f"{p:g}": s for p, s in zip(e3["ps"], e3["steps"])}, lr=e3["lr"], points=300)
    return [(synthetic.E1_KIND, synthetic.E1Config.of(first)), (synthetic.E1_KIND, synthetic.E1Config.of(stall)),
            (synthetic.E2_KIND, synthetic.E2Config.of(second)), (synthetic.E3_KIND, synthetic.E3Config.of(third))]


def _runs() -> list:
    """(kind, config) of every default-profile run of the book's chapters that the store keys."""
    grids = sentiment.chapter_grids(**profiles.executed_parameters("04_sentiment"))
    runs = [run for g in grids for run in _design_runs(g.design())]
    chapter = profiles.executed_parameters("04_sentiment")
    variation = grids[1]  # a 2 x 2 the profile trains on the variation: its arms at every step the sweep may choose
    arms = [allocation.ArmGrid(base=variation, multiples=list(chapter["allocation_multiples"]),
                               seeds=variation.seeds_of(variation.methods[0])) for std in chapter["allocation_stds"]
            if std == 0.02]
    for chosen in itertools.product(*([((L, k), m) for m in variation.multiples[k]]
                                      for L in variation.layers[:1] for k in variation.methods)):
        runs += [run for a in arms for run in _design_runs(a.design(dict(chosen)))]
    runs.append((sentiment.BASELINE_KIND, {"dataset": chapter["dataset"], "split_seed": 0,
                                           "max_length": chapter["max_length"], "train_size": chapter["train_size"],
                                           "C": list(sentiment.BASELINE_C)}))
    for g in vision.chapter_grids(**profiles.executed_parameters("07_vision")):
        design = g.design()
        runs += _design_runs(design)
        final = design.final_config(design.cells[0], design.candidates(design.cells[0])[0], 0)
        runs.append((vision.PRUNING_KIND, {"run": final, "sparsities": [0.0, 0.5, 0.9]}))
    sweep = step_size_guide.chapter_config(**profiles.executed_parameters("09_step_sizes"))
    runs += _design_runs(sweep.design())
    runs += [(step_size_guide.KIND, sweep.run("sgd", m * sweep.centre("2"), seed))  # at each step p = 2 may choose
             for m in sweep.multiples for seed in range(sweep.seeds)]
    return runs + _synthetic_runs()


def held_keys(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """{kind: sorted distinct store keys} of ``_runs``, the code fingerprint fixed to "held"."""
    monkeypatch.setattr(sys.modules[identity.config_key.__module__], "code_of", lambda kind: "held")
    keys: dict[str, set[str]] = {}
    for kind, config in _runs():
        keys.setdefault(kind, set()).add(identity.config_key(kind, config))
    return {kind: sorted(found) for kind, found in sorted(keys.items())}


def test_default_profile_store_keys_are_unchanged(monkeypatch):
    held = json.loads(FIXTURE.read_text("utf-8"))
    now = held_keys(monkeypatch)
    assert {kind: len(keys) for kind, keys in now.items()} == {kind: len(keys) for kind, keys in held.items()}
    assert now == held
