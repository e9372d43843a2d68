"""The one step-size grid (``mdlib.experiments.step_grid``) on fake runs, and the typed configs of the two
chapters that use it: what it trains, what it chooses on, what it reads back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from mdlib.book import profiles
from mdlib.book.views.step_grid import edge_clause, tie_clause
from mdlib.book.views.vision import sweep_texts
from mdlib.experiments import estimates, methods, sentiment, step_grid, step_size_guide, train, vision, workload
from mdlib.experiments.sentiment import grids
from mdlib.runs import identity, store
from mdlib.runs.identity import RunId


@pytest.fixture(autouse=True)
def build_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))


def key_of(config) -> str:
    return methods.method_key(config.optimizer.name, config.optimizer.p)


class FakeRuns:
    """A chapter's ``train_runs`` without training: ``outcome(config)`` gives (final training accuracy,
    validation accuracy, test accuracy) or None (diverged: FloatingPointError). Stored runs are read
    back, as ``pool.run_many`` does; ``trained`` lists the configs it trained."""

    def __init__(self, kind, outcome):
        self.kind, self.outcome, self.trained = kind, outcome, []

    def __call__(self, configs, workers=1, progress=True, skip=()):
        out = []
        for c in configs:
            if (hit := store.load(RunId.of(self.kind, c))) is not None:
                out.append(hit)
                continue
            values = self.outcome(c)
            if values is None:
                if FloatingPointError not in skip:
                    raise FloatingPointError("diverged")
                out.append(None)
                continue
            self.trained.append(c)
            train_acc, validation, test = values
            history = pd.DataFrame({"epoch": [1, 2], "train_loss": [1.0, 0.5], "train_accuracy": [0.5, train_acc],
                                    "test_accuracy": [0.0, test], "seconds": [1.0, 1.0]})
            store.save(RunId.of(self.kind, c), {"history": history, "validation_accuracy": validation, "validation_n": 1000,
                                      "state.x": np.zeros(1)})
            out.append(store.load(RunId.of(self.kind, c)))
        return out


def sentiment_config(**overrides):
    return dict(dataset="rotten_tomatoes", max_length=16, train_size=None, width=6, setup="authors", epochs=3,
                layers=[3], methods=["1.1", "2"], seeds=3, multiples={"1.1": [1, 3, 10], "2": [3, 10]}) | overrides


def multiple_of(config) -> int:
    return round(config.optimizer.lr / sentiment.reference_step(config.model.layers, key_of(config)))


#: (method, multiple) -> (training accuracy, validation, test) of the fake sentiment runs; None: diverged.
SENTIMENT = {("1.1", 1): (1.0, 0.70, 0.90), ("1.1", 3): (1.0, 0.75, 0.60), ("1.1", 10): None,
             ("2", 3): (0.90, 0.80, 0.95), ("2", 10): (1.0, 0.65, 0.50)}


def sentiment_runs(monkeypatch, flip_test=False, table=SENTIMENT):
    """Fake sentiment runs from ``table``; ``flip_test``: test accuracy 1 - test (its order reversed)."""
    def outcome(c):
        values = table[key_of(c), multiple_of(c)]
        return None if values is None else (values[0], values[1], 1 - values[2] if flip_test else values[2])
    fake = FakeRuns(sentiment.KIND, outcome)
    monkeypatch.setattr(grids, "train_runs", fake)
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    return fake


def fake_correct(config, result, batch_size=100, split="test"):
    """Per-sentence correctness of a fake run: its validation accuracy's share of its sentences, drawn at
    random per run (seeded by the run's seed and step), so two candidates' differences are noisy as real
    runs' are (what ``choose`` pairs across candidates)."""
    n = int(result["validation_n"])
    rng = np.random.default_rng([config.fit.seed, round(1e9 * config.optimizer.lr)])
    return rng.permutation(n) < round(result["validation_accuracy"] * n)


def test_the_sentiment_sweep_trains_each_candidate_once_and_the_seeds_at_the_choice(monkeypatch):
    fake = sentiment_runs(monkeypatch)
    built = sentiment.grid(sentiment_config())
    # the stop rule first, then validation: 1.1 takes 3x (not 1x, whose test is higher); 2 takes 10x
    # (3x missed the rule)
    assert built.chosen == {(3, "1.1"): 3.0, (3, "2"): 10.0}
    trained = [(key_of(c), multiple_of(c), c.fit.seed) for c in fake.trained]
    assert len(trained) == len(set(trained))  # nothing trained twice
    swept = [(k, m, s) for k, m in [("1.1", 1), ("1.1", 3), ("2", 3), ("2", 10)] for s in (0, 1)]  # 10x diverged
    assert sorted(t for t in trained if t[2] < sentiment.SWEEP_SEEDS) == swept  # every candidate at seeds 0, 1
    assert sorted(t for t in trained if t[2] >= sentiment.SWEEP_SEEDS) == [("1.1", 3, 2), ("2", 10, 2)]
    assert {(k, s): multiple_of(c) for (_, k, s), c in built.configs.items()} == {
        ("1.1", s): 3 for s in range(3)} | {("2", s): 10 for s in range(3)}
    diverged = built.runs[built.runs.diverged]
    assert list(zip(diverged.method, diverged.multiple)) == [("1.1", 10)] * 2 and not diverged.chosen.any()


def test_the_choice_never_reads_the_test_set(monkeypatch, tmp_path):
    chosen = []
    for flip in (False, True):
        monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / str(flip)))
        sentiment_runs(monkeypatch, flip_test=flip)
        chosen.append(sentiment.grid(sentiment_config()).chosen)
    assert chosen[0] == chosen[1]


