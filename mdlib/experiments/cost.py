"""What the optimizers and the chapters' models cost per step: the timing harness (interleaved rounds in
a seeded random order, medians, bootstrap intervals of round-by-round ratios) and chapter 08's tables
(``step_tables``, ``ops_table``, ``training_table``, ``vit_table``: DataFrames). ``python -m mdlib bench``
(``mdlib.book.bench``) reports the same measurements against its targets.

Timings on shared 2-core machines are noisy: each measurement interleaves the contenders, repeats,
and reports medians and ratios measured side by side in one run.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence, TypeVar

from mdlib.experiments import paper

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from numpy.typing import ArrayLike
    from torch import Tensor, nn

_T = TypeVar("_T")

# OpenMP threads spin while waiting; a passive policy keeps a neighbour's load from distorting timings.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


#: How a model's parameters split into tensors (a few large, several small), scaled to any total.
TENSOR_SPLIT = (0.4, 0.2, 0.2, 0.1, 0.05, 0.03, 0.02)


#: The optimizer-step contenders from torch, by name: (class, keyword arguments). "default" is what the
#: class does when told nothing (on CPU: the single-tensor loop; on CUDA: foreach).
TORCH_CONTENDERS = {"sgd_default": ("SGD", {}), "sgd_fused": ("SGD", {"fused": True}),
                    "adam_default": ("Adam", {}), "adam_foreach": ("Adam", {"foreach": True}),
                    "adam_fused": ("Adam", {"fused": True})}


#: LpMirrorDescent's implementations timed, as its arguments ("-unchecked": without the per-step check
#: that parameters were not edited outside the optimizer, ``check_edits=False``).
MD_MODES = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True},
            "default-unchecked": {"check_edits": False}, "fused-unchecked": {"fused": True, "check_edits": False}}


#: Chapter 08's targets (issue 11), per mode: (reference, largest median ratio allowed).
STEP_TARGETS = {"default": ("adam_default", 1.0), "fused": ("adam_fused", 1.10)}


def choice(name: str, value: _T, allowed: Iterable[object]) -> _T:
    """``value`` if it is one of ``allowed``, else a ValueError naming the parameter ``name``, the value and
    the allowed values: chapter 08 checks its parameters of a closed set with it before any timing."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"parameter {name!r}: {value!r} is not one of {', '.join(map(repr, allowed))}; "
                         "give one of them")
    return value


def optimizer_step_times(total: int, ps: Iterable[float] = (1.1, 1.75, 3.0), repeats: int = 31,
                         modes: Sequence[str] = ("default", "fused"), seed: int = 0,
                         torch_contenders: Mapping[str, tuple[str, dict]] = TORCH_CONTENDERS
                         ) -> dict[str, list[float]]:
    """Seconds per optimizer step on ``total`` float32 parameters (split as ``TENSOR_SPLIT``), for the
    torch optimizers of ``torch_contenders`` and LpMirrorDescent at each p in each mode of ``MD_MODES``
    (named ``md_p{p}_{mode}``); after two warm-up steps (which also compile), the contenders take one
    step each per round, in a new random order every round (seeded). Returns {contender: [seconds per
    round]}."""
    import torch

    from mdlib.optim import LpMirrorDescent

    generator = torch.Generator().manual_seed(seed)
    sizes = [max(1, round(total * share)) for share in TENSOR_SPLIT]

    def make(factory):
        params = [torch.nn.Parameter(torch.randn(n, generator=generator) * 0.05) for n in sizes]
        for w in params:
            w.grad = torch.randn(w.shape, generator=generator) * 1e-3
        return factory(params)

    contenders = {name: make(lambda ps_, cls=cls, kw=kw: getattr(torch.optim, cls)(ps_, lr=1e-3, **kw))
                  for name, (cls, kw) in torch_contenders.items()}
    for p in ps:
        for mode in modes:
            contenders[f"md_p{p:g}_{mode}"] = make(
                lambda ps_, p=p, mode=mode: LpMirrorDescent(ps_, lr=1e-3, p=p, **MD_MODES[mode]))
    for opt in contenders.values():
        opt.step()
        opt.step()
    rounds = {name: [] for name in contenders}
    order = random.Random(seed)
    for _ in range(repeats):
        names = list(contenders)
        order.shuffle(names)  # no contender always follows the same one (caches, dirty lines, clocks)
        for name in names:
            rounds[name].append(median_time(contenders[name].step, 1))
    return rounds


