"""The scorecard: each verdict rule flips between its outcomes on crafted results, the page has one row
per claim in the paper's order, missing results give "not measured", and the real sample folder builds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mdlib import scorecard
from mdlib.scorecard import DIFFERS, HOLDS, INCONCLUSIVE, NOT_MEASURED

SAMPLE = Path("/work/main/_build/results")
OUTCOMES = (HOLDS, DIFFERS, INCONCLUSIVE, NOT_MEASURED)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the page's (only) table, cells split on unescaped bars."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| Claim |") and set(lines[1]) <= set("|-")
    return [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[2:]]


def verdict_of(cell: str) -> str:
    return re.match(r"\*\*(.+?)\*\*", cell).group(1)


def rows_of(text: str, claim: int) -> list[list[str]]:
    """The page's rows for ``CLAIMS[claim]``."""
    return [row for row in table_rows(text) if row[0].startswith(scorecard.CLAIMS[claim].claim)]


def save(folder: Path, label: str, frame: pd.DataFrame) -> None:
    frame.to_csv(folder / f"{label}.csv", index=False)


def sentiment_runs(folder: Path, first, second, reached: bool = True) -> None:
    """table-sentiment-runs with best test accuracies ``first`` (ℓ1.1) and ``second`` (GD), 3 layers."""
    rows = [{"layers": 3, "method": m, "seed": s, "best_test": a, "reached": reached, "chosen": True}
            for m, values in (("1.1", first), ("2", second)) for s, a in enumerate(values)]
    rows.append({"layers": 3, "method": "2", "seed": 0, "best_test": 0.99, "reached": False, "chosen": False})
    save(folder, "table-sentiment-runs", pd.DataFrame(rows))


# ---------------------------------------------------------------------------------------------
# crafted results, one writer per claim: scenario -> the files of that claim


def e1(folder, scenario):
    own, other, spread = {HOLDS: (0.001, 0.05, 0.0005), DIFFERS: (0.05, 0.001, 0.0005),
                          INCONCLUSIVE: (0.01, 0.012, 0.005), NOT_MEASURED: (0.001, 0.05, 0.0005)}[scenario]
    svm_ps = [2.0] if scenario == NOT_MEASURED else [2.0, 3.0]
    rows = []
    for p in (2.0, 3.0):
        for q in svm_ps:
            level = own if p == q else other
            for step in (0, 10):
                mean = 1.0 if step == 0 else level
                rows.append({"train_p": p, "svm_p": q, "step": step, "mean": mean, "std": spread,
                             "q10": mean - spread, "q90": mean + spread})
    save(folder, "fig-e1-paths", pd.DataFrame(rows))


def e2(folder, scenario):
    """Norm: log k (holds), k (differs), k^0.45 (inconclusive); 500 steps (not measured). Divergence:
    1/log^2 k (holds), constant (differs), 1/sqrt(log k) (inconclusive)."""
    K = 500 if scenario == NOT_MEASURED else 100000
    k = np.unique(np.geomspace(1, K, 300).astype(int))
    norm = {HOLDS: np.log(k), DIFFERS: k.astype(float), INCONCLUSIVE: k ** 0.45, NOT_MEASURED: np.log(k)}[scenario]
    log = np.log(k + 1.0)
    divergence = {HOLDS: 1 / log ** 2, DIFFERS: np.full(k.shape, 0.3), INCONCLUSIVE: 1 / np.sqrt(log),
                  NOT_MEASURED: 1 / log ** 2}[scenario]
    save(folder, "fig-e2-norm-growth", pd.concat(
        [pd.DataFrame({"p": p, "method": "plain", "step": k, "norm": norm, "selected_probability": 0.9,
                       "divergence": divergence, "loss": 0.1}) for p in (1.75, 3.0)]))


def e3(folder, scenario):
    ps = [] if scenario == NOT_MEASURED else [1.75, 2.0]
    value = {HOLDS: 1e-4, DIFFERS: 0.5, INCONCLUSIVE: 0.05, NOT_MEASURED: 0.0}[scenario]
    save(folder, "table-e3-final", pd.DataFrame({"p": ps, "W_divergence": [1e-5] * len(ps),
                                                 "v_divergence": [value] * len(ps)}, dtype=float))


def table1(folder, scenario):
    high, low = [0.60, 0.61, 0.62], [0.50, 0.51, 0.52]
    first, second = {HOLDS: (high, low), DIFFERS: (low, high), INCONCLUSIVE: ([0.55, 0.56, 0.57], [0.555, 0.565, 0.56]),
                     NOT_MEASURED: (high, low)}[scenario]
    sentiment_runs(folder, first, second, reached=scenario != NOT_MEASURED)
    save(folder, "table-1", pd.DataFrame({"layers": 3, "method": ["1.1", "2", "3"], "paper": [83.47, 81.66, 82.57]}))


