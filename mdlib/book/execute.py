"""Executing one notebook with papermill at a profile (``run_notebook``), into the book's folders or a
variant's (``default_output_dir``), writing a notebook for papermill's own command (``write_notebook``),
and the checks that the executed notebooks of a build are complete and from one profile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, NoReturn

from mdlib import first_line
from mdlib.book import chapters, profiles
from mdlib.experiments import paths
from mdlib.runs import lockfile
from mdlib.runs.files import atomic_write


KERNEL = "python3"
FAILED_SUFFIX = ".failed.ipynb"  #: a failed execution is kept beside the executed notebook for inspection


TORCH_HELP = ("choose a CUDA build of torch that matches the driver with TORCH= (README, \"Choosing a torch "
              "wheel\"), e.g. make book TORCH='torch==2.14.1+cu126 torchvision==0.29.1+cu126 "
              "--extra-index-url https://download.pytorch.org/whl/cu126'")


def gpu_warning(notebook: str, profile: str) -> str | None:
    """The one-line warning for a chapter the paper profile trains at the paper's scale (its
    ``at_scale`` in ``mdlib.book.chapters``) run at that profile where torch sees no CUDA GPU (None
    otherwise): what the profile trains, and, when ``nvidia-smi`` lists GPUs that this torch cannot
    use, the driver's CUDA version against the one torch was built for. Imports torch only for those
    chapters at that profile."""
    at_scale = chapters.chapter(notebook).at_scale if notebook in chapters.NAMES else None
    if profile != "paper" or at_scale is None:
        return None
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.is_available():
        return None
    cost = f"warning: {notebook} at the paper profile trains {at_scale}"
    gpus, driver_cuda = _driver_gpus()
    if not gpus:
        return (f"{cost}, and torch sees no CUDA GPU: on this CPU that takes months; see `python -m mdlib plan "
                f"--profile paper`; on a machine with a GPU, {TORCH_HELP}")
    built = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    return (f"{cost}, but torch {torch.__version__} ({built}) cannot use the {gpus} GPU(s) nvidia-smi lists "
            f"(driver CUDA {driver_cuda or 'unknown'}): it would train on the CPU, for months; {TORCH_HELP}, "
            "a CUDA version at most the driver's")


def _driver_gpus() -> tuple[int, str | None]:
    """(the GPUs ``nvidia-smi -L`` lists, the driver's CUDA version in ``nvidia-smi``'s header); (0, None)
    without nvidia-smi or when it fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return 0, None
    try:
        listed = subprocess.run([command, "-L"], capture_output=True, text=True, timeout=30)
        header = subprocess.run([command], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0, None
    gpus = sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0
    version = re.search(r"CUDA Version:\s*([0-9.]+)", header.stdout)
    return gpus, version.group(1) if version else None


class NotebookError(RuntimeError):
    """A notebook failed to execute (the message names it and the failing cell)."""


class BookError(RuntimeError):
    """The book could not be built (configuration, table of contents, Sphinx warnings)."""


@contextlib.contextmanager
def _kernel_environment(run: Mapping[str, Any] | None = None, output: Path | None = None,
                        executor: str | None = None, progress_dir: Path | None = None) -> Iterator[None]:
    """The kernel imports the mdlib this process runs (PYTHONPATH: the folder holding the package, a
    checkout or site-packages) and reads and writes where this process would (``MDLIB_ROOT``: the
    project this process found, when it found one).

    ``run`` (``{notebook, profile, parameters, overrides, output_dir}``) reaches the kernel as the JSON
    value of ``mdlib.book.provenance.ENV``, from which every saved figure and table records how it was
    made; ``output``, when given, as ``MDLIB_OUTPUT_DIR``: the folder that gets its figures and results.

    ``MDLIB_BUILD_DIR`` and ``MDLIB_DATA_DIR``, when set, are passed down as absolute paths resolved
    here: the kernel runs in ``notebooks/`` and would resolve a relative one against that folder.
    ``executor`` (the profile's ``executor: SPEC``) reaches ``pool.run_many`` in the kernel as
    ``$MDLIB_EXECUTOR`` unless that is set already (``--executor`` sets it for the whole command).
    Progress bars (tqdm) are off inside executed notebooks (``TQDM_DISABLE=1`` unless set): their
    carriage-return output would clutter the book. The kernel's training runs tell their progress through
    the files of ``progress_dir`` instead (``$MDLIB_PROGRESS_DIR``, ``mdlib.book.progress``), which this
    process shows on its terminal; without one, the variable is not passed on.
    """
    from mdlib.book import provenance
    from mdlib.experiments import fetch
    from mdlib.runs import pool
    from mdlib.runs.progress import PROGRESS_ENV

    keys = ("PYTHONPATH", "OMP_WAIT_POLICY", "TQDM_DISABLE", "PYTHONWARNINGS", paths.BUILD_ENV, fetch.DATA_ENV,
            paths.ROOT_ENV, paths.OUTPUT_ENV, provenance.ENV, pool.EXECUTOR_ENV, PROGRESS_ENV)
    saved = {key: os.environ.get(key) for key in keys}
    if progress_dir is not None:
        os.environ[PROGRESS_ENV] = str(Path(progress_dir).resolve())
    else:
        os.environ.pop(PROGRESS_ENV, None)
    if run is not None:
        os.environ[provenance.ENV] = json.dumps(dict(run), default=str)
    if output is not None:
        os.environ[paths.OUTPUT_ENV] = str(Path(output).resolve())
    if executor is not None and not saved[pool.EXECUTOR_ENV]:
        os.environ[pool.EXECUTOR_ENV] = executor
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


#: The parameters that choose where a chapter's runs train (processes, GPUs), not what they compute:
#: overriding them alone still executes the book's own chapter.
PLACEMENT = frozenset({"workers"})


def default_output_dir(name: str, profile: str = "default", overrides: Mapping[str, Any] | None = None, *,
                       notebooks_dir: Path | None = None, params_dir: Path | None = None) -> Path:
    """Where ``python -m mdlib run`` writes ``name`` at ``profile`` with ``overrides`` when no
    ``--output-dir`` is given: without overrides (or with only overrides of :data:`PLACEMENT`, which
    change where runs train, not what they compute) the book's own build directory; with them the variant
    folder ``<build>/variants/<name>-<hash>``, ``<hash>`` the first 8 hex digits of the SHA-256 of the
    profile and the overrides as the notebook reads them (so the same command, in any order of its
    ``-p``, writes into the same folder). Unknown parameters and values of the wrong type raise."""
    path = profiles.resolve_notebook(name, notebooks_dir)
    parameters = profiles.resolve_parameters(path.stem, profile, overrides, notebooks_dir=path.parent,
                                             params_dir=params_dir)
    chosen = {key: parameters[key] for key in overrides or {} if key not in PLACEMENT}
    if not chosen:
        return paths.build_dir()
    text = json.dumps({"profile": profile, "overrides": chosen}, sort_keys=True, ensure_ascii=False, default=str)
    return paths.build_dir() / "variants" / f"{path.stem}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def run_notebook(name: str, profile: str = "default", overrides: Mapping[str, Any] | None = None,
                 output_dir: Path | None = None, *, artifacts_dir: Path | None = None,
                 notebooks_dir: Path | None = None, params_dir: Path | None = None, progress: bool = True) -> Path:
    """Execute ``notebooks/<name>.py`` with papermill at ``profile`` (plus ``overrides``) and write the
    executed notebook ``<output_dir or notebooks/>/<name>.ipynb``; returns its path. The data the
    chapter reads at these parameters (``mdlib.book.chapters``) is fetched first where missing
    (``fetch.ensure``).

    Its figures, results and provenance records go to ``<artifacts_dir>/figures`` and ``/results``
    (``artifacts_dir``: the build directory by default, the book's own; the kernel gets it as
    ``MDLIB_OUTPUT_DIR``). The results store and the checkpoints are the build directory's whatever
    ``artifacts_dir`` is. A record's command names ``artifacts_dir`` (``--output-dir``) unless it is
    the folder that command writes into anyway (:func:`default_output_dir`).

    The kernel (``python3``) runs in the notebooks folder. The chapter commits all or nothing, and
    only its own files: the notebook executes into ``<artifacts_dir>/.staging/<name>/`` (the executed
    notebook, and its figures and results: the kernel's ``MDLIB_OUTPUT_DIR``) while it holds the
    chapter's lock (a second execution of it into the same folder is refused by name), and only a
    finished execution is moved into place (``_commit``), so a failed, interrupted or killed execution
    leaves the previous notebook and every artifact byte for byte, its own and other chapters'; a kill
    during the move is completed by the chapter's next execution or the book's check. The failed
    notebook, with its traceback, is saved as ``<name>.failed.ipynb`` and a failing cell raises
    ``NotebookError`` naming the notebook and cell. On success the chapter's artifacts of earlier
    executions that this one did not write again are removed. Every artifact's record and the
    executed notebook's metadata (``mdlib``) carry one execution id, which :func:`check_consistent`
    compares before a book is rendered.
    """
    import papermill

    from mdlib.experiments import fetch

    path = profiles.resolve_notebook(name, notebooks_dir)
    nb_name = path.stem
    parameters = profiles.resolve_parameters(nb_name, profile, overrides, notebooks_dir=path.parent, params_dir=params_dir)
    execution = uuid.uuid4().hex
    artifacts = Path(artifacts_dir).resolve() if artifacts_dir is not None else paths.build_dir()
    implied = default_output_dir(nb_name, profile, overrides, notebooks_dir=path.parent, params_dir=params_dir)
    executed = profiles.executed_parameters(nb_name, profile, overrides, notebooks_dir=path.parent, params_dir=params_dir)
    run = {"notebook": nb_name, "profile": profile, "execution": execution, "parameters": executed,
           "overrides": {key: parameters[key] for key in overrides or {}},
           "output_dir": None if artifacts == implied else str(artifacts),
           "variant": None if artifacts == paths.build_dir() else hashlib.sha256(str(artifacts).encode()).hexdigest()[:8]}
    executor = profiles.profile_executor(profile, params_dir)
    nb = _prepared(path, profile, execution)
    out_dir = Path(output_dir) if output_dir is not None else path.parent
    output = out_dir / f"{nb_name}.ipynb"
    failed = out_dir / f"{nb_name}{FAILED_SUFFIX}"
    shown = ", ".join(f"{k}={v!r}" for k, v in parameters.items())
    if (warning := gpu_warning(nb_name, profile)) is not None:
        print(warning, file=sys.stderr, flush=True)
    if nb_name in chapters.NAMES:  # the data it reads at these parameters, when missing (a test's notebook reads none)
        fetch.ensure(chapters.chapter(nb_name).needed(executed))
    if progress:
        print(f"executing {nb_name} ({shown})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    kept: list[Path] = []  # this run's failed notebook, once saved
    with _chapter_lock(nb_name, artifacts), contextlib.ExitStack() as watched:
        before = _speed_probe() if nb_name in chapters.NAMES else None  # a test's notebook has no plan to check
        _recover(nb_name, artifacts)
        staging = _staging(nb_name, artifacts)
        staged = staging / output.name
        monitor = _monitor(nb_name, executed, execution, watched) if progress else None
        try:
            staging.mkdir(parents=True)
            with _kernel_environment(run, staging, executor, monitor and monitor.watch.folder):
                # The kernel's own log (a TCP warning at start, a traceback when Ctrl-C stops it mid-cell)
                # says nothing about the notebook: a cell's error is in the notebook and raised here.
                # Progress goes to this terminal (monitor), papermill's cell counter included.
                with _showing(monitor):
                    papermill.execute_notebook(
                        nb, str(staged), parameters=parameters, kernel_name=KERNEL, language="python",
                        cwd=str(path.parent), progress_bar=monitor.papermill_bar() if monitor else False,
                        start_timeout=300, log_output=False, extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
                    )
            _record_portable_paths(staged, path, output, None if before is None else _speed(before))
            _echo_store_warnings(staged, nb_name)
        except BaseException as exc:
            if monitor is not None and isinstance(exc, (KeyboardInterrupt, SystemExit)):
                if (line := monitor.kept()) is not None:
                    print(line, file=sys.stderr, flush=True)
            if staged.exists():
                with contextlib.suppress(Exception):  # a notebook papermill could not finish writing
                    _record_portable_paths(staged, path, failed)
                _move(staged, failed)
                kept.append(failed)
            shutil.rmtree(staging, ignore_errors=True)
            _raise_notebook_error(exc, nb_name, profile, output, kept)
        (staging / COMMIT).write_text(json.dumps({"execution": execution, "notebook": str(output)}), "utf-8")
        committing = staging.with_name(staging.name + COMMITTING)
        os.replace(staging, committing)  # from here on the execution counts: a kill is finished by _recover
        _commit(nb_name, committing, artifacts)
    failed.unlink(missing_ok=True)  # a failure of an earlier run, now superseded
    if progress:
        print(f"  {nb_name}: {time.perf_counter() - start:.1f} s -> {output}", file=sys.stderr, flush=True)
    return output


def _monitor(nb_name: str, executed: Mapping[str, Any], execution: str, stack: contextlib.ExitStack):
    """The progress monitor of an execution of ``nb_name`` at its parameters ``executed``
    (``mdlib.book.progress``), its folder ``<build>/.progress/<host>-<pid>-<execution>/`` held by
    ``stack`` (removed when it closes); None when ``$MDLIB_PROGRESS`` is off."""
    from mdlib.book import progress

    mode, every = progress.chosen_mode(), progress.log_every()  # a wrong setting: an error before the kernel starts
    if mode == "off":
        return None
    folder = stack.enter_context(progress.watching(
        paths.build_dir() / ".progress" / f"{lockfile.host()}-{os.getpid()}-{execution[:12]}"))

    def plan_time():
        from mdlib.book import plan

        return plan.planned_time(nb_name, executed)

    ours = nb_name in chapters.NAMES  # a test's notebook has no plan
    return progress.Monitor(nb_name, folder, mode=mode, every=every,
                            planned=(lambda: progress.planned_runs(nb_name, executed)) if ours else None,
                            plan_time=plan_time if ours else None)


@contextlib.contextmanager
def _showing(monitor) -> Iterator[None]:
    """``monitor`` shows the progress during the block (nothing when it is None)."""
    if monitor is None:
        yield
        return
    monitor.start()
    try:
        yield
    finally:
        monitor.stop()


#: The file of a staged execution that says where its executed notebook goes and its execution id.
COMMIT = "commit.json"
#: The suffix of a staged execution that finished and is being moved into place.
COMMITTING = ".commit"


def _staging(nb_name: str, artifacts: Path) -> Path:
    """Where an execution of ``nb_name`` stages its executed notebook and its ``figures/`` and
    ``results/`` (the kernel's ``MDLIB_OUTPUT_DIR``): ``<artifacts>/.staging/<nb_name>``."""
    return artifacts / ".staging" / nb_name


def _move(source: Path, target: Path) -> None:
    """Put the file ``source`` at ``target`` (atomically, across file systems too), then remove ``source``."""
    atomic_write(target, lambda tmp: shutil.copyfile(source, tmp), tag="executing")
    source.unlink()


def _commit(nb_name: str, committing: Path, artifacts: Path) -> None:
    """Move a finished execution's files into place: its figures and results into ``artifacts`` file by
    file, then the removal of the chapter's artifacts that earlier executions wrote and this one did
    not, then its executed notebook, then the staging folder. Each step can be repeated, so a commit
    that was killed is finished by running it again (``_recover``)."""
    plan = json.loads((committing / COMMIT).read_text("utf-8"))
    for folder in (paths.figures_dir(committing), paths.results_dir(committing)):
        for staged in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if staged.is_file():
                target = artifacts / staged.relative_to(committing)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, target)
    _drop_earlier_artifacts(nb_name, plan["execution"], artifacts)
    notebook = committing / Path(plan["notebook"]).name
    if notebook.exists():
        _move(notebook, Path(plan["notebook"]))
    shutil.rmtree(committing)


