"""Dry runs of the real-data chapters at the ``paper`` profile (select them with ``-k paper_profile``).

Each notebook executes with the paper profile's widths, depths, step sizes, data sets and data paths,
on tiny stand-ins in the real on-disk formats: IMDb as parquet files in the hub's layout under
``<data cache>/imdb`` (real movie-review sentences; named as the user's own files, since the hub's
names are checked against the hub's sha256), CIFAR-10/100 as torchvision's pickles under
``<data cache>/cifar``. Only the volume is cut: one epoch, one seed, small batches for the ViT. Every
run is on a PATH without apt-get, as on a machine without Debian's apt (RHEL, macOS): the paper
profile reads no Debian package. So ``PROFILE=paper make book`` on a GPU machine is known to run up
to the data volume.
"""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import path_without_apt
from mdlib.book import execute, profiles
from mdlib.experiments import data, fetch

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("paper_profile")]

#: What the dry runs cut, per notebook (everything else is the paper profile's).
DRY = {
    "04_sentiment": {"epochs": 1, "seeds": {"1.1": 1, "2": 1, "3": 1}, "variation_seeds": {"1.1": 1, "2": 1},
                     "variation_epochs": 1},
    "05_token_selection": {},
    "06_weights": {},
    "07_vision": {"epochs": 1, "sweep_epochs": 1, "seeds": 1, "batch_size": 20, "validation": 20,
                  "step_sizes": {"adam": [1e-4], "1.1": [0.05], "1.75": [0.01], "2": [0.01, 0.03], "3": [0.001]}},
}


def _imdb_stand_in(folder, snippets: pd.DataFrame) -> None:
    """Rotten Tomatoes sentences as IMDb's parquet files (300 train, 100 test reviews)."""
    plain = folder / "imdb" / "plain_text"
    plain.mkdir(parents=True)
    rows = snippets.sample(400, random_state=0)
    rows.iloc[:300].to_parquet(plain / "train-standin.parquet")
    rows.iloc[300:].to_parquet(plain / "test-standin.parquet")


def _cifar_stand_in(folder) -> None:
    """40 training and 20 test images of CIFAR-10 and CIFAR-100 in torchvision's pickle layout."""
    rng = np.random.default_rng(0)
    for name, (sub, train_files, test_file, label_key) in fetch.CIFAR_FILES.items():
        classes = 10 if name == "cifar10" else 100
        (folder / "cifar" / sub).mkdir(parents=True)
        counts = {f: 40 // len(train_files) for f in train_files} | {test_file: 20}
        for file, count in counts.items():
            batch = {b"data": rng.integers(0, 256, (count, 3072)).astype(np.uint8),
                     label_key: rng.integers(0, classes, count).tolist()}
            with open(folder / "cifar" / sub / file, "wb") as handle:
                pickle.dump(batch, handle)


@pytest.fixture(scope="module", autouse=True)
def without_apt(tmp_path_factory):
    """No apt-get on PATH for every fetch and kernel of this module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", path_without_apt(tmp_path_factory.mktemp("bin-without-apt")))
        yield


@pytest.fixture(scope="module")
def paper_data(tmp_path_factory):
    """A data cache holding the fetched offline files plus the IMDb and CIFAR stand-ins, and a build
    folder shared by the chapters (05 and 06 read the runs 04 trained)."""
    for name in ("rotten_tomatoes", "wordpiece_vocab"):
        fetch.fetch(name)
    root = tmp_path_factory.mktemp("paper")
    cache = root / "cache"
    cache.mkdir()
    for name in ("vocab.txt", "vader_lexicon.txt", "movieReviewSnippets_GroundTruth.txt"):
        shutil.copy2(fetch.path_of(name), cache / name)
    rt = data.rotten_tomatoes()
    snippets = pd.DataFrame({"text": list(rt["train"]["text"]), "label": list(rt["train"]["label"])})
    _imdb_stand_in(cache, snippets)
    _cifar_stand_in(cache)
    return cache, root / "build"


def _dry_run(name, paper_data, monkeypatch, tmp_path):
    cache, build = paper_data
    assert shutil.which("apt-get") is None
    monkeypatch.setenv("MDLIB_DATA_DIR", str(cache))
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(build))
    parameters = profiles.resolve_parameters(name, "paper", DRY[name])
    out = execute.run_notebook(name, "paper", DRY[name], output_dir=tmp_path, progress=False)
    return parameters, out


def test_paper_profile_04_sentiment(paper_data, monkeypatch, tmp_path):
    parameters, out = _dry_run("04_sentiment", paper_data, monkeypatch, tmp_path)
    assert parameters["dataset"] == "imdb" and parameters["width"] == 384 and parameters["layers"] == [3, 4, 6]
    assert parameters["max_length"] == 512 and parameters["train_size"] is None
    assert all(m == [1] for m in parameters["step_multiples"].values())  # the paper's step sizes
    runs = pd.read_csv(paper_data[1] / "results" / "table-sentiment-runs.csv")
    replication = runs[runs.grid == "replication"]  # and the variation: l_1.1 and GD at the first depth
    assert sorted(set(replication.layers)) == [3, 4, 6] and len(replication) == 9 and not runs.diverged.any()
    assert len(runs[runs.grid == "variation"]) == 2 and set(runs[runs.analysed].grid) == {"replication"}
    expected = {(3, "1.1"): 8e-4, (4, "2"): 4e-4, (6, "3"): 1e-5}
    for (layers, method), lr in expected.items():
        assert runs[(runs.layers == layers) & (runs.method.astype(float) == float(method))].lr.iloc[0] == lr
    assert out.is_file()


@pytest.fixture(scope="module")
def paper_grid(paper_data, tmp_path_factory):
    """The data and build folder once chapter 04's dry run has built the Table 1 grid that 05 and 06
    read (whatever order, or worker, the tests run in)."""
    with pytest.MonkeyPatch.context() as patch:
        _dry_run("04_sentiment", paper_data, patch, tmp_path_factory.mktemp("04"))
    return paper_data


def test_paper_profile_05_token_selection(paper_grid, monkeypatch, tmp_path):
    _, out = _dry_run("05_token_selection", paper_grid, monkeypatch, tmp_path)
    assert out.is_file()


def test_paper_profile_06_weights(paper_grid, monkeypatch, tmp_path):
    parameters, _ = _dry_run("06_weights", paper_grid, monkeypatch, tmp_path)
    assert parameters["depth"] == 6  # the paper's histograms are of the 6-layer models
    counts = pd.read_csv(paper_grid[1] / "results" / "table-weights-kqv.csv")
    init = counts[counts.method == "init"]
    assert (init[["K", "Q", "V", "K > 0.06", "Q > 0.06", "V > 0.06"]] == 0).all().all()  # width 384: none at init


def test_paper_profile_07_vision(paper_data, monkeypatch, tmp_path):
    parameters, out = _dry_run("07_vision", paper_data, monkeypatch, tmp_path)
    assert parameters["datasets"] == ["cifar10", "cifar100"] and parameters["image_size"] == 48
    assert parameters["model"]["width"] == 512 and parameters["model"]["depth"] == 6
    assert "setup" not in parameters  # the notebook's default: the authors' initialization
    assert out.is_file()
