"""Fetching from package registries: checksums, extraction, caching, and errors that name the fix
(no network: the downloads are faked)."""

import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import FIXTURES, idx_bytes
from mdlib.book import chapters, profiles
from mdlib.experiments import data, fetch


def fake_sdist() -> bytes:
    """A source archive laid out like vaderSentiment 3.3.2's, holding the fixture files."""
    def tar_of(members: dict[str, bytes]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tf.addfile(info, io.BytesIO(content))
        return buffer.getvalue()

    inner = tar_of({"hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt":
                    (FIXTURES / "movieReviewSnippets_GroundTruth.txt").read_bytes()})
    return tar_of({"vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz": inner,
                   "vaderSentiment-3.3.2/vaderSentiment/vader_lexicon.txt": (FIXTURES / "vader_lexicon.txt").read_bytes()})


def test_fetch_verifies_extracts_and_caches(cache, monkeypatch):
    archive = fake_sdist()
    calls = []

    def download(requirement, kind, into):
        calls.append((requirement, kind))
        path = into / "vaderSentiment-3.3.2.tar.gz"
        path.write_bytes(archive)
        return path

    with pytest.raises(fetch.DataError, match="refusing"):  # the real archive checksum does not match
        fetch.fetch("rotten_tomatoes", download=download)
    digest = hashlib.sha256(archive).hexdigest()
    patched = {n: fetch.RegistryFile(**{**f.__dict__, "archive_sha256": digest}) if f.fetch_as == "rotten_tomatoes" else f
               for n, f in fetch.FILES.items()}
    monkeypatch.setattr(fetch, "FILES", patched)
    files = fetch.fetch("rotten_tomatoes", download=download)
    assert [p.name for p in files] == ["movieReviewSnippets_GroundTruth.txt", "vader_lexicon.txt"]
    assert calls[-1] == ("vadersentiment==3.3.2", "sdist")
    assert data.sentiment_lexicon()["amazing"] == 2.8
    fetch.fetch("rotten_tomatoes", download=download)  # intact files: nothing downloaded again
    assert len(calls) == 2
    with pytest.raises(ValueError, match="fetchable: rotten_tomatoes, wordpiece_vocab, fashion_mnist, imdb"):
        fetch.fetch("mnist")


def test_deb_download_updates_the_package_lists_once_when_apt_cannot_find_the_package(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, capture_output, text, cwd=None):
        calls.append(command)
        if command[:2] == ["apt-get", "download"] and ["apt-get", "update", "-qq"] in calls:
            (tmp_path / "pkg.deb").write_bytes(b"deb")
            return subprocess.CompletedProcess(command, 0, "", "")
        return subprocess.CompletedProcess(command, 0 if command[1] == "update" else 100, "", "E: Unable to locate")

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    assert fetch._download("dataset-fashion-mnist", "deb", tmp_path) == tmp_path / "pkg.deb"
    assert calls == [["apt-get", "download", "dataset-fashion-mnist"], ["apt-get", "update", "-qq"],
                     ["apt-get", "download", "dataset-fashion-mnist"]]


def test_missing_files_name_the_registry_that_serves_them(cache):
    with pytest.raises(fetch.DataError, match=r"fetch fashion_mnist` \(apt-get from Debian's archive, else "
                                             r"torchvision's download with internet\)"):
        data.fashion_mnist("test")
    with pytest.raises(fetch.DataError, match=r"vadersentiment==3.3.2 from PyPI with pip"):
        data.sentiment_lexicon()


@pytest.mark.parametrize("kind, stderr, registry", [
    ("sdist", "ERROR: Could not find a version that satisfies the requirement vadersentiment==3.3.2 (from versions: "
              "none)\nERROR: No matching distribution found for vadersentiment==3.3.2", "PyPI"),
    ("wheel", "WARNING: Retrying ... NewConnectionError: Failed to establish a new connection: [Errno 101] Network "
              "is unreachable", "PyPI"),
    ("deb", "W: Failed to fetch http://deb.debian.org/...  Temporary failure resolving 'deb.debian.org'\n"
            "E: Unable to locate package dataset-fashion-mnist", "Debian's package archive"),
])
def test_an_unreachable_registry_is_named_with_the_package(tmp_path, monkeypatch, kind, stderr, registry):
    monkeypatch.setattr(fetch.subprocess, "run", lambda command, **kw: subprocess.CompletedProcess(command, 1, "", stderr))
    with pytest.raises(fetch.DataError) as error:
        fetch._download("some-package==1.0", kind, tmp_path)
    message = str(error.value)
    tool = "apt-get" if kind == "deb" else "pip"
    assert message.startswith(f"{tool} could not download some-package==1.0; {registry} may be unreachable from "
                              "here (offline, or behind a proxy")
    assert message.endswith(": " + stderr.splitlines()[-1])  # the tool's last line, its cause


def test_other_download_failures_get_no_registry_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch.subprocess, "run",
                        lambda command, **kw: subprocess.CompletedProcess(command, 1, "", "ERROR: disk full"))
    with pytest.raises(fetch.DataError, match=r"^pip could not download x==1: ERROR: disk full$"):
        fetch._download("x==1", "wheel", tmp_path)


