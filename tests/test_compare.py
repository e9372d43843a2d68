"""``python -m mdlib.book.compare A B``: two results folders are the same when every CSV is byte for byte
identical or holds the same values outside its timing columns; anything else is a difference the
report names (the column, the row, both values), and the exit code says which."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mdlib.book import cli
from mdlib.experiments import paths
from mdlib.book.compare import DIFFERS, IDENTICAL, ONLY_A, ONLY_B, SAME, FolderError, compare

#: A default-profile build's results folder, where this machine keeps one (the test on it skips elsewhere).
RESULTS = Path(__file__).parent / "fixtures" / "results"  #: a smoke build's results (fixtures/make_results.py)

ACCURACY = ("epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds,lr,dataset,method,seed\n"
            "1,2.16,0.179,,,0.8983999269985361,0.001,fashion_mnist,Adam,0\n"
            "2,1.87,0.3245,0.61,0.7123935666982024,0.8212330369933625,0.001,fashion_mnist,Adam,0\n"
            "3,1.49,0.4495,0.58,0.7250000000000001,0.8931727570015937,0.001,fashion_mnist,Adam,0\n")
COST = ("model,optimizer,ms per step,vs Adam (median ratio),ci95\n"
        "ViT (07),Adam,38.69041700090747,1.0,1.00-1.00\n"
        "ViT (07),MD p = 1.1,39.12259999924572,1.0275172678530984,1.01-1.07\n")


def results(folder: Path, **tables: str) -> Path:
    """A results folder: each table as ``<label>.csv`` (``_`` in a keyword for ``-``), with a
    provenance record that differs from any other folder's."""
    folder.mkdir(parents=True)
    for name, text in tables.items():
        label = name.replace("_", "-")
        (folder / f"{label}.csv").write_text(text)
        (folder / f"{label}.json").write_text(f'{{"label": "{label}", "git": {{"commit": "{folder.name}"}}}}')
    return folder


def one(report, label: str):
    (entry,) = [e for e in report.entries if e.label == label]
    return entry


@pytest.fixture
def a(tmp_path) -> Path:
    return results(tmp_path / "a", fig_vit_accuracy=ACCURACY, table_cost_training=COST)


def test_identical_copies_are_identical_and_pass(a, tmp_path, capsys):
    b = results(tmp_path / "b", fig_vit_accuracy=ACCURACY, table_cost_training=COST)
    report = compare(a, b)
    assert [(e.label, e.status) for e in report.entries] == [("fig-vit-accuracy", IDENTICAL),
                                                              ("table-cost-training", IDENTICAL)]
    assert report.ok
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "2 files: 2 identical, 0 same values (timing columns aside), 0 differ"


def test_a_changed_time_is_the_same_values_naming_the_column_set_aside(a, tmp_path):
    b = results(tmp_path / "b", fig_vit_accuracy=ACCURACY.replace("0.8212330369933625", "0.95"),
                table_cost_training=COST.replace("38.69041700090747,1.0,1.00-1.00", "41.2,1.0,0.98-1.03"))
    report = compare(a, b)
    assert report.ok
    seconds, cost = one(report, "fig-vit-accuracy"), one(report, "table-cost-training")
    assert (seconds.status, seconds.timing) == (SAME, ("seconds",))
    assert seconds.details == "set aside: seconds (1 cell differs)"
    assert cost.status == SAME and cost.timing == ("ms per step", "vs Adam (median ratio)", "ci95")
    assert "set aside: ms per step, vs Adam (median ratio), ci95 (2 cells differ)" in report.text()
    assert report.text().splitlines()[-1] == "2 files: 0 identical, 2 same values (timing columns aside), 0 differ"


def test_seconds_is_timing_in_a_table_without_a_schema(tmp_path):
    a = results(tmp_path / "a", fig_new="run,seconds,loss\n0,1.5,0.25\n")
    b = results(tmp_path / "b", fig_new="run,seconds,loss\n0,1.75,0.25\n")
    assert one(compare(a, b), "fig-new").status == SAME


def test_an_accuracy_off_by_1e_12_differs_unless_a_tolerance_allows_it(a, tmp_path, capsys):
    b = results(tmp_path / "b", fig_vit_accuracy=ACCURACY.replace("0.7123935666982024", "0.7123935666992024"),
                table_cost_training=COST)
    entry = one(compare(a, b), "fig-vit-accuracy")
    assert entry.status == DIFFERS
    assert entry.details == "row 3, test_accuracy: A 0.7123935666982024, B 0.7123935666992024 (1 cell differs)"
    assert cli.main(["compare", str(a), str(b)]) == 1
    assert "fig-vit-accuracy     differs      row 3, test_accuracy" in capsys.readouterr().out
    assert cli.main(["compare", str(a), str(b), "--atol", "1e-9"]) == 0
    out = capsys.readouterr().out
    assert "numbers compared within rtol 0 or atol 1e-09" in out and "1 cell within tolerance" in out
    assert one(compare(a, b, rtol=1e-9), "fig-vit-accuracy").status == SAME


