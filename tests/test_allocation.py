"""Chapter 04's 2 x 2 and embedding-scale series (mdlib.experiments.sentiment.allocation): the arms' optimizers
against matched_lr and an independent first step, the effective steps against numpy, the std of equal
embedding steps against numerical integration, the series' grids, and the two training pools."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import integrate

from mdlib import matched_lr
from mdlib.experiments import estimates, sentiment
from mdlib.experiments.sentiment import allocation, chapter, grids
from mdlib.experiments.train import Optimizer
from mdlib.runs import store
from mdlib.runs.identity import RunId
from test_step_grid import fake_correct


def grid_config(**overrides) -> sentiment.SentimentGrid:
    return sentiment.SentimentGrid(**(dict(
        dataset="rotten_tomatoes", max_length=16, train_size=None, width=6, setup="small-embeddings", epochs=100,
        layers=[3], methods=["1.1", "2"], seeds=4, multiples={"1.1": [1], "2": [1, 3]}) | overrides))


CHOSEN = {(3, "1.1"): 1.0, (3, "2"): 3.0}


def test_the_arms_take_the_other_method_s_chosen_step_per_tensor():
    """ℓ1.1 at GD's steps: each tensor's lr is matched_lr(GD's chosen lr, 1.1, its mean |w|); GD at ℓ1.1's
    steps: matched_lr(ℓ1.1's chosen lr, 2, mean |w|, reference_p=1.1). Everything else is the trained
    method's run at that seed."""
    config = grid_config()
    gd_lr, md_lr = 3 * sentiment.reference_step(3, "2"), sentiment.reference_step(3, "1.1")
    arm = allocation.arm_config(config, CHOSEN, "1.1@2", seed=2)
    assert arm.optimizer == Optimizer("md", gd_lr, 1.1, 2.0)
    assert dataclass_without_optimizer(arm) == dataclass_without_optimizer(config.run((3, "1.1"), 1.0, 2))
    back = allocation.arm_config(config, CHOSEN, "2@1.1", seed=0)
    assert back.optimizer == Optimizer("md", md_lr, 2.0, 1.1)
    model = sentiment.initial_model(arm)
    optimizer = arm.optimizer.make(model.parameters())
    assert len(optimizer.param_groups) == len(list(model.parameters()))
    for group in optimizer.param_groups:
        (w,) = group["params"]
        assert group["lr"] == pytest.approx(matched_lr(gd_lr, 1.1, float(w.detach().abs().double().mean())))
    gd = back.optimizer.make(sentiment.initial_model(back).parameters())
    for group in gd.param_groups:
        (w,) = group["params"]
        scale = float(w.detach().abs().double().mean())
        assert group["lr"] == pytest.approx(md_lr * 10 * scale ** 0.9)
    assert arm.to_dict()["optimizer"]["matched_p"] == 2.0
    assert "matched_p" not in config.run((3, "1.1"), 1.0, 2).to_dict()["optimizer"]  # stored keys unchanged
    with pytest.raises(ValueError, match="unknown arm"):
        allocation.arm_config(config, CHOSEN, "3@2", seed=0)


def dataclass_without_optimizer(run):
    return {k: v for k, v in run.to_dict().items() if k != "optimizer"}


def test_an_arm_s_first_step_moves_a_typical_entry_as_far_as_the_matched_method():
    """Independent of the formula: one step of the arm ℓ1.1@2 on a tensor of constant magnitude s (the
    mean |w| is then every entry's) moves each entry as far as GD at its chosen step does, to first order."""
    w = torch.nn.Parameter(torch.full((50,), 0.04, dtype=torch.float64) * torch.tensor([1.0, -1.0]).repeat(25))
    g = torch.linspace(-1, 1, 50, dtype=torch.float64)
    spec = Optimizer("md", 1e-5, 1.1, 2.0)
    optimizer = spec.make([w])
    w.grad = g.clone()
    before = w.detach().clone()
    optimizer.step()
    moved = (w.detach() - before).numpy()
    np.testing.assert_allclose(moved, -1e-5 * g.numpy(), rtol=2e-3, atol=1e-12)


def test_effective_steps_are_the_mean_first_order_step_of_each_group():
    config = allocation.arm_config(grid_config(), CHOSEN, "1.1@2", seed=0)
    steps = allocation.effective_steps(config)
    model = sentiment.initial_model(config)
    optimizer = config.optimizer.make(model.parameters())
    lr = {id(w): g["lr"] for g in optimizer.param_groups for w in g["params"]}
    named = dict(model.named_parameters())
    for group, names in model.parameter_groups().items():
        if not names:
            continue
        values = np.concatenate([lr[id(named[n])] * np.abs(named[n].detach().double().numpy().ravel()) ** 0.9 / 0.1
                                 for n in names])
        assert steps[group] == pytest.approx(values.mean(), rel=1e-9)
    gd = grid_config().run((3, "2"), 3.0, 0)
    assert list(allocation.effective_steps(gd).values()) == pytest.approx([gd.optimizer.lr] * 5)  # GD: lr everywhere
    table = allocation.step_table({("small", "2"): gd, ("small", "1.1@2"): config})
    assert (table[table.method == "2"].vs_gd == 1.0).all()
    # matched at each tensor's mean |w|: within Jensen's gap of GD's (E|w|^0.9 <= (E|w|)^0.9)
    assert table[table.method == "1.1@2"].vs_gd.between(0.9, 1.0 + 1e-9).all()
    from mdlib.book.views.sentiment import effective_steps_view

    view = effective_steps_view(table)
    assert list(view.method) == ["ℓ2 (GD)", "ℓ1.1, GD's steps per tensor"] and "embeddings" in view
    with pytest.raises(ValueError, match="mirror descent"):
        allocation.effective_steps(sentiment.run_config(layers=3, optimizer="adam", lr=1e-3, width=6))


@pytest.mark.parametrize("lr_md, lr_gd", [(8e-4, 4e-4), (8e-4, 1.2e-3)])
def test_equal_step_std_equates_the_gaussian_mean_steps(lr_md, lr_gd):
    sigma = allocation.equal_step_std(lr_md, lr_gd)
    moment, _ = integrate.quad(lambda x: abs(x) ** 0.9 * math.exp(-x * x / (2 * sigma ** 2))
                               / math.sqrt(2 * math.pi * sigma ** 2), -np.inf, np.inf)
    assert lr_md * moment / 0.1 == pytest.approx(lr_gd, rel=1e-7)
    assert allocation.equal_step_std(8e-4, 4e-4) == pytest.approx(0.0463, abs=5e-4)


def test_series_grids_vary_only_the_embedding_std():
    base = grid_config()
    grids = chapter.series_grids(base, [0.02, 0.1, 1.0], [100, 150, 90], {"1.1": [0.3, 1], "2": [1, 3]}, 2, grow=2)
    assert all(g.grow == 2 and not g.tied_finals for g in grids)
    assert [g.embedding_std for g in grids] == [None, 0.1, 1.0]  # 0.02 is the base's own: its runs are shared
    assert [g.epochs for g in grids] == [100, 150, 90] and all(g.seeds == 2 for g in grids)
    assert grids[0].run((3, "2"), 1, 0) == base.run((3, "2"), 1, 0)  # the variation's run, to the byte
    assert grids[1].run((3, "2"), 1, 0).model.embedding_std == 0.1
    assert chapter.series_grids(base, [], [100], {}, 2) == []
    with pytest.raises(ValueError, match="2 epoch caps for 3 stds"):
        chapter.series_grids(base, [0.02, 0.1, 1.0], [100, 150], {"1.1": [1], "2": [1]}, 2)
    with pytest.raises(ValueError, match="small-embeddings"):
        chapter.series_grids(grid_config(setup="authors"), [0.1], 100, {"1.1": [1], "2": [1]}, 2)
    torch.manual_seed(0)
    model = sentiment.initial_model(grids[2].run((3, "1.1"), 1, 0))
    assert float(model.token.weight.detach().std()) == pytest.approx(1.0, rel=0.02)
    with pytest.raises(ValueError, match="small-embeddings setup's sigma"):
        sentiment.run_config(layers=3, optimizer="md", p=2.0, lr=1e-3, setup="authors", embedding_std=0.1)


def fake_runs(calls: list, accuracy=lambda config: 0.7):
    """A stand-in for ``sentiment.train_runs`` that stores a two-epoch history per config and records
    each pool's configs that were not stored yet (what a pool trains)."""
    def run(configs, workers=1, progress=True, skip=()):
        fresh = [c for c in configs if store.load(RunId.of(sentiment.KIND, c)) is None]
        if fresh:
            calls.append(fresh)
        out = []
        for c in configs:
            if (found := store.load(RunId.of(sentiment.KIND, c))) is not None:
                out.append(found)
                continue
            history = pd.DataFrame({"epoch": [1, 2], "train_accuracy": [0.5, 0.999], "test_accuracy": [0.5, accuracy(c)],
                                    "seconds": [1.0, 1.0]})
            store.save(RunId.of(sentiment.KIND, c), {"history": history, "validation_accuracy": 0.7, "validation_n": 1000,
                                           "state.x": np.zeros(1)})
            out.append(store.load(RunId.of(sentiment.KIND, c)))
        return out
    return run


def test_chapter_runs_train_in_as_few_pools_as_the_choices_allow_and_the_2x2_reads_them_back(monkeypatch, tmp_path):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))
    calls = []
    gd_step = {1.0: 0.70, 3.0: 0.80}  # validation is 0.7 for all: ties everywhere; test by step
    monkeypatch.setattr(grids, "train_runs", fake_runs(calls, lambda c: gd_step.get(
        round(c.optimizer.lr / sentiment.reference_step(3, "2"), 3), 0.6) if c.optimizer.matched_p is None else 0.65))
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    config = grid_config()
    arms = allocation.ArmGrid(base=config, multiples=[1 / 3, 1.0, 3.0], seeds=3)
    chapter.train_chapter([config], [arms], workers=2)
    # the sweep; GD's finals with the arms' sweep (its steps follow GD's and 1.1's choice); the arms' finals
    assert len(calls) == 3
    sweeps, second, third = calls
    assert {(c.optimizer.p, c.fit.seed) for c in sweeps} == {(1.1, s) for s in range(4)} | {(2.0, s) for s in (0, 1)}
    assert {(c.optimizer.p, c.optimizer.matched_p, c.fit.seed) for c in second} == (
        {(1.1, 2.0, s) for s in (0, 1)} | {(2.0, 1.1, s) for s in (0, 1)} | {(2.0, None, s) for s in (2, 3)})
    assert len(second) == 2 * 3 * 2 + 2  # each arm at three multiples and two seeds
    assert {(c.optimizer.p, c.fit.seed) for c in third} == {(1.1, 2), (2.0, 2)}
    grid = sentiment.grid(config)
    assert grid.chosen == {(3, "1.1"): 1.0, (3, "2"): 1.0}  # tied validation, equal scores: the smaller
    calls.clear()
    both = allocation.allocation(arms, grid)
    assert calls == []  # every run of the 2 x 2 was trained by train_chapter
    assert list(both.runs.method.unique()) == ["1.1", "2", "1.1@2", "2@1.1"]
    assert set(both.runs.steps) == {"global", "per tensor"} and (both.runs.embedding_std == 0.02).all()
    chosen = both.runs[both.runs.chosen.astype(bool) & (both.runs.steps == "per tensor")]
    assert set(chosen.multiple) == {1.0} and len(chosen) == 6  # a three-way tie: its middle, every seed
    assert (chosen[chosen.method == "1.1@2"].lr == sentiment.reference_step(3, "2")).all()
    assert set(both.configs) == {(3, arm, s) for arm in allocation.ARMS for s in range(3)}
    effects = estimates.allocation_effects(both.runs[both.runs.chosen.astype(bool)])
    assert effects["geometry"].value == pytest.approx(100 * (0.65 - 0.70)) and effects["geometry"].n == 3
    assert effects["interaction"].value == pytest.approx(100 * (0.6 - 0.65 - 0.65 + 0.70))
    with pytest.raises(LookupError, match="not in the results store"):
        allocation.allocation(dataclasses.replace(arms, seeds=5), grid, stored_only=True)


