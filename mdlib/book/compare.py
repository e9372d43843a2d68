"""Compare two results folders (a book build's ``_build/results/``): are the results the same, the
timings aside? ``python -m mdlib compare A B`` prints :meth:`Report.text` and exits 0 when they are.

Each ``<label>.csv`` of either folder is one :class:`Entry` (the label is the file's stem), with a
status:

- ``identical``: the same bytes;
- ``same values``: the bytes differ, but the two tables have the same columns in the same order, the
  same number of rows, and every cell outside the timing columns equal: numbers within ``rtol`` or
  ``atol`` as :func:`math.isclose` (default: exactly; NaN equals NaN, and an empty cell is NaN), any
  other text exactly;
- ``differs``: anything else; its details name the columns added or removed, the change in the
  number of rows, or the first differing cell (its row numbered as a spreadsheet shows it: the header
  is row 1), both values and how many cells differ;
- ``only in A``, ``only in B``.

Timing columns hold a wall-clock measurement or a number derived from one, which differs between two
runs of the same code: the columns a table declares ``timing`` in ``mdlib.book.scorecard.schema.TABLES``,
and in any table a column named ``seconds``. Their values are set aside (each entry names the columns), not
the columns themselves: one added or removed is a difference.

Only the CSVs are compared. The provenance records (``<label>.json``: git commit, versions, timings,
parameters) differ between any two builds, and are not.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mdlib.book.scorecard import schema

__all__ = ["DIFFERS", "IDENTICAL", "ONLY_A", "ONLY_B", "SAME", "Entry", "FolderError", "Report", "compare"]

IDENTICAL, SAME, DIFFERS, ONLY_A, ONLY_B = "identical", "same values", "differs", "only in A", "only in B"
#: The details of two tables with the same cells in other bytes.
SAME_CELLS = "the same cells in other bytes (quoting or line endings)"
#: The columns that are timing in any table, declared or not.
TIMING_NAMES = frozenset({"seconds"})


class FolderError(ValueError):
    """A folder that cannot be compared: it does not exist, is not a folder or holds no CSV."""


@dataclass(frozen=True)
class Entry:
    """One label's comparison: its ``status``, ``details`` (what differs, or what was set aside) and
    the ``timing`` columns whose values were set aside (empty where no values were compared)."""
    label: str
    status: str
    details: str = ""
    timing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    """The comparison of the results folders ``a`` and ``b`` (with the tolerances used): one entry per
    label, sorted by label."""
    a: Path
    b: Path
    entries: tuple[Entry, ...]
    rtol: float = 0.0
    atol: float = 0.0
    added_columns: bool = False

    @property
    def ok(self) -> bool:
        """Whether every label is in both folders with the same values."""
        return all(entry.status in (IDENTICAL, SAME) for entry in self.entries)

    def text(self) -> str:
        """The report as ``python -m mdlib compare`` prints it: the two folders and the tolerance, one
        line per label (its status and details), and a summary line."""
        count = Counter(entry.status for entry in self.entries)
        numbers = (f"within rtol {self.rtol:g} or atol {self.atol:g}" if self.rtol or self.atol else "exactly")
        width = max((len(entry.label) for entry in self.entries), default=0)
        added = "; columns B adds set aside" if self.added_columns else ""
        lines = [f"A: {self.a}", f"B: {self.b}",
                 f"numbers compared {numbers}; timing columns aside{added}; provenance records (JSON) not compared"]
        lines += [f"{entry.label:<{width}}  {entry.status:<11}  {entry.details}".rstrip() for entry in self.entries]
        summary = (f"{len(self.entries)} files: {count[IDENTICAL]} identical, {count[SAME]} same values (timing "
                   f"columns aside), {count[DIFFERS]} {'differs' if count[DIFFERS] == 1 else 'differ'}")
        summary += "".join(f", {count[status]} {status}" for status in (ONLY_A, ONLY_B) if count[status])
        return "\n".join(lines + [summary])


def compare(a: Path, b: Path, *, rtol: float = 0.0, atol: float = 0.0, added_columns: bool = False) -> Report:
    """Compare the results folders ``a`` and ``b`` CSV by CSV, as the module's docstring says.
    ``added_columns``: a table of B may have columns A lacks (new code that writes more); A's columns,
    in A's order among B's, are compared and the added ones named. Raises ``FolderError`` when either
    folder does not exist, is not a folder or holds no CSV, and ``ValueError`` for a negative
    tolerance."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    a, b = Path(a), Path(b)
    in_a, in_b = _csvs(a, "A"), _csvs(b, "B")
    entries = []
    for label in sorted(in_a.keys() | in_b.keys()):
        if label not in in_b:
            entries.append(Entry(label, ONLY_A))
        elif label not in in_a:
            entries.append(Entry(label, ONLY_B))
        else:
            entries.append(_compare_files(label, in_a[label], in_b[label], rtol, atol, added_columns))
    return Report(a, b, tuple(entries), rtol, atol, added_columns)