def test_every_differing_cell_is_counted_and_the_first_shown(a, tmp_path):
    changed = ACCURACY.replace("0.3245", "0.3").replace("Adam,0\n3,", "SGD,0\n3,").replace("0.58", "")
    entry = one(compare(a, results(tmp_path / "b", fig_vit_accuracy=changed)), "fig-vit-accuracy")
    assert entry.details == "row 3, train_accuracy: A 0.3245, B 0.3 (3 cells differ)"


def test_an_added_column_differs_naming_it(a, tmp_path):
    lines = ACCURACY.splitlines(keepends=True)
    b = results(tmp_path / "b", fig_vit_accuracy="".join(line.replace("\n", ",x\n") for line in lines[:1])
                + "".join(line.replace("\n", ",1\n") for line in lines[1:]), table_cost_training=COST)
    report = compare(a, b)
    assert one(report, "fig-vit-accuracy").status == DIFFERS and not report.ok
    assert one(report, "fig-vit-accuracy").details == "column added in B: x"
    removed = one(compare(b, a), "fig-vit-accuracy")
    assert removed.details == "column removed in B: x"


def test_added_columns_are_set_aside_only_when_asked_and_never_hide_a_change(a, tmp_path, capsys):
    lines = ACCURACY.splitlines(keepends=True)
    added = ("key," + lines[0]) + "".join("adam," + line for line in lines[1:])  # a column B adds, first
    b = results(tmp_path / "b", fig_vit_accuracy=added, table_cost_training=COST)
    assert one(compare(a, b), "fig-vit-accuracy").status == DIFFERS
    report = compare(a, b, added_columns=True)
    entry = one(report, "fig-vit-accuracy")
    assert report.ok and entry.status == SAME and entry.details == "added in B: key"
    assert cli.main(["compare", str(a), str(b), "--added-columns"]) == 0
    assert "columns B adds set aside" in capsys.readouterr().out
    changed = results(tmp_path / "c", fig_vit_accuracy=added.replace("0.3245", "0.3246"), table_cost_training=COST)
    entry = one(compare(a, changed, added_columns=True), "fig-vit-accuracy")
    assert entry.status == DIFFERS and "row 3, train_accuracy: A 0.3245, B 0.3246" in entry.details
    removed = one(compare(b, a, added_columns=True), "fig-vit-accuracy")  # A's key is not in B
    assert removed.status == DIFFERS and removed.details == "column removed in B: key"
    header = lines[0].rstrip("\n").split(",")
    swapped = ",".join([header[1], header[0], *header[2:]]) + "\n"  # A's columns in another order
    rows = "".join(",".join([r.split(",")[1], r.split(",")[0], *r.split(",")[2:]]) for r in lines[1:])
    other = results(tmp_path / "d", fig_vit_accuracy=swapped + rows, table_cost_training=COST)
    assert one(compare(a, other, added_columns=True), "fig-vit-accuracy").status == DIFFERS


def test_a_removed_row_differs_with_the_row_counts(a, tmp_path):
    lines = ACCURACY.splitlines(keepends=True)
    entry = one(compare(a, results(tmp_path / "b", fig_vit_accuracy="".join(lines[:2] + lines[3:]))),
                "fig-vit-accuracy")
    assert entry.status == DIFFERS
    assert entry.details == "3 rows in A, 2 in B (header aside); the first differing row is row 3"
    entry = one(compare(a, results(tmp_path / "c", fig_vit_accuracy="".join(lines[:3]))), "fig-vit-accuracy")
    assert entry.details == "3 rows in A, 2 in B (header aside); rows 2 to 3 agree"


def test_a_label_in_one_folder_only_is_a_difference(a, tmp_path, capsys):
    b = results(tmp_path / "b", fig_vit_accuracy=ACCURACY, table_new="a\n1\n")
    report = compare(a, b)
    assert [(e.label, e.status) for e in report.entries] == [
        ("fig-vit-accuracy", IDENTICAL), ("table-cost-training", ONLY_A), ("table-new", ONLY_B)]
    assert not report.ok
    assert report.text().splitlines()[-1] == ("3 files: 1 identical, 0 same values (timing columns aside), 0 differ, "
                                              "1 only in A, 1 only in B")
    assert cli.main(["compare", str(a), str(b)]) == 1


