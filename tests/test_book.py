"""The book pipeline: parameter handling, the generated parameters page, notebook execution, and an
end-to-end smoke-profile build of the whole book in a copy of the repository (marked slow)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

from conftest import HTML, raw_html
from mdlib.book import book, chapters, cli, execute, pages, profiles
from mdlib.experiments import fetch, paths

FIXTURES = Path(__file__).parent / "fixtures"
NBS = FIXTURES / "notebooks"
PARAMS = FIXTURES / "params"
FIX = dict(notebooks_dir=NBS, params_dir=PARAMS)
FIXTURE_PAGE = dict(FIX, notebooks=["01_fixture"])  #: the parameters page of the fixture chapter


# ---------------------------------------------------------------------------------------------
# parameters (fast)


def test_resolve_notebook_names():
    assert profiles.resolve_notebook("01_fixture", NBS) == NBS / "01_fixture.py"
    assert profiles.resolve_notebook("01_fixture.py", NBS) == NBS / "01_fixture.py"
    assert profiles.resolve_notebook("notebooks/01_fixture.ipynb", NBS) == NBS / "01_fixture.py"
    assert profiles.resolve_notebook("01", NBS) == NBS / "01_fixture.py"  # a chapter by its number
    with pytest.raises(ValueError, match=r"unknown notebook '99'"):
        profiles.resolve_notebook("99", NBS)
    with pytest.raises(ValueError, match=r"unknown notebook 'nope'.*01_fixture"):
        profiles.resolve_notebook("nope", NBS)


def test_parse_parameters_cell():
    declared = profiles.notebook_parameters(NBS / "01_fixture.py")
    assert list(declared) == ["profile", "seeds", "lr", "ps", "name", "verbose", "schedule", "fail"]
    assert declared["seeds"].value == 4 and declared["seeds"].description == "number of random instances"
    assert declared["lr"].value == 0.1 and declared["lr"].description == "step size | with a pipe"
    assert declared["ps"].value == [1.75, 2.0, 3.0] and declared["ps"].source == "[ 1.75, 2.0, 3.0, ]"
    assert declared["ps"].description == "exponents p"
    assert declared["schedule"].literal is False and declared["schedule"].source == 'dict(kind="constant")'


def test_merge_order_and_profile_injection():
    assert profiles.resolve_parameters("01_fixture", "default", **FIX) == {"profile": "default"}
    smoke = profiles.resolve_parameters("01_fixture", "smoke", **FIX)
    assert smoke == {"seeds": 2, "lr": 1e-3, "profile": "smoke"}  # 1e-3: a float, as in YAML 1.2
    over = profiles.resolve_parameters("01_fixture", "smoke", {"seeds": 3, "lr": 1, "ps": (2, 3)}, **FIX)
    assert over == {"seeds": 3, "lr": 1.0, "ps": [2, 3], "profile": "smoke"}
    assert isinstance(over["lr"], float)
    assert profiles.resolve_parameters("01_fixture", "default", {"seeds": 5.0}, **FIX)["seeds"] == 5
    # a non-literal default takes any value
    assert profiles.resolve_parameters("01_fixture", "default", {"schedule": "cosine"}, **FIX)["schedule"] == "cosine"


def test_unknown_parameter_is_rejected_with_the_valid_names():
    with pytest.raises(ValueError, match=r"unknown parameter 'seed'.*profile, seeds, lr, ps, name, verbose"):
        profiles.resolve_parameters("01_fixture", "default", {"seed": 1}, **FIX)
    with pytest.raises(ValueError, match="unknown parameter"):
        execute.run_notebook("01_fixture", "default", {"nope": 1}, **FIX)


@pytest.mark.parametrize("name,value,expected", [
    ("seeds", "many", "a number"), ("seeds", 2.5, "an integer"), ("seeds", True, "a number"),
    ("verbose", 1, "true/false"), ("ps", 2.0, "a list"), ("name", 3, "a string"),
    ("seeds", None, "a number"), ("verbose", None, "true/false"), ("ps", None, "a list"), ("name", None, "a string"),
])
def test_wrong_types_are_rejected(name, value, expected):
    with pytest.raises(TypeError, match=rf"{name}.*should be {expected}"):
        profiles.resolve_parameters("01_fixture", "default", {name: value}, **FIX)


def test_profile_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown profile 'huge'.*smoke, default, paper"):
        profiles.resolve_parameters("01_fixture", "huge", **FIX)
    with pytest.raises(ValueError, match="--profile"):
        profiles.resolve_parameters("01_fixture", "smoke", {"profile": "paper"}, **FIX)
    bad = tmp_path / "params"
    bad.mkdir()
    (bad / "smoke.yaml").write_text("01_fixture:\n  sedes: 3\n")
    with pytest.raises(ValueError, match=r"unknown parameter 'sedes' in params/smoke.yaml"):
        profiles.resolve_parameters("01_fixture", "smoke", notebooks_dir=NBS, params_dir=bad)


@pytest.mark.parametrize("name,value", [("vit", "bogus"), ("vit", "Paper"), ("modes", ["default", "fast"])])
def test_chapter_08_refuses_an_unknown_model_or_mode_before_any_timing(name, value):
    """Any ``vit`` but "paper" used to time the tiny model. The values pass the type check; the checks in
    the first code cell after the parameters (its mdlib imports and calls of ``choice``, run here on the
    injected parameters as papermill would) refuse them before any timing cell."""
    nb = profiles.read_notebook(paths.notebooks_dir() / "08_cost.py")
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    first = code[code.index(profiles.parameters_cell(nb)) + 1].source
    statements = [ast.get_source_segment(first, node) for node in ast.parse(first).body]
    checks = [s for s in statements if s.startswith("from mdlib") or "choice(" in s]
    assert any("choice(" in s for s in checks)

    def run(overrides):
        namespace = {}
        exec(profiles.parameters_cell(nb).source, namespace)
        namespace.update(profiles.resolve_parameters("08_cost", "smoke", overrides))
        exec("\n".join(checks), namespace)

    run({"vit": "tiny", "modes": ["foreach"]})
    with pytest.raises(ValueError, match=rf"^parameter {name!r}: '(bogus|Paper|fast)' is not one of"):
        run({name: value})


@pytest.mark.parametrize("overrides, error", [
    ({"train_ps": [1.5, 2.0], "steps": [100, 100]}, r"svm_ps \(\[1.75, 2.0, 3.0\]\) must include every training exponent"),
    ({"train_ps": [1.75, 3.0]}, r"steps \(\[1500, 2000, 20000\]\) needs one entry per training exponent")])
def test_chapter_01_refuses_exponents_it_cannot_compare_before_training(overrides, error):
    """A training exponent without an SVM of its own once ended in an IndexError after the training;
    the checks in the first code cell after the parameters (the ``if ...: raise`` statements, run here
    on the injected parameters) refuse it first."""
    nb = profiles.read_notebook(paths.notebooks_dir() / "01_fixed_decoder_paths.py")
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    first = code[code.index(profiles.parameters_cell(nb)) + 1].source
    checks = [ast.get_source_segment(first, node) for node in ast.parse(first).body if isinstance(node, ast.If)]
    namespace = {}
    exec(profiles.parameters_cell(nb).source, namespace)
    exec("\n".join(checks), dict(namespace, **profiles.resolve_parameters("01_fixed_decoder_paths", "default",
                                                                        {"train_ps": [1.75, 3.0], "steps": [1, 2]})))
    with pytest.raises(ValueError, match=error):
        exec("\n".join(checks), dict(namespace, **profiles.resolve_parameters("01_fixed_decoder_paths", "default",
                                                                            overrides)))


def _write_nb(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(body)
    return path


#: The most lines a chapter's code cell may have (its parameters cell aside): longer logic belongs in mdlib.
#: Today's longest cell (04's Table 1 save and glue) has 20: a cell that grows past it fails.
CELL_LINES = 20


@pytest.mark.parametrize("chapter", chapters.NAMES)
def test_chapter_cells_are_thin(chapter):
    nb = profiles.read_notebook(profiles.resolve_notebook(chapter))
    long = [(i, len(cell.source.splitlines())) for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and "parameters" not in cell.metadata.get("tags", [])
            and len(cell.source.splitlines()) > CELL_LINES]
    assert not long, f"{chapter}: code cells (index, lines) longer than {CELL_LINES} lines: {long}"


def test_notebook_conventions_are_enforced(tmp_path):
    nbs = tmp_path / "nbs"
    _write_nb(nbs, "01_noprofile", '# %% tags=["parameters"]\nseeds = 3  # seeds\n\n# %%\nprint(seeds)\n')
    _write_nb(nbs, "02_nocell", "# %%\nseeds = 3\n")
    _write_nb(nbs, "03_twocells", '# %% tags=["parameters"]\na = 1\n\n# %% tags=["parameters"]\nb = 2\n')
    params = tmp_path / "params"
    params.mkdir()
    (params / "default.yaml").write_text("{}\n")
    kw = dict(notebooks_dir=nbs, params_dir=params)
    with pytest.raises(ValueError, match="must define `profile"):
        profiles.resolve_parameters("01_noprofile", **kw)
    with pytest.raises(ValueError, match="exactly one cell tagged 'parameters'.*found 0"):
        profiles.resolve_parameters("02_nocell", **kw)
    with pytest.raises(ValueError, match="found 2"):
        profiles.resolve_parameters("03_twocells", **kw)


def test_cli_reports_errors(capsys):
    assert cli.main(["run", "no_such_notebook"]) == 1
    assert "unknown notebook 'no_such_notebook'" in capsys.readouterr().err
    assert cli._parse_value("1e-3") == 1e-3 and cli._parse_value("3") == 3
    assert cli._parse_value("[1.1, 2]") == [1.1, 2] and cli._parse_value("true") is True
    assert cli._parse_value("adam") == "adam"


# ---------------------------------------------------------------------------------------------
# the parameters page (fast)


def test_parameters_page_from_fixture(tmp_path):
    text = pages.parameters_page("smoke", **FIXTURE_PAGE)
    assert "## Fixture chapter" in text
    assert "executed with the **smoke** profile" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    declared = profiles.notebook_parameters(NBS / "01_fixture.py")
    assert set(rows) == {f"`{name}`" for name in declared}
    header = next(line for line in text.splitlines() if line.startswith("| Parameter"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["Parameter", "Default", "smoke", "paper",
                                                                 "Description"]
    cells = lambda name: [c.strip() for c in re.split(r"(?<!\\)\|", rows[f"`{name}`"])[1:-1]]  # noqa: E731
    assert cells("seeds") == ["`seeds`", "`4`", "`2`", "`100`", "number of random instances"]
    assert cells("lr") == ["`lr`", "`0.1`", "`0.001`", "", r"step size \| with a pipe"]
    assert cells("ps") == ["`ps`", "`[ 1.75, 2.0, 3.0, ]`", "", "`[1.1, 2, 3]`", "exponents p"]
    assert cells("verbose")[3] == "`True`"
    assert cells("profile")[2:4] == ['`"smoke"`', '`"paper"`']
    assert cells("schedule")[1] == '`dict(kind="constant")`'
    path = pages.write_parameters_page(tmp_path / "parameters.md", profile="smoke", **FIXTURE_PAGE)
    assert path.read_text() == text


def test_parameters_page_shows_only_profiles_that_set_values(tmp_path):
    params = tmp_path / "params"
    shutil.copytree(PARAMS, params)
    (params / "default.yaml").write_text("01_fixture:\n  seeds: 7\n")
    (params / "gpu.yaml").write_text("01_fixture: {}\n")
    text = pages.parameters_page(None, notebooks=["01_fixture"], notebooks_dir=NBS, params_dir=params)
    header = next(line for line in text.splitlines() if line.startswith("| Parameter"))
    assert [c.strip() for c in header.strip("|").split("|")][2:-1] == ["smoke", "default", "paper"]
    assert "executed with" not in text


def test_html_in_a_profile_name_or_value_is_text_on_the_parameters_page(tmp_path):
    """The profile a build names and a profile's values are escaped: no raw HTML reaches the page, and a
    backtick in a value does not end its code span. A file whose name is not a profile's is no column."""
    params = tmp_path / "params"
    shutil.copytree(PARAMS, params)
    (params / "smoke.yaml").write_text(f"01_fixture:\n  name: '`{HTML}` and ``'\n")
    (params / f"{HTML}.yaml").write_text("01_fixture:\n  seeds: 3\n")
    assert profiles.list_profiles(params) == ["smoke", "default", "paper"]
    text = pages.parameters_page(HTML, notebooks=["01_fixture"], notebooks_dir=NBS, params_dir=params)
    assert raw_html(text) == [] and "img" not in next(line for line in text.splitlines() if line.startswith("| Param"))
    assert "executed with the **&lt;img src=x onerror=alert(1)&gt;** profile" in text
    row = next(line for line in text.splitlines() if line.startswith("| `name`"))
    assert f"| ```\"`{HTML}` and ``\"``` |" in row  # one code span, the value as written