# --- Fashion-MNIST without apt: torchvision's layout ---------------------------------------------------

def _upstream_fashion_mnist(folder, monkeypatch):
    """Tiny Fashion-MNIST files as upstream's gzip files in ``folder``, their IDX sha256 registered as the
    expected ones; returns the arrays by IDX file stem."""
    rng = np.random.default_rng(0)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28)), "train-labels-idx1-ubyte":
              np.array([0, 1, 2, 9, 9, 3]), "t10k-images-idx3-ubyte": rng.integers(0, 256, (2, 28, 28)),
              "t10k-labels-idx1-ubyte": np.array([5, 7])}
    folder.mkdir(parents=True)
    for stem, array in arrays.items():
        (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(array)))
    digests = {stem: hashlib.sha256(idx_bytes(array)).hexdigest() for stem, array in arrays.items()}
    monkeypatch.setattr(fetch, "FASHION_MNIST_IDX", digests)
    return arrays


def _torchvision_serving(folder, monkeypatch):
    """torchvision's Fashion-MNIST download, with the internet replaced by ``folder`` (its md5 check
    included: the fixtures' md5 stands in for upstream's); returns the list of files it served."""
    mnist = pytest.importorskip("torchvision.datasets.mnist")
    from torchvision.datasets.utils import extract_archive

    served = []

    def download_and_extract_archive(url, download_root, filename, md5):
        assert url == mnist.FashionMNIST.mirrors[0] + filename and md5 == fetch.TORCHVISION_FASHION_MNIST_MD5[filename]
        target = Path(download_root) / filename
        shutil.copyfile(folder / filename, target)
        served.append(filename)
        extract_archive(str(target))

    monkeypatch.setattr(mnist, "download_and_extract_archive", download_and_extract_archive)
    return served


