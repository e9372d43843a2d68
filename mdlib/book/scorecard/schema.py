"""The results schema: what every table the scorecard reads must hold, checked where a chapter writes
it (``artifacts.save_table``, ``artifacts.save_figure(..., data=)``) and where the scorecard reads it.

``TABLES[label]`` declares a table's columns, each with a type, the closed interval its numbers lie in
and whether a value may be missing (NaN: only where a chapter leaves a hole on purpose, e.g. the
accuracies of a diverged run); its key, the columns that identify a row (one row per run, per step,
...); and rows it must have. Other columns are free; a label without an entry is not checked.

``read(path, label)`` parses a CSV and enforces its table's rules: an empty or unparsable file, or a
violation, raises ``SchemaError`` naming the file, the row (numbered as a spreadsheet shows it: the
header is row 1) and the rule, e.g. ``table-1.csv row 3: test 8.5 outside [0, 1]``.

A column declared ``timing`` holds a wall-clock measurement or a number derived from one (a ratio of
times, hours projected from a step's time): it differs between two runs of the same code, so
``mdlib.book.compare`` sets its values aside; ``timing_columns(label)`` names a table's.

A table whose only column is ``note`` is a chapter's placeholder for something it did not measure at
its profile (``placeholder``): it passes, and the scorecard shows its note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

__all__ = ["Column", "Table", "METHOD", "SchemaError", "TABLES", "check", "read", "placeholder", "timing_columns"]


class SchemaError(ValueError):
    """A results CSV that breaks its table's rules (the message names the file, the row and the rule)."""


@dataclass(frozen=True)
class Column:
    """A column's rule: its type ("number", "integer", "bool", or "label": any value, matching
    ``pattern`` when given), the closed interval [low, high] its numbers lie in (None: unbounded;
    numbers are finite; within ``ROUNDING`` of a bound counts as inside), whether a value may be
    missing, and whether the column is ``timing``: a wall-clock measurement or a number derived from
    one: differs between runs of the same code."""
    type: str = "number"
    low: float | None = None
    high: float | None = None
    missing: bool = False
    pattern: str | None = None
    timing: bool = False


@dataclass(frozen=True)
class Table:
    """A table's rules: its columns, its key (one row per distinct key: a ``per``, e.g. "run") and the
    rows it must have, each as ``{column: value}``."""
    columns: Mapping[str, Column]
    key: tuple[str, ...]
    per: str
    required: tuple[Mapping[str, Any], ...] = ()


#: How far outside its interval a computed number may fall by rounding alone (a normalized entropy of
#: float32 probabilities just above 1, a divergence of -1e-12 at convergence).
ROUNDING = 1e-6


def maybe(column: Column) -> Column:
    """``column``, a value of which may be missing."""
    return replace(column, missing=True)


SHARE = Column("number", 0, 1)  #: an accuracy, rate, share, density, probability or sparsity
PERCENT = Column("number", 0, 100)  #: an accuracy in points
NONNEGATIVE = Column("number", 0)  #: a divergence, norm, loss, spread, step size or ratio
COUNT = Column("integer", 0)  #: a seed, step, epoch or count
NUMBER = Column("number")  #: a change, which may have either sign
EXPONENT = Column("number", 1)  #: an l_p exponent p
FLAG = Column("bool")
LABEL = Column("label")  #: a name or key ("1.1", "adam", "fashion_mnist")
#: a method key of ``mdlib.experiments.methods``: an l_p exponent ("1.1", "2": GD) or "adam", or "init"
#: (the models at initialization); beside a column that names the method for a reader ("p = 1.1",
#: "MD p = 1.1"), it is what the scorecard reads
METHOD = Column("label", pattern=r"adam|init|\d+(\.\d+)?")
TIMING = Column("number", 0, timing=True)  #: a time, or a number derived from one (a ratio of times)