def _recover(nb_name: str, artifacts: Path) -> str | None:
    """Settle an execution of ``nb_name`` into ``artifacts`` that was killed (the chapter's lock held):
    one that had finished is committed, one that had not is discarded; what was done, or None. Nothing
    outside the chapter's staging folder is touched but the files its commit puts in place."""
    staging = _staging(nb_name, artifacts)
    committing = staging.with_name(staging.name + COMMITTING)
    if committing.is_dir():
        _commit(nb_name, committing, artifacts)
        return "an execution that had finished was killed while it was put in place; its commit was completed"
    if staging.exists():
        shutil.rmtree(staging)
        return "an execution was killed before it finished; what it had written was discarded"
    return None


@contextlib.contextmanager
def _chapter_lock(nb_name: str, artifacts: Path) -> Iterator[None]:
    """Hold ``<artifacts>/.staging/<nb_name>.lock`` for the block (``lockfile.hold``, with its heartbeat):
    one execution of a chapter into one folder at a time. A lock whose holder is gone (no longer running
    on this host, a heartbeat older than the lock timeout, an unreadable record) is taken over; one held
    by a live process is refused by name (BookError)."""
    lock = _staging(nb_name, artifacts).with_name(f"{nb_name}.lock")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(lockfile.hold(lock, f"chapter {nb_name}", wait=False))
        except lockfile.LockHeld as held:
            raise BookError(f"{nb_name} is being executed into {artifacts} by {held.record.get('host')}:"
                            f"{held.record.get('pid')} (since {held.record.get('started')}): wait until it "
                            f"finishes, or execute into another folder (MDLIB_BUILD_DIR or --output-dir); if no "
                            f"such process runs, delete {lock}") from None
        yield


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