def step_ratios(rounds: dict[str, list[float]],
                targets: Mapping[str, tuple[str, float | None]] = STEP_TARGETS) -> dict[str, dict]:
    """For each mirror-descent contender ``md_p{p}_{mode}`` whose mode is in ``targets``: the median over
    rounds of its time over the reference's in the same round, its 95 % interval, the reference and the
    target."""
    out = {}
    for name in rounds:
        mode = name.rsplit("_", 1)[-1]
        if not name.startswith("md_") or mode not in targets:
            continue
        reference, target = targets[mode]
        out[name] = {"vs": reference, **ratio_entry(rounds[name], rounds[reference], target)}
    return out


def ratio_entry(times: list[float], reference: list[float], target: float | None, *, key: str = "median_ratio",
                at_least: bool = False) -> dict:
    """The round-by-round ratios times[i] / reference[i] summarised: their median (as ``key``, rounded to
    3 digits), its 95 % interval, the target, and whether the median is met: <= target, or >= target
    with ``at_least`` (a speedup); None without a target."""
    ratios = [a / b for a, b in zip(times, reference)]
    median = statistics.median(ratios)
    met = None if target is None else median >= target if at_least else median <= target
    return {key: round(median, 3), "ci95": [round(x, 3) for x in median_interval(ratios)], "target": target,
            "met": met}


def interleaved_rounds(steps: Mapping[str, Callable[[], object]], repeats: int, seed: int, *, warmup: int,
                       per_call: int = 1) -> dict[str, list[float]]:
    """Seconds of each step: ``warmup`` untimed calls each, then ``repeats`` rounds that time one call of
    every step, in an order shuffled by ``random.Random(seed)`` each round; each time divided by
    ``per_call`` (the work units one call does). Returns {step: [seconds, one per round]}."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    rounds = {name: [] for name in steps}
    order = random.Random(seed)
    for _ in range(repeats):
        names = list(steps)
        order.shuffle(names)
        for name in names:
            rounds[name].append(median_time(steps[name], 1) / per_call)
    return rounds


def median_interval(values: ArrayLike, confidence: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` (seeded)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    draws = np.random.default_rng(seed).choice(values, size=(resamples, len(values)))
    low, high = np.quantile(np.median(draws, axis=1), [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


#: The training steps timed: the models of chapters 04 (sentiment encoder) and 07 (ViT) at the default
#: profile's sizes, a batch of 100 (their batch size).
TRAINING_MODELS = ("sentiment", "vit")


#: The optimizers of the training-step comparison, as ``methods.make_optimizer`` arguments (what the
#: chapters run): Adam, and mirror descent at each p (small steps: the time does not depend on them).
TRAINING_OPTIMIZERS = {"adam": ("adam", 1e-4, None), "md_p1.1": ("md", 1e-4, 1.1), "md_p1.75": ("md", 1e-4, 1.75),
                       "md_p2": ("md", 1e-4, 2.0), "md_p3": ("md", 1e-4, 3.0)}


#: How chapter 08's tables write the models of ``TRAINING_MODELS``.
TRAINING_MODEL_NAMES = {"sentiment": "sentiment encoder (04)", "vit": "ViT (07)"}


#: Chapter 08's target for a training step (and ``bench optimizer``'s): mirror descent's median ratio
#: to Adam's at most this.
TRAINING_TARGET = 1.10


def step_tables(sizes: Iterable[int], ps: Iterable[float], repeats: int = 31,
                modes: Sequence[str] = ("default", "fused")) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chapter 08's optimizer steps (``optimizer_step_times`` at each size of ``sizes``, mirror descent at
    each p but 2, which is SGD): (steps, targets). ``steps``: per size and contender, the median ms of a
    step, the median ns per parameter and the median over rounds of the ratio to fused Adam's step;
    ``targets``: per size and mirror-descent contender with a target (``step_ratios``), its median ratio
    to the reference, the 95 % interval and the target."""
    import pandas as pd

    rows, targets = [], []
    for total in sizes:
        rounds = optimizer_step_times(total, ps=[p for p in ps if p != 2.0], repeats=repeats, modes=modes)
        for name, seconds in rounds.items():
            ratio = statistics.median(a / b for a, b in zip(seconds, rounds["adam_fused"]))
            rows.append({"params": total, "optimizer": name, "ms": 1e3 * statistics.median(seconds),
                         "ns_per_param": 1e9 * statistics.median(seconds) / total, "vs_adam_fused": ratio})
        for name, r in step_ratios(rounds).items():
            targets.append({"params": total, "optimizer": name, "reference": r["vs"], "median_ratio": r["median_ratio"],
                            "ci95_low": r["ci95"][0], "ci95_high": r["ci95"][1], "target": r["target"]})
    return pd.DataFrame(rows), pd.DataFrame(targets, columns=["params", "optimizer", "reference", "median_ratio",
                                                              "ci95_low", "ci95_high", "target"])


