"""Live progress on the terminal of the command that executes a notebook (``mdlib.book.progress``): the
status files ``run_many`` writes, the reader of a run's checkpoint, the lines and the estimate from
crafted files, and (slow: a kernel) ``mdlib run`` of a tiny training notebook through a pseudo-terminal
and into a log, interrupted with Ctrl-C, its executed notebook free of progress text."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from mdlib.book import progress
from mdlib.experiments import paths, train
from mdlib.runs import identity, lockfile, pool, progress as status_files
from test_runs import blobs_run, build_blobs


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLIB_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.delenv(status_files.PROGRESS_ENV, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path / "build"


HISTORY = [{"epoch": e, "train_loss": 0.5 / e, "train_accuracy": 0.8 + e / 100, "test_loss": 0.6,
            "test_accuracy": 0.7, "seconds": 3.0, "lr": 0.1} for e in range(1, 5)]


def _checkpoint(path: Path, history: list[dict]) -> Path:
    """A checkpoint as ``train.fit`` writes it: tensors (model, optimizer, RNG states) beside the history."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"settings": {"seed": 0, "model.weight": [4, 3]}, "model": {"weight": torch.ones(4, 3)},
                "optimizer": {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": [{"lr": 0.1}]},
                "history": history, "stopped": False, "rng": [{"torch": torch.get_rng_state()}]}, path)
    return path


# ---------------------------------------------------------------------------------------------
# reading a checkpoint


def test_a_checkpoint_is_read_without_its_tensors_as_fit_wrote_it(tmp_path):
    from test_train import blobs, mlp
    from torch.utils.data import TensorDataset

    x, y = blobs(32)
    model = mlp(0)
    history = train.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), TensorDataset(x, y), None,
                        train.FitOptions(epochs=2, batch_size=8, seed=0), checkpoint=tmp_path / "ck", progress=False)
    found = status_files.read_checkpoint(tmp_path / "ck" / status_files.CHECKPOINT)
    assert [row["epoch"] for row in found["history"]] == [1, 2] and found["stopped"] is False
    assert [row["train_accuracy"] for row in found["history"]] == list(history["train_accuracy"])
    assert status_files.CHECKPOINT == train.CHECKPOINT


def test_the_reader_falls_back_to_torch_and_gives_none_for_what_it_cannot_read(tmp_path, monkeypatch):
    path = _checkpoint(tmp_path / "checkpoint.pt", HISTORY)
    assert status_files.read_checkpoint(path)["history"] == HISTORY
    monkeypatch.setattr(status_files, "_structure", lambda path: 1 / 0)  # the fast path fails: torch.load
    assert status_files.read_checkpoint(path)["history"] == HISTORY
    monkeypatch.undo()
    (tmp_path / "bad.pt").write_bytes(b"not a zip")
    assert status_files.read_checkpoint(tmp_path / "bad.pt") is None
    assert status_files.read_checkpoint(tmp_path / "missing.pt") is None


class _Runs:
    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_the_reader_runs_no_code_from_the_file(tmp_path):
    """A checkpoint's pickle that would call os.system: the restricted reader builds nothing of it."""
    payload = _Runs()
    payload.target = tmp_path / "ran"
    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"history": [{"epoch": 1}], "x": payload}, protocol=2))
    found = status_files._structure(tmp_path / "evil.pt")
    assert found["history"] == [{"epoch": 1}] and not (tmp_path / "ran").exists()


# ---------------------------------------------------------------------------------------------
# what run_many writes


