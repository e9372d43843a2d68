"""The results store and what fills it: a finished run is read back instead of recomputed.

A run is identified by ``kind`` (what computes it, e.g. ``"e1-paths"``), its full ``config`` (every
setting that changes the numbers: data sizes, seeds, step sizes, steps, p values) and the code that
computes it: the fingerprint (``mdlib.experiments.fingerprint``) of the module that declared the kind with
:func:`kind` and of every mdlib module it imports (of all of mdlib for a kind nobody declared). Its key
is the sha256 of the canonical JSON of ``{"kind": kind, "config": config, "code": fingerprint}``
(sorted keys, no whitespace), so a change of that code is recomputed, never served the old numbers;
the entries of other fingerprints stay on disk unused until :func:`prune` (``python -m mdlib store
--prune``) removes them. An entry lives in ``<build>/runs/<kind>/<key>/``::

    config.json      the config, canonical JSON
    arrays.npz       the numpy arrays of the result
    <name>.parquet   one file per DataFrame (or Series)
    meta.json        kind, key, code fingerprint, what each name is, JSON values, creation time, seconds,
                     and the sha256 of every other file and of meta.json's own other fields

An entry is written into a temporary folder and moved into place with one ``os.replace``, so it is
either complete or absent; an entry that does not read back completely (corrupt, partial) or whose
content is not what was written (a file or a value edited, another entry's file copied in: its sha256
differs) is ignored, recomputed and replaced. The temporary folders (``.tmp-*``, ``.trash-*``) are named after the
writing process (``<pid>@<host>``); one left behind by a killed write is removed by the first ``load``
or ``save`` of that kind in a later process, when its writer is no longer running on this host or it
is older than ``STALE_SECONDS`` (a write takes seconds; the age covers other hosts and reused pids).

    from mdlib.experiments import store
    result = store.load_or_run("e1-paths", config, lambda: train(config))
    result["divergence"]          # numpy array / DataFrame / JSON value, as compute() returned it
    result.cached, result.path    # whether it came from the store, and where it lives

Two processes asked for the same missing run (two notebooks, two jobs on a cluster sharing the build
folder over NFS) compute it once: ``load_or_run`` takes the run's lock, ``<build>/runs/.locks/<kind>/
<key>.lock``, created with ``O_CREAT | O_EXCL`` (atomic on NFS) and holding the holder's host, pid and
start time; the holder touches it every few seconds while it computes (its heartbeat). The other
process says once that it waits for ``host:pid``, polls, and reads the stored entry when the lock goes.
A lock is taken over when its holder is no longer running on this host, when its heartbeat is older
than ``$MDLIB_LOCK_TIMEOUT`` minutes (default 10; a holder on another host that died; a heartbeat in the
future, a clock ahead, ages from when the waiter first saw it), or when it holds no readable record
``UNREADABLE_LOCK_SECONDS`` after it appeared (a holder killed before writing it); the waiter says which
and for how long it waits. The run's checkpoint lets the next holder resume where the last one stopped.

Training runs of the real-data chapters fill it through ``mdlib.experiments.pool``. The store imports
neither torch nor the trainer: the scorecard and the provenance records read it without them.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import typing
import uuid
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

import numpy as np

from mdlib.experiments import fingerprint, paths

__all__ = ["Config", "RunResult", "StoreWarning", "busy", "canonical_json", "code_of", "config_key",
           "entries", "entry_dir", "kind", "load", "load_or_run", "prune", "save"]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_NAME = 128  #: the most characters of a kind, run name or result name
FORMAT = 3  #: 3: meta.json holds the sha256 of the entry's content
STALE_SECONDS = 3600  #: a temporary folder this old is removed whoever wrote it
_WRITER_RE = re.compile(r"^\.(?:tmp|trash)-(?:[0-9a-f]{16}-)?([0-9]+)@([A-Za-z0-9_]*)-")
LOCK_TIMEOUT_ENV = "MDLIB_LOCK_TIMEOUT"  #: minutes without a heartbeat after which a run's lock is taken over
LOCK_TIMEOUT_MINUTES = 10.0
#: A lock file without a readable record this many seconds old is stale: its writer creates it and
#: writes the record at once, so it was killed in between (or the file was emptied).
UNREADABLE_LOCK_SECONDS = 5.0
_cleaned: set[Path] = set()
_used: dict[str, None] = {}  # "kind/key" of the runs loaded or stored by this process, in first-use order

log = logging.getLogger(__name__)


class RunResult(dict):
    """The stored result (a dict of name -> value) plus where it came from."""

    key: str
    path: Path
    cached: bool
    meta: dict

    def __init__(self, values: Mapping[str, Any], *, key: str, path: Path, cached: bool, meta: dict):
        super().__init__(values)
        self.key, self.path, self.cached, self.meta = key, path, cached, meta


# ---------------------------------------------------------------------------------------------
# keys


class StoreWarning(UserWarning):
    """A stored entry was unusable and is being recomputed."""


def _plain(obj: Any, where: str = "config", finite: bool = True) -> Any:
    """Plain JSON data for hashing: a ``Config`` -> its ``to_dict()``, tuples -> lists, numpy
    scalars/arrays -> Python, Paths -> str."""
    if isinstance(obj, Config):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings, got {key!r}")
            out[key] = _plain(value, f"{where}.{key}", finite)
        return out
    if isinstance(obj, (list, tuple)):
        return [_plain(value, f"{where}[{i}]", finite) for i, value in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist(), where, finite)
    if isinstance(obj, np.generic):
        return _plain(obj.item(), where, finite)
    if isinstance(obj, Path):
        return str(obj)
    if finite and isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"{where}: {obj} is not allowed in a run config (use None or a string)")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{where}: {type(obj).__name__} is not JSON data; put plain numbers, strings, "
                    "lists and dicts in a run config")


def canonical_json(obj: Any) -> str:
    return json.dumps(_plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"invalid {what} {name!r}: use letters, digits, '-', '_' or '.'")
    if len(name) > MAX_NAME:  # a file name: most file systems stop at 255 bytes
        raise ValueError(f"invalid {what} {name[:32]!r}... ({len(name)} characters): use at most {MAX_NAME}")
    return name


def check_keys(config: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    """Raise ValueError unless ``config`` has exactly ``keys`` (an experiment's config is complete, so
    the store keeps exactly what ran); ``what`` names the config in the message."""
    missing = [k for k in keys if k not in config]
    unknown = [k for k in config if k not in keys]
    if missing or unknown:
        raise ValueError(f"{what} has exactly the keys {', '.join(keys)}; missing {missing}, unknown {unknown}")


_C = TypeVar("_C", bound="Config")


class Config:
    """The base of the typed configs (frozen dataclasses), which callers read by attribute. The store
    takes a config as it is and serializes it at its door: ``to_dict()`` is the plain dict it hashes
    and keeps (nested configs as dicts), so a typed config and its dict name the same run;
    ``from_dict`` is its inverse (nested configs typed again)."""

    #: What the config is called in error messages ("a Table 1 grid config").
    WHAT = "a config"
    #: Compatibility with the entries stored before these fields existed: a field named here is left out
    #: of ``to_dict()`` while it holds its default (so those runs keep their keys), and ``from_dict``
    #: fills it in when a mapping lacks it.
    OMIT_AT_DEFAULT: typing.ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The config as the store keeps it: every field (but ``OMIT_AT_DEFAULT``'s at their default),
        nested configs as dicts."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self.OMIT_AT_DEFAULT and value == f.default:
                continue
            out[f.name] = value.to_dict() if isinstance(value, Config) else copy.deepcopy(value)
        return out

    @classmethod
    def from_dict(cls: type[_C], config: Mapping[str, Any]) -> _C:
        """The typed config of a mapping with exactly its fields, those of ``OMIT_AT_DEFAULT`` optional
        (ValueError naming the missing and the unknown ones otherwise); a field typed as a ``Config``
        is made from its mapping in turn."""
        names = tuple(f.name for f in fields(cls))
        check_keys({name: None for name in cls.OMIT_AT_DEFAULT} | dict(config), names, cls.WHAT)
        hints = typing.get_type_hints(cls)
        values = {}
        for name, value in config.items():
            hint = hints[name]
            nested = isinstance(hint, type) and issubclass(hint, Config) and isinstance(value, Mapping)
            values[name] = hint.from_dict(value) if nested else value
        return cls(**values)

    @classmethod
    def of(cls: type[_C], config: "_C | Mapping[str, Any]") -> _C:
        """``config`` itself when it is one, else ``from_dict(config)``."""
        return config if isinstance(config, cls) else cls.from_dict(config)


_KIND_MODULES: dict[str, str] = {}  # kind -> the module that computes its runs


def kind(name: str, module: str) -> str:
    """Declare that the runs of kind ``name`` are computed by ``module`` (the caller's ``__name__``), so
    that their keys hold the fingerprint of that module's code; returns ``name``. For example
    ``KIND = store.kind("e4-sentiment", __name__)``."""
    _check_name(name, "run kind")
    known = _KIND_MODULES.setdefault(name, module)
    if known != module:
        raise ValueError(f"run kind {name!r} is declared by {known} already; {module} must use another name")
    return name


def code_of(kind: str) -> str:
    """The code fingerprint in the keys of ``kind``'s runs: its module's (see :func:`kind`), else all of
    mdlib's."""
    return fingerprint.fingerprint(_KIND_MODULES.get(kind))


def config_key(kind: str, config: Config | Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of ``{"kind": kind, "config": config, "code": code_of(kind)}``."""
    _check_name(kind, "run kind")
    payload = {"kind": kind, "config": config, "code": code_of(kind)}
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def entry_dir(kind: str, config: Config | Mapping[str, Any]) -> Path:
    return paths.runs_dir() / kind / config_key(kind, config)


# ---------------------------------------------------------------------------------------------
# temporary folders


def _temp_prefix(kind: str, key: str = "") -> str:
    """The name prefix of this process's temporary folders: ``.<kind>-[<key16>-]<pid>@<host>-``."""
    return f".{kind}-{key[:16] + '-' if key else ''}{os.getpid()}@{paths.host()}-"


def _lock_timeout() -> float:
    """Seconds without a heartbeat after which a lock is stale: ``$MDLIB_LOCK_TIMEOUT`` minutes."""
    text = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    try:
        minutes = float(text) if text else LOCK_TIMEOUT_MINUTES
    except ValueError:
        minutes = math.nan
    if not minutes > 0 or math.isinf(minutes):
        raise ValueError(f"${LOCK_TIMEOUT_ENV} is {text!r}: give the minutes without a heartbeat after which a "
                         f"run's lock is taken over, a number > 0 (default {LOCK_TIMEOUT_MINUTES:g})")
    return minutes * 60


def _clean_stale(folder: Path) -> None:
    """Remove the temporary folders in ``folder`` (a kind's folder) left by killed writes, once per
    process: those whose writer is not running on this host, or older than ``STALE_SECONDS``."""
    if folder in _cleaned or not folder.is_dir():
        return
    _cleaned.add(folder)
    now = time.time()
    for entry in os.scandir(folder):
        if not entry.name.startswith((".tmp-", ".trash-")):
            continue
        match = _WRITER_RE.match(entry.name)
        try:
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS
        except FileNotFoundError:
            continue
        dead = match is not None and match.group(2) == paths.host() and not paths.alive(int(match.group(1)))
        if old or dead:
            shutil.rmtree(entry.path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# reading


def _read(path: Path, kind: str, config: Config | Mapping[str, Any]) -> RunResult | None:
    """The entry at ``path``, or None when it is absent or does not read back completely."""
    import pandas as pd

    if not path.is_dir():
        return None
    try:
        meta = json.loads((path / "meta.json").read_text("utf-8"))
        if meta.get("format") != FORMAT or meta.get("kind") != kind:
            raise ValueError("format or kind mismatch")
        if meta.get("code") != code_of(kind):
            raise ValueError("computed by other code (its fingerprint differs)")
        _check_content(path, meta)
        stored_config = json.loads((path / "config.json").read_text("utf-8"))
        if canonical_json(stored_config) != canonical_json(config):
            raise ValueError("stored config differs from the requested one")
        entries: dict[str, str] = meta["entries"]
        values: dict[str, Any] = {}
        array_names = [name for name, typ in entries.items() if typ == "array"]
        if array_names:
            with np.load(path / "arrays.npz", allow_pickle=False) as npz:
                if sorted(npz.files) != sorted(array_names):
                    raise ValueError("arrays.npz does not hold the arrays meta.json lists")
                arrays = {name: npz[name] for name in array_names}
        for name, typ in entries.items():
            if typ == "array":
                values[name] = arrays[name]
            elif typ in ("frame", "series"):
                frame = pd.read_parquet(path / f"{name}.parquet")
                values[name] = frame.iloc[:, 0] if typ == "series" else frame
            elif typ == "json":
                values[name] = meta["values"][name]
            else:
                raise ValueError(f"unknown entry type {typ!r}")
    except Exception as exc:  # noqa: BLE001 - any failure means: not a usable entry
        warnings.warn(f"ignoring unreadable run entry {path} ({type(exc).__name__}: {exc}); recomputing",
                      StoreWarning, stacklevel=3)
        return None
    return RunResult(values, key=path.name, path=path, cached=True, meta=meta)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta_digest(meta: Mapping[str, Any]) -> str:
    """The sha256 of meta.json's fields other than ``sha256`` itself (sorted keys, no whitespace)."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return _sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def _content(folder: Path, meta: Mapping[str, Any]) -> dict[str, str]:
    """{file name: sha256} of every file of an entry but meta.json, and ``meta.json``: ``_meta_digest``."""
    files = {f.name: _sha256(f.read_bytes()) for f in sorted(folder.iterdir()) if f.name != "meta.json"}
    return files | {"meta.json": _meta_digest(meta)}


def _check_content(folder: Path, meta: Mapping[str, Any]) -> None:
    """Raise ValueError unless the entry's files and meta.json's fields are those its writer hashed."""
    written = meta.get("sha256")
    if not isinstance(written, dict):
        raise ValueError("meta.json holds no sha256 of the entry's content")
    found = _content(folder, meta)
    changed = sorted(set(found) ^ set(written) | {n for n in found.keys() & written.keys() if found[n] != written[n]})
    if changed:
        raise ValueError(f"its content is not what was stored (edited or replaced: {', '.join(changed)})")


def load(kind: str, config: Config | Mapping[str, Any]) -> RunResult | None:
    """The stored result of this run, or None. A hit is recorded in :func:`used_runs`."""
    path = entry_dir(kind, config)
    _clean_stale(path.parent)
    result = _read(path, kind, config)
    if result is not None:
        _used[f"{kind}/{path.name}"] = None
    return result


# ---------------------------------------------------------------------------------------------
# the runs this process used


def used_runs() -> list[str]:
    """``kind/key`` of every run this process has loaded from the store (a hit of ``load`` or
    ``load_or_run``) or stored (``save``, ``load_or_run``), in first-use order. In a notebook: the
    runs it has read or written up to now, which ``mdlib.book.provenance`` records with each figure."""
    return list(_used)


def clear_used_runs() -> None:
    """Forget :func:`used_runs` (e.g. between two notebooks executed in one process)."""
    _used.clear()


# ---------------------------------------------------------------------------------------------
# names: how one chapter finds the runs another chapter built


def _name_path(name: str) -> Path:
    return paths.runs_dir() / "_names" / f"{_check_name(name, 'run name')}.json"


def set_name(name: str, kind: str, config: Config | Mapping[str, Any]) -> Path:
    """Record that ``name`` now means the run (``kind``, ``config``), replacing what it meant before;
    ``named(name)`` reads it back. Written atomically (``<build>/runs/_names/<name>.json``)."""
    text = canonical_json({"kind": _check_name(kind, "run kind"), "config": config}) + "\n"
    return paths.atomic_write(_name_path(name), lambda tmp: tmp.write_text(text, "utf-8"))


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


def _discard(path: Path, key: str = "") -> None:
    """Remove the entry folder ``path`` at once for readers: moved into a temporary ``.trash-`` folder
    (one ``os.replace``), then deleted."""
    trash = Path(tempfile.mkdtemp(prefix=_temp_prefix("trash", key), dir=path.parent))
    os.replace(path, trash / "entry")
    shutil.rmtree(trash, ignore_errors=True)


def entries() -> list[Entry]:
    """Every entry in ``<build>/runs/`` (the runs names and temporary folders aside), by kind and key.
    ``current`` needs the kind's module imported (``python -m mdlib store`` imports all of mdlib)."""
    out = []
    root = paths.runs_dir()
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir() or folder.name.startswith(("_", ".")):
            continue
        for path in sorted(folder.iterdir()):
            if not path.is_dir() or path.name.startswith("."):
                continue
            try:
                code = json.loads((path / "meta.json").read_text("utf-8")).get("code")
            except (OSError, ValueError):
                code = None
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            out.append(Entry(folder.name, path.name, code, code is not None and code == code_of(folder.name), size, path))
    return out


def prune() -> list[Entry]:
    """Remove the entries not computed by the code their kind runs now (other fingerprints, unreadable
    metadata); returns them."""
    gone = [entry for entry in entries() if not entry.current]
    for entry in gone:
        _discard(entry.path, entry.key)
    return gone


# ---------------------------------------------------------------------------------------------
# writing


def _to_numpy(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        return value.detach().cpu().numpy()
    return None


def _write_entry(folder: Path, kind: str, key: str, config: Config | Mapping[str, Any], result: Mapping[str, Any],
                 seconds: float) -> None:
    import pandas as pd

    entries: dict[str, str] = {}
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    for name, value in result.items():
        _check_name(name, "result name")
        array = _to_numpy(value)
        if array is not None:
            if array.dtype.hasobject:
                raise TypeError(f"result {name!r}: object arrays cannot be stored; use a numeric array "
                                "or a DataFrame")
            arrays[name], entries[name] = array, "array"
        elif isinstance(value, pd.DataFrame):
            value.to_parquet(folder / f"{name}.parquet")
            entries[name] = "frame"
        elif isinstance(value, pd.Series):
            value.to_frame().to_parquet(folder / f"{name}.parquet")
            entries[name] = "series"
        else:
            try:
                values[name] = json.loads(json.dumps(_plain(value, name, finite=False)))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"result {name!r}: store numpy arrays, pandas DataFrames or JSON values "
                                f"({exc})") from None
            entries[name] = "json"
    (folder / "config.json").write_text(canonical_json(config) + "\n", "utf-8")
    if arrays:
        with open(folder / "arrays.npz", "wb") as handle:
            np.savez(handle, **arrays)
    from mdlib import __version__

    meta = {
        "format": FORMAT,
        "kind": kind,
        "key": key,
        "entries": entries,
        "values": values,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 3),
        "code": code_of(kind),
        "mdlib_version": __version__,
    }
    meta["sha256"] = _content(folder, meta)
    # meta.json last: an entry without it is never read back as complete.
    (folder / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", "utf-8")


def save(kind: str, config: Config | Mapping[str, Any], result: Mapping[str, Any], *, seconds: float = 0.0) -> Path:
    """Write ``result`` as the entry of this run (atomically) and return its folder; the run is
    recorded in :func:`used_runs`."""
    key = config_key(kind, config)
    final = paths.runs_dir() / kind / key
    final.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix("tmp", key), dir=final.parent))
    try:
        _write_entry(tmp, kind, key, config, result, seconds)
        try:
            os.replace(tmp, final)
        except OSError:
            # Something is already there: a complete entry from a concurrent run (keep it), or a
            # corrupt one (move it aside, then put ours in place).
            if _read(final, kind, config) is None and final.exists():
                _discard(final, key)
                os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _used[f"{kind}/{key}"] = None
    return final


# ---------------------------------------------------------------------------------------------
# the lock of a run being computed


def _lock_path(kind: str, key: str) -> Path:
    return paths.runs_dir() / ".locks" / kind / f"{key}.lock"


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
    if (record.get("host"), record.get("pids")) == (paths.host(), _pid_namespace()):
        if isinstance(record.get("pid"), int) and not paths.alive(record["pid"]):
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
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}@{paths.host()}-{uuid.uuid4().hex[:8]}")
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
                          "the run may be computed twice", StoreWarning, stacklevel=1)
            return
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)