def _as_ipynb(path: Path) -> Any:
    """The jupytext source ``path`` as a notebook for papermill: the kernel ``python3``, no jupytext
    pairing (the ``.ipynb`` is an output: opening and saving it in Jupyter must never write over the
    source)."""
    nb = profiles.read_notebook(path)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata.get("jupytext", {}).pop("formats", None)
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def _prepared(path: Path, profile: str, execution: str) -> Any:
    """The notebook ``path`` as papermill executes it (:func:`_as_ipynb`), its metadata carrying the
    execution id, the profile and the build folder (``mdlib``)."""
    nb = _as_ipynb(path)
    nb.metadata["mdlib"] = {"execution": execution, "profile": profile, "build": _build_label()}
    return nb


def write_notebook(name: str, target: str | os.PathLike | None = None, *, force: bool = False,
                   notebooks_dir: Path | None = None) -> Path:
    """Write the notebook ``name`` from its jupytext source as an unexecuted ``.ipynb`` for papermill's own
    command or Jupyter (kernel ``python3``, no jupytext pairing, no execution record) at ``target``,
    by default ``<name>.ipynb`` in the working directory; returns its path. Executed so, it saves its
    figures and results into ``$MDLIB_OUTPUT_DIR``, else ``<build>/scratch`` (never the book's).

    A ``target`` that is not ``.ipynb`` is refused (ValueError), and so, unless ``force``, is the book's
    own executed notebook ``notebooks/<name>.ipynb``."""
    import nbformat

    path = profiles.resolve_notebook(name, notebooks_dir)
    out = Path(target) if target is not None else Path.cwd() / f"{path.stem}.ipynb"
    if out.suffix != ".ipynb":
        raise ValueError(f"-o {out}: the notebook is written as .ipynb; give a path ending in .ipynb")
    if not force and out.resolve() == path.with_suffix(".ipynb").resolve():
        raise ValueError(f"-o {out} is the book's executed notebook of {path.stem}; give another path, or --force "
                         "to replace it with the unexecuted one")
    nb = _as_ipynb(path)
    return atomic_write(out, lambda tmp: nbformat.write(nb, str(tmp)))


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


