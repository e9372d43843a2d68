"""The step-size guide (chapter 09): which lr for which p, measured by a small lr x p sweep.

One config, ``StepSizeGrid`` (the store hashes its ``to_dict()``), names the whole sweep: a tiny
sentiment encoder (``EncoderClassifier``, BERT-like "modern" initialization) trained for a fixed number
of epochs on a seeded, stratified subset of the offline Rotten Tomatoes training split, with the batch's
mean binary cross-entropy, and evaluated once, after training, on the validation split (the test split
is never read). Every method is one cell of a ``mdlib.experiments.step_grid`` design:

* mirror descent at each exponent p of ``ps`` at the step sizes ``multiples`` times the centre
  ``matched_lr(sgd_lr, p, scale)`` (``mdlib.mirror.matched_lr``): every p's grid spans the same
  first-step movements of an entry of magnitude ``scale`` (p = 2 is SGD, centred on ``sgd_lr``);
* AdamW at ``adamw_multiples`` times ``adamw_lr``.

A cell's choice is its candidate with the lowest validation loss (mean over ``seeds``); a run that
overflowed (mirror descent raises FloatingPointError) or ended with a non-finite loss is never chosen,
and is recorded as such in the grid's stored entry, so a re-render never trains it again. Then
torch's SGD trains at the chosen lr of p = 2, as a reference (the same update as mirror descent at
p = 2, by another implementation).

    config = step_sizes.chapter_config(ps=[1.1, 1.75, 2.0, 3.0], multiples=[0.1, 1, 10], ...)
    result = step_sizes.sweep(config, workers=2)
    result.runs   # one row per run (method, p, lr, outcome, validation loss and accuracy, ...)
    result.best   # one row per method: the chosen lr next to matched_lr's prediction

A run config (``StepRun``; the store hashes its ``to_dict()``) is that of ``mdlib.experiments.sentiment`` but
for the fit (no stop rule, the mean loss) and its evaluation (validation only)::

    {"dataset": "rotten_tomatoes", "split_seed": 0, "max_length": 64, "train_size": 4000,
     "model": {"width": 16, "layers": 1, "heads": 2, "mlp": 64, "dropout": 0.1, "setup": "modern"},
     "optimizer": {"name": "md", "lr": 0.04, "p": 1.75},
     "fit": {"epochs": 4, "batch_size": 32, "seed": 0, "loss": "binary", "reduction": "mean", "pool": 16}}

Each run keeps, beside its history and validation numbers, its final weights except the token
embedding (the bulk of the model, in the store many times over): ``movement`` compares them with the
run's initialization, per parameter group.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd
import torch

from mdlib.experiments import analysis, methods, pool, sentiment_run, store, train
from mdlib.experiments import step_grid
from mdlib.experiments.train import Optimizer
from mdlib.experiments.sentiment_run import TextModel
from mdlib.mirror import check_p, matched_lr
from mdlib.models import EncoderClassifier, check_setup

__all__ = ["GRID_KIND", "KIND", "MOVEMENT_GROUPS", "OUTCOMES", "StepRun", "StepSizeGrid", "StepSizes",
           "best_table", "build", "chapter_config", "choose", "first_step_table", "initial_model", "kept_state",
           "matrix_scale", "movement", "summary_row", "sweep", "train_runs", "work"]

KIND = store.kind("e9-step-sizes", __name__)
GRID_KIND = store.kind("e9-step-grid", __name__)
#: How a run ended: it finished with a finite validation loss, mirror descent refused a step that
#: overflowed (FloatingPointError), or it finished with a non-finite loss (it diverged).
OUTCOMES = ("finished", "overflow", "non-finite loss")
#: The parameter groups ``movement`` measures: ``EncoderClassifier.parameter_groups`` without the token
#: embedding (not kept), the position embedding standing for the small-magnitude embeddings.
MOVEMENT_GROUPS = ("positions", "attention", "mlp", "norms", "classifier")
_TOKEN = "token.weight"
_STATE = "state."


@dataclass(frozen=True)
class StepRun(store.Config):
    """A run config of the sweep (the module docstring); ``to_dict()`` is what the store keeps (of the fit
    settings: all but those of ``OMIT_AT_DEFAULT`` where they hold their defaults; no stop rule: a fixed
    number of epochs)."""

    OMIT_AT_DEFAULT = ("fit.stop_train_accuracy", "fit.eval_every")

    dataset: str
    split_seed: int
    max_length: int
    train_size: int
    model: TextModel
    optimizer: Optimizer
    fit: train.FitOptions

    def __post_init__(self) -> None:
        check_setup(self.model.setup)
        if self.model.width % self.model.heads:
            raise ValueError(f"width {self.model.width} is not divisible by {self.model.heads} heads")


@dataclass(frozen=True)
class StepSizeGrid(store.Config):
    """The sweep's config (the module docstring): the task (data, ``model``: the runs' ``TextModel``,
    epochs, batch, seeds), the
    exponents ``ps`` (2, SGD, among them: it is the reference of the predictions), the centre ``sgd_lr``
    and the ``scale`` that ``matched_lr`` centres each p's grid with, the grid's ``multiples``, and AdamW's
    centre ``adamw_lr`` and ``adamw_multiples``."""

    WHAT = "a step-size sweep config"

    dataset: str
    max_length: int
    train_size: int
    model: TextModel
    epochs: int
    batch_size: int
    seeds: int
    ps: list[float]
    sgd_lr: float
    scale: float
    multiples: list[float]
    adamw_lr: float
    adamw_multiples: list[float]

    def __post_init__(self) -> None:
        for p in self.ps:
            check_p(p)
        if 2.0 not in [float(p) for p in self.ps]:
            raise ValueError(f"ps={self.ps} must include 2 (SGD): matched_lr predicts the other exponents' step "
                             "sizes from its best one")
        if len({f"{float(p):g}" for p in self.ps}) != len(self.ps):
            raise ValueError(f"ps={self.ps} names an exponent twice")
        for name in ("seeds", "epochs", "batch_size", "train_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.train_size < self.batch_size:
            raise ValueError(f"train_size={self.train_size} is smaller than one batch ({self.batch_size})")
        for name in ("multiples", "adamw_multiples"):
            values = getattr(self, name)
            if not values or any(not (isinstance(m, (int, float)) and math.isfinite(m) and m > 0) for m in values):
                raise ValueError(f"{name} must be a non-empty list of finite numbers > 0, got {values!r}")
        for name in ("sgd_lr", "adamw_lr", "scale"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        matched_lr(self.sgd_lr, max(self.ps, key=float), self.scale)  # a scale that overflows: its error now

    @property
    def methods(self) -> list[str]:
        """The cells' method keys: each exponent ("1.1", "2", ...), then "adamw"."""
        return [methods.method_key("md", float(p)) for p in self.ps] + ["adamw"]

    def centre(self, key: str) -> float:
        """The step size a method's multiples refer to: ``matched_lr(sgd_lr, p, scale)``, or ``adamw_lr``."""
        name, p = methods.method(key)
        return self.adamw_lr if name == "adamw" else matched_lr(self.sgd_lr, p, self.scale)

    def candidates(self, key: str) -> list[float]:
        return list(self.adamw_multiples if key == "adamw" else self.multiples)

    def run(self, key: str, lr: float, seed: int) -> StepRun:
        """The run config of method ``key`` ("1.1", "adamw", "sgd") at step size ``lr`` with ``seed``."""
        name, p = methods.method(key)
        return StepRun(self.dataset, 0, self.max_length, self.train_size,
                       self.model,
                       Optimizer(name, float(lr), p),
                       train.FitOptions(epochs=self.epochs, batch_size=self.batch_size, seed=seed, loss="binary",
                                        reduction="mean", pool=16))

    def design(self) -> step_grid.Design:
        """The sweep as a ``grid.Design``: one cell per method, every candidate at every seed; the final
        runs are the sweep's at the chosen candidate (nothing more is trained)."""
        def config(cell: tuple[str], multiple: float, seed: int) -> StepRun:
            return self.run(cell[0], multiple * self.centre(cell[0]), seed)

        return step_grid.Design(
            kind=GRID_KIND, run_kind=KIND, config=self, cells=[(key,) for key in self.methods],
            candidates=lambda cell: self.candidates(cell[0]), seeds=lambda cell: self.seeds,
            sweep_seeds=lambda cell: range(self.seeds), sweep_config=config, final_config=config,
            summary=self._summary, columns=("method",), candidate="multiple", choose=choose, train_runs=train_runs)

    def sgd_equivalent(self, key: str, lr: float) -> float:
        """The SGD step size whose first step moves an entry of magnitude ``scale`` as far as ``lr`` does
        at method ``key`` (the inverse of ``matched_lr``; NaN for AdamW, whose steps do not scale so)."""
        name, p = methods.method(key)
        if name == "adamw":
            return math.nan
        return lr if name == "sgd" else lr / matched_lr(1.0, p, self.scale)

    def _summary(self, cell: tuple[str], multiple: float, seed: int, config: StepRun,
                 result: Mapping[str, Any] | None) -> dict[str, Any]:
        return summary_row(self, cell[0], multiple, seed, config, result)

    def work(self) -> tuple[int, int]:
        """(training runs, optimizer steps in all) of the sweep and its SGD reference runs (``work``)."""
        return work(dataset=self.dataset, train_size=self.train_size, epochs=self.epochs, batch_size=self.batch_size,
                    seeds=self.seeds, ps=self.ps, multiples=self.multiples, adamw_multiples=self.adamw_multiples)


