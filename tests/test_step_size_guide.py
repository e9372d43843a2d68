"""Chapter 09's sweep (mdlib.experiments.step_size_guide): its grids follow matched_lr, its choice never takes
a diverged run, its exact first-step table, and a tiny sweep end to end on the fixture data, read back
without training (a diverged run included)."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mdlib.book.views.step_size_guide import first_step_view, summary_texts
from mdlib.experiments import methods, step_grid, step_size_guide, train
from mdlib.experiments.sentiment import tokens
from mdlib.experiments.train import Optimizer
from mdlib.mirror import matched_lr
from mdlib.runs import store
from mdlib.runs.identity import RunId

TINY = dict(dataset="rotten_tomatoes", max_length=16, train_size=8, width=4, layers=1, heads=2, mlp=8, dropout=0.0,
            setup="small-embeddings", epochs=1, batch_size=4, seeds=1, ps=[1.1, 2.0], sgd_lr=0.1, scale=0.25,
            multiples=[1.0, 1e4], adamw_lr=1e-3, adamw_multiples=[1.0])


def grid(**overrides):
    return step_size_guide.chapter_config(**(TINY | overrides))


def test_each_exponents_grid_is_centred_on_matched_lr():
    config = grid(ps=[1.1, 1.75, 2.0, 3.0], multiples=[0.1, 1.0, 10.0])
    design = config.design()
    assert design.cells == [("1.1",), ("1.75",), ("2",), ("3",), ("adamw",)]
    for p in (1.1, 1.75, 2.0, 3.0):
        key = f"{p:g}"
        for multiple in (0.1, 1.0, 10.0):
            run = design.sweep_config((key,), multiple, 0)
            assert run.optimizer == Optimizer("md", pytest.approx(multiple * matched_lr(0.1, p, 0.25)), p)
            assert config.sgd_equivalent(key, run.optimizer.lr) == pytest.approx(0.1 * multiple)
    assert design.sweep_config(("adamw",), 1.0, 0).optimizer == Optimizer("adamw", 1e-3, None)
    assert config.run("sgd", 0.3, 2).optimizer == Optimizer("sgd", 0.3, None)
    assert config.run("sgd", 0.3, 2).fit == train.FitOptions(epochs=1, batch_size=4, seed=2, loss="binary",
                                                             reduction="mean", pool=16)
    assert math.isnan(config.sgd_equivalent("adamw", 1e-3))
    assert config.work() == step_size_guide.work(**TINY | dict(ps=[1.1, 1.75, 2.0, 3.0], multiples=[0.1, 1.0, 10.0]))
    assert config.work() == (4 * 3 + 1 + 1, 14 * 2)  # runs (and the SGD reference), 2 steps each


def test_the_default_scale_is_the_median_of_the_initial_matrices():
    scale = step_size_guide.matrix_scale(16, 2, 2, 64, "small-embeddings", 64)
    assert 0.05 < scale < 0.2  # torch's default U(+-1/sqrt(fan_in)) at fan-in 16 and 64
    assert grid(scale=0, width=16, layers=2, mlp=64, max_length=64).scale == float(f"{scale:.2g}")


@pytest.mark.parametrize("overrides, error", [
    (dict(ps=[1.1, 3.0]), "must include 2"), (dict(ps=[2.0, 2]), "twice"), (dict(ps=[1.0, 2.0]), "exponent"),
    (dict(multiples=[]), "non-empty list"), (dict(adamw_multiples=[0.0]), "non-empty list"),
    (dict(sgd_lr=-1.0), "sgd_lr must be"), (dict(scale=-0.5), "scale must be"), (dict(seeds=0), "seeds must be"),
    (dict(train_size=2), "smaller than one batch"), (dict(setup="bert"), "unknown setup")])
def test_a_bad_sweep_config_is_refused_by_name(overrides, error):
    with pytest.raises(ValueError, match=error):
        grid(**overrides).design().sweep_config(("2",), 1.0, 0)


def _rows(losses, diverged=()):
    return pd.DataFrame([{"method": "1.1", "multiple": m, "lr": m, "seed": s, "validation_loss": loss,
                          "diverged": (m, s) in diverged} for (m, s), loss in losses.items()])


#: The validation losses of 500 sentences under a reference model: what the fake runs below shift.
SENTENCES = np.random.default_rng(0).exponential(0.6, 500)


def test_choose_reads_the_paired_error_of_the_sentences_and_never_a_diverged_step():
    """Three steps, the middle one 0.01 lower in mean validation loss. Paired (the same sentences, each
    0.01 lower give or take 0.005) the difference is far beyond its error and the middle one is chosen
    alone; with the sentences' losses drawn independently per step (an unpaired error of about 0.04) the
    three tie and the tie goes to its middle. A diverged candidate is never chosen."""
    noise = np.random.default_rng(1).normal(0, 0.005, (3, 500))
    tables = {m: (SENTENCES - 0.01 * (m == 1.0) + noise[i])[None, :] for i, m in enumerate((0.33, 1.0, 3.0))}
    losses = {(m, 0): float(t.mean()) for m, t in tables.items()}
    asked = []

    def paired(key, multiple):
        asked.append((key, multiple))
        return tables[multiple]

    choice = step_size_guide.choose(_rows(losses), paired)
    assert choice == step_grid.Choice(1.0, (1.0,), 1.0) and sorted(asked) == [("1.1", m) for m in (0.33, 1.0, 3.0)]
    shuffled = {m: np.random.default_rng(i).permutation(t[0])[None, :] for i, (m, t) in enumerate(tables.items())}
    unpaired = step_size_guide.choose(_rows(losses), lambda key, m: shuffled[m])
    assert unpaired.tied == (0.33, 1.0, 3.0) and unpaired.value == 1.0
    asked.clear()
    assert step_size_guide.choose(_rows(losses, diverged={(1.0, 0)}), paired).value in (0.33, 3.0)
    assert ("1.1", 1.0) not in asked  # a diverged candidate is never chosen, its losses never read
    with pytest.raises(ValueError, match="every candidate step size diverged for method 1.1"):
        step_size_guide.choose(_rows({(1.0, 0): math.nan}, diverged={(1.0, 0)}), paired)


def fake_sweep(monkeypatch, mean_loss):
    """Chapter 09's runs without training: ``mean_loss(method, multiple)`` is a run's mean validation loss
    (None: it overflowed), each sentence's loss ``SENTENCES`` shifted to it with a little noise per run."""
    trained = []

    def train_runs(configs, workers=1, progress=True, skip=()):
        out = []
        for c in configs:
            if (hit := store.load(RunId.of(step_size_guide.KIND, c))) is not None:
                out.append(hit)
                continue
            key = methods.method_key(c.optimizer.name, c.optimizer.p)
            multiple = round(c.optimizer.lr / grid_of(c).centre(key), 6) if key != "sgd" else 1.0
            loss = mean_loss(key, multiple)
            if loss is None:
                out.append(None)
                continue
            trained.append((key, multiple, c.fit.seed))
            rng = np.random.default_rng([c.fit.seed, round(1e6 * c.optimizer.lr)])
            per = SENTENCES - SENTENCES.mean() + loss + rng.normal(0, 0.002, len(SENTENCES))
            store.save(RunId.of(step_size_guide.KIND, c), {"history": pd.DataFrame({"epoch": [1], "train_loss": [loss],
                                                                     "train_accuracy": [0.8]}),
                                            "validation_loss": float(per.mean()), "validation_accuracy": 0.7,
                                            "validation_n": len(per), "validation_losses": per})
            out.append(store.load(RunId.of(step_size_guide.KIND, c)))
        return out

    monkeypatch.setattr(step_size_guide, "train_runs", train_runs)
    return trained