def _record_portable_paths(ipynb: Path, source: Path, output: Path, speed: Mapping[str, Any] | None = None) -> None:
    """Rewrite papermill's record in the executed notebook ``ipynb``: ``input_path`` (papermill stores
    the whole input notebook there, or its absolute path) and ``output_path`` (the temporary file)
    become the source and the output relative to the project, or their file names outside it; the
    machine's ``speed`` around the execution (:func:`_speed_probe`) joins its ``mdlib`` metadata."""
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    record = nb.metadata.setdefault("papermill", {})
    for key, where in (("input_path", source), ("output_path", output)):
        record[key] = _project_relative(where) or Path(where).name
    if speed:
        nb.metadata.setdefault("mdlib", {})["speed"] = dict(speed)
    nbformat.write(nb, str(ipynb))


def _speed_probe() -> float | None:
    """The machine's speed now (``steptimes.probe``, seconds), which an execution of a chapter reads before
    and after it for ``plan --against``; None when ``$MDLIB_SPEED_PROBE`` is off."""
    from mdlib.book import steptimes

    return steptimes.probe() if steptimes.probing() else None


def _speed(before: float) -> dict[str, Any]:
    """A chapter's ``mdlib.speed`` metadata, once it has run: the probe's readings before it and now, and
    what the probe reads."""
    from mdlib.book import steptimes

    return {"before": before, "after": steptimes.probe(), "probe": steptimes.PROBE_TEXT}