def test_labels_name_the_method_what_differs_and_the_seed():
    configs = [{"optimizer": {"name": "md", "lr": lr, "p": 1.1}, "model": {"layers": 2}, "fit": {"seed": s}}
               for lr in (1e-3, 3e-3) for s in (0, 1)]
    configs.append({"optimizer": {"name": "adam", "lr": 1e-3, "p": None}, "model": {"layers": 2}, "fit": {"seed": 0}})
    labels = status_files.describe(configs)
    assert labels[:2] == ["md p=1.1 lr=0.001 seed 0", "md p=1.1 lr=0.001 seed 1"]
    assert labels[2] == "md p=1.1 lr=0.003 seed 0" and labels[-1] == "adam lr=0.001 seed 0"
    assert status_files.describe([{"a": {"x": 1}, "b": {"x": 2}}, {"a": {"x": 2}, "b": {"x": 2}}]) == ["x=1", "x=2"]
    assert status_files.describe([{"a": {"x": 1}, "b": {"x": 2}}, {"a": {"x": 2}, "b": {"x": 1}}]) == [
        "a.x=1 b.x=2", "a.x=2 b.x=1"]  # one last name for two settings: their paths


def _status(folder: Path) -> dict:
    (found,) = [p for p in folder.glob("*.json") if not p.name.startswith(".")]
    return json.loads(found.read_text())


@pytest.mark.parametrize("where", ["here", "executor"])
def test_run_many_writes_its_status_for_the_command_that_watches(build_dir, tmp_path, monkeypatch, where):
    pool.run_many("blobs", [blobs_run(0)], build_blobs, progress=False)  # stored before the call
    configs = [blobs_run(seed, epochs=2) for seed in (0, 1, 2)] + [blobs_run(0)]
    pool.run_many("blobs", configs[:1], build_blobs, progress=False)
    assert not (tmp_path / "progress").exists()  # nothing without $MDLIB_PROGRESS_DIR
    monkeypatch.setenv(status_files.PROGRESS_ENV, str(tmp_path / "progress"))
    executor = concurrent.futures.ThreadPoolExecutor(2) if where == "executor" else None
    pool.run_many("blobs", configs, build_blobs, progress=False, executor=executor)
    record = _status(tmp_path / "progress")
    assert record["finished"] and record["kind"] == "blobs" and record["pid"] == os.getpid()
    runs = record["runs"]
    assert [run["state"] for run in runs] == ["stored", "done", "done", "stored"]
    assert [run["label"] for run in runs] == ["epochs=2 seed 0", "epochs=2 seed 1", "epochs=2 seed 2",
                                              "epochs=1 seed 0"]
    assert runs[1]["epochs"] == 2 and runs[1]["seconds"] > 0 and runs[1]["cap"] == 2
    assert runs[1]["checkpoint"] == str(paths.checkpoints_dir() / "blobs" / runs[1]["key"] / "checkpoint.pt")
    assert runs[1]["entry"] == str(paths.runs_dir() / "blobs" / runs[1]["key"])
    assert Path(runs[1]["lock"]).parent == paths.runs_dir() / ".locks" / "blobs"


def test_a_run_stopped_by_a_skipped_error_is_recorded_with_its_type(build_dir, tmp_path, monkeypatch):
    """A step that cannot be taken (here a step size that overflows) stops its run with FloatingPointError, which
    ``skip`` turns into None; the status file says which error, and the terminal line says it diverged."""
    monkeypatch.setenv(status_files.PROGRESS_ENV, str(tmp_path / "progress"))
    configs = [blobs_run(0), blobs_run(1, lr=1e30)]
    assert pool.run_many("blobs", configs, build_blobs, progress=False, skip=(FloatingPointError,))[1] is None
    runs = _status(tmp_path / "progress")["runs"]
    assert [run["state"] for run in runs] == ["done", "failed"]
    assert "error" not in runs[0] and runs[1]["error"] == "FloatingPointError"
    watch = progress.Watch(tmp_path / "progress")
    watch.poll()
    assert progress.lines(watch.snapshot("04_sentiment", 5.0), 200)[0].startswith(
        "04_sentiment: runs 1/2 so far (1 diverged), 0:05 elapsed")


# ---------------------------------------------------------------------------------------------
# the lines, from crafted files


