"""The chapter registry (``mdlib.book.chapters``): it lists the book's chapters as ``_toc.yml``,
``notebooks/`` and every profile do, and each chapter reads the data it read before the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mdlib.book import chapters, profiles, scorecard
from mdlib.experiments import sentiment, store

ROOT = Path(__file__).resolve().parents[1]


def test_the_registry_lists_the_books_chapters():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text("utf-8"))
    listed = [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    in_toc = [Path(file).name for file in listed if file.startswith("notebooks/")]
    assert list(chapters.NAMES) == in_toc  # the book's order
    assert list(chapters.NAMES) == profiles.chapters()  # notebooks/NN_*.py
    for profile in profiles.list_profiles():
        assert set(profiles.load_profile(profile)) == set(chapters.NAMES), profile
    assert len(set(chapters.NAMES)) == len(chapters.NAMES)


def test_a_chapter_reads_only_earlier_chapters_and_claims_its_own_labels():
    for i, chapter in enumerate(chapters.CHAPTERS):
        assert set(chapter.reads) <= set(chapters.NAMES[:i]), chapter.name
    labels = [label for chapter in chapters.CHAPTERS for label in chapter.claims]
    assert len(labels) == len(set(labels)) == len(chapters.BY_CLAIM)
    assert {claim.label: claim.notebook for claim in scorecard.CLAIMS} == chapters.BY_CLAIM
    assert chapters.chapter_of_claim("table-1-variation") is chapters.chapter("04_sentiment")
    with pytest.raises(ValueError, match="no chapter '10_new' in mdlib.book.chapters.CHAPTERS"):
        chapters.chapter("10_new")


#: What each chapter read before the registry (``fetch.needed`` at 9ad93d2), at each profile: with no Table 1
#: grid in the results store, and (``GRID``) once chapter 04 has recorded one built on IMDb.
NOTHING = {"01_fixed_decoder_paths": [], "02_single_instance_path": [], "03_joint_training": [], "08_cost": []}
READ_BEFORE = {
    "smoke": NOTHING | {"04_sentiment": ["rotten_tomatoes", "wordpiece_vocab"],
                        "05_token_selection": ["wordpiece_vocab", "rotten_tomatoes"], "06_weights": ["wordpiece_vocab"],
                        "07_vision": ["fashion_mnist"], "09_step_sizes": ["rotten_tomatoes", "wordpiece_vocab"]},
    "default": NOTHING | {"04_sentiment": ["rotten_tomatoes", "wordpiece_vocab"],
                          "05_token_selection": ["wordpiece_vocab", "rotten_tomatoes"],
                          "06_weights": ["wordpiece_vocab"], "07_vision": ["fashion_mnist"],
                          "09_step_sizes": ["rotten_tomatoes", "wordpiece_vocab"]},
    "paper": NOTHING | {"04_sentiment": ["imdb", "wordpiece_vocab"],
                        "05_token_selection": ["wordpiece_vocab", "rotten_tomatoes"], "06_weights": ["wordpiece_vocab"],
                        "07_vision": ["cifar10", "cifar100"], "09_step_sizes": ["rotten_tomatoes", "wordpiece_vocab"]},
}
GRID = {"05_token_selection": ["imdb", "wordpiece_vocab", "rotten_tomatoes"], "06_weights": ["imdb", "wordpiece_vocab"]}


@pytest.mark.parametrize("profile", list(READ_BEFORE))
def test_each_chapter_reads_the_data_it_read_before(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))

    def read() -> dict[str, list[str]]:
        return {c.name: c.needed(profiles.executed_parameters(c.name, profile)) for c in chapters.CHAPTERS}

    assert read() == READ_BEFORE[profile]
    store.set_name(sentiment.grid_name(profile), sentiment.GRID_KIND, {"dataset": "imdb"})
    assert read() == READ_BEFORE[profile] | GRID
    with pytest.raises(ValueError, match="07_vision reads unknown data 'mnist'"):
        chapters.chapter("07_vision").needed({"datasets": ["mnist"], "profile": profile})