def _csvs(folder: Path, side: str) -> dict[str, Path]:
    """The CSVs of ``folder`` by label; a ``FolderError`` naming the ``side`` when there are none."""
    if not folder.exists():
        raise FolderError(f"{side} {folder} does not exist")
    if not folder.is_dir():
        raise FolderError(f"{side} {folder} is not a folder")
    odd = sorted(path.name for path in folder.glob("*.csv") if not path.is_file())
    if odd:
        raise FolderError(f"{side} {folder} holds {', '.join(odd)}, named like a table but not a file: move it away")
    found = {path.stem: path for path in folder.glob("*.csv")}
    if not found:
        raise FolderError(f"{side} {folder} holds no .csv file: give a results folder, e.g. _build/results")
    return found


def _compare_files(label: str, path_a: Path, path_b: Path, rtol: float, atol: float,
                   added_columns: bool = False) -> Entry:
    """The entry of ``label``, whose CSVs are ``path_a`` and ``path_b``."""
    raw_a, raw_b = path_a.read_bytes(), path_b.read_bytes()
    if raw_a == raw_b:
        return Entry(label, IDENTICAL)
    tables, problems = [], []
    for side, raw in (("A", raw_a), ("B", raw_b)):
        try:
            tables.append(_table(raw))
        except ValueError as error:
            problems.append(f"{side} {error}")
    if problems:
        return Entry(label, DIFFERS, "; ".join(problems))
    (header, rows_a), (header_b, rows_b) = tables
    if added_columns and header != header_b and _kept_in_order(header, header_b):
        keep = [header_b.index(column) for column in header]
        entry = _compare_values(label, header, rows_a, [[row[i] for i in keep] for row in rows_b], rtol, atol)
        if entry.status == DIFFERS:
            return entry
        added = [column for column in header_b if column not in header]
        kept = [x for x in entry.details.split("; ") if x and x != SAME_CELLS]  # of course: B has more cells
        details = "; ".join([f"added in B: {', '.join(added)}", *kept])
        return Entry(label, SAME, details, entry.timing)
    if header != header_b:
        rows = [] if len(rows_a) == len(rows_b) else [_row_counts(rows_a, rows_b)]
        return Entry(label, DIFFERS, "; ".join([_column_change(header, header_b)] + rows))
    return _compare_values(label, header, rows_a, rows_b, rtol, atol)


