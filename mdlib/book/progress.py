"""Live progress of a notebook's execution, on the terminal of the command that executes it
(``python -m mdlib run``, ``mdlib book``), never in the notebook.

The notebook runs in a Jupyter kernel, whose output lands in the executed notebook. So the kernel says
nothing: :func:`watching` gives it a folder (``$MDLIB_PROGRESS_DIR``, inherited by the kernel and its
workers), its ``pool.run_many`` calls write their status files there (``mdlib.runs.progress``),
and a thread of the executing command (:class:`Monitor`) reads them, the locks of the runs being
trained and those runs' checkpoints (their epochs and training accuracy so far; at most every
``poll`` seconds, each checkpoint only when it changed, without its tensors), and shows:

    <chapter>: cell 12/31, runs 7/23, 6:02 elapsed, ~21 min left (estimate)
      training e4-sentiment md p=1.1 lr=0.0008 seed 1: 14/100 epochs, train acc 0.962 (stop 0.995) | ...

On a terminal those lines are redrawn in place; in a log (not a terminal) one line is written every
``every`` seconds (default 60, ``$MDLIB_PROGRESS_EVERY``) while the chapter executes. ``$MDLIB_PROGRESS``:
``auto`` (the default), ``lines`` (a line at a time even on a terminal: ``mdlib book`` gives it to the
chapters it executes side by side) or ``off``.

The runs' total is the chapter's as ``mdlib.book.plan`` counts them at its parameters (more when its
grids grow), else the runs its ``run_many`` calls asked for so far ("so far"). The plan counts a run
whose step a sweep chooses at one candidate: it stands for the run of its cell and seed (its slot,
``mdlib.runs.progress.slot_of``) until one of that slot is asked for, then goes (so a tied candidate
that is never trained, counted "at most", goes too). A run stopped by an error its caller skips is
counted apart: "diverged" for the optimizer's FloatingPointError (a non-finite step), else "failed".

The time left is the training runs' estimate and then the plan's time of the chapter's other work. The
estimate: each run waiting or training needs its expected epochs (a run with a stop rule: the mean
epochs of the finished runs of its setting, else of its kind, else its cap, when the estimate says
"at most"; without one, its cap) at its measured seconds per epoch (its own epochs so far, else those
of the finished and training runs of its kind, scaled by each run's FLOPs per epoch where
``mdlib.experiments.workload`` counts them), laid out over as many runs at once as are training. The
other work (forward passes, analyses, figures: ``mdlib.book.plan.planned_time``) is added to it and
counts down once no run is left (in a chapter that trains no runs, from its start). A chapter the plan
prices whole (a CPU chapter's measured time, runs included) counts down its plan where no run is seen,
else its runs' estimate alone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, TextIO

from mdlib import positive_env
from mdlib.experiments import paths
from mdlib.runs import lockfile, progress as status_files

if TYPE_CHECKING:  # the plan imports the chapters' code: read only when the monitor asks it
    from mdlib.book.plan import PlannedTime

__all__ = ["EVERY_ENV", "MODE_ENV", "Monitor", "Run", "Snapshot", "Watch", "chosen_mode", "estimate", "lines", "log_every", "log_line",
           "planned_runs", "watching"]

MODE_ENV = "MDLIB_PROGRESS"  #: auto | lines | off
EVERY_ENV = "MDLIB_PROGRESS_EVERY"  #: seconds between two lines in a log
EVERY_SECONDS = 60.0
POLL_SECONDS = 10.0  #: the status files, locks and checkpoints are read at most this often


@dataclass
class Run:
    """What the monitor knows of one training run of the chapter."""

    key: str
    kind: str
    label: str = ""
    group: str = ""
    slot: str = ""  #: ``mdlib.runs.progress.slot_of``; a planned run's only when its step follows a choice
    cap: int | None = None
    stop: float | None = None
    state: str = "planned"  #: planned (not asked for yet) | waiting | stored | done (trained now) | failed
    checkpoint: str | None = None
    lock: str | None = None
    entry: str | None = None
    flops_per_epoch: float | None = None
    expected_epochs: float | None = None
    known_epochs: float | None = None  #: the epochs its config took in the stored or committed runs (the plan's)
    epochs: int | None = None  #: a finished run's epochs
    seconds: float | None = None  #: and their seconds
    error: str | None = None  #: a failed run's error type (FloatingPointError: it diverged)
    running: bool = False  #: its lock is held: it trains now
    history: list[dict] = field(default_factory=list)  #: a training run's epochs so far (its checkpoint)

    @property
    def finished(self) -> bool:
        return self.state in ("stored", "done")

    def epoch_seconds(self) -> float | None:
        """Its measured seconds per epoch: of its finished epochs (trained now) or of its history so far."""
        if self.state == "done" and self.epochs and self.seconds:
            return self.seconds / self.epochs
        times = [row.get("seconds") for row in self.history if isinstance(row.get("seconds"), (int, float))]
        return sum(times) / len(times) if times else None

    def accuracy(self) -> float | None:
        value = self.history[-1].get("train_accuracy") if self.history else None
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


@dataclass
class Snapshot:
    """What the monitor shows at one moment."""

    notebook: str
    elapsed: float
    runs: list[Run]
    complete: bool  #: the runs' total is the chapter's (the plan's), not only those asked for so far
    cells: tuple[int, int] | None = None
    left: tuple[float, bool, str] | None = None  #: (seconds, an upper bound, what it comes from)

    @property
    def training(self) -> list[Run]:
        return [run for run in self.runs if run.running]


# ---------------------------------------------------------------------------------------------
# the time left


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per_epoch(run: Run, runs: list[Run]) -> float | None:
    """``run``'s seconds per epoch: its own measurement, else its kind's, scaled by FLOPs per epoch."""
    own = run.epoch_seconds()
    if own is not None:
        return own
    measured = [(m, m.epoch_seconds()) for m in runs if m.kind == run.kind and m.epoch_seconds() is not None]
    if not measured:
        return None
    scaled = [seconds / m.flops_per_epoch for m, seconds in measured if m.flops_per_epoch]
    if scaled and run.flops_per_epoch:
        return statistics.median(scaled) * run.flops_per_epoch
    return statistics.median(seconds for _, seconds in measured)


def _expected_epochs(run: Run, runs: list[Run]) -> tuple[float | None, bool]:
    """(``run``'s expected epochs in all, whether they are only its cap, which a stop rule may undercut)."""
    cap = float(run.cap) if run.cap else None
    done = len(run.history)
    if run.stop is None:
        return (cap or run.expected_epochs), False
    if run.history and (run.accuracy() or 0.0) >= run.stop:
        return float(done), False  # it reached its stop rule: finishing
    finished = [m for m in runs if m.state == "done" and m.epochs and m.kind == run.kind and m.stop is not None]
    alike = [m.epochs for m in finished if m.group == run.group]
    if alike:  # its setting's, trained now
        epochs, bound = _mean(alike), False
    elif run.known_epochs is not None:  # its config's, stored or committed
        epochs, bound = run.known_epochs, False
    elif finished:  # its kind's, trained now
        epochs, bound = _mean([m.epochs for m in finished]), False
    else:  # the work model's expectation (the authors' measured mean where it has one), else the cap
        epochs = run.expected_epochs or cap
        bound = run.expected_epochs is None or (cap is not None and run.expected_epochs >= cap)
    if epochs is None:
        return None, bound
    epochs = min(epochs, cap) if cap else epochs
    if done >= epochs:  # longer than the runs like it: one more epoch at least
        epochs = min(done + 1.0, cap) if cap else done + 1.0
    return epochs, bound


def estimate(runs: list[Run], slots: int) -> tuple[float, bool] | None:
    """(seconds until the runs waiting and training are trained, whether it is an upper bound): each
    one's remaining epochs at its seconds per epoch, the training ones first, laid out over ``slots``
    runs at once; None while a run's seconds per epoch cannot be told yet (no epoch finished)."""
    pending = [run for run in runs if run.state in ("waiting", "planned")]
    if not pending:
        return 0.0, False
    loads, later, bound = [], [], False
    for run in pending:
        per_epoch = _per_epoch(run, runs)
        epochs, capped = _expected_epochs(run, runs)
        if per_epoch is None or epochs is None:
            return None
        bound |= capped
        left = max(0.0, epochs - len(run.history)) * per_epoch
        (loads if run.running else later).append(left)
    loads = sorted(loads) + [0.0] * max(0, slots - len(loads))
    for left in later:  # each next run goes to the first slot free
        loads[loads.index(min(loads))] += left
    return max(loads), bound


# ---------------------------------------------------------------------------------------------
# the text


def clock(seconds: float) -> str:
    """``seconds`` as m:ss or h:mm:ss."""
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def span(seconds: float) -> str:
    """A duration, rounded for an estimate: 40 s, 25 min, 3 h 10 min."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _summary(snap: Snapshot) -> str:
    parts = [f"cell {min(snap.cells[0] + 1, snap.cells[1])}/{snap.cells[1]}"] if snap.cells else []  # the one running
    if snap.runs:
        done = sum(run.finished for run in snap.runs)
        failed = [run for run in snap.runs if run.state == "failed"]
        diverged = sum(run.error == "FloatingPointError" for run in failed)  # the optimizer's non-finite step
        stopped = [f"{diverged} diverged"] * bool(diverged) + [f"{len(failed) - diverged} failed"] * (len(failed) > diverged)
        total = f"{done}/{len(snap.runs)}" + ("" if snap.complete else " so far")
        parts.append(f"runs {total}" + (f" ({', '.join(stopped)})" if stopped else ""))
    parts.append(f"{clock(snap.elapsed)} elapsed")
    if snap.left is not None:
        seconds, bound, source = snap.left
        parts.append(f"{'at most ' if bound else '~'}{span(seconds)} left ({source})")
    elif any(run.state in ("waiting", "planned") for run in snap.runs):
        parts.append("time left: after the first epoch")
    return ", ".join(parts)


def _training(run: Run, first: bool) -> str:
    epochs = f"{len(run.history)}/{run.cap} epochs" if run.cap else f"{len(run.history)} epochs"
    accuracy = run.accuracy()
    text = f"{run.label}: {epochs}"
    if accuracy is not None:
        text += f", train acc {accuracy:.3f}" if first else f", {accuracy:.3f}"
        if run.stop is not None:
            text += f" (stop {run.stop:g})" if first else f"/{run.stop:g}"
    return text


def _now_training(snap: Snapshot) -> str | None:
    training = snap.training
    if not training:
        return None
    kinds = list(dict.fromkeys(run.kind for run in training))
    return f"training {', '.join(kinds)} " + " | ".join(_training(run, i == 0) for i, run in enumerate(training))


def lines(snap: Snapshot, width: int = 120) -> list[str]:
    """The one or two lines a terminal shows (each cut to ``width`` characters)."""
    out = [f"{snap.notebook}: {_summary(snap)}"]
    if (now := _now_training(snap)) is not None:
        out.append(f"  {now}")
    return [line if len(line) < width else line[:max(width - 4, 1)] + "..." for line in out]


def log_line(snap: Snapshot) -> str:
    """The line a log gets."""
    now = _now_training(snap)
    return f"[{snap.notebook}] {_summary(snap)}" + (f"; {now}" if now else "")


# ---------------------------------------------------------------------------------------------
# reading what the kernel writes


@dataclass
class _Planned:
    kind: str
    entry: str
    cap: int | None
    stop: float | None
    group: str
    flops_per_epoch: float | None
    expected_epochs: float | None
    slot: str = ""  #: where its step follows a choice: the slot of the run it stands for


class Watch:
    """The chapter's runs as the status files in ``folder``, the runs' locks, store entries and
    checkpoints, and ``planned`` (the plan's runs, by key) show them."""

    def __init__(self, folder: Path, planned: Mapping[str, _Planned] | None = None):
        self.folder = Path(folder)
        self.planned = dict(planned or {})
        self.runs: dict[str, Run] = {}
        self._runs_done: float | None = None  #: the elapsed seconds when no run was left to train
        self.known: dict[str, float] = {}  #: the plan's known epochs by store key (``plan.known_epochs_of``)
        self._read: dict[str, float] = {}  # checkpoint -> modification time read
        self.slots = 1

    def _calls(self) -> list[dict[str, Any]]:
        calls = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            if path.name.startswith("."):
                continue
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_text("utf-8"))
                if isinstance(record, dict) and isinstance(record.get("runs"), list):
                    calls.append(record)
        return sorted(calls, key=lambda record: record.get("started") or 0)

    def poll(self) -> None:
        """Read the status files, locks, entries and changed checkpoints again."""
        slots = 1
        for call in self._calls():
            live = call.get("finished") or call.get("host") != lockfile.host() or lockfile.alive(int(call.get("pid", 0)))
            waiting = 0
            for row in call["runs"]:
                run = self.runs.setdefault(row["key"], Run(row["key"], call.get("kind", "")))
                for name in ("label", "group", "slot", "cap", "stop", "checkpoint", "lock", "entry", "flops_per_epoch",
                             "expected_epochs"):
                    if row.get(name) is not None:
                        setattr(run, name, row[name])
                state = row.get("state", "waiting")
                if not (run.state == "done" and state == "stored"):
                    run.state, run.error = state, row.get("error")
                if row.get("epochs") is not None:
                    run.epochs, run.seconds = row["epochs"], row.get("seconds")
                waiting += state == "waiting"
            if waiting and live and not call.get("finished"):
                slots = max(slots, min(int(call.get("workers") or 1), waiting))
        for key, plan in self.planned.items():
            if key not in self.runs:
                self.runs[key] = Run(key, plan.kind, group=plan.group, slot=plan.slot, cap=plan.cap, stop=plan.stop,
                                     entry=plan.entry, flops_per_epoch=plan.flops_per_epoch,
                                     expected_epochs=plan.expected_epochs)
        asked = {run.slot for run in self.runs.values() if run.state != "planned" and run.slot}
        for key in [key for key, run in self.runs.items() if run.state == "planned" and run.slot in asked]:
            del self.runs[key]  # it stood for a run whose step follows a choice: that run is asked for now
        for run in self.runs.values():
            self._update(run)
        # the most runs trained at once so far: between two pools no call is live, and the next pool
        # trains on as many workers
        self.slots = max(self.slots, slots, sum(run.running for run in self.runs.values()))

    def _update(self, run: Run) -> None:
        run.known_epochs = self.known.get(run.key, run.known_epochs)
        if run.state in ("waiting", "planned") and run.entry and os.path.isdir(run.entry):
            run.state = "stored"  # stored by another process, or before its call said so
        run.running = run.state == "waiting" and bool(run.lock) and lockfile.is_held(Path(run.lock))
        if run.state != "waiting" or not run.checkpoint:
            return
        try:
            changed = os.stat(run.checkpoint).st_mtime
        except OSError:
            return
        if self._read.get(run.checkpoint) != changed:
            found = status_files.read_checkpoint(run.checkpoint)
            if found is not None:
                run.history = found["history"]
                self._read[run.checkpoint] = changed

    def snapshot(self, notebook: str, elapsed: float, cells: tuple[int, int] | None = None,
                 plan_time: PlannedTime | None = None) -> Snapshot:
        """What to show ``elapsed`` seconds into the chapter; ``plan_time``: the plan's time of it
        (``plan.planned_time``). Its cells besides the pools of runs come after the runs' estimate and,
        once the runs are done, count down from then. A chapter's whole time (``whole``: 09, priced from
        its measured time, trains runs) counts down where no run is seen; where runs are, their estimate
        stands alone."""
        runs = list(self.runs.values())
        left = None
        if runs and plan_time is not None and plan_time.whole:
            plan_time = None  # the runs' estimate is the chapter's
        after = plan_time.seconds if plan_time is not None else 0.0
        if any(run.state in ("waiting", "planned") for run in runs):
            self._runs_done = None
            found = estimate(runs, self.slots)
            if found is not None:
                left = (found[0] + after, found[1], "estimate" if not found[1] else "estimate at the epoch caps")
        elif plan_time is not None:
            if self._runs_done is None:
                self._runs_done = elapsed if runs else 0.0
            if after > elapsed - self._runs_done:
                left = (after - (elapsed - self._runs_done), False, "plan")
        return Snapshot(notebook, elapsed, runs, bool(self.planned), cells, left)

    def kept(self, notebook: str) -> str | None:
        """What an interrupted chapter keeps of its runs, or None when it trained none: the runs stored,
        and the runs that were training with the epochs their checkpoints hold (the files read again)."""
        self.poll()
        if not any(run.state != "planned" for run in self.runs.values()):
            return None
        stored = sum(run.finished for run in self.runs.values())
        text = f"{notebook}: {stored} of {len(self.runs)} runs are in the results store and kept"
        resumable = []
        for run in self.runs.values():
            found = status_files.read_checkpoint(run.checkpoint) if run.state == "waiting" and run.checkpoint else None
            if found is not None and found["history"]:
                epochs = len(found["history"])
                resumable.append(f"{run.label} ({epochs}/{run.cap} epochs)" if run.cap else f"{run.label} ({epochs} epochs)")
        if len(resumable) == 1:
            text += f"; the run that was training resumes from its checkpoint: {resumable[0]}"
        elif resumable:
            text += (f"; the {len(resumable)} runs that were training resume from their checkpoints: "
                     + ", ".join(resumable))
        return text


def planned_runs(notebook: str, values: Mapping[str, Any]) -> tuple[dict[str, _Planned], dict[str, float]]:
    """The plan's runs of ``notebook`` at its parameter ``values`` (``mdlib.book.plan.chapter_runs``),
    with what the estimate needs of each ({} for a chapter the plan lists no runs of), and the epochs the
    stored or committed runs tell of each config they may train, by store key (``plan.known_epochs_of``)."""
    from mdlib.book import plan

    found = plan.chapter_runs(notebook, values) or {}
    out = {}
    for key, run in found.items():
        flops, expected = status_files.work_of(run.kind, run.config)
        plain = run.config.to_dict() if hasattr(run.config, "to_dict") else dict(run.config)
        fit = plain.get("fit") or {}
        out[key] = _Planned(run.kind, str(paths.runs_dir() / run.kind / key), fit.get("epochs"),
                            fit.get("stop_train_accuracy"), status_files.group_of(plain), flops, expected,
                            status_files.slot_of(plain) if run.chosen else "")
    return out, plan.known_epochs_of(found.values())


# ---------------------------------------------------------------------------------------------
# the thread that shows it


class _Cells:
    """A file for papermill's progress bar (tqdm, ``bar_format="{n}/{total}"``): keeps the cells done."""

    def __init__(self):
        self.value: tuple[int, int] | None = None

    def write(self, text: str) -> int:
        if found := re.findall(r"(\d+)/(\d+)", text):
            done, total = found[-1]
            self.value = (int(done), int(total))
        return len(text)

    def flush(self) -> None:
        pass


def chosen_mode() -> str:
    """``$MDLIB_PROGRESS``: auto (the default), lines or off; a ValueError naming them otherwise."""
    mode = os.environ.get(MODE_ENV, "").strip().lower() or "auto"
    if mode not in ("auto", "lines", "off"):
        raise ValueError(f"${MODE_ENV} is {mode!r}: give auto (redraw on a terminal, else a line a minute), "
                         "lines or off")
    return mode


def log_every() -> float:
    """``$MDLIB_PROGRESS_EVERY``: the seconds between two lines in a log (default 60)."""
    return positive_env(EVERY_ENV, EVERY_SECONDS, "the seconds between two progress lines in a log")


class Monitor:
    """Shows the progress of notebook ``notebook`` (:class:`Watch` of ``folder``) on ``stream`` from a
    thread, from ``start()`` to ``stop()``: on a terminal (``tty``; default ``stream.isatty()``, unless
    ``mode`` is ``lines``) one or two lines redrawn every second; else a line every ``every`` seconds.
    The files are read at most every ``poll`` seconds (the smaller of 10 and ``every``). ``planned``:
    called once, in the thread, for the plan's runs of the chapter and the epochs the stored or
    committed runs tell of them (:func:`planned_runs`; its errors only leave the total open);
    ``plan_time``: likewise, the plan's time of the chapter (``plan.planned_time``)."""

    def __init__(self, notebook: str, folder: Path, *, stream: TextIO | None = None, mode: str | None = None,
                 every: float | None = None, poll: float | None = None,
                 planned: Callable[[], tuple[Mapping[str, _Planned], Mapping[str, float]]] | None = None,
                 plan_time: Callable[[], PlannedTime] | None = None):
        self.notebook, self.stream = notebook, stream or sys.stderr
        self.mode = mode or chosen_mode()
        self.every = every if every is not None else log_every()
        self.poll = poll if poll is not None else min(POLL_SECONDS, self.every)
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.tty = tty and self.mode == "auto"
        self.watch = Watch(folder)
        self.cells = _Cells()
        self._planned, self._plan_time, self._time = planned, plan_time, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = 0
        self._start = time.monotonic()

    def papermill_bar(self) -> dict[str, Any] | bool:
        """papermill's ``progress_bar``: its cell counter, into this monitor (nothing on the terminal)."""
        if self.mode == "off":
            return False
        return {"file": self.cells, "bar_format": "{n}/{total}", "disable": False, "mininterval": 0,
                "dynamic_ncols": False, "ncols": 40, "ascii": True}

    def snapshot(self) -> Snapshot:
        return self.watch.snapshot(self.notebook, time.monotonic() - self._start, self.cells.value, self._time)

    def start(self) -> "Monitor":
        if self.mode != "off":
            self._thread = threading.Thread(target=self._loop, name=f"mdlib-progress-{self.notebook}", daemon=True)
            self._thread.start()
        return self

    def _plan(self) -> None:
        with contextlib.suppress(Exception):  # the plan only completes the total and the estimate
            if self._planned is not None:
                planned, known = self._planned()
                self.watch.planned, self.watch.known = dict(planned), dict(known)
        with contextlib.suppress(Exception):
            if self._plan_time is not None:
                self._time = self._plan_time()

    def _loop(self) -> None:
        tick = min(1.0, self.every / 2, self.poll)
        polled = written = -math.inf
        planned = False
        while not self._stop.wait(0 if polled == -math.inf else tick):
            now = time.monotonic()
            try:
                if now - polled >= self.poll:
                    self.watch.poll()
                    polled = now
                if self.tty:
                    self._draw(lines(self.snapshot(), self._width()))
                elif now - self._start >= self.every and now - written >= self.every:
                    self._write(log_line(self.snapshot()) + "\n")
                    written = now
            except Exception:  # noqa: BLE001 - progress never stops an execution
                continue
            if not planned:  # after the first lines: the plan imports the chapter's code (seconds)
                self._plan()
                planned, polled = True, -math.inf

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
        return columns or shutil.get_terminal_size((120, 24)).columns or 120  # a terminal of unknown size: 120

    def _write(self, text: str) -> None:
        with contextlib.suppress(Exception):
            self.stream.write(text)
            self.stream.flush()

    def _draw(self, shown: list[str]) -> None:
        """Redraw the lines in place (the cursor stays at the end of the last)."""
        text = f"\x1b[{self._drawn - 1}A" if self._drawn > 1 else ""
        text += "\r" + "\n".join("\x1b[K" + line for line in shown)
        if (extra := self._drawn - len(shown)) > 0:
            text += "\n\x1b[K" * extra + f"\x1b[{extra}A"
        self._drawn = len(shown)
        self._write(text)

    def _clear(self) -> None:
        if self._drawn:
            self._write((f"\x1b[{self._drawn - 1}A" if self._drawn > 1 else "") + "\r\x1b[J")
            self._drawn = 0

    def stop(self) -> None:
        """Stop the thread and take the redrawn lines off the terminal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.tty:
            self._clear()

    def kept(self) -> str | None:
        """The line an interrupted execution prints about its runs (``Watch.kept``)."""
        try:
            return self.watch.kept(self.notebook)
        except Exception:  # noqa: BLE001
            return None


@contextlib.contextmanager
def watching(folder: Path) -> Iterator[Path]:
    """A fresh progress folder ``folder`` for one execution, removed afterwards, with those that killed
    executions on this host left beside it (their process is gone) removed first."""
    parent = folder.parent
    if parent.is_dir():
        for other in parent.iterdir():
            found = re.fullmatch(rf"{re.escape(lockfile.host())}-([0-9]+)-.*", other.name)
            if found and not lockfile.alive(int(found.group(1))):
                shutil.rmtree(other, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