def _overnight(values: dict[float, tuple[float, float]], capped: tuple[float, ...] = (), seeds: int = 3, n: int = 400):
    """Runs and compact predictions of a fake long build: at each std, l_1.1 and GD chosen at 1x (and GD's 3x
    tied, with sweep seeds only), their per-sentence accuracies ``values[std]``."""
    rng = np.random.default_rng(0)
    runs, compact = [], []
    for std, accuracy in values.items():
        for key, acc in zip(("1.1", "2"), accuracy):
            for s in range(seeds):
                runs.append({"part": "series", "embedding_std": std, "layers": 3, "method": key, "multiple": 1.0,
                             "lr": sentiment.reference_step(3, key), "seed": s, "reached": std not in capped,
                             "last_test": acc, "chosen": True, "tied": True})
                correct = rng.random(n) < acc
                compact.append({"part": "series", "embedding_std": std, "method": key, "multiple": 1.0, "seed": s,
                                "correct": "".join("1" if c else "0" for c in correct)})
            runs += [{"part": "series", "embedding_std": std, "layers": 3, "method": "2", "multiple": 3.0, "seed": s,
                      "lr": 3 * sentiment.reference_step(3, "2"), "reached": True, "last_test": 0.7, "chosen": False,
                      "tied": True} for s in range(2)]
    return pd.DataFrame(runs), pd.DataFrame(compact)


