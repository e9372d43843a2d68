"""One step-size grid for every chapter: a validation sweep of candidate step sizes per cell, a choice
per cell (never on the test set), then the final runs of every seed at the chosen candidate.

A chapter describes its grid as a ``Design``: the cells in order, each cell's candidates and seeds,
the seeds its sweep trains, the run config of a sweep run and of a final run, a summary row per run,
how a cell's rows are reduced to one per candidate and how a candidate is chosen from them. ``build``
then runs it through the chapter's ``train_runs`` (``pool.run_many``) and the results store:

1. the sweep: every (cell, candidate, sweep seed) once, a diverged run (FloatingPointError) giving a
   row with NaN results instead of stopping the others;
2. the choice: ``choose(rows of the cell)`` for every cell the sweep trained, the only candidate of a
   cell it did not;
3. the final runs: every seed of every cell at its chosen candidate (a final run whose config is a
   sweep run's is that run, read back), a diverged one recorded as such, never trained again;
4. the grid's entry, kept by the store under the chapter's grid kind and config (so its fingerprint is
   the code of the chapter that declared the kind): the sweep table (``chosen`` marks each cell's
   choice), the chosen candidates, the diverged final runs and (``summarise_finals``) the summary rows
   of the final runs the sweep did not train.

``build(..., stored_only=True)`` reads the entry and the final runs back and never trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from mdlib.experiments import store

__all__ = ["DIVERGED", "Design", "Outcome", "TIE_Z", "build", "sweep", "sweep_configs", "tied"]

Cell = tuple  #: a cell's key, e.g. (layers, method) or (dataset, method)
Item = tuple  #: (cell, candidate, seed) of one run
TrainRuns = Callable[..., list]
#: What a run that diverged raises (mirror descent refuses a non-finite step).
DIVERGED = (FloatingPointError,)


#: How many standard errors apart two accuracies must be for one to rank above the other (``tied``):
#: the two-sided 95 % normal quantile.
TIE_Z = 1.96


def tied(first: float, second: float, n_first: int, n_second: int, z: float = TIE_Z) -> bool:
    """Whether two accuracies, shares of ``n_first`` and ``n_second`` predictions, lie within ``z`` standard
    errors of their difference, sqrt(a(1-a)/n_a + b(1-b)/n_b) (binomial): a difference that sampling
    alone makes, which must not decide a choice (a step size chosen on validation), since another
    machine's runs would give another. Two equal accuracies are tied, also at 0 or 1."""
    if min(n_first, n_second) < 1:
        raise ValueError(f"tied needs at least one prediction on each side, got {n_first} and {n_second}")
    error = math.sqrt(first * (1 - first) / n_first + second * (1 - second) / n_second)
    return abs(first - second) <= z * error



@dataclass(frozen=True)
class Design:
    """How a chapter's grid sweeps, chooses and finishes (see the module docstring).

    ``cells``: the cells in order. ``candidates(cell)``: its candidate values, in order. ``seeds(cell)``:
    how many final runs it has (seeds 0..seeds-1). ``sweep_seeds(cell)``: the seeds its sweep trains
    at each candidate (none: nothing to choose). ``sweep_config`` / ``final_config`` (cell, candidate,
    seed): the run configs. ``summary(cell, candidate, seed, config, result)``: a run's row (result
    None: diverged), with ``columns`` naming the cell and ``candidate`` the candidate's column.
    ``reduce``: the sweep's rows -> one row per (cell, candidate) (None: the rows as they are).
    ``choose(rows)``: the chosen candidate among a cell's reduced rows; it must never read the test
    set. ``train_runs(configs, workers, progress, skip)``: the chapter's runs (``pool.run_many``).
    ``summarise_finals``: the entry keeps the summary rows of the final runs the sweep did not train.
    ``kind``: the store kind of the grid's entry and ``run_kind`` that of its runs, both declared by
    the chapter's module; ``config``: the grid's typed config (the store keeps its ``to_dict()``)."""

    kind: str
    run_kind: str
    config: store.Config
    cells: Sequence[Cell]
    candidates: Callable[[Cell], Sequence[float]]
    seeds: Callable[[Cell], int]
    sweep_seeds: Callable[[Cell], Sequence[int]]
    sweep_config: Callable[[Cell, float, int], store.Config]
    final_config: Callable[[Cell, float, int], store.Config]
    summary: Callable[[Cell, float, int, store.Config, Mapping[str, Any] | None], dict[str, Any]]
    columns: tuple[str, ...]
    candidate: str
    choose: Callable[[pd.DataFrame], float]
    train_runs: TrainRuns
    reduce: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    summarise_finals: bool = False

    def sweep_items(self) -> list[Item]:
        """(cell, candidate, seed) of every sweep run, cell by cell, candidate by candidate."""
        return [(cell, c, s) for cell in self.cells for c in self.candidates(cell) for s in self.sweep_seeds(cell)]

    def final_items(self, chosen: Mapping[Cell, float]) -> list[Item]:
        """(cell, chosen candidate, seed) of every final run, cell by cell."""
        return [(cell, chosen[cell], s) for cell in self.cells for s in range(self.seeds(cell))]


@dataclass
class Outcome:
    """A built grid: ``sweep`` (the reduced sweep rows, ``chosen`` marking each cell's choice),
    ``chosen`` ({cell: candidate}), ``finals`` (summary rows of the final runs the sweep did not train;
    None unless ``summarise_finals``), ``diverged`` ((cell..., seed) of the diverged final runs),
    ``configs``/``results`` (the final runs that finished, keyed (cell..., seed))."""

    sweep: pd.DataFrame
    chosen: dict[Cell, float]
    finals: pd.DataFrame | None
    diverged: list[tuple]
    configs: dict[tuple, store.Config]
    results: dict[tuple, store.RunResult]


