"""The sentiment experiments' pieces on the fixture data: batching, run configs, the builder and the
step-size sweep's choice."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mdlib.book import chapters, profiles
from mdlib.book.views.sentiment import movement_text, steps_view, table1_view
from mdlib.experiments import estimates, methods, paper, sentiment, step_grid, train
from mdlib.experiments.sentiment import grids
from mdlib.runs import store
from mdlib.runs.identity import RunId
from test_step_grid import fake_correct  # tests/test_step_grid.py

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def small(**overrides):
    return sentiment.run_config(**dict(layers=3, optimizer="md", p=1.1, lr=0.05, width=6, max_length=16, epochs=2,
                                   batch_size=2) | overrides)


def test_collate_pads_to_the_longest_and_masks_padding():
    batch = [(torch.tensor([101, 5, 102]), torch.tensor(1)), (torch.tensor([101, 102]), torch.tensor(0))]
    inputs, labels = sentiment.collate(batch)
    assert inputs["input_ids"].tolist() == [[101, 5, 102], [101, 102, 0]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert labels.dtype == torch.float32 and labels.tolist() == [1.0, 0.0]


def test_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="not divisible by 4 heads"):
        sentiment.run_config(layers=4, optimizer="md", p=2.0, lr=0.1, width=6)
    with pytest.raises(ValueError, match="3 token sequences but 2 labels"):
        sentiment.TokenizedDataset([[1], [2], [3]], [0, 1])


def test_method_keys_round_trip():
    for key in ("1.1", "2", "3", "1.75", "adam", "adamw"):
        assert methods.method_key(*methods.method(key)) == key
    assert methods.method("2") == ("md", 2.0)
    with pytest.raises(ValueError, match="unknown method 'rmsprop'"):
        methods.method("rmsprop")
    assert methods.method(1.1) == ("md", 1.1) and methods.method(2) == ("md", 2.0)  # a YAML key 1.1


def test_the_papers_method_keys_are_named_in_methods():
    assert [methods.method(k) for k in (methods.L1_1, methods.GD, methods.L3, methods.ADAM)] == [
        ("md", 1.1), ("md", 2.0), ("md", 3.0), ("adam", None)]
    assert methods.PAPER_PS == (methods.L1_1, methods.GD, methods.L3)
    assert all(list(row) == list(methods.PAPER_PS) for row in paper.TABLE_1.values())  # Table 1's columns
    assert estimates.COMPARED == (methods.L1_1, methods.GD)
    assert methods.arm_key(methods.L1_1, methods.GD) == "1.1@2"
    assert methods.arm_text(methods.arm_key(methods.GD, methods.L1_1)) == "GD, ℓ1.1's steps per tensor"


@pytest.mark.parametrize("module", ["mdlib/book/scorecard/claims.py", "mdlib/book/scorecard/rules.py",
                                    "mdlib/experiments/estimates.py", "mdlib/experiments/sentiment/allocation.py",
                                    "mdlib/experiments/sentiment/chapter.py", "mdlib/experiments/selection.py",
                                    "mdlib/experiments/paper.py"])
def test_the_claims_modules_type_no_method_key(module):
    """The scorecard, the estimates it reads and the paper's numbers name the paper's methods through
    ``methods``' keys."""
    tree = ast.parse((ROOT / module).read_text("utf-8"))
    typed = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and node.value in {methods.L1_1, methods.GD, methods.L3, methods.ADAM}]
    assert typed == [], f"{module}: method keys typed on lines {typed}; use mdlib.experiments.methods' names"


def test_movement_text_gives_each_groups_means_and_l11_over_gd():
    table = pd.DataFrame([{"layers": 3, "method": key, "seed": seed, "group": group, "movement": value * (1 + seed)}
                          for key, scale in (("1.1", 3.0), ("2", 1.0)) for seed in (0, 1)
                          for group, value in (("embeddings", 0.1 * scale), ("attention", 0.02 * scale))])
    names = {"1.1": "ℓ1.1", "2": "ℓ2 (GD)"}
    assert movement_text(table, names) == ("embeddings: 0.45 / 0.15; attention: 0.09 / 0.03 "
                                           "(ℓ1.1 / ℓ2 (GD)); ℓ1.1 over GD: embeddings 3.0× / attention 3.0×")
    alone = movement_text(table[table.method == "2"], names)
    assert alone == "embeddings: 0.15; attention: 0.03 (ℓ2 (GD)); ℓ1.1 over GD: not measured"


