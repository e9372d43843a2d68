"""Variants next to the book, never over it: ``mdlib run`` with overrides (or ``--output-dir``) writes
its notebook, figures and results into a folder of its own; a notebook executed outside ``mdlib run``
(papermill's own command) writes into ``<build>/scratch``; ``mdlib notebook`` writes the ``.ipynb``
papermill needs on a fresh clone. The book's own executions write where they always did."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mdlib.book import cli, execute, profiles, provenance
from mdlib.experiments import paths

FIXTURES = Path(__file__).parent / "fixtures"


def hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by relative path."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def make_project(root: Path) -> Path:
    """A checkout of a book whose one chapter is the fixture notebook."""
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(FIXTURES / "notebooks" / "01_fixture.py", root / "notebooks")
    shutil.copytree(FIXTURES / "params", root / "params")
    (root / "_config.yml").write_text("title: fixture\n")
    return root


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The fixture book, found by --root and $MDLIB_ROOT, building into its own ``_build``."""
    root = make_project(tmp_path / "book")
    monkeypatch.setenv(paths.ROOT_ENV, str(root))
    for name in (paths.BUILD_ENV, paths.OUTPUT_ENV, provenance.ENV):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture
def executions(monkeypatch):
    """papermill replaced by a recorder of what the kernel would get: its run, the folder its figures and
    results are committed to (it writes them into that folder's ``.staging/<notebook>``) and the
    notebook it writes (no kernel: fast)."""
    import papermill

    seen = []

    def fake_papermill(nb, output_path, **kwargs):
        staging = Path(os.environ[paths.OUTPUT_ENV])
        assert staging.parent.name == ".staging" and staging.name == json.loads(os.environ[provenance.ENV])["notebook"]
        seen.append({"run": json.loads(os.environ[provenance.ENV]), "output": staging.parent.parent})
        nbformat.write(nbformat.from_dict(nb), output_path)

    monkeypatch.setattr(papermill, "execute_notebook", fake_papermill)
    return seen


# ---------------------------------------------------------------------------------------------
# where each execution writes (fast)


def test_a_variant_folder_is_named_by_the_profile_and_the_overrides(project):
    folder = execute.default_output_dir("01_fixture", "smoke", {"seeds": 3, "lr": 0.5})
    assert folder.parent == project / "_build" / "variants" and folder.name.startswith("01_fixture-")
    # the first 8 hex digits of the SHA-256 of the profile and the overrides as read, keys sorted
    text = json.dumps({"profile": "smoke", "overrides": {"lr": 0.5, "seeds": 3}}, sort_keys=True)
    assert folder.name == "01_fixture-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    assert execute.default_output_dir("01_fixture.py", "smoke", {"lr": 0.5, "seeds": 3.0}) == folder  # as read
    assert execute.default_output_dir("01_fixture", "default", {"seeds": 3, "lr": 0.5}) != folder
    assert execute.default_output_dir("01_fixture", "smoke", {"seeds": 4, "lr": 0.5}) != folder
    assert execute.default_output_dir("01_fixture", "smoke", {}) == paths.build_dir() == project / "_build"
    with pytest.raises(ValueError, match="unknown parameter 'sedes'"):
        execute.default_output_dir("01_fixture", "smoke", {"sedes": 3})


def test_overriding_only_where_runs_train_executes_the_books_chapter(project, monkeypatch):
    monkeypatch.setattr(execute, "PLACEMENT", frozenset({"lr"}))  # the fixture has no `workers`
    assert execute.default_output_dir("01_fixture", "smoke", {"lr": 0.5}) == paths.build_dir()
    assert execute.default_output_dir("01_fixture", "smoke", {"lr": 0.5, "seeds": 3}) == \
        execute.default_output_dir("01_fixture", "smoke", {"seeds": 3}) != paths.build_dir()


def test_the_chapters_workers_choose_where_runs_train_not_what_they_compute(monkeypatch, tmp_path):
    from mdlib.experiments import sentiment, vision

    monkeypatch.delenv(paths.ROOT_ENV, raising=False)
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path))
    assert execute.PLACEMENT == {"workers"}
    for name in ("04_sentiment", "07_vision"):  # a GPU node's `-p workers 8` is the book's own chapter
        assert execute.default_output_dir(name, "paper", {"workers": 8}) == paths.build_dir()
    values = {n: profiles.executed_parameters(n, "paper") for n in ("04_sentiment", "07_vision")}
    for module, name in ((sentiment, "04_sentiment"), (vision, "07_vision")):
        grids = module.chapter_grids(**values[name])
        assert [g.to_dict() for g in grids if g] == [g.to_dict() for g in module.chapter_grids(
            **dict(values[name], workers=8)) if g]  # workers is not part of any run's config


