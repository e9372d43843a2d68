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

A cell's choice follows the rule of every grid of the book (``choose``, ``step_grid.tie_choice``): the
candidate with the lowest validation loss (mean over ``seeds``), every candidate within 1.96 paired
standard errors of it tied with it (the same validation sentences and seeds, from each run's stored
per-sentence losses), and the tie's middle candidate chosen; a choice at an end of its grid grows the
grid there (``grow`` times at most, a candidate 3x beyond the end). A run that overflowed (mirror
descent raises FloatingPointError) or ended with a non-finite loss is never chosen, and is recorded as
such in the grid's stored entry, so a re-render never trains it again. Then torch's SGD trains at the
chosen lr of p = 2, as a reference (the same update as mirror descent at p = 2, by another
implementation).

    config = step_size_guide.chapter_config(ps=[1.1, 1.75, 2.0, 3.0], multiples=[0.1, 1, 10], ...)
    result = step_size_guide.sweep(config, workers=2)
    result.runs   # one row per run (method, p, lr, outcome, validation loss and accuracy, ...)
    result.best   # one row per method: the chosen lr next to matched_lr's prediction

A run config (``StepRun``; the store hashes its ``to_dict()``) is that of ``mdlib.experiments.sentiment`` but
for the fit (no stop rule, the mean loss) and its evaluation (validation only)::

    {"dataset": "rotten_tomatoes", "split_seed": 0, "max_length": 64, "train_size": 4000,
     "model": {"width": 16, "layers": 1, "heads": 2, "mlp": 64, "dropout": 0.1, "setup": "modern"},
     "optimizer": {"name": "md", "lr": 0.04, "p": 1.75},
     "fit": {"epochs": 4, "batch_size": 32, "seed": 0, "loss": "binary", "reduction": "mean", "pool": 16}}