def _compare_values(label: str, header: list[str], rows_a: list[list[str]], rows_b: list[list[str]], rtol: float,
                    atol: float) -> Entry:
    """The entry of ``label``, whose two tables (of different bytes) have the same ``header``."""
    timing = schema.timing_columns(label) | TIMING_NAMES
    aside = tuple(column for column in header if column in timing)
    timed = {i for i, column in enumerate(header) if column in timing}
    if len(rows_a) != len(rows_b):
        first = next((number for number, (row_a, row_b) in enumerate(zip(rows_a, rows_b), start=2)
                      if any(x != y for i, (x, y) in enumerate(zip(row_a, row_b)) if i not in timed)), None)
        where = (f"the first differing row is row {first}" if first is not None
                 else f"rows 2 to {min(len(rows_a), len(rows_b)) + 1} agree")
        return Entry(label, DIFFERS, f"{_row_counts(rows_a, rows_b)}; {where}", aside)
    count: Counter[str] = Counter()  # cells of different text: "timing", "equal", "near" or "differs"
    first = None
    for number, (row_a, row_b) in enumerate(zip(rows_a, rows_b), start=2):
        for i, (x, y) in enumerate(zip(row_a, row_b)):
            if x == y:
                continue
            match = "timing" if i in timed else _match(x, y, rtol, atol)
            count[match] += 1
            if match == "differs" and first is None:
                first = f"row {number}, {header[i]}: A {_show(x)}, B {_show(y)}"
    if count["differs"]:
        return Entry(label, DIFFERS, f"{first} ({_differ(count['differs'])})", aside)
    details = [f"set aside: {', '.join(aside)} ({_differ(count['timing'])})"] if count["timing"] else []
    details += [f"{_cells(count['equal'])} written differently"] if count["equal"] else []
    details += [f"{_cells(count['near'])} within tolerance"] if count["near"] else []
    if not count:
        details.append(SAME_CELLS)
    return Entry(label, SAME, "; ".join(details), aside)


def _table(raw: bytes) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a CSV's bytes, every cell as its text; a ``ValueError`` saying why the
    bytes are no table."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    try:  # an empty line is one empty cell (a one-column table's missing value)
        records = [row or [""] for row in csv.reader(io.StringIO(text, newline=""))]
    except csv.Error as error:
        raise ValueError(f"is not a readable CSV ({error})") from None
    if not records:
        raise ValueError("is empty")
    header, rows = records[0], records[1:]
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ValueError(f"row {number} has {len(row)} fields, the header {len(header)}")
    return header, rows


def _column_change(header_a: list[str], header_b: list[str]) -> str:
    """How the columns of B differ from those of A: added, removed, or the same in another order."""
    added = list((Counter(header_b) - Counter(header_a)).elements())
    removed = list((Counter(header_a) - Counter(header_b)).elements())
    changes = [f"{what} in B: {', '.join(columns)}" for what, columns in
               ((f"column{'s' * (len(added) > 1)} added", added), (f"column{'s' * (len(removed) > 1)} removed",
                                                                    removed)) if columns]
    return "; ".join(changes) or f"columns in another order: A {', '.join(header_a)}; B {', '.join(header_b)}"


def _kept_in_order(header_a: list[str], header_b: list[str]) -> bool:
    """Whether B's header holds every column of A's, once each and in A's order."""
    if len(set(header_b)) != len(header_b) or not set(header_a) <= set(header_b):
        return False
    positions = [header_b.index(column) for column in header_a]
    return positions == sorted(positions)


def _row_counts(rows_a: list[list[str]], rows_b: list[list[str]]) -> str:
    """The numbers of rows of A and B."""
    return f"{len(rows_a)} rows in A, {len(rows_b)} in B (header aside)"


def _match(a: str, b: str, rtol: float, atol: float) -> str:
    """How two cells of different text compare: "equal" (the same number, or both NaN), "near"
    (numbers within ``rtol`` or ``atol``) or "differs"."""
    x, y = _number(a), _number(b)
    if x is None or y is None:
        return "differs"
    if x == y or (math.isnan(x) and math.isnan(y)):
        return "equal"
    if not (rtol or atol):
        return "differs"  # exactly: integers too (2**53 + 1 is not 2**53, as floats would have it)
    return "near" if math.isclose(x, y, rel_tol=rtol, abs_tol=atol) else "differs"


def _number(text: str) -> int | float | None:
    """The number a cell holds, an integer exactly (NaN for an empty cell); None for text that is no
    number."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text) if text else math.nan
    except ValueError:
        return None


def _cells(count: int) -> str:
    """1 cell, 2 cells."""
    return f"{count} cell{'s' * (count != 1)}"


def _differ(count: int) -> str:
    """1 cell differs, 2 cells differ."""
    return f"{_cells(count)} {'differs' if count == 1 else 'differ'}"


def _show(text: str) -> str:
    """A cell's text as the details show it: as written, an empty one as (empty)."""
    return text if text else "(empty)"
