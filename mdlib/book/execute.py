"""Executing one notebook with papermill at a profile (``run_notebook``), and the checks that the
executed notebooks of a build are complete and from one profile.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NoReturn


from mdlib import first_line
from mdlib.experiments import paths
from mdlib.book import profiles

if TYPE_CHECKING:
    pass


KERNEL = "python3"
FAILED_SUFFIX = ".failed.ipynb"  #: a failed execution is kept beside the executed notebook for inspection


class NotebookError(RuntimeError):
    """A notebook failed to execute (the message names it and the failing cell)."""


class BookError(RuntimeError):
    """The book could not be built (configuration, table of contents, Sphinx warnings)."""


@contextlib.contextmanager
def _kernel_environment(run: Mapping[str, Any] | None = None, executor: str | None = None) -> Iterator[None]:
    """The kernel imports the mdlib this process runs (PYTHONPATH: the folder holding the package, a
    checkout or site-packages) and reads and writes where this process would (``MDLIB_ROOT``: the
    project this process found, when it found one).

    ``run`` (``{notebook, profile, parameters, overrides}``) reaches the kernel as the JSON value of
    ``mdlib.book.provenance.ENV``, from which every saved figure and table records how it was made.

    ``MDLIB_BUILD_DIR`` and ``MDLIB_DATA_DIR``, when set, are passed down as absolute paths resolved
    here: the kernel runs in ``notebooks/`` and would resolve a relative one against that folder.
    ``executor`` (the profile's ``executor: SPEC``) reaches ``pool.run_many`` in the kernel as
    ``$MDLIB_EXECUTOR`` unless that is set already (``--executor`` sets it for the whole command).
    Progress bars (tqdm) are off inside executed notebooks (``TQDM_DISABLE=1`` unless set): their
    carriage-return output would clutter the book; papermill shows progress per cell instead.
    """
    import json

    from mdlib.book import provenance
    from mdlib.experiments import executors, fetch

    keys = ("PYTHONPATH", "OMP_WAIT_POLICY", "TQDM_DISABLE", "PYTHONWARNINGS", paths.BUILD_ENV, fetch.DATA_ENV,
            paths.ROOT_ENV, provenance.ENV, executors.EXECUTOR_ENV)
    saved = {key: os.environ.get(key) for key in keys}
    if run is not None:
        os.environ[provenance.ENV] = json.dumps(dict(run), default=str)
    if executor is not None and not saved[executors.EXECUTOR_ENV]:
        os.environ[executors.EXECUTOR_ENV] = executor
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

    path = profiles.resolve_notebook(name, notebooks_dir)
    nb_name = path.stem
    parameters = profiles.resolve_parameters(nb_name, profile, overrides, notebooks_dir=path.parent, params_dir=params_dir)
    executed = {n: p.value if p.literal else p.source for n, p in profiles.notebook_parameters(path).items()}
    execution = uuid.uuid4().hex
    run = {"notebook": nb_name, "profile": profile, "execution": execution, "parameters": {**executed, **parameters},
           "overrides": {key: parameters[key] for key in overrides or {}}}
    executor = profiles.profile_executor(profile, params_dir)
    nb = _prepared(path, profile, execution)
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
            with _kernel_environment(run, executor):
                # The kernel's own log (a TCP warning at start, a traceback when Ctrl-C stops it mid-cell)
                # says nothing about the notebook: a cell's error is in the notebook and raised here.
                papermill.execute_notebook(
                    nb, str(partial), parameters=parameters, kernel_name=KERNEL, language="python",
                    cwd=str(path.parent), progress_bar=progress, start_timeout=300, log_output=False,
                    extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
                )
            _record_portable_paths(partial, path, output)
        except BaseException:
            if partial.exists():
                with contextlib.suppress(Exception):  # a notebook papermill could not finish writing
                    _record_portable_paths(partial, path, failed)
                os.replace(partial, failed)
                kept.append(failed)
            raise

    try:
        with paths.all_or_nothing(_artifact_folders(), _journal(nb_name)):
            paths.atomic_write(output, execute, tag="executing")
            _drop_earlier_artifacts(nb_name, execution)
    except BaseException as exc:
        _raise_notebook_error(exc, nb_name, profile, output, kept)
    failed.unlink(missing_ok=True)  # a failure of an earlier run, now superseded
    if progress:
        print(f"  {nb_name}: {time.perf_counter() - start:.1f} s -> {output}", file=sys.stderr, flush=True)
    return output


def _raise_notebook_error(exc: BaseException, nb_name: str, profile: str, output: Path, kept: list[Path]) -> NoReturn:
    """Raise ``NotebookError`` for a failed execution, naming the notebook, the failing cell (or the
    error) and what was kept: the previous executed notebook, the artifacts as before, this run's
    failed notebook. Interrupts (KeyboardInterrupt, SystemExit) are raised unchanged."""
    from papermill.exceptions import PapermillExecutionError

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
    raise exc


def _prepared(path: Path, profile: str, execution: str) -> Any:
    """The notebook ``path`` as papermill executes it: its metadata carries the execution id, the
    profile and the build folder (``mdlib``), the kernel, and no jupytext pairing."""
    nb = profiles.read_notebook(path)
    nb.metadata["mdlib"] = {"execution": execution, "profile": profile, "build": _build_label()}
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    # The executed .ipynb is an output, not a jupytext pair of the .py: opening and saving it in
    # Jupyter must never write over the source.
    nb.metadata.get("jupytext", {}).pop("formats", None)
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def _project_relative(path: Path) -> str | None:
    """``path`` relative to the project (POSIX separators), or None outside a project."""
    root = paths.find_root()
    path = Path(path).resolve()
    if root is None or not path.is_relative_to(root.resolve()):
        return None
    return path.relative_to(root.resolve()).as_posix()


def _build_label() -> str:
    """The build folder as an executed notebook records it (``metadata.mdlib.build``): relative to the
    project when inside it (no machine path in the notebook), else absolute (a folder chosen by
    ``$MDLIB_BUILD_DIR`` elsewhere)."""
    return _project_relative(paths.build_dir()) or str(paths.build_dir())


def _record_portable_paths(ipynb: Path, source: Path, output: Path) -> None:
    """Rewrite papermill's record in the executed notebook ``ipynb``: ``input_path`` (papermill stores
    the whole input notebook there, or its absolute path) and ``output_path`` (the temporary file)
    become the source and the output relative to the project, or their file names outside it."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    record = nb.metadata.setdefault("papermill", {})
    for key, where in (("input_path", source), ("output_path", output)):
        record[key] = _project_relative(where) or Path(where).name
    nbformat.write(nb, str(ipynb))


def _artifact_folders() -> dict[str, Path]:
    return {"figures": paths.figures_dir(), "results": paths.results_dir()}


def _journal(nb_name: str) -> Path:
    return paths.build_dir() / ".rollback" / nb_name


def _drop_earlier_artifacts(nb_name: str, execution: str) -> None:
    """Remove the figures and tables of ``nb_name`` that earlier executions wrote and this one did not."""
    from mdlib.book import provenance

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

    from mdlib.book import provenance

    folder = Path(notebooks_dir or paths.notebooks_dir())
    for name in names:
        if paths.recover(_journal(name), _artifact_folders()):
            print(f"{name}: an execution was killed before it finished; its figures and results were set back "
                  "to those before it", file=sys.stderr)
    build, problems = _build_label(), {}
    executions = {}
    for name in names:
        meta = nbformat.read(folder / f"{name}.ipynb", as_version=4).metadata.get("mdlib", {})
        executions[name] = meta.get("execution")
        if meta.get("build") not in (build, str(paths.build_dir())):  # or absolute, as earlier runs wrote it
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


