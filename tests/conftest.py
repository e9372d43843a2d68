"""Shared fixtures and helpers."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from mdlib.experiments import fetch

FIXTURES = Path(__file__).parent / "fixtures" / "data"
HTML = "<img src=x onerror=alert(1)>"  #: user-given text that would run in the reader's browser


@pytest.fixture(scope="session", autouse=True)
def xdist_groups_hold(request):
    """Under ``--dist loadgroup`` a worker tags each test of an ``xdist_group`` with ``@group`` in its node
    id, which the scheduler reads; a test without the tag is scheduled alone. Fail the run before any
    group's fixture is built if the tags were lost: every worker would build the wheel's venv with torch
    (gigabytes), the smoke book and the paper profile again."""
    if not getattr(request.config.option, "loadgroup", False):  # not an xdist worker of a loadgroup run
        return
    lost = [item.nodeid for item in request.session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        import xdist

        pytest.fail(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} drops the xdist_group "
                    f"of {len(lost)} tests (e.g. {lost[0]}), so --dist loadgroup would run each group on every "
                    "worker (pytest-dev/pytest-xdist#1386): install the versions pyproject.toml's test extra "
                    "allows (make test does), or run without -n", pytrace=False)


def raw_html(text: str) -> list[str]:
    """The raw HTML a markdown page passes through to the browser (MyST keeps it as HTML)."""
    tokens = pytest.importorskip("markdown_it").MarkdownIt("commonmark").enable("table").parse(text)
    inline = [child for t in tokens for child in t.children or []]
    return [t.content for t in tokens + inline if t.type in ("html_block", "html_inline")]


@pytest.fixture
def build_dir(tmp_path, monkeypatch):
    """A temporary build directory, also the output directory (as in the book's own executions)."""
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("MDLIB_OUTPUT_DIR", str(tmp_path / "out"))
    return tmp_path / "out"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty data cache, with the fixture files' checksums standing in for the real ones."""
    monkeypatch.setenv("MDLIB_DATA_DIR", str(tmp_path / "cache"))
    files = dict(fetch.FILES)
    for name in ("movieReviewSnippets_GroundTruth.txt", "vader_lexicon.txt", "vocab.txt"):
        digest = hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest()
        files[name] = fetch.RegistryFile(**{**files[name].__dict__, "sha256": digest})
    monkeypatch.setattr(fetch, "FILES", files)
    return tmp_path / "cache"


def path_without_apt(folder: Path) -> str:
    """A PATH of one folder, ``folder``, holding a link to every program on the current PATH except
    Debian's apt tools (apt, apt-get, apt-cache, ...): a machine without apt (RHEL, macOS) for
    subprocesses, with python, git and the rest as they are."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if not entry.name.startswith("apt") and not link.exists() and os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    assert shutil.which("apt-get", path=str(folder)) is None
    return str(folder)


@pytest.fixture
def no_apt(tmp_path, monkeypatch):
    """PATH without apt-get (``path_without_apt``)."""
    monkeypatch.setenv("PATH", path_without_apt(tmp_path / "bin-without-apt"))


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes, as in the MNIST / Fashion-MNIST distributions."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def install_idx(cache: Path, monkeypatch, arrays: dict[str, np.ndarray]) -> None:
    """Write each array as the gzipped IDX file ``name`` into ``cache`` and register its sha256 as the
    expected one (Fashion-MNIST stand-ins)."""
    cache.mkdir(parents=True, exist_ok=True)
    patched = dict(fetch.FILES)
    for name, array in arrays.items():
        content = gzip.compress(idx_bytes(array))
        (cache / name).write_bytes(content)
        patched[name] = fetch.RegistryFile(**{**patched[name].__dict__, "sha256": hashlib.sha256(content).hexdigest()})
    monkeypatch.setattr(fetch, "FILES", patched)


@pytest.fixture
def fixture_data(cache, monkeypatch, tmp_path):
    """The fixture snippets, lexicon and 15-entry vocabulary as the fetched data."""
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("movieReviewSnippets_GroundTruth.txt", "vader_lexicon.txt", "vocab.txt"):
        (cache / name).write_bytes((FIXTURES / name).read_bytes())
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    from mdlib.experiments import sentiment

    sentiment.splits.cache_clear()
    sentiment.tokenizer.cache_clear()
    yield cache
    sentiment.splits.cache_clear()
    sentiment.tokenizer.cache_clear()
