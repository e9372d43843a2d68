"""Runs shared between processes: the store's per-run lock, run_many through an executor (Dask), one
worker per GPU. Real processes throughout; ``pytest -k cluster`` selects them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mdlib.experiments import paths, store

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

#: A process that asks the store for run "race"/{"a": 1}; its compute appends a line to argv[1] (so the
#: test counts the computations), sleeps argv[2] seconds, and the process prints the result as JSON.
ASK = textwrap.dedent("""
    import json, os, sys, time
    from mdlib.experiments import store

    def compute():
        with open(sys.argv[1], "a") as handle:
            handle.write(f"{os.getpid()}\\n")
        time.sleep(float(sys.argv[2]))
        return {"pid": os.getpid(), "value": 42}

    result = store.load_or_run("race", {"a": 1}, compute)
    print(json.dumps(dict(result)))
""")


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "build"))
    monkeypatch.delenv(store.LOCK_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


def _ask(count: Path, seconds: float, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen([sys.executable, "-c", ASK, str(count), str(seconds)], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(process: subprocess.Popen) -> tuple[dict, str]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out), err


def _lock() -> Path:
    return paths.runs_dir() / ".locks" / "race" / f"{store.config_key('race', {'a': 1})}.lock"


def test_cluster_lock_two_racing_processes_compute_a_run_once(tmp_path):
    count = tmp_path / "count"
    first, second = _ask(count, 2.0), _ask(count, 2.0)
    (a, err_a), (b, err_b) = _answer(first), _answer(second)
    assert len(count.read_text().split()) == 1
    assert a == b and a["value"] == 42
    assert "waiting for it" in err_a + err_b and f":{a['pid']} " in err_a + err_b
    assert not _lock().exists()


def test_cluster_lock_of_a_killed_holder_is_taken_over_at_once(tmp_path):
    count = tmp_path / "count"
    holder = _ask(count, 600.0)
    deadline = time.monotonic() + 30
    while not (count.exists() and _lock().exists()):
        assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read() if holder.poll() else ""
        time.sleep(0.05)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    start = time.monotonic()
    result, _ = _answer(_ask(count, 0.0))  # the lock timeout is 10 minutes: the dead pid decides
    assert time.monotonic() - start < 30
    assert result["pid"] != holder.pid and len(count.read_text().split()) == 2
    assert store.load("race", {"a": 1})["value"] == 42 and not _lock().exists()


def _foreign_lock(age: float) -> None:
    lock = _lock()
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"host": "another-host", "pid": 1, "token": "another-host:1:x",
                                "started": "2026-01-01T00:00:00+00:00"}))
    os.utime(lock, (time.time() - age, time.time() - age))


def test_cluster_lock_with_an_old_heartbeat_is_taken_over_by_one_of_two_waiters(tmp_path):
    count = tmp_path / "count"
    _foreign_lock(age=3600)
    first, second = (_ask(count, 1.0, MDLIB_LOCK_TIMEOUT="0.01") for _ in range(2))
    (a, _), (b, _) = _answer(first), _answer(second)
    assert len(count.read_text().split()) == 1 and a == b
    assert not list(_lock().parent.iterdir())  # neither the stale lock nor a guard left behind


def test_cluster_lock_of_another_host_is_waited_for_until_its_heartbeat_is_old(monkeypatch, capsys):
    monkeypatch.setenv(store.LOCK_TIMEOUT_ENV, "0.02")  # 1.2 s
    _foreign_lock(age=0)
    start = time.monotonic()
    result = store.load_or_run("race", {"a": 1}, lambda: {"value": 1})
    assert time.monotonic() - start >= 1.0 and result["value"] == 1
    assert "another-host:1 (since 2026-01-01T00:00:00+00:00); waiting" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0", "-1", "ten", "inf"])
def test_cluster_lock_timeout_must_be_positive_minutes(monkeypatch, text):
    monkeypatch.setenv(store.LOCK_TIMEOUT_ENV, text)
    with pytest.raises(ValueError, match="MDLIB_LOCK_TIMEOUT.*minutes"):
        store.load_or_run("race", {"a": 1}, lambda: {"value": 1})