def ops_table(steps: pd.DataFrame, ps: Iterable[float], modes: Sequence[str] = ("default", "fused")) -> pd.DataFrame:
    """Chapter 08's table-cost: the paper's operations per parameter (``paper.OPS_PER_PARAMETER``) next to
    the ns per parameter of one step at the largest size of ``steps`` (``step_tables``), per optimizer
    and implementation: SGD (mirror descent at p = 2), Adam, and mirror descent at each p but 2 in
    ``modes``; optimizers written by ``methods.method_text``."""
    import pandas as pd

    from mdlib.experiments.methods import method_text

    ops = paper.OPS_PER_PARAMETER
    largest = steps[steps.params == steps.params.max()].set_index("optimizer").ns_per_param
    rows = [(method_text("sgd"), mode, ops["GD"], f"sgd_{mode}") for mode in ("default", "fused")]
    rows += [(method_text("adam"), mode, ops["Adam"], f"adam_{mode}") for mode in ("default", "foreach", "fused")]
    rows += [(method_text("md", p), mode, ops["MD"], f"md_p{p:g}_{mode}") for p in ps if p != 2.0 for mode in modes]
    return pd.DataFrame([{"optimizer": f"{name} ({mode})", "paper ops per param": count,
                          "ns per param (step, largest size)": largest[contender]}
                         for name, mode, count, contender in rows])


def training_table(repeats: int = 21) -> pd.DataFrame:
    """Chapter 08's table-cost-training: per model of ``TRAINING_MODELS`` (written as
    ``TRAINING_MODEL_NAMES``) and optimizer of ``TRAINING_OPTIMIZERS`` (``methods.method_text``; its
    key in ``method``), the median ms of a training step (``training_step_times``), the median over
    rounds of its ratio to Adam's step in the same round and that median's 95 % interval
    (``median_interval``: as text in ``ci95``, as numbers in ``ci_low`` and ``ci_high``)."""
    import pandas as pd

    from mdlib.experiments import methods

    rows = []
    for which in TRAINING_MODELS:
        times = training_step_times(which, repeats=repeats)
        for name, seconds in times.items():
            ratios = [a / b for a, b in zip(seconds, times["adam"])]
            low, high = median_interval(ratios)
            optimizer, _, p = TRAINING_OPTIMIZERS[name]
            rows.append({"model": TRAINING_MODEL_NAMES[which], "optimizer": methods.method_text(optimizer, p),
                         "ms per step": 1e3 * statistics.median(seconds),
                         "vs Adam (median ratio)": statistics.median(ratios), "ci95": f"{low:.2f}-{high:.2f}",
                         "method": methods.method_key(optimizer, p), "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)


def training_setup(which: str, seed: int = 0) -> tuple[Callable[[], nn.Module], Tensor | dict[str, Tensor], Tensor,
                                                      Callable[[Tensor, Tensor], Tensor]]:
    """(model factory, inputs, labels, loss function) of one training step of a chapter's default run:
    "sentiment" (04: width 24, 3 layers and heads, 64 positions, sentences of 32 WordPiece tokens) or
    "vit" (07: Fashion-MNIST 28 px, patch 7, width 64, depth 3, 4 heads, MLP 64)."""
    import torch
    import torch.nn.functional as F

    from mdlib.experiments import sentiment
    from mdlib.models import VisionTransformer

    generator = torch.Generator().manual_seed(seed)
    if which == "sentiment":
        config = sentiment.run_config(layers=3, optimizer="adam", lr=1e-3, width=24, max_length=64)
        ids = torch.randint(1000, 30000, (100, 32), generator=generator)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)}
        labels = torch.randint(0, 2, (100,), generator=generator).double()
        return (lambda: sentiment.initial_model(config), inputs, labels,
                lambda logits, y: F.binary_cross_entropy_with_logits(logits.reshape(-1), y.to(logits.dtype),
                                                                     reduction="sum"))
    if which == "vit":
        images = torch.randn((100, 1, 28, 28), generator=generator)
        labels = torch.randint(0, 10, (100,), generator=generator)

        def make():
            torch.manual_seed(seed)
            return VisionTransformer(image_size=28, patch=7, channels=1, classes=10, width=64, depth=3, heads=4,
                                     mlp=64)
        return make, images, labels, F.cross_entropy
    raise ValueError(f"unknown training setup {which!r}; choose one of {', '.join(TRAINING_MODELS)}")


