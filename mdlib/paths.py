"""Where things live: the repository root and the build outputs.

The build directory is ``$MDLIB_BUILD_DIR`` when set, else ``<repo>/_build``. The functions read the
environment variable at call time, so a test (or a user) can redirect every output by setting it.

    <build>/figures/<label>.png, .pdf   figures saved by ``mdlib.plots.save_figure``
    <build>/results/<label>.csv         the numbers behind each figure and table
    <build>/{figures,results}/<label>.json   their provenance records (``mdlib.provenance``)
    <build>/artifacts.zip               every figure, table and record (``python -m mdlib book``)
    <build>/runs/<kind>/<hash>/         the results store (``mdlib.runs``)
    <build>/checkpoints/<kind>/<hash>/  checkpoints of unfinished training runs (``mdlib.train.run``)
    <build>/html/index.html             the book, when the build directory is named ``_build``
"""

from __future__ import annotations

import os
from pathlib import Path

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