def _hold(path: Path) -> None:
    """A lock file as a live holder (this process) writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": lockfile.host(), "pid": os.getpid(), "pids": lockfile._pid_namespace(),
                                "token": "t", "started": "2026-12-06T12:00:00+00:00"}))


def _row(tmp_path: Path, key: str, label: str, group: str, state: str, **rest) -> dict:
    return {"key": key, "label": label, "group": group, "cap": 10, "stop": 0.995, "state": state,
            "checkpoint": str(tmp_path / "ck" / key / "checkpoint.pt"), "lock": str(tmp_path / "locks" / f"{key}.lock"),
            "entry": str(tmp_path / "runs" / key), "flops_per_epoch": 1e9, "expected_epochs": 10.0, "epochs": None,
            "seconds": None, **rest}


def crafted(tmp_path: Path) -> Path:
    """A chapter's progress folder: one run_many call of three runs on 2 workers; a finished (10 epochs
    in 20 s), one training (4 epochs of 3 s, its lock held, accuracy 0.84), c waiting (twice the FLOPs)."""
    folder = tmp_path / "progress"
    folder.mkdir()
    runs = [_row(tmp_path, "a", "md p=1.1 seed 0", "g1", "done", epochs=10, seconds=20.0),
            _row(tmp_path, "b", "md p=1.1 seed 1", "g1", "waiting"),
            _row(tmp_path, "c", "md p=3 seed 0", "g2", "waiting", flops_per_epoch=2e9)]
    record = {"pid": os.getpid(), "host": lockfile.host(), "kind": "e4-sentiment", "workers": 2, "started": time.time(),
              "updated": time.time(), "finished": False, "runs": runs}
    (folder / f"{os.getpid()}-0.json").write_text(json.dumps(record))
    _hold(tmp_path / "locks" / "b.lock")
    _checkpoint(tmp_path / "ck" / "b" / "checkpoint.pt", HISTORY)
    return folder


def test_the_lines_of_a_crafted_status_file_and_checkpoint(tmp_path):
    watch = progress.Watch(crafted(tmp_path))
    watch.poll()
    snap = watch.snapshot("04_sentiment", 125.0, cells=(11, 31))
    # b: 6 epochs left of the 10 its like took, at its own 3 s; c: 10 epochs at 2.5 s/epoch per 1e9 FLOPs x 2e9
    assert snap.left == (50.0, False, "estimate")
    first, second = progress.lines(snap, width=200)
    assert first == "04_sentiment: cell 12/31, runs 1/3 so far, 2:05 elapsed, ~50 s left (estimate)"
    assert second == "  training e4-sentiment md p=1.1 seed 1: 4/10 epochs, train acc 0.840 (stop 0.995)"
    assert progress.log_line(snap) == f"[04_sentiment] {first[len('04_sentiment: '):]}; {second.strip()}"
    assert all(len(line) <= 60 for line in progress.lines(snap, width=60))

    for name, error in (("a", "FloatingPointError"), ("b", "ValueError")):  # runs that stopped, and how
        watch.runs[name].state, watch.runs[name].error = "failed", error
    assert progress.lines(watch.snapshot("04_sentiment", 125.0), 200)[0].startswith(
        "04_sentiment: runs 0/3 so far (1 diverged, 1 failed), 2:05 elapsed")
    watch.poll()  # the files say again what they said

    (tmp_path / "runs" / "c").mkdir(parents=True)  # stored meanwhile (another process): counted, not waited for
    watch.poll()
    assert progress.lines(watch.snapshot("04_sentiment", 130.0), 200)[0] == (
        "04_sentiment: runs 2/3 so far, 2:10 elapsed, ~18 s left (estimate)")


def test_the_plan_completes_the_total_and_a_stop_rule_not_reached_yet_bounds_the_estimate(tmp_path):
    folder = crafted(tmp_path)
    record = json.loads((folder / f"{os.getpid()}-0.json").read_text())
    record["runs"] = record["runs"][1:]  # no run finished: the cap bounds the epochs
    (folder / f"{os.getpid()}-0.json").write_text(json.dumps(record))
    planned = {"d": progress._Planned("e4-sentiment", str(tmp_path / "runs" / "d"), 10, 0.995, "g3", 1e9, 10.0)}
    watch = progress.Watch(folder, planned)
    watch.poll()
    snap = watch.snapshot("04_sentiment", 5.0)
    assert snap.complete and len(snap.runs) == 3
    # b: 6 x 3 s; c: 10 x 6 s, d: 10 x 3 s, on 2 slots: [18 + 30, 60]
    assert snap.left == (60.0, True, "estimate at the epoch caps")
    assert "runs 0/3, 0:05 elapsed, at most 1 min left (estimate at the epoch caps)" in progress.lines(snap)[0]


def test_between_two_pools_the_runs_to_come_are_laid_out_on_the_workers_seen(tmp_path):
    """Once a pool is done and before the next writes its status, no call is live: the runs still to come
    go on as many slots as the chapter trained at once (a 2026-12-07 build said 49 min for 32.5 there,
    for one line, laying them out one after another)."""
    folder = crafted(tmp_path)
    planned = {name: progress._Planned("e4-sentiment", str(tmp_path / "runs" / name), 10, 0.995, "g1", 1e9, 10.0)
               for name in ("d", "e")}
    watch = progress.Watch(folder, planned)
    watch.poll()
    assert watch.slots == 2
    path = folder / f"{os.getpid()}-0.json"
    record = json.loads(path.read_text())
    record["finished"] = True
    for row in record["runs"]:
        row.update(state="done", epochs=10, seconds=20.0)
    path.write_text(json.dumps(record))
    watch.poll()
    # d and e: 10 epochs each (their group's), 2 s an epoch (a's 20 s for 10), side by side
    assert watch.snapshot("04_sentiment", 200.0).left == (20.0, False, "estimate")


def test_a_planned_run_whose_step_a_sweep_chooses_goes_once_its_cell_and_seed_are_asked_for(tmp_path):
    """The plan counts a final run at its grid's first candidate; the run at the chosen step (another key,
    the same slot) replaces it, where the plan's placeholder would stay "planned" forever and inflate the
    total and the time left. A planned run whose step no choice decides stays until it is asked for."""
    folder = crafted(tmp_path)
    path = folder / f"{os.getpid()}-0.json"
    record = json.loads(path.read_text())
    record["runs"][2]["slot"] = "s2"  # c: the final of seed 2 at the chosen step
    path.write_text(json.dumps(record))
    planned = {name: progress._Planned("e4-sentiment", str(tmp_path / "runs" / name), 10, 0.995, "g3", 1e9, 10.0, slot)
               for name, slot in (("c0", "s2"), ("d", "s3"), ("e", ""))}
    watch = progress.Watch(folder, planned)
    watch.poll()
    assert sorted(watch.runs) == ["a", "b", "c", "d", "e"]  # c0 stands for c: gone; d and e still to come
    record["runs"].append(_row(tmp_path, "d1", "md p=3 seed 3", "g4", "waiting", slot="s3"))
    path.write_text(json.dumps(record))
    watch.poll()
    assert sorted(watch.runs) == ["a", "b", "c", "d1", "e"]
    assert progress.lines(watch.snapshot("04_sentiment", 5.0), 200)[0].startswith("04_sentiment: runs 1/5, ")


def test_the_plan_marks_the_runs_whose_step_a_choice_decides():
    from mdlib.book import plan, profiles

    values = profiles.executed_parameters("04_sentiment", "default")
    found = plan.planned_runs("04_sentiment", values)
    by_stage = {}
    for run in found:
        by_stage.setdefault(run.stage, []).append(run)
    variation = by_stage["Table 1, variation (small-embeddings)"]
    swept = {run.config.fit.seed for run in variation if not run.chosen}
    assert swept == {0, 1}  # the sweep's seeds: their candidates are all trained
    assert {run.config.fit.seed for run in variation if run.chosen} == set(range(2, 6))
    assert all(len(run.alternatives) == 3 for run in variation if run.chosen)
    assert not any(run.chosen for run in by_stage["Table 1 grid (replication)"])  # one candidate: no choice
    planned, _ = progress.planned_runs("04_sentiment", values)
    assert {key for key, p in planned.items() if p.slot} == {run.key for run in found if run.chosen}


def test_kept_names_the_runs_stored_and_those_that_resume_from_their_checkpoint(tmp_path):
    watch = progress.Watch(crafted(tmp_path))
    (tmp_path / "locks" / "b.lock").unlink()  # its worker was killed
    assert watch.kept("04_sentiment") == ("04_sentiment: 1 of 3 runs are in the results store and kept; the run "
                                          "that was training resumes from its checkpoint: md p=1.1 seed 1 (4/10 "
                                          "epochs)")
    _checkpoint(tmp_path / "ck" / "c" / "checkpoint.pt", HISTORY[:1])
    assert watch.kept("04_sentiment").endswith("the 2 runs that were training resume from their checkpoints: md "
                                               "p=1.1 seed 1 (4/10 epochs), md p=3 seed 0 (1/10 epochs)")
    assert progress.Watch(tmp_path / "none").kept("01") is None


def test_a_chapter_without_runs_gets_the_plans_time_and_stale_folders_go(tmp_path):
    from mdlib.book import plan

    snap = progress.Watch(tmp_path / "none").snapshot("01_fixed_decoder_paths", 30.0,
                                                      plan_time=plan.PlannedTime(77.0, whole=True))
    assert progress.lines(snap) == ["01_fixed_decoder_paths: 0:30 elapsed, ~47 s left (plan)"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "p" / f"{lockfile.host()}-{dead.stdout.strip()}-abc"
    stale.mkdir(parents=True)
    with progress.watching(tmp_path / "p" / f"{lockfile.host()}-{os.getpid()}-def") as folder:
        assert folder.is_dir() and not stale.exists()
    assert not folder.exists()


def test_the_plans_other_work_follows_the_runs_and_counts_down_once_they_are_done(tmp_path):
    """A training chapter's forward passes and other cells (``planned_time``, not ``whole``) come after its
    runs: added to their estimate while runs are left, then counted down from the moment none is, whether
    or not the plan's runs of it could be read. A chapter the plan prices whole (09: a CPU chapter that
    trains runs) gets its runs' estimate alone: adding the whole chapter's time said 9 min at 1:00 where
    3.6 remained (2026-12-07). What the plan's time covers is the plan's to say, not the monitor's guess."""
    from mdlib.book import plan

    folder = crafted(tmp_path)
    planned = {"a": progress._Planned("e4-sentiment", str(tmp_path / "runs" / "a"), 10, 0.995, "g1", 1e9, 10.0)}
    besides, whole = plan.PlannedTime(30.0, whole=False), plan.PlannedTime(300.0, whole=True)
    for watch in (progress.Watch(folder, planned), progress.Watch(folder)):  # the plan's runs read, or not
        watch.poll()
        assert watch.snapshot("07_vision", 125.0, plan_time=besides).left == (80.0, False, "estimate")  # 50 + 30
        for run in watch.runs.values():
            run.state = "done"
        assert watch.snapshot("07_vision", 130.0, plan_time=besides).left == (30.0, False, "plan")
        assert watch.snapshot("07_vision", 140.0, plan_time=besides).left == (20.0, False, "plan")
        assert watch.snapshot("07_vision", 170.0, plan_time=besides).left is None  # past the plan: only the clock

    for watch in (progress.Watch(folder), progress.Watch(folder, planned)):
        watch.poll()
        assert watch.snapshot("09_step_sizes", 125.0, plan_time=whole).left == (50.0, False, "estimate")
        for run in watch.runs.values():
            run.state = "done"
        assert watch.snapshot("09_step_sizes", 130.0, plan_time=whole).left is None