def test_an_all_diverged_cell_names_itself(monkeypatch):
    sentiment_runs(monkeypatch, table=SENTIMENT | {("2", 3): None, ("2", 10): None})
    with pytest.raises(ValueError, match=r"every candidate step size diverged for 2 at 3 layers"):
        sentiment.grid(sentiment_config())


def test_a_stored_grid_is_read_back_without_training(monkeypatch):
    fake = sentiment_runs(monkeypatch)
    first = sentiment.grid(sentiment_config(), name="grid-test")
    fake.trained.clear()
    again = sentiment.grid(sentiment_config())
    stored = sentiment.grid(sentiment_config(), stored_only=True)
    assert fake.trained == [] and again.chosen == stored.chosen == first.chosen
    pd.testing.assert_frame_equal(stored.runs, first.runs)
    with pytest.raises(LookupError, match="not in the results store. build it first"):
        sentiment.grid(sentiment_config(seeds=2), stored_only=True, missing_hint="build it first")


def vision_config(**overrides):
    return dict(datasets=["fashion_mnist"], image_size=28, train_size=200, validation=100,
                model={"patch": 7, "width": 8, "depth": 1, "heads": 2, "mlp": 8, "dropout": 0.1, "embedding_dropout": 0.1},
                setup="authors", batch_size=50, root="", epochs=4, eval_every=2, seeds=2, methods=["adam", "1.1"],
                step_sizes={"adam": [1e-3], "1.1": [0.05, 0.15, 0.5]}, sweep_seeds=2, sweep_epochs=2,
                sweep_window=1) | overrides


def vision_runs(monkeypatch, test_shift=0.0, diverge=(0.5,), validation=None):
    """Sweep runs (held-out validation images) score 0.8 at lr 0.15, else 0.7 (or ``validation(lr)``);
    final runs score ``test_shift`` more on the test set; the steps in ``diverge`` diverge. Per-image
    predictions: ``fake_vision_correct``."""
    def outcome(c):
        lr, sweep = c.optimizer.lr, c.data.validation > 0
        if lr in diverge:
            return None
        score = validation or (lambda lr: 0.8 if lr == 0.15 else 0.7)
        accuracy = score(lr) if sweep else 0.6 + test_shift * lr
        return 1.0, np.nan, accuracy
    fake = FakeRuns(vision.KIND, outcome)
    monkeypatch.setattr(vision, "train_runs", fake)
    monkeypatch.setattr(vision, "validation_correct", fake_vision_correct)
    return fake


