"""E7 run configs on a tiny Fashion-MNIST in the real IDX format: subsets, held-out validation, seeds."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import install_idx
from mdlib.book.views.vision import pruning_contrast_text, pruning_levels_text, summary_texts, summary_view
from mdlib.experiments import data, train, vision
from mdlib.runs import pool

MODEL = dict(patch=7, width=8, depth=1, heads=2, mlp=8, dropout=0.1, embedding_dropout=0.1)
TRAIN_PER_CLASS, TEST_PER_CLASS = 12, 2


@pytest.fixture(autouse=True)
def fashion(tmp_path, monkeypatch):
    """A 120 / 20 image Fashion-MNIST (10 balanced classes) in the data cache; returns its train labels."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MDLIB_DATA_DIR", str(cache))
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rng = np.random.default_rng(0)
    labels = {split: rng.permutation(np.repeat(np.arange(10), per)) for split, per in
              (("train", TRAIN_PER_CLASS), ("t10k", TEST_PER_CLASS))}
    files = {f"{split}-labels-idx1-ubyte.gz": y for split, y in labels.items()}
    files.update({f"{split}-images-idx3-ubyte.gz": rng.integers(0, 256, (len(y), 28, 28)) for split, y in labels.items()})
    install_idx(cache, monkeypatch, files)
    return labels["train"]


def config(**kw):
    settings = dict(optimizer="md", lr=0.05, p=1.1, seed=0, epochs=1, model=MODEL, batch_size=10)
    return vision.run_config("fashion_mnist", **{**settings, **kw})


def test_subset_is_stratified_and_validation_is_held_out(fashion):
    keep, held_out = vision.split_indices(fashion, train_size=50, validation=20, seed=3)
    assert len(keep) == 50 and len(held_out) == 20 and not set(keep) & set(held_out)
    assert np.bincount(fashion[keep], minlength=10).tolist() == [5] * 10
    assert np.bincount(fashion[held_out], minlength=10).tolist() == [2] * 10
    again = vision.split_indices(fashion, train_size=50, validation=20, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((keep, held_out), again))
    assert not np.array_equal(vision.split_indices(fashion, 50, 20, seed=4)[0], keep)
    everything, none = vision.split_indices(fashion, train_size=None, validation=0, seed=3)
    assert len(everything) == len(fashion) and len(none) == 0


def test_sweep_runs_evaluate_on_validation_never_on_test(fashion):
    setup = vision.build(config(train_size=50, validation=20))
    assert (len(setup.train_set), len(setup.test_set)) == (50, 20)
    keep, held_out = vision.split_indices(fashion, 50, 20, seed=0)
    assert np.array_equal(setup.test_set.labels, fashion[held_out])
    full = data.fashion_mnist("train")
    assert np.array_equal(setup.test_set.images, full.images[held_out])
    assert np.array_equal(setup.train_set.images, full.images[keep])
    # no validation: the evaluation set is the test set, untransformed apart from normalization
    final = vision.build(config(train_size=50))
    assert len(final.test_set) == 10 * TEST_PER_CLASS
    image, _ = final.test_set[0]
    mean, std = data.NORMALIZATION["fashion_mnist"]
    expected = (torch.from_numpy(data.fashion_mnist("test").images[0, ..., 0]).float() / 255 - mean[0]) / std[0]
    torch.testing.assert_close(image[0], expected)


def test_seeds_give_distinct_initializations_and_reruns_are_identical():
    first, second = vision.make_model(config(seed=0)), vision.make_model(config(seed=1))
    assert not torch.equal(first.embed.weight, second.embed.weight)
    assert torch.equal(first.embed.weight, vision.make_model(config(seed=0)).embed.weight)
    run_config = config(train_size=40)
    stored = pool.run("e7-test", run_config, vision.build, extras=train.model_state, progress=False)
    model = vision.trained_model(run_config, stored)
    assert not model.training and not torch.equal(model.embed.weight, first.embed.weight)
    setup = vision.build(run_config)  # the same run again, outside the store
    history = train.fit(setup.model, setup.optimizer, setup.train_set, setup.test_set,
                        run_config.fit, progress=False)
    cols = ["train_loss", "train_accuracy", "test_loss", "test_accuracy"]
    assert history[cols].equals(stored["history"][cols])
    for name, value in setup.model.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name


def test_unknown_dataset_is_rejected():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'.*fashion_mnist, cifar10, cifar100"):
        vision.run_config("mnist", optimizer="adam", lr=1e-4, seed=0, epochs=1, model=MODEL)


