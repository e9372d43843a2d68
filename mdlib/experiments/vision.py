"""Experiment E7, the vision transformer, in the shape of ``mdlib.experiments.sentiment``: a run config, the
``Setup`` it trains, the trained model back; a validation ``sweep`` of step sizes and the ``grid`` of
final runs as one function of one grid config; ``pruning`` of a trained model.

    config = vision.run_config("fashion_mnist", optimizer="md", lr=5e-2, p=1.1, seed=0, epochs=10,
                               model=dict(patch=7, width=64, depth=4, heads=4, mlp=64, dropout=0.1,
                                          embedding_dropout=0.1), train_size=10000)
    result, = vision.train_runs([config])
    model = vision.trained_model(config, result)

Data: ``fashion_mnist`` (offline, 28 px grey) or ``cifar10`` / ``cifar100`` (torchvision's files under
``root``, default ``<data cache>/cifar``), with the paper's transforms (``mdlib.experiments.data.ImageTransform``).
With ``validation > 0`` that many training images (seeded, stratified) are held out and the run is
evaluated on them, never on the test set: a run of the step-size sweep. ``train_size`` trains on a
seeded, stratified subset of the remaining training images. Both draws use the data seed
(``config.data.seed``), so every optimizer and training seed sees the same images; the training
seed (``config.fit.seed``) also seeds the model's initialization.

Precision: ``precision="bf16"`` trains under bfloat16 autocast (``train.FitOptions.precision``); the
paper's float32 is the default, and a config's ``to_dict()`` at it holds no ``precision`` key
(``identity.Config.OMIT_AT_DEFAULT``), so the store keys of float32 runs are those they had before the
option existed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Container, Mapping

import numpy as np
import pandas as pd
import torch

from mdlib.experiments import analysis, data, fetch, methods, paper, step_grid, train
from mdlib.experiments.methods import method, method_key
from mdlib.experiments.stats import paired_se
from mdlib.experiments.train import Optimizer
from mdlib.models import VISION_SETUPS, VisionTransformer, check_setup
from mdlib.runs import identity, pool, store
from mdlib.runs.identity import RunId

__all__ = ["DATASETS", "GRID_KIND", "Grid", "ImageData", "KIND", "PAPER_STEP_SIZES", "PRUNING_KIND",
           "VisionGrid", "VisionModel", "VisionPruning", "VisionRun", "build", "change_table", "chapter_grids", "choose", "dataset_shape", "grid", "image_sets",
           "make_model", "pruning", "run_config", "run_scores", "split_indices", "summary_table", "sweep", "train_runs",
           "trained_model", "pruning_table", "validation_correct"]

#: dataset -> (channels, classes, native image size)
DATASETS = {name: (channels, methods.DATASET_CLASSES[name], size)
            for name, channels, size in (("fashion_mnist", 1, 28), ("cifar10", 3, 32), ("cifar100", 3, 32))}


def dataset_shape(dataset: str) -> tuple[int, int, int]:
    """(channels, classes, native image size) of a data set of ``DATASETS``; ValueError naming them
    for any other."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[dataset]


@dataclass(frozen=True)
class ImageData(identity.Config):
    """The data part of a vision run config (the module docstring): images, held-out validation images
    (0: evaluate on the test set), the data seed and CIFAR's folder (None: the data cache)."""

    dataset: str
    image_size: int
    train_size: int | None
    validation: int
    seed: int
    root: str | None

    def __post_init__(self) -> None:
        dataset_shape(self.dataset)


@dataclass(frozen=True)
class VisionModel(identity.Config):
    """The model part of a vision run config: ``VisionTransformer``'s arguments but the image's size,
    channels and classes (the data's)."""

    patch: int
    width: int
    depth: int
    heads: int
    mlp: int
    dropout: float
    embedding_dropout: float
    setup: str

    def __post_init__(self) -> None:
        check_setup(self.setup, VISION_SETUPS)


@dataclass(frozen=True)
class VisionRun(identity.Config):
    """A vision run config; ``to_dict()`` is what the store keeps (of the fit settings: all but those of
    ``OMIT_AT_DEFAULT``, and ``precision``, where they hold their defaults)."""

    OMIT_AT_DEFAULT = ("fit.reduction", "fit.stop_train_accuracy", "fit.pool")

    data: ImageData
    model: VisionModel
    optimizer: Optimizer
    fit: train.FitOptions