def test_toc_lists_exactly_the_chapter_notebooks():
    book._check_toc()  # raises BookError naming the mismatch
    for file in book.toc_files():
        if not file.startswith("notebooks/") and file not in ("book/parameters", "book/scorecard"):  # generated
            assert (paths.root() / f"{file}.md").is_file(), file


def _book_sources() -> dict[str, str]:
    """The markdown of every page: book/*.md, and the chapters' markdown cells (comment marks removed)."""
    texts = {f"book/{path.stem}": path.read_text() for path in sorted((paths.root() / "book").glob("*.md"))}
    for name in chapters.NAMES:
        cells = re.split(r"^# %%", (paths.notebooks_dir() / f"{name}.py").read_text(), flags=re.M)
        texts[f"notebooks/{name}"] = "\n".join(
            re.sub(r"^# ?", "", line) for cell in cells if cell.startswith(" [markdown]")
            for line in cell.splitlines()[1:])
    return texts


def test_each_equation_is_labelled_once_and_every_reference_has_a_target():
    """The paper's equations are stated once, as labelled math, and cited elsewhere with {eq}."""
    labels, refs = {}, set()
    for page, text in _book_sources().items():
        assert "$$" not in text, f"{page}: unlabelled display math; use a labelled {{math}} block or {{eq}}"
        for label in re.findall(r"^:label: (\S+)", text, flags=re.M):
            assert label not in labels, f"equation {label} is labelled in {labels.get(label)} and {page}"
            labels[label] = page
        refs |= set(re.findall(r"\{eq\}`([^`]+)`", text))
    assert {"eq-md-update", "eq-bregman", "eq-attention-svm", "eq-decoder-svm"} <= set(labels)
    assert refs <= set(labels), f"{{eq}} references without a label: {sorted(refs - set(labels))}"
    assert set(labels) <= refs, f"labelled but never cited: {sorted(set(labels) - refs)}"