def tokens(folder, scenario):
    wins, losses = {HOLDS: (80, 20), DIFFERS: (20, 80), INCONCLUSIVE: (50, 50), NOT_MEASURED: (80, 20)}[scenario]
    sentiment_runs(folder, [0.6, 0.6], [0.5, 0.5], reached=scenario != NOT_MEASURED)
    save(folder, "table-token-selection", pd.DataFrame([
        {"sentences": "hand-written", "l1.1 wins": wins, "GD wins": losses, "ties": 3},
        {"sentences": "paper (40 machine-written, 1 model each)", "l1.1 wins": 22, "GD wins": 16, "ties": 2}]))


def kqv(folder, scenario):
    first, second = {HOLDS: ([100, 110, 105], [200, 210, 205]), DIFFERS: ([200, 210, 205], [100, 110, 105]),
                     INCONCLUSIVE: ([100, 150, 125], [120, 130, 140]), NOT_MEASURED: ([0, 0, 0], [0, 0, 0])}[scenario]
    sentiment_runs(folder, [0.6] * 3, [0.5] * 3)
    save(folder, "table-weights-kqv", pd.DataFrame(
        [{"method": "init", "seed": s, "K": 0, "Q": 0, "V": 0} for s in range(3)]
        + [{"method": m, "seed": s, "K": c, "Q": c, "V": 1 if c else 0}
           for m, counts in (("1.1", first), ("2", second)) for s, c in enumerate(counts)]))


def pruning(folder, scenario):
    high, low = [0.70, 0.71, 0.72], [0.60, 0.61, 0.62]
    first, second = {HOLDS: (high, low), DIFFERS: (low, high), INCONCLUSIVE: ([0.6, 0.7, 0.65], [0.62, 0.68, 0.66]),
                     NOT_MEASURED: (high, low)}[scenario]
    sentiment_runs(folder, [0.8] * 3, [0.8] * 3, reached=scenario != NOT_MEASURED)
    save(folder, "fig-pruning", pd.DataFrame(
        [{"method": m, "seed": s, "sparsity": x, "test_accuracy": 0.8 if x == 0 else a}
         for m, values in ((1.1, first), (2, second)) for s, a in enumerate(values) for x in (0.0, 0.5, 0.9)]))


def vit_table(folder, levelled: bool):
    save(folder, "table-vit", pd.DataFrame({"dataset": "Fashion-MNIST", "optimizer": ["Adam", "p = 1.1", "p = 2"],
                                            "levelled": [True, levelled, True]}))


def vit_parity(folder, scenario):
    md = {HOLDS: [0.80, 0.81, 0.805], DIFFERS: [0.70, 0.705, 0.71], INCONCLUSIVE: [0.70, 0.80, 0.90],
          NOT_MEASURED: [0.80, 0.81, 0.805]}[scenario]
    rows = [{"epoch": e, "dataset": "fashion_mnist", "method": m, "seed": s,
             "test_accuracy": np.nan if e == 2 else (0.3 if e == 0 else a)}
            for m, values in (("Adam", [0.80, 0.81, 0.805]), ("p = 1.1", md), ("p = 2", [0.80, 0.81, 0.805]))
            for s, a in enumerate(values) for e in range(3)]
    save(folder, "fig-vit-accuracy", pd.DataFrame(rows))
    vit_table(folder, levelled=scenario != NOT_MEASURED)


def vit_sparsity(folder, scenario):
    md, adam = {HOLDS: ([100, 110], [300, 310]), DIFFERS: ([300, 310], [100, 110]),
                INCONCLUSIVE: ([100, 400], [240, 260]), NOT_MEASURED: ([100, 110], [300, 310])}[scenario]
    rows = [{"dataset": "fashion_mnist", "method": m, "seed": s, "matrix": kind, "count": c}
            for m, counts in (("Adam", adam), ("p = 1.1", md), ("p = 2", [5, 5]), ("initialization", [0, 0]))
            for s, c in enumerate(counts) for kind in ("query", "key", "value")]
    save(folder, "fig-vit-weights", pd.DataFrame(rows))
    vit_table(folder, levelled=scenario != NOT_MEASURED)


def cost(folder, scenario):
    ci = {HOLDS: "0.95-1.05", DIFFERS: "2.00-2.50", INCONCLUSIVE: "1.10-1.40", NOT_MEASURED: None}[scenario]
    rows = [{"model": "ViT (07)", "optimizer": "Adam", "ms per step": 10.0, "vs Adam (median ratio)": 1.0,
             "ci95": "1.00-1.00"}]
    if ci:
        rows.append({"model": "ViT (07)", "optimizer": "MD p = 1.1", "ms per step": 10.0,
                     "vs Adam (median ratio)": float(ci.split("-")[0]), "ci95": ci})
    save(folder, "table-cost-training", pd.DataFrame(rows))


WRITERS = [e1, e2, e2, e3, table1, tokens, kqv, pruning, vit_parity, vit_sparsity, cost]  # CLAIMS' order


def test_writers_follow_the_claims():
    assert len(WRITERS) == len(scorecard.CLAIMS)