def fake_vision_correct(config, result):
    """Per-image correctness of a fake sweep run on 1,000 validation images: its last validation accuracy's
    share of them, drawn at random per run (seeded by its seed and step). It refuses a run evaluated on the
    test set, as ``vision.validation_correct`` does: the choice must never ask for one."""
    assert config.data.validation > 0, "the choice read a run evaluated on the test set"
    accuracy = float(result["history"].test_accuracy.iloc[-1])
    rng = np.random.default_rng([config.fit.seed, round(1e9 * config.optimizer.lr)])
    return rng.permutation(1000) < round(accuracy * 1000)


def test_the_vision_sweep_chooses_on_validation_images_and_keeps_diverged_finals(monkeypatch, tmp_path):
    fake = vision_runs(monkeypatch)
    built = vision.grid(vision_config())
    assert built.chosen == {("fashion_mnist", "adam"): 1e-3, ("fashion_mnist", "1.1"): 0.15}
    swept = [(c.optimizer.lr, c.fit.seed) for c in fake.trained if c.data.validation]
    assert sorted(swept) == [(0.05, 0), (0.05, 1), (0.15, 0), (0.15, 1)]  # adam's one step: no sweep
    assert sorted((c.optimizer.lr, c.fit.seed) for c in fake.trained if not c.data.validation) == [
        (1e-3, 0), (1e-3, 1), (0.15, 0), (0.15, 1)]
    assert built.sweep.validation_accuracy.isna().tolist() == [False, False, True]  # 0.5 diverged, never chosen
    assert built.sweep.diverged.tolist() == [False, False, True]
    assert built.sweep.chosen.tolist() == [False, True, False]  # 0.8 against 0.7 on 2 x 1,000 images: no tie
    assert built.sweep.tied.tolist() == [False, True, False] and built.choices["fashion_mnist", "1.1"].tied == (0.15,)
    for shift in (5.0, -5.0):  # the test set plays no part in the choice
        monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / str(shift)))
        vision_runs(monkeypatch, test_shift=shift)
        assert vision.grid(vision_config()).chosen == built.chosen
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "finals"))
    vision_runs(monkeypatch, diverge=(1e-3,))  # a final run that diverges is recorded, not raised
    finals = vision.grid(vision_config())
    assert finals.diverged == [("fashion_mnist", "adam", 0), ("fashion_mnist", "adam", 1)]
    assert sorted(finals.configs) == [("fashion_mnist", "1.1", 0), ("fashion_mnist", "1.1", 1)]


def test_the_engine_refuses_a_cell_with_candidates_but_no_sweep():
    design = vision.VisionGrid.of(vision_config()).design()
    broken = dataclasses.replace(design, sweep_seeds=lambda cell: [], train_runs=lambda *a, **k: [])
    with pytest.raises(ValueError, match=r"cell \('fashion_mnist', '1.1'\) has 3 candidates but no sweep seeds"):
        step_grid.sweep(broken)