def test_series_points_judge_each_std_at_its_chosen_steps_over_seeds_and_sentences():
    runs, compact = _overnight({0.02: (0.70, 0.76), 0.1: (0.74, 0.74), 0.3: (0.80, 0.70)}, capped=(0.3,))
    predictions = chapter.long_predictions(compact)
    assert len(predictions) == 3 * 2 * 3 * 400 and set(predictions.correct) == {0, 1}
    points = chapter.series_points(runs, predictions)
    assert points.embedding_std.tolist() == [0.02, 0.1, 0.3] and points.reached.tolist() == [True, True, False]
    assert points["tied_2"].tolist() == ["1 3"] * 3 and (points.n == 3).all()
    at = predictions[np.isclose(predictions.embedding_std, 0.02)]
    assert points.value.iloc[0] == pytest.approx(estimates.crossed(at, "1.1", "2").value)
    assert points.high.iloc[0] < 0 < points.low.iloc[2]  # GD ahead at 0.02; l_1.1 at 0.3 (capped)
    ratio = allocation.embedding_ratio(8e-4, 4e-4, 0.1)
    assert points.embedding_ratio.iloc[1] == pytest.approx(ratio)
    # the ratio is 1 at the std of equal first-order steps, and follows std^0.9
    assert allocation.embedding_ratio(8e-4, 4e-4, allocation.equal_step_std(8e-4, 4e-4)) == pytest.approx(1.0)
    assert allocation.embedding_ratio(8e-4, 4e-4, 0.2) / ratio == pytest.approx(2 ** 0.9)


