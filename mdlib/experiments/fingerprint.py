"""Fingerprints of mdlib's source: the code that computes a run's numbers.

A stored run is keyed by its config *and* by the fingerprint of the code that computes it (see
``mdlib.experiments.runkey``), so an edit of that code is recomputed instead of served from the store, with
no version number to bump by hand. Only the arithmetic counts, as joblib.Memory counts a function's code:

- the modules: the module that computes a kind and every mdlib module it imports, directly or through
  others, at module level or inside a function (read statically from the source, so an import on a path
  a test never takes still counts; a public name imported from the package, ``from mdlib import
  LpMirrorDescent``, counts as its module; a package's ``__init__`` counts only where a name is taken
  from it; an ``if TYPE_CHECKING:`` block, never executed, does not count), but never the modules of
  :data:`BOOKKEEPING`, which find, lock, schedule, name and file runs and never change their numbers
  (a run's config records every number it takes from them, the paper's step sizes included);
- of each module, its code without docstrings, comments, blank lines, import statements and
  ``__all__``: editing the prose, moving a module or re-exporting a name keeps every key, and so does
  the module's name (the fingerprint hashes the modules' code, not where they live).

The fingerprint of the package (``fingerprint()``, the provenance records' code) is that of every mdlib
source file, as it is. Sources are read once per process: the fingerprint names the code this process
loaded (an edit takes effect, like the edit itself, in a new process).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from pathlib import Path

__all__ = ["BOOKKEEPING", "PACKAGE", "arithmetic", "closure", "fingerprint", "imports", "source_file"]

PACKAGE = "mdlib"
_ROOT = Path(__file__).resolve().parent.parent  #: the package mdlib/

#: The modules no run's numbers depend on: the package inits (public names, loaded lazily), the results
#: store and what it is made of (keys, fingerprints, entry files, locks), the pool, its executors and
#: its progress files (where runs train, what they are doing), paths, downloads (checksum-verified) and
#: the paper's numbers (a run's config holds the values it uses). A run's fingerprint neither includes
#: nor looks through them.
BOOKKEEPING = frozenset([PACKAGE] + [f"{PACKAGE}.{name}" for name in (
    "experiments", "experiments.store", "experiments.runkey", "experiments.fingerprint",
    "experiments.runfiles", "experiments.lockfile", "experiments.pool", "experiments.executors",
    "experiments.paths", "experiments.fetch", "experiments.paper", "experiments.progress")])


def source_file(module: str) -> Path | None:
    """The source file of the mdlib module ``module`` ("mdlib.experiments.store", "mdlib"), or None if there is none."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = _ROOT.joinpath(*parts[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=None)
def _source(module: str) -> bytes:
    return source_file(module).read_bytes()


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _executed(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (imports for type checkers only)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.orelse if _type_checking(node) else ast.iter_child_nodes(node))
    return nodes


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The modules an import statement of a module of ``package`` takes names from: ``import a.b`` -> a.b;
    ``from a import b`` -> a.b when b is a module, else a; ``from mdlib import X`` -> X's module."""
    from mdlib import _MODULE_OF  # the package's public names and their modules (loaded lazily there)

    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    names = []
    for alias in node.names:
        if base == PACKAGE and alias.name in _MODULE_OF:
            names.append(_MODULE_OF[alias.name])
        elif source_file(f"{base}.{alias.name}") is not None:
            names.append(f"{base}.{alias.name}")
        else:
            names.append(base)
    return names


def imports(module: str) -> set[str]:
    """The mdlib modules ``module``'s source imports anywhere in its code (see the module docstring),
    those with a source file."""
    tree = ast.parse(_source(module))
    package = module if source_file(module).name == "__init__.py" else module.rpartition(".")[0]
    found = {name for node in _executed(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for name in _imported(node, package)}
    return {name for name in found if source_file(name) is not None}


def closure(module: str) -> set[str]:
    """``module`` and every mdlib module it imports, transitively, never entering ``BOOKKEEPING``."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports(name) - seen - BOOKKEEPING)
    return seen


def _dropped(tree: ast.Module) -> set[int]:
    """The lines (1-based) of ``tree``'s docstrings, imports and ``__all__`` assignments that hold nothing
    else (a line another statement starts or ends on is kept: ``x = 1; import y``)."""
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    spans = []
    for node in statements:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                and any(isinstance(t, ast.Name) and t.id == "__all__"
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            spans.append(node)
    for node in [tree, *statements]:
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                spans.append(first)
    dropped = set()
    for span in spans:
        lines = set(range(span.lineno, span.end_lineno + 1))
        shared = any(other is not span and (other.lineno in lines or other.end_lineno in lines)
                     and not (other.lineno < span.lineno and other.end_lineno > span.end_lineno)
                     for other in statements)
        if not shared:
            dropped |= lines
    return dropped


@functools.lru_cache(maxsize=None)
def arithmetic(module: str) -> str:
    """The code of ``module`` that can change numbers: its source without docstrings, comments, imports,
    ``__all__``, trailing spaces and blank lines (a line that also holds another statement is kept whole). The same text on every Python version: positions come from ``ast`` and ``tokenize``, the text
    from the source itself."""
    text = _source(module).decode("utf-8")
    lines = text.splitlines()
    dropped = _dropped(ast.parse(text))
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    kept = [line.rstrip() for i, line in enumerate(lines, 1) if i not in dropped]
    return "\n".join(line for line in kept if line.strip()) + "\n"


@functools.lru_cache(maxsize=None)
def fingerprint(module: str | None = None) -> str:
    """sha256 (hex) of the code that computes ``module``'s runs: the ``arithmetic`` of every module of its
    ``closure``, as a sorted list of their hashes (so their names and places do not count); ``None``: of
    every mdlib source file as it is, with its name (what a provenance record calls the code)."""
    digest = hashlib.sha256()
    if module is None:
        for path in sorted(_ROOT.rglob("*.py")):
            name = ".".join((PACKAGE, *path.relative_to(_ROOT).with_suffix("").parts)).removesuffix(".__init__")
            digest.update(f"{name}\0{hashlib.sha256(_source(name)).hexdigest()}\n".encode())
        return digest.hexdigest()
    if source_file(module) is None:
        raise ValueError(f"{module!r} is not a module of {PACKAGE} with a source file")
    for code in sorted(hashlib.sha256(arithmetic(name).encode("utf-8")).hexdigest() for name in closure(module)):
        digest.update(f"{code}\n".encode())
    return digest.hexdigest()