def test_book_config_is_offline():
    config = yaml.safe_load((paths.root() / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "off"
    assert config["only_build_toc_files"] is True
    assert "sphinx-mathjax-offline" in config["sphinx"]["extra_extensions"]
    assert config["launch_buttons"].get("binderhub_url", "") == "" and not config["launch_buttons"]["thebe"]
    for profile in ("smoke", "default", "paper"):
        assert (paths.params_dir() / f"{profile}.yaml").is_file()


def test_relative_dirs_reach_the_kernel_as_absolute_paths(tmp_path, monkeypatch):
    launch = tmp_path / "launch"
    launch.mkdir()
    monkeypatch.chdir(launch)
    monkeypatch.setenv("MDLIB_BUILD_DIR", "relbuild")
    monkeypatch.setenv("MDLIB_DATA_DIR", "reldata")
    assert fetch.data_dir() == paths.build_dir().parent / "reldata" == launch / "reldata"
    with execute._kernel_environment():  # what the kernel, running in notebooks/, is given
        seen = dict(os.environ)
    assert seen["MDLIB_BUILD_DIR"] == str(launch / "relbuild")
    assert seen["MDLIB_DATA_DIR"] == str(launch / "reldata")
    assert os.environ["MDLIB_BUILD_DIR"] == "relbuild" and os.environ["MDLIB_DATA_DIR"] == "reldata"  # restored
    monkeypatch.delenv("MDLIB_DATA_DIR")
    with execute._kernel_environment():
        assert "MDLIB_DATA_DIR" not in os.environ  # unset stays unset: the kernel uses the default
    assert "MDLIB_DATA_DIR" not in os.environ


def test_executed_notebook_records_no_machine_path(tmp_path, monkeypatch):
    """papermill records its input (the whole notebook object, or an absolute path) and its output (the
    temporary file) in the executed notebook; run_notebook writes them relative to the project (the
    fixture's source) or as the file's name (an output outside the project), and the build folder
    relative to the project. papermill is replaced by what it writes (no kernel: fast)."""
    import papermill

    def fake_papermill(nb, output_path, **kwargs):
        nb = nbformat.from_dict(nb)
        nb.metadata["papermill"] = {"input_path": nb.copy(), "output_path": output_path,
                                    "parameters": kwargs["parameters"]}
        nbformat.write(nb, output_path)
        return nb
    monkeypatch.setattr(papermill, "execute_notebook", fake_papermill)
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "build"))
    out = execute.run_notebook("01_fixture", "smoke", output_dir=tmp_path / "out", progress=False, **FIX)
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata["papermill"]["input_path"] == "tests/fixtures/notebooks/01_fixture.py"
    assert nb.metadata["papermill"]["output_path"] == "01_fixture.ipynb"
    assert nb.metadata["mdlib"]["build"] == str(tmp_path / "build")  # outside the project: where it is
    monkeypatch.delenv(paths.BUILD_ENV)
    assert execute._build_label() == "_build"  # the project's own build folder, relative
    text = out.read_text()
    assert str(paths.find_root()) not in text and str(tmp_path / "out") not in text


