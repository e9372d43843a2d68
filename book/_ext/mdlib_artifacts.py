"""The book's figures and tables as ``mdlib.book.artifacts`` saved them.

* Tables numbered as tables: ``{glue:figure}`` makes a figure of everything it shows; a figure whose
  name (its ``:name:`` label) starts with ``table-`` becomes a :class:`table_figure`, rendered like a
  figure but numbered, captioned ("Table 4.1: ...") and referenced by ``{numref}`` as a table.
* Reproduce and cite: under every figure or table whose label has a provenance record in the build
  folder (``<build>/figures/<label>.json`` or ``<build>/results/<label>.json``, written by
  ``mdlib.book.artifacts``), a collapsed block with the command that regenerates it and its citation
  (``mdlib.book.provenance.reproduce_html``). A label without a record gets nothing. A page whose records
  changed since Sphinx read it is read again, so an incremental build never keeps a stale block.
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

ROOT = Path(__file__).resolve().parents[2]  # the repository: its mdlib, its CITATION.cff
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TABLE_PREFIX = "table-"


class table_figure(nodes.figure):  # noqa: N801 - docutils names node classes in lower case
    """A table shown by ``{glue:figure}``: a figure, numbered as a table."""


class TablesAsTables(SphinxTransform):
    """Swap every figure named ``table-...`` for a :class:`table_figure` before numbers are assigned."""

    default_priority = 800

    def apply(self, **kwargs) -> None:
        for node in list(self.document.findall(nodes.figure)):
            if type(node) is nodes.figure and any(name.startswith(TABLE_PREFIX) for name in node["names"]):
                table = table_figure(node.rawsource, *node.children, **node.attributes)
                table.source, table.line = node.source, node.line
                node.replace_self(table)
                for node_id in table["ids"]:  # what {numref} looks a target up in
                    self.document.ids[node_id] = table


def _number(app, docname: str, node: nodes.Element) -> str | None:
    """The node's number as the book shows it ("Table 4.2"), or None when it has none."""
    std = app.env.domains["std"]
    figtype = std.get_enumerable_node_type(node)
    try:
        number = app.env.toc_fignumbers[docname][figtype][node["ids"][0]]
    except (KeyError, IndexError):
        return None
    return app.config.numfig_format.get(figtype, "%s") % ".".join(map(str, number))


def add_reproduce_blocks(app, doctree: nodes.document, docname: str) -> None:
    """Append the "reproduce and cite" block after each figure/table with a provenance record."""
    from mdlib.book import provenance

    cff = None
    for node in list(doctree.findall(nodes.figure)):
        record = next((r for name in node["names"] if (r := provenance.find(name)) is not None), None)
        if record is None:
            continue
        if cff is None:
            cff = provenance.load_citation(ROOT / "CITATION.cff")
        block = provenance.reproduce_html(record, cff, _number(app, docname, node))
        node.parent.insert(node.parent.index(node) + 1, nodes.raw("", block, format="html"))


def _digest(label: str) -> str | None:
    """A hash of the record of ``label`` as it is now (None without one)."""
    import hashlib
    import json

    from mdlib.book import provenance

    record = provenance.find(label)
    return None if record is None else hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def note_records(app, doctree: nodes.document) -> None:
    """Remember, per page, the records of its figures and tables as they were when it was read."""
    labels = {name for node in doctree.findall(nodes.figure) for name in node["names"]}
    records = getattr(app.env, "mdlib_records", None)
    if records is None:
        records = app.env.mdlib_records = {}
    records[app.env.docname] = {label: _digest(label) for label in labels}


def pages_with_new_records(app, env, added, changed, removed) -> list[str]:
    """The pages to read again: those whose figures' or tables' records changed since."""
    return [doc for doc, seen in getattr(env, "mdlib_records", {}).items()
            if doc not in removed and any(_digest(label) != digest for label, digest in seen.items())]


def forget_page(app, env, docname: str) -> None:
    getattr(env, "mdlib_records", {}).pop(docname, None)


def merge_pages(app, env, docnames, other) -> None:
    theirs = getattr(other, "mdlib_records", {})
    env.mdlib_records = getattr(env, "mdlib_records", {}) | {d: theirs[d] for d in docnames if d in theirs}


def _visit(self, node):
    self.visit_figure(node)


def _depart(self, node):
    self.depart_figure(node)


def quote_the_build(app, config) -> None:
    """The numbers the prose pages quote from this build's parameters (``mdlib.book.pages.substitutions``),
    as MyST substitutions."""
    from mdlib.book import pages

    config.myst_substitutions = {**(getattr(config, "myst_substitutions", None) or {}), **pages.substitutions()}


def setup(app):
    app.connect("config-inited", quote_the_build)
    app.add_enumerable_node(table_figure, "table", html=(_visit, _depart))
    app.add_transform(TablesAsTables)
    app.connect("doctree-resolved", add_reproduce_blocks)
    app.connect("doctree-read", note_records)
    app.connect("env-get-outdated", pages_with_new_records)
    app.connect("env-purge-doc", forget_page)
    app.connect("env-merge-info", merge_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
