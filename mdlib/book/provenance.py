"""Provenance of every saved figure and table: what produced it, and how to produce it again.

``artifacts.save_figure`` and ``artifacts.save_table`` call :func:`write` after saving, which writes one JSON
record per label (atomically) into the output directory (``mdlib.experiments.paths.output_dir``: the
build directory for the book's own executions, a variant's folder, or ``<build>/scratch``):

    <output>/figures/<label>.json   for a figure (beside its PNG and PDF)
    <output>/results/<label>.json   for every label with a CSV (a table, and a figure saved with data=)

A figure with data has both files, with the same content. The PNG (text chunk ``Provenance``) and the
PDF (info dict ``Subject``) carry the same JSON. The record holds:

* ``label``, ``kind`` ("figure" / "table"), ``reproduces`` (the paper's figure or table, from
  :data:`mdlib.experiments.paper.ARTIFACTS`, or None) and ``new`` (true for an analysis the paper does not have);
* ``notebook``, ``profile``, ``execution`` (the id of the notebook's execution, also in the executed
  ``.ipynb``), ``parameters`` (every parameter as executed), ``overrides`` (those given
  on the command line), ``output_dir`` (the folder the command must name with ``--output-dir``: one
  other than the book's or the variant's own, else None) and ``command`` (the
  ``python -m mdlib run`` line that regenerates it, into the same folder); these come from the
  environment variable :data:`ENV` that ``mdlib.book.execute.run_notebook`` sets for the kernel, and
  are None outside that pipeline (a notebook executed by papermill's own command or in Jupyter);
* ``executed_by``: :data:`BY_MDLIB` inside that pipeline, else :data:`OUTSIDE`, which says so;
* ``runs``: ``kind/key`` of every stored run the process loaded or stored before the save
  (``mdlib.runs.store.used_runs``): in a notebook, its runs up to that figure, a superset of those drawn;
  each key holds the fingerprint of the code that computed the run;
* ``code``: the fingerprint of every mdlib source file as this process read them
  (``mdlib.runs.identity``), which names the library code behind the artifact even in a dirty tree;
* ``git`` (``commit``, ``dirty``; None outside a git checkout), ``versions`` (mdlib, torch, numpy,
  python), ``hardware`` (platform, CPU model and count, GPU name or None), ``time`` (UTC, ISO 8601),
  ``files`` (relative to the output directory), ``sha256`` ({file: hash} of the CSV, written before the
  record; the scorecard judges only a CSV its record vouches for).

:func:`write_archive` zips every figure, table and record into ``<build>/artifacts.zip``;
:func:`reproduce_html` is the collapsed "reproduce and cite" block the book shows under each artifact.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import html
import json
import os
import platform
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from mdlib.experiments import paper, paths
from mdlib.runs import identity
from mdlib.runs.files import atomic_write

#: The environment variable (JSON: notebook, profile, parameters, overrides) set for a notebook's kernel.
ENV = "MDLIB_NOTEBOOK_RUN"
#: Where :func:`write_archive` puts the archive, relative to the build directory and to the HTML root.
ARCHIVE = "artifacts.zip"
ARCHIVE_HTML = f"_downloads/{ARCHIVE}"
#: ``executed_by`` of a record saved by ``python -m mdlib run`` or ``book``, and of any other.
BY_MDLIB = "python -m mdlib run"
OUTSIDE = ("outside python -m mdlib run (papermill's own command, Jupyter or a script): the notebook, profile, "
           "parameters and command are unknown")



# ---------------------------------------------------------------------------------------------
# the fields


def notebook_run() -> dict[str, Any]:
    """``{notebook, profile, execution, parameters, overrides, output_dir, variant}`` from :data:`ENV` (all
    None when it is unset or unreadable: a notebook run outside ``mdlib.book.execute.run_notebook``);
    ``execution`` is the id of one execution of the notebook, which its executed ``.ipynb`` carries too;
    ``output_dir`` is the folder a command must name with ``--output-dir`` to write there again, or None;
    ``variant`` names the folder a variant writes into (8 hex digits), None for the book's own chapter."""
    empty = dict.fromkeys(("notebook", "profile", "execution", "parameters", "overrides", "output_dir", "variant"))
    try:
        value = json.loads(os.environ.get(ENV) or "null")
    except ValueError:
        return empty
    if not isinstance(value, dict):
        return empty
    return {key: value.get(key) for key in empty}