# ---------------------------------------------------------------------------------------------
# executing a notebook (slow: starts a kernel)


@pytest.mark.slow
def test_run_notebook_executes_with_parameters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MDLIB_BUILD_DIR", "build")  # relative to this process's cwd, not the kernel's
    out = execute.run_notebook("01_fixture.py", "smoke", {"seeds": 3}, output_dir=tmp_path / "out",
                            progress=False, **FIX)
    assert out == tmp_path / "out" / "01_fixture.ipynb"
    values = json.loads((tmp_path / "build" / "fixture.json").read_text())
    assert values["profile"] == "smoke" and values["seeds"] == 3 and values["lr"] == 1e-3
    assert Path(values["cwd"]).resolve() == NBS.resolve()
    assert Path(values["mdlib"]).parents[1] == paths.PACKAGE_DIR  # the kernel imports this process's mdlib
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.metadata["papermill"]["parameters"] == {"seeds": 3, "lr": 1e-3, "profile": "smoke"}
    record = nb.metadata["papermill"]  # no machine path: the source relative to the project, the output's name
    assert (record["input_path"], record["output_path"]) == ("tests/fixtures/notebooks/01_fixture.py",
                                                             "01_fixture.ipynb")
    artifacts = _artifacts(nb)
    assert [a["label"] for a in artifacts] == ["fig-fixture"]
    assert artifacts[0]["files"] == ["figures/fig-fixture.png", "figures/fig-fixture.pdf"]
    assert (tmp_path / "build" / "figures" / "fig-fixture.pdf").read_bytes()[:4] == b"%PDF"
    # the kernel knew which run it was: every parameter as executed, the overrides, the command
    record = json.loads((tmp_path / "build" / "figures" / "fig-fixture.json").read_text())
    assert (record["notebook"], record["profile"], record["overrides"]) == ("01_fixture", "smoke", {"seeds": 3})
    assert record["parameters"] == {"profile": "smoke", "seeds": 3, "lr": 1e-3, "ps": [1.75, 2.0, 3.0],
                                    "name": "fixture", "verbose": False, "schedule": 'dict(kind="constant")',
                                    "fail": False}
    # into the same folder: the build's, which a command with -p names (it would write a variant otherwise)
    assert record["command"] == f"python -m mdlib run 01_fixture --profile smoke -p seeds 3 --output-dir {tmp_path / 'build'}"
    assert record["executed_by"] == "python -m mdlib run" and record["output_dir"] == str(tmp_path / "build")