@pytest.mark.parametrize("key", ["1_1", "1e1", "inf", "nan", " 2", "2.", "+2", "1", "0.5", "Adam", "\uff11.\uff11",
                                 True, None, float("inf")])
def test_method_keys_are_strict(key):
    """Python's float() reads "1_1" as 11, and " 2", "inf" or full-width digits too: none is a method key."""
    with pytest.raises(ValueError, match=re.escape(f"unknown method {key!r}: an l_p exponent p > 1")):
        methods.method(key)


def test_build_seeds_distinct_initializations_and_evaluates_on_the_named_split(fixture_data):
    a, b, c = (sentiment.build(small(seed=s)) for s in (0, 0, 1))
    first = lambda setup: next(setup.model.parameters()).detach()  # noqa: E731
    assert torch.equal(first(a), first(b)) and not torch.equal(first(a), first(c))
    parts = sentiment.splits("rotten_tomatoes", 0, 16)
    assert a.train_set is parts["train"]
    for dataset, split in ((a.test_set, "test"), (a.final_evaluations["validation"], "validation")):
        lengths = [len(x) for x in dataset.ids]  # the named split, sorted by length
        assert lengths == sorted(lengths) and sorted(dataset.texts) == sorted(parts[split].texts)
    assert a.lengths == [len(x) for x in parts["train"].ids]
    assert all(x[0] == 2 and x[-1] == 3 for x in parts["train"].ids)  # [CLS] ... [SEP] in the fixture vocab
    assert isinstance(a.optimizer, torch.optim.Optimizer) and a.optimizer.defaults["p"] == 1.1


def test_training_subset_is_stratified_seeded_and_shared(fixture_data):
    full = sentiment.splits("rotten_tomatoes", 0, 16)["train"]
    setup = sentiment.build(small(train_size=4))
    again = sentiment.build(small(train_size=4, seed=1, optimizer="md", p=2.0))
    assert len(setup.train_set) == 4 and setup.train_set.texts == again.train_set.texts  # every run: the same
    assert set(setup.train_set.texts) <= set(full.texts)
    assert sorted(setup.train_set.labels.tolist()) == [0, 0, 1, 1]  # stratified
    assert setup.lengths == [len(x) for x in setup.train_set.ids]
    with pytest.raises(ValueError, match="train_size must be None"):
        small(train_size=1)
    with pytest.raises(ValueError, match="unknown setup"):
        small(setup="bert")


def test_a_run_is_stored_and_its_model_rebuilt(fixture_data):
    config = small()
    [result] = sentiment.train_runs([config], progress=False)  # the path a grid trains its runs by
    assert not result.cached and list(result["history"].epoch) == [1, 2]
    assert 0 <= result["validation_accuracy"] <= 1 and result["validation_loss"] > 0  # evaluated once, at the end
    [again] = sentiment.train_runs([config], progress=False)
    assert again.cached
    model = sentiment.trained_model(config, again)
    setup = sentiment.build(config)
    train.fit(setup.model, setup.optimizer, setup.train_set, None, config.fit,
              collate_fn=setup.collate_fn, lengths=setup.lengths, progress=False)
    for (name, mine), theirs in zip(model.state_dict().items(), setup.model.state_dict().values()):
        assert torch.equal(mine, theirs), name