GROWING = dict(TINY, ps=[1.1, 2.0], multiples=[0.33, 1.0, 3.0], adamw_multiples=[0.33, 1.0, 3.0], grow=2)


def grid_of(config):
    return grid(**GROWING)


def test_a_grid_grows_on_the_side_where_its_choice_sits_and_stops_once_it_is_inside(build_dir, monkeypatch):
    """ℓ1.1's validation loss falls with the step up to 9x its matched step and rises beyond: its grid 0.33x,
    1x, 3x grows to 9x (the choice at its top), then to 27x, and 9x is then inside. GD's minimum, 1x, is
    inside from the start and its grid does not grow; AdamW's keeps falling and stays at its grown end,
    which the best table reports."""
    curve = {("1.1", m): 0.9 - 0.05 * i for i, m in enumerate((0.33, 1.0, 3.0, 9.0))} | {("1.1", 27.0): 0.95}
    curve |= {("2", 0.33): 0.8, ("2", 1.0): 0.6, ("2", 3.0): 0.8}
    curve |= {("adamw", m): 0.9 - 0.1 * i for i, m in enumerate((0.33, 1.0, 3.0, 9.0, 27.0))}
    trained = fake_sweep(monkeypatch, lambda key, m: 0.7 if key == "sgd" else curve[key, m])
    result = step_size_guide.sweep(grid(**GROWING), progress=False)
    assert {k: [round(m, 6) for m in v] for k, v in result.candidates.items()} == {
        "1.1": [0.33, 1.0, 3.0, 9.0, 27.0], "2": [0.33, 1.0, 3.0], "adamw": [0.33, 1.0, 3.0, 9.0, 27.0]}
    assert {k: round(m, 6) for k, m in result.chosen.items()} == {"1.1": 9.0, "2": 1.0, "adamw": 27.0}
    best = result.best.set_index("method")
    assert best.at_edge.to_dict() == {"1.1": False, "2": False, "adamw": True}
    assert best.tried["1.1"] == "0.33, 1, 3, 9, 27" and best.tied["2"] == "1"
    assert ("sgd", 1.0, 0) in trained and sorted(t for t in trained if t[0] == "2") == [
        ("2", m, 0) for m in (0.33, 1.0, 3.0)]  # GD: nothing grown
    texts = summary_texts(result)
    assert texts["edges"] == ("inside its grid for ℓ1.1, ℓ2 (GD); at an end for AdamW: 27× is the largest of 0.33×, "
                              "1×, 3×, 9×, 27×, after the grid grew twice on that side (its most); the best step "
                              "may lie beyond it")
    assert texts["ties"] == "no choice was tied"
