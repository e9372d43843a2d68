"""Shared fixtures."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mdlib import data

FIXTURES = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty data cache, with the fixture files' checksums standing in for the real ones."""
    monkeypatch.setenv("MDLIB_DATA_DIR", str(tmp_path / "cache"))
    files = dict(data.FILES)
    for name in ("movieReviewSnippets_GroundTruth.txt", "vader_lexicon.txt", "vocab.txt"):
        digest = hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest()
        files[name] = data.RegistryFile(**{**files[name].__dict__, "sha256": digest})
    monkeypatch.setattr(data, "FILES", files)
    monkeypatch.setattr(data, "FETCHABLE", {n: [files[f.name] for f in fs] for n, fs in data.FETCHABLE.items()})
    return tmp_path / "cache"