def test_a_runs_epochs_come_from_its_setting_then_its_configs_known_runs_then_its_kind():
    """Before a run of its own setting finishes, a run is expected to take the epochs the stored or
    committed runs of its config took (``known_epochs``), not those of another setting trained now."""
    def run(key, group, state="waiting", epochs=None, known=None):
        return progress.Run(key, "e4-sentiment", group=group, cap=100, stop=0.995, state=state, epochs=epochs,
                            known_epochs=known)

    other, target = run("o", "replication", "done", epochs=30), run("t", "variation", known=58.0)
    assert progress._expected_epochs(target, [other, target]) == (58.0, False)
    same = run("s", "variation", "done", epochs=40)
    assert progress._expected_epochs(target, [other, same, target]) == (40.0, False)  # measured here wins
    target.known_epochs = None
    assert progress._expected_epochs(target, [other, target]) == (30.0, False)
    assert progress._expected_epochs(target, [target]) == (100.0, True)  # nothing known: at most its cap


def test_the_known_epochs_cover_every_step_a_chosen_run_may_take():
    from mdlib.book import epochs, plan, profiles

    values = profiles.executed_parameters("04_sentiment", "default")
    _, known = progress.planned_runs("04_sentiment", values)
    runs = plan.chapter_runs("04_sentiment", values).values()
    index = epochs.Index(epochs.known_runs())
    alternatives = {identity.config_key(run.kind, c): (run.kind, c) for run in runs for c in run.alternatives}
    assert known and set(known) <= set(alternatives)
    for key, epochs_known in known.items():
        kind, config = alternatives[key]
        assert epochs.expect(kind, config, index).epochs == epochs_known