@pytest.mark.slow
def test_failing_cell_names_the_notebook_and_keeps_the_good_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    good = tmp_path / "01_fixture.ipynb"
    good.write_bytes(b'{"the": "previous good notebook"}\n')
    with pytest.raises(execute.NotebookError) as error:
        execute.run_notebook("01_fixture", "default", {"fail": True}, output_dir=tmp_path, progress=False, **FIX)
    message = str(error.value)
    assert "\n" not in message
    assert re.match(r"notebook 01_fixture \(profile default\) failed in cell \[\d+\]: ValueError: the fixture "
                    r"was asked to fail; the previous executed notebook .*01_fixture.ipynb is kept; the figures and "
                    r"results are as they were before this run; this run's, "
                    r"with the traceback: .*01_fixture.failed.ipynb$", message)
    assert good.read_bytes() == b'{"the": "previous good notebook"}\n'
    failed = tmp_path / "01_fixture.failed.ipynb"
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) + sorted(p.name for p in tmp_path.glob(".*")) == [
        "01_fixture.failed.ipynb", "01_fixture.ipynb"]  # no temporary file left
    assert execute.notebook_failure(failed).endswith("raised ValueError: the fixture was asked to fail")
    # `book --skip-execute` refuses a failed notebook in place (e.g. one papermill wrote by hand)
    shutil.copy(failed, good)
    with pytest.raises(execute.BookError, match=r"^notebooks/01_fixture.ipynb failed: cell \[\d+\] raised "
                                             r"ValueError: the fixture was asked to fail; execute again with `python -m mdlib run 01_fixture`"):
        execute.check_executed(["01_fixture"], tmp_path)