_RUN = {"layers": Column("integer", 1), "method": LABEL, "multiple": NONNEGATIVE, "lr": NONNEGATIVE,
        "seed": COUNT, "diverged": FLAG, "epochs": maybe(COUNT), "train_accuracy": maybe(SHARE), "reached": FLAG,
        "best_test": maybe(SHARE), "last_test": maybe(SHARE), "validation": maybe(SHARE), "chosen": FLAG}
_CELL = {"setup": LABEL, "layers": Column("integer", 1), "method": LABEL, "runs": COUNT, "reached": COUNT,
         "epochs": NONNEGATIVE, "test": SHARE, "test_std": maybe(NONNEGATIVE), "best": SHARE,
         "best_std": maybe(NONNEGATIVE), "validation": SHARE, "multiple": NONNEGATIVE, "lr": NONNEGATIVE,
         "paper": maybe(PERCENT), "paper_epochs": maybe(COUNT)}

#: An estimate with its interval over seeds and test sentences and over seeds only (``estimates.Estimate``).
_INTERVAL = {"value": maybe(NUMBER), "low": maybe(NUMBER), "high": maybe(NUMBER), "seeds_low": maybe(NUMBER),
             "seeds_high": maybe(NUMBER)}
#: A point of the embedding-scale series (``chapter.series_points``).
_SERIES = {"embedding_std": Column("number", 0), "multiple_1.1": NONNEGATIVE, "multiple_2": NONNEGATIVE,
           "embedding_ratio": NONNEGATIVE, "runs": COUNT, "reached_runs": COUNT, "reached": FLAG, "n": COUNT,
           **_INTERVAL}

#: The null of a sparsity measure (``sparsity.change_table``): the dual change's density, the init weighting's
#: and their product. Chapter 06's table adds each model's init-weighting null (``sparsity_null.null_table``).
_NULL = {"dual_density": maybe(SHARE), "weighting_density": maybe(SHARE), "null_density": maybe(SHARE)}

