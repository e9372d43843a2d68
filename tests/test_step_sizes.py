"""Chapter 09's sweep (mdlib.experiments.step_sizes): its grids follow matched_lr, its choice never takes
a diverged run, its exact first-step table, and a tiny sweep end to end on the fixture data, read back
without training (a diverged run included)."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mdlib.book.views.step_sizes import first_step_view, summary_texts
from mdlib.experiments import methods, step_sizes, store, train
from mdlib.experiments.train import Optimizer
from mdlib.mirror import matched_lr

TINY = dict(dataset="rotten_tomatoes", max_length=16, train_size=8, width=4, layers=1, heads=2, mlp=8, dropout=0.0,
            setup="small-embeddings", epochs=1, batch_size=4, seeds=1, ps=[1.1, 2.0], sgd_lr=0.1, scale=0.25,
            multiples=[1.0, 1e4], adamw_lr=1e-3, adamw_multiples=[1.0])


def grid(**overrides):
    return step_sizes.chapter_config(**(TINY | overrides))


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
    assert config.work() == step_sizes.work(**TINY | dict(ps=[1.1, 1.75, 2.0, 3.0], multiples=[0.1, 1.0, 10.0]))
    assert config.work() == (4 * 3 + 1 + 1, 14 * 2)  # runs (and the SGD reference), 2 steps each


def test_the_default_scale_is_the_median_of_the_initial_matrices():
    scale = step_sizes.matrix_scale(16, 2, 2, 64, "small-embeddings", 64)
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


def test_choose_takes_the_lowest_mean_validation_loss_and_never_a_diverged_step():
    assert step_sizes.choose(_rows({(0.1, 0): 0.6, (1.0, 0): 0.5, (10.0, 0): 0.55})) == 1.0
    assert step_sizes.choose(_rows({(0.1, 0): 0.5, (1.0, 0): 0.5})) == 0.1  # a tie: the smaller step
    # the mean over seeds decides, and a step that diverged at one seed is out
    losses = {(0.1, 0): 0.6, (0.1, 1): 0.6, (1.0, 0): 0.4, (1.0, 1): 0.9, (10.0, 0): 0.3, (10.0, 1): math.nan}
    assert step_sizes.choose(_rows(losses, diverged={(10.0, 1)})) == 0.1
    with pytest.raises(ValueError, match="every candidate step size diverged for method 1.1"):
        step_sizes.choose(_rows({(1.0, 0): math.nan}, diverged={(1.0, 0)}))


@pytest.mark.parametrize("p", [1.1, 1.75, 2.0, 3.0])
def test_the_first_step_table_is_exact(p):
    """At the matched scale a small step moves like SGD; from zero it moves by (lr g)^(1/(p-1)); the
    linearized column is (|w| / scale)^(2-p)."""
    table = step_sizes.first_step_table([p], [0.0, 0.02, 0.25, 1.0], 0.1, 0.25, gradient=1e-4)
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
    setup = step_sizes.build(grid().run("2", 0.1, 0))
    assert setup.test_set is None and list(setup.final_evaluations) == ["validation"]  # the test split: never
    result = step_sizes.sweep(grid(), progress=False)
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
    assert set(moved.group) == set(step_sizes.MOVEMENT_GROUPS) and (moved.movement > 0).all()
    texts = summary_texts(result, moved)
    assert texts["overflows"].startswith(f"{int(runs.diverged.sum())} of 6 runs diverged: ℓ1.1 at lr "
                                      f"{1e4 * matched_lr(0.1, 1.1, 0.25):.2g} (overflow)")
    assert texts["seeds"] == "one seed per step size" and texts["sgd-check"] == "0"

    def no_training(config):
        raise AssertionError(f"trained {config['optimizer']} again")

    monkeypatch.setattr(step_sizes, "build", no_training)
    again = step_sizes.sweep(grid(), progress=False)
    pd.testing.assert_frame_equal(again.runs, result.runs)
    assert store.load(step_sizes.KIND, grid().design().sweep_config(("1.1",), 1e4, 0)) is None  # kept as diverged only
    assert np.isfinite(again.best.validation_loss).all()
