"""Execute the notebooks with papermill at a parameter profile and build the Jupyter Book.

Notebook conventions (``notebooks/NN_name.py``, jupytext py:percent):

* exactly one cell tagged ``parameters`` (``# %% tags=["parameters"]``) holding one assignment per
  line, each with a trailing ``# description`` (it becomes the row of the generated parameters page);
  it must define ``profile = "default"``: the build injects the profile's name;
* figures are saved and glued with ``mdlib.plots.save_figure(fig, label, data=df)`` and shown by a
  markdown cell with ``{glue:figure} label`` (``:name: label`` and a caption make it numbered).

Parameters are merged as: the notebook's own defaults < ``params/<profile>.yaml[<notebook>]`` <
explicit overrides, plus ``profile=<profile>``; unknown names and values of the wrong type are
rejected before anything runs.
"""

from __future__ import annotations

import ast
import contextlib
import html
import io
import math
import os
import re
import subprocess
import sys
import time
import tokenize
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import yaml

from mdlib import first_line, paths

if TYPE_CHECKING:
    import nbformat

CHAPTER_RE = re.compile(r"^[0-9][0-9]_.+\.py$")
PROFILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  #: a profile's name: params/<name>.yaml, never a path
KERNEL = "python3"
FAILED_SUFFIX = ".failed.ipynb"  #: a failed execution is kept beside the executed notebook for inspection
PROFILE_ORDER = ("smoke", "default", "paper")


class NotebookError(RuntimeError):
    """A notebook failed to execute (the message names it and the failing cell)."""


class BookError(RuntimeError):
    """The book could not be built (configuration, table of contents, Sphinx warnings)."""


# ---------------------------------------------------------------------------------------------
# YAML


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
    """Names (without ``.py``) of every jupytext notebook in ``notebooks/``, sorted."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    return sorted(path.stem for path in folder.glob("*.py") if not path.name.startswith((".", "_")))


def chapters(notebooks_dir: Path | None = None) -> list[str]:
    """The book's chapters: ``notebooks/[0-9][0-9]_*.py``, in order."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    return sorted(path.stem for path in folder.glob("*.py") if CHAPTER_RE.match(path.name))