def test_fashion_mnist_without_apt_comes_from_torchvision_in_its_layout(cache, no_apt, monkeypatch, tmp_path, capsys):
    arrays = _upstream_fashion_mnist(tmp_path / "upstream", monkeypatch)
    served = _torchvision_serving(tmp_path / "upstream", monkeypatch)
    files = fetch.fetch("fashion_mnist")
    raw = cache / "fashion_mnist" / "FashionMNIST" / "raw"
    assert files == [raw / stem for stem in arrays]  # torchvision unpacked the .gz files beside them
    assert sorted(served) == sorted(f"{stem}.gz" for stem in arrays)
    message = capsys.readouterr().err
    assert "apt-get is not available" in message and f"downloading Fashion-MNIST with torchvision instead (internet, " \
                                                      f"md5-checked) into {cache / 'fashion_mnist'}" in message
    test = data.fashion_mnist("test")
    assert len(test) == 2 and test[1][1] == 7
    np.testing.assert_array_equal(test.images[..., 0], arrays["t10k-images-idx3-ubyte"])
    fetch.fetch("fashion_mnist")  # verified files: nothing downloaded again
    assert len(served) == 4
    (raw / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([5, 8])))
    (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(fetch.DataError, match="t10k-labels-idx1-ubyte is missing or corrupt"):
        data.fashion_mnist("test")


def test_torchvision_checks_the_md5_it_has_for_the_upstream_files():
    mnist = pytest.importorskip("torchvision.datasets.mnist")
    assert dict(mnist.FashionMNIST.resources) == fetch.TORCHVISION_FASHION_MNIST_MD5


def test_fashion_mnist_with_neither_route_names_both(cache, no_apt, monkeypatch, tmp_path):
    mnist = pytest.importorskip("torchvision.datasets.mnist")

    def offline(url, **kwargs):
        raise RuntimeError(f"Error downloading {url}: <urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(mnist, "download_and_extract_archive", offline)
    with pytest.raises(fetch.DataError) as error:
        fetch.fetch("fashion_mnist")
    message = str(error.value)
    assert message.startswith("cannot fetch Fashion-MNIST either way. Debian's package: cannot download "
                              "dataset-fashion-mnist=")
    assert "apt-get is not available" in message and "torchvision: torchvision could not download FashionMNIST: " \
                                                      "Error downloading" in message
    assert message.endswith(f"or copy torchvision's files into {cache / 'fashion_mnist' / 'FashionMNIST' / 'raw'}")


def test_debian_and_torchvision_bytes_are_the_same_images():
    """The Debian package's .gz files (their sha256 in FILES) unpack to the IDX bytes of FASHION_MNIST_IDX
    (checked on the fetched files where they are here)."""
    try:
        files = [fetch.path_of(f"{stem}.gz") for stem in fetch.FASHION_MNIST_IDX]
    except fetch.DataError:
        pytest.skip("Debian's Fashion-MNIST files are not fetched here")
    for stem, path in zip(fetch.FASHION_MNIST_IDX, files):
        assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == fetch.FASHION_MNIST_IDX[stem]


# --- IMDb: the hub's files at the pinned revision ------------------------------------------------------

def _hub_serving(monkeypatch, content: bytes):
    """huggingface_hub's download, serving ``content`` for every file; returns the calls."""
    hub = pytest.importorskip("huggingface_hub")
    calls = []

    def hf_hub_download(repo_id, filename, *, repo_type, revision, local_dir):
        calls.append((repo_id, filename, repo_type, revision))
        path = Path(local_dir) / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return str(path)

    monkeypatch.setattr(hub, "hf_hub_download", hf_hub_download)
    return calls


def test_imdb_is_downloaded_at_the_pinned_revision_and_checked(cache, monkeypatch):
    frame = pd.DataFrame({"text": ["good", "bad"], "label": [1, 0]})
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    calls = _hub_serving(monkeypatch, buffer.getvalue())
    with pytest.raises(fetch.DataError, match=r"the downloaded plain_text/train-00000-of-00001.parquet of "
                                             r"stanfordnlp/imdb at e6281661ce1c\w+ has sha256 \w+, expected db47d16b"):
        fetch.fetch("imdb")
    assert not (cache / "imdb" / "plain_text" / "train-00000-of-00001.parquet").exists()  # not left to be read
    assert calls == [("stanfordnlp/imdb", "plain_text/train-00000-of-00001.parquet", "dataset", fetch.IMDB_REVISION)]
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    monkeypatch.setattr(fetch, "IMDB_FILES", dict.fromkeys(fetch.IMDB_FILES, digest))
    ds = data.imdb(validation=0.5)  # nothing local: fetched first
    assert sorted(ds["test"]["text"]) == ["bad", "good"] and len(calls) == 3
    fetch.fetch("imdb")
    assert len(calls) == 3


def test_a_corrupt_hub_file_is_refused_and_other_files_are_read_as_given(cache, tmp_path, capsys):
    plain = tmp_path / "imdb" / "plain_text"
    plain.mkdir(parents=True)
    pd.DataFrame({"text": ["good", "bad"], "label": [1, 0]}).to_parquet(plain / "train-00000-of-00001.parquet")
    pd.DataFrame({"text": ["fine"], "label": [1]}).to_parquet(plain / "test-mine.parquet")
    with pytest.raises(fetch.DataError, match=r"train-00000-of-00001.parquet does not match the sha256 of "
                                             r"stanfordnlp/imdb's plain_text/train-00000-of-00001.parquet at e6281661"):
        data.imdb(local_dir=tmp_path / "imdb")
    (plain / "train-00000-of-00001.parquet").rename(plain / "train-mine.parquet")
    ds = data.imdb(local_dir=tmp_path / "imdb", validation=0.5)
    assert ds["test"]["text"] == ["fine"]
    assert f"imdb: reading train-mine.parquet, test-mine.parquet in {plain} as given" in capsys.readouterr().err


# --- what the chapters read (the chapters' data: tests/test_chapters.py) ------------------------------

def test_the_paper_profile_fetches_per_chapter_without_apt(fixture_data, no_apt, monkeypatch, capsys):
    commands = []
    monkeypatch.setattr(fetch.subprocess, "run", lambda command, **kw: commands.append(command))
    for chapter in chapters.CHAPTERS:
        fetch.ensure(chapter.needed(profiles.executed_parameters(chapter.name, "paper")))
    assert commands == []  # the registry files are cached; nothing else is fetched ahead, apt never runs
    told = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in told] == ["imdb", "cifar10", "cifar100"]
    assert told[0] == (f"imdb: not in {fixture_data}; downloaded at use: IMDb's two parquet files (41 MB) from the "
                       "Hugging Face hub (stanfordnlp/imdb at e6281661ce1c, sha256-checked)")