def _rows_and_correct(validation, n=1000):
    """A cell's sweep rows (2 seeds of 1x, 3x, 10x, 30x; 3x misses the stop rule at seed 1, 30x diverges
    there) with per-seed ``validation`` accuracies, and per-sentence predictions that give them: the
    first share of ``n`` sentences right, shifted by the seed."""
    rows = pd.DataFrame({"layers": 3, "method": "2", "multiple": [1.0, 1.0, 3.0, 3.0, 10.0, 10.0, 30.0, 30.0],
                         "lr": [1.0, 1.0, 3.0, 3.0, 10.0, 10.0, 30.0, 30.0], "seed": [0, 1] * 4,
                         "diverged": [False] * 7 + [True], "reached": [True, True, True, False, True, True, True, False],
                         "validation": validation, "validation_n": n})
    right = {(m, seed): v for m, seed, v in zip(rows.multiple, rows.seed, rows.validation)}

    def correct(layers, key, multiple, seed):
        assert (layers, key) == (3, "2")
        return np.random.default_rng([seed, int(10 * multiple)]).permutation(n) < round(right[multiple, seed] * n)

    return rows, correct


def test_choose_ranks_the_stop_rule_then_validation_beyond_its_paired_error_then_the_middle_of_a_tie():
    # 3x missed the rule at seed 1, 30x diverged: 1x and 10x remain, 0.71 each: a tie of two, the nearer
    # the middle of the grid... both are as near: the smaller
    rows, correct = _rows_and_correct([0.70, 0.72, 0.75, 0.50, 0.71, 0.71, 0.80, np.nan])
    choice = sentiment.choose(rows, correct)
    assert (choice.value, choice.tied) == (1.0, (1.0, 10.0))
    # 10x ahead by 5 points at both seeds (5.5 and 4.5): beyond its paired error over 2 x 1000 sentences
    rows, correct = _rows_and_correct([0.655, 0.665, 0.75, 0.50, 0.71, 0.71, 0.80, np.nan])
    assert sentiment.choose(rows, correct) == step_grid.Choice(10.0, (10.0,), 10.0)
    # 5 points again, but 8 at one seed and 2 at the other: the seeds' spread puts it inside; of two, the better
    rows, correct = _rows_and_correct([0.64, 0.68, 0.75, 0.50, 0.72, 0.70, 0.80, np.nan])
    assert sentiment.choose(rows, correct) == step_grid.Choice(10.0, (1.0, 10.0), 10.0)
    # none reached the rule: every finished candidate competes (3x's 0.625 is tied with 10x's 0.71 here)
    assert sentiment.choose(rows.assign(reached=False), correct).tied == (1.0, 3.0, 10.0)
    rows, correct = _rows_and_correct([0.70, 0.72, 0.75, 0.50, 0.71, 0.71, 0.80, np.nan])
    with pytest.raises(ValueError, match=r"every candidate step size diverged for 2 at 3 layers"):
        sentiment.choose(rows.assign(diverged=True), correct)


def test_reference_steps_are_the_papers():
    assert sentiment.reference_step(4, "3") == 6e-6 and sentiment.reference_step(6, "1.1") == 1e-3
    assert sentiment.reference_step(3, "adam") == sentiment.ADAM_STEP
    with pytest.raises(ValueError, match="no reference step size for method '1.75'"):
        sentiment.reference_step(3, "1.75")


def grid_config(**overrides):
    return dict(dataset="rotten_tomatoes", max_length=64, train_size=None, width=6, setup="authors", epochs=600,
                layers=[3], methods=["1.1", "2"], seeds=3, multiples={"1.1": [1, 3], "2": [3, 10]}) | overrides


