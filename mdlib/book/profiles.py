"""The notebooks' parameters: profiles (``params/<profile>.yaml``), the parameters cell and the
checks a value passes before anything runs.

Notebook conventions (``notebooks/NN_name.py``, jupytext py:percent):

* exactly one cell tagged ``parameters`` (``# %% tags=["parameters"]``) holding one assignment per
  line, each with a trailing ``# description`` (it becomes the row of the generated parameters page);
  it must define ``profile = "default"``: the build injects the profile's name;
* figures are saved and glued with ``mdlib.book.artifacts.save_figure(fig, label, data=df)`` and shown by
  a markdown cell with ``{glue:figure} label`` (``:name: label`` and a caption make it numbered).

Parameters are merged as: the notebook's own defaults < ``params/<profile>.yaml[<notebook>]`` <
explicit overrides, plus ``profile=<profile>``. A profile names only the notebooks it changes: one it
does not name runs at its own defaults. A section that names no notebook, unknown parameter names and
values of the wrong type are rejected before anything runs.
"""

from __future__ import annotations

import ast
import difflib
import io
import math
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn

import yaml

from mdlib import first_line
from mdlib.book import chapters
from mdlib.experiments import paths

if TYPE_CHECKING:
    import nbformat


CHAPTER_RE = re.compile(r"^[0-9][0-9]_.+\.py$")  #: a chapter's notebook file: notebooks/NN_name.py
PROFILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  #: a profile's name: params/<name>.yaml, never a path
PROFILE_ORDER = ("smoke", "default", "overnight", "paper")
EXECUTOR_KEY = "executor"  #: a profile's one top-level key that is not a notebook: where runs train


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml's SafeLoader, refusing a mapping that repeats a key (SafeLoader keeps the last one) and
    reading ``1e-3`` as a float, as YAML 1.2 does (SafeLoader, YAML 1.1, reads it as a string)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            if seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first[key] + 1})",
                    key_node.start_mark)
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                      re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                      list("-+0123456789."))


def load_yaml(text: str, where: str, fix: str) -> Any:
    """``text`` parsed by :class:`UniqueKeyLoader`; a YAML error becomes a one-line ValueError naming
    ``where`` (a file or a command-line value), the line and column, the problem and ``fix``."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or first_line(exc)
        if not isinstance(exc, yaml.constructor.ConstructorError):
            problem = f"not valid YAML: {problem}"
        raise ValueError(f"{where}{at}: {problem}; {fix}") from None


# ---------------------------------------------------------------------------------------------
# notebooks and profiles


def list_notebooks(notebooks_dir: Path | None = None) -> list[str]:
    """Names (without ``.py``) of every jupytext notebook in ``notebooks/``, sorted: the book's chapters
    (``mdlib.book.chapters.NAMES``, which :func:`check_notebooks` holds the folder to) and any other
    notebook there, which ``python -m mdlib run`` also executes."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    return sorted(path.stem for path in folder.glob("*.py") if not path.name.startswith((".", "_")))