# ---------------------------------------------------------------------------------------------
# the whole book at the smoke profile, in a copy of the repository (slow)


def _source_files(root: Path) -> list[str]:
    """Tracked files plus untracked files git does not ignore (what a fresh checkout would hold)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True).stdout.decode()
        return sorted({f for f in out.split("\0") if f and (root / f).is_file()})
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "_build", "__pycache__", ".pytest_cache", "cache"}
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                      and not skip & set(p.relative_to(root).parts) and p.suffix != ".ipynb"
                      and p.relative_to(root) != Path("book/parameters.md"))


def _artifacts(nb) -> list[dict]:
    """What the notebook announced through mdlib.book.plots: metadata["mdlib"] of its glued outputs."""
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {}).get("mdlib")
            if meta:
                found.append(meta)
    return found


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    root = tmp_path_factory.mktemp("book") / "repo"
    for name in _source_files(paths.root()):
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(paths.root() / name, target)
    # a commit of its own, so that the provenance records name one
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the sources under test"]):
        subprocess.run(git + args, cwd=root, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                            text=True).stdout.strip()
    build = root / "_build"
    env = {**os.environ, "MDLIB_BUILD_DIR": str(build), "MDLIB_DATA_DIR": str(fetch.data_dir()),  # fetch once
           "PYTHONPATH": os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mdlib", "book", "--profile", "smoke"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=20 * 60)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        pytest.fail(f"`python -m mdlib book --profile smoke` failed (exit {proc.returncode}) after {seconds:.0f} s\n"
                    f"--- stdout (tail)\n{proc.stdout[-6000:]}\n--- stderr (tail)\n{proc.stderr[-6000:]}")
    profiles.check_notebooks(root / "notebooks")  # the copy holds every chapter's notebook
    return SimpleNamespace(root=root, build=build, html=build / "html", chapters=chapters.NAMES, seconds=seconds,
                           log=proc.stderr, commit=commit)


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_every_notebook_executed_without_errors(smoke_book):
    for name in smoke_book.chapters:
        nb = nbformat.read(smoke_book.root / "notebooks" / f"{name}.ipynb", as_version=4)
        assert nb.metadata["papermill"]["parameters"]["profile"] == "smoke", name
        assert not nb.metadata["papermill"].get("exception"), name
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
        assert (smoke_book.root / "notebooks" / f"{name}.py").is_file()
        speed = nb.metadata["mdlib"]["speed"]  # the machine's speed around it, for plan --against
        assert 0 < speed["before"] < 10 and 0 < speed["after"] < 10 and "chapter 04" in speed["probe"], name
    # the kernels wrote into the copy's build folder, not the developer's
    assert (smoke_book.build / "figures").is_dir()


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_announced_figures_and_results_exist(smoke_book):
    labels = []
    for name in smoke_book.chapters:
        nb = nbformat.read(smoke_book.root / "notebooks" / f"{name}.ipynb", as_version=4)
        artifacts = _artifacts(nb)
        names = _glued_names(nb)
        for cell in nb.cells:  # every glue directive/role in the text refers to something this notebook glued
            if cell.cell_type == "markdown":
                for match in re.finditer(r"\{glue(?::\w*)?\}(`[^`]+`|[ \t]+\S+)", cell.source):
                    ref = match.group(1).strip().strip("`")
                    if "::" not in ref:  # (references into other notebooks are left to Sphinx)
                        ref = ref.split(":")[0]  # a role's format spec, {glue:text}`name:.2f`
                        assert ref in names, f"{name}: nothing glued as {ref!r}"
        for artifact in artifacts:
            labels.append(artifact["label"])
            kind, label = artifact["kind"], artifact["label"]
            expected = {f"figures/{label}.png", f"figures/{label}.pdf"} if kind == "figure" else {f"results/{label}.csv"}
            assert expected <= set(artifact["files"]), (name, artifact)
            for rel in artifact["files"]:
                path = smoke_book.build / rel
                assert path.is_file() and path.stat().st_size > 0, f"{name} announced {rel}, which is missing"
            if kind == "figure":
                assert (smoke_book.build / f"figures/{label}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
                assert (smoke_book.build / f"figures/{label}.pdf").read_bytes()[:5] == b"%PDF-"
    assert labels, "the notebooks announced no figure or table"
    assert len(labels) == len(set(labels)), f"labels used twice: {sorted(labels)}"


def _glued_names(nb) -> set[str]:
    return {o["metadata"]["scrapbook"]["name"] for c in nb.cells for o in c.get("outputs", [])
            if "scrapbook" in o.get("metadata", {})}


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_html_pages_exist(smoke_book):
    html = smoke_book.html
    assert (html / "index.html").is_file()
    for name in smoke_book.chapters:
        page = html / "notebooks" / f"{name}.html"
        assert page.is_file(), f"no page for chapter {name}"
        assert "<img" in page.read_text() or "mdlib-table" in page.read_text(), f"{name}: no figure or table"
    for page in ("intro", "reproduce", "parameters", "bibliography"):
        assert (html / "book" / f"{page}.html").is_file(), page
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert (html / "_static" / "mdlib.css").is_file()  # the tables' column spacing
    assert "_static/mdlib.css" in (html / "notebooks" / f"{smoke_book.chapters[0]}.html").read_text()
    scorecard = (html / "book" / "scorecard.html").read_text()
    image = re.search(r'<img[^>]+src="([^"]*scorecard-forest[^"]*\.png)"', scorecard)  # the page leads with it
    assert image and (html / "book" / image.group(1)).resolve().is_file()
    assert scorecard.index("scorecard-forest") < scorecard.index("<table")


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_no_page_loads_anything_from_the_internet(smoke_book):
    remote = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
    pages = sorted(smoke_book.html.rglob("*.html"))
    assert pages
    for page in pages:
        text = page.read_text(errors="replace")
        assert not remote.search(text), f"{page.name} loads {remote.search(text).group(0)}"
        assert not re.search(r"https?://[^\"'\s]*mathjax", text, re.I), f"{page.name} references a MathJax CDN"
    chapter = (smoke_book.html / "notebooks" / f"{smoke_book.chapters[0]}.html").read_text()
    assert "_static/mathjax/tex-chtml.js" in chapter


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_every_page_typesets_the_sidebar_math_and_has_one_search_box(smoke_book):
    """Chapter 1's title has math, and every page's sidebar shows it: MathJax loads on every page,
    including those without math of their own; the header's search box is the only one."""
    for name in ("book/reproduce", "book/bibliography", "book/parameters", f"notebooks/{smoke_book.chapters[0]}"):
        text = (smoke_book.html / f"{name}.html").read_text()
        assert "_static/mathjax/tex-chtml.js" in text, f"{name}: no MathJax"
        assert "\\(\\ell_p\\)" in text or "\\ell_p" in text, f"{name}: the sidebar lost chapter 1's title"
        sidebar = text[text.index("bd-sidebar-primary"):text.index("<main", text.index("bd-sidebar-primary"))]
        assert "search-button-field" not in sidebar, f"{name}: a second search box, in the sidebar"


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_equation_references_link_to_the_numbered_equation(smoke_book):
    """Each labelled equation is numbered on one page; every {eq} reference, on any page, is a link
    "(n)" to that page's anchor (Sphinx would leave an unresolved one as plain text, with a warning)."""
    html = smoke_book.html
    pages = {page: page.read_text() for page in html.rglob("*.html")}
    numbered = {}  # label -> (page, number)
    for page, text in pages.items():
        for number, label in re.findall(r'<span class="eqno">\(([0-9.]+)\)<a class="headerlink" '
                                        r'href="#equation-([\w-]+)"', text):
            assert label not in numbered, f"{label} is numbered twice"
            numbered[label] = (page.resolve(), number)
    assert {"eq-md-update", "eq-bregman", "eq-attention-svm", "eq-decoder-svm"} <= set(numbered)
    links = 0
    for page, text in pages.items():
        for href, label, shown in re.findall(r'href="([^"#]*)#equation-([\w-]+)">\(([0-9.]+)\)</a>', text):
            target = (page.parent / href).resolve() if href else page.resolve()
            assert (target, shown) == numbered[label], (page.name, label)
            links += 1
    assert links >= 10, f"only {links} equation references in the book"


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_parameters_page_lists_every_parameter(smoke_book):
    text = (smoke_book.root / "book" / "parameters.md").read_text()
    assert "executed with the **smoke** profile" in text
    html = (smoke_book.html / "book" / "parameters.html").read_text()
    for name in smoke_book.chapters:
        for param in profiles.notebook_parameters(smoke_book.root / "notebooks" / f"{name}.py"):
            assert f"| `{param}` |" in text, f"{name}: {param} missing from the parameters page"
            assert f">{param}</span>" in html, f"{name}: {param} missing from parameters.html"


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_provenance_tables_as_tables_and_the_archive(smoke_book):
    """Every announced artifact has its provenance record (beside the PNG, and beside the CSV), shown
    as a "reproduce and cite" block on its page; tables are numbered as tables; the archive holds
    every artifact and is in the HTML book."""
    import zipfile

    members = set()
    for name in smoke_book.chapters:
        nb = nbformat.read(smoke_book.root / "notebooks" / f"{name}.ipynb", as_version=4)
        page = (smoke_book.html / "notebooks" / f"{name}.html").read_text()
        for artifact in _artifacts(nb):
            label, files = artifact["label"], artifact["files"]
            records = ([f"figures/{label}.json"] if artifact["kind"] == "figure" else []) + \
                [f"results/{label}.json" for rel in files if rel.endswith(".csv")]
            members |= set(files) | set(records)
            for rel in records:
                record = json.loads((smoke_book.build / rel).read_text())
                assert (record["label"], record["notebook"], record["profile"]) == (label, name, "smoke"), rel
                assert record["command"] == f"python -m mdlib run {name} --profile smoke", rel
                assert record["git"] == {"commit": smoke_book.commit, "dirty": False}, rel
                if name != "08_cost":  # every other chapter reads its numbers from stored runs
                    assert record["runs"], rel
                for run in record["runs"]:  # kind/sha256 of a stored run
                    kind, key = run.split("/")
                    assert re.fullmatch(r"[0-9a-f]{64}", key) and (smoke_book.build / "runs" / kind / key).is_dir(), run
            if f'id="{label}"' in page or f"#{label}" in page:  # shown with {glue:figure} ... :name: label
                assert f"Reproduce and cite {artifact['kind']} <code>{label}</code>" in page, (name, label)
    sentiment = (smoke_book.html / "notebooks" / "04_sentiment.html").read_text()
    assert re.search(r'<span class="caption-number">Table 4\.\d+ </span>', sentiment)
    assert re.search(r'<span class="caption-number">Fig\. 4\.1 </span>', sentiment)  # the first figure
    with zipfile.ZipFile(smoke_book.build / "artifacts.zip") as archive:
        assert members <= set(archive.namelist())
    assert (smoke_book.html / "_downloads" / "artifacts.zip").read_bytes() == \
        (smoke_book.build / "artifacts.zip").read_bytes()