def command(notebook: str | None, profile: str | None, overrides: Mapping[str, Any] | None,
            output_dir: str | None = None) -> str | None:
    """The shell command that executes ``notebook`` again at ``profile`` with ``overrides``
    (``python -m mdlib run NN_name --profile P -p key value ... [--output-dir DIR]``), into the same
    folder: the book's own without overrides, the same variant folder with them (named by a hash of the
    profile and the overrides), ``output_dir`` when one was given; None without a notebook.

    Every value is written as JSON, which the command line reads back as YAML, exactly: a string in
    double quotes stays that string whatever it looks like ("1e-3", "yes"). A space goes before a
    leading minus (``' -1e-05'``): argparse would take ``-1e-05`` for an option; YAML skips the space."""
    if not notebook:
        return None
    parts = ["python", "-m", "mdlib", "run", notebook, "--profile", profile or "default"]
    for key, value in (overrides or {}).items():
        text = json.dumps(value, ensure_ascii=False)
        parts += ["-p", key, f" {text}" if text.startswith("-") else text]
    if output_dir:
        parts += ["--output-dir", output_dir]
    return shlex.join(parts)


def git_state(root: Path | None = None) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout at ``root`` (the book project,
    ``mdlib.experiments.paths.find_root``, by default); both None when there is no project, ``root`` is not the top
    of a git work tree or git is unavailable. Dirty: a tracked file modified, or an untracked file git
    does not ignore."""
    root = Path(root).resolve() if root is not None else paths.find_root()
    if root is None:
        return {"commit": None, "dirty": None}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root:
            raise ValueError("inside another repository")
        return {"commit": git("rev-parse", "--verify", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, ValueError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    import numpy

    from mdlib import __version__

    return {"mdlib": __version__, "torch": _version("torch"), "numpy": numpy.__version__,
            "python": platform.python_version()}


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo, else the platform's processor; None where neither says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def hardware() -> dict[str, Any]:
    """Platform, CPU model and count, and the name of CUDA device 0 (None without one, or when torch
    has not been imported: the record never imports torch itself)."""
    gpu = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - a broken driver: no GPU to report
            gpu = None
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpu": gpu}


def record(label: str, kind: str, files: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """The provenance record of the artifact ``label`` (``kind`` "figure" or "table") saved now."""
    from mdlib.runs import store

    if kind not in ("figure", "table"):
        raise ValueError(f"kind must be 'figure' or 'table', got {kind!r}")
    run = notebook_run()
    output = paths.output_dir()
    rel = []
    for path in (files or {}).values():
        try:
            rel.append(Path(path).relative_to(output).as_posix())
        except ValueError:
            rel.append(str(path))
    reproduces = paper.ARTIFACTS.get(label)
    return {
        "label": label,
        "kind": kind,
        "reproduces": reproduces,
        "new": reproduces is None,
        **run,
        "executed_by": BY_MDLIB if run["notebook"] else OUTSIDE,
        "command": command(run["notebook"], run["profile"], run["overrides"], run["output_dir"]),
        "runs": store.used_runs(),
        "code": identity.fingerprint(),
        "git": git_state(),
        "versions": versions(),
        "hardware": hardware(),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "files": rel,
        "sha256": {name: sha256(path) for name, path in zip(rel, (files or {}).values())
                   if Path(path).suffix == ".csv"},
    }


def sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, in hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dumps(rec: Mapping[str, Any]) -> str:
    return json.dumps(rec, indent=1, ensure_ascii=True, default=str)


def json_paths(label: str, kind: str, has_csv: bool) -> list[Path]:
    """Where the record of ``label`` goes: beside the PNG of a figure, and beside every CSV (in the
    output directory)."""
    output = paths.output_dir()
    out = [paths.figures_dir(output) / f"{label}.json"] if kind == "figure" else []
    if has_csv:
        out.append(paths.results_dir(output) / f"{label}.json")
    return out


def write(rec: Mapping[str, Any], has_csv: bool) -> list[Path]:
    """Write ``rec`` (see :func:`record`) atomically to every place :func:`json_paths` names."""
    text = dumps(rec) + "\n"
    return [atomic_write(path, lambda tmp: tmp.write_text(text, "utf-8"))
            for path in json_paths(rec["label"], rec["kind"], has_csv)]


def find(label: str, build: Path | None = None) -> dict[str, Any] | None:
    """The record of ``label`` in the build directory (figures first, then results), or None."""
    build = Path(build) if build is not None else paths.build_dir()
    for path in (paths.figures_dir(build) / f"{label}.json", paths.results_dir(build) / f"{label}.json"):
        try:
            return json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
    return None


def records(build: Path | None = None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(path, record) of every readable record in the build directory's figures and results."""
    build = Path(build) if build is not None else paths.build_dir()
    for folder in (paths.figures_dir(build), paths.results_dir(build)):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                record = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(record, dict):
                yield path, record


