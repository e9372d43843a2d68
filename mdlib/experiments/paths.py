"""Where things live: the book project, the build outputs, the data cache.

The library (the optimizer, the mirror maps, the SVM solvers, the models) needs none of this: nothing
here runs on import, and only the book and the experiments' stores ask for a folder.

**The project** (:func:`root`) is the folder of the book: ``_config.yml``, ``notebooks/``, ``params/``,
``book/``, ``data/``. It is, the first that applies:

1. the ``--root`` of the command line (``python -m mdlib --root DIR ...``; :func:`using_root`);
2. ``$MDLIB_ROOT``;
3. the checkout that holds this package, when it is one (running from the checkout, an editable
   install);
4. the working directory or the nearest of its parents that is a project;

a folder is a project when it holds ``_config.yml``, ``notebooks/`` and ``params/``. An explicit
folder (1, 2) that is not one is an error, and so is finding none (:class:`ProjectNotFound` says what
to do). A non-editable install is found only by 1, 2 or 4: its package folder (site-packages) never is.
The book's own folders in it and in the build directory are named below (:func:`notebooks_dir`,
:func:`params_dir`, :func:`book_dir`, :func:`figures_dir`, :func:`results_dir`, :func:`html_dir`).

**The build directory** is ``$MDLIB_BUILD_DIR`` when set, else ``<project>/_build``, else (no project:
the experiments used as a library) ``<user cache>/build``. **The user cache** is
``$XDG_CACHE_HOME/mdlib`` or ``~/.cache/mdlib`` (:func:`user_cache_dir`; ``mdlib.experiments.fetch.data_dir``
keeps the data there outside a project). Every function reads the environment at call time, so a
test (or a user) can redirect every output by setting a variable. Nothing is ever written into the
installed package.

    <build>/figures/<label>.png, .pdf   the book's figures, saved by ``mdlib.book.artifacts.save_figure``
    <build>/results/<label>.csv         the numbers behind each figure and table
    <build>/{figures,results}/<label>.json   their provenance records (``mdlib.book.provenance``)
    <build>/artifacts.zip               every figure, table and record (``python -m mdlib book``)
    <build>/runs/<kind>/<hash>/         the results store (``mdlib.runs.store``)
    <build>/checkpoints/<kind>/<hash>/  checkpoints of unfinished training runs (``mdlib.runs.pool.run``)
    <build>/html/index.html             the book, when the build directory is named ``_build``
    <build>/variants/<name>-<hash>/     a chapter executed with overrides (``python -m mdlib run -p``)
    <build>/scratch/                    what a notebook executed outside ``python -m mdlib`` saves

**The output directory** (:func:`output_dir`) is where a notebook's writers (``mdlib.book.artifacts``'
save functions, the provenance records, the chapter's own scorecard verdicts) put and read its
``figures/`` and ``results/``: ``$MDLIB_OUTPUT_DIR`` when set, else ``<build>/scratch``. The book's
readers (the scorecard page, the archive, the consistency checks) read the build directory's
(:func:`figures_dir`, :func:`results_dir`). ``python -m mdlib run`` and ``book`` set
``$MDLIB_OUTPUT_DIR`` for the kernel: the build directory for the book's own executions (a profile,
no overrides), a variant folder otherwise; so a notebook executed any other way (papermill's own
command, Jupyter, a script) never writes over the book's figures. The results store and the
checkpoints (``runs/``, ``checkpoints/``) are the build directory's for every execution: runs are
keyed by their configuration, so a variant reuses the runs it shares with the book and overwrites none.

Every file mdlib writes goes through ``mdlib.runs.files.atomic_write``: a reader (or a killed writer)
sees the old file or the complete new one, never half of it (a chapter's files as a whole:
``mdlib.book.execute``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator

#: The installed (or checked-out) package ``mdlib/`` itself; its parent is what ``import mdlib`` needs on
#: the path. Not the project: see :func:`root`.
PACKAGE_DIR = Path(__file__).resolve().parent.parent

ROOT_ENV = "MDLIB_ROOT"
#: Set by ``mdlib book`` for the chapters it runs as processes (``mdlib run``): the pid they stop with.
PARENT_ENV = "MDLIB_PARENT_PID"
BUILD_ENV = "MDLIB_BUILD_DIR"
OUTPUT_ENV = "MDLIB_OUTPUT_DIR"
CACHE_ENV = "XDG_CACHE_HOME"
#: What makes a folder a book project: these files and folders.
PROJECT_FILES = ("_config.yml",)
PROJECT_FOLDERS = ("notebooks", "params")

_override: list[Path] = []  # the --root of the command line, innermost last (using_root)


class ProjectNotFound(LookupError):
    """No book project (``_config.yml``, ``notebooks/``, ``params/``) was found; the message says how
    to point mdlib at one."""


def is_project(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds ``_config.yml``, ``notebooks/`` and ``params/``."""
    folder = Path(folder)
    return all((folder / name).is_file() for name in PROJECT_FILES) and \
        all((folder / name).is_dir() for name in PROJECT_FOLDERS)


def _must_be_project(folder: Path, given: str) -> Path:
    folder = folder.expanduser().resolve()
    if not is_project(folder):
        missing = [f for f in PROJECT_FILES if not (folder / f).is_file()] + \
            [f"{f}/" for f in PROJECT_FOLDERS if not (folder / f).is_dir()]
        raise ProjectNotFound(f"{given} is {folder}, which is not a checkout of the book: it has no "
                              f"{', '.join(missing)}. Point it at the folder that holds _config.yml, "
                              "notebooks/ and params/")
    return folder