TABLES: dict[str, Table] = {
    # 01-03: the synthetic paths
    "fig-e1-paths": Table({"train_p": EXPONENT, "svm_p": EXPONENT, "step": COUNT, "mean": NONNEGATIVE,
                           "std": NONNEGATIVE, "q10": NONNEGATIVE, "q90": NONNEGATIVE},
                          ("train_p", "svm_p", "step"), "step of a path, per SVM"),
    "fig-e2-norm-growth": Table({"p": EXPONENT, "method": LABEL, "step": COUNT, "norm": NONNEGATIVE,
                                 "selected_probability": SHARE, "divergence": NONNEGATIVE, "loss": NONNEGATIVE},
                                ("p", "method", "step"), "step of a path", ({"method": "plain"},)),
    "table-e3-final": Table({"p": EXPONENT, "steps": COUNT, "selected": LABEL, "W_divergence": NONNEGATIVE,
                             "v_divergence": NONNEGATIVE, "final_loss": NONNEGATIVE}, ("p",), "exponent"),
    # 04: sentiment
    "table-1": Table(_CELL, ("layers", "method"), "cell"),
    "table-1-variation": Table(_CELL, ("layers", "method"), "cell"),
    "table-sentiment-runs": Table({"grid": Column("label", pattern="replication|variation"), "setup": LABEL,
                                   "analysed": FLAG, **_RUN, "tied": FLAG},
                                  ("grid", "layers", "method", "multiple", "seed"), "run"),
    "table-sentiment-predictions": Table({"grid": Column("label", pattern="replication|variation"),
                                          "layers": Column("integer", 1), "method": LABEL, "seed": COUNT,
                                          "example": COUNT, "correct": Column("integer", 0, 1)},
                                         ("grid", "layers", "method", "seed", "example"), "run and test sentence"),
    "table-sentiment-allocation": Table({"embedding_std": Column("number", 0), **_RUN,
                                         "steps": Column("label", pattern="global|per tensor")},
                                        ("embedding_std", "layers", "method", "seed"), "run"),
    "table-sentiment-contrasts": Table({"embedding_std": Column("number", 0), "contrast": LABEL, "n": COUNT,
                                        **_INTERVAL, "sd": maybe(NONNEGATIVE)}, ("embedding_std", "contrast"),
                                       "scale and contrast"),
    "table-sentiment-tied": Table({"chosen": FLAG, "n": COUNT, **_INTERVAL}, (), "pair of tied steps"),
    "table-sentiment-tied-2x2": Table({"embedding_std": Column("number", 0), "contrast": LABEL, "chosen": FLAG,
                                       "n": COUNT, **_INTERVAL}, (), "scale, contrast and tied steps"),
    "table-sentiment-overnight-runs": Table({"part": Column("label", pattern="series|2x2"),
                                             "embedding_std": Column("number", 0), **_RUN, "tied": FLAG,
                                             "seconds": maybe(TIMING)},
                                            ("part", "embedding_std", "layers", "method", "multiple", "seed"), "run"),
    "table-sentiment-overnight-predictions": Table({"part": Column("label", pattern="series|2x2"),
                                                    "embedding_std": Column("number", 0), "method": LABEL,
                                                    "multiple": NONNEGATIVE, "seed": COUNT,
                                                    "correct": Column("label", pattern="[01]+")},
                                                   ("part", "embedding_std", "method", "multiple", "seed"), "run"),
    "table-sentiment-effective-steps": Table({"setup": LABEL, "method": LABEL, "lr": NONNEGATIVE, "group": LABEL,
                                              "effective_step": NONNEGATIVE, "vs_gd": maybe(NONNEGATIVE)},
                                             ("setup", "method", "group"), "method and parameter group"),
    "fig-sentiment-scale-series": Table(_SERIES, ("embedding_std",), "embedding std"),
    "table-sentiment-series": Table(_SERIES, ("embedding_std",), "embedding std"),
    "table-sentiment-baseline": Table({"baseline": LABEL, "description": LABEL, "C": maybe(NONNEGATIVE),
                                       "validation_accuracy": SHARE, "test_accuracy": SHARE, "train_size": COUNT},
                                      ("baseline",), "baseline", ({"baseline": "naive_bayes"},)),
    "fig-sentiment-curves": Table({"layers": Column("integer", 1), "method": LABEL, "seed": COUNT, "epoch": COUNT,
                                   "train_loss": maybe(NONNEGATIVE), "train_accuracy": SHARE,
                                   "test_loss": maybe(NONNEGATIVE), "test_accuracy": maybe(SHARE), "seconds": TIMING,
                                   "lr": NONNEGATIVE}, ("layers", "method", "seed", "epoch"), "epoch of a run"),
    # 05: token selection
    "table-token-selection-seeds": Table({"sentences": LABEL, "set": LABEL, "seed": COUNT, "wins": COUNT,
                                          "losses": COUNT, "ties": COUNT}, ("sentences", "seed"),
                                         "sentence set and seed"),
    "table-token-selection-sentences": Table({"sentences": LABEL, "set": LABEL, "seed": COUNT, "sentence": COUNT,
                                              "wins": Column("integer", 0, 1), "losses": Column("integer", 0, 1),
                                              "ties": Column("integer", 0, 1)}, ("set", "seed", "sentence"),
                                             "sentence of a seed pair"),
    "table-token-concentration": Table({"method": LABEL, "seed": COUNT, "entropy": SHARE, "top_share": SHARE,
                                        "sentences": COUNT}, ("method", "seed"), "model"),
    # 06: weights
    "table-weights-change": Table({"method": LABEL, "seed": COUNT, "top_share": maybe(SHARE),
                                   "effective_density": maybe(SHARE), "relative_change": maybe(NONNEGATIVE),
                                   **_NULL, "weighting_null_density": maybe(SHARE), "epochs": COUNT,
                                   "reached": FLAG}, ("method", "seed"), "model"),
    "table-weights-kqv": Table({"method": LABEL, "seed": COUNT, "K": COUNT, "Q": COUNT, "V": COUNT,
                                "K > 0.06": COUNT, "Q > 0.06": COUNT, "V > 0.06": COUNT}, ("method", "seed"), "model"),
    "fig-pruning": Table({"method": LABEL, "seed": COUNT, "sparsity": SHARE, "test_accuracy": SHARE},
                         ("method", "seed", "sparsity"), "model and sparsity"),
    # 07: vision
    "fig-vit-accuracy": Table({"epoch": COUNT, "train_loss": maybe(NONNEGATIVE), "train_accuracy": SHARE,
                               "test_loss": maybe(NONNEGATIVE), "test_accuracy": maybe(SHARE),
                               "seconds": TIMING, "lr": NONNEGATIVE, "dataset": LABEL, "method": LABEL,
                               "seed": COUNT, "key": METHOD}, ("dataset", "method", "seed", "epoch"), "epoch of a run"),
    "table-vit": Table({"dataset": LABEL, "optimizer": LABEL, "lr": NONNEGATIVE, "lr from": LABEL,
                        "final_mean": maybe(PERCENT), "final_std": maybe(NONNEGATIVE), "best_mean": maybe(PERCENT),
                        "best_std": maybe(NONNEGATIVE), "train_loss": maybe(NONNEGATIVE),
                        "loss_change": maybe(NUMBER), "loss_share": maybe(NUMBER), "accuracy_change": maybe(NUMBER),
                        "levelled": FLAG, "key_above": maybe(NONNEGATIVE), "query_above": maybe(NONNEGATIVE),
                        "value_above": maybe(NONNEGATIVE), "paper": maybe(PERCENT), "method": METHOD},
                       ("dataset", "optimizer"), "optimizer and data set"),
    "table-vit-change": Table({"steps": LABEL, "dataset": LABEL, "lr": NONNEGATIVE, "method": LABEL, "seed": COUNT,
                               "top_share": maybe(SHARE), "effective_density": maybe(SHARE),
                               "relative_change": maybe(NONNEGATIVE), **_NULL, "loss_share": maybe(NUMBER),
                               "levelled": FLAG}, ("steps", "dataset", "method", "seed"), "model"),
    "table-vit-diverged": Table({"dataset": LABEL, "method": METHOD, "seed": COUNT}, ("dataset", "method", "seed"),
                                "final run that diverged"),
    "fig-vit-weights": Table({"dataset": LABEL, "method": LABEL, "seed": COUNT, "matrix": LABEL, "count": COUNT,
                              "key": METHOD},
                             ("dataset", "method", "seed", "matrix"), "matrix of a model"),
    # 08: cost
    "fig-cost-step": Table({"params": Column("integer", 1), "optimizer": LABEL, "ms": TIMING, "ns_per_param": TIMING,
                            "vs_adam_fused": TIMING}, ("params", "optimizer"), "optimizer and size",
                           ({"optimizer": "adam_fused"},)),
    "table-cost": Table({"optimizer": LABEL, "paper ops per param": COUNT, "ns per param (step, largest size)": TIMING},
                        ("optimizer",), "optimizer"),
    "table-cost-training": Table({"model": LABEL, "optimizer": LABEL, "ms per step": TIMING,
                                  "vs Adam (median ratio)": TIMING,
                                  "ci95": Column("label", pattern=r"\d+(\.\d+)?-\d+(\.\d+)?", timing=True),
                                  "method": METHOD, "ci_low": TIMING, "ci_high": TIMING},
                                 ("model", "optimizer"), "optimizer and model", ({"optimizer": "Adam"},)),
    "table-cost-vit": Table({"optimizer": LABEL, "step_s": TIMING, "params": Column("integer", 1),
                             "hours_2000_epochs": TIMING}, ("optimizer",), "optimizer"),
}


