"""The training loop of the real-data chapters (sentiment encoder E4-E6, ViT E7).

    options = FitOptions(epochs=20, batch_size=100, seed=0, loss="binary", stop_train_accuracy=0.995)
    history = fit(model, optimizer, train_set, test_set, options, checkpoint="ckpt/")

``FitOptions`` holds the settings that change the numbers, and is the ``fit`` part of every run config
(``config.fit``); ``fit``'s keywords are the data's helpers (``collate_fn``,
``lengths``) and where and how it runs (checkpoint, device, workers, progress).

(``mdlib.runs.pool.run`` trains a run config this way unless the results store holds it.)

Datasets are map-style torch Datasets yielding ``(inputs, label)``. ``inputs`` is a tensor, passed as
``model(inputs)``, or a dict of tensors (e.g. ``input_ids``, ``attention_mask``), passed as
``model(**inputs)``. ``loss="binary"``: the model returns one logit per example, shape (B,) or (B, 1),
labels are 0/1, binary cross-entropy with logits. ``loss="multiclass"``: (B, C) logits, integer labels,
cross-entropy. Training accuracy is counted on the training batches during the epoch (dropout on), as
the paper does; ``stop_train_accuracy`` ends training after the first epoch that reaches it.

Precision: ``precision="fp32"`` (the default) trains in float32; ``"bf16"`` runs the forward pass and
the loss (training and evaluation) under ``torch.autocast`` in bfloat16 on the run's device, so the
backward pass follows in bfloat16 while the parameters, their gradients and the optimizer's state stay
float32.

Determinism: epoch e's data order is a permutation drawn from a generator seeded by (seed, e); the
global torch/numpy/python RNGs (dropout, augmentation) are seeded from (seed, rank) at a fresh start
and restored from the checkpoint on resume. Model initialization is the caller's.

Checkpoints: with ``checkpoint=<folder>``, ``<folder>/checkpoint.pt`` is replaced atomically after
every epoch (model, optimizer, history, RNG states); ``fit`` resumes from it when it exists, and a
resumed run gives bit-for-bit the numbers of an uninterrupted one (same device). A checkpoint written
with other settings (fit's options, the optimizer's class and hyperparameters, the model's class and
parameter shapes, the data sizes) is refused, naming what differs; an unreadable one is moved aside to
``checkpoint.pt.corrupt`` with a warning and the run starts over.

Data parallel: launched by ``torchrun --nproc_per_node N`` (WORLD_SIZE > 1), ``fit`` joins the process
group (nccl on CUDA, gloo on CPU), wraps the model in DistributedDataParallel and gives each process
batch_size / N examples of every global batch of ``batch_size``; metrics are summed over processes and
only rank 0 writes checkpoints and results and shows progress.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from mdlib import first_line
from mdlib.runs.files import atomic_write
from mdlib.runs.identity import Config

__all__ = ["COLUMNS", "PRECISIONS", "FitOptions", "Optimizer", "Setup", "World", "batching", "check_precision", "evaluate", "fit",
           "load_model_state", "model_state", "process_world", "train_batches", "train_setup"]

#: The columns of the history ``fit`` returns, one row per epoch (test columns NaN when not evaluated).
COLUMNS = ["epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "seconds", "lr"]
CHECKPOINT = "checkpoint.pt"
LOSSES = ("binary", "multiclass")
REDUCTIONS = ("mean", "sum")
#: fit's precisions: float32 throughout, or the forward pass and loss under bfloat16 autocast.
PRECISIONS = ("fp32", "bf16")
_ORDER, _RNG, _WORKERS = 0, 1, 2  # purposes of the seeds derived from ``seed``

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitOptions(Config):
    """The settings of ``fit`` that change the numbers: the ``fit`` part of every run config (a
    ``Config``; a setting added after runs were stored is left out at its default, ``OMIT_AT_DEFAULT``
    here, or in the run configs of the kinds that did not have it, e.g. ``"fit.eval_every"``)."""

    WHAT = "the fit settings of a run config"
    OMIT_AT_DEFAULT = ("precision",)

    epochs: int  #: the most epochs to train (counting epochs restored from the checkpoint)
    batch_size: int  #: the global batch size (split evenly over torchrun processes); an epoch's last may be smaller
    seed: int  #: seeds the data order of every epoch and the dropout/augmentation RNGs
    loss: str = "binary"  #: "binary" (one logit per example, BCE) or "multiclass" ((B, C) logits, cross-entropy)
    #: the step's loss is the batch's "mean" (torch's default) or its "sum" (the authors' sentiment code:
    #: ``BCELoss(reduction="sum")``, so their step sizes assume it)
    reduction: str = "mean"
    stop_train_accuracy: float | None = None  #: stop after the first epoch whose training accuracy reaches it
    eval_every: int = 1  #: evaluate on the test set every this many epochs (and always after the last epoch)
    #: with ``fit``'s ``lengths``, the batches per length-sorted pool: smaller pools pad more, larger ones
    #: keep the same examples together across epochs
    pool: int = 16
    #: "fp32", or "bf16": the forward pass and the loss under bfloat16 autocast (the module docstring); a
    #: bf16 checkpoint resumes only a bf16 run
    precision: str = "fp32"

    def __post_init__(self) -> None:
        _check_fit_options(self)
        check_precision(self.precision)


@dataclass(frozen=True)
class Optimizer(Config):
    """The optimizer part of a run config: ``methods.make_optimizer(params, name, lr, p, matched_p)``
    (``make``). ``matched_p`` None: one step ``lr`` for every tensor; an exponent: each tensor's step
    moves its entries as far as ``lr`` at exponent ``matched_p`` would (``mirror.matched_param_groups``,
    at the tensor's mean |w| at initialization)."""

    OMIT_AT_DEFAULT = ("matched_p",)

    name: str
    lr: float
    p: float | None
    matched_p: float | None = None

    def make(self, params) -> torch.optim.Optimizer:
        """The optimizer over ``params`` (``methods.make_optimizer``)."""
        from mdlib.experiments import methods

        return methods.make_optimizer(params, self.name, self.lr, self.p, self.matched_p)


def _derived_seed(seed: int, *tags: int) -> int:
    """A 64-bit seed for (seed, *tags), independent across tags."""
    return int(np.random.SeedSequence([seed, *tags]).generate_state(1, np.uint64)[0])


# ---------------------------------------------------------------------------------------------
# processes and devices


@dataclass(frozen=True)
class World:
    """The processes of a (torchrun) data-parallel run, as one process sees them."""

    rank: int
    size: int
    device: torch.device


def process_world(device: str | torch.device | None) -> World:
    """This process's rank, the number of processes and the device; joins the process group when
    launched by torchrun with WORLD_SIZE > 1."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(0, 1, device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    return World(dist.get_rank(), dist.get_world_size(), device)


# ---------------------------------------------------------------------------------------------
# RNG states and checkpoints


def _seed_everything(seed: int, rank: int) -> None:
    value = _derived_seed(seed, _RNG, rank)
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)


def _rng_state(device: torch.device) -> dict:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _save(folder: Path, checkpoint: dict) -> None:
    """Write ``folder/checkpoint.pt`` atomically."""
    atomic_write(folder / CHECKPOINT, lambda tmp: torch.save(checkpoint, tmp))


def _plain_setting(value: Any) -> Any:
    """A setting as plain data that compares by value (tensors -> numbers, tuples -> lists)."""
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain_setting(item) for item in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def _fingerprint(model: nn.Module, optimizer: torch.optim.Optimizer, train_set: Dataset,
                 test_set: Dataset | None) -> dict:
    """What changes the numbers and ``fit`` can see beyond its arguments: the optimizer's class and
    hyperparameters (every param-group entry but ``params``), the model's class and parameter shapes,
    the dataset sizes."""
    groups = optimizer.param_groups
    settings = {"optimizer": type(optimizer).__name__, "model": type(model).__name__,
                "test_size": None if test_set is None else len(test_set)}
    for i, group in enumerate(groups):
        prefix = "optimizer." if len(groups) == 1 else f"optimizer.group{i}."
        settings.update({prefix + key: _plain_setting(value) for key, value in group.items() if key != "params"})
    settings.update({f"model.{name}": list(param.shape) for name, param in model.named_parameters()})
    return settings


def _load(folder: Path, settings: dict) -> dict | None:
    """The checkpoint in ``folder`` if it exists and was written with ``settings``. A checkpoint that
    cannot be read is moved aside to ``checkpoint.pt.corrupt`` (the run starts over); one written with
    other settings is refused."""
    path = folder / CHECKPOINT
    if not path.exists():
        return None
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("settings"), dict):
            raise ValueError("not a checkpoint written by mdlib.experiments.train.fit")
    except Exception as error:  # noqa: BLE001 - any unreadable file is a corrupt checkpoint
        aside = path.with_name(CHECKPOINT + ".corrupt")
        os.replace(path, aside)
        reason = first_line(error)[:200]
        log.warning("the checkpoint %s cannot be read (%s: %s); moved it to %s and starting this run from "
                    "scratch", path, type(error).__name__, reason, aside.name)
        return None
    old = checkpoint["settings"]
    if old != settings:
        differ = {k: (old.get(k), settings.get(k)) for k in sorted({*old, *settings}, key=str)
                  if old.get(k) != settings.get(k)}
        shown = "; ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in differ.items())
        raise ValueError(f"the checkpoint {path} belongs to another run (checkpoint vs now: {shown}); "
                         "use another checkpoint folder, or delete it to start over")
    return checkpoint


# ---------------------------------------------------------------------------------------------
# batches


def train_batches(n: int, batch_size: int, seed: int, epoch: int, world: World,
                  lengths: Tensor | None = None, pool: int = 16) -> list[tuple[list[int], int]]:
    """This process's part of each global batch of epoch ``epoch`` (0-based), with the global batch size.
    A final global batch with fewer examples than processes is dropped (only possible when N > 1).
    With ``lengths``, the shuffled epoch is cut into pools of ``pool`` batches, each pool is sorted by
    length before it is cut into batches, and the batches are shuffled: similar lengths share a batch,
    and a batch's members change from epoch to epoch as long as an epoch holds several pools."""
    generator = torch.Generator().manual_seed(_derived_seed(seed, _ORDER, epoch))
    order = torch.randperm(n, generator=generator)
    chunks = list(order.split(batch_size))
    if lengths is not None:
        pools = [part[lengths[part].argsort(stable=True)] for part in order.split(pool * batch_size)]
        chunks = [chunk for part in pools for chunk in part.split(batch_size)]
        chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=generator).tolist()]
    return [(chunk.tensor_split(world.size)[world.rank].tolist(), len(chunk))
            for chunk in chunks if len(chunk) >= world.size]


