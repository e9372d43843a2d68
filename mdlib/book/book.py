"""Building the Jupyter Book: every notebook executed at a profile, the generated pages, the HTML.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from mdlib.experiments import paths
from mdlib.book import chapters
from mdlib.book import execute
from mdlib.book import pages, profiles



def write_scorecard_page(target: Path | None = None, profile: str | None = None) -> Path:
    """``book/scorecard.md``: which of the paper's claims hold in this build's results
    (``mdlib.book.scorecard.page``), with the link to the archive of every figure and table."""
    from mdlib.book import provenance
    from mdlib.book.scorecard import page

    return page.write_page(Path(target or paths.book_dir() / "scorecard.md"), paths.results_dir(),
                           profile=profile, archive_link=provenance.archive_href("book/scorecard"))



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


def _check_toc() -> None:
    """A BookError unless ``_toc.yml`` lists the registry's chapters (``mdlib.book.chapters.NAMES``), in
    its order."""
    in_toc = [f.split("/", 1)[1] for f in toc_files() if f.startswith("notebooks/")]
    if in_toc == list(chapters.NAMES):
        return
    missing = [n for n in chapters.NAMES if n not in in_toc]
    unknown = [n for n in in_toc if n not in chapters.NAMES]
    problems = ([f"not in _toc.yml: {', '.join(missing)}"] if missing else []) + (
        [f"listed but not a chapter of mdlib.book.chapters.CHAPTERS (add its Chapter entry there): {', '.join(unknown)}"]
        if unknown else [])
    raise execute.BookError("_toc.yml and the chapter registry disagree: "
                            + ("; ".join(problems) or f"_toc.yml lists the chapters in another order than the "
                                                       f"registry's: {', '.join(chapters.NAMES)}"))


def _executed_profile(ipynb: Path) -> str | None:
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    return nb.metadata.get("papermill", {}).get("parameters", {}).get("profile")


def build(profile: str = "default", skip_execute: bool = False) -> Path:
    """Execute every chapter notebook at ``profile`` (unless ``skip_execute``; each first fetches the
    data it reads, ``execute.run_notebook``), generate
    ``book/parameters.md`` and ``book/scorecard.md``, zip every figure, table and provenance record
    into ``<build>/artifacts.zip`` and build the HTML book with ``jupyter-book build -W --keep-going``,
    which gets a copy of the archive (``mdlib.book.provenance.archive_href`` links it). Returns the path of
    ``index.html``."""
    start = time.perf_counter()
    profiles.load_profile(profile)  # unknown profile -> clear error before anything runs
    names = list(chapters.NAMES)
    profiles.check_notebooks()
    _check_toc()
    for nb_name in names:  # validate parameters and profiles before spending time executing
        profiles.resolve_parameters(nb_name, profile)
    timings = {}
    if not skip_execute:
        timings = _execute(names, profile)
        execute.check_consistent(names)
    else:
        execute.check_executed(names)
        execute.check_consistent(names)
        used = {_executed_profile(paths.notebooks_dir() / f"{n}.ipynb") for n in names}
        profile = used.pop() if len(used) == 1 and None not in used else "mixed (see each chapter)"
    pages.write_parameters_page(profile=profile)
    from mdlib.book import provenance

    write_scorecard_page(profile=profile)
    provenance.write_archive()
    t0 = time.perf_counter()
    index = build_html()
    provenance.publish_archive()
    timings["jupyter-book"] = time.perf_counter() - t0
    summary = ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
    print(f"book built in {time.perf_counter() - start:.0f} s ({summary}): {index}", file=sys.stderr, flush=True)
    return index


#: The groups ``build`` executes one after another (``chapters.side_by_side``, which the plan reads too).
side_by_side = chapters.side_by_side


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _execute(names: list[str], profile: str) -> dict[str, float]:
    """Execute the chapters at ``profile`` in ``side_by_side``'s groups; each chapter's seconds. A group
    of one executes in this process; a larger one as ``python -m mdlib run`` processes, one per chapter and
    as many at once as there are cores, and a failed chapter stops the build once its group has finished."""
    timings: dict[str, float] = {}
    done = 0
    for group in side_by_side(names, _cores()):
        first = done + 1
        done += len(group)
        if len(group) == 1:
            print(f"[{first}/{len(names)}] ", end="", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            execute.run_notebook(group[0], profile=profile)
            timings[group[0]] = time.perf_counter() - t0
            continue
        print(f"[{first}-{done}/{len(names)}] side by side: {', '.join(group)}", file=sys.stderr, flush=True)
        with concurrent.futures.ThreadPoolExecutor(min(_cores(), len(group))) as pool:
            outcomes = dict(zip(group, pool.map(lambda name: _run_apart(name, profile), group)))
        failed = [name for name, (code, _) in outcomes.items() if code]
        if failed:
            raise execute.NotebookError(
                f"{', '.join(failed)} failed at profile {profile!r} (the error is above; to execute one alone: "
                f"python -m mdlib run {failed[0]} --profile {profile})")
        timings |= {name: seconds for name, (_, seconds) in outcomes.items()}
    return timings


def _run_apart(name: str, profile: str) -> tuple[int, float]:
    """``python -m mdlib run name --profile profile`` in this project, stopping if this process dies
    (``paths.PARENT_ENV``): its exit code and seconds. Chapters side by side share the terminal, so each
    shows its progress a line at a time (``mdlib.book.progress``), never redrawn."""
    from mdlib.book import progress

    env = dict(os.environ, **{paths.ROOT_ENV: str(paths.root()), paths.PARENT_ENV: str(os.getpid())})
    if progress.chosen_mode() != "off":
        env[progress.MODE_ENV] = "lines"
    t0 = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "mdlib", "run", name, "--profile", profile], env=env).returncode
    return code, time.perf_counter() - t0


def build_html() -> Path:
    """``jupyter-book build`` of the pre-executed notebooks, warnings as errors."""
    output, project = paths.jupyter_book_output(), paths.root()
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(project), "--path-output", str(output), "--builder", "html", "-W", "--keep-going"]
    print("building the HTML book: jupyter-book build -W --keep-going", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=project)
    index = paths.html_dir() / "index.html"
    if proc.returncode != 0:
        raise execute.BookError(f"jupyter-book build failed (exit {proc.returncode}); warnings count as errors, "
                        "see the messages above")
    if not index.is_file():
        raise execute.BookError(f"jupyter-book build finished but {index} does not exist")
    return index