def test_typed_run_configs_are_the_dicts_the_store_keeps():
    config = sentiment.run_config(layers=3, optimizer="md", lr=8e-4, p=1.1, seed=2, train_size=1000, width=48)
    assert config.fit.seed == 2 and config.model.heads == 3 and sentiment.SentimentRun.from_dict(config.to_dict()) == config
    assert config.to_dict() == {
        "dataset": "rotten_tomatoes", "split_seed": 0, "max_length": 64, "train_size": 1000,
        "model": {"width": 48, "layers": 3, "heads": 3, "mlp": 192, "dropout": 0.2, "setup": "authors"},
        "optimizer": {"name": "md", "lr": 8e-4, "p": 1.1},
        "fit": {"epochs": 600, "batch_size": 100, "seed": 2, "loss": "binary", "reduction": "sum",
                "stop_train_accuracy": 0.995, "pool": 16}}
    config = vision.run_config("fashion_mnist", optimizer="adam", lr=1e-3, seed=1, epochs=10, train_size=10000,
                               model={"patch": 7, "width": 64, "depth": 4, "heads": 4, "mlp": 64, "dropout": 0.1,
                                      "embedding_dropout": 0.0}, validation=500)
    assert config.data.validation == 500 and vision.VisionRun.from_dict(config.to_dict()) == config
    assert config.to_dict() == {
        "data": {"dataset": "fashion_mnist", "image_size": 28, "train_size": 10000, "validation": 500, "seed": 0,
                 "root": None},
        "model": {"patch": 7, "width": 64, "depth": 4, "heads": 4, "mlp": 64, "dropout": 0.1, "embedding_dropout": 0.0,
                  "setup": "authors"},
        "optimizer": {"name": "adam", "lr": 1e-3, "p": None},
        "fit": {"epochs": 10, "batch_size": 100, "seed": 1, "loss": "multiclass", "eval_every": 1}}
    typed = sentiment.SentimentRun(
        "rotten_tomatoes", 0, 64, None, sentiment.TextModel(6, 3, 3, 24, 0.2, "authors"),
        train.Optimizer("gd", 1e-3, None),
        train.FitOptions(epochs=5, batch_size=100, seed=0, loss="binary", reduction="sum", stop_train_accuracy=0.995))
    plain = typed.to_dict()
    assert identity.config_key(sentiment.KIND, typed) == identity.config_key(sentiment.KIND, plain)
    assert identity.canonical_json(typed) == identity.canonical_json(plain)
    # one fit type: each kind keeps the fit settings it kept before, the others only where changed
    assert plain["fit"] == {"epochs": 5, "batch_size": 100, "seed": 0, "loss": "binary", "reduction": "sum",
                            "stop_train_accuracy": 0.995, "pool": 16}
    assert sentiment.SentimentRun.from_dict(plain) == typed
    bf16 = dataclasses.replace(typed, fit=dataclasses.replace(typed.fit, eval_every=2, precision="bf16"))
    assert bf16.to_dict()["fit"] == plain["fit"] | {"eval_every": 2, "precision": "bf16"}
    assert sentiment.SentimentRun.from_dict(bf16.to_dict()) == bf16
    assert identity.config_key(sentiment.KIND, bf16) != identity.config_key(sentiment.KIND, typed)
    assert set(config.to_dict()["fit"]) == {"epochs", "batch_size", "seed", "loss", "eval_every"}  # vision's
    with pytest.raises(ValueError, match=r"the fit settings of a run config has exactly the keys .*missing \['pool'\]"):
        sentiment.SentimentRun.from_dict(plain | {"fit": {k: v for k, v in plain["fit"].items() if k != "pool"}})