@pytest.mark.parametrize("claim", range(len(WRITERS)), ids=[c.label + f"-{i}" for i, c in enumerate(scorecard.CLAIMS)])
@pytest.mark.parametrize("scenario", OUTCOMES)
def test_each_rule_flips_between_its_outcomes(tmp_path, claim, scenario):
    WRITERS[claim](tmp_path, scenario)
    text = scorecard.page(tmp_path, profile="smoke")
    rows = rows_of(text, claim)
    assert len(rows) == 1
    assert verdict_of(rows[0][4]) == scenario, rows[0]
    if scenario == NOT_MEASURED:  # says why, and not because a file is missing
        assert "(" in rows[0][4] and "missing" not in rows[0][4]


def full_folder(folder: Path) -> Path:
    for writer in WRITERS:
        writer(folder, HOLDS)
    table1(folder, HOLDS)  # the sentiment runs again: later writers replaced them with their own
    return folder


def test_page_has_one_row_per_claim_in_paper_order(tmp_path):
    text = scorecard.page(full_folder(tmp_path), profile="smoke", archive_link="results.zip")
    rows = table_rows(text)
    assert all(len(row) == 6 for row in rows)
    tokens = pytest.importorskip("markdown_it").MarkdownIt("commonmark").enable("table").parse(text)
    assert [t.type for t in tokens].count("tr_open") == 1 + len(rows)  # a markdown table: header + a row per claim
    assert [t.type for t in tokens].count("td_open") == 6 * len(rows)
    claims = [next(i for i, c in enumerate(scorecard.CLAIMS) if row[0].startswith(c.claim)) for row in rows]
    assert claims == list(range(len(scorecard.CLAIMS)))
    assert {verdict_of(row[4]) for row in rows} == {HOLDS}
    assert all(row[3] == "smoke" for row in rows)
    assert '<a href="results.zip" download>artifacts.zip</a>' in text
    assert rows[4][0].endswith("(3 layers)") and rows[4][1].startswith("83.47 / 81.66 / 82.57")
    for rule in scorecard.RULES:  # the page prints the rules it applied
        assert rule.sentence in text


def test_missing_results_are_not_measured(tmp_path):
    rows = table_rows(scorecard.page(tmp_path))
    assert len(rows) == len(scorecard.CLAIMS)
    for row in rows:
        assert verdict_of(row[4]) == NOT_MEASURED and ".csv missing" in row[4]
        assert row[3] == "unknown"
    # one file of a claim missing is enough
    table1(tmp_path, HOLDS)
    (tmp_path / "table-sentiment-runs.csv").unlink()
    row = rows_of(scorecard.page(tmp_path), 4)[0]
    assert verdict_of(row[4]) == NOT_MEASURED and "table-sentiment-runs.csv missing" in row[4]


def test_a_missing_column_is_not_measured_and_named(tmp_path):
    save(tmp_path, "table-e3-final", pd.DataFrame({"p": [2.0], "W_divergence": [0.0]}))
    row = rows_of(scorecard.page(tmp_path), 3)[0]
    assert verdict_of(row[4]) == NOT_MEASURED and "lacks v_divergence" in row[4]


def test_profile_comes_from_the_json_next_to_the_csv(tmp_path):
    e3(tmp_path, HOLDS)
    (tmp_path / "table-e3-final.json").write_text(json.dumps({"profile": "paper"}))
    rows = table_rows(scorecard.page(tmp_path, profile="smoke"))
    assert rows[3][3] == "paper" and rows[0][3] == "smoke"


def test_links_use_the_given_target(tmp_path):
    default = table_rows(scorecard.page(tmp_path))[4][5]
    assert default == "{numref}`table-1`"
    custom = table_rows(scorecard.page(tmp_path, link=lambda nb, label: f"[{label}]({nb}.md#{label})"))[4][5]
    assert custom == "[table-1](04_sentiment.md#table-1)"


def test_write_page(tmp_path):
    full_folder(tmp_path)
    target = scorecard.write_page(tmp_path / "book" / "scorecard.md", tmp_path, profile="smoke")
    assert target.read_text("utf-8") == scorecard.page(tmp_path, profile="smoke")
    assert [p.name for p in target.parent.iterdir()] == ["scorecard.md"]


def test_rules_on_edge_numbers():
    assert scorecard.interval_rule(float("nan"), float("nan")).outcome == INCONCLUSIVE
    assert scorecard.table1_rule(0.1, 0.2, seeds=1, unreached=0).outcome == NOT_MEASURED
    assert scorecard.e3_rule([float("nan")]).outcome == DIFFERS
    assert scorecard.cost_rule([(0.8, 1.25)]).outcome == HOLDS
    assert scorecard.cost_rule([(0.7, 0.9)]).outcome == INCONCLUSIVE
    assert scorecard.parity_rule([(-2.5, -1.0)], seeds=3, levelled=True).outcome == INCONCLUSIVE
    assert scorecard.token_rule(0, 0, unreached=0).outcome == NOT_MEASURED


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="no results of a real build at /work/main/_build/results")
def test_the_sample_results_build_a_page():
    rows = table_rows(scorecard.page(SAMPLE, profile="default"))
    assert len(rows) >= len(scorecard.CLAIMS)
    assert all(verdict_of(row[4]) in OUTCOMES for row in rows)