def test_grid_chooses_on_the_sweep_seeds_then_runs_the_others_and_records_a_diverged_one(monkeypatch, tmp_path):
    """Fake runs: (training, validation, test) accuracies keyed by (method, multiple) or (method,
    multiple, seed), None: diverged; the choice never looks at test."""
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))
    assert sentiment.SWEEP_SEEDS == 2
    outcome = {("1.1", 1): (0.99, 0.70, 0.60), ("1.1", 3): (1.0, 0.65, 0.90), ("2", 3): (1.0, 0.8, 0.5),
               ("2", 3, 1): None, ("2", 10): (1.0, 0.6, 0.5), ("2", 10, 2): None}
    calls = []

    def fake_runs(configs, workers=1, progress=True, skip=()):
        calls.append([(methods.method_key(c.optimizer.name, c.optimizer.p), c.fit.seed) for c in configs])
        out = []
        for c in configs:
            key = methods.method_key(c.optimizer.name, c.optimizer.p)
            multiple = round(c.optimizer.lr / sentiment.reference_step(3, key))
            values = outcome.get((key, multiple, c.fit.seed), outcome[key, multiple])
            if values is None:
                if not skip:
                    raise FloatingPointError("overflow")
                out.append(None)
                continue
            train_acc, validation, test = values
            history = pd.DataFrame({"epoch": [1, 2], "train_accuracy": [0.5, train_acc], "test_accuracy": [0.5, test],
                                    "seconds": [1.0, 1.0]})
            store.save(RunId.of(sentiment.KIND, c), {"history": history, "validation_accuracy": validation, "validation_n": 1000,
                                            "state.x": np.zeros(1)})
            out.append(store.load(RunId.of(sentiment.KIND, c)))
        return out

    monkeypatch.setattr(grids, "train_runs", fake_runs)
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    grid = sentiment.grid(grid_config(), name=sentiment.grid_name("test"))
    assert grid.chosen == {(3, "1.1"): 3.0, (3, "2"): 10.0}  # 1x missed the rule, GD 3x overflowed at seed 1
    assert calls[0] == [("1.1", 0), ("1.1", 1)] * 2 + [("2", 0), ("2", 1)] * 2
    assert calls[1] == [("1.1", 2), ("2", 2)]  # GD's seed 2 overflows: recorded, never trained again
    assert calls[2] == [("1.1", 0), ("1.1", 1), ("1.1", 2), ("2", 0), ("2", 1)]  # the chosen runs that finished
    table = grid.runs
    assert list(zip(table.method, table.seed, table.multiple)) == [
        ("1.1", 0, 1.0), ("1.1", 0, 3.0), ("1.1", 1, 1.0), ("1.1", 1, 3.0), ("1.1", 2, 3.0),
        ("2", 0, 3.0), ("2", 0, 10.0), ("2", 1, 3.0), ("2", 1, 10.0), ("2", 2, 10.0)]
    assert table.chosen.tolist() == [False, True, False, True, True, False, True, False, True, True]
    assert table.diverged.tolist() == [False] * 7 + [True, False, True] and not table.reached.iloc[-1]
    assert len(grid.configs) == 5 and set(grid.history.seed) == {0, 1, 2}
    calls.clear()
    single = sentiment.grid(grid_config(seeds=2, multiples={"1.1": [3], "2": [3, 10]}))
    assert calls[:2] == [[("1.1", 0), ("1.1", 1)] + [("2", 0), ("2", 1)] * 2, []]  # the sweep seeds are every seed
    assert single.runs.chosen.tolist() == [True, True, False, True, False, True]
    with pytest.raises(ValueError, match=r"no step-size multiples for \['3'\]"):
        sentiment.grid(grid_config(methods=["3"], multiples={}))
    with pytest.raises(ValueError, match=r"missing \['seeds'\], unknown \['workers'\]"):
        sentiment.grid({k: v for k, v in grid_config(workers=2).items() if k != "seeds"})

    # read back by the name chapter 04 records: the same grid, nothing trained
    calls.clear()
    again = sentiment.built_grid("test")
    assert again.config.to_dict() == grid_config() and again.chosen == grid.chosen and calls == []
    pd.testing.assert_frame_equal(again.runs, grid.runs)
    with pytest.raises(LookupError, match=r"not built a Table 1 grid at profile 'paper'.*Build it with "
                                          r"`python -m mdlib run (\d\d) --profile paper`") as missing:
        sentiment.built_grid("paper")
    number = re.search(r"mdlib run (\d\d)", str(missing.value)).group(1)  # the command names the Table 1 chapter
    assert "table-1" in chapters.chapter(profiles.resolve_notebook(number, NOTEBOOKS).stem).claims

    # a variant of chapter 04 records its grid under its own name: the book's chapters still read the book's
    store.set_name(sentiment.grid_name("test", "ab12cd34"), sentiment.GRID_KIND, grid_config(seeds=2))
    assert store.named(sentiment.grid_name("test"))[1] == grid_config()
    read = []
    monkeypatch.setattr(grids, "grid", lambda config, **_: read.append(config.seeds))
    for variant in ("ab12cd34", "ffffffff", None):  # the variant's own; another variant's folder; the book
        sentiment.built_grid("test", variant=variant)
    assert read == [2, 3, 3]


