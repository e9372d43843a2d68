"""Fetching from package registries: checksums, extraction, caching, and errors that name the fix
(no network: the downloads are faked)."""

import hashlib
import io
import subprocess
import tarfile

import pytest

from conftest import FIXTURES
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
    monkeypatch.setattr(fetch, "FETCHABLE", {n: [patched[f.name] for f in fs] for n, fs in fetch.FETCHABLE.items()})
    files = fetch.fetch("rotten_tomatoes", download=download)
    assert [p.name for p in files] == ["movieReviewSnippets_GroundTruth.txt", "vader_lexicon.txt"]
    assert calls[-1] == ("vadersentiment==3.3.2", "sdist")
    assert data.sentiment_lexicon()["amazing"] == 2.8
    fetch.fetch("rotten_tomatoes", download=download)  # intact files: nothing downloaded again
    assert len(calls) == 2
    with pytest.raises(ValueError, match="fetchable"):
        fetch.fetch("cifar10")


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
    with pytest.raises(fetch.DataError, match=r"fetch fashion_mnist` \(it downloads dataset-fashion-mnist=\S+ from "
                                             r"Debian's package archive with apt-get and checks sha256\)"):
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