def test_the_plan_gives_the_chapters_runs_and_time_besides_them(tmp_path, monkeypatch):
    from mdlib.book import plan, profiles, steptimes

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no timings here: no speed probe read with them

    values = profiles.executed_parameters("04_sentiment", "smoke")
    planned, _ = progress.planned_runs("04_sentiment", values)
    stages = [stage for stage in plan.plan("smoke") if stage.notebook == "04_sentiment"]
    assert len(planned) == sum(stage.runs for stage in stages) > 0
    run = next(iter(planned.values()))
    assert run.kind == "e4-sentiment" and run.cap == values["epochs"] and run.stop == 0.995 and run.flops_per_epoch > 0
    assert Path(run.entry).parent == paths.runs_dir() / "e4-sentiment"
    walls = {wall.notebook: wall for wall in plan.plan("smoke", cores=steptimes.cores()).walls}  # by FLOPs: nothing timed
    for name in ("04_sentiment", "05_token_selection", "07_vision"):  # besides the runs: forward passes, other cells
        expected = walls[name].forward + walls[name].rest
        assert expected > 0
        found = plan.planned_time(name, profiles.executed_parameters(name, "smoke"))
        assert found.seconds == pytest.approx(expected) and not found.whole
    measured = plan.chapters.chapter("01_fixed_decoder_paths").work.measured.seconds
    default = profiles.executed_parameters("01_fixed_decoder_paths", "default")
    found = plan.planned_time("01_fixed_decoder_paths", default)
    assert found.seconds == pytest.approx(measured) and found.whole
    reference = plan.chapters.chapter("01_fixed_decoder_paths").work.measured.probe
    timings = steptimes.Timings("cpu", "cached")
    timings._write({steptimes.PROBE_KEY: {"seconds": 2 * reference, "when": "now"}})  # a machine half as fast
    assert plan.planned_time("01_fixed_decoder_paths", default).seconds == pytest.approx(2 * measured)
    assert plan.chapter_runs("01_fixed_decoder_paths", default) is None