def test_typed_grid_configs_are_frozen_and_keep_the_old_errors():
    typed = sentiment.SentimentGrid.of(sentiment_config())
    assert typed.to_dict() == sentiment_config() and sentiment.SentimentGrid.of(typed) is typed
    assert vision.VisionGrid.of(vision_config()).to_dict() == vision_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.epochs = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        sentiment.TextModel(6, 3, 3, 24, 0.2, "authors").width = 12
    with pytest.raises(ValueError, match=r"a Table 1 grid config has exactly the keys .*missing \['seeds'\], "
                                         r"unknown \['workers'\]"):
        sentiment.SentimentGrid.of({k: v for k, v in sentiment_config(workers=2).items() if k != "seeds"})
    with pytest.raises(ValueError, match=r"no step-size multiples for \['3'\]"):
        sentiment.SentimentGrid.of(sentiment_config(methods=["3"], multiples={}))
    with pytest.raises(ValueError, match="seeds must be an integer >= 1"):
        sentiment.SentimentGrid.of(sentiment_config(seeds=0))
    with pytest.raises(ValueError, match=r"a vision grid config has exactly the keys .*missing \[\], unknown \['x'\]"):
        vision.VisionGrid.of(vision_config(x=1))
    with pytest.raises(ValueError, match="needs a non-empty list of candidates for each of the methods"):
        vision.VisionGrid.of(vision_config(step_sizes={"adam": [1e-3]}))
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        vision.VisionGrid.of(vision_config(datasets=["mnist"]))
    with pytest.raises(ValueError, match="width 8 is not divisible by 3 heads"):
        sentiment.run_config(layers=3, optimizer="gd", lr=1.0, width=8)
    with pytest.raises(ValueError, match="train_size must be None"):
        sentiment.run_config(layers=3, optimizer="gd", lr=1.0, width=6, train_size=10)
    with pytest.raises(ValueError, match="unknown setup 'bert'"):
        vision.run_config("fashion_mnist", optimizer="adam", lr=1e-3, seed=0, epochs=1, model=vision_config()["model"],
                          setup="bert")


def test_a_tie_goes_to_its_middle_and_an_even_tie_to_the_higher_score():
    one = lambda i, j: 0.01  # noqa: E731  (a paired standard error of one point)
    values = [0.3, 1.0, 3.0, 10.0]
    assert step_grid.tie_choice(values, [0.70, 0.71, 0.712, 0.60], one) == step_grid.Choice(1.0, (0.3, 1.0, 3.0), 3.0)
    assert step_grid.tie_choice(values, [0.60, 0.70, 0.71, 0.712], one).value == 3.0  # the middle of 1x, 3x, 10x
    assert step_grid.tie_choice(values, [0.60, 0.71, 0.70, 0.60], one) == step_grid.Choice(1.0, (1.0, 3.0), 1.0)
    assert step_grid.tie_choice(values, [0.60, 0.70, 0.71, 0.60], one).value == 3.0  # even: the higher score
    # beyond 1.96 errors: no tie; a candidate that diverged is never chosen; the stop rule ranks first
    assert step_grid.tie_choice(values, [0.70, 0.75, 0.60, 0.60], one).tied == (1.0,)
    assert step_grid.tie_choice(values, [0.70, 0.75, 0.60, 0.60], one, eligible=[1, 0, 1, 1]).value == 0.3
    assert step_grid.tie_choice(values, [0.70, 0.75, 0.60, 0.60], one, ranked=[0, 0, 1, 1]).tied == (3.0, 10.0)
    with pytest.raises(ValueError, match="every one diverged"):
        step_grid.tie_choice(values, [0.7] * 4, one, eligible=[0] * 4)
    assert step_grid.neutral_pick([1.0, 3.0], [0.7, 0.7]) == 0  # nothing tells them apart: the smaller
    assert step_grid.neutral_pick([0.3, 1.0, 3.0, 30.0], [0.7] * 4) == 2  # 3x is the geometric middle of 0.3x..30x


def test_the_tie_rule_favours_no_side_and_holds_its_choice_across_machines():
    """Machine-to-machine noise: two builds see the same candidates with independent run noise. With three
    candidates of equal accuracy the choice must go to either end equally often (the old rule, the
    smaller step of a tie, always went to one), and two builds must agree more often than the best score
    alone would make them."""
    rng = np.random.default_rng(0)
    values, truth, noise = [0.3, 1.0, 3.0], np.array([0.72, 0.72, 0.72]), 0.01
    error = lambda i, j: noise  # noqa: E731  (two candidates' means over two seeds: sd of 1 point)
    picks, best = [], []
    for _ in range(4000):
        machines = truth + noise * rng.standard_normal((2, 3)) / np.sqrt(2)
        chosen = [step_grid.tie_choice(values, list(m), error) for m in machines]
        picks.append([c.value for c in chosen])
        best.append([c.best for c in chosen])
    picks, best = np.array(picks), np.array(best)
    low, high = (picks == 0.3).mean(), (picks == 3.0).mean()
    assert abs(low - high) < 0.03  # no side: 4,000 x 2 choices, a binomial error of about 0.005
    agree, agree_best = (picks[:, 0] == picks[:, 1]).mean(), (best[:, 0] == best[:, 1]).mean()
    assert agree > agree_best + 0.3