def summary_row(grid: StepSizeGrid, key: str, multiple: float, seed: int, config: StepRun,
                result: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's row of ``StepSizes.runs`` (result None: the run overflowed)."""
    name, p = methods.method(key)
    lr = float(config.optimizer.lr)
    row = {"method": key, "optimizer": name, "p": math.nan if p is None else p, "multiple": float(multiple),
           "lr": lr, "sgd_equivalent_lr": grid.sgd_equivalent(key, lr), "seed": seed}
    if result is None:
        return row | {"outcome": "overflow", "diverged": True, "train_loss": math.nan, "train_accuracy": math.nan,
                      "validation_loss": math.nan, "validation_accuracy": math.nan}
    h = result["history"]
    loss = float(result["validation_loss"])
    finite = math.isfinite(loss) and math.isfinite(float(h.train_loss.iloc[-1]))
    return row | {"outcome": "finished" if finite else "non-finite loss", "diverged": not finite,
                  "train_loss": float(h.train_loss.iloc[-1]), "train_accuracy": float(h.train_accuracy.iloc[-1]),
                  "validation_loss": loss if finite else math.nan,
                  "validation_accuracy": float(result["validation_accuracy"]) if finite else math.nan}


def choose(candidates: pd.DataFrame) -> float:
    """The chosen multiple among one method's sweep rows: the lowest mean validation loss over the
    seeds; a candidate with a diverged run is never chosen; ties go to the smaller step. The test
    split plays no part (the runs never read it)."""
    per = candidates.groupby("multiple").agg(diverged=("diverged", "any"), loss=("validation_loss", "mean"),
                                             lr=("lr", "first"))
    finished = per[~per.diverged]
    if finished.empty:
        raise ValueError(f"every candidate step size diverged for method {candidates.method.iloc[0]} "
                         f"(lr {sorted(per.lr)}): try smaller multiples")
    return float(finished.sort_values(["loss", "lr"]).index[0])


def matrix_scale(width: int, layers: int, heads: int, mlp: int, setup: str, max_length: int, seed: int = 0) -> float:
    """The median |w| over the entries of the attention and MLP matrices of the initial model (seed
    ``seed``): the magnitude of the entries that carry most of the learning, the default ``scale``."""
    torch.manual_seed(seed)
    model = EncoderClassifier(max_length=max_length, width=width, layers=layers, heads=heads, mlp=mlp, setup=setup)
    groups = model.parameter_groups()
    named = dict(model.named_parameters())
    entries = torch.cat([named[n].detach().abs().flatten() for g in ("attention", "mlp") for n in groups[g]])
    return float(entries.median())


def work(*, dataset: str, train_size: int, epochs: int, batch_size: int, seeds: int, ps: list[float],
         multiples: list[float], adamw_multiples: list[float], **_: Any) -> tuple[int, int]:
    """(training runs, optimizer steps in all) of a sweep with these settings (chapter 09's parameters or a
    ``StepSizeGrid``'s fields; others are ignored): every method's candidates at every seed, and the SGD
    reference at every seed, each ``epochs`` epochs of the training (sub)set in batches of ``batch_size``."""
    from mdlib.experiments.workload import SPLITS

    runs = seeds * (len(ps) * len(multiples) + len(adamw_multiples) + 1)
    examples = min(train_size, SPLITS[dataset][0]) if dataset in SPLITS else train_size
    return runs, runs * epochs * math.ceil(examples / batch_size)


def chapter_config(*, dataset: str, max_length: int, train_size: int, width: int, layers: int, heads: int, mlp: int,
                   dropout: float, setup: str, epochs: int, batch_size: int, seeds: int, ps: list[float],
                   sgd_lr: float, scale: float, multiples: list[float], adamw_lr: float,
                   adamw_multiples: list[float], **_: Any) -> StepSizeGrid:
    """Chapter 09's sweep config from its parameters (others are ignored); ``scale`` 0 means
    ``matrix_scale`` of the chapter's model, rounded to 2 significant digits."""
    if scale == 0:
        scale = float(f"{matrix_scale(width, layers, heads, mlp, setup, max_length):.2g}")
    model = TextModel(width, layers, heads, mlp, float(dropout), setup)
    return StepSizeGrid(dataset, max_length, train_size, model, epochs, batch_size, seeds, [float(p) for p in ps],
                        float(sgd_lr), float(scale), [float(m) for m in multiples], float(adamw_lr),
                        [float(m) for m in adamw_multiples])


# ---------------------------------------------------------------------------------------------
# runs


def initial_model(config: StepRun) -> EncoderClassifier:
    """The run's model as initialized (seeded by ``fit.seed``), before any training step."""
    torch.manual_seed(config.fit.seed)
    return EncoderClassifier(max_length=config.max_length, **config.model.to_dict())


def build(config: StepRun) -> train.Setup:
    """The Setup of a run: the seeded model and its optimizer, the training subset (batched by length),
    no per-epoch evaluation, and the validation split evaluated once, at the end."""
    parts = sentiment_run.splits(config.dataset, config.split_seed, config.max_length)
    train_set = sentiment_run.training_subset(parts["train"], config.train_size, config.split_seed)
    model = initial_model(config)
    spec = config.optimizer
    optimizer = spec.make(model.parameters())
    return train.Setup(model, optimizer, train_set, None, sentiment_run.collate, [len(ids) for ids in train_set.ids],
                      final_evaluations={"validation": sentiment_run.by_length(parts["validation"])})


def kept_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The run's final weights but the token embedding (``train.model_state`` without it)."""
    return {name: value for name, value in train.model_state(model, _STATE).items() if name != _STATE + _TOKEN}


def train_runs(configs: list[StepRun], workers: int = 1, progress: bool = True,
               skip: tuple[type[BaseException], ...] = ()) -> list[store.RunResult | None]:
    """The stored result of each run config, the missing ones trained ``workers`` at a time (None for a
    run that raised one of ``skip``)."""
    return pool.run_many(KIND, configs, build, extras=kept_state, workers=workers, skip=skip, progress=progress)


def movement(config: StepRun, result: Mapping[str, Any]) -> dict[str, float]:
    """||W - W(0)|| / ||W(0)|| per group of ``MOVEMENT_GROUPS`` (``analysis.relative_movement``) of a stored
    run against its own initialization."""
    start = initial_model(config)
    trained = initial_model(config)
    state = {name[len(_STATE):]: torch.from_numpy(np.asarray(value)) for name, value in result.items()
             if name.startswith(_STATE)}
    missing, unexpected = trained.load_state_dict(state, strict=False)
    if missing != [_TOKEN] or unexpected:
        raise ValueError(f"the stored run holds other weights than kept_state keeps (missing {missing}, "
                         f"unexpected {unexpected})")
    groups = start.parameter_groups()
    groups = dict(groups, positions=[n for n in groups.pop("embeddings") if n != _TOKEN])
    return analysis.relative_movement(trained, start, {g: groups[g] for g in MOVEMENT_GROUPS})


# ---------------------------------------------------------------------------------------------
# the sweep


@dataclass
class StepSizes:
    """A built sweep (``sweep``): ``runs``, one row per run (``summary_row``; the SGD reference runs with
    method "sgd"); ``chosen``, {method: chosen multiple}; ``best``, one row per method (``best_table``);
    ``configs``/``results``: the chosen runs (and the SGD references), keyed (method, seed)."""

    config: StepSizeGrid
    runs: pd.DataFrame
    chosen: dict[str, float]
    best: pd.DataFrame
    configs: dict[tuple[str, int], StepRun] = field(default_factory=dict)
    results: dict[tuple[str, int], store.RunResult] = field(default_factory=dict)

    def movement(self) -> pd.DataFrame:
        """``movement`` of every chosen run: one row per (method, seed, group)."""
        rows = []
        for (key, seed), config in self.configs.items():
            for group, value in movement(config, self.results[key, seed]).items():
                rows.append({"method": key, "seed": seed, "group": group, "movement": value})
        return pd.DataFrame(rows)


def best_table(grid: StepSizeGrid, runs: pd.DataFrame, chosen: Mapping[str, float]) -> pd.DataFrame:
    """One row per method: its chosen lr and validation numbers (means over seeds), whether the choice
    lies at an end of its grid, and for mirror descent ``matched_lr``'s prediction from the chosen SGD
    (p = 2) lr, their ratio and the scale at which the prediction would be exact (NaN at p = 2)."""
    sgd_lr = chosen["2"] * grid.centre("2")
    rows = []
    for key in grid.methods:
        name, p = methods.method(key)
        mine = runs[(runs.method == key) & (runs.multiple == chosen[key])]
        candidates = grid.candidates(key)
        lr = chosen[key] * grid.centre(key)
        row = {"method": key, "p": math.nan if p is None else p, "lr": lr,
               "at_edge": chosen[key] in (min(candidates), max(candidates)),
               "validation_loss": float(mine.validation_loss.mean()),
               "validation_accuracy": float(mine.validation_accuracy.mean()),
               "predicted_lr": math.nan, "ratio": math.nan, "implied_scale": math.nan}
        if name == "md":
            predicted = matched_lr(sgd_lr, p, grid.scale)
            implied = (lr / (sgd_lr * (p - 1))) ** (1 / (p - 2)) if p != 2 else math.nan
            row |= {"predicted_lr": predicted, "ratio": lr / predicted, "implied_scale": implied}
        rows.append(row)
    return pd.DataFrame(rows)


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """Within the block torch uses ``count`` CPU threads (None: as it does)."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def sweep(config: StepSizeGrid | Mapping[str, Any], *, workers: int = 1, progress: bool = True) -> StepSizes:
    """The sweep of ``config`` (the module docstring), read back from the store or trained: the grid
    (``grid.build``: each method's candidates at every seed, the choice by validation loss, the overflowed
    runs recorded), then torch's SGD at p = 2's chosen lr, at every seed. With ``workers`` > 1 the grid's
    runs train in one-thread processes; an SGD reference that ``run_many`` trains in this process (one
    missing run) then trains with one thread too, so that its arithmetic is theirs: a float sum over
    two threads rounds otherwise, and after a thousand steps that alone moved the final validation
    loss by about 0.01 in the chapter's pilot."""
    grid = StepSizeGrid.of(config)
    design = grid.design()
    built = step_grid.build(design, workers=workers, progress=progress, what="step-size sweep")
    chosen = {cell[0]: value for cell, value in built.chosen.items()}
    sgd_lr = chosen["2"] * grid.centre("2")
    references = [grid.run("sgd", sgd_lr, seed) for seed in range(grid.seeds)]
    with _threads(1 if workers > 1 else None):  # the arithmetic of run_many's one-thread workers, which trained p = 2
        found = train_runs(references, workers, progress, skip=step_grid.DIVERGED)
    reference_rows = [summary_row(grid, "sgd", 1.0, seed, c, r) for seed, (c, r) in enumerate(zip(references, found))]
    runs = pd.concat([built.sweep, pd.DataFrame(reference_rows).assign(chosen=True)], ignore_index=True)
    configs = {(cell[0], seed): c for (*cell, seed), c in built.configs.items()}
    results = {(cell[0], seed): r for (*cell, seed), r in built.results.items()}
    for seed, (c, r) in enumerate(zip(references, found)):
        if r is not None:
            configs["sgd", seed], results["sgd", seed] = c, r
    return StepSizes(grid, runs, chosen, best_table(grid, runs, chosen), configs, results)


# ---------------------------------------------------------------------------------------------
# the first step, exactly


def first_step_table(ps: list[float], magnitudes: list[float], sgd_lr: float, scale: float,
                     gradient: float = 1.0) -> pd.DataFrame:
    """One mirror-descent step from entries of the given ``magnitudes`` with gradient ``gradient``, in
    float64, at each p's ``matched_lr(sgd_lr, p, scale)``: one row per (p, magnitude) with the step size,
    the movement |w+ - w| (``mdlib.mirror.mirror_step``), its ratio to SGD's movement ``sgd_lr * gradient``,
    and the ratio the linearization predicts, (magnitude / scale)^(2-p) (infinite or 0 at magnitude 0,
    where it fails)."""
    from mdlib.mirror import mirror_step

    rows = []
    for p in ps:
        lr = matched_lr(sgd_lr, p, scale)
        w = torch.tensor(magnitudes, dtype=torch.float64)
        moved = (mirror_step(w, torch.full_like(w, gradient), lr, p) - w).abs()
        for magnitude, step in zip(magnitudes, moved.tolist()):
            with np.errstate(divide="ignore"):  # 0^(2-p): 0 for p < 2, infinite for p > 2
                linear = float(np.float64(magnitude / scale) ** (2 - p))
            rows.append({"p": float(p), "magnitude": float(magnitude), "lr": lr, "movement": step,
                         "vs_sgd": step / (sgd_lr * abs(gradient)), "linearized_vs_sgd": linear})
    return pd.DataFrame(rows)
