"""A run's identity: its kind, its typed config, the code that computes it, and the key the results
store files it under.

A run is identified by ``kind`` (what computes it, e.g. ``"e1-paths"``), its full ``config`` (every
setting that changes the numbers: data sizes, seeds, step sizes, steps, p values) and the code that
computes it: the :func:`fingerprint` of the module that computes the kind (:data:`KINDS`) and of every
mdlib module it imports (of all of mdlib for a kind not in the table). Its key is the sha256 of the
canonical JSON of ``{"kind": kind, "config": config, "code": fingerprint}`` (sorted keys, no
whitespace), so a change of that code is recomputed, never served the old numbers. A ``RunId`` holds
the four, made once per run and passed to whatever visits the run in the store.

A config is a typed ``Config`` (a frozen dataclass that callers read by attribute) or a plain mapping;
the key is taken of its ``to_dict()``, the one place a typed config becomes the dict the store keeps.

**The code in a key** is the arithmetic alone, as joblib.Memory counts a function's code, so that an
edit of how runs are filed, scheduled or shown retrains nothing:

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
import copy
import functools
import hashlib
import io
import json
import math
import re
import tokenize
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, TypeVar

import numpy as np

__all__ = ["BOOKKEEPING", "KINDS", "PACKAGE", "Config", "RunId", "arithmetic", "canonical_json", "check_keys",
           "check_name", "closure", "code_of", "config_key", "fingerprint", "imports", "kind", "plain", "source_file"]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME = 128  #: the most characters of a kind, run name or result name


def plain(obj: Any, where: str = "config", finite: bool = True) -> Any:
    """Plain JSON data for hashing: a ``Config`` -> its ``to_dict()``, tuples -> lists, numpy
    scalars/arrays -> Python, Paths -> str."""
    if isinstance(obj, Config):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings, got {key!r}")
            out[key] = plain(value, f"{where}.{key}", finite)
        return out
    if isinstance(obj, (list, tuple)):
        return [plain(value, f"{where}[{i}]", finite) for i, value in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist(), where, finite)
    if isinstance(obj, np.generic):
        return plain(obj.item(), where, finite)
    if isinstance(obj, Path):
        return str(obj)
    if finite and isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"{where}: {obj} is not allowed in a run config (use None or a string)")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{where}: {type(obj).__name__} is not JSON data; put plain numbers, strings, "
                    "lists and dicts in a run config")


def canonical_json(obj: Any) -> str:
    """``obj`` (``plain``) as JSON with sorted keys and no whitespace: what keys and stored configs are made of."""
    return json.dumps(plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"invalid {what} {name!r}: use letters, digits, '-', '_' or '.'")
    if len(name) > MAX_NAME:  # a file name: most file systems stop at 255 bytes
        raise ValueError(f"invalid {what} {name[:32]!r}... ({len(name)} characters): use at most {MAX_NAME}")
    return name


def check_keys(config: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    """Raise ValueError unless ``config`` has exactly ``keys`` (an experiment's config is complete, so
    the store keeps exactly what ran); ``what`` names the config in the message."""
    missing = [k for k in keys if k not in config]
    unknown = [k for k in config if k not in keys]
    if missing or unknown:
        raise ValueError(f"{what} has exactly the keys {', '.join(keys)}; missing {missing}, unknown {unknown}")


_C = TypeVar("_C", bound="Config")


class Config:
    """The base of the typed configs (frozen dataclasses), which callers read by attribute. The store
    takes a config as it is and serializes it at its door: ``to_dict()`` is the plain dict it hashes
    and keeps (nested configs as dicts), so a typed config and its dict name the same run;
    ``from_dict`` is its inverse (nested configs typed again)."""

    #: What the config is called in error messages ("a Table 1 grid config").
    WHAT = "a config"
    #: Compatibility with the entries stored before these fields existed: a field named here is left out
    #: of ``to_dict()`` while it holds its default (so those runs keep their keys), and ``from_dict``
    #: fills it in when a mapping lacks it. A field of a nested config is named by its path
    #: (``"fit.eval_every"``: a setting this kind of run did not have), besides that config's own.
    OMIT_AT_DEFAULT: typing.ClassVar[tuple[str, ...]] = ()

    def to_dict(self, omitted: tuple[str, ...] = ()) -> dict[str, Any]:
        """The config as the store keeps it: every field but those of ``OMIT_AT_DEFAULT`` (and ``omitted``,
        a parent config's names for this one) at their default, nested configs as dicts."""
        omit = self.OMIT_AT_DEFAULT + omitted
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in omit and value == f.default:
                continue
            out[f.name] = value.to_dict(_inside(omit, f.name)) if isinstance(value, Config) else copy.deepcopy(value)
        return out

    @classmethod
    def from_dict(cls: type[_C], config: Mapping[str, Any], omitted: tuple[str, ...] = ()) -> _C:
        """The typed config of a mapping with exactly its fields, those ``to_dict`` omits at their default
        at will (ValueError naming the missing and the unknown ones otherwise); a field typed as a
        ``Config`` is made from its mapping in turn."""
        omit = cls.OMIT_AT_DEFAULT + omitted
        names = tuple(f.name for f in fields(cls))
        check_keys({name: None for name in omit if name in names} | dict(config), names, cls.WHAT)
        hints = typing.get_type_hints(cls)
        values = {}
        for name, value in config.items():
            hint = hints[name]
            nested = isinstance(hint, type) and issubclass(hint, Config) and isinstance(value, Mapping)
            values[name] = hint.from_dict(value, _inside(omit, name)) if nested else value
        return cls(**values)

    @classmethod
    def of(cls: type[_C], config: "_C | Mapping[str, Any]") -> _C:
        """``config`` itself when it is one, else ``from_dict(config)``."""
        return config if isinstance(config, cls) else cls.from_dict(config)


def _inside(names: tuple[str, ...], nested: str) -> tuple[str, ...]:
    """The names of ``names`` inside the nested config ``nested``: "fit.pool" -> "pool" for "fit"."""
    return tuple(name[len(nested) + 1:] for name in names if name.startswith(f"{nested}."))


# ---------------------------------------------------------------------------------------------
# the code that computes a run: fingerprints of mdlib's source

PACKAGE = "mdlib"
_ROOT = Path(__file__).resolve().parent.parent  #: the package mdlib/

#: The modules no run's numbers depend on: the package inits (public names, loaded lazily), the package
#: ``mdlib.runs`` (a run's identity, its entry files, locks, the store, the pool and its progress files:
#: how runs are named, filed, scheduled and watched), paths, downloads (checksum-verified) and the
#: paper's numbers (a run's config holds the values it uses). A run's fingerprint neither includes nor
#: looks through them.
BOOKKEEPING = frozenset([PACKAGE] + [f"{PACKAGE}.{name}" for name in (
    "runs", "runs.identity", "runs.files", "runs.lockfile", "runs.store", "runs.pool", "runs.progress",
    "experiments", "experiments.paths", "experiments.fetch", "experiments.paper")])


def source_file(module: str) -> Path | None:
    """The source file of the mdlib module ``module`` ("mdlib.runs.store", "mdlib"), or None if there is none."""
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


# ---------------------------------------------------------------------------------------------
# the kinds and a run's id

#: Every run kind and the module that computes its runs: the code in their keys is that module's
#: fingerprint (:func:`code_of`), read from this table so that no module need be imported to know it.
#: The module declares the kind with :func:`kind`, which checks it against this table.
KINDS: Mapping[str, str] = MappingProxyType({
    "e1-fixed-decoder": "mdlib.experiments.synthetic",
    "e2-single-instance": "mdlib.experiments.synthetic",
    "e3-joint": "mdlib.experiments.synthetic",
    "e4-sentiment": "mdlib.experiments.sentiment.run",
    "e4-grid": "mdlib.experiments.sentiment.grids",
    "e4-baseline": "mdlib.experiments.sentiment.bag_of_words",
    "e4-arms": "mdlib.experiments.sentiment.allocation",
    "e7-vit": "mdlib.experiments.vision",
    "e7-grid": "mdlib.experiments.vision",
    "e7-pruning": "mdlib.experiments.vision",
    "e9-step-sizes": "mdlib.experiments.step_size_guide",
    "e9-step-grid": "mdlib.experiments.step_size_guide",
})


def kind(name: str, module: str) -> str:
    """Declare, in ``module`` (the caller's ``__name__``), that it computes the runs of kind ``name``;
    returns ``name``, e.g. ``KIND = identity.kind("e4-sentiment", __name__)``. A ValueError unless
    :data:`KINDS` pairs them."""
    check_name(name, "run kind")
    known = KINDS.get(name)
    if known is None:
        raise ValueError(f"run kind {name!r} is not in mdlib.runs.identity.KINDS: add it there, "
                         f"computed by {module}")
    if known != module:
        raise ValueError(f"run kind {name!r} is computed by {known} (mdlib.runs.identity.KINDS); "
                         f"{module} must use another name")
    return name


def code_of(kind: str) -> str:
    """The code fingerprint in the keys of ``kind``'s runs: that of its module in :data:`KINDS`, else
    (a kind not in the table, e.g. a test's) all of mdlib's."""
    return fingerprint(KINDS.get(kind))


@dataclass(frozen=True)
class RunId:
    """A run's identity, made once (:meth:`of`) and passed to whatever finds, locks, writes or reads the
    run: its ``kind``, its ``config`` as the store keeps it (plain JSON data, ``Config.to_dict()`` of a
    typed one), the fingerprint of the ``code`` that computes it (:func:`code_of`) and its ``key``, the
    sha256 of the three. Two ids are equal when their kind, code and key are."""

    kind: str
    config: dict[str, Any] = field(compare=False)
    code: str
    key: str

    @classmethod
    def of(cls, kind: str, config: Config | Mapping[str, Any]) -> "RunId":
        """The identity of run (``kind``, ``config``): the key is the sha256 (hex) of the canonical JSON of
        ``{"kind": kind, "config": config, "code": code_of(kind)}``."""
        check_name(kind, "run kind")
        config, code = plain(config), code_of(kind)
        payload = canonical_json({"kind": kind, "config": config, "code": code})
        return cls(kind, config, code, hashlib.sha256(payload.encode("utf-8")).hexdigest())


def config_key(kind: str, config: Config | Mapping[str, Any]) -> str:
    """The key of run (``kind``, ``config``): ``RunId.of(kind, config).key``."""
    return RunId.of(kind, config).key
