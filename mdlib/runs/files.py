"""The files of a results-store entry: writing them, reading them back, checking their content, and the
temporary folders an entry is written in. An entry lives in ``<build>/runs/<kind>/<key>/``::

    config.json      the config, canonical JSON
    arrays.npz       the numpy arrays of the result
    <name>.parquet   one file per DataFrame (or Series)
    meta.json        kind, key, code fingerprint, what each name is, JSON values, creation time, seconds,
                     and the sha256 of every other file and of meta.json's own other fields

An entry is written into a temporary folder and moved into place with one ``os.replace``, so it is
either complete or absent; one that does not read back completely (corrupt, partial) or whose content
is not what was written (a file or a value edited, another entry's file copied in: its sha256 differs)
is refused by :func:`read_entry`. The temporary folders (``.tmp-*``, ``.trash-*``) are named after the
writing process (``<pid>@<host>``); one left behind by a killed write is removed by :func:`clean_stale`
when its writer is no longer running on this host or it is older than ``STALE_SECONDS`` (a write takes
seconds; the age covers other hosts and reused pids).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from mdlib.runs import lockfile
from mdlib.runs.identity import RunId, canonical_json, check_name, plain

__all__ = ["FORMAT", "META", "STALE_SECONDS", "atomic_write", "check_content", "clean_stale", "discard", "read_entry", "sha256_hex",
           "temp_folder", "write_entry"]

FORMAT = 3  #: 3: meta.json holds the sha256 of the entry's content
META = "meta.json"  #: the file an entry is complete with: written last, read first
STALE_SECONDS = 3600  #: a temporary folder this old is removed whoever wrote it
_WRITER_RE = re.compile(r"^\.(?:tmp|trash)-(?:[0-9a-f]{16}-)?([0-9]+)@([A-Za-z0-9_]*)-")
_cleaned: set[Path] = set()


def temp_folder(parent: Path, what: str, key: str = "") -> Path:
    """A new temporary folder in ``parent`` named after this process: ``.<what>-[<key16>-]<pid>@<host>-*``
    (``what``: "tmp" or "trash")."""
    prefix = f".{what}-{key[:16] + '-' if key else ''}{os.getpid()}@{lockfile.host()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def clean_stale(folder: Path) -> None:
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
        dead = match is not None and match.group(2) == lockfile.host() and not lockfile.alive(int(match.group(1)))
        if old or dead:
            shutil.rmtree(entry.path, ignore_errors=True)


def discard(path: Path, key: str = "") -> None:
    """Remove the entry folder ``path`` at once for readers: moved into a temporary ``.trash-`` folder
    (one ``os.replace``), then deleted."""
    trash = temp_folder(path.parent, "trash", key)
    os.replace(path, trash / "entry")
    shutil.rmtree(trash, ignore_errors=True)


def read_entry(path: Path, run: RunId) -> tuple[dict[str, Any], dict[str, Any]]:
    """(values, meta) of the entry at ``path`` of ``run``; an exception (any) when it does not read back
    completely or is not that run's, computed by the code its kind runs now (``run.code``)."""
    import pandas as pd

    meta = json.loads((path / META).read_text("utf-8"))
    if meta.get("format") != FORMAT or meta.get("kind") != run.kind:
        raise ValueError("format or kind mismatch")
    if meta.get("code") != run.code:
        raise ValueError("computed by other code (its fingerprint differs)")
    check_content(path, meta)
    stored_config = json.loads((path / "config.json").read_text("utf-8"))
    if canonical_json(stored_config) != canonical_json(run.config):
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
    return values, meta


def sha256_hex(data: bytes) -> str:
    """The sha256 of ``data``, in hex: what an entry's files are checked by (and the data files, by
    ``mdlib.experiments.fetch``)."""
    return hashlib.sha256(data).hexdigest()


def _meta_digest(meta: Mapping[str, Any]) -> str:
    """The sha256 of meta.json's fields other than ``sha256`` itself (sorted keys, no whitespace)."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return sha256_hex(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def _content(folder: Path, meta: Mapping[str, Any]) -> dict[str, str]:
    """{file name: sha256} of every file of an entry but meta.json, and ``meta.json``: ``_meta_digest``."""
    files = {f.name: sha256_hex(f.read_bytes()) for f in sorted(folder.iterdir()) if f.name != META}
    return files | {META: _meta_digest(meta)}


def check_content(folder: Path, meta: Mapping[str, Any]) -> None:
    """Raise ValueError unless the entry's files and meta.json's fields are those its writer hashed."""
    written = meta.get("sha256")
    if not isinstance(written, dict):
        raise ValueError("meta.json holds no sha256 of the entry's content")
    found = _content(folder, meta)
    changed = sorted(set(found) ^ set(written) | {n for n in found.keys() & written.keys() if found[n] != written[n]})
    if changed:
        raise ValueError(f"its content is not what was stored (edited or replaced: {', '.join(changed)})")


def _to_numpy(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        return value.detach().cpu().numpy()
    return None


def write_entry(folder: Path, run: RunId, result: Mapping[str, Any], seconds: float) -> None:
    """Write the entry of ``run`` into the empty folder ``folder``: its files, meta.json last."""
    import pandas as pd

    entries: dict[str, str] = {}
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    for name, value in result.items():
        check_name(name, "result name")
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
                values[name] = json.loads(json.dumps(plain(value, name, finite=False)))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"result {name!r}: store numpy arrays, pandas DataFrames or JSON values "
                                f"({exc})") from None
            entries[name] = "json"
    (folder / "config.json").write_text(canonical_json(run.config) + "\n", "utf-8")
    if arrays:
        with open(folder / "arrays.npz", "wb") as handle:
            np.savez(handle, **arrays)
    from mdlib import __version__

    meta = {
        "format": FORMAT,
        "kind": run.kind,
        "key": run.key,
        "entries": entries,
        "values": values,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 3),
        "code": run.code,
        "mdlib_version": __version__,
    }
    meta["sha256"] = _content(folder, meta)
    # meta.json last: an entry without it is never read back as complete.
    (folder / META).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", "utf-8")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object], *, tag: str = "tmp") -> Path:
    """Call ``write(tmp)`` on the temporary sibling ``.<stem>.<pid>@<host>.<tag><suffix>`` of ``path``
    (same folder, same suffix), flush it to disk, then move it over ``path`` with one ``os.replace``;
    returns ``path``.

    ``path`` is either the previous file or the complete new one. If ``write`` raises, the temporary
    file is removed (unless ``write`` moved it elsewhere first, e.g. to keep a failed output) and the
    error propagates; the parent folder is created when missing. The temporary siblings that killed
    writers on this host left (their pid no longer runs) are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    leftover = re.compile(rf"\.{re.escape(path.stem)}\.([0-9]+)@{re.escape(lockfile.host())}\.{re.escape(tag)}"
                          rf"{re.escape(path.suffix)}")
    for sibling in path.parent.iterdir():
        if (found := leftover.fullmatch(sibling.name)) and not lockfile.alive(int(found.group(1))):
            sibling.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}@{lockfile.host()}.{tag}{path.suffix}")
    try:
        write(tmp)
        with open(tmp, "r+b") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
