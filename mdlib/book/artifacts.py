"""Saving the book's figures and tables under stable labels, with their provenance, and glueing them
into the chapter (drawing them is ``mdlib.book.plots``').

In a notebook::

    from mdlib.book import artifacts
    artifacts.save_figure(fig, "fig-e1-divergence", data=tidy_df)

writes ``<output>/figures/fig-e1-divergence.png`` and ``.pdf``, ``<output>/results/fig-e1-divergence.csv``
(the numbers behind the figure; ``<output>`` is ``mdlib.experiments.paths.output_dir()``, the build
directory when ``python -m mdlib book`` or ``run`` executes the book's chapter), their provenance record
``fig-e1-divergence.json`` beside the PNG and the CSV (``mdlib.book.provenance``), glues the figure under
its label (hidden in the cell output) and closes it. A markdown cell then shows it as a numbered figure::

    ```{glue:figure} fig-e1-divergence
    :name: fig-e1-divergence

    Caption (a caption is what makes the figure numbered).
    ```

and text refers to it with ``{numref}`fig-e1-divergence```. ``save_table`` does the same for a
DataFrame (CSV + glued HTML table): the evidence the scorecard reads; the book numbers a label that
starts with ``table-`` as a table ("Table 4.1", ``book/_ext/mdlib_artifacts.py``). Every glued artifact
carries ``metadata["mdlib"]`` = ``{"kind", "label", "files"}`` (files relative to the output directory) in
the executed notebook; the book test reads it to check that the announced files exist. ``glue_paper``
glues the paper's numbers as the chapters quote them.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mdlib.book import provenance
from mdlib.book.scorecard import schema
from mdlib.experiments import paper, paths
from mdlib.runs.files import atomic_write

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from pandas.io.formats.style import Styler
    from seaborn.axisgrid import Grid

__all__ = ["DPI", "LABEL_RE", "Saved", "glue_paper", "save_figure", "save_table"]

DPI = 150  #: the saved PNGs' resolution (and the theme's ``savefig.dpi``, ``plots.set_theme``)
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  #: a label: a file name, a glue key and a reference target


@dataclass(frozen=True)
class Saved:
    """What ``save_figure`` / ``save_table`` wrote: the label and absolute paths."""

    label: str
    kind: str
    files: dict[str, Path] = field(default_factory=dict)

    def __repr__(self) -> str:
        names = ", ".join(path.name for path in self.files.values())
        return f"saved {self.kind} {self.label}: {names}"

    def _ipython_display_(self) -> None:
        """Show nothing when it ends a cell: the book shows the figure through ``{glue:figure}``."""


class _Glued:
    """What gets glued: the saved image or HTML table plus ``mdlib`` metadata (IPython display protocol)."""

    def __init__(self, bundle: dict, saved: Saved):
        self._bundle = bundle
        self._saved = saved

    def _repr_mimebundle_(self, include=None, exclude=None):
        output = paths.output_dir()
        files = []
        for path in self._saved.files.values():
            try:
                files.append(path.relative_to(output).as_posix())
            except ValueError:
                files.append(str(path))
        meta = {"mdlib": {"kind": self._saved.kind, "label": self._saved.label, "files": files}}
        return dict(self._bundle), meta


def _check_label(label: str) -> str:
    if not isinstance(label, str) or not LABEL_RE.match(label):
        raise ValueError(
            f"invalid label {label!r}: use letters, digits, '-', '_' or '.', starting with a letter "
            "or digit (it becomes a file name, a glue key and a cross-reference target), "
            "e.g. 'fig-e1-divergence'"
        )
    return label


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipykernel
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _glue(label: str, obj: _Glued) -> None:
    if not _in_kernel():
        return
    from myst_nb import glue

    glue(label, obj, display=False)


def glue_paper() -> None:
    """Glue the paper's numbers as the chapters quote them (``mdlib.experiments.paper.quotes``), each
    under its name, for ``{glue:text}`` in a chapter's prose (nothing outside a kernel). Returns
    nothing, so that a cell ending with it prints nothing."""
    if _in_kernel():
        from myst_nb import glue

        for name, text in paper.quotes().items():
            glue(name, text, display=False)


def _meaningful_index(frame) -> bool:
    """Write/show the index only when it carries information (named, a MultiIndex, or not integers)."""
    import pandas as pd

    index = frame.index
    return any(name is not None for name in index.names) or not pd.api.types.is_integer_dtype(index)


def _write_csv(frame, label: str) -> Path:
    """Write ``frame`` as ``<output>/results/<label>.csv`` (``paths.output_dir``); refused (ValueError, nothing written) when the
    label has a results schema (``mdlib.book.scorecard.schema.TABLES``) and the file as written breaks it."""
    import pandas as pd

    if isinstance(frame, pd.Series):
        frame = frame.to_frame()
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"data must be a pandas DataFrame (tidy, one row per point), got {type(frame).__name__}")

    def write(tmp: Path) -> None:
        frame.to_csv(tmp, index=_meaningful_index(frame))
        if label not in schema.TABLES:
            return
        try:
            schema.read(tmp, label)
        except schema.SchemaError as error:
            raise ValueError(f"{label} not saved: {error}. Fix the table, or its rule in "
                             "mdlib.book.scorecard.schema.TABLES if the rule is wrong") from None

    return atomic_write(paths.results_dir(paths.output_dir()) / f"{label}.csv", write)


def save_figure(fig: Figure | Axes | Grid, label: str, data: pd.DataFrame | pd.Series | None = None, *,
                close: bool = True, glue: bool = True) -> Saved:
    """Save ``fig`` as ``<output>/figures/<label>.png`` (150 dpi) and ``.pdf``; with ``data`` (a tidy
    DataFrame: the numbers plotted) also ``<output>/results/<label>.csv``; the provenance record
    (``mdlib.book.provenance``) goes to ``<output>/figures/<label>.json`` (and beside the CSV) and into the
    PNG's ``Provenance`` text chunk and the PDF's ``Subject``. ``<output>`` is ``paths.output_dir()``: the
    build directory in the book's executions, a variant's folder, or ``<build>/scratch`` outside
    ``python -m mdlib run``. In a notebook the figure is
    glued under ``label`` (not displayed in the cell; show it with a ``{glue:figure}`` directive), and
    closed so the inline backend does not show it a second time. Returns the paths written.

    ``fig`` may also be anything with a ``.figure`` (a seaborn FacetGrid, an Axes).
    """
    from matplotlib.figure import Figure

    _check_label(label)
    if not isinstance(fig, Figure):
        inner = getattr(fig, "figure", None)
        if not isinstance(inner, Figure):
            raise TypeError(f"save_figure needs a matplotlib Figure (or a seaborn grid), got {type(fig).__name__}")
        fig = inner
    figures = paths.figures_dir(paths.output_dir())
    files = {"png": figures / f"{label}.png", "pdf": figures / f"{label}.pdf"}
    if data is not None:
        files["csv"] = _write_csv(data, label)  # first: the record holds its hash
    record = provenance.record(label, "figure", files)
    text = provenance.dumps(record)
    png = atomic_write(files["png"], lambda tmp: fig.savefig(
        tmp, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None, "Provenance": text}))
    atomic_write(files["pdf"], lambda tmp: fig.savefig(
        tmp, format="pdf", bbox_inches="tight", metadata={
            "CreationDate": None, "Title": label, "Subject": text, "Creator": f"mdlib {record['versions']['mdlib']}"}))
    provenance.write(record, has_csv=data is not None)
    saved = Saved(label, "figure", files)
    if glue:
        bundle = {"image/png": base64.b64encode(png.read_bytes()).decode("ascii"),
                  "text/plain": f"<figure {label}>"}
        _glue(label, _Glued(bundle, saved))
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return saved


def save_table(df: pd.DataFrame | pd.Series, label: str, *, styled: Styler | None = None, float_format: str = "{:.4g}",
               index: bool | None = None, glue: bool = True, absent: str | None = None) -> Saved:
    """Save ``df`` as ``<output>/results/<label>.csv`` (``paths.output_dir``) with its provenance record (``mdlib.book.provenance``)
    beside it, ``<label>.json``, and glue it as an HTML table under ``label``. An empty ``df`` with
    ``absent`` given is saved as the placeholder ``note`` table that says why (``schema.placeholder``).

    ``styled`` is an optional pandas ``Styler`` (or any object with ``to_html()``) to display instead
    of the plain table, e.g. with "mean ± std" formatting; the CSV always holds ``df``'s raw numbers.
    Show it with ``{glue:figure}`` (numbered, with a caption) or ``{glue}``.
    """
    import pandas as pd

    _check_label(label)
    if isinstance(df, pd.Series):
        df = df.to_frame()
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"save_table needs a pandas DataFrame, got {type(df).__name__}")
    if absent is not None and df.empty:
        df, styled = pd.DataFrame({"note": [absent]}), None
    csv = _write_csv(df, label)
    saved = Saved(label, "table", {"csv": csv})
    provenance.write(provenance.record(label, "table", saved.files), has_csv=True)
    if glue:
        if index is None:
            index = _meaningful_index(df)
        if styled is not None:
            html = styled.to_html()
        else:
            html = df.to_html(index=index, border=0, classes=["dataframe", "table", "mdlib-table"],
                              float_format=float_format.format)
        _glue(label, _Glued({"text/html": html, "text/plain": df.to_string(index=index)}, saved))
    return saved
