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

import pandas as pd
import pytest
import torch

from mdlib.experiments import paths
from mdlib.runs import identity, lockfile, pool, store
from mdlib.runs.identity import RunId
from test_runs import BlobsRun, blobs_run, build_blobs, build_either

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

#: A process that asks the store for run "race"/{"a": 1}; its compute appends a line to argv[1] (so the
#: test counts the computations), sleeps argv[2] seconds, and the process prints the result as JSON.
ASK = textwrap.dedent("""
    import json, os, sys, time
    from mdlib.runs import store
    from mdlib.runs.identity import RunId

    def compute():
        with open(sys.argv[1], "a") as handle:
            handle.write(f"{os.getpid()}\\n")
        time.sleep(float(sys.argv[2]))
        return {"pid": os.getpid(), "value": 42}

    result = store.load_or_run(RunId.of("race", {"a": 1}), compute)
    print(json.dumps(dict(result)))
""")


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "build"))
    monkeypatch.delenv(lockfile.LOCK_TIMEOUT_ENV, raising=False)
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
    return paths.runs_dir() / ".locks" / "race" / f"{identity.config_key('race', {'a': 1})}.lock"


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
    assert store.load(RunId.of("race", {"a": 1}))["value"] == 42 and not _lock().exists()


def _foreign_lock(age: float, host: str = "another-host", pid: int = 1, pids: str = "") -> None:
    lock = _lock()
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"host": host, "pid": pid, "pids": pids, "token": f"{host}:{pid}:x",
                                "started": "2026-01-01T00:00:00+00:00"}))
    os.utime(lock, (time.time() - age, time.time() - age))


def test_cluster_lock_with_an_old_heartbeat_is_taken_over_by_one_of_two_waiters(tmp_path):
    count = tmp_path / "count"
    _foreign_lock(age=3600)
    first, second = (_ask(count, 1.0, MDLIB_LOCK_TIMEOUT="0.01") for _ in range(2))
    (a, _), (b, _) = _answer(first), _answer(second)
    assert len(count.read_text().split()) == 1 and a == b
    assert not list(_lock().parent.iterdir())  # neither the stale lock nor a guard left behind



def test_cluster_lock_asked_not_to_wait_names_its_live_holder_and_takes_a_stale_one(monkeypatch):
    _foreign_lock(age=0)
    with pytest.raises(lockfile.LockHeld, match=r"held by another-host:1 \(since 2026-01-01") as held:
        with lockfile.hold(_lock(), "a run", wait=False):
            pass
    assert held.value.record["host"] == "another-host" and held.value.path == _lock()
    monkeypatch.setenv(lockfile.LOCK_TIMEOUT_ENV, "0.01")  # the same lock, now stale (0.6 s)
    os.utime(_lock(), (time.time() - 60, time.time() - 60))
    with lockfile.hold(_lock(), "a run", wait=False):
        assert json.loads(_lock().read_text())["pid"] == os.getpid()
    assert not _lock().exists()

@pytest.mark.parametrize("elsewhere", ["another host", "another pid namespace"])
def test_cluster_lock_of_another_host_is_waited_for_until_its_heartbeat_is_old(monkeypatch, capsys, elsewhere):
    monkeypatch.setenv(lockfile.LOCK_TIMEOUT_ENV, "0.02")  # 1.2 s
    if elsewhere == "another host":
        _foreign_lock(age=0)
        holder = "another-host:1"
    else:  # a container sharing this host's name: its pid means nothing here
        dead = subprocess.Popen([sys.executable, "-c", ""])
        dead.wait()
        _foreign_lock(age=0, host=lockfile.host(), pid=dead.pid, pids="pid:[1]")
        holder = f"{lockfile.host()}:{dead.pid}"
    start = time.monotonic()
    result = store.load_or_run(RunId.of("race", {"a": 1}), lambda: {"value": 1})
    assert time.monotonic() - start >= 1.0 and result["value"] == 1
    assert f"{holder} (since 2026-01-01T00:00:00+00:00); waiting" in capsys.readouterr().err


def _within(seconds: float, call) -> tuple[object, float]:
    """(call(), its duration), failing when it does not return within ``seconds`` (a wait that hangs)."""
    import threading

    out, start = [], time.monotonic()
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"still waiting after {seconds} s"
    return out[0], time.monotonic() - start


@pytest.mark.parametrize("text", ["", "{\"host\": \"a"])
def test_cluster_lock_without_a_readable_record_is_taken_over_within_seconds(monkeypatch, capsys, text):
    """A writer killed between creating its lock and writing it (or an emptied lock): not 10 minutes."""
    _lock().parent.mkdir(parents=True)
    _lock().write_text(text)
    result, seconds = _within(30, lambda: store.load_or_run(RunId.of("race", {"a": 1}), lambda: {"value": 1}))
    assert result["value"] == 1 and seconds < 3 * lockfile.UNREADABLE_LOCK_SECONDS and not _lock().exists()
    assert f"the lock {_lock()} holds no readable record; waiting at most 5 s" in capsys.readouterr().err