def resolve_notebook(name: str | os.PathLike, notebooks_dir: Path | None = None) -> Path:
    """``notebooks/<name>.py`` for a name given with or without ``.py`` (or ``.ipynb``)."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    stem = Path(name).name
    for suffix in (".py", ".ipynb"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
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
    """``params/<profile>.yaml``: a mapping notebook name -> {parameter: value}; ``profile`` is one of
    :func:`list_profiles` (a name, never a path)."""
    folder = Path(params_dir or paths.params_dir())
    profiles = list_profiles(folder)
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; the profiles are {', '.join(profiles) or '(none)'} "
                         f"(the files {folder}/<profile>.yaml, <profile> of letters, digits, '_', '.', '-')")
    path = folder / f"{profile}.yaml"
    data = load_yaml(path.read_text("utf-8"), str(path), "correct the file") or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of notebook name -> parameters, got {type(data).__name__}")
    out = {}
    for notebook, values in data.items():
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

    def fail(expected: str):
        raise TypeError(f"{notebook}: parameter {param.name!r} from {origin} should be {expected} like its "
                        f"default {param.source}, got {value!r}")

    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    if numeric and isinstance(value, str):  # "nan" or "inf" as YAML reads them, a quoted "1e-3"
        try:
            value = float(value) if any(c in value.lower() for c in ".en") else int(value)
        except ValueError:
            fail("a number")
    if _non_finite(value):
        raise ValueError(f"{notebook}: parameter {param.name!r} from {origin} is {value!r}: nan and infinity "
                         "are not accepted; give finite numbers")
    if default is None:  # a default of None, or not a literal: any value
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            fail("true/false")
        return value
    if numeric:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail("a number")
        if isinstance(default, int) and isinstance(value, float):
            if not value.is_integer():
                fail("an integer")
            return int(value)
        if isinstance(default, float):
            return float(value)
        return value
    if isinstance(default, str) and not isinstance(value, str):
        fail("a string")
    if isinstance(default, (list, tuple)) and not isinstance(value, list):
        fail("a list")
    if isinstance(default, dict) and not isinstance(value, dict):
        fail("a mapping")
    return value


def resolve_parameters(name: str, profile: str = "default", overrides: Mapping[str, Any] | None = None, *,
                       notebooks_dir: Path | None = None, params_dir: Path | None = None) -> dict[str, Any]:
    """The parameters papermill injects: ``params/<profile>.yaml[<name>]`` < ``overrides``, plus the
    profile; validated against the notebook's parameters cell (names and types)."""
    path = resolve_notebook(name, notebooks_dir)
    nb_name = path.stem
    profile_values = load_profile(profile, params_dir).get(nb_name, {})
    declared = notebook_parameters(path)
    valid = ", ".join(declared) or "(none)"
    if "profile" not in declared:
        raise ValueError(f"{nb_name}: the parameters cell must define `profile = \"default\"` "
                         "(the build injects the profile's name)")
    merged: dict[str, Any] = {}
    for origin, values in ((f"params/{profile}.yaml", profile_values), ("the overrides", overrides or {})):
        for key, value in values.items():
            if key not in declared:
                owners = [name for name in chapters(path.parent) if name != nb_name
                          and key in notebook_parameters(path.parent / f"{name}.py")]
                elsewhere = f" ({key!r} is a parameter of {', '.join(owners)})" if owners else ""
                raise ValueError(f"{nb_name}: unknown parameter {key!r} in {origin}{elsewhere}; the parameters cell "
                                 f"defines: {valid}")
            if key == "profile":
                raise ValueError(f"{nb_name}: set the profile with --profile (profile=...), not as a parameter")
            merged[key] = _check_value(nb_name, declared[key], value, origin)
    merged["profile"] = profile
    return merged


# ---------------------------------------------------------------------------------------------
# execution