# ---------------------------------------------------------------------------------------------
# citation and the "reproduce and cite" block


def load_citation(path: Path | None = None) -> dict[str, Any]:
    """The project's ``CITATION.cff`` as a mapping ({} when it is missing, or there is no project)."""
    import yaml

    if path is None:
        project = paths.find_root()
        if project is None:
            return {}
        path = project / "CITATION.cff"
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text("utf-8")) or {}
    except OSError:
        return {}


def _authors(cff: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(plain, BibTeX) name of each author: an entity's ``name`` braced, a person "Family, Given"."""
    names = []
    for author in cff.get("authors") or []:
        if author.get("name"):
            names.append((str(author["name"]), "{" + str(author["name"]) + "}"))
        elif author.get("family-names"):
            given, family = author.get("given-names"), str(author["family-names"])
            names.append((f"{given} {family}" if given else family, f"{family}, {given}" if given else family))
    return names or [("The mdlib contributors", "{The mdlib contributors}")]


def citation(rec: Mapping[str, Any], cff: Mapping[str, Any], number: str | None = None) -> tuple[str, str]:
    """(BibTeX, plain text) citing the artifact of ``rec`` in the software of ``cff``; ``number`` is
    the artifact's number in the book (e.g. "Table 4.2"), or None."""
    label = rec["label"]
    authors = _authors(cff)
    title = str(cff.get("title", "mdlib"))
    version = cff.get("version")
    commit = (rec.get("git") or {}).get("commit")
    year = str(rec.get("time") or "")[:4] or None
    what = f"{number} ({label})" if number else f"{rec['kind']} {label}"
    note = ", ".join(x for x in (what, f"profile {rec['profile']}" if rec.get("profile") else None,
                                  f"commit {commit[:12]}" if commit else None) if x)
    key = "mdlib-" + "".join(c if c.isalnum() else "-" for c in label)
    fields = {"author": " and ".join(bib for _, bib in authors),
              "title": "{" + title + "}", "year": year, "version": version, "note": note, "url": cff.get("url")}
    bibtex = "@misc{" + key + ",\n" + ",\n".join(
        f"  {name} = {{{value}}}" for name, value in fields.items() if value) + "\n}"
    plain = f"{', '.join(name for name, _ in authors)}. {title}" + (f", version {version}" if version else "") + \
        (f" ({year})" if year else "") + f". {note[0].upper() + note[1:]}."
    return bibtex, plain


def paper_citation(cff: Mapping[str, Any]) -> tuple[str, str] | None:
    """(BibTeX, plain text) of the paper the software reproduces: ``preferred-citation`` of ``cff``, with
    its DOI as a resolvable link; None when ``cff`` names none."""
    paper = cff.get("preferred-citation")
    if not paper:
        return None
    authors = _authors(paper)
    doi, year = paper.get("doi"), str(paper.get("year", ""))
    fields = {"author": " and ".join(bib for _, bib in authors), "title": "{" + str(paper.get("title", "")) + "}",
              "journal": paper.get("journal"), "volume": paper.get("volume"), "number": paper.get("issue"),
              "year": year or None, "doi": doi, "url": paper.get("url")}
    family = str((paper.get("authors") or [{}])[0].get("family-names", "paper")).lower()
    bibtex = "@article{" + f"{family}{year}" + ",\n" + ",\n".join(
        f"  {name} = {{{value}}}" for name, value in fields.items() if value) + "\n}"
    venue = " ".join(str(x) for x in (paper.get("journal"), paper.get("volume")) if x)
    venue += f"({paper['issue']})" if paper.get("issue") else ""
    plain = f"{', '.join(name for name, _ in authors)}. {paper.get('title', '')}. " + \
        ", ".join(x for x in (venue, year) if x) + "." + (f" https://doi.org/{doi}" if doi else "")
    return bibtex, plain


def reproduce_html(rec: Mapping[str, Any], cff: Mapping[str, Any], number: str | None = None) -> str:
    """A collapsed ``<details>`` block: the command that regenerates the artifact of ``rec``, its
    provenance in brief, its citation and that of the paper (BibTeX and plain text)."""
    bibtex, plain = citation(rec, cff, number)
    paper = paper_citation(cff)
    git = rec.get("git") or {}
    commit = git.get("commit")
    state = ("" if commit is None else f"{commit[:12]}{' (uncommitted changes)' if git.get('dirty') else ''}")
    runs = rec.get("runs") or []
    rows = [("label", rec["label"]), ("paper", rec.get("reproduces") or "new analysis"),
            ("profile", rec.get("profile") or "unknown"), ("commit", state or "unknown"),
            ("stored runs", f"{len(runs)} (listed in {rec['label']}.json)"), ("saved", rec.get("time") or "")]
    cmd = rec.get("command") or "(saved outside `python -m mdlib`: no command recorded)"
    esc = html.escape
    items = "".join(f"<li><strong>{esc(k)}</strong>: <code>{esc(str(v))}</code></li>" for k, v in rows)
    return (
        '<details class="mdlib-provenance">\n'
        f"<summary>Reproduce and cite {esc(rec['kind'])} <code>{esc(rec['label'])}</code></summary>\n"
        f'<p>Regenerate it:</p>\n<pre class="mdlib-command">{esc(cmd)}</pre>\n'
        f"<ul>{items}</ul>\n"
        f'<p>Cite it (BibTeX):</p>\n<pre class="mdlib-bibtex">{esc(bibtex)}</pre>\n'
        f'<p class="mdlib-cite">{esc(plain)}</p>\n'
        + ("" if paper is None else f'<p>and the paper it reproduces:</p>\n<pre class="mdlib-bibtex">{esc(paper[0])}</pre>\n'
           f'<p class="mdlib-cite">{esc(paper[1])}</p>\n')
        + "</details>\n"
    )


# ---------------------------------------------------------------------------------------------
# the archive


def archive_members(build: Path | None = None) -> list[Path]:
    """Every figure (PNG, PDF), table CSV and provenance JSON in the build directory, sorted."""
    build = Path(build) if build is not None else paths.build_dir()
    found = []
    for folder, suffixes in ((paths.figures_dir(build), (".png", ".pdf", ".json")),
                             (paths.results_dir(build), (".csv", ".json"))):
        if folder.is_dir():
            found += [p for p in folder.iterdir()
                      if p.is_file() and p.suffix in suffixes and not p.name.startswith(".")]
    return sorted(found)


def write_archive(build: Path | None = None) -> Path:
    """Zip :func:`archive_members` into ``<build>/artifacts.zip`` (atomically; names relative to the
    build directory, e.g. ``figures/fig-e1-paths.png``) and return its path."""
    build = Path(build) if build is not None else paths.build_dir()

    def fill(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for path in archive_members(build):
                archive.write(path, path.relative_to(build).as_posix())

    return atomic_write(build / ARCHIVE, fill)


def publish_archive(html_root: Path | None = None, build: Path | None = None) -> Path:
    """Copy ``<build>/artifacts.zip`` into the HTML book at :data:`ARCHIVE_HTML` (atomically)."""
    import shutil

    build = Path(build) if build is not None else paths.build_dir()
    html_root = Path(html_root) if html_root is not None else paths.html_dir()
    return atomic_write(html_root / ARCHIVE_HTML, lambda tmp: shutil.copyfile(build / ARCHIVE, tmp))


def archive_href(docname: str = "index") -> str:
    """The link to the archive from the page ``docname`` (e.g. "book/scorecard"), relative to it."""
    depth = docname.count("/")
    return "../" * depth + ARCHIVE_HTML