def test_run_writes_the_book_without_overrides_and_a_variant_with_them(project, executions, capsys):
    build = project / "_build"
    assert cli.main(["run", "01_fixture", "--profile", "smoke"]) == 0
    book = executions[-1]
    assert book["output"] == build and book["run"]["output_dir"] is None and book["run"]["variant"] is None
    assert (project / "notebooks" / "01_fixture.ipynb").is_file()
    assert "variant" not in capsys.readouterr().err

    assert cli.main(["run", "01_fixture", "--profile", "smoke", "-p", "seeds", "3"]) == 0
    variant = execute.default_output_dir("01_fixture", "smoke", {"seeds": 3})
    assert executions[-1]["output"] == variant and executions[-1]["run"]["output_dir"] is None
    assert re.fullmatch(r"[0-9a-f]{8}", executions[-1]["run"]["variant"])  # chapter 04 names its grid by it
    assert (variant / "01_fixture.ipynb").is_file()
    assert f"go to {variant}" in capsys.readouterr().err
    # the recorded command, run again, writes into the same folder
    run = executions[-1]["run"]
    args = cli.build_parser().parse_args(
        shlex.split(provenance.command(run["notebook"], run["profile"], run["overrides"]))[3:])
    again = cli.overrides(args.notebook, args.parameter)
    assert execute.default_output_dir(args.notebook, args.profile, again) == variant


@pytest.mark.parametrize("where,what", [("_build", "the build folder"), ("notebooks", "the notebooks folder"),
                                        ("book", "the book's pages folder"), (".", "the project's root"),
                                        ("copy", "a folder that holds the book's 01_fixture.ipynb")])
def test_an_output_dir_that_would_land_on_the_book_is_refused(project, executions, capsys, where, what):
    """--output-dir _build used to make a variant the book's chapter; notebooks/ replaced its notebook."""
    (project / "copy").mkdir()
    (project / "copy" / "01_fixture.ipynb").write_text("{}")
    folder = (project / where).resolve()
    assert cli.main(["run", "01_fixture", "--output-dir", str(project / where)]) == 1
    assert capsys.readouterr().err.startswith(f"error: --output-dir {folder} is {what}: a variant goes elsewhere")
    assert executions == []


def test_an_output_dir_is_the_variants_folder_and_in_its_command(project, executions, tmp_path):
    chosen = tmp_path / "mine"
    assert cli.main(["run", "01_fixture", "--output-dir", str(chosen)]) == 0
    assert executions[-1]["output"] == chosen and (chosen / "01_fixture.ipynb").is_file()
    run = executions[-1]["run"]
    assert run["output_dir"] == str(chosen)
    assert provenance.command(run["notebook"], run["profile"], run["overrides"], run["output_dir"]) == \
        f"python -m mdlib run 01_fixture --profile default --output-dir {chosen}"
    assert not (project / "notebooks" / "01_fixture.ipynb").exists()


def test_a_variants_verdicts_read_its_own_results_and_the_books_earlier_chapters(project, monkeypatch):
    """Chapter 05's claims read its own tables and chapter 04's runs: a variant of 05 is judged on its own
    tables (in its folder) and the book's 04 (in the build's results), as the whole folder would be."""
    from mdlib.book import scorecard

    whole = FIXTURES / "results"
    own = {p.name for p in whole.iterdir() if p.name.startswith("table-token-")}
    book, variant = project / "_build" / "results", project / "_build" / "variants" / "05-x"
    for path in whole.iterdir():
        target = (variant / "results" if path.name in own else book) / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    monkeypatch.setenv(provenance.ENV, json.dumps({"notebook": "05_token_selection", "profile": "smoke"}))
    monkeypatch.setenv(paths.OUTPUT_ENV, str(variant))
    expected = scorecard.verdicts("05_token_selection", whole)
    assert "4 run(s) did not reach the stop rule" in expected  # read from chapter 04's table-sentiment-runs
    assert scorecard.verdicts("05_token_selection") == expected
    assert "table-sentiment-runs.csv missing" in scorecard.verdicts("05_token_selection", variant / "results")


# ---------------------------------------------------------------------------------------------
# mdlib notebook (fast)