def test_cluster_lock_with_a_heartbeat_in_the_future_is_taken_over_after_the_timeout(monkeypatch, capsys):
    """A lock of another host whose clock runs a day ahead: its age counts from when it was seen."""
    monkeypatch.setenv(lockfile.LOCK_TIMEOUT_ENV, "0.02")  # 1.2 s
    _foreign_lock(age=-86400)
    result, seconds = _within(30, lambda: store.load_or_run(RunId.of("race", {"a": 1}), lambda: {"value": 1}))
    assert result["value"] == 1 and 1.0 <= seconds < 10
    assert ("another-host:1 (since 2026-01-01T00:00:00+00:00); waiting for it, and taking it over if its "
            "heartbeat stops for 0.02 minutes") in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0", "-1", "ten", "inf"])
def test_cluster_lock_timeout_must_be_positive_minutes(monkeypatch, text):
    monkeypatch.setenv(lockfile.LOCK_TIMEOUT_ENV, text)
    with pytest.raises(ValueError, match="MDLIB_LOCK_TIMEOUT.*minutes"):
        store.load_or_run(RunId.of("race", {"a": 1}), lambda: {"value": 1})


# ---------------------------------------------------------------------------------------------
# run_many through an executor: Dask


def build_counted(config: BlobsRun):
    """build_blobs, appending a line to the file ``config.count`` first: one line per run trained."""
    with open(config.count, "a") as handle:
        handle.write(f"{config.fit.seed}\n")
    return build_blobs(config)


