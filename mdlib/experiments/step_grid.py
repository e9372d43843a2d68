"""One step-size grid for every chapter: a validation sweep of candidate step sizes per cell, a choice
per cell (never on the test set), then the final runs of every seed at the chosen candidate.

A chapter describes its grid as a ``Design``: the cells in order, each cell's candidates and seeds,
the seeds its sweep trains, the run config of a sweep run and of a final run, a summary row per run,
how a cell's rows are reduced to one per candidate and how a candidate is chosen from them. ``build``
then runs it through the chapter's ``train_runs`` (``pool.run_many``) and the results store:

1. the sweep: every (cell, candidate, sweep seed) once, a diverged run (FloatingPointError) giving a
   row with NaN results instead of stopping the others;
2. the choice: ``choose(rows of the cell)`` for every cell the sweep trained (a ``Choice``: the chosen
   candidate and those tied with it, usually by ``tie_choice``), the only candidate of a cell it did
   not; a choice at an end of its cell's candidates grows the grid on that side (``Design.grow``
   candidates at most, each ``spacing`` times beyond the last) and the sweep and the choice run again,
   until every choice is strictly inside its candidates or its side has grown ``grow`` times;
3. the final runs: every seed of every cell at its chosen candidate (a final run whose config is a
   sweep run's is that run, read back), and with ``tied_finals`` every seed at each candidate tied with
   it, so that a verdict can be read at every tied choice; a diverged one is recorded as such, never
   trained again;
4. the grid's entry, kept by the store under the chapter's grid kind and config (so its fingerprint is
   the code of the chapter that declared the kind): the sweep table (``chosen`` and ``tied`` mark each
   cell's choice and its ties), each cell's candidates, the choices and their ties, the diverged final
   runs and (``summarise_finals``) the summary rows of the final runs the sweep did not train.

``build(..., stored_only=True)`` reads the entry and the final runs back and never trains.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from mdlib.runs import identity, store
from mdlib.runs.identity import RunId

__all__ = ["Choice", "DIVERGED", "Design", "Outcome", "TIE_Z", "build", "decided", "neutral_pick", "pending", "sweep",
           "sweep_configs", "tie_choice", "train"]

Cell = tuple  #: a cell's key, e.g. (layers, method) or (dataset, method)
Item = tuple  #: (cell, candidate, seed) of one run
TrainRuns = Callable[..., list]
#: What a run that diverged raises (mirror descent refuses a non-finite step).
DIVERGED = (FloatingPointError,)


#: How many paired standard errors apart two candidates' validation scores must be for one to rank above
#: the other (``tie_choice``): the two-sided 95 % normal quantile.
TIE_Z = 1.96


@dataclass(frozen=True)
class Choice:
    """A cell's choice: the chosen candidate ``value``, every candidate ``tied`` with the best one (the
    choice among them; in the grid's order) and the ``best``-scoring one."""

    value: float
    tied: tuple[float, ...]
    best: float

    @classmethod
    def of(cls, choice: "Choice | float") -> "Choice":
        """``choice`` itself, or the Choice of a bare value (nothing tied with it)."""
        if isinstance(choice, Choice):
            return choice
        return cls(float(choice), (float(choice),), float(choice))