def find_root(cwd: str | os.PathLike | None = None) -> Path | None:
    """The project by the rules of this module's docstring (``cwd``: the working directory to search
    from, ``os.getcwd()`` by default); None when there is none, ``ProjectNotFound`` when ``--root`` or
    ``$MDLIB_ROOT`` names a folder that is not one."""
    if _override:
        return _must_be_project(_override[-1], "--root")
    value = os.environ.get(ROOT_ENV)
    if value:
        return _must_be_project(Path(value), f"${ROOT_ENV}")
    checkout = PACKAGE_DIR.parent
    if is_project(checkout):
        return checkout
    here = Path(cwd if cwd is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if is_project(folder):
            return folder
    return None


def root() -> Path:
    """The book project (see the module's docstring); ``ProjectNotFound`` when there is none."""
    found = find_root()
    if found is None:
        raise ProjectNotFound(
            f"no checkout of the book found: mdlib looked for a folder holding _config.yml, notebooks/ and "
            f"params/ in --root, ${ROOT_ENV}, the checkout this mdlib was imported from ({PACKAGE_DIR.parent}) "
            f"and the working directory {os.getcwd()} and its parents. Run the command inside a checkout of "
            f"the book, set {ROOT_ENV}=/path/to/the/checkout, or pass --root /path/to/the/checkout. (The "
            "library itself, the optimizer, SVM solvers and models, needs no checkout.)")
    return found


@contextlib.contextmanager
def using_root(folder: str | os.PathLike | None) -> Iterator[None]:
    """Within the block, :func:`root` is ``folder`` (checked to be a project; the command line's
    ``--root``); None changes nothing."""
    if folder is None:
        yield
        return
    _override.append(_must_be_project(Path(folder), "--root"))
    try:
        yield
    finally:
        _override.pop()


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/mdlib`` or ``~/.cache/mdlib``: mdlib's folder outside a project (a relative
    ``XDG_CACHE_HOME`` is ignored, as the XDG base directory specification says)."""
    value = Path(os.environ.get(CACHE_ENV) or "").expanduser()
    base = value if value.is_absolute() else Path.home() / ".cache"
    return base.resolve() / "mdlib"


def data_file(name: str) -> Path:
    """A tracked data file ``data/<name>`` (the token-selection sentences): the project's copy inside a
    project, else the copy the installed package carries (``mdlib/_data/``, from the same file)."""
    found = find_root()
    if found is not None and (found / "data" / name).is_file():
        return found / "data" / name
    packaged = PACKAGE_DIR / "_data" / name
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(f"data/{name} is neither in a checkout of the book nor installed with mdlib "
                            f"({packaged}); reinstall the package or run inside a checkout")


def located(env: str, in_project: str, in_cache: str = "") -> Path:
    """``$env`` (made absolute), else ``<project>/<in_project>`` inside a project, else
    ``<user cache>/<in_cache>``: where a folder of mdlib's lives, never inside the installed package."""
    value = os.environ.get(env)
    if value:
        return Path(value).expanduser().resolve()
    found = find_root()
    return found / in_project if found is not None else user_cache_dir() / in_cache


def build_dir() -> Path:
    """``$MDLIB_BUILD_DIR`` (made absolute), else ``<project>/_build``, else ``<user cache>/build``."""
    return located(BUILD_ENV, "_build", "build")


def output_dir() -> Path:
    """``$MDLIB_OUTPUT_DIR`` (made absolute), else ``<build>/scratch``: where a notebook's figures and
    results go (see the module's docstring; ``python -m mdlib run`` sets the variable for its kernel)."""
    value = os.environ.get(OUTPUT_ENV)
    return Path(value).expanduser().resolve() if value else build_dir() / "scratch"


def _build_folder(name: str, holds: str) -> Callable[[], Path]:
    """The function ``<name>_dir()``: the folder ``<build>/<name>``, which holds ``holds``."""
    def folder() -> Path:
        return build_dir() / name

    folder.__name__ = folder.__qualname__ = f"{name}_dir"
    folder.__doc__ = f"``<build>/{name}``: {holds}."
    return folder


runs_dir = _build_folder("runs", "the results store, one entry per run (``mdlib.runs.store``)")
checkpoints_dir = _build_folder("checkpoints", "the checkpoint of every training run still going")


# ---------------------------------------------------------------------------------------------
# the book's folders: its sources in the project, what a build makes of them


def notebooks_dir() -> Path:
    """Jupytext sources of the book's chapters (``NN_name.py``) and their executed ``.ipynb``."""
    return root() / "notebooks"


def params_dir() -> Path:
    """Parameter profiles: ``params/<profile>.yaml``."""
    return root() / "params"


def book_dir() -> Path:
    """Prose pages of the book."""
    return root() / "book"


def figures_dir(folder: str | os.PathLike | None = None) -> Path:
    """``<folder>/figures``: every figure, as PNG and PDF, under the label the book cites, and its
    provenance record; ``folder``: the build directory when None (the book's), a notebook's
    :func:`output_dir` for its writers, a chapter's staging folder."""
    return Path(folder if folder is not None else build_dir()) / "figures"


def results_dir(folder: str | os.PathLike | None = None) -> Path:
    """``<folder>/results``: the CSV behind each figure and table, and its provenance record; ``folder``
    as for :func:`figures_dir`."""
    return Path(folder if folder is not None else build_dir()) / "results"


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