def test_notebook_writes_an_unexecuted_ipynb_for_papermill(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["notebook", "01_fixture"]) == 0
    written = tmp_path / "01_fixture.ipynb"
    assert capsys.readouterr().out.strip() == str(written)
    nb = nbformat.read(written, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert "formats" not in nb.metadata.get("jupytext", {}) and "mdlib" not in nb.metadata
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "seeds = 4" in tagged[0].source
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert cli.main(["notebook", "01_fixture", "-o", str(tmp_path / "01.ipynb")]) == 0
    sources = lambda path: [c.source for c in nbformat.read(path, as_version=4).cells]  # noqa: E731
    assert sources(tmp_path / "01.ipynb") == sources(written)


def test_notebook_refuses_the_books_notebook_and_other_suffixes(project, capsys):
    book_copy = project / "notebooks" / "01_fixture.ipynb"
    book_copy.write_text('{"the": "executed chapter"}\n')
    assert cli.main(["notebook", "01_fixture", "-o", str(book_copy)]) == 1
    err = capsys.readouterr().err
    assert "is the book's executed notebook of 01_fixture" in err and "--force" in err
    assert book_copy.read_text() == '{"the": "executed chapter"}\n'
    assert cli.main(["notebook", "01_fixture", "-o", str(project / "notebooks" / "01_fixture.py")]) == 1
    assert "give a path ending in .ipynb" in capsys.readouterr().err
    assert (project / "notebooks" / "01_fixture.py").read_text().startswith("# ---")
    assert cli.main(["notebook", "01_fixture", "-o", str(book_copy), "--force"]) == 0
    assert nbformat.read(book_copy, as_version=4).metadata["kernelspec"]["name"] == "python3"


# ---------------------------------------------------------------------------------------------
# real executions in a copy of the book (slow: kernels)


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (paths.BUILD_ENV, paths.OUTPUT_ENV, provenance.ENV)}
    return {**env, paths.ROOT_ENV: str(root), "PYTHONPATH": str(paths.PACKAGE_DIR.parent)}


def _mdlib(root: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mdlib", *args], cwd=root, env=_env(root), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture book with its chapter executed as the book executes it, and the hash of every file of
    its figures, results and executed notebook."""
    root = make_project(tmp_path_factory.mktemp("variants") / "book")
    _mdlib(root, "run", "01_fixture", "--profile", "smoke")
    build = root / "_build"
    assert (build / "figures" / "fig-fixture.png").is_file()
    return root, build, _book_state(root)


def _book_state(root: Path) -> dict[str, str]:
    return {**{f"figures/{k}": v for k, v in hashes(root / "_build" / "figures").items()},
            **{f"results/{k}": v for k, v in hashes(root / "_build" / "results").items()},
            "notebook": hashlib.sha256((root / "notebooks" / "01_fixture.ipynb").read_bytes()).hexdigest()}


@pytest.mark.slow
def test_a_variant_run_leaves_the_book_byte_identical(built):
    root, build, before = built
    proc = _mdlib(root, "run", "01_fixture", "--profile", "smoke", "-p", "seeds", "3")
    variants = list((build / "variants").iterdir())
    assert len(variants) == 1 and f"go to {variants[0]}" in proc.stderr
    folder = variants[0]
    assert _book_state(root) == before
    assert {"01_fixture.ipynb", "figures/fig-fixture.png", "figures/fig-fixture.pdf", "figures/fig-fixture.json"} \
        <= set(hashes(folder))
    record = json.loads((folder / "figures" / "fig-fixture.json").read_text())
    assert record["command"] == "python -m mdlib run 01_fixture --profile smoke -p seeds 3"
    assert (record["executed_by"], record["overrides"], record["output_dir"]) == (provenance.BY_MDLIB, {"seeds": 3}, None)
    assert record["files"] == ["figures/fig-fixture.png", "figures/fig-fixture.pdf"]  # relative to its folder
    executed = nbformat.read(folder / "01_fixture.ipynb", as_version=4)
    assert executed.metadata["papermill"]["parameters"]["seeds"] == 3


@pytest.mark.slow
def test_papermill_on_a_written_notebook_writes_into_scratch(built, tmp_path):
    """The README's route: ``mdlib notebook`` then papermill's own command, with a list given by -y."""
    root, build, before = built
    _mdlib(root, "notebook", "01_fixture", "-o", str(tmp_path / "01.ipynb"))
    proc = subprocess.run([sys.executable, "-m", "papermill", str(tmp_path / "01.ipynb"), str(tmp_path / "out.ipynb"),
                           "-y", "ps: [1.5, 2.0]", "--cwd", str(root / "notebooks")],
                          env=_env(root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _book_state(root) == before
    scratch = build / "scratch"
    assert {"figures/fig-fixture.png", "figures/fig-fixture.pdf", "figures/fig-fixture.json"} <= set(hashes(scratch))
    record = json.loads((scratch / "figures" / "fig-fixture.json").read_text())
    assert record["executed_by"] == provenance.OUTSIDE and record["command"] is None
    values = json.loads((build / "fixture.json").read_text())  # what the kernel was given
    assert values["ps"] == [1.5, 2.0]
