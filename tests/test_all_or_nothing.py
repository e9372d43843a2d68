"""A chapter commits all or nothing: a failed, interrupted or killed execution leaves every earlier
figure and table byte for byte, and a book is rendered only from a notebook and artifacts of one
execution, for its own build folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mdlib.book import execute
from mdlib.experiments import paths

FIXTURES = Path(__file__).parent / "fixtures"
FIX = dict(notebooks_dir=FIXTURES / "notebooks", params_dir=FIXTURES / "params")


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(path: Path, text: str) -> None:
    paths.atomic_write(path, lambda tmp: tmp.write_text(text))


@pytest.fixture
def folders(tmp_path):
    out = {"figures": tmp_path / "figures", "results": tmp_path / "results"}
    write(out["figures"] / "a.png", "old a")
    write(out["results"] / "a.csv", "old table")
    write(out["results"] / "sub" / "b.csv", "old b")
    return out


def test_a_failed_block_leaves_every_file_as_it_was(tmp_path, folders):
    before = tree(tmp_path)
    with pytest.raises(RuntimeError, match="cell 6"):
        with paths.all_or_nothing(folders, tmp_path / ".rollback" / "ch"):
            write(folders["figures"] / "a.png", "new a")  # replaced
            write(folders["figures"] / "new.png", "new")  # added
            (folders["results"] / "sub" / "b.csv").unlink()  # removed
            raise RuntimeError("cell 6 failed")
    assert tree(tmp_path) == before


def test_a_finished_block_keeps_its_writes_and_no_journal(tmp_path, folders):
    with paths.all_or_nothing(folders, tmp_path / ".rollback" / "ch"):
        write(folders["figures"] / "a.png", "new a")
        write(folders["figures"] / "new.png", "new")
    assert tree(tmp_path) == {"figures/a.png": b"new a", "figures/new.png": b"new", "results/a.csv": b"old table",
                              "results/sub/b.csv": b"old b"}


def test_the_writes_of_a_killed_process_are_undone_by_the_next(tmp_path, folders):
    before = tree(tmp_path)
    script = f"""
import os
from pathlib import Path
from mdlib.experiments import paths
folders = {{k: Path(v) for k, v in {({k: str(v) for k, v in folders.items()})!r}.items()}}
with paths.all_or_nothing(folders, Path({str(tmp_path / '.rollback' / 'ch')!r})):
    paths.atomic_write(folders["figures"] / "a.png", lambda t: t.write_text("half"))
    os._exit(9)  # killed mid-chapter: no cleanup runs
"""
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 9
    assert (folders["figures"] / "a.png").read_text() == "half"
    assert paths.recover(tmp_path / ".rollback" / "ch", folders)
    assert tree(tmp_path) == before
    assert not paths.recover(tmp_path / ".rollback" / "ch", folders)  # nothing left to undo


@pytest.mark.slow
def test_a_failed_rerun_leaves_the_build_byte_identical_and_the_book_consistent(tmp_path, monkeypatch):
    build = tmp_path / "build"
    monkeypatch.setenv(paths.BUILD_ENV, str(build))
    execute.run_notebook("01_fixture", "default", {"seeds": 4}, output_dir=tmp_path, progress=False, **FIX)
    execute.check_consistent(["01_fixture"], tmp_path)
    before = tree(build / "figures") | {f"results/{k}": v for k, v in tree(build / "results").items()}
    notebook = (tmp_path / "01_fixture.ipynb").read_bytes()
    # the re-run with new overrides saves the figure, then fails in its last cell
    with pytest.raises(execute.NotebookError, match="the figures and results are as they were before this run"):
        execute.run_notebook("01_fixture", "default", {"seeds": 3, "fail": True}, output_dir=tmp_path, progress=False,
                          **FIX)
    after = tree(build / "figures") | {f"results/{k}": v for k, v in tree(build / "results").items()}
    assert after == before and (tmp_path / "01_fixture.ipynb").read_bytes() == notebook
    assert json.loads(after["fig-fixture.json"])["overrides"] == {"seeds": 4}
    execute.check_consistent(["01_fixture"], tmp_path)
    # a record from another execution of the chapter: the book refuses to render the mix
    record = json.loads(after["fig-fixture.json"])
    write(build / "figures" / "fig-fixture.json", json.dumps(record | {"execution": "another"}))
    with pytest.raises(execute.BookError, match=r"fig-fixture.json is not from the execution of notebooks/01_fixture"
                                             r".ipynb; execute again with `python -m mdlib run 01_fixture`"):
        execute.check_consistent(["01_fixture"], tmp_path)
    # the notebook executed for another build folder (MDLIB_BUILD_DIR) is not this build's chapter
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "other"))
    with pytest.raises(execute.BookError, match="was executed for the build folder .*build, not this one"):
        execute.check_consistent(["01_fixture"], tmp_path)


@pytest.mark.slow
def test_a_successful_rerun_removes_the_chapters_artifacts_it_no_longer_makes(tmp_path, monkeypatch):
    build = tmp_path / "build"
    monkeypatch.setenv(paths.BUILD_ENV, str(build))
    execute.run_notebook("01_fixture", "default", {}, output_dir=tmp_path, progress=False, **FIX)
    stale = json.loads((build / "figures" / "fig-fixture.json").read_text()) | {"label": "fig-gone",
                                                                                "files": ["figures/fig-gone.png"]}
    write(build / "figures" / "fig-gone.json", json.dumps(stale))
    write(build / "figures" / "fig-gone.png", "an earlier execution's figure")
    execute.run_notebook("01_fixture", "default", {}, output_dir=tmp_path, progress=False, **FIX)
    assert not (build / "figures" / "fig-gone.png").exists() and not (build / "figures" / "fig-gone.json").exists()
    execute.check_consistent(["01_fixture"], tmp_path)
