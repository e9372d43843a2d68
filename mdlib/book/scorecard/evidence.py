"""The results folder as a scorecard claim reads it: only CSVs the pipeline vouches for.

A CSV counts only when its provenance record (``<label>.json``, ``mdlib.book.provenance``) names the
build's profile and holds the CSV's hash, when it keeps its table's rules (``mdlib.book.scorecard.schema``),
and when the CSVs one claim reads agree (one run of each notebook; a later chapter analysed only runs an
earlier one lists). Anything else raises :class:`Unmeasured`, which the scorecard shows as "not
measured" with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mdlib.book import chapters, provenance
from mdlib.book.scorecard import schema

__all__ = ["Results", "Unmeasured", "complete"]


class Unmeasured(Exception):
    """A claim cannot be measured from this folder (a CSV or a column is missing)."""


class Results:
    """The results folder as one claim reads it. A CSV is judged only when its record (``<label>.json``,
    ``mdlib.book.provenance``) vouches for it, made by the pipeline at the build's ``profile`` and holding
    this very file's hash, and when it keeps its table's rules (``mdlib.book.scorecard.schema``). The CSVs of one
    claim agree: one profile (with ``profile`` None, a caller that does not know the build's, the one its
    first record names); one run of each notebook (the same parameters); and a later chapter analysed
    only runs of a kind an earlier one's record lists among them. A label ``folder`` lacks is read from
    ``also`` when given (a variant's own results, then the book's for the chapters it builds on)."""

    def __init__(self, folder: Path, profile: str | None, also: Path | None = None, _read: dict | None = None):
        self.folders = list(dict.fromkeys(Path(f) for f in (folder, also) if f is not None))
        self.profile = profile
        self.records: dict[str, dict] = {}  # label -> record, of the CSVs read so far
        self._read = {} if _read is None else _read  # label -> (record, frame): files vouched for and parsed once

    def csv(self, label: str, columns=(), where: str | None = None) -> pd.DataFrame:
        """The table ``label``, vouched for by its record and kept to its rules (only the rows where the
        flag column ``where`` is set, when given), every one of the ``columns`` a verdict uses holding
        a value in every row."""
        if label not in schema.TABLES:
            raise KeyError(f"{label} has no results schema: declare it in mdlib.book.scorecard.schema.TABLES")
        _, frame = self._vouched(label)
        return complete(frame if where is None else frame[frame[where].astype(bool)], label, columns)

    def _vouched(self, label: str) -> tuple[dict, pd.DataFrame]:
        """The record and the parsed table of ``label``, vouched for (once per file) and agreeing with the
        claim's other tables."""
        if label not in self._read:
            path = next((f / f"{label}.csv" for f in self.folders if (f / f"{label}.csv").is_file()),
                        self.folders[0] / f"{label}.csv")
            if not path.is_file():
                raise Unmeasured(f"{path.name} missing")
            record = self._record(label, path)
            try:
                frame = schema.read(path, label)
            except schema.SchemaError as error:
                raise Unmeasured(str(error)) from None
            if schema.placeholder(frame):
                raise Unmeasured(f"{path.name}: " + "; ".join(frame.note.astype(str)))
            self._read[label] = (record, frame)
        record, frame = self._read[label]
        wanted = self.profile or next((r["profile"] for r in self.records.values()), record["profile"])
        if record["profile"] != wanted:
            raise Unmeasured(f"{label}.csv was made at profile {record['profile']}, not {wanted}")
        for other, known in self.records.items():
            _agree((f"{label}.csv", record), (f"{other}.csv", known))
        self.records[label] = record
        return record, frame

    def _record(self, label: str, path: Path) -> dict:
        """The provenance record that vouches for the file at ``path``: made by the pipeline and holding
        its hash (``Unmeasured`` otherwise)."""
        name = path.name
        try:
            record = json.loads((path.parent / f"{label}.json").read_text("utf-8"))
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict):
            raise Unmeasured(f"{name} has no readable record ({label}.json): made outside the pipeline, or its "
                             "save did not finish")
        profile = record.get("profile")
        if not profile:
            raise Unmeasured(f"{name} was made outside the pipeline (no profile in its record)")
        digest = {Path(file).name: value for file, value in (record.get("sha256") or {}).items()}.get(name)
        if digest is None:
            raise Unmeasured(f"{name}'s record holds no hash of it (an older record): run its chapter again")
        if provenance.sha256(path) != digest:
            raise Unmeasured(f"{name} does not match its record: edited or from another run")
        return record

    def shown(self) -> str:
        """The profile of the claim's results: its records', else the build's, else "unknown"."""
        return next((r["profile"] for r in self.records.values()), None) or self.profile or "unknown"


def _agree(one: tuple[str, dict], other: tuple[str, dict]) -> None:
    """Raise ``Unmeasured`` unless two (CSV name, record) of one claim come from one run of each
    notebook: within a notebook, the same execution (the same parameters, for records without its id);
    across two, the later chapter's runs of every kind the earlier one's record lists are among those
    (it analysed the grid the earlier one built)."""
    (early, first), (late, second) = _upstream_first(one, other)
    if first.get("notebook") == second.get("notebook"):
        both = bool(first.get("execution") and second.get("execution"))
        field = "execution" if both else "parameters"
        if first.get(field) != second.get(field):
            raise Unmeasured(f"{early} and {late} come from different runs of {first.get('notebook')} "
                             f"(their {'execution ids' if both else 'parameters'} differ)")
        return
    listed = set(first.get("runs") or [])
    kinds = {run.partition("/")[0] for run in listed}
    if any(run.partition("/")[0] in kinds and run not in listed for run in second.get("runs") or []):
        raise Unmeasured(f"{late} analysed runs that {early} does not list: its chapter ran again since, or "
                         "with other parameters")


def _upstream_first(one: tuple[str, dict], other: tuple[str, dict]) -> tuple[tuple[str, dict], tuple[str, dict]]:
    """The two in the order of the registry's ``reads`` (the chapter that builds the runs first); by
    name where neither reads the other."""
    a, b = one[1].get("notebook"), other[1].get("notebook")
    if a in chapters.NAMES and b in chapters.chapter(a).reads:
        return other, one
    if b in chapters.NAMES and a in chapters.chapter(b).reads:
        return one, other
    return tuple(sorted((one, other), key=lambda item: str(item[1].get("notebook"))))


def complete(frame: pd.DataFrame, label: str, columns) -> pd.DataFrame:
    """``frame`` (rows of ``<label>.csv``); ``Unmeasured`` when one of ``columns`` lacks a value in a row."""
    for column in columns:
        missing = frame[column].isna()
        if missing.any():
            raise Unmeasured(f"{label}.csv row {missing.idxmax() + 2}: {column} is missing")
    return frame