def test_a_choice_at_the_end_of_its_grid_grows_the_grid_on_that_side(monkeypatch):
    """1.1's validation grows with the step (beyond 27x it diverges): the grid 1x, 3x grows to 9x, then
    27x, and stops after its two extensions, the choice still at its end; GD's choice, 1x of 0.3x..3x, is
    inside and its grid does not grow."""
    table = {("1.1", 1.0): 0.60, ("1.1", 3.0): 0.65, ("1.1", 9.0): 0.70, ("1.1", 27.0): 0.75,
             ("2", 0.3): 0.60, ("2", 1.0): 0.70, ("2", 3.0): 0.60}

    def outcome(c):
        multiple = round(c.optimizer.lr / sentiment.reference_step(3, key_of(c)), 6)
        return (1.0, table[key_of(c), multiple], 0.5) if (key_of(c), multiple) in table else None

    fake = FakeRuns(sentiment.KIND, outcome)
    monkeypatch.setattr(grids, "train_runs", fake)
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    built = sentiment.grid(sentiment_config(multiples={"1.1": [1, 3], "2": [0.3, 1, 3]}, grow=2, seeds=2))
    assert {cell: [round(v, 6) for v in values] for cell, values in built.candidates.items()} == {
        (3, "1.1"): [1.0, 3.0, 9.0, 27.0], (3, "2"): [0.3, 1.0, 3.0]}
    assert round(built.chosen[3, "1.1"], 6) == 27.0 and built.chosen[3, "2"] == 1.0
    assert sorted(set(round(m, 6) for m in built.runs.multiple[built.runs.method == "1.1"])) == [1.0, 3.0, 9.0, 27.0]
    design = grids.SentimentGrid.of(sentiment_config(multiples={"1.1": [1, 3], "2": [0.3, 1, 3]}, grow=2, seeds=2)).design()
    grown = len(fake.trained) - len(workload.grid_runs([design]))  # the plan counts the first candidates' runs
    assert grown == 2 * grids.SWEEP_SEEDS  # 9x and 27x at the sweep seeds
    assert design.grown_at_most() == 2 * 2 * 2 * grids.SWEEP_SEEDS >= grown  # both cells, both sides, twice


def test_a_vision_choice_at_its_grids_end_grows_the_grid_on_that_side(monkeypatch):
    """Chapter 07 with ``grow``: validation accuracy rises with the step up to 1.35 and falls beyond, so the
    grid 0.05, 0.15, 0.45 grows to 1.35 (the choice at its top), then to 4.05 (1.35 at the top again), and
    the choice, 1.35, now sits inside; nothing grows below, and a grid whose choice is inside does not grow.
    Growth trains sweep runs only (held-out images), and the finals train at the choice."""
    peak = {0.05: 0.60, 0.15: 0.65, 0.45: 0.70, 1.35: 0.80, 4.05: 0.40}
    fake = vision_runs(monkeypatch, diverge=(), validation=lambda lr: peak.get(round(lr, 6), 0.7))
    config = vision_config(step_sizes={"adam": [1e-3, 3e-3, 9e-3], "1.1": [0.05, 0.15, 0.45]}, grow=2)
    built = vision.grid(config)
    tried = {cell: [round(v, 6) for v in values] for cell, values in built.candidates.items()}
    assert tried == {("fashion_mnist", "adam"): [1e-3, 3e-3, 9e-3], ("fashion_mnist", "1.1"): [0.05, 0.15, 0.45, 1.35, 4.05]}
    assert round(built.chosen["fashion_mnist", "1.1"], 6) == 1.35
    assert built.chosen["fashion_mnist", "adam"] == 3e-3  # 0.7 everywhere: a three-way tie, its middle
    assert built.choices["fashion_mnist", "adam"].tied == (1e-3, 3e-3, 9e-3)
    swept = sorted({round(c.optimizer.lr, 6) for c in fake.trained if c.data.validation and key_of(c) == "1.1"})
    assert swept == [0.05, 0.15, 0.45, 1.35, 4.05]
    assert {round(c.optimizer.lr, 6) for c in fake.trained if not c.data.validation and key_of(c) == "1.1"} == {1.35}
    where = estimates.step_edges(built.sweep, cell=("dataset", "method"), candidate="lr")
    assert where["fashion_mnist", "1.1"][0] == "" and where["fashion_mnist", "adam"][0] == ""
    texts = sweep_texts(built, {"adam": "Adam", "1.1": "ℓ1.1"}, {"fashion_mnist": "Fashion-MNIST"})
    assert texts == {"vit-edge": "Every chosen step size lies strictly inside the steps its method tried.",
                     "vit-ties": "Adam on Fashion-MNIST: 0.001, 0.003, 0.009 (chosen: 0.003, the middle one)",
                     "vit-tried": "Adam on Fashion-MNIST 3, ℓ1.1 on Fashion-MNIST 5 (2 grown)"}


