"""Where things live (the repository root, the build outputs) and how a file gets there: atomically.

The build directory is ``$MDLIB_BUILD_DIR`` when set, else ``<repo>/_build``. The functions read the
environment variable at call time, so a test (or a user) can redirect every output by setting it.

    <build>/figures/<label>.png, .pdf   figures saved by ``mdlib.plots.save_figure``
    <build>/results/<label>.csv         the numbers behind each figure and table
    <build>/{figures,results}/<label>.json   their provenance records (``mdlib.provenance``)
    <build>/artifacts.zip               every figure, table and record (``python -m mdlib book``)
    <build>/runs/<kind>/<hash>/         the results store (``mdlib.runs``)
    <build>/checkpoints/<kind>/<hash>/  checkpoints of unfinished training runs (``mdlib.runs.run``)
    <build>/html/index.html             the book, when the build directory is named ``_build``

Every file mdlib writes goes through ``atomic_write``: a reader (or a killed writer) sees the old file
or the complete new one, never half of it; ``all_or_nothing`` extends that to every file a block of
work writes into some folders (a chapter's figures and results).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

#: The repository root (the folder holding ``mdlib/``, ``notebooks/``, ``params/``, ``_config.yml``).
ROOT = Path(__file__).resolve().parent.parent
#: Jupytext sources of the book's chapters (``NN_name.py``) and their executed ``.ipynb``.
NOTEBOOKS = ROOT / "notebooks"
#: Parameter profiles: ``params/<profile>.yaml``.
PARAMS = ROOT / "params"
#: Prose pages of the book.
BOOK = ROOT / "book"

BUILD_ENV = "MDLIB_BUILD_DIR"


def build_dir() -> Path:
    """``$MDLIB_BUILD_DIR`` (made absolute) or ``<repo>/_build``."""
    value = os.environ.get(BUILD_ENV)
    return Path(value).expanduser().resolve() if value else ROOT / "_build"


def figures_dir() -> Path:
    return build_dir() / "figures"


def results_dir() -> Path:
    return build_dir() / "results"


def runs_dir() -> Path:
    return build_dir() / "runs"


def checkpoints_dir() -> Path:
    return build_dir() / "checkpoints"


def html_dir() -> Path:
    """Where ``jupyter-book build`` writes the HTML book.

    Jupyter Book always writes to ``<path-output>/_build/html``: with the default build directory
    (or any build directory named ``_build``) that is ``<build>/html``, otherwise
    ``<build>/_build/html``.
    """
    build = build_dir()
    return build / "html" if build.name == "_build" else build / "_build" / "html"


def jupyter_book_output() -> Path:
    """The ``--path-output`` to hand to ``jupyter-book build`` so that HTML lands in ``html_dir()``."""
    build = build_dir()
    return build.parent if build.name == "_build" else build


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object], *, tag: str = "tmp") -> Path:
    """Call ``write(tmp)`` on the temporary sibling ``.<stem>.<pid>.<tag><suffix>`` of ``path`` (same
    folder, same suffix), flush it to disk, then move it over ``path`` with one ``os.replace``; returns
    ``path``.

    ``path`` is either the previous file or the complete new one. If ``write`` raises, the temporary
    file is removed (unless ``write`` moved it elsewhere first, e.g. to keep a failed output) and the
    error propagates; the parent folder is created when missing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{tag}{path.suffix}")
    try:
        write(tmp)
        with open(tmp, "r+b") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _files(folder: Path) -> dict[str, Path]:
    return {path.relative_to(folder).as_posix(): path for path in folder.rglob("*") if path.is_file()} \
        if folder.is_dir() else {}


def _roll_back(journal: Path, folders: dict[str, Path]) -> None:
    """Put every file of ``folders`` back as the snapshot in ``journal`` holds it, then drop the journal."""
    for name, folder in folders.items():
        saved, now = _files(journal / name), _files(folder)
        for rel, path in now.items():
            if rel not in saved:
                path.unlink()
        for rel, old in saved.items():
            target = folder / rel
            if rel not in now or not os.path.samefile(old, target):
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(old, target)
    shutil.rmtree(journal)


def recover(journal: Path, folders: dict[str, Path]) -> bool:
    """Undo the writes of a block of ``all_or_nothing(folders, journal)`` whose process was killed;
    returns whether there was one."""
    journal = Path(journal)
    partial = journal.with_name(journal.name + ".partial")
    if partial.exists():  # killed while taking the snapshot: nothing was written yet
        shutil.rmtree(partial)
    if not journal.exists():
        return False
    _roll_back(journal, folders)
    return True


@contextlib.contextmanager
def all_or_nothing(folders: dict[str, Path], journal: Path) -> Iterator[None]:
    """Keep what the block writes into ``folders`` (name -> folder) only if it finishes: if it raises,
    every file there is put back byte for byte as it was on entry and the files it added are removed.

    On entry the files are hard-linked into the snapshot ``journal`` (no copy, so it works on a full
    disk; sound because mdlib replaces files with ``atomic_write`` instead of editing them in place).
    A journal left by a killed process is rolled back on the next entry, so its half-written outputs
    never outlive it. Returns, on success, with the journal removed.
    """
    journal = Path(journal)
    recover(journal, folders)
    partial = journal.with_name(journal.name + ".partial")
    for name, folder in folders.items():
        for rel, path in _files(folder).items():
            link = partial / name / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, link)
    partial.mkdir(parents=True, exist_ok=True)
    os.replace(partial, journal)
    try:
        yield
    except BaseException:
        _roll_back(journal, folders)
        raise
    shutil.rmtree(journal)
