"""Fingerprints of mdlib's source: which code computed a result.

A stored run is keyed by its config *and* by the fingerprint of the code that computes it (see
``mdlib.experiments.store``), so a change of that code is recomputed instead of served from the store, with no
version number to bump by hand. The fingerprint of a module is the sha256 of the sources of the module
and of every mdlib module it imports, directly or through others, at module level or inside a
function (read statically from the source, so an import on a path a test never takes still counts;
a public name imported from the package, ``from mdlib import LpMirrorDescent``, counts as its module,
and an ``if TYPE_CHECKING:`` block, never executed, does not count).
The fingerprint of the package is that of every mdlib source file.

Sources are read once per process: the fingerprint names the code this process loaded (an edit takes
effect, like the edit itself, in a new process).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

__all__ = ["PACKAGE", "fingerprint", "imports", "source_file"]

PACKAGE = "mdlib"
_ROOT = Path(__file__).resolve().parent.parent  #: the package mdlib/


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


def _executed(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (imports for type checkers only)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def imports(module: str) -> set[str]:
    """The mdlib modules ``module``'s source imports anywhere in its code (the package itself included
    when it is named), resolved to modules that have a source file."""
    from mdlib import _MODULE_OF  # the package's public names and their modules (loaded lazily there)

    tree = ast.parse(_source(module))
    package = module if source_file(module).name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _executed(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [_MODULE_OF.get(alias.name, f"{base}.{alias.name}") if base == PACKAGE
                              else f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {name for name in found if source_file(name) is not None}


def _closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports(name) - seen)
    return seen


@functools.lru_cache(maxsize=None)
def fingerprint(module: str | None = None) -> str:
    """sha256 (hex) of the sources ``module`` executes: its own and those of every mdlib module it
    imports, transitively; ``None``: of every mdlib source file."""
    if module is None:
        files = sorted(_ROOT.rglob("*.py"))
        names = [".".join((PACKAGE, *path.relative_to(_ROOT).with_suffix("").parts)).removesuffix(".__init__")
                 for path in files]
    else:
        if source_file(module) is None:
            raise ValueError(f"{module!r} is not a module of {PACKAGE} with a source file")
        names = sorted(_closure(module))
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(f"{name}\0{hashlib.sha256(_source(name)).hexdigest()}\n".encode())
    return digest.hexdigest()
