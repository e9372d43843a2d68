"""One sentiment training run (E4-E6): its config, data, model and optimizer, and nothing else (the
code of a run's key, ``mdlib.runs.identity``; chapter 04's grids, tables and views are
the other modules of ``mdlib.experiments.sentiment``).

A run config (``SentimentRun``, made by ``run_config``; the results store hashes its ``to_dict()``)
names everything that changes the numbers::

    {"dataset": "rotten_tomatoes", "split_seed": 0, "max_length": 64, "train_size": 1000,
     "model": {"width": 48, "layers": 3, "heads": 3, "mlp": 192, "dropout": 0.2, "setup": "authors"},
     "optimizer": {"name": "md", "lr": 8e-4, "p": 1.1},
     "fit": {"epochs": 600, "batch_size": 100, "seed": 0, "loss": "binary", "reduction": "sum",
             "stop_train_accuracy": 0.995, "pool": 16}}

``fit.seed`` seeds the initialization as well as the data order and dropout, so seeds are distinct
initializations (the authors' code reused one). ``train_size`` trains on a seeded, stratified subset
of the training split (the same sentences for every method and seed; None: all of it). The loss is
the batch's summed binary cross-entropy, as in the authors' code (their step sizes assume the sum).
Training batches hold sentences of similar lengths: each epoch's random order is cut into pools of
``fit.pool`` batches, each sorted by length (``mdlib.experiments.train.fit``). ``build(config)`` is the
run's ``train.Setup``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mdlib.experiments import paper, train
from mdlib.experiments.sentiment.tokens import by_length, collate, splits, training_subset
from mdlib.experiments.train import Optimizer
from mdlib.models import EncoderClassifier, check_setup
from mdlib.runs import identity

if TYPE_CHECKING:
    pass

__all__ = ["KIND", "SentimentRun", "TextModel", "build", "initial_model", "run_config"]

KIND = identity.kind("e4-sentiment", __name__)


@dataclass(frozen=True)
class TextModel(identity.Config):
    """The model part of a sentiment run config: ``EncoderClassifier``'s arguments (``embedding_std``:
    the small-embeddings setup's sigma, None for its default 0.02)."""

    OMIT_AT_DEFAULT = ("embedding_std",)

    width: int
    layers: int
    heads: int
    mlp: int
    dropout: float
    setup: str
    embedding_std: float | None = None


@dataclass(frozen=True)
class SentimentRun(identity.Config):
    """A sentiment run config (the module docstring); ``to_dict()`` is what the store keeps (of the fit
    settings: all but those of ``OMIT_AT_DEFAULT`` where they hold their defaults)."""

    OMIT_AT_DEFAULT = ("fit.eval_every",)

    dataset: str
    split_seed: int
    max_length: int
    train_size: int | None
    model: TextModel
    optimizer: Optimizer
    fit: train.FitOptions

    def __post_init__(self) -> None:
        check_setup(self.model.setup)
        if self.model.embedding_std is not None and self.model.setup != "small-embeddings":
            raise ValueError(f"embedding_std is the small-embeddings setup's sigma; setup {self.model.setup!r} fixes "
                             "its own: give embedding_std=None")
        batch_size = self.fit.batch_size
        if self.train_size is not None and (not isinstance(self.train_size, int) or self.train_size < batch_size):
            raise ValueError(f"train_size must be None (the whole training split) or an integer >= the batch "
                             f"size {batch_size}, got {self.train_size!r}")
        if self.model.width % self.model.heads:
            raise ValueError(f"width {self.model.width} is not divisible by {self.model.heads} heads (heads = layers)")


def run_config(*, layers: int, optimizer: str, lr: float, p: float | None = None, seed: int = 0,
           dataset: str = "rotten_tomatoes", max_length: int = 64, train_size: int | None = None,
           width: int = 48, mlp: int | None = None, dropout: float = 0.2, setup: str = "authors",
           epochs: int = 600, batch_size: int = 100, stop_train_accuracy: float = paper.STOP_TRAIN_ACCURACY,
           split_seed: int = 0, pool: int = 16, embedding_std: float | None = None,
           matched_p: float | None = None) -> SentimentRun:
    """A run config (see the module docstring); heads = layers as in the paper, MLP 4 x width.
    ``embedding_std``: sigma of the small-embeddings setup (None: 0.02); ``matched_p``: steps per tensor
    matched to exponent ``matched_p`` at ``lr`` (``grid.Optimizer``; None: one step ``lr``)."""
    return SentimentRun(
        dataset, split_seed, max_length, train_size,
        TextModel(width, layers, layers, mlp or 4 * width, dropout, setup, embedding_std),
        Optimizer(optimizer, float(lr), None if p is None else float(p), None if matched_p is None else float(matched_p)),
        train.FitOptions(epochs=epochs, batch_size=batch_size, seed=seed, loss="binary", reduction="sum",
                         stop_train_accuracy=stop_train_accuracy, pool=pool))


def initial_model(config: SentimentRun) -> EncoderClassifier:
    """The run's model as initialized (seeded by ``fit.seed``), before any training step."""
    torch.manual_seed(config.fit.seed)
    return EncoderClassifier(max_length=config.max_length, **config.model.to_dict())


def build(config: SentimentRun) -> train.Setup:
    """The Setup of a run: the seeded model, its optimizer, the training (sub)set, the test split
(evaluated after every epoch) and the validation split (evaluated once, at the end)."""
    parts = splits(config.dataset, config.split_seed, config.max_length)
    train_set = training_subset(parts["train"], config.train_size, config.split_seed)
    model = initial_model(config)
    spec = config.optimizer
    optimizer = spec.make(model.parameters())
    lengths = [len(ids) for ids in train_set.ids]
    return train.Setup(model, optimizer, train_set, by_length(parts["test"]), collate, lengths,
                      final_evaluations={"validation": by_length(parts["validation"])})