#: The claims whose chapter glues the estimate the scorecard judges: label -> (chapter, glue names'
#: prefix, how the estimate is written there).
GLUED_ESTIMATES = {
    "table-1": ("04_sentiment", "t1-gaps", lambda e: e.text()),
    "table-1-variation": ("04_sentiment", "t1v-gaps", lambda e: e.text()),
    "table-sentiment-allocation": ("04_sentiment", "t1a-", lambda e: e.text()),
    "table-token-selection": ("05_token_selection", "tok-", lambda e: f"{e.value:.1%} [{e.low:.1%}, {e.high:.1%}]"),
    "fig-token-concentration": ("05_token_selection", "tok-sharp", lambda e: e.text(3)),
    "table-weights-change": ("06_weights", "w-density-gap", lambda e: e.text(3)),
}


@pytest.mark.slow
@pytest.mark.xdist_group("book")
def test_chapters_glue_the_estimate_the_scorecard_judges(smoke_book):
    """For each claim whose chapter quotes its estimate, every scorecard row of the claim shows the very
    numbers the chapter glued (both come from one ``mdlib.experiments.estimates`` call on one table)."""
    from mdlib.book import scorecard
    from mdlib.experiments.estimates import Estimate

    rows = scorecard.rows(smoke_book.build / "results", profile="smoke")
    for label, (chapter, prefix, written) in GLUED_ESTIMATES.items():
        nb = nbformat.read(smoke_book.root / "notebooks" / f"{chapter}.ipynb", as_version=4)
        glued = " ".join(text for c in nb.cells for o in c.get("outputs", [])
                         if o.get("metadata", {}).get("scrapbook", {}).get("name", "").startswith(prefix)
                         for mime, text in o["data"].items() if mime.endswith("text/plain"))
        claim = next(c for c in scorecard.CLAIMS if c.label == label)
        judged = [r for r in rows if r.claim.startswith(claim.claim) and r.effect is not None]
        assert glued and judged, (label, "the smoke build glues and judges this estimate")
        for row in judged:
            e = row.effect
            shown = written(Estimate(e.estimate, e.low, e.high, 0))
            assert shown in glued, (label, row.short, shown, glued)