def test_a_vision_choice_still_at_its_end_after_growing_says_so(monkeypatch):
    """Accuracy that keeps rising with the step: the grid grows twice on top, and the choice stays at its
    end, which ``estimates.step_edges`` reports (the page justifies it with what was tried)."""
    fake = vision_runs(monkeypatch, diverge=(), validation=lambda lr: 0.5 + 0.1 * np.log10(lr / 0.01))
    config = vision_config(step_sizes={"adam": [1e-3], "1.1": [0.05, 0.15, 0.45]}, grow=2)
    built = vision.grid(config)
    assert [round(v, 6) for v in built.candidates["fashion_mnist", "1.1"]] == [0.05, 0.15, 0.45, 1.35, 4.05]
    design = vision.VisionGrid.of(config).design()  # Adam's one step is not swept: only 1.1 may grow
    sweep_seeds = len(list(design.sweep_seeds(("fashion_mnist", "1.1"))))
    assert design.grown_at_most() == 2 * 2 * sweep_seeds
    assert len(fake.trained) - len(workload.grid_runs([design])) == 2 * sweep_seeds  # one side, twice: half the bound
    where, chosen, tried = estimates.step_edges(built.sweep, cell=("dataset", "method"), candidate="lr")[
        "fashion_mnist", "1.1"]
    assert where == "the largest" and round(chosen, 6) == 4.05 and len(tried) == 5
    edge = sweep_texts(built, {"adam": "Adam", "1.1": "ℓ1.1"}, {"fashion_mnist": "Fashion-MNIST"})["vit-edge"]
    assert edge == ("A chosen step size at an end of the steps tried: ℓ1.1 on Fashion-MNIST: 4.05 is the largest of "
                    "0.05, 0.15, 0.45, 1.35, 4.05, after the grid grew twice on that side (its most); the best step "
                    "may lie beyond it.")


