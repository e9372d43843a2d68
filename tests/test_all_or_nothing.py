"""A chapter commits all or nothing, and only its own files: a failed, interrupted or killed execution
leaves every earlier figure and table byte for byte, its own chapter's and the others', two executions
of one chapter into one folder never run at once, and a book is rendered only from a notebook and
artifacts of one execution, for its own build folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdlib.book import execute
from mdlib.experiments import paths
from mdlib.runs import lockfile
from mdlib.runs.files import atomic_write

FIXTURES = Path(__file__).parent / "fixtures"
FIX = dict(notebooks_dir=FIXTURES / "notebooks", params_dir=FIXTURES / "params")


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def record(folder: Path, label: str, notebook: str, execution: str) -> None:
    """A figure of ``notebook`` with its provenance record, as a chapter's execution leaves it."""
    write(folder / "figures" / f"{label}.png", f"{label} of {execution}")
    write(folder / "figures" / f"{label}.json", json.dumps({"label": label, "notebook": notebook,
                                                            "execution": execution,
                                                            "files": [f"figures/{label}.png"]}))


def test_a_killed_unfinished_execution_is_discarded_touching_no_other_chapter(tmp_path):
    """Issue: one chapter's journal used to roll back every chapter's files."""
    record(tmp_path, "fig-one", "01_one", "first")
    staged = execute._staging("03_three", tmp_path)
    record(staged, "fig-three", "03_three", "killed")  # what the killed execution had written
    before = tree(tmp_path / "figures")
    record(tmp_path, "fig-one", "01_one", "second")  # chapter 01 re-executed meanwhile
    after_01 = tree(tmp_path / "figures")
    assert after_01 != before
    with execute._chapter_lock("03_three", tmp_path):
        assert "discarded" in execute._recover("03_three", tmp_path)
    assert tree(tmp_path / "figures") == after_01 and not staged.exists()
    assert execute._recover("03_three", tmp_path) is None  # nothing left to settle


def test_a_commit_killed_half_way_is_completed_by_the_next_recovery(tmp_path):
    record(tmp_path, "fig-one", "01_one", "first")
    record(tmp_path, "fig-gone", "03_three", "earlier")  # the chapter's earlier execution wrote it, this one not
    committing = execute._staging("03_three", tmp_path).with_name("03_three" + execute.COMMITTING)
    record(committing, "fig-three", "03_three", "new")
    write(committing / "03_three.ipynb", "the executed notebook")
    write(committing / execute.COMMIT, json.dumps({"execution": "new", "notebook": str(tmp_path / "03_three.ipynb")}))
    (committing / "figures" / "fig-three.png").replace(tmp_path / "figures" / "fig-three.png")  # moved before the kill
    one = tree(tmp_path / "figures")["fig-one.png"]
    assert "completed" in execute._recover("03_three", tmp_path)
    figures = tree(tmp_path / "figures")
    assert sorted(figures) == ["fig-one.json", "fig-one.png", "fig-three.json", "fig-three.png"]
    assert figures["fig-one.png"] == one and (tmp_path / "03_three.ipynb").read_text() == "the executed notebook"
    assert not committing.exists()


def test_a_second_execution_of_a_running_chapter_is_refused_by_name(tmp_path):
    with execute._chapter_lock("03_three", tmp_path):
        with pytest.raises(execute.BookError, match=r"03_three is being executed into .* by \S+:\d+ \(since"):
            with execute._chapter_lock("03_three", tmp_path):
                pass
        with execute._chapter_lock("01_one", tmp_path):  # another chapter at once: fine
            pass
    lock = execute._staging("03_three", tmp_path).with_name("03_three.lock")
    killed = subprocess.Popen([sys.executable, "-c", KILLED_HOLDER, str(lock)],
                              env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)})
    assert killed.wait(60) == -signal.SIGKILL and lock.exists()
    with execute._chapter_lock("03_three", tmp_path):  # its holder is gone: taken over at once
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_a_chapter_lock_of_another_host_is_refused_until_its_heartbeat_stops(tmp_path, monkeypatch):
    monkeypatch.setenv(lockfile.LOCK_TIMEOUT_ENV, "0.02")  # 1.2 s
    lock = execute._staging("03_three", tmp_path).with_name("03_three.lock")
    write(lock, json.dumps({"host": "another-host", "pid": 1, "pids": "", "token": "another-host:1:x",
                            "started": "2026-01-01T00:00:00+00:00"}))
    with pytest.raises(execute.BookError, match=r"by another-host:1 \(since 2026-01-01T00:00:00\+00:00\)"):
        with execute._chapter_lock("03_three", tmp_path):
            pass
    os.utime(lock, (time.time() - 60, time.time() - 60))  # its heartbeat stopped a minute ago
    with execute._chapter_lock("03_three", tmp_path):
        assert json.loads(lock.read_text())["host"] == lockfile.host()
    assert not lock.exists()


#: A process that takes a lock (``sys.argv[1]``) and is killed while it holds it.
KILLED_HOLDER = """import os, signal, sys
from pathlib import Path
from mdlib.runs import lockfile
with lockfile.hold(Path(sys.argv[1]), "a chapter"):
    os.kill(os.getpid(), signal.SIGKILL)
"""