def test_nan_equals_nan_however_it_is_written(tmp_path):
    a = results(tmp_path / "a", table_x="run,loss,seconds\n0,,1.0\n1,nan,2.0\n")
    b = results(tmp_path / "b", table_x="run,loss,seconds\n0,,1.5\n1,,2.5\n")
    entry = one(compare(a, b), "table-x")
    assert entry.status == SAME and entry.details == "set aside: seconds (2 cells differ); 1 cell written differently"


def test_text_is_compared_exactly_and_numbers_by_value(tmp_path):
    a = results(tmp_path / "a", table_x="method,score\nadam,1\n", table_y="method\nAdam\n")
    b = results(tmp_path / "b", table_x="method,score\nadam,1.0\n", table_y="method\nadam\n")
    report = compare(a, b)
    assert one(report, "table-x").status == SAME
    assert one(report, "table-y").details == "row 2, method: A Adam, B adam (1 cell differs)"


def test_integers_are_compared_exactly(tmp_path):
    a = results(tmp_path / "a", table_x=f"run,count\n0,{2 ** 53}\n1,3\n")
    b = results(tmp_path / "b", table_x=f"run,count\n0,{2 ** 53 + 1}\n1,3.0\n")
    entry = one(compare(a, b), "table-x")
    assert entry.details == f"row 2, count: A {2 ** 53}, B {2 ** 53 + 1} (1 cell differs)", entry.details


def test_a_folder_named_like_a_table_is_an_error_not_skipped(a, tmp_path, capsys):
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "table-x.csv").mkdir()
    assert cli.main(["compare", str(a), str(b)]) == 1
    assert capsys.readouterr().err == (f"error: B {b} holds table-x.csv, named like a table but not a file: "
                                       "move it away\n")


def test_a_file_that_is_no_table_differs_saying_why(a, tmp_path):
    b = results(tmp_path / "b", fig_vit_accuracy="", table_cost_training=COST + "ViT (07),MD p = 2,1.0\n")
    report = compare(a, b)
    assert one(report, "fig-vit-accuracy").details == "B is empty"
    assert one(report, "table-cost-training").details == "B row 4 has 3 fields, the header 5"


def test_a_missing_folder_or_one_without_csv_is_a_one_line_error(a, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "fig-vit-accuracy.json").write_text("{}")
    with pytest.raises(FolderError, match="holds no .csv file"):
        compare(a, empty)
    nowhere = tmp_path / "nowhere"
    for argv, message in ((["compare", str(a), str(nowhere)], f"error: B {nowhere} does not exist\n"),
                          (["compare", str(empty), str(a)],
                           f"error: A {empty} holds no .csv file: give a results folder, e.g. _build/results\n"),
                          (["compare", str(a / "fig-vit-accuracy.csv"), str(a)], "is not a folder\n")):
        assert cli.main(argv) == 1
        captured = capsys.readouterr()
        assert captured.err.endswith(message) and captured.err.count("\n") == 1 and not captured.out
    with pytest.raises(SystemExit):
        cli.main(["compare", str(a), str(a), "--rtol", "-1"])
    assert "--rtol: must be a number >= 0, got '-1'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="atol must be a number >= 0"):
        compare(a, a, atol=-1.0)


def test_compare_needs_no_book_project(a, tmp_path):
    """Run as a user would, in a folder that is no checkout of the book, with no MDLIB_ROOT."""
    b = results(tmp_path / "b", fig_vit_accuracy=ACCURACY, table_cost_training=COST)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != paths.ROOT_ENV}
    env["PYTHONPATH"] = str(paths.PACKAGE_DIR.parent)
    done = subprocess.run([sys.executable, "-m", "mdlib", "compare", str(a), str(b)], cwd=elsewhere, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("2 files: 2 identical")


def test_importing_compare_does_not_import_torch():
    code = "import sys, mdlib.book.compare; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)}).stdout
    assert out.split() == ["False"]


def test_two_copies_of_a_real_build_are_identical(tmp_path):
    b = tmp_path / "b"
    shutil.copytree(RESULTS, b)
    report = compare(RESULTS, b)
    labels = sorted(path.stem for path in RESULTS.glob("*.csv"))
    assert [e.label for e in report.entries] == labels and report.ok
    assert {e.status for e in report.entries} == {IDENTICAL}
    assert report.text().splitlines()[-1] == (f"{len(labels)} files: {len(labels)} identical, 0 same values "
                                              "(timing columns aside), 0 differ")
    curves = pd.read_csv(b / "fig-sentiment-curves.csv")
    curves.assign(seconds=curves.seconds + 1).to_csv(b / "fig-sentiment-curves.csv", index=False)  # another run's times
    entry = one(compare(RESULTS, b), "fig-sentiment-curves")
    assert entry.status == SAME and entry.details.startswith("set aside: seconds (")