def test_the_vision_choice_reads_the_paired_error_of_the_images():
    """Two steps 2 points apart on 1,000 validation images: paired (the larger step gets 20 more images
    right, the same ones otherwise) the error of the difference is 0.44 points and they are not tied;
    scored on independent images (an unpaired error of about 2 points) they would be."""
    base = np.arange(1000) < 700
    better = base | ((np.arange(1000) >= 700) & (np.arange(1000) < 720))
    tables = {0.05: base, 0.15: better, 0.45: base}
    rows = pd.DataFrame({"dataset": "fashion_mnist", "method": "1.1", "lr": [0.05, 0.15, 0.45],
                         "validation_accuracy": [0.70, 0.72, 0.70], "diverged": False})
    asked = []

    def correct(dataset, key, lr):
        asked.append((dataset, key, lr))
        return tables[lr][None, :]

    choice = vision.choose(rows, correct)
    assert choice == step_grid.Choice(0.15, (0.15,), 0.15)
    assert sorted(asked) == [("fashion_mnist", "1.1", lr) for lr in (0.05, 0.15, 0.45)]
    shuffled = {lr: np.random.default_rng(i).permutation(t) for i, (lr, t) in enumerate(tables.items())}
    unpaired = vision.choose(rows, lambda d, k, lr: shuffled[lr][None, :])
    assert unpaired.tied == (0.05, 0.15, 0.45) and unpaired.value == 0.15  # the middle of the tie
    # a diverged candidate is never chosen and its predictions are never asked for
    asked.clear()
    assert vision.choose(rows.assign(diverged=[False, True, False]), correct).value in (0.05, 0.45)
    assert ("fashion_mnist", "1.1", 0.15) not in asked
    with pytest.raises(ValueError, match=r"every candidate step size diverged for 1.1 on fashion_mnist"):
        vision.choose(rows.assign(diverged=True), correct)


def test_the_words_on_a_choice_say_which_end_what_was_tried_and_why_it_stopped():
    assert edge_clause("ℓ2", 1.0, [0.3, 1.0, 3.0], [0.3, 1.0, 3.0], 2) == ""
    assert edge_clause("ℓ2", 0.3, [0.3, 1.0, 3.0], [0.3, 1.0, 3.0], 0) == (
        "ℓ2: 0.3 is the smallest of 0.3, 1, 3, and the grid may not grow (grow = 0); the best step may lie beyond it")
    assert edge_clause("ℓ2", 0.1, [0.1, 0.3, 1.0], [0.3, 1.0], 1).startswith(
        "ℓ2: 0.1 is the smallest of 0.1, 0.3, 1, after the grid grew once on that side (its most)")
    assert edge_clause("Adam", 1e-4, [1e-4], [1e-4], 2) == "Adam: 0.0001 is the only candidate (nothing to choose)"
    assert tie_clause("ℓ2", step_grid.Choice(1.0, (1.0,), 1.0)) == ""
    assert tie_clause("ℓ2", step_grid.Choice(3.0, (1.0, 3.0), 3.0)) == (
        "ℓ2: 1, 3 (chosen: 3, the better of the middle two)")


def fair(steps) -> bool:
    """The book's grid rule for a swept method's first steps: at least three, each at most 3x the one
    before (up to float rounding: 0.9 / 0.3 is 3.0000000000000004)."""
    ordered = sorted(steps)
    return len(ordered) >= 3 and all(b / a <= 3 * (1 + 1e-9) for a, b in zip(ordered, ordered[1:]))


@pytest.mark.parametrize("profile", ["smoke", "default", "overnight", "paper"])
def test_every_swept_method_of_chapters_07_and_09_starts_from_a_fair_grid_that_may_grow(profile):
    """Chapter 07's and 09's grids at every profile: each method with more than one step has at least three
    at most 3x apart, and its grid may grow where the choice sits at an end. A method with a single step
    (chapter 07's Adam and ℓ1.1 at the paper's steps, and the smoke profile's other methods) is not swept."""
    swept, at_paper = vision.chapter_grids(**profiles.executed_parameters("07_vision", profile))
    several = {key: steps for key, steps in swept.step_sizes.items() if len(steps) > 1}
    assert several and all(fair(steps) for steps in several.values()), several
    assert swept.grow >= 1 and all(len(steps) == 1 for steps in at_paper.step_sizes.values())
    guide = step_size_guide.chapter_config(**profiles.executed_parameters("09_step_sizes", profile) | {"scale": 0.1})
    assert all(fair(guide.candidates(key)) for key in guide.methods) and guide.grow >= 1
    if profile in ("default", "overnight"):
        assert len(several) == len(swept.methods)  # the book's default sweeps every method
