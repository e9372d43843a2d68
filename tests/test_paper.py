"""The paper's numbers live in mdlib.experiments.paper only, and agree with themselves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mdlib.book import scorecard
from mdlib.book.views.sentiment import paper_table1_view
from mdlib.experiments import paper, sentiment

ROOT = Path(__file__).resolve().parents[1]

#: Literals that only the paper's numbers produce: Table 1 and its gaps, the authors' re-run, the K/Q/V
#: counts (with or without thousands separators) and the token-selection count.
DISTINCTIVE = [f"{v:.2f}" for row in paper.TABLE_1.values() for v in row.values()]
DISTINCTIVE += [f"{v:.2f}" for v in (*paper.TABLE_1_GAPS.values(), *paper.RERUN_6_LAYERS.values())]
DISTINCTIVE += [form for row in paper.KQV_ABOVE.values() for n in row for form in (str(n), f"{n:,}")]
DISTINCTIVE += [f"{paper.KQV_ENTRIES:,}", f"{paper.TOKEN_SELECTION['wins']} of {paper.TOKEN_SELECTION['sentences']}"]
PATTERN = re.compile(r"(?<![\d.])(" + "|".join(map(re.escape, sorted(set(DISTINCTIVE), key=len, reverse=True)))
                     + r")(?![\d])")


def _sources() -> list[Path]:
    files = sorted([*(ROOT / "mdlib").rglob("*.py"), *(ROOT / "notebooks").glob("*.py")])
    return [f for f in files if f != ROOT / "mdlib" / "experiments" / "paper.py"]


def test_the_pattern_finds_the_numbers():
    """The scan would catch a typed copy: it matches the literals as the old code wrote them."""
    assert PATTERN.search("| 3 | 83.47 | 81.66 | 82.57 |")
    assert PATTERN.search("18,206 / 13,964 / 7,643") and PATTERN.search('"K": "27224"')
    assert PATTERN.search("ℓ1.1 wins 22 of 40, GD 16")
    assert not PATTERN.search("183.47 and 83.478 and 0.1827224")


def test_no_paper_number_outside_paper_py():
    found = [f"{path.relative_to(ROOT)}:{n}: {m.group(0)}" for path in _sources()
             for n, line in enumerate(path.read_text("utf-8").splitlines(), 1) for m in PATTERN.finditer(line)]
    assert not found, "type the paper's numbers in mdlib/experiments/paper.py only:\n" + "\n".join(found)


def test_no_reference_to_the_unpublished_spec():
    """Published text (the chapters, the library tier the API page renders) cites no unpublished file."""
    files = [*(ROOT / "notebooks").glob("*.py"), *(ROOT / "mdlib").glob("*.py")]
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files
             for m in re.finditer(r"PAPER\.md|DESIGN\.md|section 5a|the spec\b", f.read_text("utf-8"))]
    assert not found, found


def test_reported_gaps_match_the_table():
    """Table 1's stated ℓ1.1 − GD gaps agree with its cells up to the rounding of the cells."""
    for layers, gap in paper.TABLE_1_GAPS.items():
        assert gap == pytest.approx(paper.TABLE_1[layers]["1.1"] - paper.TABLE_1[layers]["2"], abs=0.011)


def test_token_counts_add_up():
    t = paper.TOKEN_SELECTION
    assert t["wins"] + t["losses"] + t["ties"] == t["sentences"]
    assert paper.token_win_rate() == pytest.approx(22 / 38)


def test_step_sizes_cover_table_1():
    assert set(paper.SENTIMENT_STEP_SIZES) == set(paper.TABLE_1) == set(paper.EPOCHS_TO_STOP)
    assert sentiment.PAPER_STEP_SIZES is paper.SENTIMENT_STEP_SIZES


def test_scorecard_paper_column_is_generated():
    """The scorecard's paper text shows the module's numbers, formatted, in the paper's layout."""
    table1 = next(c for c in scorecard.CLAIMS if c.label == "table-1").paper
    assert table1.startswith("83.47 / 81.66 / 82.57 (L = 3), 83.36 / 81.05 / 82.40 (L = 4)")
    assert table1.endswith("ℓ1.1 − GD 1.81 / 2.31 / 1.43 (best over epochs)")
    tokens = next(c for c in scorecard.CLAIMS if c.label == "table-token-selection").paper
    assert tokens == "ℓ1.1 wins 22 of 40, GD 16, 2 ties (57.9 % of non-ties); one model each"
    cost = next(c for c in scorecard.CLAIMS if c.label == "table-cost-training").paper
    assert cost.startswith("ops per parameter GD 2, MD 10, Adam 14;")


def test_quotes_are_the_numbers():
    quoted = paper.quotes()
    assert quoted["paper-t1-gaps"] == "+1.81 / +2.31 / +1.43"
    assert quoted["paper-epochs"] == "ℓ1.1 72 / 87 / 150, ℓ2 (GD) 80 / 88 / 58, ℓ3 162 / 135 / 95"
    assert "18,206 / 13,964 / 7,643 (K / Q / V)" in quoted["paper-kqv"]
    assert all(name.startswith("paper-") for name in quoted)


def test_chapters_glue_every_quote_they_cite():
    """Each ``{glue:text}`paper-...``` a chapter cites is a quote, and the chapter glues the quotes."""
    quoted = paper.quotes()
    for chapter in (ROOT / "notebooks").glob("*.py"):
        text = chapter.read_text("utf-8")
        cited = set(re.findall(r"\{glue:text\}`(paper-[\w-]+)`", text))
        assert cited <= set(quoted), (chapter.name, cited - set(quoted))
        assert not cited or "artifacts.glue_paper()" in text, chapter.name


def test_paper_imports_nothing_heavy():
    code = "import sys, mdlib.experiments.paper; print(sorted({'torch', 'pandas', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_the_chapter_s_table_1_view_shows_the_paper_s_cells():
    view = paper_table1_view()
    assert list(view.layers) == [3, 4, 6]
    assert view.iloc[0].tolist() == [3, "83.47", "81.66", "82.57", "+1.81"]
    assert list(view["ℓ3"]) == [f"{paper.TABLE_1[L]['3']:.2f}" for L in (3, 4, 6)]


def test_the_paper_profile_runs_at_the_papers_step_sizes():
    """params/paper.yaml states the paper's scale as a profile (the config is the call); where it names the
    paper's step sizes, they are paper.py's."""
    from mdlib.book import profiles

    vision = profiles.resolve_parameters("07_vision", "paper")
    assert {k: vision["step_sizes"][k] for k in paper.VIT_STEP_SIZES} == {k: [v] for k, v in
                                                                          paper.VIT_STEP_SIZES.items()}
    sentiment = profiles.resolve_parameters("04_sentiment", "paper")
    assert all(m == [1] for m in sentiment["step_multiples"].values())  # 1 x paper.SENTIMENT_STEP_SIZES


def test_the_paper_profile_trains_the_papers_vit():
    """``paper.VIT_MODEL`` (which the plan's GPU throughput and chapter 08's timed ViT read) is the model
    the paper profile's chapter 07 trains."""
    from mdlib.book import profiles

    values = profiles.executed_parameters("07_vision", "paper", notebooks_dir=ROOT / "notebooks",
                                          params_dir=ROOT / "params")
    assert values["model"] == dict(paper.VIT_MODEL) and values["image_size"] == paper.VIT_IMAGE_SIZE
