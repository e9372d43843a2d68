"""The results store: a finished run is read back instead of recomputed.

    from mdlib.runs import store
    from mdlib.runs.identity import RunId
    run = RunId.of("e1-paths", config)
    result = store.load_or_run(run, lambda: train(config))
    result["divergence"]          # numpy array / DataFrame / JSON value, as compute() returned it
    result.cached, result.path    # whether it came from the store, and where it lives

A run is named by its ``RunId`` (``mdlib.runs.identity``: its kind, its config and the code that
computes it, and their key), made once by the caller and given to every function here; it is filed
under ``<build>/runs/<kind>/<key>/``, written atomically and checked when read back
(``mdlib.runs.files``); an entry that does not read back is ignored, recomputed and replaced.
:func:`exists` asks whether an entry is there without reading it, :func:`load` reads and checks it,
:func:`stored` reads a run that must be there.
The entries of other code fingerprints stay on disk unused until :func:`prune` (``python -m mdlib store
--prune``) removes them.

Two processes asked for the same missing run compute it once: ``load_or_run`` holds the run's lock,
``<build>/runs/.locks/<kind>/<key>.lock`` (``mdlib.runs.lockfile``), while it computes; the other
waits and reads the stored entry when the lock goes. The run's checkpoint lets the next holder resume
where the last one stopped.

Training runs of the real-data chapters fill it through ``mdlib.runs.pool``. The store imports
neither torch nor the trainer: the scorecard and the provenance records read it without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from mdlib.experiments import paths
from mdlib.runs import files, identity, lockfile
from mdlib.runs.identity import RunId, canonical_json, check_name

__all__ = ["Entry", "RunResult", "StoreWarning", "busy", "entries", "entry_dir", "exists", "load", "load_or_run",
           "lock_path", "named", "prune", "save", "set_name", "stored", "used_runs"]

_used: dict[str, None] = {}  # "kind/key" of the runs loaded or stored by this process, in first-use order


class RunResult(dict):
    """The stored result (a dict of name -> value) plus where it came from."""

    key: str
    path: Path
    cached: bool
    meta: dict

    def __init__(self, values: Mapping[str, Any], *, key: str, path: Path, cached: bool, meta: dict):
        super().__init__(values)
        self.key, self.path, self.cached, self.meta = key, path, cached, meta


class StoreWarning(UserWarning):
    """A stored entry was unusable and is being recomputed."""


def entry_dir(run: RunId) -> Path:
    """The folder of the entry of ``run``."""
    return paths.runs_dir() / run.kind / run.key


def _read(path: Path, run: RunId) -> RunResult | None:
    """The entry at ``path`` of ``run``, or None when it is absent or does not read back completely (a
    ``StoreWarning`` says why)."""
    if not path.is_dir():
        return None
    try:
        values, meta = files.read_entry(path, run)
    except Exception as exc:  # noqa: BLE001 - any failure means: not a usable entry
        warnings.warn(f"ignoring unreadable run entry {path} ({type(exc).__name__}: {exc}); recomputing",
                      StoreWarning, stacklevel=3)
        return None
    return RunResult(values, key=path.name, path=path, cached=True, meta=meta)


def exists(run: RunId) -> bool:
    """Whether the store holds an entry of ``run``, told from its metadata alone (``files.META``: its
    kind, key and code are the run's); :func:`load` still checks the whole entry when it reads it."""
    try:
        meta = json.loads((entry_dir(run) / files.META).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and (meta.get("kind"), meta.get("key"), meta.get("code")) == (run.kind, run.key, run.code)


def load(run: RunId) -> RunResult | None:
    """The stored result of ``run``, or None. A hit is recorded in :func:`used_runs`."""
    path = entry_dir(run)
    files.clean_stale(path.parent)
    result = _read(path, run)
    if result is not None:
        _used[f"{run.kind}/{run.key}"] = None
    return result


def stored(run: RunId, what: str = "run", hint: str = "") -> RunResult:
    """The stored result of ``run``, which must be stored: a LookupError naming ``what`` and ending with
    ``hint`` (what builds it) when it is not."""
    result = load(run)
    if result is None:
        raise LookupError(f"the {what} ({run.kind}/{run.key[:12]}) is not in the results store. {hint}".strip())
    return result


# ---------------------------------------------------------------------------------------------
# the runs this process used


def used_runs() -> list[str]:
    """``kind/key`` of every run this process has loaded from the store (a hit of ``load`` or
    ``load_or_run``) or stored (``save``, ``load_or_run``), in first-use order. In a notebook: the
    runs it has read or written up to now, which ``mdlib.book.provenance`` records with each figure."""
    return list(_used)


# ---------------------------------------------------------------------------------------------
# names: how one chapter finds the runs another chapter built


def _name_path(name: str) -> Path:
    return paths.runs_dir() / "_names" / f"{check_name(name, 'run name')}.json"


def set_name(name: str, kind: str, config: identity.Config | Mapping[str, Any]) -> Path:
    """Record that ``name`` now means the run (``kind``, ``config``), replacing what it meant before;
    ``named(name)`` reads it back. Written atomically (``<build>/runs/_names/<name>.json``)."""
    text = canonical_json({"kind": check_name(kind, "run kind"), "config": config}) + "\n"
    return files.atomic_write(_name_path(name), lambda tmp: tmp.write_text(text, "utf-8"))


def named(name: str) -> tuple[str, dict[str, Any]] | None:
    """(kind, config) of the run ``set_name`` last recorded under ``name``, or None."""
    path = _name_path(name)
    if not path.is_file():
        return None
    record = json.loads(path.read_text("utf-8"))
    return record["kind"], record["config"]


# ---------------------------------------------------------------------------------------------
# the entries on disk, by code fingerprint


@dataclass(frozen=True)
class Entry:
    """One entry of the store: its kind, key, the fingerprint of the code that computed it, whether that
    is the code its kind runs now, and its size on disk."""

    kind: str
    key: str
    code: str | None
    current: bool
    bytes: int
    path: Path


def entries() -> list[Entry]:
    """Every entry in ``<build>/runs/`` (the runs names and temporary folders aside), by kind and key;
    ``current`` compares its code with its kind's today (``identity.code_of``: no module is imported)."""
    out = []
    root = paths.runs_dir()
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir() or folder.name.startswith(("_", ".")):
            continue
        today = identity.code_of(folder.name)  # the code RunId.of puts in the keys of this kind's runs
        for path in sorted(folder.iterdir()):
            if not path.is_dir() or path.name.startswith("."):
                continue
            try:
                code = json.loads((path / "meta.json").read_text("utf-8")).get("code")
            except (OSError, ValueError):
                code = None
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            out.append(Entry(folder.name, path.name, code, code is not None and code == today, size, path))
    return out


def prune() -> list[Entry]:
    """Remove the entries not computed by the code their kind runs now (other fingerprints, unreadable
    metadata); returns them."""
    gone = [entry for entry in entries() if not entry.current]
    for entry in gone:
        files.discard(entry.path, entry.key)
    return gone


# ---------------------------------------------------------------------------------------------
# writing


def save(run: RunId, result: Mapping[str, Any], *, seconds: float = 0.0) -> Path:
    """Write ``result`` as the entry of ``run``, atomically, and return its folder; the run is recorded in
    :func:`used_runs`."""
    final = entry_dir(run)
    final.parent.mkdir(parents=True, exist_ok=True)
    files.clean_stale(final.parent)
    tmp = files.temp_folder(final.parent, "tmp", run.key)
    try:
        files.write_entry(tmp, run, result, seconds)
        try:
            os.replace(tmp, final)
        except OSError:
            # Something is already there: a complete entry from a concurrent run (keep it), or a
            # corrupt one (move it aside, then put ours in place).
            if _read(final, run) is None and final.exists():
                files.discard(final, run.key)
                os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _used[f"{run.kind}/{run.key}"] = None
    return final


# ---------------------------------------------------------------------------------------------
# the lock of a run being computed


def lock_path(run: RunId) -> Path:
    """The lock file of ``run`` while it is computed (``<build>/runs/.locks/<kind>/<key>.lock``)."""
    return paths.runs_dir() / ".locks" / run.kind / f"{run.key}.lock"


def busy(run: RunId) -> bool:
    """Whether another process computes ``run`` now: its lock is held and not stale."""
    return lockfile.is_held(lock_path(run))


def _run_lock(run: RunId) -> contextlib.AbstractContextManager[None]:
    """The lock of ``run`` (``lockfile.hold``), to hold while computing it."""
    return lockfile.hold(lock_path(run), f"run {run.kind}/{run.key[:12]}")


def load_or_run(run: RunId, compute: Callable[[], Mapping[str, Any]], *, force: bool = False,
                lock: bool = True) -> RunResult:
    """The stored result of ``run``; if there is none, ``compute()`` it, store it and return it as read back from the store (so a fresh and a
    cached result look exactly the same).

    ``compute()`` returns a dict of name -> numpy array (or torch tensor), pandas DataFrame/Series, or
    JSON value. ``force=True`` recomputes and replaces a stored entry. While computing it holds the
    run's lock, so another process asked for the same run waits and then reads this one's result (see
    the module's docstring); a process that finds the lock free re-reads the store first. ``lock=False``
    for a result gathered from runs that hold their own locks (a grid): processes that compute it at
    once share those runs out, and the first stored result is the one all of them return.
    """
    if not force:
        hit = load(run)
        if hit is not None:
            return hit
    with _run_lock(run) if lock else contextlib.nullcontext():
        hit = None if force else load(run)  # a racing process may have stored it meanwhile
        if hit is not None:
            return hit
        start = time.perf_counter()
        result = compute()
        seconds = time.perf_counter() - start
        return _store_computed(run, result, seconds, force)


def _store_computed(run: RunId, result: Any, seconds: float, force: bool) -> RunResult:
    """``load_or_run``'s last step: store what ``compute()`` returned and read it back."""
    if not isinstance(result, Mapping):
        raise TypeError(f"compute() for run kind {run.kind!r} must return a dict of name -> value, "
                        f"got {type(result).__name__}")
    if force:
        existing = entry_dir(run)
        if existing.exists():
            files.discard(existing)
    path = save(run, result, seconds=seconds)
    loaded = _read(path, run)
    if loaded is None:  # pragma: no cover - save() just wrote it
        raise RuntimeError(f"run entry {path} could not be read back after writing it")
    loaded.cached = False
    return loaded