# ---------------------------------------------------------------------------------------------
# the thread


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [False, True])
def test_the_monitor_redraws_a_terminal_and_writes_a_line_every_interval_to_a_log(tmp_path, tty):
    stream = _Terminal() if tty else io.StringIO()
    monitor = progress.Monitor("04_sentiment", crafted(tmp_path), stream=stream, mode="auto", every=0.4, poll=0.1)
    start = time.monotonic()
    monitor.start()
    time.sleep(1.5)
    monitor.stop()
    elapsed = time.monotonic() - start
    text = stream.getvalue()
    if tty:
        assert "\r\x1b[K04_sentiment: runs 1/3 so far" in text and "\n\x1b[K  training e4-sentiment" in text
        assert "\x1b[1A\r\x1b[K04_sentiment" in text  # redrawn over its two lines
        assert text.endswith("\x1b[1A\r\x1b[J")  # and taken off the terminal at the end
    else:
        lines = text.splitlines()
        assert 2 <= len(lines) <= elapsed / 0.4 and all(line.startswith("[04_sentiment] runs 1/3") for line in lines)
        assert "\r" not in text and "\x1b" not in text


def test_papermills_cell_counter_goes_into_the_monitor():
    from tqdm.auto import tqdm

    monitor = progress.Monitor("x", Path("none"), stream=io.StringIO(), mode="auto", every=60)
    bar = tqdm(total=7, **monitor.papermill_bar())
    bar.update(3)
    assert monitor.cells.value == (3, 7)
    bar.close()
    assert progress.Monitor("x", Path("none"), mode="off", every=60).papermill_bar() is False