def neutral_pick(values: Sequence[float], scores: Sequence[float]) -> int:
    """The index of the candidate a tie goes to, among tied candidates ``values`` (in the grid's order) with
    their ``scores`` (higher is better): the middle one, and of the two middle ones of an even count the
    higher-scoring (on equal scores, the one nearer the geometric middle of the tied values; then the
    smaller). The rule favours no side of the grid: reversing the order of the candidates picks the same
    one but for exact ties of score and distance."""
    n = len(values)
    if n == 0 or n != len(scores):
        raise ValueError(f"neutral_pick needs as many scores as candidates, at least one; got {n} and {len(scores)}")
    order = sorted(range(n), key=lambda i: values[i])
    if n % 2:
        return order[n // 2]
    low, high = order[n // 2 - 1], order[n // 2]
    if scores[low] != scores[high]:
        return low if scores[low] > scores[high] else high
    centre = (math.log(values[order[0]]) + math.log(values[order[-1]])) / 2 if min(values) > 0 else None
    if centre is not None:
        far = [abs(math.log(values[i]) - centre) for i in (low, high)]
        if far[0] != far[1]:
            return low if far[0] < far[1] else high
    return low


def tie_choice(values: Sequence[float], scores: Sequence[float], error: Callable[[int, int], float], *,
               eligible: Sequence[bool] | None = None, ranked: Sequence[bool] | None = None,
               z: float = TIE_Z) -> Choice:
    """The step-size rule of every grid. ``values``: a cell's candidates; ``scores``: each one's validation
    score (higher is better); ``error(i, j)``: the standard error of ``scores[i] - scores[j]``, paired (the
    same validation examples and seeds); ``eligible``: may be chosen (False: a run diverged); ``ranked``:
    ranks before the others (every run reached the stop rule).

    Among the eligible candidates (the ranked ones, when there are any), the best score; every candidate
    within ``z`` standard errors of it is tied with it (a difference that sampling alone makes, which
    another machine's runs would make otherwise); the choice among the tied ones is ``neutral_pick``'s.
    The test set plays no part."""
    n = len(values)
    eligible = [True] * n if eligible is None else [bool(x) for x in eligible]
    ranked = [True] * n if ranked is None else [bool(x) for x in ranked]
    pool = [i for i in range(n) if eligible[i] and ranked[i]] or [i for i in range(n) if eligible[i]]
    if not pool:
        raise ValueError("no candidate may be chosen: every one diverged")
    best = max(pool, key=lambda i: (scores[i], -abs(i - (n - 1) / 2)))
    tied_ = [i for i in pool if i == best or scores[best] - scores[i] <= 0 or scores[best] - scores[i] <= z * error(best, i)]
    tied_.sort(key=lambda i: values[i])
    chosen = tied_[neutral_pick([values[i] for i in tied_], [scores[i] for i in tied_])]
    return Choice(float(values[chosen]), tuple(float(values[i]) for i in tied_), float(values[best]))



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
    config: identity.Config
    cells: Sequence[Cell]
    candidates: Callable[[Cell], Sequence[float]]
    seeds: Callable[[Cell], int]
    sweep_seeds: Callable[[Cell], Sequence[int]]
    sweep_config: Callable[[Cell, float, int], identity.Config]
    final_config: Callable[[Cell, float, int], identity.Config]
    summary: Callable[[Cell, float, int, identity.Config, Mapping[str, Any] | None], dict[str, Any]]
    columns: tuple[str, ...]
    candidate: str
    choose: Callable[[pd.DataFrame], float]
    train_runs: TrainRuns
    reduce: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    summarise_finals: bool = False
    grow: int = 0
    spacing: float = 3.0
    tied_finals: bool = False

    def sweep_items(self, grids: Mapping[Cell, Sequence[float]] | None = None) -> list[Item]:
        """(cell, candidate, seed) of every sweep run, cell by cell, candidate by candidate (the cells'
        candidates ``grids``; None: their first ones, ``candidates``)."""
        return [(cell, c, s) for cell in self.cells for c in (grids or {}).get(cell, self.candidates(cell))
                for s in self.sweep_seeds(cell)]

    def final_items(self, chosen: Mapping[Cell, "Choice | float"]) -> list[Item]:
        """(cell, candidate, seed) of every final run, cell by cell: every seed at the chosen candidate, and
        with ``tied_finals`` at each candidate tied with it."""
        items = []
        for cell in self.cells:
            choice = Choice.of(chosen[cell])
            values = [choice.value] + ([v for v in choice.tied if v != choice.value] if self.tied_finals else [])
            items += [(cell, value, s) for value in values for s in range(self.seeds(cell))]
        return items

    def grown_at_most(self) -> int:
        """The most runs the grid's growth can add to those of its first candidates: ``grow`` candidates a
        side for every swept cell of two candidates or more, each trained at the cell's sweep seeds and,
        with ``tied_finals`` (a grown candidate may tie with the choice), at its other seeds' final runs
        (a final run whose config is a sweep run's is that run)."""
        total = 0
        for cell in self.cells:
            sweep_seeds, first = list(self.sweep_seeds(cell)), self.candidates(cell)[0]
            if not sweep_seeds or len(self.candidates(cell)) < 2:
                continue
            per = len(sweep_seeds)
            if self.tied_finals:
                swept = {identity.canonical_json(self.sweep_config(cell, first, s)) for s in sweep_seeds}
                per += sum(identity.canonical_json(self.final_config(cell, first, s)) not in swept
                           for s in range(self.seeds(cell)))
            total += 2 * self.grow * per
        return total

    def grown(self, cell: Cell, values: Sequence[float], choice: Choice, added: Mapping[str, int]) -> float | None:
        """The candidate to add to ``cell``'s ``values`` when ``choice`` sits at an end of them and that side
        (``added``: how many each side has had) may still grow (``grow``); None otherwise."""
        if len(values) < 2 or self.grow < 1:
            return None
        low, high = min(values), max(values)
        if choice.value == low and added.get("low", 0) < self.grow:
            return low / self.spacing
        if choice.value == high and added.get("high", 0) < self.grow:
            return high * self.spacing
        return None


@dataclass
class Outcome:
    """A built grid: ``sweep`` (the reduced sweep rows, ``chosen`` and ``tied`` marking each cell's choice
    and its ties), ``chosen`` ({cell: candidate}), ``choices`` ({cell: Choice}), ``candidates`` ({cell:
    the candidates tried, in order}), ``finals`` (summary rows of the final runs the sweep did not train;
    None unless ``summarise_finals``), ``diverged`` ((cell..., seed) of the diverged final runs at the
    choice), ``configs``/``results`` (the final runs at the choice that finished, keyed (cell..., seed)),
    ``tied_configs``/``tied_results`` (with ``tied_finals``: the finished final runs at every tied
    candidate, the choice's included, keyed (cell..., candidate, seed))."""

    sweep: pd.DataFrame
    chosen: dict[Cell, float]
    choices: dict[Cell, Choice]
    candidates: dict[Cell, list[float]]
    finals: pd.DataFrame | None
    diverged: list[tuple]
    configs: dict[tuple, identity.Config]
    results: dict[tuple, store.RunResult]
    tied_configs: dict[tuple, identity.Config]
    tied_results: dict[tuple, store.RunResult]


def sweep_configs(design: Design) -> list[identity.Config]:
    """The run configs of a grid's first sweep, in order (to train several grids' sweeps in one pool)."""
    return [design.sweep_config(*item) for item in design.sweep_items()]


def _table(design: Design, items: list[Item], configs: list, results: list) -> pd.DataFrame:
    """One ``summary`` row per run."""
    rows = [design.summary(*item, config, result) for item, config, result in zip(items, configs, results)]
    return pd.DataFrame(rows)


def _mark(design: Design, table: pd.DataFrame, choices: Mapping[Cell, Choice]) -> pd.DataFrame:
    """``table`` with ``chosen`` and ``tied``: whether its candidate is its cell's choice, or tied with it."""
    cells = list(zip(*(table[c] for c in design.columns)))
    values = table[design.candidate]
    return table.assign(chosen=[choices[cell].value == value for cell, value in zip(cells, values)],
                        tied=[value in choices[cell].tied for cell, value in zip(cells, values)])


def sweep(design: Design, *, workers: int = 1, progress: bool = True) -> tuple[pd.DataFrame, dict[Cell, Choice]]:
    """Train the sweep (diverged runs: NaN rows), growing the grid where a choice sits at its end, and
    choose: (the reduced sweep table with ``chosen`` and ``tied``, {cell: Choice})."""
    table, choices, _, _ = _swept(design, workers, progress)
    return table, choices


def _choose(design: Design, table: pd.DataFrame, cell: Cell, swept: bool) -> Choice:
    if not swept:
        only = design.candidates(cell)
        if len(only) != 1:
            raise ValueError(f"cell {cell} has {len(only)} candidates but no sweep seeds: give it sweep seeds "
                             "or a single candidate")
        return Choice.of(only[0])
    rows = table[np.logical_and.reduce([table[c] == v for c, v in zip(design.columns, cell)])]
    return Choice.of(design.choose(rows))


def _swept(design: Design, workers: int, progress: bool
           ) -> tuple[pd.DataFrame, dict[Cell, Choice], list[Item], dict[Cell, list[float]]]:
    """``sweep``, the items of the sweep runs that diverged and each cell's candidates."""
    grids = {cell: [float(c) for c in design.candidates(cell)] for cell in design.cells}
    added: dict[Cell, dict[str, int]] = {cell: {} for cell in design.cells}
    while True:
        items = design.sweep_items(grids)
        configs = [design.sweep_config(*item) for item in items]
        results = design.train_runs(configs, workers, progress, skip=DIVERGED)
        table = _table(design, items, configs, results)
        if design.reduce is not None:
            table = design.reduce(table)
        swept = {cell for cell, _, _ in items}
        choices = {cell: _choose(design, table, cell, cell in swept) for cell in design.cells}
        more = {cell: design.grown(cell, grids[cell], choices[cell], added[cell]) for cell in swept}
        more = {cell: value for cell, value in more.items() if value is not None}
        if not more:
            break
        for cell, value in more.items():
            side = "low" if value < min(grids[cell]) else "high"
            added[cell][side] = added[cell].get(side, 0) + 1
            grids[cell] = sorted(grids[cell] + [value])
    diverged = [item for item, result in zip(items, results) if result is None]
    return _mark(design, table, choices), choices, diverged, grids


def _entry(design: Design, workers: int, progress: bool) -> dict[str, Any]:
    """What the store keeps of a grid: the sweep, each cell's candidates, the choices and their ties, the
    diverged finals at the choice (a sweep run at its cell's choice among them) and (optionally) the
    summaries of the final runs the sweep did not train."""
    table, choices, swept_diverged, grids = _swept(design, workers, progress)
    swept = {identity.canonical_json(design.sweep_config(*item)) for item in design.sweep_items(grids)}
    items = design.final_items(choices)
    fresh = [(item, c) for item, c in zip(items, (design.final_config(*item) for item in items))
             if identity.canonical_json(c) not in swept]
    results = design.train_runs([c for _, c in fresh], workers, progress, skip=DIVERGED)
    entry = {"sweep": table, "chosen": [[*cell, c.value] for cell, c in choices.items()],
             "tied": [[*cell, list(c.tied), c.best] for cell, c in choices.items()],
             "candidates": [[*cell, grids[cell]] for cell in design.cells],
             "diverged": [[*cell, seed] for cell, value, seed in swept_diverged if choices[cell].value == value]
             + [[*cell, seed] for ((cell, value, seed), _), result in zip(fresh, results)
                if result is None and choices[cell].value == value],
             "diverged_tied": [[*cell, value, seed] for (cell, value, seed) in swept_diverged + [
                 item for (item, _), result in zip(fresh, results) if result is None] if choices[cell].value != value
                 and value in choices[cell].tied]}
    if design.summarise_finals:
        finals = _table(design, [i for i, _ in fresh], [c for _, c in fresh], results)
        entry["finals"] = _mark(design, finals, choices) if len(finals) else table.iloc[:0]
    return entry


def _choices(entry: Mapping[str, Any]) -> dict[Cell, Choice]:
    """The choices an entry records ({cell: Choice})."""
    tied = {tuple(row[:-2]): (tuple(float(v) for v in row[-2]), float(row[-1])) for row in entry.get("tied", [])}
    out = {}
    for row in entry["chosen"]:
        cell, value = tuple(row[:-1]), float(row[-1])
        ties, best = tied.get(cell, ((value,), value))
        out[cell] = Choice(value, ties, best)
    return out


def build(design: Design, *, workers: int = 1, progress: bool = True, name: str | None = None,
          stored_only: bool = False, missing_hint: str = "", what: str = "grid") -> Outcome:
    """The grid of ``design``: its stored entry (built by sweep -> choose -> final runs when missing)
    and the final runs that finished. ``name`` records the grid under that name (``store.set_name``).
    ``stored_only``: never train; a grid or final run that is not stored raises LookupError naming
    ``what`` and ending with ``missing_hint``."""
    if stored_only:
        entry = store.stored(RunId.of(design.kind, design.config), what, missing_hint)
    else:
        # no lock: the grid's runs hold theirs, so two processes building it share them out
        entry = store.load_or_run(RunId.of(design.kind, design.config), lambda: _entry(design, workers, progress), lock=False)
    choices = _choices(entry)
    candidates = {tuple(row[:-1]): [float(v) for v in row[-1]] for row in entry.get("candidates", [])}
    diverged = [tuple(item) for item in entry["diverged"]]
    finals = {(cell, value, seed): design.final_config(cell, value, seed) for cell, value, seed in design.final_items(choices)}
    diverged_tied = {(tuple(row[:-2]), float(row[-2]), row[-1]) for row in entry.get("diverged_tied", [])}
    wanted = {item: c for item, c in finals.items() if item not in diverged_tied
              and not (item[1] == choices[item[0]].value and (*item[0], item[2]) in diverged)}
    if stored_only:
        found = [store.load(RunId.of(design.run_kind, c)) for c in wanted.values()]
        if any(r is None for r in found):
            raise LookupError(f"{sum(r is None for r in found)} of the {what}'s {len(found)} final runs are not "
                              f"in the results store. {missing_hint}".strip())
    else:
        found = design.train_runs(list(wanted.values()), workers, progress, skip=DIVERGED)
    if name is not None:
        store.set_name(name, design.kind, design.config)
    done = {item: (c, r) for (item, c), r in zip(wanted.items(), found) if r is not None}
    at_choice = {(*cell, seed): cr for (cell, value, seed), cr in done.items() if value == choices[cell].value}
    return Outcome(entry["sweep"], {cell: c.value for cell, c in choices.items()}, choices,
                   candidates or {cell: [float(c) for c in design.candidates(cell)] for cell in design.cells},
                   entry.get("finals"), diverged, {k: c for k, (c, _) in at_choice.items()},
                   {k: r for k, (_, r) in at_choice.items()},
                   {(*cell, value, seed): c for (cell, value, seed), (c, _) in done.items()},
                   {(*cell, value, seed): r for (cell, value, seed), (_, r) in done.items()})


class _Missing(Exception):
    """Raised by a probe of the store (``pending``) at the first step whose runs are not all stored."""

    def __init__(self, configs: list):
        super().__init__(f"{len(configs)} runs not stored")
        self.configs = configs


def _probe(design: Design, failed: frozenset[str]) -> Design:
    """``design`` with a ``train_runs`` that trains nothing: stored runs are read back, a run in ``failed``
    (the canonical JSON of configs that diverged in this process) reads as diverged, and a step with any
    other run missing raises ``_Missing`` with them."""
    def stored_only(configs, workers=1, progress=True, skip=()):
        results, missing = [], []
        for config in configs:
            result = store.load(RunId.of(design.run_kind, config))
            if result is None and identity.canonical_json(config) not in failed:
                missing.append(config)
            results.append(result)
        if missing:
            raise _Missing(missing)
        return results

    return dataclasses.replace(design, train_runs=stored_only)


def pending(design: Design, failed: frozenset[str] = frozenset()) -> list[identity.Config]:
    """The runs the grid needs next that the store lacks: its sweep's, a grown sweep's once the choices
    ask for one, then its final runs; [] once every run it needs is stored (or diverged: ``failed``), or
    once the grid's entry is (``build`` then trains whatever final run is missing)."""
    if store.load(RunId.of(design.kind, design.config)) is not None:
        return []
    try:
        _entry(_probe(design, failed), 1, False)
    except _Missing as missing:
        return missing.configs
    return []


def decided(design: Design, failed: frozenset[str] = frozenset()) -> dict[Cell, Choice] | None:
    """The grid's choices once its sweep (grown where it grows) is stored, else None."""
    try:
        return _swept(_probe(design, failed), 1, False)[1]
    except _Missing:
        return None


def train(designs: Callable[[frozenset[str]], Sequence[Design]], train_runs: TrainRuns, *, workers: int = 1,
          progress: bool = True) -> None:
    """Train every run of several grids in as few pools of ``workers`` as their choices allow: each round
    trains, in one pool, every grid's ``pending`` runs (the sweeps, then the grown sweeps, then the
    finals), so that no worker waits for one grid while another has runs left. ``designs(failed)`` gives
    the grids of the round (a grid whose steps follow another's choice joins once that one is
    ``decided``); ``train_runs(configs, workers, progress, skip)`` trains (``pool.run_many``)."""
    failed: set[str] = set()
    while True:
        need: dict[str, identity.Config] = {}
        for design in designs(frozenset(failed)):
            for config in pending(design, frozenset(failed)):
                need.setdefault(identity.canonical_json(config), config)
        if not need:
            return
        results = train_runs(list(need.values()), workers, progress, skip=DIVERGED)
        failed |= {key for key, result in zip(need, results) if result is None}