def test_the_choices_predictions_are_the_sweep_runs_last_validation_accuracy_and_never_the_test_sets(fashion):
    """``validation_correct``, what chapter 07's choice pairs across step sizes: one entry per held-out
    validation image of a sweep run, whose mean is the last validation accuracy of its history; a run
    evaluated on the test set (validation 0) is refused."""
    vision._test_tensors.cache_clear()
    sweep_run = config(train_size=50, validation=20, epochs=2)
    stored = pool.run("e7-test", sweep_run, vision.build, extras=train.model_state, progress=False)
    correct = vision.validation_correct(sweep_run, stored)
    assert correct.shape == (20,) and correct.dtype == bool
    assert correct.mean() == pytest.approx(stored["history"].test_accuracy.iloc[-1], abs=1e-12)
    final_run = config(train_size=50, epochs=2)
    with pytest.raises(ValueError, match="validation=0 .*the test set, which no choice may read"):
        vision.validation_correct(final_run, stored)
    vision._test_tensors.cache_clear()


def test_summary_table_is_chapter_07s_table_vit():
    """From a smoke build's history and weight counts, ``run_scores`` + ``summary_table`` give exactly
    the table-vit.csv that chapter 07 wrote (tests/fixtures/results)."""
    results = Path(__file__).parent / "fixtures" / "results"
    history = pd.read_csv(results / "fig-vit-accuracy.csv").drop(columns="key")
    counts = pd.read_csv(results / "fig-vit-weights.csv")
    written = pd.read_csv(results / "table-vit.csv", dtype={"method": str})
    names = dict(zip(written.method, written.optimizer))
    chosen = {("fashion_mnist", m): lr for m, lr in zip(written.method, written.lr)}
    mean_counts = counts.groupby(["dataset", "method", "matrix"], sort=False)["count"].mean()
    swept = set(written.method[written["lr from"].str.startswith("sweep")])
    table = vision.summary_table(vision.run_scores(history), mean_counts, chosen, methods=list(names), names=names,
                                 datasets={"fashion_mnist": "Fashion-MNIST"}, swept=swept, flat_share=0.05)
    pd.testing.assert_frame_equal(table, written, check_dtype=False, check_exact=True)
    view = summary_view(table, 0.06)
    assert list(view["final test acc. (%)"]) == [f"{a:.2f} ± {b:.2f}" for a, b in zip(written.final_mean,
                                                                                    written.final_std)]
    assert set(view["paper (%)"]) == {"not run"}  # the paper ran no Fashion-MNIST


def test_summary_texts_are_the_chapters_prose_of_its_table():
    table = pd.DataFrame({"dataset": ["Fashion-MNIST"] * 2, "optimizer": ["Adam", "p = 1.1"],
                          "final_mean": [80.04, 79.0], "final_std": [1.0, 0.55], "best_mean": [81.0, 80.0],
                          "best_std": [0.2, 0.3], "loss_change": [-0.02, -0.5], "loss_share": [0.01, 0.2],
                          "accuracy_change": [0.5, -1.25], "levelled": [True, False]})
    texts = summary_texts(table, {("fashion_mnist", "1.1"): 0.05}, names={"adam": "Adam", "1.1": "p = 1.1"},
                          datasets={"fashion_mnist": "Fashion-MNIST"}, swept=["1.1"], flat_share=0.05)
    assert texts["vit-final"] == "Fashion-MNIST: Adam 80.0 ± 1.0, p = 1.1 79.0 ± 0.6"
    assert texts["vit-best"] == "Fashion-MNIST: Adam 81.0 ± 0.2, p = 1.1 80.0 ± 0.3"
    assert texts["vit-spread"] == "Fashion-MNIST: 1.0 points"
    assert texts["vit-lrs"] == "Fashion-MNIST: p = 1.1: 0.05"
    assert texts["vit-loss-change"] == "-50.0% to -2.0%" and texts["vit-accuracy-change"] == "-1.25 to +0.50"
    assert texts["vit-levelled"].startswith("the training loss has not levelled off for p = 1.1 on Fashion-MNIST "
                                            "(20.0% of its decrease in the last quarter) (the rule: the last quarter")
    levelled = summary_texts(table.assign(levelled=True), {}, names={}, datasets={}, swept=[], flat_share=0.05)
    assert levelled["vit-levelled"].endswith("the largest share, a method's mean over seeds, is 20.0%)")