def timing_columns(label: str) -> frozenset[str]:
    """The columns of ``TABLES[label]`` declared ``timing``; empty for a label without an entry."""
    table = TABLES.get(label)
    return frozenset() if table is None else frozenset(c for c, rule in table.columns.items() if rule.timing)


def placeholder(frame: pd.DataFrame) -> bool:
    """Is ``frame`` a chapter's placeholder (its only column is ``note``)?"""
    return list(frame.columns) == ["note"]


def read(path: Path, label: str) -> pd.DataFrame:
    """The CSV at ``path`` as the table ``label``, checked (``check``)."""
    name = f"{label}.csv"
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise SchemaError(f"{name} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise SchemaError(f"{name} is not a readable CSV ({' '.join(str(error).split())})") from None
    if not isinstance(frame.index, pd.RangeIndex):
        raise SchemaError(f"{name} row 2 has more fields than the header")
    check(label, frame)
    return frame


def check(label: str, frame: pd.DataFrame) -> None:
    """Raise ``SchemaError`` when ``frame``, as read from ``<label>.csv`` (row i is the file's row
    i + 2), breaks a rule of ``TABLES[label]``: a declared column lacking, a value of the wrong type,
    out of bounds or missing where it may not be, a key repeated, a required row absent."""
    table = TABLES.get(label)
    if table is None or placeholder(frame):
        return
    name = f"{label}.csv"
    lacking = [c for c in table.columns if c not in frame.columns]
    if lacking:
        raise SchemaError(f"{name} lacks {', '.join(lacking)}")
    for column, rule in table.columns.items():
        for bad, why in _violations(frame[column], rule):
            if bad.any():
                row = bad.idxmax()
                value = "" if pd.isna(frame.at[row, column]) else f" {_show(frame.at[row, column])}"
                raise SchemaError(f"{name} row {row + 2}: {column}{value} {why}")
    key = list(table.key)
    repeated = frame.duplicated(key) if key else pd.Series(False, index=frame.index)
    if repeated.any():
        row = repeated.idxmax()
        first = frame[key].eq(frame.loc[row, key]).all(axis=1).idxmax()
        values = ", ".join(_show(v, quote=False) for v in frame.loc[row, key])
        raise SchemaError(f"{name} row {row + 2} repeats row {first + 2}: the same {', '.join(key)} ({values}); "
                          f"one row per {table.per}")
    for wanted in table.required:
        if not frame[list(wanted)].eq(pd.Series(wanted)).all(axis=1).any():
            raise SchemaError(f"{name} has no row with " + ", ".join(f"{c} {_show(v)}" for c, v in wanted.items())
                              + " (required)")


def _violations(values: pd.Series, rule: Column):
    """(mask, why): the rows of ``values`` that break ``rule``, one test after another."""
    present = values.notna()
    yield ~present & (not rule.missing), "is missing"
    if rule.type == "label":
        if rule.pattern:
            yield present & ~values.astype(str).str.fullmatch(rule.pattern), f"does not match {rule.pattern}"
        return
    if rule.type == "bool":  # a CSV column with a missing value reads its flags as text
        yield present & ~values.isin([True, False, "True", "False"]), "is not True or False"
        return
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    yield present & (numbers.isna() | pd.api.types.is_bool_dtype(values)), "is not a number"
    yield present & ~np.isfinite(numbers.fillna(0)), "is not finite"
    if rule.type == "integer":
        yield present & (numbers != numbers.round()), "is not an integer"
    low = -math.inf if rule.low is None else rule.low
    high = math.inf if rule.high is None else rule.high
    yield present & ~numbers.between(low - ROUNDING, high + ROUNDING), f"outside {_interval(low, high)}"


def _interval(low: float, high: float) -> str:
    """[0, 1], [0, ∞), (-∞, ∞)."""
    return (("(" if low == -math.inf else "[") + f"{_show(low)}, {_show(high)}"
            + (")" if high == math.inf else "]")).replace("inf", "∞")


def _show(value, quote: bool = True) -> str:
    """A value as a message shows it: numbers plainly (8.5, 3), text quoted (unless not ``quote``)."""
    if isinstance(value, str):
        return repr(value) if quote else value
    return f"{value:g}" if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) else str(value)