def check_notebooks(notebooks_dir: Path | None = None) -> None:
    """A ValueError unless the chapter notebooks in ``notebooks/`` (``[0-9][0-9]_*.py``) are the
    registry's chapters (``mdlib.book.chapters.NAMES``): it names a chapter whose notebook is missing and
    a chapter notebook the registry lacks, which gets its ``Chapter`` entry there."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    found = {path.stem for path in folder.glob("*.py") if CHAPTER_RE.match(path.name)}
    missing = [name for name in chapters.NAMES if name not in found]
    unknown = sorted(found - set(chapters.NAMES))
    problems = ([f"no notebook {folder / name}.py for the chapter {name}" for name in missing]
                + [f"{folder / name}.py is not a chapter of mdlib.book.chapters.CHAPTERS: add its Chapter entry "
                   "there (and its line in _toc.yml)" for name in unknown])
    if problems:
        raise ValueError("; ".join(problems))


def resolve_notebook(name: str | os.PathLike, notebooks_dir: Path | None = None) -> Path:
    """``notebooks/<name>.py`` for a name given with or without ``.py`` (or ``.ipynb``), or by its
    chapter's two digits alone ("04" for ``04_<title>.py``)."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    stem = Path(name).name
    for suffix in (".py", ".ipynb"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    numbered = [n for n in list_notebooks(folder) if n.startswith(f"{stem}_")] if re.fullmatch(r"[0-9][0-9]", stem) else []
    if len(numbered) == 1:
        stem = numbered[0]
    path = folder / f"{stem}.py"
    if not path.is_file():
        available = ", ".join(list_notebooks(folder)) or "(none)"
        raise ValueError(f"unknown notebook {str(name)!r}; the notebooks in {folder} are: {available}")
    return path


def list_profiles(params_dir: Path | None = None) -> list[str]:
    """The profiles: the names of the files ``params/<name>.yaml`` that match :data:`PROFILE_RE`."""
    folder = Path(params_dir or paths.params_dir())
    names = [path.stem for path in folder.glob("*.yaml") if PROFILE_RE.fullmatch(path.stem)]
    return sorted(names, key=lambda n: (PROFILE_ORDER.index(n) if n in PROFILE_ORDER else len(PROFILE_ORDER), n))


def load_profile(profile: str, params_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """``params/<profile>.yaml``: a mapping notebook name -> {parameter: value} of the notebooks the
    profile changes (a notebook it does not name keeps its defaults); ``profile`` is one of
    :func:`list_profiles` (a name, never a path). Its ``executor`` key, checked, is left out (see
    :func:`profile_executor`)."""
    return {name: values for name, values in _read_profile(profile, params_dir).items() if name != EXECUTOR_KEY}


def profile_executor(profile: str, params_dir: Path | None = None) -> str | None:
    """The profile's ``executor: SPEC`` (where ``pool.run_many`` trains its runs: processes,
    dask-local:N, dask:ADDRESS; ``mdlib.runs.pool``), or None when it names none."""
    return _read_profile(profile, params_dir).get(EXECUTOR_KEY)


def _read_profile(profile: str, params_dir: Path | None) -> dict[str, Any]:
    """``params/<profile>.yaml`` checked: notebook name -> {parameter: value}, and an executor spec."""
    from mdlib.runs import pool

    folder = Path(params_dir or paths.params_dir())
    profiles = list_profiles(folder)
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; the profiles are {', '.join(profiles) or '(none)'} "
                         f"(the files {folder}/<profile>.yaml, <profile> of letters, digits, '_', '.', '-')")
    path = folder / f"{profile}.yaml"
    data = load_yaml(path.read_text("utf-8"), str(path), "correct the file") or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of notebook name -> parameters, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for notebook, values in data.items():
        if notebook == EXECUTOR_KEY:
            try:
                pool.parse_executor(values)
            except ValueError as exc:
                raise ValueError(f"{path}: {EXECUTOR_KEY}: {exc}") from None
            out[EXECUTOR_KEY] = str(values).strip()
            continue
        values = values or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: the entry of {notebook!r} must be a mapping parameter -> value")
        out[str(notebook)] = values
    return out


# ---------------------------------------------------------------------------------------------
# the parameters cell


@dataclass(frozen=True)
class Parameter:
    name: str
    source: str          # the default as written in the notebook
    value: Any           # the default as a Python literal (None when not a literal)
    literal: bool        # whether ``source`` is a literal (so its type can be checked)
    description: str     # the trailing ``# comment`` on the assignment line


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The jupytext (py:percent) source of a chapter as a notebook."""
    import jupytext

    return jupytext.read(Path(path), fmt="py:percent")


def parameters_cell(nb: nbformat.NotebookNode, where: str = "notebook") -> nbformat.NotebookNode:
    """The notebook's one code cell tagged ``parameters`` (ValueError naming ``where`` otherwise)."""
    cells = [cell for cell in nb.cells if "parameters" in cell.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{where}: expected exactly one cell tagged 'parameters' "
                         f"(`# %% tags=[\"parameters\"]`), found {len(cells)}")
    if cells[0].cell_type != "code":
        raise ValueError(f"{where}: the cell tagged 'parameters' must be a code cell")
    return cells[0]


def parse_parameters(source: str, where: str = "parameters cell") -> dict[str, Parameter]:
    """The assignments of a parameters cell, in order, with their trailing-comment descriptions."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{where}: syntax error in the parameters cell: {exc}") from None
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    out: dict[str, Parameter] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value_node = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value_node = node.target.id, node.value
        else:
            continue
        text = " ".join((ast.get_source_segment(source, value_node) or "").split())
        try:
            value, literal = ast.literal_eval(value_node), True
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value, literal = None, False
        description = next((comments[line] for line in range(node.lineno, node.end_lineno + 1)
                            if line in comments), "")
        out[name] = Parameter(name, text, value, literal, description)
    return out


def notebook_parameters(path: Path) -> dict[str, Parameter]:
    path = Path(path)
    cell = parameters_cell(read_notebook(path), where=str(path))
    return parse_parameters(cell.source, where=str(path))


def _non_finite(value: Any) -> bool:
    """Whether ``value`` is, or holds in a list or mapping, a float nan or +-inf."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(map(_non_finite, value))
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    return False


def _check_value(notebook: str, param: Parameter, value: Any, origin: str) -> Any:
    """``value`` coerced to the default's type where that is unambiguous, else a clear TypeError (None
    only where the default is None); a ValueError for nan or infinity anywhere in it."""
    if isinstance(value, tuple):
        value = list(value)
    default = param.value if param.literal else None

    def fail(expected: str) -> NoReturn:
        raise TypeError(f"{notebook}: parameter {param.name!r} from {origin} should be {expected} like its "
                        f"default {param.source}, got {value!r}")

    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    if numeric and isinstance(value, str):  # "nan" or "inf" as YAML reads them, a quoted "1e-3"
        value = _parse_number(value, fail)
    if _non_finite(value):
        raise ValueError(f"{notebook}: parameter {param.name!r} from {origin} is {value!r}: nan and infinity "
                         "are not accepted; give finite numbers")
    if default is None:  # a default of None, or not a literal: any value
        return value
    if numeric:
        return _as_number(value, default, fail)
    _check_kind(value, default, fail)
    return value


def _parse_number(text: str, fail: Callable[[str], NoReturn]) -> int | float:
    """A number written as a string: a float if it has a point, an exponent or is nan/inf, else an int;
    ``fail("a number")`` if it is neither."""
    try:
        return float(text) if any(c in text.lower() for c in ".en") else int(text)
    except ValueError:
        fail("a number")


def _as_number(value: Any, default: int | float, fail: Callable[[str], NoReturn]) -> int | float:
    """``value`` as the numeric type of ``default``: a float default takes any number (as a float), an
    int default a whole float (as an int); ``fail`` for booleans and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail("a number")
    if isinstance(default, int) and isinstance(value, float):
        if not value.is_integer():
            fail("an integer")
        return int(value)
    if isinstance(default, float):
        return float(value)
    return value


def _check_kind(value: Any, default: Any, fail: Callable[[str], NoReturn]) -> None:
    """``fail`` unless ``value`` is of the default's kind: a bool, a string, a list or a mapping (other
    defaults accept anything)."""
    for kind, accepted, expected in ((bool, bool, "true/false"), (str, str, "a string"),
                                     ((list, tuple), list, "a list"), (dict, dict, "a mapping")):
        if isinstance(default, kind) and not isinstance(value, accepted):
            fail(expected)


def resolve_parameters(name: str, profile: str = "default", overrides: Mapping[str, Any] | None = None, *,
                       notebooks_dir: Path | None = None, params_dir: Path | None = None) -> dict[str, Any]:
    """The parameters papermill injects: ``params/<profile>.yaml[<name>]`` (nothing where the profile does
    not name the notebook) < ``overrides``, plus the profile; validated against the notebook's parameters
    cell (names and types), and every section of the profile against the notebooks."""
    path = resolve_notebook(name, notebooks_dir)
    nb_name = path.stem
    sections = load_profile(profile, params_dir)
    notebooks = list_notebooks(path.parent)
    for section in sections:
        if section not in notebooks:
            near = difflib.get_close_matches(section, notebooks, n=1)
            raise ValueError(f"params/{profile}.yaml has a section {section!r}, which is not a notebook"
                             + (f" (did you mean {near[0]!r}?)" if near else "") + f"; the notebooks are: "
                             f"{', '.join(notebooks)}")
    profile_values = sections.get(nb_name, {})
    declared = notebook_parameters(path)
    valid = ", ".join(declared) or "(none)"
    if "profile" not in declared:
        raise ValueError(f"{nb_name}: the parameters cell must define `profile = \"default\"` "
                         "(the build injects the profile's name)")
    merged: dict[str, Any] = {}
    for origin, values in ((f"params/{profile}.yaml", profile_values), ("the overrides", overrides or {})):
        for key, value in values.items():
            if key not in declared:
                owners = [name for name in list_notebooks(path.parent) if CHAPTER_RE.match(f"{name}.py") and name != nb_name
                          and key in notebook_parameters(path.parent / f"{name}.py")]
                elsewhere = f" ({key!r} is a parameter of {', '.join(owners)})" if owners else ""
                raise ValueError(f"{nb_name}: unknown parameter {key!r} in {origin}{elsewhere}; the parameters cell "
                                 f"defines: {valid}")
            if key == "profile":
                raise ValueError(f"{nb_name}: set the profile with --profile (profile=...), not as a parameter")
            merged[key] = _check_value(nb_name, declared[key], value, origin)
    merged["profile"] = profile
    return merged




def executed_parameters(name: str, profile: str = "default", overrides: Mapping[str, Any] | None = None, *,
                        notebooks_dir: Path | None = None, params_dir: Path | None = None) -> dict[str, Any]:
    """Every parameter as ``name`` executes at ``profile`` with ``overrides``: the parameters cell's
    values (an expression as its source text), then :func:`resolve_parameters`'."""
    path = resolve_notebook(name, notebooks_dir)
    declared = {n: p.value if p.literal else p.source for n, p in notebook_parameters(path).items()}
    return declared | resolve_parameters(path.stem, profile, overrides, notebooks_dir=path.parent,
                                         params_dir=params_dir)