SLEEPER = """# %% tags=["parameters"]
profile = "default"  # profile

# %%
import time

import matplotlib.pyplot as plt

from mdlib.book import artifacts

artifacts.save_figure(plt.subplots()[0], "fig-sleeper")
time.sleep(300)
"""


def _project(tmp_path: Path) -> Path:
    """A book project with the fixture chapter (01) and a chapter that saves a figure, then sleeps (02)."""
    import shutil

    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(FIXTURES / "notebooks" / "01_fixture.py", root / "notebooks")
    (root / "notebooks" / "02_sleeper.py").write_text(SLEEPER)
    shutil.copytree(FIXTURES / "params", root / "params")
    (root / "_config.yml").write_text("title: t\n")
    return root


def _start(root: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``mdlib --root ROOT ARGV...`` in a new session, with ``env`` added to this process's environment."""
    script = f"import sys; from mdlib.book import cli; sys.exit(cli.main(['--root', {str(root)!r}, *{list(argv)!r}]))"
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent), **(env or {})},
                            start_new_session=True)


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)


#: ``mdlib run`` as ``mdlib book`` starts a chapter beside others: a child told its parent's pid.
BOOK_CHILD = """import os, subprocess, sys
env = dict(os.environ, MDLIB_PARENT_PID=str(os.getpid()))
subprocess.run([sys.executable, "-c", sys.argv[1]], env=env)
"""


@pytest.mark.slow
def test_a_chapter_the_book_started_stops_when_the_book_is_killed(tmp_path):
    root = _project(tmp_path)
    build = root / "_build"
    script = f"import sys; from mdlib.book import cli; sys.exit(cli.main(['--root', {str(root)!r}, 'run', '02_sleeper']))"
    book = subprocess.Popen([sys.executable, "-c", BOOK_CHILD, script], start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)})
    _wait_for(execute._staging("02_sleeper", build) / "figures" / "fig-sleeper.png", book)
    child = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(book.pid)], capture_output=True, text=True
                                                  ).stdout.split()]
    assert len(child) == 1
    book.kill()  # kill -9 of the book's process, mid-cell of the chapter it started
    book.wait()
    deadline = time.monotonic() + 60
    while lockfile.alive(child[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not lockfile.alive(child[0]), "the chapter kept running without its book"
    assert not execute._staging("02_sleeper", build).exists() and not (build / "figures" / "fig-sleeper.png").exists()
    try:  # its kernel stopped with it: nothing of the book's process group is left
        while time.monotonic() < deadline:
            os.killpg(book.pid, 0)
            time.sleep(0.2)
        os.killpg(book.pid, signal.SIGKILL)
        raise AssertionError("the chapter's kernel kept running")
    except ProcessLookupError:
        pass


@pytest.mark.slow
def test_killing_one_chapter_and_running_another_keeps_both_chapters_files(tmp_path):
    """The issue's replay: kill 02 mid-run, re-run 01, run 02's recovery: 01's new files stay."""
    root = _project(tmp_path)
    build = root / "_build"
    assert subprocess.run([sys.executable, "-m", "mdlib", "--root", str(root), "run", "01_fixture"],
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)}
                          ).returncode == 0
    sleeper = _start(root, "run", "02_sleeper")
    _wait_for(execute._staging("02_sleeper", build) / "figures" / "fig-sleeper.png", sleeper)
    second = _start(root, "run", "02_sleeper")  # two executions of one chapter at once
    assert second.wait(120) == 1
    assert "02_sleeper is being executed into" in second.communicate()[1]
    os.killpg(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    first = tree(build / "figures")
    assert subprocess.run([sys.executable, "-m", "mdlib", "--root", str(root), "run", "01_fixture"],
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(paths.PACKAGE_DIR.parent)}
                          ).returncode == 0
    figures = tree(build / "figures")
    assert figures["fig-fixture.json"] != first["fig-fixture.json"]  # 01's second execution
    with execute._chapter_lock("02_sleeper", build):
        assert "discarded" in execute._recover("02_sleeper", build)
    assert tree(build / "figures") == figures and "fig-sleeper.png" not in figures


@pytest.mark.slow
def test_a_rooted_run_executes_into_the_build_folder_of_the_environment(tmp_path):
    """``MDLIB_BUILD_DIR=B mdlib --root R run``: the chapter's lock, staging folder, figures and the files its
    kernel writes are all in B; nothing goes to R/_build. A second execution into B is refused by name."""
    root = _project(tmp_path)
    build = tmp_path / "elsewhere"
    env = {paths.BUILD_ENV: str(build)}
    sleeper = _start(root, "run", "02_sleeper", env=env)
    _wait_for(execute._staging("02_sleeper", build) / "figures" / "fig-sleeper.png", sleeper)
    second = _start(root, "run", "02_sleeper", env=env)
    assert second.wait(120) == 1
    assert f"02_sleeper is being executed into {build}" in second.communicate()[1]
    os.killpg(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    fixture = _start(root, "run", "01_fixture", env=env)
    assert fixture.wait(180) == 0, fixture.communicate()
    assert json.loads((build / "fixture.json").read_text())["profile"] == "default"  # the kernel's file
    assert (build / "figures" / "fig-fixture.png").is_file() and (build / "figures" / "fig-fixture.json").is_file()
    assert not (root / "_build").exists()


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