def test_fp32_configs_keep_the_dicts_they_had_before_precision_existed():
    """The store's keys of fp32 runs and grids: the dicts captured before ``precision`` was an option."""
    before = {"data": {"dataset": "fashion_mnist", "image_size": 28, "train_size": None, "validation": 0, "seed": 0,
                       "root": None},
              "model": {"patch": 7, "width": 8, "depth": 1, "heads": 2, "mlp": 8, "dropout": 0.1,
                        "embedding_dropout": 0.1, "setup": "authors"},
              "optimizer": {"name": "md", "lr": 0.05, "p": 1.1},
              "fit": {"epochs": 1, "batch_size": 10, "seed": 0, "loss": "multiclass", "eval_every": 1}}
    assert config().to_dict() == config(precision="fp32").to_dict() == before
    grid = {"datasets": ["fashion_mnist"], "image_size": 28, "train_size": 40, "validation": 20,
            "model": MODEL, "setup": "authors",
            "batch_size": 10, "root": "", "epochs": 2, "eval_every": 1, "seeds": 1, "methods": ["adam", "1.1"],
            "step_sizes": {"adam": [0.001], "1.1": [0.05, 0.1]}, "sweep_seeds": 1, "sweep_epochs": 1,
            "sweep_window": 1}
    assert vision.VisionGrid.of(grid).to_dict() == vision.VisionGrid.of(dict(grid, precision="fp32")).to_dict() == grid
    assert "precision" not in vision.VisionGrid.of(grid).run(("fashion_mnist", "1.1"), 0.05, 0).to_dict()["fit"]
    bf16 = vision.VisionGrid.of(dict(grid, precision="bf16"))
    assert bf16.to_dict() == dict(grid, precision="bf16")
    assert bf16.run(("fashion_mnist", "1.1"), 0.05, 0, sweep=True).fit.precision == "bf16"
    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'bf16'\).*got 'fp16'"):
        vision.VisionGrid.of(dict(grid, precision="fp16"))


def test_a_bf16_grid_trains_its_runs_under_bf16_autocast(monkeypatch):
    """``precision="bf16"``, chapter 07's parameter, reaches ``train.fit``: the ViT's layers compute in
    bfloat16, and the run differs from the fp32 one."""
    calls, real_fit = [], train.fit

    def recording_fit(model, optimizer, train_set, test_set, options, **kwargs):
        seen = []
        model.head.register_forward_hook(lambda module, inputs, out: seen.append(out.dtype))
        history = real_fit(model, optimizer, train_set, test_set, options, **kwargs)
        calls.append((options.precision, set(seen)))
        return history

    monkeypatch.setattr(train, "fit", recording_fit)
    grid = dict(datasets=["fashion_mnist"], image_size=28, train_size=40, validation=0, model=MODEL, setup="authors",
                batch_size=10, root="", epochs=1, eval_every=1, seeds=1, methods=["1.1"], step_sizes={"1.1": [0.05]},
                sweep_seeds=1, sweep_epochs=1, sweep_window=1)
    runs = {precision: vision.grid(dict(grid, precision=precision), progress=False) for precision in ("bf16", "fp32")}
    assert calls == [("bf16", {torch.bfloat16}), ("fp32", {torch.float32})]
    bf16, fp32 = (runs[p].history.train_loss.iloc[0] for p in ("bf16", "fp32"))
    assert bf16 != fp32 and bf16 == pytest.approx(fp32, rel=0.05)


def _pruned(dataset="cifar10"):
    """Mean test accuracy by (dataset, method key, sparsity) and mean K/Q/V counts by (dataset, name, matrix)."""
    accuracy = pd.Series({(dataset, "1.1", 0.5): 0.612, (dataset, "1.1", 0.9): 0.401,
                          (dataset, "adam", 0.5): 0.633, (dataset, "adam", 0.9): 0.2049})
    counts = pd.Series({(dataset, name, kind): count for name, per in (("ℓ1.1", 1000), ("Adam", 250))
                        for kind, count in zip(("key", "query", "value"), (per, 2 * per, 3 * per))})
    return accuracy, counts, {"1.1": "ℓ1.1", "adam": "Adam"}


def test_the_pruning_prose_reads_each_methods_accuracy_at_each_level():
    accuracy, _, names = _pruned()
    assert pruning_levels_text("cifar10", accuracy, names, [0.5, 0.9]) == "ℓ1.1 61.2 / 40.1, Adam 63.3 / 20.5"
    assert pruning_levels_text("cifar10", accuracy, {"adam": "Adam"}, [0.9]) == "Adam 20.5"


def test_the_pruning_contrast_says_which_keeps_more_entries_and_accuracy():
    accuracy, counts, names = _pruned()
    text = pruning_contrast_text("cifar10", accuracy, counts, names, kinds=("key", "query", "value"),
                                 key="1.1", sparsity=0.9)
    assert text == ("ℓ1.1 has more entries above the threshold than Adam (6,000 against 1,500) and keeps 40.1 % "
                    "test accuracy with 90 % of the weights pruned, against 20.5 % for Adam")
    for adam, words in ((2000, "fewer entries above the threshold than Adam (1,000 against 2,000)"),
                        (1000, "as many entries above the threshold than Adam (1,000 against 1,000)")):
        changed = counts.copy()
        changed[("cifar10", "Adam", "key")] = adam
        text = pruning_contrast_text("cifar10", accuracy, changed, names, kinds=("key",), key="1.1",
                                     sparsity=0.5)
        assert text.startswith(f"ℓ1.1 has {words} and keeps 61.2 % test accuracy with 50 % of the weights pruned")
