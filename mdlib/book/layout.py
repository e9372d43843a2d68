"""The book's folders: its sources in the project (``notebooks/``, ``params/``, ``book/``) and what a
build makes of them in the build directory (``figures/``, ``results/``, the HTML).

Where the project and the build directory are, the results store, the data cache and a notebook's
output directory are ``mdlib.experiments.paths``' (``root``, ``build_dir``, ``runs_dir``,
``output_dir``): the experiments need those, and none of these. Every function reads the environment
at call time (``$MDLIB_ROOT``, ``$MDLIB_BUILD_DIR``), as ``paths`` does.
"""

from __future__ import annotations

from pathlib import Path

from mdlib.experiments import paths

__all__ = ["book_dir", "figures_dir", "html_dir", "jupyter_book_output", "notebooks_dir", "params_dir", "results_dir"]


def notebooks_dir() -> Path:
    """Jupytext sources of the book's chapters (``NN_name.py``) and their executed ``.ipynb``."""
    return paths.root() / "notebooks"


def params_dir() -> Path:
    """Parameter profiles: ``params/<profile>.yaml``."""
    return paths.root() / "params"


def book_dir() -> Path:
    """Prose pages of the book."""
    return paths.root() / "book"


def figures_dir() -> Path:
    """``<build>/figures``: every figure, as PNG and PDF, under the label the book cites."""
    return paths.build_dir() / "figures"


def results_dir() -> Path:
    """``<build>/results``: the CSV behind each figure and table, and its provenance record."""
    return paths.build_dir() / "results"


def html_dir() -> Path:
    """Where ``jupyter-book build`` writes the HTML book.

    Jupyter Book always writes to ``<path-output>/_build/html``: with the default build directory
    (or any build directory named ``_build``) that is ``<build>/html``, otherwise
    ``<build>/_build/html``.
    """
    build = paths.build_dir()
    return build / "html" if build.name == "_build" else build / "_build" / "html"


def jupyter_book_output() -> Path:
    """The ``--path-output`` to hand to ``jupyter-book build`` so that HTML lands in ``html_dir()``."""
    build = paths.build_dir()
    return build.parent if build.name == "_build" else build