def test_the_settings_are_checked(monkeypatch):
    monkeypatch.setenv(progress.MODE_ENV, "loud")
    with pytest.raises(ValueError, match="auto .* lines or off"):
        progress.chosen_mode()
    monkeypatch.setenv(progress.EVERY_ENV, "-1")
    with pytest.raises(ValueError, match="number > 0"):
        progress.log_every()


# ---------------------------------------------------------------------------------------------
# mdlib run of a tiny training notebook (slow: starts a kernel)

NOTEBOOK = '''# %% tags=["parameters"]
profile = "default"  # profile
runs = 3  # runs
epochs = 6  # epochs a run
pause = 0.25  # seconds an epoch

# %%
import dataclasses
import time

import torch
from torch.utils.data import Dataset

from mdlib.experiments import train
from mdlib.runs import identity, pool, store


@dataclasses.dataclass(frozen=True)
class Toy(identity.Config):
    lr: float
    fit: train.FitOptions


class Slow(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
        self.y = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(1)).float()  # never all right

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(pause / len(self.x))
        return self.x[i], self.y[i]


def build(config):
    torch.manual_seed(config.fit.seed)
    model = torch.nn.Linear(4, 1)
    return train.Setup(model, torch.optim.SGD(model.parameters(), lr=config.lr), Slow(16))


configs = [Toy(0.1, train.FitOptions(epochs=epochs, batch_size=8, seed=seed, stop_train_accuracy=1.0))
           for seed in range(runs)]
print(len(pool.run_many("toy-progress", configs, build)), "runs")
'''


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "params").mkdir()
    (root / "_config.yml").write_text("title: progress\n")
    (root / "params" / "default.yaml").write_text("{}\n")
    (root / "notebooks" / "01_train.py").write_text(NOTEBOOK)
    return root


def _env(root: Path, every: float) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MDLIB_")}
    return {**env, "PYTHONPATH": str(paths.PACKAGE_DIR.parent), "MDLIB_BUILD_DIR": str(root / "_build"),
            progress.EVERY_ENV: str(every)}


def _mdlib_run_in_a_terminal(root: Path) -> tuple[int, int]:
    """``python -m mdlib run 01_train`` with a pseudo-terminal as its controlling terminal (so Ctrl-C
    there interrupts it): (its pid, the terminal's master end)."""
    import pty

    pid, master = pty.fork()
    if pid == 0:  # the child: Ctrl-C as a terminal's foreground job gets it, even where the tests run as a
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # background job of a script, which ignores SIGINT
        os.execve(sys.executable, [sys.executable, "-m", "mdlib", "--root", str(root), "run", "01_train"],
                  _env(root, 0.3))
    return pid, master


