"""A lock file, safe on NFS, for one holder at a time: of a run being computed (the results store: two
processes asked for the same missing run, two notebooks or two jobs on a cluster sharing the build
folder, compute it once) and of a chapter being executed into a folder (``mdlib.book.execute``).

:func:`hold` creates the lock file with ``O_CREAT | O_EXCL`` (atomic on NFS), holding the holder's host,
pid and start time; the holder touches it every few seconds while it computes (its heartbeat). Another
process says once that it waits for ``host:pid``, polls, and goes on when the lock goes; or, asked not
to wait, raises :class:`LockHeld` naming the holder (the chapters: a second execution is refused). A lock is taken
over when its holder is no longer running on this host, when its heartbeat is older than
``$MDLIB_LOCK_TIMEOUT`` minutes (default 10; a holder on another host that died; a heartbeat in the
future, a clock ahead, ages from when the waiter first saw it), or when it holds no readable record
``UNREADABLE_LOCK_SECONDS`` after it appeared (a holder killed before writing it); the waiter says which
and for how long it waits. :func:`is_held` tells whether a live process holds a lock now.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from mdlib import positive_env

__all__ = ["LOCK_TIMEOUT_ENV", "LockHeld", "LockWarning", "UNREADABLE_LOCK_SECONDS", "alive", "hold", "host", "is_held",
           "lock_timeout", "watch_parent"]

LOCK_TIMEOUT_ENV = "MDLIB_LOCK_TIMEOUT"  #: minutes without a heartbeat after which a run's lock is taken over
LOCK_TIMEOUT_MINUTES = 10.0
#: A lock file without a readable record this many seconds old is stale: its writer creates it and
#: writes the record at once, so it was killed in between (or the file was emptied).
UNREADABLE_LOCK_SECONDS = 5.0

log = logging.getLogger(__name__)


def host() -> str:
    """This machine's name, as file names and lock records hold it (letters, digits, '_')."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40]


def watch_parent(parent: int, on_death: Callable[[], None]) -> None:
    """Call ``on_death`` from a daemon thread as soon as process ``parent`` is no longer this process's
    parent (it died, even by kill -9, and this process was reparented); checked twice a second."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        on_death()

    threading.Thread(target=watch, name="mdlib-parent-watchdog", daemon=True).start()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


class LockWarning(UserWarning):
    """A lock was taken over while its holder still ran: the run may be computed twice."""


class LockHeld(RuntimeError):
    """A live process holds the lock that ``hold(..., wait=False)`` asked for: ``path`` and the holder's
    ``record`` (``host``, ``pid``, ``started``)."""

    def __init__(self, path: Path, record: dict[str, Any]):
        super().__init__(f"the lock {path} is held by {record.get('host')}:{record.get('pid')} "
                         f"(since {record.get('started')})")
        self.path, self.record = path, record


def lock_timeout() -> float:
    """Seconds without a heartbeat after which a lock is stale: ``$MDLIB_LOCK_TIMEOUT`` minutes."""
    return 60 * positive_env(LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_MINUTES,
                             "the minutes without a heartbeat after which a run's lock is taken over")


def _holder(path: Path) -> tuple[dict[str, Any] | None, float] | None:
    """(what the lock file holds, or None while its holder is still writing it or when it cannot be read;
    its age in seconds, a modification time in the future counting as now), or None when there is no
    lock file."""
    try:
        age = max(0.0, time.time() - path.stat().st_mtime)
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    return (record if isinstance(record, dict) else None), age


def _pid_namespace() -> str:
    """This process's pid namespace on Linux (containers on one host may share its name, not their
    pids), else ""."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _stale(record: dict[str, Any] | None, age: float, timeout: float) -> bool:
    """Whether a lock is abandoned: it holds no readable record ``UNREADABLE_LOCK_SECONDS`` after it was
    written, its holder is not running on this host (same host name and pid namespace), or its heartbeat
    (the file's modification time) is older than ``timeout`` seconds."""
    if record is None:
        return age > min(UNREADABLE_LOCK_SECONDS, timeout)
    if (record.get("host"), record.get("pids")) == (host(), _pid_namespace()):
        if isinstance(record.get("pid"), int) and not alive(record["pid"]):
            return True
    return age > timeout