def training_step_times(which: str, repeats: int = 21, threads: int = 1, seed: int = 0,
                        optimizers: Mapping[str, tuple[str, float, float | None]] | None = None
                        ) -> dict[str, list[float]]:
    """Seconds per training step (forward, loss, backward, optimizer step) of ``training_setup(which)``
    with each optimizer of ``TRAINING_OPTIMIZERS`` (through ``methods.make_optimizer``, as the chapters
    build them), on ``threads`` threads (the chapters' runs: one each), interleaved round by round in a
    seeded random order after two warm-up steps. Returns {optimizer: [seconds per round]}."""
    import torch

    from mdlib.experiments import methods

    make, inputs, labels, loss_fn = training_setup(which, seed)
    specs = TRAINING_OPTIMIZERS if optimizers is None else optimizers
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        steps = {}
        for name, (kind, lr, p) in specs.items():
            model = make()
            opt = methods.make_optimizer(model.parameters(), kind, lr, p)

            def step(model=model, opt=opt):
                opt.zero_grad(set_to_none=True)
                out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
                loss_fn(out, labels).backward()
                opt.step()
            steps[name] = step
        return interleaved_rounds(steps, repeats, seed, warmup=2)
    finally:
        torch.set_num_threads(before)


def training_step_time(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Tensor | dict[str, Tensor],
                       labels: Tensor, loss_fn: Callable[[Tensor, Tensor], Tensor], repeats: int = 3) -> float:
    """Median seconds of one training step (forward, loss, backward, optimizer step) after one warm-up;
    ``inputs`` a tensor or the model's keyword arguments. On CUDA each step ends with a synchronization,
    so the time is the GPU's work, not its launch."""
    import torch

    cuda = next(model.parameters()).is_cuda

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        loss_fn(out, labels).backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    step()
    return median_time(step, repeats)


#: Chapter 08's ViTs to time, as ``VisionTransformer`` arguments: the paper's (CIFAR) and a tiny one.
VIT_MODELS = {"paper": {"image_size": paper.VIT_IMAGE_SIZE, "channels": 3, **paper.VIT_MODEL},
              "tiny": {"image_size": 28, "patch": 7, "channels": 1, "width": 64, "depth": 2, "heads": 4, "mlp": 64}}


def vit_table(vit: str = "paper", batch: int = 100, repeats: int = 3, ps: Iterable[float] = (1.1, 1.75, 2.0, 3.0),
              device: str = "cpu") -> pd.DataFrame:
    """Chapter 08's table-cost-vit: one training step of the ViT ``VIT_MODELS[vit]`` (10 classes, random
    images, a batch of ``batch``) on ``device`` with Adam and with mirror descent at each p, every one at
    step size 1e-4 (``training_step_time``: the median of ``repeats`` steps after one warm-up): seconds
    per step, the model's parameters, and the hours of the paper's ``VIT_EPOCHS`` epochs of 50,000
    images (CIFAR's training set) at that step time. Optimizers written by ``methods.method_text``."""
    import pandas as pd
    import torch

    from mdlib.experiments.methods import method_text
    from mdlib.models import VisionTransformer
    from mdlib.optim import LpMirrorDescent

    spec = VIT_MODELS[choice("vit", vit, VIT_MODELS)]
    shape = (spec["channels"], spec["image_size"], spec["image_size"])
    optimizers = {method_text("adam"): lambda params: torch.optim.Adam(params, lr=1e-4)}
    for p in ps:
        optimizers[method_text("md", p)] = lambda params, p=p: LpMirrorDescent(params, lr=1e-4, p=p)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn((batch, *shape), generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    rows = []
    for name, factory in optimizers.items():
        torch.manual_seed(0)
        model = VisionTransformer(**spec).to(device)
        seconds = training_step_time(model, factory(model.parameters()), images, labels,
                                     torch.nn.functional.cross_entropy, repeats=repeats)
        rows.append({"optimizer": name, "step_s": seconds, "params": sum(w.numel() for w in model.parameters())})
    table = pd.DataFrame(rows)
    return table.assign(hours_2000_epochs=table.step_s * (50000 // batch) * paper.VIT_EPOCHS / 3600)