@contextlib.contextmanager
def _kernel_environment(run: Mapping[str, Any] | None = None) -> Iterator[None]:
    """The kernel imports the mdlib this process runs (PYTHONPATH: the folder holding the package, a
    checkout or site-packages) and reads and writes where this process would (``MDLIB_ROOT``: the
    project this process found, when it found one).

    ``run`` (``{notebook, profile, parameters, overrides}``) reaches the kernel as the JSON value of
    ``mdlib.provenance.ENV``, from which every saved figure and table records how it was made.

    ``MDLIB_BUILD_DIR`` and ``MDLIB_DATA_DIR``, when set, are passed down as absolute paths resolved
    here: the kernel runs in ``notebooks/`` and would resolve a relative one against that folder.
    Progress bars (tqdm) are off inside executed notebooks (``TQDM_DISABLE=1`` unless set): their
    carriage-return output would clutter the book; papermill shows progress per cell instead.
    """
    import json

    from mdlib import fetch, provenance

    keys = ("PYTHONPATH", "OMP_WAIT_POLICY", "TQDM_DISABLE", "PYTHONWARNINGS", paths.BUILD_ENV, fetch.DATA_ENV,
            paths.ROOT_ENV, provenance.ENV)
    saved = {key: os.environ.get(key) for key in keys}
    if run is not None:
        os.environ[provenance.ENV] = json.dumps(dict(run), default=str)
    for key, resolved in ((paths.BUILD_ENV, paths.build_dir), (fetch.DATA_ENV, fetch.data_dir)):
        if saved[key]:
            os.environ[key] = str(resolved())
    project = paths.find_root()
    if project is not None:
        os.environ[paths.ROOT_ENV] = str(project)
    parts = [str(paths.PACKAGE_DIR.parent)] + [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TQDM_DISABLE", "1")
    # tqdm.auto warns at import when ipywidgets is absent; the warning says nothing about the results.
    filters = [f for f in (saved["PYTHONWARNINGS"] or "").split(",") if f] + ["ignore:IProgress not found"]
    os.environ["PYTHONWARNINGS"] = ",".join(filters)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_notebook(name: str, profile: str = "default", overrides: Mapping[str, Any] | None = None,
                 output_dir: Path | None = None, *, notebooks_dir: Path | None = None,
                 params_dir: Path | None = None, progress: bool = True) -> Path:
    """Execute ``notebooks/<name>.py`` with papermill at ``profile`` (plus ``overrides``) and write the
    executed notebook ``<output_dir or notebooks/>/<name>.ipynb``; returns its path.

    The kernel (``python3``) runs in the notebooks folder. The chapter commits all or nothing: the
    notebook is executed into a temporary file beside the output and renamed over it only on success,
    and the figures and results it writes are kept only then (``paths.all_or_nothing``), so a failed,
    interrupted or killed execution leaves the previous notebook and every previous artifact byte for
    byte; the failed notebook, with its traceback, is saved as ``<name>.failed.ipynb`` and a failing
    cell raises ``NotebookError`` naming the notebook and cell. On success the chapter's artifacts of
    earlier executions that this one did not write again are removed. Every artifact's record and the
    executed notebook's metadata (``mdlib``) carry one execution id, which :func:`check_consistent`
    compares before a book is rendered.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path = resolve_notebook(name, notebooks_dir)
    nb_name = path.stem
    parameters = resolve_parameters(nb_name, profile, overrides, notebooks_dir=path.parent, params_dir=params_dir)
    executed = {n: p.value if p.literal else p.source for n, p in notebook_parameters(path).items()}
    execution = uuid.uuid4().hex
    run = {"notebook": nb_name, "profile": profile, "execution": execution, "parameters": {**executed, **parameters},
           "overrides": {key: parameters[key] for key in overrides or {}}}
    nb = read_notebook(path)
    nb.metadata["mdlib"] = {"execution": execution, "profile": profile, "build": str(paths.build_dir())}
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    # The executed .ipynb is an output, not a jupytext pair of the .py: opening and saving it in
    # Jupyter must never write over the source.
    nb.metadata.get("jupytext", {}).pop("formats", None)
    nb.metadata.setdefault("language_info", {"name": "python"})
    out_dir = Path(output_dir) if output_dir is not None else path.parent
    output = out_dir / f"{nb_name}.ipynb"
    failed = out_dir / f"{nb_name}{FAILED_SUFFIX}"
    shown = ", ".join(f"{k}={v!r}" for k, v in parameters.items())
    if progress:
        print(f"executing {nb_name} ({shown})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    kept: list[Path] = []  # this run's failed notebook, once saved

    def execute(partial: Path) -> None:
        try:
            with _kernel_environment(run):
                # The kernel's own log (a TCP warning at start, a traceback when Ctrl-C stops it mid-cell)
                # says nothing about the notebook: a cell's error is in the notebook and raised here.
                papermill.execute_notebook(
                    nb, str(partial), parameters=parameters, kernel_name=KERNEL, language="python",
                    cwd=str(path.parent), progress_bar=progress, start_timeout=300, log_output=False,
                    extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
                )
        except BaseException:
            if partial.exists():
                os.replace(partial, failed)
                kept.append(failed)
            raise

    try:
        with paths.all_or_nothing(_artifact_folders(), _journal(nb_name)):
            paths.atomic_write(output, execute, tag="executing")
            _drop_earlier_artifacts(nb_name, execution)
    except BaseException as exc:
        where = [f"the previous executed notebook {output} is kept"] if output.exists() else []
        where += ["the figures and results are as they were before this run"]
        where += [f"this run's, with the traceback: {saved}" for saved in kept]
        where_text = "".join(f"; {part}" for part in where)
        if isinstance(exc, PapermillExecutionError):
            raise NotebookError(f"notebook {nb_name} (profile {profile}) failed in cell [{exc.exec_count}]: "
                                f"{exc.ename}: {first_line(exc.evalue)}{where_text}") from None
        if isinstance(exc, Exception):
            raise NotebookError(f"notebook {nb_name} (profile {profile}) could not be executed: "
                                f"{type(exc).__name__}: {first_line(exc)}{where_text}") from exc
        raise
    failed.unlink(missing_ok=True)  # a failure of an earlier run, now superseded
    if progress:
        print(f"  {nb_name}: {time.perf_counter() - start:.1f} s -> {output}", file=sys.stderr, flush=True)
    return output


def _artifact_folders() -> dict[str, Path]:
    return {"figures": paths.figures_dir(), "results": paths.results_dir()}


def _journal(nb_name: str) -> Path:
    return paths.build_dir() / ".rollback" / nb_name


def _drop_earlier_artifacts(nb_name: str, execution: str) -> None:
    """Remove the figures and tables of ``nb_name`` that earlier executions wrote and this one did not."""
    from mdlib import provenance

    for path, record in list(provenance.records()):
        if record.get("notebook") == nb_name and record.get("execution") != execution:
            for name in record.get("files") or []:
                (paths.build_dir() / name).unlink(missing_ok=True)
            path.unlink(missing_ok=True)


def check_consistent(names: list[str], notebooks_dir: Path | None = None) -> None:
    """Raise ``BookError`` unless each executed ``<notebooks>/<name>.ipynb`` was executed for this build
    folder and every figure and table the build holds from that notebook comes from that same
    execution (a chapter's text and its numbers agree). Restores first the artifacts of an execution
    that was killed before it finished."""
    import nbformat

    from mdlib import provenance

    folder = Path(notebooks_dir or paths.notebooks_dir())
    for name in names:
        if paths.recover(_journal(name), _artifact_folders()):
            print(f"{name}: an execution was killed before it finished; its figures and results were set back "
                  "to those before it", file=sys.stderr)
    build, problems = str(paths.build_dir()), {}
    executions = {}
    for name in names:
        meta = nbformat.read(folder / f"{name}.ipynb", as_version=4).metadata.get("mdlib", {})
        executions[name] = meta.get("execution")
        if meta.get("build") != build:
            problems[name] = [f"notebooks/{name}.ipynb was executed for the build folder {meta.get('build')}, "
                              f"not this one ({build})"]
    for path, rec in provenance.records():
        name = rec.get("notebook")
        if name in executions and rec.get("execution") != executions[name]:
            problems.setdefault(name, []).append(f"{path.name} is not from the execution of notebooks/{name}.ipynb")
    if problems:
        raise BookError("; ".join(sorted(set(sum(problems.values(), [])))) + "; execute again with "
                        + " and ".join(f"`python -m mdlib run {n}`" for n in sorted(problems)))


def notebook_failure(ipynb: Path) -> str | None:
    """Why the executed notebook ``ipynb`` is not a good chapter (a cell's error output, papermill's
    record of an exception, an execution that did not finish), or None."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return (f"cell [{cell.get('execution_count')}] raised {output.get('ename')}: "
                        f"{first_line(output.get('evalue', ''))}")
    record = nb.metadata.get("papermill", {})
    if record.get("exception"):
        return "papermill recorded an exception during its execution"
    if record and record.get("end_time") is None:
        return "its execution did not finish"
    return None


def check_executed(names: list[str], notebooks_dir: Path | None = None) -> None:
    """Raise ``BookError`` unless every ``<notebooks>/<name>.ipynb`` exists and executed without error."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    missing = [n for n in names if not (folder / f"{n}.ipynb").is_file()]
    if missing:
        raise BookError(f"not executed yet: {', '.join(missing)}; run `python -m mdlib book` without "
                        "--skip-execute (or `python -m mdlib run <notebook>`)")
    failed = {n: why for n in names if (why := notebook_failure(folder / f"{n}.ipynb"))}
    if failed:
        again = f"`python -m mdlib run {next(iter(failed))}`" if len(failed) == 1 else \
            "`python -m mdlib run <notebook>` for each"
        raise BookError("; ".join(f"notebooks/{n}.ipynb failed: {why}" for n, why in failed.items())
                        + f"; execute again with {again} (or `python -m mdlib book` without --skip-execute)")


# ---------------------------------------------------------------------------------------------
# the generated parameters page


def _literal(value: Any) -> str:
    """A value as Python source, strings in double quotes (as the notebooks write them)."""
    import json

    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def md_text(text: object) -> str:
    """``text`` as one line of a generated MyST page, safe in a table cell: ``<``, ``>`` and ``&`` as HTML
    entities (MyST passes raw HTML through to the reader's browser) and ``|`` escaped."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _md_code(text: str) -> str:
    """``text`` as an inline code span of a table cell, fenced by more backticks than it holds (a backtick
    in a value cannot end the span and let the rest through as markdown or HTML)."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    if not text:
        return ""
    fence = "`" * (1 + max(map(len, re.findall("`+", text)), default=0))
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def parameters_page(profile: str | None = None, *, notebooks: list[str] | None = None,
                    notebooks_dir: Path | None = None, params_dir: Path | None = None) -> str:
    """The markdown of the parameters page: per notebook, a table of every parameter with its default,
    its value in each profile that sets it (smoke and paper always shown) and its description.
    Every profile's values are validated against the notebooks (unknown names, wrong types)."""
    folder = Path(notebooks_dir or paths.notebooks_dir())
    names = chapters(folder) if notebooks is None else list(notebooks)
    profiles = list_profiles(params_dir)
    loaded = {p: load_profile(p, params_dir) for p in profiles}
    known = set(list_notebooks(folder))
    for p, sections in loaded.items():
        for nb_name in sections:
            if nb_name not in known:
                print(f"warning: params/{p}.yaml has a section for {nb_name!r}, which is not a notebook",
                      file=sys.stderr)
    lines = [
        "# Parameters",
        "",
        "This page is generated by `python -m mdlib book` from the `parameters` cell of every notebook "
        "and from `params/<profile>.yaml`; edit those, not this page.",
    ]
    if profile:
        lines += ["", f"The pages of this build were executed with the **{md_text(profile)}** profile."]
    lines += [
        "",
        "*Default* is the value in the notebook, which is what the `default` profile uses; a profile "
        "column is empty where that profile keeps the default. Re-execute one notebook with other values "
        "with, for example, `python -m mdlib run <notebook> --profile paper -p seeds 3` "
        "(see [how to reproduce](reproduce.md)).",
    ]
    for nb_name in names:
        path = resolve_notebook(nb_name, folder)
        nb = read_notebook(path)
        declared = parse_parameters(parameters_cell(nb, str(path)).source, str(path))
        values = {}
        for p in profiles:
            values[p] = resolve_parameters(nb_name, p, None, notebooks_dir=folder, params_dir=params_dir)
            values[p].pop("profile")
        shown = [p for p in profiles if p in ("smoke", "paper") or values[p]]
        lines += ["", f"## {md_text(_title(nb, nb_name))}", "",
                  f"Source `notebooks/{nb_name}.py`; {{doc}}`go to the chapter </notebooks/{nb_name}>`.", ""]
        lines.append("| Parameter | Default | " + " | ".join(map(md_text, shown)) + " | Description |")
        lines.append("|---|---|" + "---|" * len(shown) + "---|")
        for param in declared.values():
            cells = [_md_code(param.name), _md_code(param.source)]
            for p in shown:
                if param.name == "profile":
                    cells.append(_md_code(_literal(p)))
                elif param.name in values[p]:
                    cells.append(_md_code(_literal(values[p][param.name])))
                else:
                    cells.append("")
            cells.append(md_text(param.description))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_parameters_page(target: Path | None = None, profile: str | None = None, **kwargs: Any) -> Path:
    """Write :func:`parameters_page` (``kwargs`` go to it) to ``book/parameters.md``, atomically."""
    target = Path(target or paths.book_dir() / "parameters.md")
    text = parameters_page(profile, **kwargs)
    return paths.atomic_write(target, lambda tmp: tmp.write_text(text, "utf-8"))


def write_scorecard_page(target: Path | None = None, profile: str | None = None) -> Path:
    """``book/scorecard.md``: which of the paper's claims hold in this build's results
    (``mdlib.scorecard``), with the link to the archive of every figure and table."""
    from mdlib import provenance, scorecard

    return scorecard.write_page(Path(target or paths.book_dir() / "scorecard.md"), paths.results_dir(), profile=profile,
                                archive_link=provenance.archive_href("book/scorecard"))


# ---------------------------------------------------------------------------------------------
# the book


def toc_files(toc: Path | None = None) -> list[str]:
    """Every ``file:`` entry of ``_toc.yml`` (the root first), in order."""
    data = yaml.safe_load(Path(toc or paths.root() / "_toc.yml").read_text("utf-8"))
    found = [data["root"]] if "root" in data else []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in data.items() if k != "root"})
    return found