def batching(lengths: Tensor | np.ndarray | Sequence[int], batch_size: int, pool: int,
             seed: int = 0) -> dict[str, float]:
    """What length pools do to an epoch's batches (``fit(lengths=..., pool=...)``), from the lengths
    alone: ``padding``, the padded tokens of epoch 0 over its real tokens (1: no padding); ``again``,
    the share of a batch's pairs of examples that share a batch again in epoch 1 (random batches:
    (batch_size - 1) / (n - 1)); ``random_again``, that reference."""
    lengths = torch.as_tensor(lengths)
    n = len(lengths)
    world = World(0, 1, torch.device("cpu"))
    epochs = [train_batches(n, batch_size, seed, epoch, world, lengths, pool) for epoch in (0, 1)]
    padded = sum(int(lengths[b].max()) * len(b) for b, _ in epochs[0])
    where = torch.empty(n, dtype=torch.long)
    for k, (b, _) in enumerate(epochs[1]):
        where[b] = k
    pairs = together = 0
    for b, _ in epochs[0]:
        counts = torch.bincount(where[b])
        together += int((counts * (counts - 1)).sum())
        pairs += len(b) * (len(b) - 1)
    return {"padding": padded / int(lengths.sum()), "again": together / pairs,
            "random_again": (batch_size - 1) / (n - 1)}


