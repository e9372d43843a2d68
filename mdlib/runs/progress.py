"""What the training runs of a process are doing, for a command that shows it elsewhere: the status
files ``pool.run_many`` writes and the reader of a run's checkpoint.

A notebook runs in a Jupyter kernel, whose output lands in the notebook; the command that executes it
(``python -m mdlib run``, ``mdlib book``) shows its progress on its own terminal instead
(``mdlib.book.progress``). It names a folder in ``$MDLIB_PROGRESS_DIR``, which the kernel inherits, and
every ``run_many`` call of the kernel writes one small JSON file there, replaced atomically when a run
finishes (:class:`Status`, ``<folder>/<pid>-<n>.json``)::

    {"pid": 4242, "host": "node7", "kind": "e4-sentiment", "workers": 2, "started": 1767225600.0,
     "updated": ..., "finished": false,
     "runs": [{"key": "3f0c...", "label": "md p=1.1 lr=0.0008 seed 2", "group": "a91e...", "slot": "5d2c...",
               "cap": 600, "stop": 0.995, "state": "waiting",    # stored | waiting | done | failed
               "checkpoint": "<build>/checkpoints/e4-sentiment/3f0c.../checkpoint.pt",
               "lock": "<build>/runs/.locks/e4-sentiment/3f0c....lock", "entry": "<build>/runs/e4-sentiment/3f0c...",
               "flops_per_epoch": 1.2e12, "expected_epochs": 600.0,   # mdlib.experiments.workload, when it has a model
               "epochs": null, "seconds": null}]}                     # a run trained now: its epochs and seconds
                                                                      # a failed one: "error", its type's name

A run is being trained while its lock exists (``store.load_or_run`` holds it, in whichever process or
worker trains it), and its checkpoint, replaced after every epoch (``train.fit``), holds its history so
far: :func:`read_checkpoint` reads that history without torch and without the tensors. Nothing here
changes a run's numbers (``fingerprint.BOOKKEEPING``); without ``$MDLIB_PROGRESS_DIR`` nothing is
written.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import pickle
import time
import zipfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from mdlib.runs import files, lockfile

__all__ = ["PROGRESS_ENV", "Status", "describe", "group_of", "read_checkpoint", "slot_of", "status", "work_of"]

#: The folder the command that executes a notebook reads its kernel's progress from.
PROGRESS_ENV = "MDLIB_PROGRESS_DIR"
CHECKPOINT = "checkpoint.pt"  #: ``train.CHECKPOINT``, named here so that the reader needs no torch

_calls = itertools.count()


# ---------------------------------------------------------------------------------------------
# what a run is called


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def describe(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """A short label of each run config (plain dicts, as the store keeps them) among ``configs`` (the
    runs of one call): its method (``optimizer``'s ``name`` and ``p``: ``md p=1.1``, ``adam``), the
    settings in which the configs differ (by their last name: ``lr=0.0008``, ``layers=2``; an arm's
    ``matched_p=1.1``) and its seed (``fit.seed``)."""
    flat = [_flat(config) for config in configs]
    names = list(dict.fromkeys(name for config in flat for name in config))
    varying = [name for name in names if len({json.dumps(c.get(name), sort_keys=True, default=str) for c in flat}) > 1
               and name not in ("optimizer.name", "optimizer.p", "fit.seed")]
    short = {name: name.rsplit(".", 1)[-1] for name in varying}
    if len(set(short.values())) < len(short):  # two settings of one last name: their paths
        short = {name: name for name in varying}
    labels = []
    for config in flat:
        parts = []
        method = config.get("optimizer.name")
        if method is not None:
            p = config.get("optimizer.p")
            parts.append(f"{method} p={_value(p)}" if method == "md" and p is not None else str(method))
        parts += [f"{short[name]}={_value(config[name])}" for name in varying if name in config]
        if "fit.seed" in config:
            parts.append(f"seed {config['fit.seed']}")
        labels.append(" ".join(parts) or "run")
    return labels


def group_of(config: Mapping[str, Any]) -> str:
    """The runs that differ only by their seed share a group (they take similar numbers of epochs)."""
    fit = {k: v for k, v in dict(config.get("fit") or {}).items() if k != "seed"}
    return _digest({**config, "fit": fit})


def slot_of(config: Mapping[str, Any]) -> str:
    """The runs that differ only by their step size (``optimizer.lr``) share a slot: a grid's run of one
    cell and seed, at whichever candidate step its sweep chooses."""
    optimizer = {k: v for k, v in dict(config.get("optimizer") or {}).items() if k != "lr"}
    return _digest({**config, "optimizer": optimizer})


def _digest(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# a run_many call's status file


def work_of(kind: str, config: Any) -> tuple[float | None, float | None]:
    """(forward-and-backward FLOPs of one epoch, expected epochs) of a run, from
    ``mdlib.experiments.workload`` where it has a model of ``kind``; (None, None) otherwise."""
    try:
        from mdlib.experiments import workload

        work = workload.run_work(kind, config)
        return work.flops(1.0), float(work.epochs)
    except Exception:  # noqa: BLE001 - a kind without a work model (or a config it does not read)
        return None, None


class Status:
    """The status file of one ``run_many`` call (the module's docstring), written at the start, when a
    run finishes and at the end."""

    def __init__(self, folder: Path, kind: str, runs: Sequence[tuple[Any, Any]], missing: set, workers: int,
                 lock_of, checkpoint_of, entry_of):
        self.path = folder / f"{os.getpid()}-{next(_calls)}.json"
        self.record: dict[str, Any] = {"pid": os.getpid(), "host": lockfile.host(), "kind": kind, "workers": workers,
                                       "started": time.time(), "updated": time.time(), "finished": False, "runs": []}
        unique = list({run_id.key: (run_id, config) for run_id, config in runs}.values())  # a run asked twice: once
        labels = describe([run_id.config for run_id, _ in unique])
        self._index = {}
        for (run_id, config), label in zip(unique, labels):
            fit = run_id.config.get("fit") or {}
            flops, expected = work_of(kind, config) if run_id in missing else (None, None)
            self._index[run_id.key] = len(self.record["runs"])
            self.record["runs"].append({
                "key": run_id.key, "label": label, "group": group_of(run_id.config), "slot": slot_of(run_id.config),
                "cap": fit.get("epochs"),
                "stop": fit.get("stop_train_accuracy"), "state": "waiting" if run_id in missing else "stored",
                "checkpoint": str(checkpoint_of(run_id) / CHECKPOINT), "lock": str(lock_of(run_id)),
                "entry": str(entry_of(run_id)), "flops_per_epoch": flops, "expected_epochs": expected,
                "epochs": None, "seconds": None})
        self.write()

    def write(self) -> None:
        """Replace the status file (never raises: progress must not stop a training)."""
        self.record["updated"] = time.time()
        text = json.dumps(self.record)
        try:
            files.atomic_write(self.path, lambda tmp: tmp.write_text(text, "utf-8"), tag="progress")
        except OSError:
            pass

    def waiting(self, run_id: Any) -> bool:
        """Whether run ``run_id`` is one this call trains and has not finished yet."""
        index = self._index.get(run_id.key)
        return index is not None and self.record["runs"][index]["state"] == "waiting"

    def finished(self, run_id: Any, history: Any = None, failed: BaseException | bool = False) -> None:
        """Record that run ``run_id``, one this call trains, was trained (``history``: its ``train.fit``
        history, a DataFrame) or failed (the error, whose type is recorded, e.g. the FloatingPointError
        of a run that diverged)."""
        if not self.waiting(run_id):
            return
        row = self.record["runs"][self._index[run_id.key]]
        row["state"] = "failed" if failed else "done"
        if isinstance(failed, BaseException):
            row["error"] = type(failed).__name__
        if history is not None and len(history):
            row["epochs"] = int(len(history))
            row["seconds"] = float(history["seconds"].sum())
        self.write()

    def close(self) -> None:
        self.record["finished"] = True
        self.write()


def status(kind: str, runs: Sequence[tuple[Any, Any]], missing: set, workers: int, *, lock_of, checkpoint_of,
           entry_of) -> Status | None:
    """A :class:`Status` for a ``run_many`` call of ``runs`` ((RunId, config) pairs; ``missing``: the ids
    it trains), when a command watches (``$MDLIB_PROGRESS_DIR``) and this process is not a torchrun
    rank other than 0; else None. ``lock_of``, ``checkpoint_of``, ``entry_of``: a run id's lock file,
    checkpoint folder and store entry."""
    folder = os.environ.get(PROGRESS_ENV)
    if not folder or os.environ.get("RANK", "0") != "0":
        return None
    try:
        return Status(Path(folder), kind, runs, missing, workers, lock_of, checkpoint_of, entry_of)
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# reading a checkpoint's history


class _Opaque:
    """What a restricted read of a checkpoint makes of every object it does not rebuild (tensors,
    storages, numpy arrays): nothing."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Opaque()

    def __setstate__(self, state):
        pass


_PLAIN = {("builtins", name) for name in ("list", "dict", "tuple", "set", "frozenset", "int", "float", "str",
                                          "bool", "complex", "slice", "range")} | {("collections", "OrderedDict")}


class _Structure(pickle.Unpickler):
    """Unpickles the structure of a ``torch.save`` file (``data.pkl``): plain containers and numbers;
    every other class and every tensor storage (a persistent id) becomes an :class:`_Opaque`. It builds
    no object of any other class, so it runs no code from the file."""

    def find_class(self, module: str, name: str):
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        return type(name, (_Opaque,), {})

    def persistent_load(self, pid):
        return None


def _structure(path: Path) -> Any:
    """What ``torch.save`` wrote into ``path`` (its zip format), with every tensor left out."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
        return _Structure(io.BytesIO(archive.read(name))).load()


def _torch_structure(path: Path) -> Any:
    """The fallback: ``torch.load`` with the tensors memory-mapped (not read)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any] | None:
    """The progress a run's checkpoint (``train.fit``'s ``checkpoint.pt``) holds: ``{"history": [one dict
    per epoch: epoch, train_loss, train_accuracy, ..., seconds], "stopped": bool}``, read without its
    tensors (the pickle's structure only, a few kilobytes; ``torch.load`` with memory-mapped tensors if
    that fails); None when there is no checkpoint or it cannot be read."""
    path = Path(path)
    for read in (_structure, _torch_structure):
        try:
            state = read(path)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - any other failure: the next reader, then no progress
            continue
        if isinstance(state, Mapping) and isinstance(state.get("history"), list):
            history = [dict(row) for row in state["history"] if isinstance(row, Mapping)]
            return {"history": history, "stopped": bool(state.get("stopped"))}
    return None
