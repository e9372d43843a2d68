"""The results schema: each rule refuses a broken table naming the file, the row and the rule; the
chapters' writers (``artifacts.save_table``, ``artifacts.save_figure(..., data=)``) refuse to save it; good
tables, placeholders and tables without a schema pass."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from mdlib.book import artifacts  # noqa: E402
from mdlib.book.scorecard import schema  # noqa: E402

#: A default-profile build's results folder, where this machine keeps one (the tests on it skip elsewhere).
RESULTS = Path(__file__).parent / "fixtures" / "results"  #: a smoke build's results (fixtures/make_results.py)


pytestmark = pytest.mark.usefixtures("build_dir")  # conftest's: what they write goes to a temporary build


def runs() -> pd.DataFrame:
    """A good table-sentiment-runs: two chosen runs, and a diverged candidate (its accuracies missing)."""
    grid = {"grid": "variation", "setup": "small-embeddings", "analysed": True}
    return pd.DataFrame([
        {**grid, "layers": 3, "method": "1.1", "multiple": 1, "lr": 1e-3, "seed": s, "diverged": False, "epochs": 10,
         "train_accuracy": 0.99, "reached": True, "best_test": 0.71, "last_test": 0.7, "validation": 0.69,
         "chosen": True, "tied": True} for s in (0, 1)] + [
        {**grid, "layers": 3, "method": "1.1", "multiple": 3, "lr": 3e-3, "seed": 0, "diverged": True, "epochs": np.nan,
         "train_accuracy": np.nan, "reached": False, "best_test": np.nan, "last_test": np.nan, "validation": np.nan,
         "chosen": False, "tied": False}])


BROKEN = {  # name: (how the good table breaks, the message)
    "negated accuracy": (lambda f: f.assign(last_test=-f.last_test), "row 2: last_test -0.7 outside [0, 1]"),
    "850 %": (lambda f: f.assign(last_test=f.last_test.where(f.index != 1, 8.5)),
              "row 3: last_test 8.5 outside [0, 1]"),
    "negative step size": (lambda f: f.assign(lr=-1e-3), "row 2: lr -0.001 outside [0, ∞)"),
    "infinite": (lambda f: f.assign(lr=np.inf), "row 2: lr inf is not finite"),
    "NaN where none may be": (lambda f: f.assign(reached=f.reached.where(f.index != 1)), "row 3: reached is missing"),
    "text for a number": (lambda f: f.assign(lr="fast"), "row 2: lr 'fast' is not a number"),
    "a fractional count": (lambda f: f.assign(epochs=2.5), "row 2: epochs 2.5 is not an integer"),
    "a flag that is not one": (lambda f: f.assign(chosen="yes"), "row 2: chosen 'yes' is not True or False"),
    "a duplicated run": (lambda f: pd.concat([f, f.iloc[[1]]], ignore_index=True),
                         "row 5 repeats row 3: the same grid, layers, method, multiple, seed (variation, 3, 1.1, 1, "
                         "1); "
                         "one row per run"),
    "a column lacking": (lambda f: f.drop(columns=["seed", "chosen"]), "table-sentiment-runs.csv lacks seed, chosen"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_table_is_refused_by_file_row_and_rule(broken):
    change, message = BROKEN[broken]
    schema.check("table-sentiment-runs", runs())  # the good table passes
    with pytest.raises(schema.SchemaError) as error:
        schema.check("table-sentiment-runs", change(runs()))
    assert str(error.value).startswith("table-sentiment-runs.csv") and message in str(error.value)


def test_required_rows_and_patterns():
    baseline = pd.DataFrame({"baseline": ["naive_bayes", "logistic_regression"], "description": "x", "C": [np.nan, 1.0],
                             "validation_accuracy": 0.7, "test_accuracy": 0.75, "train_size": 100})
    schema.check("table-sentiment-baseline", baseline)
    with pytest.raises(schema.SchemaError, match=r"table-sentiment-baseline.csv has no row with baseline "
                                                 r"'naive_bayes' \(required\)"):
        schema.check("table-sentiment-baseline", baseline.iloc[1:])
    cost = pd.DataFrame({"model": "ViT (07)", "optimizer": ["Adam", "MD p = 1.1"], "ms per step": 10.0,
                         "vs Adam (median ratio)": [1.0, 0.9], "ci95": ["1.00-1.00", "0.85-0.95"],
                         "method": ["adam", "1.1"], "ci_low": [1.0, 0.85], "ci_high": [1.0, 0.95]})
    schema.check("table-cost-training", cost)
    with pytest.raises(schema.SchemaError, match=r"table-cost-training.csv row 2: method 'Adam' does not match"):
        schema.check("table-cost-training", cost.assign(method=cost.optimizer))  # a display name, not a key
    with pytest.raises(schema.SchemaError, match=r"table-cost-training.csv row 3: ci95 'nan-nan' does not match"):
        schema.check("table-cost-training", cost.assign(ci95=["1.00-1.00", "nan-nan"]))


def test_unreadable_files_are_refused_by_name(tmp_path):
    path = tmp_path / "x.csv"
    for text, message in (("", "table-1.csv is empty"), ("a,b\n1,2\n1,2,3\n", "table-1.csv is not a readable CSV"),
                          ("a,b\n1,2,3,4\n", "table-1.csv row 2 has more fields than the header")):
        path.write_text(text)
        with pytest.raises(schema.SchemaError, match=message):
            schema.read(path, "table-1")


def test_placeholders_and_tables_without_a_schema_pass():
    schema.check("table-sentiment-ablation", pd.DataFrame({"note": ["no ablation at this profile"]}))
    schema.check("table-not-read-by-the-scorecard", pd.DataFrame({"accuracy": [8.5]}))


def test_save_table_refuses_a_broken_table_and_writes_nothing(build_dir):
    with pytest.raises(ValueError, match=r"table-sentiment-runs not saved: table-sentiment-runs.csv row 2: last_test "
                                         r"-0.7 outside \[0, 1\]\. Fix the table"):
        artifacts.save_table(BROKEN["negated accuracy"][0](runs()), "table-sentiment-runs", glue=False)
    assert not (build_dir / "results").exists() or not list((build_dir / "results").iterdir())
    saved = artifacts.save_table(runs(), "table-sentiment-runs", glue=False)  # the good one is saved
    assert pd.read_csv(saved.files["csv"]).shape == runs().shape


def test_save_figure_refuses_broken_data_before_drawing(build_dir):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    curves = pd.DataFrame({"method": "1.1", "seed": 0, "sparsity": [0.0, 0.5], "test_accuracy": [0.8, 8.5]})
    with pytest.raises(ValueError, match=r"fig-pruning not saved: fig-pruning.csv row 3: test_accuracy 8.5 outside"):
        artifacts.save_figure(fig, "fig-pruning", data=curves, close=False)
    assert not (build_dir / "figures").exists()  # no PNG, PDF or record
    saved = artifacts.save_figure(fig, "fig-pruning", data=curves.assign(test_accuracy=[0.8, 0.75]))
    assert saved.files["png"].is_file() and saved.files["csv"].is_file()


def test_rounding_at_a_bound_passes():
    schema.check("table-sentiment-runs", runs().assign(last_test=1 + 1e-7, lr=-1e-12))
    with pytest.raises(schema.SchemaError, match="last_test 1.0001 outside"):
        schema.check("table-sentiment-runs", runs().assign(last_test=1.0001))


def test_timing_columns_are_declared_per_table():
    assert schema.timing_columns("table-cost-training") == {"ms per step", "vs Adam (median ratio)", "ci95", "ci_low",
                                                             "ci_high"}
    assert schema.timing_columns("fig-vit-accuracy") == schema.timing_columns("fig-sentiment-curves") == {"seconds"}
    assert schema.timing_columns("fig-cost-step") == {"ms", "ns_per_param", "vs_adam_fused"}
    assert schema.timing_columns("table-cost") == {"ns per param (step, largest size)"}
    assert schema.timing_columns("table-cost-vit") == {"step_s", "hours_2000_epochs"}
    assert schema.timing_columns("table-1") == schema.timing_columns("table-not-declared") == frozenset()
    with pytest.raises(schema.SchemaError, match=r"table-cost-vit.csv row 2: step_s -1 outside \[0, ∞\)"):
        schema.check("table-cost-vit", pd.DataFrame({"optimizer": ["Adam"], "step_s": -1.0, "params": 10,
                                                     "hours_2000_epochs": 1.0}))


@pytest.mark.parametrize("label", sorted(schema.TABLES))
def test_a_real_build_s_tables_pass(label):
    """Every rule holds on a smoke build's results (the timing tables of chapter 08 and the sentiment
    curves included), the machine-readable columns added."""
    schema.read(RESULTS / f"{label}.csv", label)
