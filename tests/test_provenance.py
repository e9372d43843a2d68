"""Provenance records of saved figures and tables, the runs registry, the "reproduce and cite" block,
tables numbered as tables, and the artifacts archive."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from mdlib.book import artifacts, chapters, cli, profiles, provenance
from mdlib.experiments import paper, paths
from mdlib.runs import identity, store# noqa: E402
from mdlib.runs.identity import RunId

sys.path.insert(0, str(paths.book_dir() / "_ext"))
import mdlib_artifacts  # noqa: E402

RUN = {"notebook": "04_sentiment", "profile": "smoke", "parameters": {"profile": "smoke", "seeds": 3, "ps": [1.1, 2.0],
                                                                    "name": "a b"},
       "overrides": {"seeds": 3, "ps": [1.1, 2.0], "name": "a b"}}


def table_1(test: float = 0.7) -> pd.DataFrame:
    """A table-1 as chapter 04 writes it (``artifacts.save_table`` checks it against the results schema)."""
    return pd.DataFrame([{"setup": "authors", "layers": 3, "method": "1.1", "runs": 3, "reached": 3, "epochs": 10.0, "test": test,
                          "test_std": 0.01, "best": test, "best_std": 0.01, "validation": 0.7, "multiple": 1,
                          "lr": 1e-3, "paper": 83.47, "paper_epochs": 72}])


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    """The build directory, which is also the output directory, as in the book's own executions."""
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "out"))
    monkeypatch.setenv(paths.OUTPUT_ENV, str(tmp_path / "out"))
    monkeypatch.delenv(provenance.ENV, raising=False)
    monkeypatch.setattr(store, "_used", {})  # a registry of the test's own runs; the process's comes back after
    return (tmp_path / "out").resolve()


@pytest.fixture
def kernel_env(monkeypatch):
    """The environment ``mdlib.book.execute.run_notebook`` gives a notebook's kernel."""
    monkeypatch.setenv(provenance.ENV, json.dumps(RUN))


def _figure():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [0, 1, 4])
    return fig


