"""Experiment E7, the vision transformer: a run config, the ``Setup`` it trains, the trained model back.

    config = vision.run_config("fashion_mnist", optimizer="md", lr=5e-2, p=1.1, seed=0, epochs=10,
                               model=dict(patch=7, width=64, depth=4, heads=4, mlp=64), train_size=10000)
    result = runs.run("e7-vit", config, vision.build, extras=runs.model_state)
    model = vision.trained_model(config, result)

Data: ``fashion_mnist`` (offline, 28 px grey) or ``cifar10`` / ``cifar100`` (torchvision's files under
``root``, default ``<data cache>/cifar``), with the paper's transforms (``mdlib.data.ImageTransform``).
With ``validation > 0`` that many training images (seeded, stratified) are held out and the run is
evaluated on them, never on the test set: a run of the step-size sweep. ``train_size`` trains on a
seeded, stratified subset of the remaining training images. Both draws use the data seed
(``config["data"]["seed"]``), so every optimizer and training seed sees the same images; the training
seed (``config["fit"]["seed"]``) also seeds the model's initialization.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from mdlib import data, fetch, optim, runs
from mdlib.models import VisionTransformer, check_setup

__all__ = ["DATASETS", "run_config", "image_sets", "split_indices", "make_model", "build", "trained_model"]

#: dataset -> (channels, classes, native image size)
DATASETS = {"fashion_mnist": (1, 10, 28), "cifar10": (3, 10, 32), "cifar100": (3, 100, 32)}


def run_config(dataset: str, *, optimizer: str, lr: float, p: float | None = None, seed: int, epochs: int,
               model: Mapping[str, Any], image_size: int | None = None, train_size: int | None = None,
               validation: int = 0, data_seed: int = 0, batch_size: int = 100, eval_every: int = 1,
               root: str | None = None, setup: str = "authors") -> dict[str, Any]:
    """The config of one E7 run (every setting that changes its numbers), for ``runs.run``.
    ``setup``: the model's initialization (``VisionTransformer``): the authors' or "modern"."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    check_setup(setup)
    return {"version": 3,
            "data": {"dataset": dataset, "image_size": image_size or DATASETS[dataset][2], "train_size": train_size,
                     "validation": validation, "seed": data_seed, "root": root},
            "model": dict(model) | {"setup": setup},
            "optimizer": {"name": optimizer, "lr": lr, "p": p},
            "fit": {"epochs": epochs, "batch_size": batch_size, "seed": seed, "loss": "multiclass",
                    "eval_every": eval_every}}


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


def image_sets(data_config: Mapping[str, Any], download: bool = False):
    """(training set, evaluation set) of a config's ``data``: the evaluation set is the held-out
    validation images when ``validation > 0``, else the test set. ``download`` lets torchvision fetch
    CIFAR first (internet)."""
    name, size = data_config["dataset"], data_config["image_size"]
    train_transform = data.ImageTransform(name, train=True, image_size=size)
    eval_transform = data.ImageTransform(name, train=False, image_size=size)
    if name == "fashion_mnist":
        load = data.fashion_mnist
    else:
        root = data_config["root"] or fetch.data_dir() / "cifar"
        load = lambda split: data.cifar(name, split, root, download=download)  # noqa: E731
    full = load("train")
    keep, held_out = split_indices(full.labels, data_config["train_size"], data_config["validation"],
                                   data_config["seed"])
    train_set = data.ImageDataset(full.images[keep], full.labels[keep], train_transform)
    if data_config["validation"]:
        return train_set, data.ImageDataset(full.images[held_out], full.labels[held_out], eval_transform)
    test = load("test")
    return train_set, data.ImageDataset(test.images, test.labels, eval_transform)


def make_model(config: Mapping[str, Any]) -> VisionTransformer:
    """The config's vision transformer, initialized from the training seed."""
    channels, classes, _ = DATASETS[config["data"]["dataset"]]
    torch.manual_seed(config["fit"]["seed"])
    return VisionTransformer(image_size=config["data"]["image_size"], channels=channels, classes=classes,
                             **config["model"])


def build(config: Mapping[str, Any]) -> runs.Setup:
    """``runs.run``'s builder: data, seeded model and optimizer of an E7 config."""
    train_set, eval_set = image_sets(config["data"])
    model = make_model(config)
    opt = config["optimizer"]
    return runs.Setup(model, optim.make_optimizer(model.parameters(), opt["name"], opt["lr"], opt["p"]),
                      train_set, eval_set)


def trained_model(config: Mapping[str, Any], result: Mapping[str, Any]) -> VisionTransformer:
    """The model of a finished run, its weights loaded from the result (stored by ``runs.model_state``),
    in evaluation mode."""
    return runs.load_model_state(make_model(config), result).eval()