def test_grid_takes_seeds_per_method(monkeypatch, tmp_path):
    """``seeds`` may give each method its own count (l3 with fewer seeds)."""
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path))
    trained = []

    def fake_runs(configs, workers=1, progress=True, skip=()):
        out = []
        for c in configs:
            trained.append((methods.method_key(c.optimizer.name, c.optimizer.p), c.fit.seed))
            history = pd.DataFrame({"epoch": [1], "train_accuracy": [1.0], "test_accuracy": [0.6], "seconds": [1.0]})
            store.save(RunId.of(sentiment.KIND, c), {"history": history, "validation_accuracy": 0.6, "validation_n": 1000,
                                            "state.x": np.zeros(1)})
            out.append(store.load(RunId.of(sentiment.KIND, c)))
        return out

    monkeypatch.setattr(grids, "train_runs", fake_runs)
    monkeypatch.setattr(grids, "test_correct", fake_correct)
    config = grid_config(methods=["1.1", "2", "3"], seeds={"1.1": 3, "2": 2, "3": 1},
                         multiples={"1.1": [3], "2": [10], "3": [300]})
    grid = sentiment.grid(config)
    assert sorted(grid.configs) == [(3, "1.1", 0), (3, "1.1", 1), (3, "1.1", 2), (3, "2", 0), (3, "2", 1), (3, "3", 0)]
    assert sorted(set(trained)) == sorted((k, s) for _, k, s in grid.configs)
    assert sentiment.seeds_of(config, "3") == 1 and sentiment.seeds_of(grid_config(), "2") == 3
    with pytest.raises(ValueError, match=r"seeds gives no count for \['3'\]"):
        sentiment.grid(grid_config(methods=["1.1", "3"], seeds={"1.1": 2}, multiples={"1.1": [1], "3": [1]}))
    with pytest.raises(ValueError, match="seeds must be an integer >= 1"):
        sentiment.grid(grid_config(seeds=0))


def runs_table():
    """A grid's runs: ℓ1.1 and GD at three seeds, ℓ3 at one, plus one unchosen sweep candidate."""
    rows = [{"layers": 3, "method": m, "seed": s, "multiple": mult, "lr": 1e-3, "epochs": e, "reached": r,
             "train_accuracy": 0.99, "best_test": b, "last_test": t, "validation": 0.6, "chosen": True, "diverged": False}
            for m, mult, values in (("1.1", 3.0, [(70, True, 0.72, 0.70), (80, True, 0.71, 0.69), (75, False, 0.73, 0.71)]),
                                    ("2", 10.0, [(90, True, 0.70, 0.66), (85, True, 0.70, 0.67), (80, True, 0.69, 0.69)]),
                                    ("3", 300.0, [(60, False, 0.60, 0.58)]))
            for s, (e, r, b, t) in enumerate(values)]
    rows.append(dict(rows[0], multiple=1.0, chosen=False, last_test=0.99, best_test=0.99))
    return pd.DataFrame(rows)


def test_cell_table_and_accuracy_gaps():
    from scipy import stats as scipy_stats

    table = runs_table()
    cells = sentiment.cell_table(table, "authors")
    assert set(cells.setup) == {"authors"}
    assert list(zip(cells.method, cells.runs, cells.reached)) == [("1.1", 3, 2), ("2", 3, 3), ("3", 1, 0)]
    assert cells.test.tolist() == pytest.approx([0.70, 0.6733333, 0.58]) and np.isnan(cells.test_std.iloc[2])
    assert cells.best.iloc[0] == pytest.approx(0.72) and cells.paper.iloc[0] == 83.47 and cells.paper_epochs.iloc[1] == 80
    gaps = estimates.accuracy_gaps(table)  # the chosen runs only; l1.1 minus GD, seed by seed
    ci = scipy_stats.ttest_rel([70, 69, 71], [66, 67, 69]).confidence_interval(0.95)
    assert list(gaps) == [3] and gaps[3].n == 3 and gaps[3].value == pytest.approx(8 / 3)
    assert (gaps[3].low, gaps[3].high) == pytest.approx((ci.low, ci.high))
    assert estimates.accuracy_gaps(table, "best_test")[3].value == pytest.approx(7 / 3)
    assert "+2.67 [" in estimates.depths_text(gaps) and "(3 pairs) at 3 layers" in estimates.depths_text(gaps)
    view = table1_view(cells)
    assert view["test acc. at the stop (%)"].tolist()[2] == "58.00" and view["epochs (reached / runs)"][0] == "75 (2/3)"


