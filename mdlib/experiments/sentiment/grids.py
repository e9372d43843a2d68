"""Table 1's grids (kind ``e4-grid``): a step-size ``sweep``, the choice on validation, then the chosen
steps at every seed, as one function of one grid config, ``grid(config)``; ``built_grid(profile)`` reads
back the grid chapter 04 built.

A grid's runs are ``mdlib.experiments.sentiment.run``'s (``SentimentRun``, whose docstring lists what a
run's config holds). ``train_runs(configs)`` trains them (reading back those the store holds) and keeps
their final weights; ``trained_model(config, result)`` rebuilds a run's model and ``test_correct`` its
per-sentence predictions.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import torch

from mdlib.experiments import analysis, paper, paths, step_grid, train
from mdlib.experiments.methods import method, method_key
from mdlib.experiments.sentiment.run import KIND, SentimentRun, build, initial_model, run_config
from mdlib.experiments.sentiment.tokens import collate, splits
from mdlib.experiments.stats import paired_se
from mdlib.models import SETUPS, EncoderClassifier
from mdlib.runs import identity, pool, store
from mdlib.runs.identity import RunId

__all__ = ["ADAM_STEP", "GRIDS", "GRID_KIND", "Grid", "PAPER_STEP_SIZES", "SWEEP_SEEDS", "SentimentGrid",
           "built_config", "built_grid", "cell_table", "chapter_grids", "chapter_runs", "choose", "grid", "grid_name",
           "movement", "predictions", "reference_step", "run_row", "seeds_of", "stored_correct", "sweep",
           "test_correct", "train_grids", "train_runs", "trained_model"]

#: Adam's reference step size (torch's default), for Adam as an extra column.
ADAM_STEP = 1e-3


#: The paper's step sizes for IMDb (``paper.SENTIMENT_STEP_SIZES``): layers -> method key -> lr.
PAPER_STEP_SIZES = paper.SENTIMENT_STEP_SIZES


def train_runs(configs: list[SentimentRun], workers: int = 1, progress: bool = True,
               skip: tuple[type[BaseException], ...] = ()) -> list[store.RunResult | None]:
    """The stored result of each run (history + final weights), the missing ones trained ``workers``
    at a time (None for a run that raised one of ``skip``)."""
    return pool.run_many(KIND, configs, build, extras=train.model_state, workers=workers, skip=skip, progress=progress)


def trained_model(config: SentimentRun, result: Mapping[str, Any]) -> EncoderClassifier:
    """The model of a stored run with its final weights, in eval mode."""
    return train.load_model_state(initial_model(config), result).eval()


@torch.no_grad()
def test_correct(config: SentimentRun, result: Mapping[str, Any], batch_size: int = 100,
                 split: str = "test") -> np.ndarray:
    """Whether the run's final model (eval mode) classifies each example of the test split (or ``split``,
    e.g. "validation") correctly, in the split's order: the per-example predictions behind its last
    accuracy there (their mean), computed in the evaluation's batches (``by_length``)."""
    test = splits(config.dataset, config.split_seed, config.max_length)[split]
    model = trained_model(config, result)
    order = sorted(range(len(test)), key=lambda i: len(test.ids[i]))
    correct = np.zeros(len(test), dtype=bool)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        inputs, labels = collate([test[i] for i in chunk])
        correct[chunk] = ((model(**inputs) > 0).float() == labels).numpy()
    return correct


def predictions(configs: Mapping[tuple[int, str, int], SentimentRun],
                results: Mapping[tuple[int, str, int], Mapping[str, Any]]) -> pd.DataFrame:
    """``test_correct`` of each run keyed (layers, method, seed): one row per (run, test example) with
    layers, method, seed, example (its index in the test split) and correct (0 or 1): what a two-way
    interval over seeds and examples needs (``estimates``)."""
    frames = [pd.DataFrame({"layers": L, "method": key, "seed": seed, "example": np.arange(len(correct)),
                            "correct": correct.astype(int)})
              for (L, key, seed), config in configs.items()
              for correct in [test_correct(config, results[L, key, seed])]]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["layers", "method", "seed", "example", "correct"])