def _break(path: Path, token: str | None, timeout: float) -> None:
    """Remove the stale lock ``path`` if it still holds ``token`` (the holder judged stale). Between
    waiters that judged it stale at once only one breaks it: the one that creates ``<lock>.break``
    (O_EXCL) and finds the same holder there; the others find a new lock or none and wait on. The stale
    lock is first renamed to a name of this process's own, so no later lock is ever removed."""
    guard = path.with_name(path.name + ".break")
    try:
        os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):  # a breaker killed within its milliseconds
            if time.time() - guard.stat().st_mtime > timeout:
                guard.unlink()
        return
    try:
        now = _holder(path)
        if now is not None and (now[0] or {}).get("token") == token:
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}@{host()}-{uuid.uuid4().hex[:8]}")
            os.replace(path, aside)
            aside.unlink()
    finally:
        guard.unlink(missing_ok=True)


def _heartbeat(path: Path, token: str, every: float, stop: threading.Event) -> None:
    """Touch the lock file every ``every`` seconds until ``stop``; a warning if another process took it."""
    while not stop.wait(every):
        held = _holder(path)
        if held is None or (held[0] or {}).get("token") != token:
            warnings.warn(f"the lock {path} was taken over by another process (this one was thought dead); "
                          "the run may be computed twice", LockWarning, stacklevel=1)
            return
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock ``path`` now: it exists and is not stale."""
    held = _holder(path)
    return held is not None and not _stale(*held, lock_timeout())


@contextlib.contextmanager
def hold(path: Path, what: str, *, wait: bool = True) -> Iterator[None]:
    """Hold the lock file ``path`` for the block (see the module's docstring): wait while a live process
    holds it (``wait``; else raise ``LockHeld``), take it over when it is stale, and keep a heartbeat on
    it meanwhile. ``what`` names what the holder computes in the waiter's message (e.g. "run
    e4-sentiment/0123456789ab"). A lock without a readable record is waited for even when not
    ``wait``: its writer is writing it, or was killed and it turns stale within seconds."""
    timeout = lock_timeout()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = f"{host()}:{os.getpid()}:{uuid.uuid4().hex}"
    poll, waited = min(1.0, timeout / 8), False
    seen: dict[float, float] = {}  # the lock's modification times, when this process first saw each
    while True:
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            held = _holder(path)
        if held is None:
            continue
        record, age = held
        with contextlib.suppress(FileNotFoundError):  # unchanged this long: a clock ahead cannot hide it
            age = max(age, time.monotonic() - seen.setdefault(path.stat().st_mtime, time.monotonic()))
        if _stale(record, age, timeout):
            log.info("taking over the stale lock %s (%s)", path, record)
            _break(path, (record or {}).get("token"), timeout)
            continue
        if record is not None and not wait:
            raise LockHeld(path, record)
        if not waited:
            waited = True
            if record is None:
                message = (f"the lock {path} holds no readable record; waiting at most "
                           f"{min(UNREADABLE_LOCK_SECONDS, timeout):g} s for its writer, then taking it over")
            else:
                message = (f"{what} is being computed by {record.get('host')}:{record.get('pid')} "
                           f"(since {record.get('started')}); waiting for it, and taking it over if its "
                           f"heartbeat stops for {timeout / 60:g} minutes")
            log.info(message)
            print(message, file=sys.stderr, flush=True)
        time.sleep(poll)
    record = {"host": host(), "pid": os.getpid(), "pids": _pid_namespace(), "token": token,
              "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, token, min(30.0, timeout / 4), stop),
                            name=f"mdlib-lock-{path.stem[:12]}", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        held = _holder(path)
        if held is not None and (held[0] or {}).get("token") == token:
            path.unlink(missing_ok=True)