def test_baseline_naive_bayes_matches_a_numpy_multinomial_model(fixture_data):
    table = sentiment.baseline("rotten_tomatoes", 0, 16, None)
    assert list(table.baseline) == ["naive_bayes", "logistic_regression"]
    parts = sentiment.splits("rotten_tomatoes", 0, 16)
    special = {0, 2, 3}  # [PAD], [CLS], [SEP] of the fixture vocabulary
    counts = lambda part: np.array([np.bincount([t for t in ids.tolist() if t not in special], minlength=15)  # noqa: E731
                                    for ids in part.ids], dtype=float)
    X, y = counts(parts["train"]), parts["train"].labels.numpy()
    log_prior = np.log(np.bincount(y, minlength=2) / len(y))
    log_like = np.log((np.stack([X[y == c].sum(0) for c in (0, 1)]) + 1)
                      / (np.stack([X[y == c].sum() for c in (0, 1)])[:, None] + 15))
    test_X, test_y = counts(parts["test"]), parts["test"].labels.numpy()
    predicted = np.argmax(log_prior + test_X @ log_like.T, axis=1)
    assert table.test_accuracy.iloc[0] == pytest.approx(np.mean(predicted == test_y))
    assert table.train_size.iloc[0] == len(parts["train"])
    assert table.C.iloc[1] in sentiment.BASELINE_C
    again = sentiment.baseline("rotten_tomatoes", 0, 16, None)  # read back from the store
    pd.testing.assert_frame_equal(table, again)


def test_chapter_runs_put_both_grids_in_one_table_and_mark_the_analysed_one():
    def grid(setup: str) -> sentiment.Grid:
        return sentiment.Grid(sentiment.SentimentGrid.of(grid_config(setup=setup)), runs_table(), pd.DataFrame(), {}, {}, {})

    grids = {"replication": grid("authors"), "variation": grid("small-embeddings")}
    runs = sentiment.chapter_runs(grids, "variation")
    assert list(runs.columns[:3]) == ["grid", "setup", "analysed"] and len(runs) == 2 * len(runs_table())
    assert set(runs[runs.analysed].grid) == {"variation"} and set(runs[runs.analysed].setup) == {"small-embeddings"}
    assert set(runs[~runs.analysed].setup) == {"authors"}
    with pytest.raises(ValueError, match="analysed='ablation' names no grid of this chapter"):
        sentiment.chapter_runs(grids, "ablation")
    view = steps_view(runs[runs.seed == 0])
    assert list(view.columns[:2]) == ["setup", "layers"]


def test_the_authors_setup_pilots_are_read_from_their_file_a_row_per_run():
    """The pilots that ruled out the authors' setup come from data/sentiment_authors_pilots.csv (one row per
    reading, the documented columns); the book joins a run's readings and names how it ended."""
    from mdlib.book.views.sentiment import authors_pilots_view

    table = sentiment.authors_pilots()
    assert list(table.columns) == ["train_size", "width", "method", "multiple", "epoch", "train_accuracy",
                                   "test_accuracy", "seconds_per_epoch", "event"]
    assert set(table.method) == {"1.1", "2"} and table.train_accuracy.between(0, 1).all()
    shown = authors_pilots_view(table)
    assert len(shown) == len(table.groupby(["train_size", "width", "method", "multiple"]))
    gd = shown[shown["method, step"].str.endswith("10×") & (shown["training set, width"] == "8,455, 24")].iloc[0]
    assert gd["epochs"] == "100 / 200 / 300 / 400 (cap; best training accuracy 0.993)"
    assert gd["training acc."] == "0.838 / 0.948 / 0.978 / 0.989"
