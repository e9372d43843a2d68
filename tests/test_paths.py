"""Where mdlib finds the book project, the data cache and the build directory, in a checkout and
outside one (an installed package). That the library itself never looks for a project:
test_distribution.py; the paths of a real installed wheel: test_packaging.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdlib.book import cli
from mdlib.experiments import fetch, paths

CHECKOUT = paths.PACKAGE_DIR.parent  # these tests run from the checkout


def make_project(folder: Path) -> Path:
    """The smallest folder mdlib takes for a book project."""
    (folder / "notebooks").mkdir(parents=True)
    (folder / "params").mkdir()
    (folder / "_config.yml").write_text("title: a project\n")
    return folder


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No variable that moves a folder; the user's cache in tmp_path/xdg."""
    for name in (paths.ROOT_ENV, paths.BUILD_ENV, fetch.DATA_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "xdg"))
    return tmp_path


@pytest.fixture
def installed(clean_env, monkeypatch):
    """The package as a regular install sees it: its folder lies in site-packages, not a checkout."""
    site = clean_env / "venv" / "lib" / "site-packages"
    (site / "mdlib").mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", site / "mdlib")
    outside = clean_env / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    return site


def test_the_checkout_holding_the_package_is_the_project(clean_env, monkeypatch):
    monkeypatch.chdir(clean_env)  # the working directory is no project: the checkout still is
    assert paths.is_project(CHECKOUT)
    assert paths.root() == paths.find_root() == CHECKOUT
    assert paths.notebooks_dir() == CHECKOUT / "notebooks" and paths.params_dir() == CHECKOUT / "params"
    assert paths.book_dir() == CHECKOUT / "book"
    assert paths.build_dir() == CHECKOUT / "_build"
    assert fetch.data_dir() == CHECKOUT / "data" / "cache"


def test_the_build_folders_follow_the_environment(tmp_path, monkeypatch):
    build_dir = tmp_path / "out"
    monkeypatch.setenv(paths.BUILD_ENV, str(build_dir))
    monkeypatch.setenv(paths.OUTPUT_ENV, str(build_dir))
    assert paths.build_dir() == build_dir.resolve()
    assert paths.figures_dir() == build_dir.resolve() / "figures"
    assert paths.results_dir() == build_dir.resolve() / "results"
    assert paths.runs_dir() == build_dir.resolve() / "runs"
    assert paths.html_dir() == build_dir.resolve() / "_build" / "html"
    assert paths.output_dir() == build_dir.resolve()
    monkeypatch.delenv(paths.OUTPUT_ENV)
    assert paths.output_dir() == build_dir.resolve() / "scratch"  # outside mdlib run: never the book's folders
    monkeypatch.delenv(paths.BUILD_ENV)
    assert paths.build_dir() == paths.root() / "_build"
    assert paths.html_dir() == paths.root() / "_build" / "html"
    assert paths.jupyter_book_output() == paths.root()
    assert (paths.root() / "mdlib" / "experiments" / "paths.py").is_file()


def test_a_figures_and_results_folder_is_named_once_for_every_base(tmp_path):
    """The book's folders are paths': ``figures/`` and ``results/`` of the build directory by default, of a
    notebook's output directory or a staging folder when given."""
    assert paths.results_dir() == paths.build_dir() / "results"
    assert paths.figures_dir() == paths.build_dir() / "figures"
    assert paths.results_dir(tmp_path) == tmp_path / "results" and paths.figures_dir(str(tmp_path)) == tmp_path / "figures"
    assert paths.notebooks_dir() == paths.root() / "notebooks" and paths.params_dir() == paths.root() / "params"


def test_mdlib_root_comes_before_the_checkout(clean_env, monkeypatch):
    project = make_project(clean_env / "book")
    monkeypatch.setenv(paths.ROOT_ENV, str(project))
    assert paths.root() == project.resolve()
    assert paths.build_dir() == project.resolve() / "_build"
    assert fetch.data_dir() == project.resolve() / "data" / "cache"


def test_root_option_comes_before_mdlib_root(clean_env, monkeypatch):
    first, second = make_project(clean_env / "first"), make_project(clean_env / "second")
    monkeypatch.setenv(paths.ROOT_ENV, str(first))
    with paths.using_root(second):
        assert paths.root() == second.resolve()
        with paths.using_root(None):
            assert paths.root() == second.resolve()
    assert paths.root() == first.resolve()


def test_working_directory_or_a_parent_when_the_package_is_installed(installed, monkeypatch):
    assert paths.find_root() is None
    project = make_project(installed.parents[2] / "book")  # beside the venv
    deep = project / "notebooks" / "sub"
    deep.mkdir()
    monkeypatch.chdir(deep)
    assert paths.root() == project.resolve()
    assert paths.find_root(installed) is None  # from another working directory: none
    assert fetch.data_dir() == project.resolve() / "data" / "cache"