def sweep_configs(design: Design) -> list[store.Config]:
    """The run configs of a grid's sweep, in order (to train several grids' sweeps in one pool)."""
    return [design.sweep_config(*item) for item in design.sweep_items()]


def _table(design: Design, items: list[Item], configs: list, results: list) -> pd.DataFrame:
    """One ``summary`` row per run."""
    rows = [design.summary(*item, config, result) for item, config, result in zip(items, configs, results)]
    return pd.DataFrame(rows)


def _mark(design: Design, table: pd.DataFrame, chosen: Mapping[Cell, float]) -> pd.DataFrame:
    """``table`` with ``chosen``: whether its candidate is its cell's choice."""
    cells = zip(*(table[c] for c in design.columns))
    return table.assign(chosen=[chosen[cell] == value for cell, value in zip(cells, table[design.candidate])])


def sweep(design: Design, *, workers: int = 1, progress: bool = True) -> tuple[pd.DataFrame, dict[Cell, float]]:
    """Train the sweep (diverged runs: NaN rows) and choose: (the reduced sweep table with ``chosen``,
    {cell: chosen candidate})."""
    return _swept(design, workers, progress)[:2]


def _swept(design: Design, workers: int, progress: bool) -> tuple[pd.DataFrame, dict[Cell, float], list[Item]]:
    """``sweep``, and the items of the sweep runs that diverged."""
    items = design.sweep_items()
    configs = [design.sweep_config(*item) for item in items]
    results = design.train_runs(configs, workers, progress, skip=DIVERGED)
    diverged = [item for item, result in zip(items, results) if result is None]
    table = _table(design, items, configs, results)
    if design.reduce is not None:
        table = design.reduce(table)
    swept = {cell for cell, _, _ in items}
    chosen = {}
    for cell in design.cells:
        if cell in swept:
            rows = table[np.logical_and.reduce([table[c] == v for c, v in zip(design.columns, cell)])]
            chosen[cell] = float(design.choose(rows))
        else:
            only = design.candidates(cell)
            if len(only) != 1:
                raise ValueError(f"cell {cell} has {len(only)} candidates but no sweep seeds: give it sweep seeds "
                                 "or a single candidate")
            chosen[cell] = float(only[0])
    return _mark(design, table, chosen), chosen, diverged


def _entry(design: Design, workers: int, progress: bool) -> dict[str, Any]:
    """What the store keeps of a grid: the sweep, the choices, the diverged finals (a sweep run at its
    cell's choice among them) and (optionally) the summaries of the final runs the sweep did not train."""
    table, chosen, swept_diverged = _swept(design, workers, progress)
    swept = {store.canonical_json(c) for c in sweep_configs(design)}
    items = design.final_items(chosen)
    fresh = [(item, c) for item, c in zip(items, (design.final_config(*item) for item in items))
             if store.canonical_json(c) not in swept]
    results = design.train_runs([c for _, c in fresh], workers, progress,
                                skip=DIVERGED)
    entry = {"sweep": table, "chosen": [[*cell, value] for cell, value in chosen.items()],
             "diverged": [[*cell, seed] for cell, value, seed in swept_diverged if chosen[cell] == value]
             + [[*cell, seed] for ((cell, _, seed), _), result in zip(fresh, results) if result is None]}
    if design.summarise_finals:
        finals = _table(design, [i for i, _ in fresh], [c for _, c in fresh], results)
        entry["finals"] = _mark(design, finals, chosen) if len(finals) else table.iloc[:0]
    return entry


def build(design: Design, *, workers: int = 1, progress: bool = True, name: str | None = None,
          stored_only: bool = False, missing_hint: str = "", what: str = "grid") -> Outcome:
    """The grid of ``design``: its stored entry (built by sweep -> choose -> final runs when missing)
    and the final runs that finished. ``name`` records the grid under that name (``store.set_name``).
    ``stored_only``: never train; a grid or final run that is not stored raises LookupError naming
    ``what`` and ending with ``missing_hint``."""
    if stored_only:
        entry = store.load(design.kind, design.config)
        if entry is None:
            raise LookupError(f"the {what} is not in the results store. {missing_hint}".strip())
    else:
        # no lock: the grid's runs hold theirs, so two processes building it share them out
        entry = store.load_or_run(design.kind, design.config, lambda: _entry(design, workers, progress), lock=False)
    chosen = {tuple(row[:-1]): row[-1] for row in entry["chosen"]}
    diverged = [tuple(item) for item in entry["diverged"]]
    configs = {(*cell, seed): design.final_config(cell, value, seed)
               for cell, value, seed in design.final_items(chosen) if (*cell, seed) not in diverged}
    if stored_only:
        found = [store.load(design.run_kind, c) for c in configs.values()]
        if any(r is None for r in found):
            raise LookupError(f"{sum(r is None for r in found)} of the {what}'s {len(found)} chosen runs are not "
                              f"in the results store. {missing_hint}".strip())
    else:
        found = design.train_runs(list(configs.values()), workers, progress)
    if name is not None:
        store.set_name(name, design.kind, design.config)
    return Outcome(entry["sweep"], chosen, entry.get("finals"), diverged, configs, dict(zip(configs, found)))