#: What the store warns when it recomputes an entry instead of serving it (``store._read``).
STORE_WARNING = re.compile(r"StoreWarning: (ignoring unreadable run entry .*)$")


def _echo_store_warnings(ipynb: Path, nb_name: str) -> None:
    """Print on the terminal, one line each, the store entries the kernel ignored and recomputed (its
    warnings are otherwise only in the notebook's outputs)."""
    import nbformat

    for cell in nbformat.read(ipynb, as_version=4).cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                for line in out.get("text", "").splitlines():
                    if found := STORE_WARNING.search(line):
                        print(f"  {nb_name}: {found.group(1)}", file=sys.stderr, flush=True)


def _drop_earlier_artifacts(nb_name: str, execution: str, folder: Path) -> None:
    """Remove the figures and tables of ``nb_name`` in ``folder`` that earlier executions wrote and this
    one did not."""
    from mdlib.book import provenance

    for path, record in list(provenance.records(folder)):
        if record.get("notebook") == nb_name and record.get("execution") != execution:
            for name in record.get("files") or []:
                (folder / name).unlink(missing_ok=True)
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
        with _chapter_lock(name, paths.build_dir()):
            if (done := _recover(name, paths.build_dir())) is not None:
                print(f"{name}: {done}", file=sys.stderr)
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