def _check_common(record, label, kind):
    assert record["label"] == label and record["kind"] == kind
    assert record["notebook"] == "04_sentiment" and record["profile"] == "smoke"
    assert record["parameters"] == RUN["parameters"] and record["overrides"] == RUN["overrides"]
    assert record["executed_by"] == provenance.BY_MDLIB and record["output_dir"] is None
    assert record["versions"]["mdlib"] == __import__("mdlib").__version__
    assert record["versions"]["numpy"] == np.__version__
    assert record["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert set(record["versions"]) == {"mdlib", "torch", "numpy", "python"}
    assert set(record["hardware"]) == {"platform", "cpu", "cpu_count", "gpu"}
    assert record["hardware"]["cpu_count"] >= 1
    assert set(record["git"]) == {"commit", "dirty"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record["time"])


def test_figure_record_has_every_field(build_dir, kernel_env):
    store.save(RunId.of("e1-paths", {"seed": 1}), {"x": np.arange(3)})
    data = pd.DataFrame({"train_p": 2.0, "svm_p": 2.0, "step": [0, 1], "mean": [1.0, 0.5], "std": 0.1,
                         "q10": [0.9, 0.4], "q90": [1.1, 0.6]})
    artifacts.save_figure(_figure(), "fig-e1-paths", data=data)
    record = json.loads((build_dir / "figures" / "fig-e1-paths.json").read_text())
    # a figure with data: the same record beside the PNG and beside the CSV
    assert json.loads((build_dir / "results" / "fig-e1-paths.json").read_text()) == record
    _check_common(record, "fig-e1-paths", "figure")
    assert record["reproduces"] == "Figure 4" and record["new"] is False
    assert record["runs"] == [f"e1-paths/{identity.config_key('e1-paths', {'seed': 1})}"]
    assert record["files"] == ["figures/fig-e1-paths.png", "figures/fig-e1-paths.pdf", "results/fig-e1-paths.csv"]
    # the command runs the same notebook again, and its -p values parse back to the overrides
    args = cli.build_parser().parse_args(shlex.split(record["command"])[3:])
    assert (args.command, args.notebook, args.profile) == ("run", "04_sentiment", "smoke")
    assert {k: cli._parse_value(v, k) for k, v in args.parameter} == RUN["overrides"]
    # no CSV, no JSON in results/
    artifacts.save_figure(_figure(), "fig-alone")
    assert (build_dir / "figures" / "fig-alone.json").is_file()
    assert not (build_dir / "results" / "fig-alone.json").exists()


#: Strings YAML reads as something else (or not at all), and strings the shell or argparse would mangle.
STRINGS = ["yes", "No", "on", "null", "~", "", "1e-3", "1E5", "1_1", "0x1F", "1:30", "2001-01-01", ".inf", "nan", "3",
           "1.5", "-x", "-1", "- a", "[a]", "{a: b}", "a: b", "a #b", " padded ", "'quoted'", '"double"', "it's", "*",
           "&a", "!tag", "%x", "@", "`", "ü 😀", "tab\there", "two\nlines"]


def _samples(default) -> list:
    """Values of a parameter with this default, as ``profiles.resolve_parameters`` returns them."""
    if isinstance(default, bool):
        return [default, not default]
    if isinstance(default, int):
        return [default, default + 1, -3, 0]
    if isinstance(default, float):
        return [default, 1e-3, -1e-05, 1e20, 2.5, -0.5]
    if isinstance(default, str):
        return [default, *STRINGS]
    if isinstance(default, list):
        return [default, [], [1e-3, -1e-05, 2, "yes", "1e-3", None, True]]
    if isinstance(default, dict):
        return [default, {}, {"1.1": [1e-4], "adam": [0.3], "a b": "yes", "null": None}]
    assert default is None, default
    return [None, 200, 1e-3, "1e-3", "yes", [1, "2"]]


@pytest.mark.parametrize("notebook", chapters.NAMES)
def test_the_recorded_command_gives_back_every_value_of_every_type(notebook):
    """The command of a record, split as a shell would, parsed by the CLI and resolved against the
    notebook, gives exactly the overrides it was made from: every parameter of the chapter at once, with
    values of its default's type (numbers, flags, lists, mappings, None) and strings YAML would read as
    something else ("yes", "null", "1e-3", "~")."""
    declared = {name: param.value for name, param in profiles.notebook_parameters(paths.notebooks_dir() / f"{notebook}.py")
                .items() if name != "profile"}
    samples = {name: _samples(default) for name, default in declared.items()}
    for i in range(max(map(len, samples.values()))):
        overrides = {name: values[i % len(values)] for name, values in samples.items()}
        args = cli.build_parser().parse_args(shlex.split(provenance.command(notebook, "smoke", overrides))[3:])
        assert (args.notebook, args.profile) == (notebook, "smoke")
        resolved = profiles.resolve_parameters(notebook, "smoke", cli.overrides(notebook, args.parameter))
        for name, value in overrides.items():
            assert repr(resolved[name]) == repr(value), (name, provenance.command(notebook, "smoke", {name: value}))


def test_the_recorded_command_quotes_every_value():
    command = provenance.command("04_sentiment", "paper", {"setup": "modern", "seeds": 3, "lr": -1e-05,
                                                           "ps": [1.1, 2.0], "train_size": None})
    assert command == ("python -m mdlib run 04_sentiment --profile paper -p setup '\"modern\"' -p seeds 3 "
                       "-p lr ' -1e-05' -p ps '[1.1, 2.0]' -p train_size null")


def test_table_record_and_new_analyses(build_dir, kernel_env):
    artifacts.save_table(table_1(), "table-1", glue=False)
    record = json.loads((build_dir / "results" / "table-1.json").read_text())
    _check_common(record, "table-1", "table")
    assert record["reproduces"] == "Table 1" and record["new"] is False and record["runs"] == []
    assert not (build_dir / "figures").exists()
    artifacts.save_table(pd.DataFrame({"a": [1.0]}), "table-something-new", glue=False)
    new = json.loads((build_dir / "results" / "table-something-new.json").read_text())
    assert new["reproduces"] is None and new["new"] is True


def test_outside_the_pipeline_the_record_says_so_and_lands_in_scratch(build_dir, monkeypatch):
    """Saved outside ``mdlib run`` (no MDLIB_OUTPUT_DIR, no run): into <build>/scratch, never the book's
    results, with a record that says where it was executed and null run fields."""
    monkeypatch.delenv(paths.OUTPUT_ENV)
    artifacts.save_table(pd.DataFrame({"a": [1]}), "table-x", glue=False)
    assert not (build_dir / "results").exists()
    record = json.loads((build_dir / "scratch" / "results" / "table-x.json").read_text())
    fields = ("notebook", "profile", "execution", "parameters", "overrides", "output_dir", "variant")
    assert [record[k] for k in fields + ("command",)] == [None] * 8
    assert record["executed_by"] == provenance.OUTSIDE and record["files"] == ["results/table-x.csv"]
    monkeypatch.setenv(provenance.ENV, "{not json")
    assert provenance.notebook_run() == dict.fromkeys(fields)


def test_every_labelled_artifact_of_the_notebooks_is_mapped():
    """Each label a notebook saves is in paper.ARTIFACTS (a paper figure/table, or None: new)."""
    source = "\n".join(p.read_text() for p in (paths.notebooks_dir() / f"{n}.py" for n in chapters.NAMES))
    labels = set(re.findall(r"save_(?:figure|table)\([^\"]*?\"((?:fig|table)-[^\"]+)\"", source, re.S))
    assert labels, "no labels found in the notebooks"
    assert labels <= set(paper.ARTIFACTS), sorted(labels - set(paper.ARTIFACTS))


def _pdf_string(raw: bytes, key: bytes) -> str:
    """The PDF literal string ``(...)`` after ``key`` (escapes and balanced parentheses resolved)."""
    i = raw.index(key + b" (") + len(key) + 2
    out, depth, escapes = bytearray(), 0, {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}
    while True:
        c = raw[i]
        if c == ord("\\"):
            i += 1
            out += escapes.get(raw[i], bytes([raw[i]]))
        elif c == ord(")") and depth == 0:
            return out.decode("latin-1")
        else:
            depth += {ord("("): 1, ord(")"): -1}.get(c, 0)
            out.append(c)
        i += 1


def test_png_and_pdf_carry_the_record(build_dir, kernel_env):
    saved = artifacts.save_figure(_figure(), "fig-meta")
    record = json.loads((build_dir / "figures" / "fig-meta.json").read_text())
    with Image.open(saved.files["png"]) as image:
        assert json.loads(image.text["Provenance"]) == record
    pdf = saved.files["pdf"]
    try:
        from pypdf import PdfReader
    except ImportError:  # read the info dict's strings from the bytes (matplotlib writes them uncompressed)
        raw = pdf.read_bytes()
        assert _pdf_string(raw, b"/Title") == "fig-meta"
        assert json.loads(_pdf_string(raw, b"/Subject")) == record
    else:
        info = PdfReader(pdf).metadata
        assert json.loads(info["/Subject"]) == record and info["/Title"] == "fig-meta"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_git_state_clean_dirty_and_not_a_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert provenance.git_state(repo) == {"commit": None, "dirty": None}  # not a repository
    _git(repo, "init", "-q")
    assert provenance.git_state(repo) == {"commit": None, "dirty": None}  # no commit yet
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert provenance.git_state(repo) == {"commit": head, "dirty": False}
    (repo / "a.txt").write_text("two\n")
    assert provenance.git_state(repo) == {"commit": head, "dirty": True}
    _git(repo, "checkout", "-q", "a.txt")
    (repo / "new.py").write_text("")
    assert provenance.git_state(repo) == {"commit": head, "dirty": True}  # an untracked, not ignored file
    (repo / "sub").mkdir()
    assert provenance.git_state(repo / "sub") == {"commit": None, "dirty": None}  # not the top of the tree


def test_runs_registry_records_exactly_what_was_loaded_or_stored(build_dir, monkeypatch):
    key = lambda kind, config: f"{kind}/{identity.config_key(kind, config)}"  # noqa: E731
    assert store.load(RunId.of("a", {"n": 1})) is None  # a miss records nothing
    assert store.used_runs() == []
    store.save(RunId.of("a", {"n": 1}), {"x": 1})
    store.load_or_run(RunId.of("b", {"n": 2}), lambda: {"y": np.ones(2)})  # computed and stored
    store.load_or_run(RunId.of("b", {"n": 2}), lambda: pytest.fail("recomputed"))  # a hit, recorded once
    assert store.used_runs() == [key("a", {"n": 1}), key("b", {"n": 2})]  # stored or computed: recorded
    monkeypatch.setattr(store, "_used", {})  # a fresh registry: what follows records hits alone
    assert store.load(RunId.of("b", {"n": 2})) is not None
    store.load_or_run(RunId.of("a", {"n": 1}), lambda: pytest.fail("recomputed"))
    assert store.used_runs() == [key("b", {"n": 2}), key("a", {"n": 1})]


def test_reproduce_block_has_command_bibtex_and_commit(kernel_env):
    record = provenance.record("table-1", "table")
    record["git"] = {"commit": "0123456789abcdef0123", "dirty": True}
    cff = provenance.load_citation()
    block = provenance.reproduce_html(record, cff, "Table 4.2")
    assert block.startswith('<details class="mdlib-provenance">') and block.rstrip().endswith("</details>")
    assert "python -m mdlib run 04_sentiment --profile smoke -p seeds 3 -p ps &#x27;[1.1, 2.0]&#x27; -p name " \
           "&#x27;&quot;a b&quot;&#x27;" in block
    bibtex, plain = provenance.citation(record, cff, "Table 4.2")
    assert bibtex.startswith("@misc{mdlib-table-1,") and "author = {{The mdlib contributors}}" in bibtex
    assert "Table 4.2 (table-1)" in bibtex and "commit 0123456789ab" in bibtex and f"version = {{{cff['version']}}}" in bibtex
    assert cff["title"] in plain and "Table 4.2 (table-1)" in plain
    assert "@misc{mdlib-table-1," in block and "0123456789ab (uncommitted changes)" in block
    assert "Table 1" in block  # the paper's artifact


def test_extension_swaps_tables_and_appends_blocks(build_dir, kernel_env):
    """The Sphinx side on a hand-made doctree: a figure named table-* becomes a table_figure, and
    every figure with a record gets the block after it (none without a record)."""
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document
    from types import SimpleNamespace

    doc = new_document("x", get_default_settings(Parser))
    section = nodes.section()
    doc += section
    for name in ("table-1", "fig-e1-paths", "fig-unsaved"):
        figure = nodes.figure("", nodes.caption("", "caption"), names=[name], ids=[name])
        section += figure
    transform = mdlib_artifacts.TablesAsTables(doc)
    transform.apply()
    assert [type(n).__name__ for n in section.children] == ["table_figure", "figure", "figure"]
    artifacts.save_table(table_1(), "table-1", glue=False)
    artifacts.save_figure(_figure(), "fig-e1-paths")
    numbers = {"table": {"table-1": (4, 2)}, "figure": {"fig-e1-paths": (4, 1)}}
    std = SimpleNamespace(get_enumerable_node_type=lambda n: "table" if isinstance(n, mdlib_artifacts.table_figure)
                          else "figure")
    app = SimpleNamespace(env=SimpleNamespace(domains={"std": std}, toc_fignumbers={"doc": numbers}),
                          config=SimpleNamespace(numfig_format={"table": "Table %s", "figure": "Fig. %s"}))
    mdlib_artifacts.add_reproduce_blocks(app, doc, "doc")
    kinds = [type(n).__name__ for n in section.children]
    assert kinds == ["table_figure", "raw", "figure", "raw", "figure"]
    table_block, figure_block = section.children[1].astext(), section.children[3].astext()
    assert "Table 4.2 (table-1)" in table_block and "python -m mdlib run 04_sentiment" in table_block
    assert "Fig. 4.1 (fig-e1-paths)" in figure_block and "@misc{mdlib-fig-e1-paths," in figure_block


def test_archive_lists_every_artifact(build_dir, tmp_path):
    artifacts.save_figure(_figure(), "fig-a", data=pd.DataFrame({"x": [1]}))
    artifacts.save_table(pd.DataFrame({"x": [1]}), "table-b", glue=False)
    (build_dir / "runs").mkdir()
    (build_dir / "runs" / "not-an-artifact.json").write_text("{}")
    path = provenance.write_archive()
    assert path == build_dir / "artifacts.zip"
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == [
            "figures/fig-a.json", "figures/fig-a.pdf", "figures/fig-a.png",
            "results/fig-a.csv", "results/fig-a.json", "results/table-b.csv", "results/table-b.json"]
        assert archive.read("results/table-b.csv") == (build_dir / "results" / "table-b.csv").read_bytes()
    html = tmp_path / "html"
    assert provenance.publish_archive(html) == html / "_downloads" / "artifacts.zip"
    assert (html / "_downloads" / "artifacts.zip").read_bytes() == path.read_bytes()
    assert provenance.archive_href() == "_downloads/artifacts.zip"
    assert provenance.archive_href("book/scorecard") == "../_downloads/artifacts.zip"


def test_tiny_sphinx_build_numbers_tables_as_tables(tmp_path, build_dir, kernel_env, monkeypatch):
    """A two-page MyST book with the extension: the figure named table-1 is "Table 1" in its caption
    and in {numref}, the figure stays "Fig. 1", and only the artifact with a record gets a block."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(paths.book_dir() / '_ext')!r})\n"
                                 "extensions = ['myst_parser', 'mdlib_artifacts']\nnumfig = True\n")
    (src / "index.md").write_text("# Book\n\n```{toctree}\npage\n```\n")
    figure = _figure()
    figure.savefig(src / "img.png")
    plt.close(figure)
    (src / "page.md").write_text(
        "# Page\n\n## Table 1\n\n```{figure} img.png\n:name: table-1\n\nThe table's caption.\n```\n\n"
        "```{figure} img.png\n:name: fig-a\n\nA figure.\n```\n\nSee {numref}`table-1` and {numref}`fig-a`.\n")
    artifacts.save_table(table_1(), "table-1", glue=False)
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "page.html").read_text()
    assert '<span class="caption-number">Table 1 </span>' in page
    assert '<span class="caption-number">Fig. 1 </span>' in page
    assert re.search(r'<span class="std std-numref">Table 1</span>', page)
    assert re.search(r'<span class="std std-numref">Fig\. 1</span>', page)
    assert page.count('class="mdlib-provenance"') == 1
    assert "Reproduce and cite table <code>table-1</code>" in page and "Table 1 (table-1)" in page
    assert "python -m mdlib run 04_sentiment --profile smoke" in page
    # an incremental build after the record changed (the page did not): the block shows the new record
    monkeypatch.setenv(provenance.ENV, json.dumps(RUN | {"overrides": {"seeds": 7}}))
    artifacts.save_table(table_1(test=0.6), "table-1", glue=False)
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "page.html").read_text()
    assert "-p seeds 7" in page and page.count('class="mdlib-provenance"') == 1