def _history_table(configs: list[SentimentRun], results: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (run, epoch): layers, method, seed and ``fit``'s history columns (lr included)."""
    frames = []
    for c, r in zip(configs, results):
        h = r["history"].copy()
        h.insert(0, "layers", c.model.layers)
        h.insert(1, "method", method_key(c.optimizer.name, c.optimizer.p))
        h.insert(2, "seed", c.fit.seed)
        h["lr"] = c.optimizer.lr
        frames.append(h)
    return pd.concat(frames, ignore_index=True)


def reference_step(layers: int, key: str) -> float:
    """The step size a method's multiples refer to: the paper's (PAPER_STEP_SIZES) for the l_p methods
    of Table 1, ADAM_STEP for Adam."""
    if key == "adam":
        return ADAM_STEP
    if key not in PAPER_STEP_SIZES.get(layers, {}):
        raise ValueError(f"no reference step size for method {key!r} at {layers} layers: the paper's table has "
                         f"{sorted(PAPER_STEP_SIZES)} layers and methods {sorted(PAPER_STEP_SIZES[3])}, plus 'adam'")
    return PAPER_STEP_SIZES[layers][key]


@dataclass
class Grid:
    """The runs of a Table 1 grid (``grid``): every candidate step size at the sweep seeds, the chosen
    one at every seed.

    ``config``: the grid's config (``grid``). ``runs``: one row per run: layers, method, multiple (of
    the reference step), lr, seed, epochs, reached (training accuracy >= the stop rule), train_accuracy
    (last epoch), best_test and last_test (test accuracy, best over epochs and at the last epoch),
    validation (at the end), chosen, tied (the candidate ties with the choice), diverged (a run mirror
    descent refused as overflowing: NaN results). ``history``: one row per (chosen run, epoch).
    ``chosen``: {(layers, method): multiple}; ``choices``: {(layers, method): step_grid.Choice};
    ``candidates``: {(layers, method): the multiples tried}. ``configs``/``results``: the chosen runs',
    keyed (layers, method, seed); ``tied_configs``/``tied_results``: with ``tied_finals``, the runs of every
    seed at every tied multiple, keyed (layers, method, multiple, seed).
    """

    config: SentimentGrid
    runs: pd.DataFrame
    history: pd.DataFrame
    chosen: dict[tuple[int, str], float]
    configs: dict[tuple[int, str, int], SentimentRun]
    results: dict[tuple[int, str, int], store.RunResult]
    choices: dict[tuple[int, str], step_grid.Choice] = field(default_factory=dict)
    candidates: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    tied_configs: dict[tuple[int, str, float, int], SentimentRun] = field(default_factory=dict)
    tied_results: dict[tuple[int, str, float, int], store.RunResult] = field(default_factory=dict)

    def models(self) -> dict[tuple[int, str, int], EncoderClassifier]:
        """{(layers, method, seed): trained model} of the chosen runs, in eval mode."""
        return {key: trained_model(c, self.results[key]) for key, c in self.configs.items()}


def run_row(cell: tuple[int, str], multiple: float, seed: int, config: SentimentRun,
             result: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's row of ``Grid.runs`` (result None: diverged); ``seconds``: the training's, summed over its epochs."""
    layers, key = cell
    row = {"layers": layers, "method": key, "multiple": multiple, "lr": config.optimizer.lr,
           "seed": seed, "diverged": result is None}
    if result is None:
        return row | {"reached": False}
    h = result["history"]
    return row | {"epochs": int(h.epoch.max()), "train_accuracy": float(h.train_accuracy.iloc[-1]),
                  "reached": bool(h.train_accuracy.iloc[-1] >= config.fit.stop_train_accuracy),
                  "best_test": float(h.test_accuracy.max()), "last_test": float(h.test_accuracy.iloc[-1]),
                  "validation": float(result["validation_accuracy"]),
                  "validation_n": int(result["validation_n"]), "seconds": float(h.seconds.sum())}


#: The seeds (0..n-1) a grid's sweep trains at each candidate step of a cell with several: a step that
#: reaches the stop rule at one seed may collapse or overflow at the next (the pilots).
SWEEP_SEEDS = 2


def choose(candidates: pd.DataFrame, correct: Callable[[int, str, float, int], np.ndarray]) -> step_grid.Choice:
    """The choice among one cell's sweep runs (``Grid.runs`` rows, every sweep seed of every candidate) by
    ``step_grid.tie_choice``: candidates whose runs all reached the stop rule rank before the others; a
    candidate with a diverged run is never chosen; among the rest, the best mean validation accuracy,
    every candidate tied with it within ``step_grid.TIE_Z`` paired standard errors, and the tie's neutral
    pick. The paired error of two candidates is that of their difference on the same validation sentences
    at the same seeds, over both samples (``stats.paired_se``), from each run's per-sentence
    predictions (``correct(layers, method, multiple, seed)``). The test split plays no part."""
    per = candidates.groupby("multiple").agg(diverged=("diverged", "any"), reached=("reached", "all"),
                                             validation=("validation", "mean"), lr=("lr", "first"))
    if per.diverged.all():
        cell = candidates.iloc[0]
        raise ValueError(f"every candidate step size diverged for {cell.method} at {cell.layers} layers "
                         f"(multiples {sorted(candidates.multiple.unique())}): try smaller ones")
    layers, key = int(candidates.layers.iloc[0]), str(candidates.method.iloc[0])
    seeds = sorted(set(candidates.seed))
    tables = {m: np.stack([correct(layers, key, m, seed) for seed in seeds]).astype(float)
              for m in per.index[~per.diverged]}
    values = list(per.index)

    def error(i: int, j: int) -> float:
        return paired_se(tables[values[i]] - tables[values[j]])

    return step_grid.tie_choice(values, list(per.validation), error, eligible=list(~per.diverged),
                                ranked=list(per.reached))


GRID_KIND = identity.kind("e4-grid", __name__)


@dataclass(frozen=True)
class SentimentGrid(identity.Config):
    """A Table 1 grid config (``grid``): the shared run settings (``run_config``: dataset, max_length,
    train_size, width, setup, epochs, embedding_std), then what the grid spans: layers (list), methods (list of method
    keys), seeds (one count, or {method: count}), multiples ({method: [multiples of the reference
    step]}). ``to_dict()`` is what the store keeps; a mapping with exactly these fields converts with
    ``SentimentGrid.of``."""

    WHAT = "a Table 1 grid config"
    OMIT_AT_DEFAULT = ("embedding_std", "grow", "tied_finals")

    dataset: str
    max_length: int
    train_size: int | None
    width: int
    setup: str
    epochs: int
    layers: list[int]
    methods: list[str]
    seeds: int | Mapping[str, int]
    multiples: Mapping[str, list[float]]
    embedding_std: float | None = None
    grow: int = 0
    tied_finals: bool = False

    def __post_init__(self) -> None:
        without = [k for k in self.methods if k not in self.multiples]
        if without:
            raise ValueError(f"no step-size multiples for {without}: give each method a list in multiples")
        for key in self.methods:
            method(key)
        seeds = self.seeds
        if isinstance(seeds, Mapping):
            lacking = [k for k in self.methods if k not in seeds]
            if lacking:
                raise ValueError(f"seeds gives no count for {lacking}: give every method one, or one integer for all")
        counts = seeds.values() if isinstance(seeds, Mapping) else [seeds]
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in counts):
            raise ValueError(f"seeds must be an integer >= 1 or {{method: integer >= 1}}, got {seeds!r}")

    def seeds_of(self, key: str) -> int:
        """The number of seeds of method ``key``."""
        return int(self.seeds[key] if isinstance(self.seeds, Mapping) else self.seeds)

    def run(self, cell: tuple[int, str], multiple: float, seed: int) -> SentimentRun:
        """The run config of cell (layers, method) at ``multiple`` times the reference step, with ``seed``."""
        layers, key = cell
        name, p = method(key)
        return run_config(layers=layers, optimizer=name, p=p, lr=multiple * reference_step(layers, key), seed=seed,
                          dataset=self.dataset, max_length=self.max_length, train_size=self.train_size,
                          width=self.width, setup=self.setup, epochs=self.epochs, embedding_std=self.embedding_std)

    def design(self) -> step_grid.Design:
        """The grid as a ``grid.Design``: seeds 0..SWEEP_SEEDS-1 of every cell at each candidate (every seed
        of a cell with one candidate: nothing to choose there), the sweep's runs being final runs too; the
        choice by ``choose``; a final run that diverges is recorded (``diverged``), never trained again."""
        def sweep_seeds(cell: tuple[int, str]) -> range:
            seeds = self.seeds_of(cell[1])
            return range(seeds if len(self.multiples[cell[1]]) == 1 else min(SWEEP_SEEDS, seeds))

        return step_grid.Design(
            kind=GRID_KIND, run_kind=KIND, config=self,
            cells=[(L, key) for L in self.layers for key in self.methods],
            candidates=lambda cell: self.multiples[cell[1]], seeds=lambda cell: self.seeds_of(cell[1]),
            sweep_seeds=sweep_seeds, sweep_config=self.run, final_config=self.run, summary=run_row,
            columns=("layers", "method"), candidate="multiple", choose=functools.partial(choose, correct=self.correct),
            train_runs=train_runs, summarise_finals=True, grow=self.grow, tied_finals=self.tied_finals)

    def correct(self, layers: int, key: str, multiple: float, seed: int, split: str = "validation") -> np.ndarray:
        """The per-sentence correctness on ``split`` of the stored run (layers, ``key``, ``multiple``, ``seed``)."""
        return stored_correct(self.run((layers, key), multiple, seed), split)


def stored_correct(config: SentimentRun, split: str = "validation") -> np.ndarray:
    """``test_correct`` on ``split`` of the stored run of ``config`` (LookupError when it is not stored),
    computed once per process and stored entry: a grid's choice reads it at every round of its training
    and again when the grid is built."""
    run = RunId.of(KIND, config)
    if not store.exists(run):
        raise LookupError(f"run {identity.canonical_json(config)} is not stored: train its grid first")
    return _stored_correct(str(store.entry_dir(run)), identity.canonical_json(config), split)


@functools.lru_cache(maxsize=None)
def _stored_correct(path: str, key: str, split: str) -> np.ndarray:
    config = SentimentRun.from_dict(json.loads(key))
    return test_correct(config, store.stored(RunId.of(KIND, config), hint="train its grid first"), split=split)


#: Chapter 04's grids: the authors' setup (the replication) and one named variation of it.
GRIDS = ("replication", "variation")


def chapter_grids(*, dataset: str, max_length: int, train_size: int | None, width: int, setup: str, epochs: int,
                  layers: list[int], methods: list[str], seeds: int | Mapping[str, int],
                  step_multiples: Mapping[str, list[float]], variation_setup: str, variation_methods: list[str],
                  variation_seeds: int | Mapping[str, int], variation_epochs: int,
                  variation_multiples: Mapping[str, list[float]], analysed: str = "variation", grow: int = 0,
                  tied_finals: bool = False, **_: Any) -> tuple[SentimentGrid, SentimentGrid]:
    """Chapter 04's grids from its parameters (other parameters are ignored): the replication's (Table 1 in
    ``setup``), and the variation's at the first depth with ``variation_setup``'s initialization, which
    must differ from ``setup``, its grid growing ``grow`` times past an end and (``tied_finals``) training
    every seed at each tied step. ``analysed`` (the grid chapters 05 and 06 read) must name one of GRIDS."""
    if analysed not in GRIDS:
        raise ValueError(f"analysed={analysed!r}: choose one of {', '.join(GRIDS)}")
    if variation_setup == setup:
        raise ValueError(f"variation_setup={variation_setup!r} is the replication's own setup: choose another one "
                         f"of {', '.join(s for s in SETUPS if s != setup)}")
    table1 = SentimentGrid(dataset=dataset, max_length=max_length, train_size=train_size, width=width, setup=setup,
                           epochs=epochs, layers=list(layers), methods=list(methods), seeds=seeds,
                           multiples=step_multiples)
    return table1, SentimentGrid(dataset=dataset, max_length=max_length, train_size=train_size, width=width,
                                 setup=variation_setup, epochs=variation_epochs, layers=list(layers[:1]),
                                 methods=list(variation_methods), seeds=variation_seeds,
                                 multiples=variation_multiples, grow=grow, tied_finals=tied_finals)


def chapter_runs(grids: Mapping[str, "Grid"], analysed: str) -> pd.DataFrame:
    """The runs of chapter 04's grids ({name in GRIDS: Grid}) in one table (``Grid.runs``' columns), led by
    ``grid``, ``setup`` and ``analysed`` (the runs of the grid chapters 05 and 06 analyse)."""
    if analysed not in grids:
        raise ValueError(f"analysed={analysed!r} names no grid of this chapter: choose one of {sorted(grids)}")
    frames = [g.runs.assign(grid=name, setup=g.config.setup, analysed=name == analysed) for name, g in grids.items()]
    runs = pd.concat(frames, ignore_index=True)
    lead = ["grid", "setup", "analysed"]
    return runs[lead + [c for c in runs.columns if c not in lead]]


def seeds_of(config: SentimentGrid | Mapping[str, Any], key: str) -> int:
    """The number of seeds of method ``key`` in a grid config (``seeds``: one integer, or per method)."""
    return SentimentGrid.of(config).seeds_of(key)


def train_grids(configs: list[SentimentGrid | Mapping[str, Any]], *, workers: int = 1, progress: bool = True) -> None:
    """Train the sweep runs of several grid configs (``grid``) in one pool of ``workers`` processes, so
    that no worker waits for another grid's runs; ``grid`` then reads them from the store (and trains
    the remaining seeds of cells that had several candidates)."""
    designs = [SentimentGrid.of(config).design() for config in configs]
    train_runs([c for design in designs for c in step_grid.sweep_configs(design)], workers,
               skip=step_grid.DIVERGED, progress=progress)


def sweep(config: SentimentGrid | Mapping[str, Any], *, workers: int = 1, progress: bool = True) -> pd.DataFrame:
    """The step-size sweep of a grid (``grid``'s config): seeds 0..SWEEP_SEEDS-1 of every cell at each
    candidate step ``multiples[method]`` times the reference step (``reference_step``), and every seed
    of a cell with a single candidate (nothing to choose there). One row per run (``Grid.runs``' columns, with
    ``chosen``: the candidate ``choose`` picks, by the validation split at the stop rule)."""
    return step_grid.sweep(SentimentGrid.of(config).design(), workers=workers, progress=progress)[0]


def grid(config: SentimentGrid | Mapping[str, Any], *, workers: int = 1, progress: bool = True,
         name: str | None = None, stored_only: bool = False, missing_hint: str = "") -> Grid:
    """Table 1's runs: ``sweep`` chooses a step per cell (layers, method), then the remaining seeds train
    at the chosen step. Every run evaluates the test split after each epoch (the paper's "best test
    accuracy over epochs") and the validation split once, at the end; the test split plays no part in
    the choice.

    ``config``: a ``SentimentGrid``, or a mapping with exactly its fields. The store keeps the grid
    under its ``to_dict()`` (kind ``GRID_KIND``) and each run under its run config; ``name`` records
    the finished grid under that name (``store.set_name``, see ``built_grid``). ``stored_only``: read
    the grid back, never train; a grid or run that is not stored raises LookupError ending with
    ``missing_hint``."""
    typed = SentimentGrid.of(config)
    design = typed.design()
    built = step_grid.build(design, workers=workers, progress=progress, name=name, stored_only=stored_only,
                              missing_hint=missing_hint, what="Table 1 grid")
    order = {cell: i for i, cell in enumerate(design.cells)}
    runs = pd.concat([t for t in (built.sweep, built.finals) if len(t)], ignore_index=True)
    runs = (runs.assign(order=[order[cell] for cell in zip(runs.layers, runs.method)])
            .sort_values(["order", "seed", "multiple"], kind="stable").drop(columns="order").reset_index(drop=True))
    configs = list(built.configs.values())
    return Grid(typed, runs, _history_table(configs, list(built.results.values())), built.chosen,
                built.configs, built.results, built.choices, built.candidates, built.tied_configs,
                built.tied_results)


def cell_table(runs_table: pd.DataFrame, setup: str) -> pd.DataFrame:
    """Table 1 from a grid's runs (``Grid.runs``) in ``setup``: one row per cell (layers, method) of the
    chosen runs, in the grid's order: the setup, runs, reached (how many met the stop rule), epochs (mean), the test accuracy
    at the last epoch, the stop rule's epoch where it was reached (``test``: mean, ``test_std``), the best
    test accuracy over epochs (``best``, ``best_std``: the paper's metric, selected on the test set),
    the validation accuracy at the end, the chosen multiple and step, and the paper's value and epochs."""
    chosen = runs_table[runs_table.chosen.astype(bool)]
    cells = chosen.groupby(["layers", "method"], sort=False).agg(
        runs=("seed", "count"), reached=("reached", "sum"), epochs=("epochs", "mean"),
        test=("last_test", "mean"), test_std=("last_test", "std"), best=("best_test", "mean"),
        best_std=("best_test", "std"), validation=("validation", "mean"), multiple=("multiple", "first"),
        lr=("lr", "first")).reset_index()
    cells["paper"] = [paper.TABLE_1.get(L, {}).get(k, np.nan) for L, k in zip(cells.layers, cells.method)]
    cells["paper_epochs"] = [paper.EPOCHS_TO_STOP.get(L, {}).get(k, np.nan) for L, k in zip(cells.layers, cells.method)]
    cells.insert(0, "setup", setup)
    return cells


def movement(grid: "Grid", layers: int | None = None) -> pd.DataFrame:
    """How far training moved each part of each chosen model (``analysis.relative_movement``,
    ||W - W(0)|| / ||W(0)|| per parameter group of ``EncoderClassifier.parameter_groups``), against the
    run's own initialization: one row per (layers, method, seed, group)."""
    rows = []
    for (L, key, seed), config in grid.configs.items():
        if layers is not None and L != layers:
            continue
        model = trained_model(config, grid.results[L, key, seed])
        moved = analysis.relative_movement(model, initial_model(config), model.parameter_groups())
        rows += [{"layers": L, "method": key, "seed": seed, "group": group, "movement": value}
                 for group, value in moved.items()]
    return pd.DataFrame(rows)


def grid_name(profile: str, variant: str | None = None) -> str:
    """The name chapter 04 records the grid chapters 05 and 06 analyse under when it builds it at
    ``profile`` (its parameter ``analysed``: the replication's or the variation's): the book's own, or,
    for an execution into a variant's folder (``variant``: its id), that variant's, so a variant never
    changes the grid the book's chapters read."""
    return f"table1.{profile}" + (f".{variant}" if variant else "")


def built_config(profile: str, variant: str | None = None) -> SentimentGrid | None:
    """The config of the Table 1 grid chapter 04 last built at ``profile`` (``grid_name``): the one of
    ``variant``'s folder when there is one, else the book's; None when chapter 04 has built none."""
    record = (variant and store.named(grid_name(profile, variant))) or store.named(grid_name(profile))
    return SentimentGrid.from_dict(record[1]) if record is not None and record[0] == GRID_KIND else None


def built_grid(profile: str, depth: int | None = None, variant: str | None = None) -> Grid:
    """The Table 1 grid chapter 04 last built at ``profile`` (``grid_name``), read from the results
    store and never trained: the one chapter 04 built into the folder of ``variant`` when there is one
    (a variant of 04 and 05 executed into one ``--output-dir``), else the book's; LookupError, saying
    how to build it, when it is not there. ``depth``: the number of layers the caller reads,
    checked to be one of the grid's."""
    hint = f"Build it with `python -m mdlib run 04 --profile {profile}` (chapter 04 at that profile)."
    config = built_config(profile, variant)
    if config is None:
        raise LookupError(f"chapter 04 has not built a Table 1 grid at profile {profile!r} in {paths.runs_dir()}. "
                          f"{hint}")
    if depth is not None and depth not in config.layers:
        raise ValueError(f"depth={depth} is not one of the layers {config.layers} of the Table 1 grid "
                         f"chapter 04 built at profile {profile!r}")
    return grid(config, stored_only=True, missing_hint=hint)