def _loader(dataset: Dataset, batches: list[list[int]], collate_fn, num_workers: int, device: torch.device,
            seed: int) -> DataLoader:
    # The generator seeds the worker processes (so augmentation there is reproducible) and keeps the
    # DataLoader from drawing from the global RNG.
    return DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn, num_workers=num_workers,
                      pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(seed))


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, Mapping):
        return {key: _to(item, device) for key, item in value.items()}
    if isinstance(value, Tensor):
        return value.to(device, non_blocking=True)
    raise TypeError(f"inputs must be a tensor or a dict of tensors, got {type(value).__name__}")


def _unpack(batch: Any, count: int, loss: str) -> tuple[Any, Tensor]:
    """The (inputs, labels) of a collated batch, with the labels checked (on the CPU)."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ValueError("the datasets must yield (inputs, label) pairs (and collate_fn must return "
                         f"(inputs, labels)); got a batch of type {type(batch).__name__}")
    inputs, labels = batch
    if not isinstance(labels, Tensor) or labels.shape != (count,):
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"expected labels of shape ({count},) for a batch of {count} examples (one scalar "
                         f"label per example), got {shape}")
    if loss == "binary" and not bool(((labels == 0) | (labels == 1)).all()):
        raise ValueError(f"loss='binary' needs labels 0 or 1, got values {labels.unique().tolist()[:10]}")
    if loss == "multiclass" and (labels.is_floating_point() or labels.dtype == torch.bool):
        raise ValueError(f"loss='multiclass' needs integer class labels, got dtype {labels.dtype}")
    return inputs, labels


def _forward(model: nn.Module, inputs: Any) -> Tensor:
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)


def _loss(logits: Tensor, labels: Tensor, loss: str) -> tuple[Tensor, Tensor]:
    """The mean loss over the batch and the number of correct predictions (the step's loss is this
    mean, or with ``fit(reduction="sum")`` the batch's sum)."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"the model must return a tensor of logits, got {type(logits).__name__}")
    if loss == "binary":
        if logits.dim() == 2 and logits.shape[1] == 1:
            logits = logits[:, 0]
        if logits.shape != labels.shape:
            raise ValueError(f"loss='binary' needs one logit per example, shape ({len(labels)},) or "
                             f"({len(labels)}, 1); the model returned {tuple(logits.shape)}")
        return (F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype)),
                ((logits > 0) == (labels == 1)).sum())
    if logits.dim() != 2 or logits.shape[0] != len(labels):
        raise ValueError(f"loss='multiclass' needs logits of shape ({len(labels)}, classes); the model "
                         f"returned {tuple(logits.shape)}")
    return F.cross_entropy(logits, labels), (logits.argmax(dim=1) == labels).sum()


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context of a forward pass and its loss at ``precision`` on ``device``."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _summed(sums: Tensor, world: World) -> list[float]:
    if world.size > 1:
        dist.all_reduce(sums)
    return sums.tolist()