def _check_toc(names: list[str]) -> None:
    in_toc = [f.split("/", 1)[1] for f in toc_files() if f.startswith("notebooks/")]
    missing = [n for n in names if n not in in_toc]
    absent = [n for n in in_toc if n not in names]
    if missing or absent:
        raise BookError("_toc.yml and notebooks/ disagree: "
                        + (f"not in _toc.yml: {', '.join(missing)}; " if missing else "")
                        + (f"listed but no notebooks/<name>.py: {', '.join(absent)}" if absent else ""))


def _executed_profile(ipynb: Path) -> str | None:
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    return nb.metadata.get("papermill", {}).get("parameters", {}).get("profile")


def build(profile: str = "default", execute: bool = True) -> Path:
    """Execute every chapter notebook at ``profile`` (unless ``execute`` is false), generate
    ``book/parameters.md`` and ``book/scorecard.md``, zip every figure, table and provenance record
    into ``<build>/artifacts.zip`` and build the HTML book with ``jupyter-book build -W --keep-going``,
    which gets a copy of the archive (``mdlib.provenance.archive_href`` links it). Returns the path of
    ``index.html``."""
    start = time.perf_counter()
    load_profile(profile)  # unknown profile -> clear error before anything runs
    names = chapters()
    if not names:
        raise BookError(f"no chapter notebooks ({paths.notebooks_dir()}/[0-9][0-9]_*.py)")
    _check_toc(names)
    for nb_name in names:  # validate parameters and profiles before spending time executing
        resolve_parameters(nb_name, profile)
    timings = {}
    if execute:
        from mdlib import fetch

        for name in fetch.FETCHABLE:  # the offline data of the real-data chapters (no-op once cached)
            fetch.fetch(name)
        for i, nb_name in enumerate(names, 1):
            print(f"[{i}/{len(names)}] ", end="", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            run_notebook(nb_name, profile=profile)
            timings[nb_name] = time.perf_counter() - t0
        check_consistent(names)
    else:
        check_executed(names)
        check_consistent(names)
        used = {_executed_profile(paths.notebooks_dir() / f"{n}.ipynb") for n in names}
        profile = used.pop() if len(used) == 1 and None not in used else "mixed (see each chapter)"
    write_parameters_page(profile=profile)
    from mdlib import provenance

    write_scorecard_page(profile=profile)
    provenance.write_archive()
    t0 = time.perf_counter()
    index = build_html()
    provenance.publish_archive()
    timings["jupyter-book"] = time.perf_counter() - t0
    summary = ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
    print(f"book built in {time.perf_counter() - start:.0f} s ({summary}): {index}", file=sys.stderr, flush=True)
    return index


def build_html() -> Path:
    """``jupyter-book build`` of the pre-executed notebooks, warnings as errors."""
    output, project = paths.jupyter_book_output(), paths.root()
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(project), "--path-output", str(output), "--builder", "html", "-W", "--keep-going"]
    print("building the HTML book: jupyter-book build -W --keep-going", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=project)
    index = paths.html_dir() / "index.html"
    if proc.returncode != 0:
        raise BookError(f"jupyter-book build failed (exit {proc.returncode}); warnings count as errors, "
                        "see the messages above")
    if not index.is_file():
        raise BookError(f"jupyter-book build finished but {index} does not exist")
    return index