def test_no_project_is_an_error_that_says_what_to_do(installed):
    with pytest.raises(paths.ProjectNotFound) as error:
        paths.root()
    message = str(error.value)
    for hint in ("_config.yml", "notebooks/", "params/", "inside a checkout of the book", "MDLIB_ROOT=", "--root",
                 str(Path.cwd())):
        assert hint in message, (hint, message)
    with pytest.raises(paths.ProjectNotFound):
        paths.notebooks_dir()


@pytest.mark.parametrize("how", ["option", "variable"])
def test_a_named_folder_that_is_no_project_is_an_error(clean_env, monkeypatch, how):
    folder = clean_env / "not-a-book"
    (folder / "notebooks").mkdir(parents=True)
    if how == "variable":
        monkeypatch.setenv(paths.ROOT_ENV, str(folder))
        with pytest.raises(paths.ProjectNotFound, match=r"\$MDLIB_ROOT is .*not-a-book.*no _config.yml, params/"):
            paths.root()
    else:
        with pytest.raises(paths.ProjectNotFound, match=r"--root is .*not-a-book.*no _config.yml, params/"):
            with paths.using_root(folder):
                pass


def test_outside_a_project_nothing_lands_in_the_package(installed, monkeypatch, tmp_path):
    cache = tmp_path / "xdg" / "mdlib"
    assert fetch.data_dir() == cache
    assert paths.build_dir() == cache / "build" and paths.runs_dir() == cache / "build" / "runs"
    for folder in (fetch.data_dir(), paths.build_dir()):
        assert installed not in folder.parents
    monkeypatch.delenv(paths.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fetch.data_dir() == tmp_path / "home" / ".cache" / "mdlib"
    monkeypatch.setenv(paths.CACHE_ENV, "relative/cache")  # not absolute: ignored, as XDG says
    assert fetch.data_dir() == tmp_path / "home" / ".cache" / "mdlib"
    monkeypatch.setenv(fetch.DATA_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "build"))
    assert fetch.data_dir() == tmp_path / "data" and paths.build_dir() == tmp_path / "build"


def test_data_files_come_from_the_project_else_from_the_package(installed, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="authors_sentences.csv"):
        paths.data_file("authors_sentences.csv")
    packaged = installed / "mdlib" / "_data" / "authors_sentences.csv"  # where the wheel puts data/*.csv
    packaged.parent.mkdir()
    packaged.write_text("from the wheel\n")
    assert paths.data_file("authors_sentences.csv") == packaged
    project = make_project(tmp_path / "book")
    (project / "data").mkdir()
    (project / "data" / "authors_sentences.csv").write_text("from the project\n")
    monkeypatch.setenv(paths.ROOT_ENV, str(project))
    assert paths.data_file("authors_sentences.csv") == project.resolve() / "data" / "authors_sentences.csv"


def test_in_the_checkout_the_data_files_are_the_tracked_ones():
    for name in ("authors_sentences.csv", "pivotal_sentences.csv"):
        assert paths.data_file(name) == CHECKOUT / "data" / name


def test_the_command_line_reports_a_missing_project_in_one_line(installed, capsys):
    assert cli.main(["run", "01_fixed_decoder_paths"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: no checkout of the book found"), err
    assert cli.main(["store", "--root", str(installed)]) == 1  # --root after the command, not a project
    assert "--root is" in capsys.readouterr().err


def test_root_option_reaches_the_notebooks(clean_env, monkeypatch, capsys):
    project = make_project(clean_env / "book")
    (project / "params" / "default.yaml").write_text("{}\n")
    (project / "notebooks" / "01_only.py").write_text('# %% tags=["parameters"]\nprofile = "default"  # profile\n')
    started = []
    monkeypatch.setattr("papermill.execute_notebook", lambda *args, **kwargs: started.append(kwargs["cwd"]))
    monkeypatch.setenv(paths.BUILD_ENV, str(clean_env / "build"))
    for argv in (["--root", str(project), "run", "nope"], ["run", "nope", "--root", str(project)]):
        assert cli.main(argv) == 1
        assert "the notebooks in" in capsys.readouterr().err  # looked in the project's notebooks/
    assert cli.main(["--root", str(project), "run", "01_only"]) == 1  # the fake papermill wrote no notebook
    assert started == [str(project / "notebooks")]
    assert "01_only" in capsys.readouterr().err


def test_a_missing_extra_is_named_by_the_command_line(monkeypatch, capsys):
    def no_papermill(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'papermill'", name="papermill")

    monkeypatch.setattr("mdlib.book.execute.run_notebook", no_papermill)
    assert cli.main(["run", "01_fixed_decoder_paths"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'attention-mirror-descent[book]'" in err and len(err.strip().splitlines()) == 1, err