def run_config(dataset: str, *, optimizer: str, lr: float, p: float | None = None, seed: int, epochs: int,
               model: Mapping[str, Any], image_size: int | None = None, train_size: int | None = None,
               validation: int = 0, data_seed: int = 0, batch_size: int = 100, eval_every: int = 1,
               root: str | None = None, setup: str = "authors", precision: str = "fp32") -> VisionRun:
    """The config of one E7 run (every setting that changes its numbers), for ``pool.run``. ``model``:
    ``VisionModel``'s fields but ``setup``, the model's initialization (``VisionTransformer``): the
    authors' or "modern". ``precision``: "fp32" or "bf16" (autocast)."""
    data_part = ImageData(dataset, image_size or dataset_shape(dataset)[2], train_size, validation, data_seed, root)
    return VisionRun(data_part, VisionModel(**model, setup=setup), Optimizer(optimizer, lr, p),
                     train.FitOptions(epochs=epochs, batch_size=batch_size, seed=seed, loss="multiclass",
                                      eval_every=eval_every, precision=precision))


def split_indices(labels: np.ndarray, train_size: int | None, validation: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices into the training images: ``validation`` images held out, then a
    subset of about ``train_size`` of the rest (all of it when None); both stratified by label and seeded."""
    labels = np.asarray(labels)
    n = len(labels)
    if not 0 <= validation < n:
        raise ValueError(f"validation must be in [0, {n}) images, got {validation}")
    parts = data.stratified_split(labels, {"validation": validation / n, "train": 1 - validation / n}, seed)
    rest = parts["train"]
    if train_size is not None and train_size < len(rest):
        share = train_size / len(rest)
        rest = rest[data.stratified_split(labels[rest], {"train": share, "unused": 1 - share}, seed)["train"]]
    return rest, parts["validation"]


def image_sets(data_config: ImageData, download: bool = False) -> tuple[data.ImageDataset, data.ImageDataset]:
    """(training set, evaluation set) of a config's ``data``: the evaluation set is the held-out
    validation images when ``validation > 0``, else the test set. ``download`` lets torchvision fetch
    CIFAR first (internet)."""
    name, size = data_config.dataset, data_config.image_size
    train_transform = data.ImageTransform(name, train=True, image_size=size)
    eval_transform = data.ImageTransform(name, train=False, image_size=size)
    if name == "fashion_mnist":
        load = data.fashion_mnist
    else:
        root = data_config.root or fetch.data_dir() / "cifar"
        load = lambda split: data.cifar(name, split, root, download=download)  # noqa: E731
    full = load("train")
    keep, held_out = split_indices(full.labels, data_config.train_size, data_config.validation, data_config.seed)
    train_set = data.ImageDataset(full.images[keep], full.labels[keep], train_transform)
    if data_config.validation:
        return train_set, data.ImageDataset(full.images[held_out], full.labels[held_out], eval_transform)
    test = load("test")
    return train_set, data.ImageDataset(test.images, test.labels, eval_transform)


def make_model(config: VisionRun) -> VisionTransformer:
    """The config's vision transformer, initialized from the training seed."""
    channels, classes, _ = DATASETS[config.data.dataset]
    torch.manual_seed(config.fit.seed)
    return VisionTransformer(image_size=config.data.image_size, channels=channels, classes=classes,
                             **config.model.to_dict())


def build(config: VisionRun) -> train.Setup:
    """``pool.run``'s builder: data, seeded model and optimizer of an E7 config."""
    train_set, eval_set = image_sets(config.data)
    model = make_model(config)
    opt = config.optimizer
    return train.Setup(model, opt.make(model.parameters()), train_set, eval_set)


def trained_model(config: VisionRun, result: Mapping[str, Any]) -> VisionTransformer:
    """The model of a finished run, its weights loaded from the result (stored by ``train.model_state``),
    in evaluation mode."""
    return train.load_model_state(make_model(config), result).eval()


# --- the chapter's experiment: a validation sweep of step sizes, then the final runs ----------------

KIND = identity.kind("e7-vit", __name__)
GRID_KIND = identity.kind("e7-grid", __name__)
PRUNING_KIND = identity.kind("e7-pruning", __name__)
#: The paper's step sizes, by method key (``paper.VIT_STEP_SIZES``).
PAPER_STEP_SIZES = paper.VIT_STEP_SIZES


@dataclass(frozen=True)
class VisionGrid(identity.Config):
    """A vision grid config (``grid``): datasets, image_size, train_size (0 or None: all), validation
    (images held out for the sweep), model (``VisionTransformer``'s arguments), setup, batch_size, root
    (CIFAR folder, "" or None: the data cache), epochs, eval_every, seeds, methods (method keys: "adam"
    or an exponent p), step_sizes ({method: [candidates]}), sweep_seeds, sweep_epochs, sweep_window,
    precision (every run's: "fp32", the default, or "bf16"), grow (how many times a method's grid may
    grow on each side, a candidate 3x beyond its end, when the sweep's choice sits at that end:
    ``step_grid.Design.grow``). ``to_dict()`` is what the store keeps (without precision and grow at
    their defaults); a mapping with exactly these fields, precision and grow optional, converts with
    ``VisionGrid.of``."""

    WHAT = "a vision grid config"
    OMIT_AT_DEFAULT = ("precision", "grow")

    datasets: list[str]
    image_size: int
    train_size: int | None
    validation: int
    model: Mapping[str, Any]
    setup: str
    batch_size: int
    root: str | None
    epochs: int
    eval_every: int
    seeds: int
    methods: list[str]
    step_sizes: Mapping[str, list[float]]
    sweep_seeds: int
    sweep_epochs: int
    sweep_window: int
    precision: str = "fp32"
    grow: int = 0

    def __post_init__(self) -> None:
        train.check_precision(self.precision)
        if not isinstance(self.grow, int) or isinstance(self.grow, bool) or self.grow < 0:
            raise ValueError(f"grow must be an integer >= 0 (how many times a grid may grow on each side), "
                             f"got {self.grow!r}")
        for key in self.methods:
            method(key)
        steps = self.step_sizes
        if set(steps) != set(self.methods) or not all(isinstance(v, list) and v for v in steps.values()):
            raise ValueError(f"step_sizes={steps} needs a non-empty list of candidates for each of the methods "
                             f"{self.methods}, and nothing else")
        for dataset in self.datasets:
            dataset_shape(dataset)

    def run(self, cell: tuple[str, str], lr: float, seed: int, sweep: bool = False) -> VisionRun:
        """A final run of cell (dataset, method), or (``sweep``) a run of its validation sweep."""
        dataset, key = cell
        name, p = method(key)
        return run_config(dataset, optimizer=name, lr=float(lr), p=p, seed=seed, model=self.model,
                          setup=self.setup, epochs=self.sweep_epochs if sweep else self.epochs,
                          image_size=self.image_size, train_size=self.train_size or None,
                          validation=self.validation if sweep else 0, batch_size=self.batch_size,
                          eval_every=1 if sweep else self.eval_every, root=self.root or None,
                          precision=self.precision)

    def _summary(self, cell: tuple[str, str], lr: float, seed: int, config: VisionRun,
                 result: Mapping[str, Any] | None) -> dict[str, Any]:
        """A sweep run's row: its mean validation accuracy over the last ``sweep_window`` evaluations
        (NaN and ``diverged``: mirror descent refused a step)."""
        dataset, key = cell
        return {"dataset": dataset, "method": key, "lr": float(lr), "p": method(key)[1],
                "paper": PAPER_STEP_SIZES.get(key) == lr,
                "validation_accuracy": np.nan if result is None else
                result["history"].test_accuracy.dropna().iloc[-self.sweep_window:].mean(),
                "diverged": result is None}

    def correct(self, dataset: str, key: str, lr: float) -> np.ndarray:
        """Whether each held-out validation image is classified correctly by the final weights of the
        sweep runs of (``dataset``, ``key``) at ``lr``: one row per sweep seed, in the validation set's
        order (``validation_correct`` of each stored run). LookupError where a run is not stored."""
        rows = []
        for seed in range(self.sweep_seeds):
            config = self.run((dataset, key), lr, seed, sweep=True)
            result = store.load(RunId.of(KIND, config))
            if result is None:
                raise LookupError(f"sweep run {key} lr {lr:g} seed {seed} on {dataset} is not stored: train the grid")
            rows.append(validation_correct(config, result))
        return np.stack(rows)

    def design(self) -> step_grid.Design:
        """The grid as a ``grid.Design``: ``sweep_seeds`` sweep runs per candidate of every cell with more
        than one, on held-out validation images, reduced to their mean per candidate and chosen by
        ``choose`` (the paired error from ``correct``); a choice at an end of its grid grows the grid
        there (``grow`` times at most, 3x apart); diverged final runs are recorded."""
        return step_grid.Design(
            kind=GRID_KIND, run_kind=KIND, config=self,
            cells=[(d, key) for d in self.datasets for key in self.methods],
            candidates=lambda cell: self.step_sizes[cell[1]], seeds=lambda cell: self.seeds,
            sweep_seeds=lambda cell: range(self.sweep_seeds if len(self.step_sizes[cell[1]]) > 1 else 0),
            sweep_config=lambda cell, lr, seed: self.run(cell, lr, seed, sweep=True), final_config=self.run,
            summary=self._summary, columns=("dataset", "method"), candidate="lr",
            choose=functools.partial(choose, correct=self.correct), train_runs=train_runs, reduce=_mean_over_seeds,
            grow=self.grow)


def chapter_grids(*, datasets: list[str], image_size: int, train_size: int | None, validation: int,
                  model: Mapping[str, Any], setup: str, batch_size: int, cifar_root: str, epochs: int,
                  eval_every: int, seeds: int, ps: list[float], step_sizes: Mapping[str, list[float]],
                  sweep_seeds: int, sweep_epochs: int, sweep_window: int, precision: str = "fp32",
                  sweep_grow: int = 0, **_: Any) -> tuple[VisionGrid, VisionGrid]:
    """Chapter 07's grids from its parameters (other parameters are ignored): Adam and mirror descent
    at each of ``ps`` with the swept step sizes (growing ``sweep_grow`` times at most on a side where
    the choice sits at an end), and Adam and ℓ1.1 at the paper's step sizes (the same seeds and budget;
    one candidate each, nothing to grow)."""
    methods = ["adam"] + [method_key("md", float(p)) for p in ps]
    swept = VisionGrid(datasets=list(datasets), image_size=image_size, train_size=train_size, validation=validation,
                       model=model, setup=setup, batch_size=batch_size, root=cifar_root, epochs=epochs,
                       eval_every=eval_every, seeds=seeds, methods=methods,
                       step_sizes={method_key(*method(k)): v for k, v in step_sizes.items()},
                       sweep_seeds=sweep_seeds, sweep_epochs=sweep_epochs, sweep_window=sweep_window,
                       precision=precision, grow=sweep_grow)
    at_paper = dataclasses.replace(swept, methods=list(PAPER_STEP_SIZES),
                                   step_sizes={k: [v] for k, v in PAPER_STEP_SIZES.items()}, grow=0)
    return swept, at_paper


def _mean_over_seeds(rows: pd.DataFrame) -> pd.DataFrame:
    """The sweep's rows -> one per (dataset, method, lr): validation accuracy averaged over the seeds that
    finished, ``diverged`` when any seed's run diverged."""
    rows = pd.DataFrame(rows.to_dict("records"),
                        columns=["dataset", "method", "lr", "p", "paper", "validation_accuracy", "diverged"])
    return rows.groupby(["dataset", "method", "lr"], as_index=False, sort=False).agg(
        p=("p", "first"), paper=("paper", "first"), validation_accuracy=("validation_accuracy", "mean"),
        diverged=("diverged", "any"))


def train_runs(configs: list[VisionRun], workers: int = 1, progress: bool = True,
               skip: tuple[type[BaseException], ...] = ()) -> list[store.RunResult | None]:
    """The stored result of each run config (history + final weights), the missing ones trained
    ``workers`` at a time (None for a run that raised one of ``skip``)."""
    return pool.run_many(KIND, configs, build, extras=train.model_state, workers=workers, skip=skip,
                          progress=progress)


def choose(candidates: pd.DataFrame, correct: Callable[[str, str, float], np.ndarray]) -> step_grid.Choice:
    """The choice among one method's candidates (``sweep`` rows: one per step size) by
    ``step_grid.tie_choice``, the rule of every grid of the book: a candidate with a diverged run is
    never chosen; among the rest, the best validation score, every candidate within ``step_grid.TIE_Z``
    paired standard errors of it tied with it, and the tie's neutral pick (its middle step).

    The score is the sweep's: the validation accuracy averaged over the last ``sweep_window`` epochs
    (and the sweep seeds), which smooths the epoch-to-epoch wobble of a short run. Per-image predictions
    exist only for the final weights, so the error of two candidates' difference is that of their
    final epoch's: ``correct(dataset, method, lr)`` gives each candidate's per-image correctness (sweep
    seeds x validation images), and ``stats.paired_se`` of the difference pairs them on the same images
    and seeds. For the window's mean difference this errs on the side of ties: its variance over the
    images is at most the largest of its epochs' (the mean of correlated terms), and the last epochs of
    a run are alike. With one sweep seed (the default) the seeds' part of the error is absent: the
    error is the images' alone, so a difference that another seed would undo can still rank two
    candidates. The test set plays no part: the sweep runs are evaluated on held-out training images."""
    candidates = candidates.sort_values("lr", kind="stable")
    diverged = candidates.diverged.astype(bool) if "diverged" in candidates else candidates.validation_accuracy.isna()
    eligible = (~diverged & candidates.validation_accuracy.notna()).tolist()
    first = candidates.iloc[0]
    if not any(eligible):
        raise ValueError(f"every candidate step size diverged for {first.method} on {first.dataset} "
                         f"(lr {sorted(candidates.lr)}): try smaller ones")
    values = [float(v) for v in candidates.lr]
    tables = {v: correct(first.dataset, first.method, v).astype(float) for v, ok in zip(values, eligible) if ok}

    def error(i: int, j: int) -> float:
        return paired_se(tables[values[i]] - tables[values[j]])

    return step_grid.tie_choice(values, list(candidates.validation_accuracy), error, eligible=eligible)


def sweep(config: VisionGrid | Mapping[str, Any], *, workers: int = 1, progress: bool = True) -> pd.DataFrame:
    """The validation sweep of a grid (``grid``'s config): for every data set and method with more than
    one candidate step size, ``sweep_seeds`` runs of ``sweep_epochs`` epochs per candidate, trained
    without the ``validation`` held-out images and evaluated on them after every epoch, the grid growing
    where the choice sits at an end (``grow``). One row per (dataset, method, lr): p, paper (the paper's
    step size), validation_accuracy (mean over the last ``sweep_window`` evaluations and the seeds that
    finished; NaN: every seed diverged), diverged (any seed did), chosen and tied (``choose``)."""
    return step_grid.sweep(VisionGrid.of(config).design(), workers=workers, progress=progress)[0]


@dataclass
class Grid:
    """A vision grid's runs (``grid``). ``config``: the grid's config; ``sweep``: the validation sweep
    (``sweep``, ``chosen`` and ``tied`` marking each method's choice and the candidates tied with it);
    ``chosen``: {(dataset, method): lr} of every method (its only candidate, or the sweep's choice);
    ``configs``/``results``: the final runs that finished, keyed (dataset, method, seed); ``diverged``:
    the (dataset, method, seed) of final runs mirror descent refused (non-finite gradients);
    ``history``: one row per (final run, epoch); ``choices``: {(dataset, method): step_grid.Choice};
    ``candidates``: {(dataset, method): the step sizes tried, grown ones included}."""

    config: VisionGrid
    sweep: pd.DataFrame
    chosen: dict[tuple[str, str], float]
    configs: dict[tuple[str, str, int], VisionRun]
    results: dict[tuple[str, str, int], store.RunResult]
    diverged: list[tuple[str, str, int]]
    history: pd.DataFrame
    choices: dict[tuple[str, str], step_grid.Choice] = dataclasses.field(default_factory=dict)
    candidates: dict[tuple[str, str], list[float]] = dataclasses.field(default_factory=dict)

    def models(self) -> dict[tuple[str, str, int], VisionTransformer]:
        """{(dataset, method, seed): trained model} of the final runs, in eval mode."""
        return {key: trained_model(c, self.results[key]) for key, c in self.configs.items()}


def grid(config: VisionGrid | Mapping[str, Any], *, workers: int = 1, progress: bool = True) -> Grid:
    """Chapter 07's runs: ``sweep`` chooses the step size of every method with more than one candidate
    (by validation accuracy and the paired tie rule, ``choose``; the test set plays no part), then
    ``seeds`` final runs of ``epochs`` per data set and method train at that step on ``train_size``
    images, evaluated on the test set every ``eval_every`` epochs.

    ``config``: a ``VisionGrid``, or a mapping with exactly its fields. The store keeps the grid under
    its ``to_dict()`` (kind ``GRID_KIND``) and each run under its run config's (kind ``KIND``). CIFAR is
    downloaded first where missing (torchvision; internet)."""
    typed = VisionGrid.of(config)
    for dataset in typed.datasets:  # before the training processes start
        if dataset != "fashion_mnist":
            image_sets(typed.run((dataset, typed.methods[0]), 1.0, 0).data, download=True)
    built = step_grid.build(typed.design(), workers=workers, progress=progress, what="vision grid")
    history = pd.concat([built.results[key]["history"].assign(dataset=key[0], method=key[1], seed=key[2])
                         for key in built.configs], ignore_index=True)
    return Grid(typed, built.sweep, built.chosen, built.configs, built.results, built.diverged, history,
                built.choices, built.candidates)


def change_table(grids: Mapping[str, Grid], methods: Container[str] = ("adam", "1.1"),
                 flat_share: float = 0.05) -> pd.DataFrame:
    """What training changed in the attention matrices of the final runs of several grids (``grids``:
    name -> grid, e.g. {"swept": ..., "paper": ...} for the chosen and the paper's step sizes): one row
    per (grid, dataset, method, seed) of ``methods`` with the step size, ``sparsity.change_table``'s
    measures of ΔW = W - W(0) against the run's own initialization, and whether the run's training
    loss levelled off (its last quarter brought at most ``flat_share`` of its decrease,
    ``analysis.late_share``)."""
    from mdlib.experiments import sparsity

    rows = []
    for name, g in grids.items():
        for (d, key, seed), config in g.configs.items():
            if key not in methods:
                continue
            measures = sparsity.change_table({(key, seed): trained_model(config, g.results[d, key, seed])},
                                             {seed: make_model(config)}).iloc[0].to_dict()
            share = analysis.late_share(g.results[d, key, seed]["history"].train_loss)
            rows.append({"steps": name, "dataset": d, "lr": config.optimizer.lr, **measures,
                         "loss_share": share, "levelled": bool(share <= flat_share)})
    return pd.DataFrame(rows)


@functools.lru_cache(maxsize=4)
def _test_tensors(data_config: ImageData) -> torch.utils.data.TensorDataset:
    """The evaluation images of a run's data config (``image_sets``: the held-out validation images of a
    sweep run, the test set otherwise), transformed once."""
    _, test_set = image_sets(data_config)
    images, labels = zip(*(test_set[i] for i in range(len(test_set))))
    return torch.utils.data.TensorDataset(torch.stack(images), torch.tensor(labels))


@torch.no_grad()
def validation_correct(config: VisionRun, result: Mapping[str, Any], batch_size: int = 500) -> np.ndarray:
    """Whether the final model of a sweep run (its stored weights, eval mode, the run's precision)
    classifies each of its held-out validation images correctly, in their order: the per-image predictions
    behind the last validation accuracy of its history (their mean). Only a sweep run's: a config
    evaluated on the test set (``validation`` 0) is refused, so a choice never reads it."""
    if not config.data.validation:
        raise ValueError("validation_correct reads a sweep run's held-out validation images; this run config "
                         "has validation=0 (it is evaluated on the test set, which no choice may read)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = trained_model(config, result).to(device)
    images = _test_tensors(config.data)
    bf16 = config.fit.precision == "bf16"
    correct = []
    for start in range(0, len(images), batch_size):
        x, y = images[start:start + batch_size]
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            logits = model(x.to(device))
        correct.append((logits.argmax(dim=1).cpu() == y).numpy())
    return np.concatenate(correct)


@dataclass(frozen=True)
class VisionPruning(identity.Config):
    """A pruning config (``pruning``): a final run (stored) and the fractions of its prunable weights
    set to zero."""

    WHAT = "a pruning config"

    run: VisionRun
    sparsities: list[float]


def pruning(config: VisionPruning | Mapping[str, Any]) -> store.RunResult:
    """Test accuracy of a final run's model after global magnitude pruning without retraining
    (``analysis.pruning_curve``), stored: ``config``, a ``VisionPruning`` or a mapping with exactly its
    fields; the result's "accuracy" has one value per sparsity."""
    config = VisionPruning.of(config)
    run = config.run
    result = store.load(RunId.of(KIND, run))
    if result is None:
        raise LookupError("the run to prune is not in the results store: train it first (``grid``)")

    def compute() -> dict[str, Any]:
        model = trained_model(run, result).to("cuda" if torch.cuda.is_available() else "cpu")
        test_set = _test_tensors(run.data)
        evaluate = lambda pruned: train.evaluate(pruned, test_set, batch_size=1000, loss="multiclass")[1]  # noqa: E731
        return {"accuracy": np.array([a for _, a in analysis.pruning_curve(model, config.sparsities, evaluate)])}

    return store.load_or_run(RunId.of(PRUNING_KIND, config), compute)


# --- the chapter's summary table (chapter 07) ---------------------------------------------------


def run_scores(history: pd.DataFrame) -> pd.DataFrame:
    """Per run (dataset, method, seed) of a training history (``Grid.history``): the test accuracy after
    the last epoch (``final``) and the best over the evaluated epochs (``best``); the last training loss,
    its late change and late share (``analysis.late_change``, ``analysis.late_share``: has it levelled
    off?); and ``accuracy_change``, the last evaluated test accuracy minus the one a quarter of the
    evaluated epochs earlier."""
    by = ["dataset", "method", "seed"]
    losses = history.groupby(by).train_loss
    accuracies = history.dropna(subset=["test_accuracy"]).groupby(by).test_accuracy

    def late_difference(values) -> float:
        before, last = analysis.late_means(values, window=1)
        return last - before

    scores = history.groupby(by).test_accuracy.agg(final="last", best="max")
    return scores.assign(train_loss=losses.last(), loss_change=losses.agg(analysis.late_change),
                         loss_share=losses.agg(analysis.late_share),
                         accuracy_change=accuracies.agg(late_difference)).reset_index()


def summary_table(scores: pd.DataFrame, mean_counts: pd.Series, chosen: Mapping[tuple[str, str], float], *,
                  methods: list[str], names: Mapping[str, str], datasets: Mapping[str, str], swept: Container[str],
                  flat_share: float, kinds: tuple[str, ...] = ("key", "query", "value")) -> pd.DataFrame:
    """Chapter 07's table-vit: one row per data set and method key (in the order of ``datasets``, then
    ``methods``) from ``run_scores`` (methods under their ``names``, data sets under their keys): the
    chosen step size and where it came from, the final and best test accuracy (%, mean and std over
    seeds), the loss measures (means), ``levelled`` (every seed's late share at most ``flat_share``),
    the mean counts of attention weights above the threshold (``mean_counts[(dataset, name, kind)]``),
    the paper's accuracy (``paper.VIT_ACCURACY``, NaN where it did not run the data set) and the
    method key. ``datasets``: data set key -> display name (the table's ``dataset``)."""
    rows = []
    for d, shown in datasets.items():
        for m in methods:
            score = scores[(scores.dataset == d) & (scores.method == names[m])]
            rows.append({"dataset": shown, "optimizer": names[m], "lr": chosen[d, m],
                         "lr from": ("sweep" if m in swept else "fixed")
                                    + (", the paper's" if PAPER_STEP_SIZES.get(m) == chosen[d, m] else ""),
                         "final_mean": 100 * score.final.mean(), "final_std": 100 * score.final.std(),
                         "best_mean": 100 * score.best.mean(), "best_std": 100 * score.best.std(),
                         "train_loss": score.train_loss.mean(), "loss_change": score.loss_change.mean(),
                         "loss_share": score.loss_share.mean(), "accuracy_change": 100 * score.accuracy_change.mean(),
                         "levelled": bool((score.loss_share <= flat_share).all()),
                         **{f"{kind}_above": mean_counts[(d, names[m], kind)] for kind in kinds},
                         "paper": paper.VIT_ACCURACY.get(d, np.nan), "method": m})
    return pd.DataFrame(rows)


def pruning_table(configs: Mapping[tuple[str, str, int], Mapping[str, Any]], sparsities: list[float]) -> pd.DataFrame:
    """Chapter 07's pruning: per final run (``Grid.configs``: (dataset, method key, seed) -> run config)
    and sparsity, the test accuracy after global magnitude pruning without retraining (``pruning``,
    stored); columns dataset, method, seed, sparsity, test_accuracy."""
    return pd.DataFrame([{"dataset": d, "method": m, "seed": s, "sparsity": x, "test_accuracy": a}
                         for (d, m, s), run in configs.items()
                         for x, a in zip(sparsities, pruning({"run": run, "sparsities": sparsities})["accuracy"])])