def test_the_series_reading_claims_a_change_of_sign_only_where_both_sides_exclude_zero():
    from mdlib.book.views.sentiment import series_reading

    runs, compact = _overnight({0.02: (0.70, 0.76), 0.05: (0.72, 0.74), 0.1: (0.76, 0.74), 0.2: (0.80, 0.72)})
    points = chapter.series_points(runs, chapter.long_predictions(compact))
    trend, ratio = estimates.scale_trend(points), estimates.scale_trend(points, x="embedding_ratio")
    text = series_reading(points, trend, ratio)
    assert text.startswith("the sign of ℓ1.1 − GD changes with the embedding scale: GD is ahead at σ 0.02")
    assert "ℓ1.1 at σ 0.2" in text and "(the stds as units, 4 in the regime, t on 2 degrees of freedom)" in text
    one_sided = points.assign(low=np.minimum(points.low, -0.1))
    assert series_reading(one_sided, trend, ratio).startswith("no change of sign is shown: GD is ahead at σ 0.02")
    capped = points.assign(reached=[True, True, True, False])
    assert "at σ 0.2 a chosen run stopped at the epoch cap, out of the regime and not judged" in series_reading(
        capped, estimates.scale_trend(capped), estimates.scale_trend(capped, x="embedding_ratio"))


def test_source_text_names_the_committed_build_or_this_execution():
    from mdlib.book.views.sentiment import source_text

    record = {"command": "python -m mdlib run 04_sentiment --profile overnight", "git": {"commit": "bda87aa6effe0123"},
              "time": "2026-12-05T04:21:35+00:00", "hardware": {"cpu": "AMD EPYC"},
              "parameters": {"dataset": "rotten_tomatoes", "width": 24, "layers": [3]}}
    text = source_text(record, "default")
    # plain text (glued as such): no backticks, no "--" that the page would print as a dash
    assert "python -m mdlib run 04_sentiment with the profile overnight at commit bda87aa6effe (2026-12-05" in text
    assert "`" not in text and "--" not in text
    assert "width 24, 3 layers" in text and f"data/{chapter.COMMITTED['runs']}" in text
    assert source_text(None, "overnight").startswith("here they were trained by this execution (profile overnight)")


def test_a_build_without_the_long_part_has_empty_tables_that_say_so():
    """With no series trained here and ``read_committed`` off, the long part is absent: tables with the
    built ones' columns and no rows, a record that says so, no variation of its own, a series with no
    points (its columns kept), no slope, and a source sentence that names why."""
    from types import SimpleNamespace

    from mdlib.book.views.sentiment import series_reading, source_text

    runs, compact = _overnight({0.02: (0.70, 0.76)})
    variation = SimpleNamespace(runs=runs[runs.part == "series"].drop(columns=["part", "embedding_std"]))
    empty_runs, empty_compact, record = chapter.long_tables(variation, [], [], read_committed=False)
    assert empty_runs.empty and list(empty_runs.columns[:2]) == ["part", "embedding_std"]
    assert set(variation.runs.columns) <= set(empty_runs.columns) and empty_compact.empty
    assert chapter.absent(record) and not chapter.absent(None)
    assert not chapter.same_variation(record, None)
    points = chapter.series_points(empty_runs, chapter.long_predictions(empty_compact))
    assert points.empty and {"embedding_std", "reached", "value", "low", "high"} <= set(points.columns)
    trend = estimates.scale_trend(points)
    assert trend.n == 0 and math.isnan(trend.value)
    assert series_reading(points, trend, trend) == "not measured: no std of the series in this build"
    assert source_text(record, "default").startswith("not in this build (profile default): the overnight profile's runs")