def evaluate(model: nn.Module, dataset: Dataset, *, batch_size: int = 500, loss: str = "binary",
             collate_fn: Callable | None = None, device: str | torch.device | None = None,
             precision: str = "fp32") -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` on ``dataset`` (eval mode), as ``fit`` measures them."""
    check_precision(precision)
    world = World(0, 1, torch.device(device or next(model.parameters()).device))
    return _evaluate(model, dataset, batch_size, loss, collate_fn, 0, world, precision)


@torch.no_grad()
def _evaluate(model: nn.Module, dataset: Dataset, batch_size: int, loss: str, collate_fn, num_workers: int,
              world: World, precision: str = "fp32") -> tuple[float, float]:
    """Mean loss and accuracy on ``dataset``, each process taking a contiguous share."""
    model.eval()
    share = torch.arange(len(dataset)).tensor_split(world.size)[world.rank]
    batches = [chunk.tolist() for chunk in share.split(batch_size)]
    sums = torch.zeros(3, dtype=torch.float64, device=world.device)  # loss sum, correct, count
    for batch, indices in zip(_loader(dataset, batches, collate_fn, num_workers, world.device, 0), batches):
        inputs, labels = _unpack(batch, len(indices), loss)
        with _autocast(precision, world.device):
            mean, correct = _loss(_forward(model, _to(inputs, world.device)), _to(labels, world.device), loss)
        sums += torch.stack([mean.double() * len(indices), correct.double(), sums.new_tensor(len(indices))])
    total, correct, count = _summed(sums, world)
    return total / count, correct / count


# ---------------------------------------------------------------------------------------------
# the loop


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, train_set: Dataset, test_set: Dataset | None,
        options: FitOptions, *, collate_fn: Callable | None = None,
        lengths: Tensor | np.ndarray | Sequence[int] | None = None, checkpoint: str | os.PathLike | None = None,
        num_workers: int = 0, progress: bool = True, device: str | torch.device | None = None) -> pd.DataFrame:
    """Train ``model`` with ``optimizer`` for up to ``options.epochs`` epochs; the history, one row per epoch.

    Args:
        model, optimizer: built by the caller (the optimizer over ``model``'s parameters); the model is
            moved to ``device`` (default: cuda when available, else cpu) and trained in place.
        train_set, test_set: map-style datasets of (inputs, label); ``test_set`` may be None.
        options: the settings that change the numbers (``FitOptions``).
        collate_fn: builds a batch from a list of (inputs, label) (e.g. to pad token ids); default
            torch's default_collate.
        lengths: the training examples' sequence lengths: batch examples of similar length together
            (less padding; see ``train_batches``), still a seeded random order of batches.
        checkpoint: a folder: checkpoint after every epoch and resume from it when it holds one.
        num_workers: DataLoader worker processes.
        progress: show a progress bar (tqdm.auto; hidden outside terminals and notebooks).
        device: where to train (default: cuda when available, else cpu).

    Returns:
        DataFrame with ``COLUMNS``: epoch (1-based), train_loss and train_accuracy (over the epoch's
        batches, in training mode), test_loss and test_accuracy (NaN in epochs without evaluation),
        seconds (the epoch's wall time, evaluation included), lr (the first param group's, at the end).
    """
    epochs, batch_size, seed, loss = options.epochs, options.batch_size, options.seed, options.loss
    reduction, pool, precision = options.reduction, options.pool, options.precision
    world = process_world(device)
    n = len(train_set)
    batches_per_epoch, lengths = _epoch_layout(n, batch_size, world, lengths)

    model.to(world.device)
    folder = Path(checkpoint) if checkpoint is not None else None
    settings = {"seed": seed, "batch_size": batch_size, "loss": loss, "reduction": reduction, "train_size": n,
                "processes": world.size, "by_length": lengths is not None,
                "pool": pool if lengths is not None else None, **_fingerprint(model, optimizer, train_set, test_set)}
    if precision != "fp32":  # fp32 checkpoints keep the settings they had before precision was an option
        settings["precision"] = precision
    history, stopped = _start(folder, settings, model, optimizer, seed, epochs, world, progress)
    net = model
    if world.size > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None)

    bar = tqdm(total=epochs * batches_per_epoch, initial=len(history) * batches_per_epoch, unit="batch",
               disable=None if progress and world.rank == 0 else True, dynamic_ncols=True)
    try:
        while not stopped and len(history) < epochs:
            epoch, start = len(history), time.perf_counter()
            bar.set_description(f"epoch {epoch + 1}/{epochs}")
            parts = train_batches(n, batch_size, seed, epoch, world, lengths, pool)
            loader = _loader(train_set, [indices for indices, _ in parts], collate_fn, num_workers, world.device,
                             _derived_seed(seed, _WORKERS, epoch, world.rank))
            sums = _train_epoch(net, optimizer, loader, parts, loss, reduction, world, bar, precision)
            train_loss, train_correct = _summed(sums, world)
            count = sum(global_count for _, global_count in parts)
            row = {"epoch": epoch + 1, "train_loss": train_loss / count, "train_accuracy": train_correct / count,
                   "test_loss": math.nan, "test_accuracy": math.nan}
            stop = options.stop_train_accuracy
            stopped = stop is not None and row["train_accuracy"] >= stop
            if test_set is not None and ((epoch + 1) % options.eval_every == 0 or epoch + 1 == epochs or stopped):
                row["test_loss"], row["test_accuracy"] = _evaluate(model, test_set, batch_size, loss, collate_fn,
                                                                   num_workers, world, precision)
            row["seconds"] = time.perf_counter() - start
            row["lr"] = float(optimizer.param_groups[0]["lr"])
            history.append(row)
            bar.set_postfix(loss=f"{row['train_loss']:.4f}", acc=f"{row['train_accuracy']:.4f}",
                            test=f"{row['test_accuracy']:.4f}")
            if folder is not None:
                _checkpoint_epoch(folder, settings, model, optimizer, history, stopped, world)
    finally:
        bar.close()
    return pd.DataFrame(history, columns=COLUMNS)


@dataclass
class Setup:
    """What a run kind's builder makes from a config: the arguments of ``fit`` that are objects."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_set: Dataset
    test_set: Dataset | None = None
    collate_fn: Callable | None = None
    lengths: Any = None  #: per-example lengths of train_set, to batch similar lengths (fit's ``lengths``)
    #: datasets evaluated once, after training: ``train_setup`` returns ``<name>_loss``, ``<name>_accuracy`` and
    #: ``<name>_n`` (the examples evaluated)
    final_evaluations: Mapping[str, Dataset] = field(default_factory=dict)


def train_setup(setup: Setup, options: FitOptions, *, extras: Callable[[nn.Module], Mapping[str, Any]] | None = None,
                checkpoint: str | os.PathLike | None = None, progress: bool = True, world: World | None = None,
                num_workers: int = 0) -> dict[str, Any]:
    """Train a run's ``setup`` with ``fit`` (checkpoints in ``checkpoint``) and return what the store keeps of
    it: ``history``, the loss, accuracy and size (``<name>_loss``, ``<name>_accuracy``, ``<name>_n``) of the
    trained model on each of ``setup.final_evaluations``, and whatever ``extras(model)`` returns (arrays,
    DataFrames or JSON values, e.g. ``model_state(model)``); {} on a process of rank > 0 (torchrun)."""
    world = world or process_world(None)
    history = fit(setup.model, setup.optimizer, setup.train_set, setup.test_set, options,
                  collate_fn=setup.collate_fn, lengths=setup.lengths, checkpoint=checkpoint, progress=progress,
                  device=world.device, num_workers=num_workers)
    if world.rank != 0:
        return {}
    result: dict[str, Any] = {"history": history}
    for name, dataset in setup.final_evaluations.items():
        result[f"{name}_loss"], result[f"{name}_accuracy"] = evaluate(
            setup.model, dataset, batch_size=options.batch_size, loss=options.loss,
            collate_fn=setup.collate_fn, device=world.device)
        result[f"{name}_n"] = len(dataset)
    for name, value in (extras(setup.model) if extras is not None else {}).items():
        if name in result:
            raise ValueError(f"extras() returned {name!r}, a name train_setup already uses")
        result[name] = value
    return result


def model_state(model: nn.Module, prefix: str = "state.") -> dict[str, np.ndarray]:
    """The model's state_dict as numpy arrays named ``prefix + name``, for ``train_setup``'s ``extras``."""
    return {prefix + name: value.detach().cpu().numpy() for name, value in model.state_dict().items()}


def load_model_state(model: nn.Module, result: Mapping[str, Any], prefix: str = "state.") -> nn.Module:
    """Load the arrays ``model_state`` stored (in ``result``) into ``model``; returns the model."""
    state = {name[len(prefix):]: torch.from_numpy(np.asarray(value)) for name, value in result.items()
             if name.startswith(prefix)}
    model.load_state_dict(state)
    return model


def _check_fit_options(options: FitOptions) -> None:
    """Raise ValueError for a ``FitOptions`` field out of its domain, naming it and what it must be."""
    if options.loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {options.loss!r}")
    if options.reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {options.reduction!r}")
    for name in ("epochs", "batch_size", "eval_every", "pool"):
        value = getattr(options, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(options.seed, int) or options.seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {options.seed!r}")
    stop = options.stop_train_accuracy
    if stop is not None and not 0 < stop <= 1:
        raise ValueError(f"stop_train_accuracy must be in (0, 1] or None, got {stop!r}")


def check_precision(precision: str) -> None:
    """ValueError unless ``precision`` is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} (\"fp32\": the paper's float32; \"bf16\": "
                         f"bfloat16 autocast), got {precision!r}")


def _epoch_layout(n: int, batch_size: int, world: World, lengths: Tensor | np.ndarray | Sequence[int] | None
                  ) -> tuple[int, Tensor | None]:
    """The batches per epoch of ``n`` examples (a last partial batch counts if every process gets an
    example of it) and ``lengths`` as a tensor of one length per example (or None); ValueError when the
    global batch does not split evenly over the processes or there is no batch at all."""
    if batch_size % world.size:
        raise ValueError(f"batch_size={batch_size} is not divisible by the {world.size} processes: the global "
                         "batch is split evenly; choose a multiple of the number of processes")
    batches_per_epoch = n // batch_size + (n % batch_size >= world.size)
    if batches_per_epoch == 0:
        raise ValueError(f"train_set has {n} examples: too few for {world.size} processes")
    if lengths is not None:
        lengths = torch.as_tensor(lengths)
        if lengths.shape != (n,):
            raise ValueError(f"lengths must hold one length per training example ({n}), got shape "
                             f"{tuple(lengths.shape)}")
    return batches_per_epoch, lengths


def _start(folder: Path | None, settings: dict, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int,
           epochs: int, world: World, progress: bool) -> tuple[list[dict], bool]:
    """The history so far and whether training had stopped: restored (model, optimizer and RNG states
    included) from the checkpoint in ``folder`` when it holds one for these ``settings``, else empty,
    with every RNG seeded."""
    state = _load(folder, settings) if folder is not None else None
    if state is None:
        _seed_everything(seed, world.rank)
        return [], False
    history, stopped = state["history"], state["stopped"]
    if len(history) > epochs:
        raise ValueError(f"the checkpoint in {folder} holds {len(history)} epochs, more than epochs={epochs}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"][world.rank], world.device)
    log.info("resumed from %s after epoch %d", folder / CHECKPOINT, len(history))
    if progress and world.rank == 0:  # no path: this line can land on a book page
        tqdm.write(f"resumed from its checkpoint after epoch {len(history)}")
    return history, stopped


def _train_epoch(net: nn.Module, optimizer: torch.optim.Optimizer, loader: Iterable, parts: list, loss: str,
                 reduction: str, world: World, bar: tqdm, precision: str = "fp32") -> Tensor:
    """One epoch of optimizer steps over ``loader``'s batches (``parts``: each batch's local indices and
    global size), in training mode; settles a lazily checked last step. Returns this process's
    (loss sum, correct) over the epoch, float64."""
    net.train()
    sums = torch.zeros(2, dtype=torch.float64, device=world.device)  # loss sum, correct
    for batch, (indices, global_count) in zip(loader, parts):
        inputs, labels = _unpack(batch, len(indices), loss)
        with _autocast(precision, world.device):
            mean, correct = _loss(_forward(net, _to(inputs, world.device)), _to(labels, world.device), loss)
        optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over processes: weight each local mean by its share of the
        # global batch (1 when the shares are equal), so the step follows the global mean,
        # times the global batch size for a summed loss.
        share = len(indices) * world.size / global_count * (global_count if reduction == "sum" else 1)
        (mean if share == 1 else mean * share).backward()
        optimizer.step()
        sums += torch.stack([mean.detach().double() * len(indices), correct.double()])
        bar.update()
    settle = getattr(optimizer, "check", None)  # an optimizer that verifies its steps lazily (on a GPU)
    if callable(settle):  # reports a refused last step before the epoch's numbers are recorded
        settle()
    return sums


def _checkpoint_epoch(folder: Path, settings: dict, model: nn.Module, optimizer: torch.optim.Optimizer,
                      history: list[dict], stopped: bool, world: World) -> None:
    """Save the checkpoint after an epoch: rank 0 writes every process's RNG state with the model, the
    optimizer and the history."""
    rng = [_rng_state(world.device)]
    if world.size > 1:  # every process's RNG state, for rank 0 to save
        rng, local = [None] * world.size, rng[0]
        dist.all_gather_object(rng, local)
    if world.rank == 0:
        _save(folder, {"settings": settings, "model": model.state_dict(),
                       "optimizer": optimizer.state_dict(), "history": history,
                       "stopped": stopped, "rng": rng})