@pytest.mark.parametrize("p", [1.1, 1.75, 2.0, 3.0])
def test_the_first_step_table_is_exact(p):
    """At the matched scale a small step moves like SGD; from zero it moves by (lr g)^(1/(p-1)); the
    linearized column is (|w| / scale)^(2-p)."""
    table = step_size_guide.first_step_table([p], [0.0, 0.02, 0.25, 1.0], 0.1, 0.25, gradient=1e-4)
    rows = table.set_index("magnitude")
    lr = matched_lr(0.1, p, 0.25)
    assert rows.lr.tolist() == [lr] * 4
    assert rows.vs_sgd[0.25] == pytest.approx(1.0, rel=1e-3)
    assert rows.movement[0.0] == pytest.approx((lr * 1e-4) ** (1 / (p - 1)), rel=1e-12)
    for magnitude in (0.02, 1.0):
        assert rows.linearized_vs_sgd[magnitude] == pytest.approx((magnitude / 0.25) ** (2 - p))
    assert rows.linearized_vs_sgd[0.0] == {1.1: 0.0, 1.75: 0.0, 2.0: 1.0, 3.0: math.inf}[p]
    view = first_step_view(table)
    assert list(view.columns) == [f"p = {p:g}"] and list(view.index) == ["0", "0.02", "0.25", "1"]


def test_adamw_is_a_method():
    assert methods.method("adamw") == ("adamw", None) and methods.method_key("adamw") == "adamw"
    assert methods.method_text("adamw") == "AdamW"
    optimizer = methods.make_optimizer(torch.nn.Linear(2, 1).parameters(), "adamw", 1e-3)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["weight_decay"] == 0.01


def test_a_tiny_sweep_end_to_end_and_read_back_without_training(fixture_data, monkeypatch):
    """p = 1.1 at 10^4 times its matched step overflows: recorded, never chosen, and (like every other run)
    not trained again when the sweep is read back. The validation split is evaluated, the test split never
    read; torch's SGD at p = 2's chosen step is the same update as mirror descent at p = 2."""
    setup = step_size_guide.build(grid().run("2", 0.1, 0))
    assert setup.test_set is None and list(setup.final_evaluations) == ["validation"]  # the test split: never
    real_splits = tokens.splits

    class NoTest(dict):
        def __getitem__(self, name):
            assert name != "test", "the sweep read the test split"
            return super().__getitem__(name)

    monkeypatch.setattr(tokens, "splits", lambda *args: NoTest(real_splits(*args)))
    result = step_size_guide.sweep(grid(), progress=False)
    for (key, seed), config in result.configs.items():  # each sentence's loss, the mean's parts
        stored = store.load(RunId.of(step_size_guide.KIND, config))
        assert len(stored["validation_losses"]) == stored["validation_n"]
        assert stored["validation_losses"].mean() == pytest.approx(stored["validation_loss"], rel=1e-5)
    runs = result.runs.set_index(["method", "multiple"])
    assert runs.outcome[("1.1", 1e4)] == "overflow" and bool(runs.diverged[("1.1", 1e4)])
    assert result.chosen["1.1"] == 1.0 and result.chosen["adamw"] == 1.0 and not runs.diverged[("2", result.chosen["2"])]
    assert runs.validation_loss[~runs.diverged.astype(bool)].notna().all()
    sgd, twin = runs.loc[("sgd", 1.0)], runs.loc[("2", result.chosen["2"])]
    assert sgd.lr == twin.lr and sgd.validation_loss == twin.validation_loss  # the same update, bit for bit
    best = result.best.set_index("method")
    assert best.predicted_lr["1.1"] == pytest.approx(matched_lr(best.lr["2"], 1.1, 0.25))
    assert best.ratio["2"] == 1.0 and best.at_edge["1.1"]
    moved = result.movement()
    assert set(moved.group) == set(step_size_guide.MOVEMENT_GROUPS) and (moved.movement > 0).all()
    texts = summary_texts(result, moved)
    assert texts["overflows"].startswith(f"{int(runs.diverged.sum())} of 6 runs diverged: ℓ1.1 at lr "
                                      f"{1e4 * matched_lr(0.1, 1.1, 0.25):.2g} (overflow)")
    assert texts["seeds"] == "one seed per step size" and texts["sgd-check"] == "0"

    def no_training(config):
        raise AssertionError(f"trained {config['optimizer']} again")

    monkeypatch.setattr(step_size_guide, "build", no_training)
    again = step_size_guide.sweep(grid(), progress=False)
    pd.testing.assert_frame_equal(again.runs, result.runs)
    assert store.load(RunId.of(step_size_guide.KIND, grid().design().sweep_config(("1.1",), 1e4, 0))) is None  # kept as diverged only
    assert np.isfinite(again.best.validation_loss).all()