def busy(kind: str, config: Config | Mapping[str, Any]) -> bool:
    """Whether another process computes run (``kind``, ``config``) now: its lock is held and not stale."""
    held = _holder(_lock_path(kind, config_key(kind, config)))
    return held is not None and not _stale(*held, _lock_timeout())


@contextlib.contextmanager
def _run_lock(kind: str, key: str) -> Iterator[None]:
    """Hold the lock of run ``kind``/``key`` for the block (see the module's docstring): wait while a live
    process holds it, take it over when it is stale, and keep a heartbeat on it meanwhile."""
    timeout = _lock_timeout()
    path = _lock_path(kind, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = f"{paths.host()}:{os.getpid()}:{uuid.uuid4().hex}"
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
        if not waited:
            waited = True
            if record is None:
                message = (f"the lock {path} holds no readable record; waiting at most "
                           f"{min(UNREADABLE_LOCK_SECONDS, timeout):g} s for its writer, then taking it over")
            else:
                message = (f"run {kind}/{key[:12]} is being computed by {record.get('host')}:{record.get('pid')} "
                           f"(since {record.get('started')}); waiting for it, and taking it over if its "
                           f"heartbeat stops for {timeout / 60:g} minutes")
            log.info(message)
            print(message, file=sys.stderr, flush=True)
        time.sleep(poll)
    record = {"host": paths.host(), "pid": os.getpid(), "pids": _pid_namespace(), "token": token,
              "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, token, min(30.0, timeout / 4), stop),
                            name=f"mdlib-lock-{key[:12]}", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        held = _holder(path)
        if held is not None and (held[0] or {}).get("token") == token:
            path.unlink(missing_ok=True)


def load_or_run(kind: str, config: Config | Mapping[str, Any], compute: Callable[[], Mapping[str, Any]], *,
                force: bool = False, lock: bool = True) -> RunResult:
    """The stored result of run (``kind``, ``config``); if there is none, ``compute()`` it, store it and
    return it as read back from the store (so a fresh and a cached result look exactly the same).

    ``compute()`` returns a dict of name -> numpy array (or torch tensor), pandas DataFrame/Series, or
    JSON value. ``force=True`` recomputes and replaces a stored entry. While computing it holds the
    run's lock, so another process asked for the same run waits and then reads this one's result (see
    the module's docstring); a process that finds the lock free re-reads the store first. ``lock=False``
    for a result gathered from runs that hold their own locks (a grid): processes that compute it at
    once share those runs out, and the first stored result is the one all of them return.
    """
    if not force:
        hit = load(kind, config)
        if hit is not None:
            return hit
    with _run_lock(kind, config_key(kind, config)) if lock else contextlib.nullcontext():
        hit = None if force else load(kind, config)  # a racing process may have stored it meanwhile
        if hit is not None:
            return hit
        start = time.perf_counter()
        result = compute()
        seconds = time.perf_counter() - start
        return _store_computed(kind, config, result, seconds, force)


def _store_computed(kind: str, config: Config | Mapping[str, Any], result: Any, seconds: float, force: bool) -> RunResult:
    """``load_or_run``'s last step: store what ``compute()`` returned and read it back."""
    if not isinstance(result, Mapping):
        raise TypeError(f"compute() for run kind {kind!r} must return a dict of name -> value, "
                        f"got {type(result).__name__}")
    if force:
        existing = entry_dir(kind, config)
        if existing.exists():
            _discard(existing)
    path = save(kind, config, result, seconds=seconds)
    loaded = _read(path, kind, config)
    if loaded is None:  # pragma: no cover - save() just wrote it
        raise RuntimeError(f"run entry {path} could not be read back after writing it")
    loaded.cached = False
    return loaded