Each run keeps, beside its history and validation numbers, the loss of each validation sentence
(``validation_losses``, in the split's order: what the choice pairs across candidates) and its final
weights except the token embedding (the bulk of the model, in the store many times over): ``movement``
compares them with the run's initialization, per parameter group.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd
import torch

from mdlib.experiments import analysis, methods, step_grid, train
from mdlib.experiments.sentiment import tokens
from mdlib.experiments.sentiment.run import TextModel
from mdlib.experiments.stats import paired_se
from mdlib.experiments.train import Optimizer
from mdlib.mirror import check_p, matched_lr
from mdlib.models import EncoderClassifier, check_setup
from mdlib.runs import identity, pool, store
from mdlib.runs.identity import RunId

__all__ = ["GRID_KIND", "KIND", "MOVEMENT_GROUPS", "OUTCOMES", "StepRun", "StepSizeGrid", "StepSizes",
           "best_table", "build", "chapter_config", "choose", "first_step_table", "initial_model", "kept_results",
           "kept_state", "matrix_scale", "movement", "summary_row", "sweep", "train_runs", "validation_losses", "work"]

KIND = identity.kind("e9-step-sizes", __name__)
GRID_KIND = identity.kind("e9-step-grid", __name__)
#: How a run ended: it finished with a finite validation loss, mirror descent refused a step that
#: overflowed (FloatingPointError), or it finished with a non-finite loss (it diverged).
OUTCOMES = ("finished", "overflow", "non-finite loss")
#: The parameter groups ``movement`` measures: ``EncoderClassifier.parameter_groups`` without the token
#: embedding (not kept), the position embedding standing for the small-magnitude embeddings.
MOVEMENT_GROUPS = ("positions", "attention", "mlp", "norms", "classifier")
_TOKEN = "token.weight"
_STATE = "state."


@dataclass(frozen=True)
class StepRun(identity.Config):
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
class StepSizeGrid(identity.Config):
    """The sweep's config (the module docstring): the task (data, ``model``: the runs' ``TextModel``,
    epochs, batch, seeds), the
    exponents ``ps`` (2, SGD, among them: it is the reference of the predictions), the centre ``sgd_lr``
    and the ``scale`` that ``matched_lr`` centres each p's grid with, the grid's ``multiples``, AdamW's
    centre ``adamw_lr`` and ``adamw_multiples``, and ``grow``: how many times a method's grid may grow on
    each side, 3x beyond its end, when the choice sits at that end (``step_grid.Design.grow``; left out
    of ``to_dict()`` at 0)."""

    WHAT = "a step-size sweep config"
    OMIT_AT_DEFAULT = ("grow",)

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
    grow: int = 0

    def __post_init__(self) -> None:
        for p in self.ps:
            check_p(p)
        if 2.0 not in [float(p) for p in self.ps]:
            raise ValueError(f"ps={self.ps} must include 2 (SGD): matched_lr predicts the other exponents' step "
                             "sizes from its best one")
        if len({f"{float(p):g}" for p in self.ps}) != len(self.ps):
            raise ValueError(f"ps={self.ps} names an exponent twice")
        if not isinstance(self.grow, int) or isinstance(self.grow, bool) or self.grow < 0:
            raise ValueError(f"grow must be an integer >= 0, got {self.grow!r}")
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
        """The sweep as a ``grid.Design``: one cell per method, every candidate at every seed, the choice by
        ``choose`` (its paired errors from ``losses``), the grid growing ``grow`` times at most where the
        choice sits at an end; the final runs are the sweep's at the chosen candidate (nothing more is
        trained)."""
        return step_grid.Design(
            kind=GRID_KIND, run_kind=KIND, config=self, cells=[(key,) for key in self.methods],
            candidates=lambda cell: self.candidates(cell[0]), seeds=lambda cell: self.seeds,
            sweep_seeds=lambda cell: range(self.seeds), sweep_config=self._config, final_config=self._config,
            summary=self._summary, columns=("method",), candidate="multiple",
            choose=functools.partial(choose, losses=self.losses), train_runs=train_runs, grow=self.grow)

    def _config(self, cell: tuple[str], multiple: float, seed: int) -> StepRun:
        """The run config of a cell's candidate ``multiple`` (of its centre) at ``seed``."""
        return self.run(cell[0], multiple * self.centre(cell[0]), seed)

    def losses(self, key: str, multiple: float) -> np.ndarray:
        """The validation loss of each sentence under the stored runs of method ``key`` at ``multiple``:
        one row per seed, in the validation split's order. LookupError where a run is not stored."""
        rows = []
        for seed in range(self.seeds):
            result = store.load(RunId.of(KIND, self._config((key,), multiple, seed)))
            if result is None or "validation_losses" not in result:
                raise LookupError(f"run {key} x{multiple:g} seed {seed} is not stored with its per-sentence "
                                  "validation losses: train the sweep")
            rows.append(np.asarray(result["validation_losses"], dtype=float))
        return np.stack(rows)

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


def choose(candidates: pd.DataFrame, losses: Callable[[str, float], np.ndarray]) -> step_grid.Choice:
    """The choice among one method's sweep rows (every seed of every candidate multiple) by
    ``step_grid.tie_choice``, the rule of every grid of the book: a candidate with a diverged run is never
    chosen; among the rest, the lowest mean validation loss over the seeds, every candidate within
    ``step_grid.TIE_Z`` paired standard errors of it tied with it, and the tie's neutral pick (its middle
    multiple). The paired error of two candidates is that of their difference in loss on the same
    validation sentences at the same seeds (``stats.paired_se``), from each run's per-sentence losses
    (``losses(method, multiple)``: seeds x sentences); with one seed (the default) the seeds' part is
    absent and the error is the sentences' alone. The test split plays no part (the runs never read it)."""
    per = candidates.groupby("multiple").agg(diverged=("diverged", "any"), loss=("validation_loss", "mean"),
                                             lr=("lr", "first"))
    key = str(candidates.method.iloc[0])
    if per.diverged.all():
        raise ValueError(f"every candidate step size diverged for method {key} "
                         f"(lr {sorted(per.lr)}): try smaller multiples")
    values = [float(m) for m in per.index]
    eligible = (~per.diverged).tolist()
    tables = {m: losses(key, m) for m, ok in zip(values, eligible) if ok}

    def error(i: int, j: int) -> float:
        return paired_se(tables[values[i]] - tables[values[j]])

    return step_grid.tie_choice(values, list(-per.loss), error, eligible=eligible)


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
    reference at every seed, each ``epochs`` epochs of the training (sub)set in batches of ``batch_size``
    (the grids as given: a grid that grows where its choice sits at an end adds runs)."""
    from mdlib.experiments.workload import SPLITS

    runs = seeds * (len(ps) * len(multiples) + len(adamw_multiples) + 1)
    examples = min(train_size, SPLITS[dataset][0]) if dataset in SPLITS else train_size
    return runs, runs * epochs * math.ceil(examples / batch_size)


def chapter_config(*, dataset: str, max_length: int, train_size: int, width: int, layers: int, heads: int, mlp: int,
                   dropout: float, setup: str, epochs: int, batch_size: int, seeds: int, ps: list[float],
                   sgd_lr: float, scale: float, multiples: list[float], adamw_lr: float,
                   adamw_multiples: list[float], grow: int = 0, **_: Any) -> StepSizeGrid:
    """Chapter 09's sweep config from its parameters (others are ignored); ``scale`` 0 means
    ``matrix_scale`` of the chapter's model, rounded to 2 significant digits."""
    if scale == 0:
        scale = float(f"{matrix_scale(width, layers, heads, mlp, setup, max_length):.2g}")
    model = TextModel(width, layers, heads, mlp, float(dropout), setup)
    return StepSizeGrid(dataset, max_length, train_size, model, epochs, batch_size, seeds, [float(p) for p in ps],
                        float(sgd_lr), float(scale), [float(m) for m in multiples], float(adamw_lr),
                        [float(m) for m in adamw_multiples], grow)


# ---------------------------------------------------------------------------------------------
# runs


def initial_model(config: StepRun) -> EncoderClassifier:
    """The run's model as initialized (seeded by ``fit.seed``), before any training step."""
    torch.manual_seed(config.fit.seed)
    return EncoderClassifier(max_length=config.max_length, **config.model.to_dict())


#: The attribute ``build`` gives a run's model: its validation split, which ``kept_results`` scores per
#: sentence once training is over (what a run keeps is a function of its trained model alone).
_VALIDATION = "_step_sizes_validation"


def build(config: StepRun) -> train.Setup:
    """The Setup of a run: the seeded model and its optimizer, the training subset (batched by length),
    no per-epoch evaluation, and the validation split evaluated once, at the end (its mean loss and
    accuracy; ``kept_results`` keeps each sentence's loss)."""
    parts = tokens.splits(config.dataset, config.split_seed, config.max_length)
    train_set = tokens.training_subset(parts["train"], config.train_size, config.split_seed)
    model = initial_model(config)
    setattr(model, _VALIDATION, parts["validation"])
    spec = config.optimizer
    optimizer = spec.make(model.parameters())
    return train.Setup(model, optimizer, train_set, None, tokens.collate, [len(ids) for ids in train_set.ids],
                      final_evaluations={"validation": tokens.by_length(parts["validation"])})


def kept_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The run's final weights but the token embedding (``train.model_state`` without it)."""
    return {name: value for name, value in train.model_state(model, _STATE).items() if name != _STATE + _TOKEN}


@torch.no_grad()
def validation_losses(model: EncoderClassifier, dataset: tokens.TokenizedDataset,
                      batch_size: int = 100) -> np.ndarray:
    """The binary cross-entropy of ``model`` (eval mode) on each sentence of ``dataset``, in its order
    (float64; their mean is the split's mean loss), computed in batches of similar lengths."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.ids[i]))
    losses = np.zeros(len(dataset))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        inputs, labels = tokens.collate([dataset[i] for i in chunk])
        logits = model(**{name: value.to(device) for name, value in inputs.items()}).float().reshape(len(chunk))
        losses[chunk] = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels.to(device), reduction="none").double().cpu().numpy()
    return losses


def kept_results(model: EncoderClassifier) -> dict[str, np.ndarray]:
    """What a run keeps of its trained model (``train_setup``'s extras): ``kept_state`` and the loss of each
    validation sentence (``validation_losses`` on the split ``build`` gave the model)."""
    return kept_state(model) | {"validation_losses": validation_losses(model, getattr(model, _VALIDATION))}


def train_runs(configs: list[StepRun], workers: int = 1, progress: bool = True,
               skip: tuple[type[BaseException], ...] = ()) -> list[store.RunResult | None]:
    """The stored result of each run config, the missing ones trained ``workers`` at a time (None for a
    run that raised one of ``skip``)."""
    return pool.run_many(KIND, configs, build, extras=kept_results, workers=workers, skip=skip, progress=progress)


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
    """A built sweep (``sweep``): ``runs``, one row per run (``summary_row``, ``chosen`` and ``tied``; the
    SGD reference runs with method "sgd"); ``chosen``, {method: chosen multiple}; ``best``, one row per
    method (``best_table``); ``configs``/``results``: the chosen runs (and the SGD references), keyed
    (method, seed); ``choices``: {method: step_grid.Choice}; ``candidates``: {method: the multiples tried,
    grown ones included}."""

    config: StepSizeGrid
    runs: pd.DataFrame
    chosen: dict[str, float]
    best: pd.DataFrame
    configs: dict[tuple[str, int], StepRun] = field(default_factory=dict)
    results: dict[tuple[str, int], store.RunResult] = field(default_factory=dict)
    choices: dict[str, step_grid.Choice] = field(default_factory=dict)
    candidates: dict[str, list[float]] = field(default_factory=dict)

    def movement(self) -> pd.DataFrame:
        """``movement`` of every chosen run: one row per (method, seed, group)."""
        rows = []
        for (key, seed), config in self.configs.items():
            for group, value in movement(config, self.results[key, seed]).items():
                rows.append({"method": key, "seed": seed, "group": group, "movement": value})
        return pd.DataFrame(rows)


def best_table(grid: StepSizeGrid, runs: pd.DataFrame, chosen: Mapping[str, float],
               candidates: Mapping[str, list[float]] | None = None,
               choices: Mapping[str, step_grid.Choice] | None = None) -> pd.DataFrame:
    """One row per method: its chosen lr and multiple and their validation numbers (means over seeds),
    whether the choice lies at an end of the multiples tried (``candidates``, grown ones included; by
    default the grid's own), those tried and those tied with the choice (``choices``), and for mirror
    descent ``matched_lr``'s prediction from the chosen SGD (p = 2) lr, their ratio and the scale at
    which the prediction would be exact (NaN at p = 2)."""
    sgd_lr = chosen["2"] * grid.centre("2")
    rows = []
    for key in grid.methods:
        name, p = methods.method(key)
        mine = runs[(runs.method == key) & (runs.multiple == chosen[key])]
        tried = sorted((candidates or {}).get(key) or grid.candidates(key))
        tied = sorted((choices or {}).get(key, step_grid.Choice.of(chosen[key])).tied)
        lr = chosen[key] * grid.centre(key)
        row = {"method": key, "p": math.nan if p is None else p, "lr": lr, "multiple": float(chosen[key]),
               "at_edge": len(tried) > 1 and chosen[key] in (tried[0], tried[-1]),
               "tried": ", ".join(f"{m:g}" for m in tried), "tied": ", ".join(f"{m:g}" for m in tied),
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
    (``grid.build``: each method's candidates at every seed, the choice by validation loss and the paired
    tie rule, ``choose``, the grid grown where a choice sits at its end, the overflowed runs recorded),
    then torch's SGD at p = 2's chosen lr, at every seed. With ``workers`` > 1 the grid's runs train in
    one-thread processes; an SGD reference that ``run_many`` trains in this process (one
    missing run) then trains with one thread too, so that its arithmetic is theirs: a float sum over
    two threads rounds otherwise, and after a thousand steps that alone moved the final validation
    loss by about 0.01 in the chapter's pilot."""
    grid = StepSizeGrid.of(config)
    design = grid.design()
    built = step_grid.build(design, workers=workers, progress=progress, what="step-size sweep")
    chosen = {cell[0]: value for cell, value in built.chosen.items()}
    choices = {cell[0]: choice for cell, choice in built.choices.items()}
    candidates = {cell[0]: tried for cell, tried in built.candidates.items()}
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
    return StepSizes(grid, runs, chosen, best_table(grid, runs, chosen, candidates, choices), configs, results,
                     choices, candidates)


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
