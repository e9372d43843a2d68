"""Building the Jupyter Book: every notebook executed at a profile, the generated pages, the HTML.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from mdlib.experiments import paths
from mdlib.book import execute as execution  # build() has a parameter named execute
from mdlib.book import pages, profiles

if TYPE_CHECKING:
    pass




def write_scorecard_page(target: Path | None = None, profile: str | None = None) -> Path:
    """``book/scorecard.md``: which of the paper's claims hold in this build's results
    (``mdlib.book.scorecard_page``), with the link to the archive of every figure and table."""
    from mdlib.book import provenance, scorecard_page

    return scorecard_page.write_page(Path(target or paths.book_dir() / "scorecard.md"), paths.results_dir(),
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


def _check_toc(names: list[str]) -> None:
    in_toc = [f.split("/", 1)[1] for f in toc_files() if f.startswith("notebooks/")]
    missing = [n for n in names if n not in in_toc]
    absent = [n for n in in_toc if n not in names]
    if missing or absent:
        raise execution.BookError("_toc.yml and notebooks/ disagree: "
                        + (f"not in _toc.yml: {', '.join(missing)}; " if missing else "")
                        + (f"listed but no notebooks/<name>.py: {', '.join(absent)}" if absent else ""))


def _executed_profile(ipynb: Path) -> str | None:
    import nbformat

    nb = nbformat.read(ipynb, as_version=4)
    return nb.metadata.get("papermill", {}).get("parameters", {}).get("profile")


def build(profile: str = "default", execute: bool = True) -> Path:
    """Execute every chapter notebook at ``profile`` (unless ``execute`` is false; each first fetches the
    data it reads, ``execute.run_notebook``), generate
    ``book/parameters.md`` and ``book/scorecard.md``, zip every figure, table and provenance record
    into ``<build>/artifacts.zip`` and build the HTML book with ``jupyter-book build -W --keep-going``,
    which gets a copy of the archive (``mdlib.book.provenance.archive_href`` links it). Returns the path of
    ``index.html``."""
    start = time.perf_counter()
    profiles.load_profile(profile)  # unknown profile -> clear error before anything runs
    names = profiles.chapters()
    if not names:
        raise execution.BookError(f"no chapter notebooks ({paths.notebooks_dir()}/[0-9][0-9]_*.py)")
    _check_toc(names)
    for nb_name in names:  # validate parameters and profiles before spending time executing
        profiles.resolve_parameters(nb_name, profile)
    timings = {}
    if execute:
        for i, nb_name in enumerate(names, 1):
            print(f"[{i}/{len(names)}] ", end="", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            execution.run_notebook(nb_name, profile=profile)
            timings[nb_name] = time.perf_counter() - t0
        execution.check_consistent(names)
    else:
        execution.check_executed(names)
        execution.check_consistent(names)
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


def build_html() -> Path:
    """``jupyter-book build`` of the pre-executed notebooks, warnings as errors."""
    output, project = paths.jupyter_book_output(), paths.root()
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(project), "--path-output", str(output), "--builder", "html", "-W", "--keep-going"]
    print("building the HTML book: jupyter-book build -W --keep-going", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=project)
    index = paths.html_dir() / "index.html"
    if proc.returncode != 0:
        raise execution.BookError(f"jupyter-book build failed (exit {proc.returncode}); warnings count as errors, "
                        "see the messages above")
    if not index.is_file():
        raise execution.BookError(f"jupyter-book build finished but {index} does not exist")
    return index