def _read_pty(master: int, until=None, timeout: float = 240) -> bytes:
    """What the terminal shows until every process holding it is gone (or ``until(output)``)."""
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        out += data
        if until is not None and until(out):
            break
    return out


def _exit_code(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _no_progress_in(notebook: Path) -> None:
    text = notebook.read_text()
    assert "3 runs" in text  # the cell's own output is there
    for trace in ("elapsed", "left (", "train acc", "\\u001b", "\\r"):
        assert trace not in text, trace


@pytest.mark.slow
def test_mdlib_run_redraws_its_progress_on_a_terminal(tmp_path):
    root = _project(tmp_path)
    pid, master = _mdlib_run_in_a_terminal(root)
    shown = _read_pty(master).decode()
    os.close(master)
    assert _exit_code(pid) == 0, shown
    screens = re.split(r"\r\x1b\[K|\x1b\[1A", shown)
    assert any(re.search(r"01_train: cell 3/3, runs [12]/3 so far, 0:\d\d elapsed, ~\d+ s left \(estimate\)", s)
               for s in screens), shown
    assert re.search(r"\n\x1b\[K  training toy-progress seed \d: [1-5]/6 epochs, train acc 0\.\d{3} \(stop 1\)", shown)
    assert "\r\x1b[J  01_train: " in shown  # the progress is taken off before the closing line
    _no_progress_in(root / "notebooks" / "01_train.ipynb")


@pytest.mark.slow
def test_mdlib_run_writes_a_line_every_interval_into_a_log(tmp_path):
    root = _project(tmp_path)
    every = 1.0
    proc = subprocess.Popen([sys.executable, "-m", "mdlib", "--root", str(root), "run", "01_train"],
                            stderr=subprocess.PIPE, text=True, env=_env(root, every))
    arrivals = []
    for line in proc.stderr:
        arrivals.append((time.monotonic(), line.rstrip("\n")))
    assert proc.wait(timeout=240) == 0
    progress_lines = [(t, line) for t, line in arrivals if line.startswith("[01_train] ")]
    assert len(progress_lines) >= 3, arrivals
    assert all(b - a >= every * 0.8 for (a, _), (b, _) in zip(progress_lines, progress_lines[1:])), arrivals
    assert any(re.search(r"runs [0-2]/3 so far, .*; training toy-progress seed \d: \d/6 epochs", line)
               for _, line in progress_lines), arrivals
    assert all("\r" not in line and "\x1b" not in line for _, line in arrivals)
    _no_progress_in(root / "notebooks" / "01_train.ipynb")
    assert not any((root / "_build" / ".progress").iterdir())  # its status files are gone


@pytest.mark.slow
def test_ctrl_c_names_the_runs_kept_and_the_command_that_resumes(tmp_path):
    root = _project(tmp_path)
    (root / "params" / "default.yaml").write_text("01_train: {epochs: 40}\n")
    pid, master = _mdlib_run_in_a_terminal(root)
    shown = _read_pty(master, until=lambda out: re.search(rb"seed 1: ([2-9]|[1-3][0-9])/40 epochs", out))
    os.write(master, b"\x03")  # Ctrl-C on the terminal: SIGINT to mdlib run (its kernel has a session of its own)
    shown = (shown + _read_pty(master)).decode()
    os.close(master)
    assert _exit_code(pid) == 130, shown
    end = shown[shown.rindex("\x1b[J"):]
    assert re.search(r"01_train: 1 of 3 runs are in the results store and kept; the run that was training "
                     r"resumes from its checkpoint: seed 1 \(\d+/40 epochs\)", end), end
    assert "interrupted: the previous executed notebook" in end
    assert f"to resume: python -m mdlib --root {root} run 01_train" in end
    assert list((root / "_build" / "checkpoints" / "toy-progress").glob("*/checkpoint.pt"))