def build_slowly(config: BlobsRun):
    """build_counted, the count's line naming this process, after a second (so that runs overlap)."""
    time.sleep(1.0)
    with open(config.count, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return build_blobs(config)


SHARE = textwrap.dedent("""
    import json, sys
    from test_cluster import build_slowly
    from test_runs import BlobsRun
    from mdlib.runs import pool

    configs = [BlobsRun.from_dict(c) for c in json.loads(sys.argv[1])]
    results = pool.run_many("cluster", configs, build_slowly, progress=False)
    print(json.dumps([r.key for r in results]))
""")


@pytest.mark.slow  # 10-20 s: two launchers importing torch, four runs of a second or more
def test_cluster_two_launchers_by_hand_share_the_runs_out(tmp_path):
    count = tmp_path / "count"
    configs = [blobs_run(seed, count=str(count)).to_dict() for seed in range(4)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    launchers = [subprocess.Popen([sys.executable, "-c", SHARE, json.dumps(configs)], env=environment,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    answers = [launcher.communicate(timeout=120) for launcher in launchers]
    for launcher, (_, err) in zip(launchers, answers):
        assert launcher.returncode == 0, err
    assert answers[0][0] == answers[1][0]
    trained_by = count.read_text().split()
    assert len(trained_by) == 4 and set(trained_by) == {str(launcher.pid) for launcher in launchers}


def test_cluster_run_many_trains_first_the_runs_no_other_process_trains(tmp_path):
    import threading

    count = tmp_path / "count"
    first, second = (blobs_run(seed, count=str(count)) for seed in (0, 1))
    held = threading.Event()

    def hold_the_first():  # as another process would: until the second run is trained here
        with store._run_lock(identity.RunId.of("cluster", first)):
            held.set()
            deadline = time.monotonic() + 60
            while not count.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    holder = threading.Thread(target=hold_the_first)
    holder.start()
    held.wait(10)
    assert store.busy(RunId.of("cluster", first)) and not store.busy(RunId.of("cluster", second))
    results = pool.run_many("cluster", [first, second], build_counted, progress=False)
    holder.join()
    assert count.read_text().split() == ["1", "0"] and [r.key for r in results] == [
        identity.config_key("cluster", c) for c in (first, second)]


#: A launcher: run_many of argv[2]'s configs through the Dask scheduler at argv[1], given as the
#: executor ("argument") or through $MDLIB_EXECUTOR ("environment"); prints key -> history as JSON.
LAUNCH = textwrap.dedent("""
    import json, os, sys
    from test_cluster import build_counted
    from test_runs import BlobsRun
    from mdlib.runs import pool

    address, configs, how = sys.argv[1], [BlobsRun.from_dict(c) for c in json.loads(sys.argv[2])], sys.argv[3]
    if how == "environment":
        os.environ[pool.EXECUTOR_ENV] = f"dask:{address}"
        results = pool.run_many("cluster", configs, build_counted, progress=False)
    else:
        from distributed import Client

        with Client(address) as client:
            results = pool.run_many("cluster", configs, build_counted, executor=client.get_executor(),
                                    progress=False)
    print(json.dumps({r.key: r["history"].drop(columns="seconds").to_dict("list") for r in results}))
""")


def _histories(results) -> dict[str, pd.DataFrame]:
    return {r.key: r["history"].drop(columns="seconds") for r in results}


@pytest.mark.slow  # 20-40 s: a LocalCluster of two workers and two launchers, each importing torch
def test_cluster_two_launchers_on_one_dask_cluster_train_each_run_once(tmp_path, build_dir, monkeypatch):
    distributed = pytest.importorskip("distributed")
    count = tmp_path / "count"
    configs = [blobs_run(seed, epochs=2, count=str(count)) for seed in (0, 1, 2)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        launchers = [subprocess.Popen([sys.executable, "-c", LAUNCH, cluster.scheduler_address,
                                       json.dumps([c.to_dict() for c in configs]),
                                       how], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for how in ("environment", "argument")]
        answers = [launcher.communicate(timeout=120) for launcher in launchers]
    for launcher, (_, err) in zip(launchers, answers):
        assert launcher.returncode == 0, err
    first, second = (json.loads(out) for out, _ in answers)
    assert first == second and len(first) == 3
    assert sorted(count.read_text().split()) == ["0", "1", "2"]  # each run trained once, by a Dask worker
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "in-process"))
    here = _histories(pool.run_many("cluster", configs, build_counted, progress=False))
    assert list(here) == list(first)  # the same store entries
    for key, history in here.items():
        pd.testing.assert_frame_equal(pd.DataFrame(first[key]), history, check_dtype=False, rtol=1e-6)


@pytest.mark.slow  # 10-20 s: a LocalCluster started and stopped, its worker importing torch
def test_cluster_dask_local_spec_trains_as_the_process_does(tmp_path, build_dir, monkeypatch):
    pytest.importorskip("distributed")
    configs = [blobs_run(4, epochs=2, count=str(tmp_path / "count"))]
    monkeypatch.setenv(pool.EXECUTOR_ENV, "dask-local:1")
    remote = pool.run_many("cluster", configs, build_counted, progress=False)
    monkeypatch.setenv(pool.EXECUTOR_ENV, "processes")
    monkeypatch.setenv(paths.BUILD_ENV, str(tmp_path / "in-process"))
    here = pool.run_many("cluster", configs, build_counted, progress=False)
    assert remote[0].key == here[0].key and remote[0].path.parent.parent.parent == build_dir
    pd.testing.assert_frame_equal(_histories(remote)[remote[0].key], _histories(here)[here[0].key], rtol=1e-6)
    assert len((tmp_path / "count").read_text().split()) == 2  # once in Dask's worker, once here


@pytest.mark.slow  # 5-10 s: a spawned worker importing torch
def test_cluster_any_executor_takes_the_runs_and_their_skipped_errors(tmp_path):
    import concurrent.futures
    import multiprocessing

    good, bad = blobs_run(0), blobs_run(0, diverge=True)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        results = pool.run_many("skip", [good, bad], build_either, skip=(FloatingPointError,), executor=executor,
                                progress=False)
        assert results[1] is None and results[0].cached  # trained in the executor, read here from the store
        with pytest.raises(FloatingPointError, match="reduce lr"):
            pool.run_many("skip", [bad], build_either, executor=executor, progress=False)
    with pytest.raises(ValueError, match="run_many\\(executor=ProcessPoolExecutor\\) sends build"):
        pool.run_many("skip", [blobs_run(0, lr=0.1)], lambda config: build_blobs(config), executor=executor,
                      progress=False)


@pytest.mark.parametrize("spec", ["dask-local:0", "dask-local", "dask:", "slurm", "processes:2", ""])
def test_cluster_executor_spec_must_be_one_of_the_three(spec):
    with pytest.raises(ValueError, match="processes, dask-local:N or dask:ADDRESS"):
        pool.parse_executor(spec)


def test_cluster_executor_specs_parse():
    assert pool.parse_executor("processes") == ("processes", None)
    assert pool.parse_executor("dask-local:4") == ("dask-local", 4)
    assert pool.parse_executor(" dask:tcp://node7:8786") == ("dask", "tcp://node7:8786")


def test_cluster_a_bad_executor_in_the_environment_stops_run_many(monkeypatch):
    monkeypatch.setenv(pool.EXECUTOR_ENV, "dask-local:none")
    config = blobs_run(0, count="unused")
    with pytest.raises(ValueError, match="unknown executor 'dask-local:none'"):
        pool.run_many("cluster", [config], build_counted, progress=False)


def test_cluster_a_worker_with_another_results_store_says_so(tmp_path):
    config = blobs_run(0, count=str(tmp_path / "count"))
    with pytest.raises(RuntimeError, match=f"start the workers with MDLIB_BUILD_DIR={tmp_path / 'elsewhere'}"):
        pool._train_job(str(tmp_path / "elsewhere"), identity.RunId.of("cluster", config), config, build_counted, None,
                        "cpu")


# ---------------------------------------------------------------------------------------------
# one worker per GPU


def seen_by_a_worker(seconds: float) -> tuple[int, str, int]:
    """(pid, CUDA_VISIBLE_DEVICES, torch threads) of the worker process that runs this."""
    time.sleep(seconds)
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES", ""), torch.get_num_threads()


@pytest.mark.slow  # 6-10 s: three spawned workers, each importing torch
def test_cluster_each_gpu_worker_sees_its_own_device():
    executor = pool._start_pool(3, ["3", "5"])
    try:
        seen = list(executor.map(seen_by_a_worker, [1.5] * 3))
    finally:
        executor.shutdown()
    by_worker = {pid: (device, threads) for pid, device, threads in seen}
    assert len(by_worker) == 3  # three jobs of 1.5 s at once: one per worker
    assert sorted(device for device, _ in by_worker.values()) == ["3", "3", "5"]  # worker i: GPU i mod 2
    assert {threads for _, threads in by_worker.values()} == {1}


def test_cluster_gpu_slots_are_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert pool._device_slots() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert pool._device_slots() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert pool._device_slots() == [str(i) for i in range(torch.cuda.device_count())]


# ---------------------------------------------------------------------------------------------
# the executor from the command line or the profile, into the notebooks' kernels


@pytest.fixture
def chapter(tmp_path, monkeypatch):
    """A copy of the fixture notebook and profiles; papermill replaced by a writer of the notebook that
    records the kernel's $MDLIB_EXECUTOR. Returns (params folder, the values recorded)."""
    import shutil

    import nbformat

    fixtures = TESTS / "fixtures"
    for name in ("notebooks", "params"):
        shutil.copytree(fixtures / name, tmp_path / name)
    monkeypatch.setattr(paths, "notebooks_dir", lambda: tmp_path / "notebooks")
    monkeypatch.setattr(paths, "params_dir", lambda: tmp_path / "params")
    monkeypatch.delenv(pool.EXECUTOR_ENV, raising=False)
    seen = []

    def execute_notebook(nb, output, **kwargs):
        seen.append(os.environ.get(pool.EXECUTOR_ENV))
        nbformat.write(nb, output)

    monkeypatch.setattr("papermill.execute_notebook", execute_notebook)
    return tmp_path / "params", seen


@pytest.mark.parametrize("in_profile,given,expected", [
    (None, None, None),
    ("dask-local:2", None, "dask-local:2"),
    ("dask-local:2", "dask:tcp://node7:8786", "dask:tcp://node7:8786"),
    (None, "processes", "processes"),
])
def test_cluster_executor_reaches_the_kernel_from_the_profile_or_the_command(chapter, in_profile, given, expected):
    from mdlib.book import cli, profiles

    params, seen = chapter
    if in_profile is not None:
        with open(params / "smoke.yaml", "a") as handle:
            handle.write(f"executor: {in_profile}\n")
    assert profiles.profile_executor("smoke") == in_profile
    assert "executor" not in profiles.load_profile("smoke")
    argv = ["run", "01_fixture", "--profile", "smoke"] + (["--executor", given] if given else [])
    assert cli.main(argv) == 0
    assert seen == [expected] and pool.EXECUTOR_ENV not in os.environ


def test_cluster_a_bad_executor_is_refused_before_anything_runs(chapter, capsys):
    from mdlib.book import cli

    params, seen = chapter
    with pytest.raises(SystemExit) as refused:
        cli.main(["run", "01_fixture", "--executor", "slurm:4"])
    assert refused.value.code == 2 and "unknown executor 'slurm:4'" in capsys.readouterr().err
    with open(params / "smoke.yaml", "a") as handle:
        handle.write("executor: dask-local:many\n")
    assert cli.main(["run", "01_fixture", "--profile", "smoke"]) == 1
    err = capsys.readouterr().err
    assert f"error: {params / 'smoke.yaml'}: executor: unknown executor 'dask-local:many'; an executor is" in err
    assert seen == []


def test_cluster_a_result_of_locked_runs_is_computed_without_its_own_lock():
    import threading

    run, held, done = identity.RunId.of("race", {"a": 1}), threading.Event(), threading.Event()

    def hold():
        with store._run_lock(run):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        assert store.load_or_run(RunId.of("race", {"a": 1}), lambda: {"value": 7}, lock=False)["value"] == 7
    finally:
        done.set()
        holder.join()
