"""What a training batch of a run costs on this machine, measured and cached: the plan's time basis
(``mdlib.book.plan``; ``python -m mdlib plan --measure`` times every shape again).

A run's time is its epochs times an epoch's cost: its training batches, its evaluated batches and its
checkpoint. Those depend on the run's *shape* (:func:`shape`): its kind, the model's dimensions, its
inputs (a text data set's token lengths at ``max_length``; an image set's channels and size), the
batch and its length pools, the optimizer (name, exponent, per-tensor steps) and the precision, never
on its seed or step size. A FLOP count misprices the small models of the default book: at width 24,
fixed costs per operation (the Python and dispatch overhead of each of a step's few hundred kernels,
collation, padding) take most of a step, about 5x what the FLOPs say at one core's throughput.

:func:`measure` times a shape with the trainer itself (``train.fit``, ``train.evaluate``) on
synthetic data of the shape: random token ids whose lengths follow the data set's
(:data:`TOKEN_LENGTHS`; at ``max_length`` where the lengths are not recorded), or random images
through the run's own transforms; the run's model, optimizer, length pools, padding and bookkeeping,
on one thread, in as many processes at once as the chapters train runs (``at_once``: their ``workers``,
at most one per core), so that what two workers cost each other (shared caches, memory bandwidth, a
core's hyperthread sibling) is in the timing. On the CPU it counts each process's CPU seconds, so a
busy neighbour outside the plan inflates it less (it still shares the caches and the host's cores);
on a GPU, wall seconds, one process. Training: an epoch of ``k`` batches and one of ``2k`` after a
warm-up, each the fastest of :data:`REPEATS`, their difference over ``k`` (a fit's fixed costs
cancel); evaluation likewise; the checkpoint: one save of the model and its optimizer's state. ``k``
is chosen for the shorter epoch to take about :data:`TARGET_SECONDS`: a small model's shape takes
about six seconds. (At a quarter of a second, repeated timings of chapter 04's step spread over
31-47 ms; at one second, over 33-38 ms.)

:class:`Timings` keeps them in ``<user cache>/plan-timings.json`` (``$XDG_CACHE_HOME/mdlib``, else
``~/.cache/mdlib``), under this machine's name (host, CPU model, cores; the GPU's name for CUDA) and
torch's version, so a cache shared by several machines (a home folder on a cluster) keeps each one's.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import queue
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mdlib.book import provenance
from mdlib.experiments import paths
from mdlib.runs.files import atomic_write

__all__ = ["CACHE_NAME", "PROBE_ENV", "SHORT_SECONDS", "TOKEN_LENGTHS", "Timing", "Timings", "cores", "machine",
           "measure", "measure_all", "probe", "probe_shape", "probing", "shape"]

CACHE_NAME = "plan-timings.json"
#: The cache's entry of the speed probe (:meth:`Timings.probe`), beside the shapes'.
PROBE_KEY = "speed probe"
#: About how long the shorter timed epoch of a shape takes (with the longer one, each timed
#: ``REPEATS`` times, the fastest kept: about 6x this in all).
TARGET_SECONDS = 1.0
REPEATS = 2
#: A shape not in the cache is timed on first use only where that takes at most about this long (by
#: its FLOPs at one core's throughput); the others are priced by FLOPs until ``plan --measure``.
SHORT_SECONDS = 10.0
#: ``plan --measure`` times a shape whose timing takes at most about this long (the paper's models on a
#: CPU: a few minutes each); a longer one stays priced by FLOPs.
MEASURE_SECONDS = 900.0

#: WordPiece tokens per text ([CLS] and [SEP] included, untruncated) of a data set's training split:
#: {dataset: {tokens: texts}}; a run at ``max_length`` truncates them there. Rotten Tomatoes: the 8,455
#: training snippets of ``sentiment.splits`` (split seed 0), counted 2026-12-06 (mean 26.9 tokens, at
#: most 79). IMDb's are not recorded: its texts are counted at ``max_length`` (an upper bound).
TOKEN_LENGTHS: Mapping[str, Mapping[int, int]] = {"rotten_tomatoes": {
    4: 6, 5: 17, 6: 43, 7: 65, 8: 88, 9: 118, 10: 128, 11: 157, 12: 170, 13: 182, 14: 207, 15: 196, 16: 209,
    17: 223, 18: 280, 19: 273, 20: 277, 21: 249, 22: 268, 23: 299, 24: 290, 25: 269, 26: 299, 27: 296, 28: 303,
    29: 275, 30: 251, 31: 258, 32: 259, 33: 211, 34: 214, 35: 203, 36: 213, 37: 193, 38: 156, 39: 148, 40: 139,
    41: 150, 42: 112, 43: 101, 44: 93, 45: 86, 46: 76, 47: 62, 48: 50, 49: 51, 50: 35, 51: 29, 52: 40, 53: 35,
    54: 22, 55: 25, 56: 9, 57: 14, 58: 4, 59: 7, 60: 5, 61: 1, 62: 6, 63: 3, 64: 3, 65: 1, 68: 1, 72: 1, 79: 1}}


@dataclass(frozen=True)
class Timing:
    """A shape's costs here: seconds per training ``batch``, per evaluated batch (``evaluate``, of the
    run's batch size) and per ``checkpoint``; ``when`` measured (ISO date), on ``device``."""

    batch: float
    evaluate: float
    checkpoint: float
    when: str
    device: str = "cpu"

    def epoch(self, steps: float, evaluated: float, batch_size: int) -> float:
        """Seconds of an epoch of ``steps`` training batches that evaluates ``evaluated`` examples."""
        return steps * self.batch + evaluated / batch_size * self.evaluate + self.checkpoint


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine(device: str = "cpu") -> str:
    """This machine's name as the cache keys it: host, CPU model and cores; for ``cuda``, the GPU's name."""
    name = f"{socket.gethostname()}, {provenance.cpu_model() or platform.machine() or 'unknown CPU'}, {cores()} cores"
    if device != "cpu":
        import torch

        name += f", {torch.cuda.get_device_name(0)}"
    return name


def shape(kind: str, config: Any, at_once: int = 1) -> str:
    """What a training batch's cost depends on (the module's docstring), timed in ``at_once`` processes at
    once, as a canonical JSON text."""
    import torch

    plain = config.to_dict()
    fit, spec = plain["fit"], plain["optimizer"]
    optimizer = {"name": spec["name"], "p": spec.get("p"), "per_tensor": spec.get("matched_p") is not None}
    batch = {"batch_size": fit["batch_size"], "pool": fit.get("pool"), "precision": fit.get("precision", "fp32")}
    model = {k: v for k, v in plain["model"].items() if k not in ("setup", "embedding_std")}  # same compute
    if kind == "e7-vit":
        inputs = {"dataset": plain["data"]["dataset"], "image_size": plain["data"]["image_size"]}
    else:
        inputs = {"dataset": plain["dataset"], "max_length": plain["max_length"]}
    return json.dumps({"kind": kind, "model": model, "inputs": inputs, "batch": batch, "optimizer": optimizer,
                       "at_once": int(at_once), "torch": torch.__version__.split("+")[0]}, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# measuring


def _lengths(config: Any, n: int, rng) -> list[int]:
    """``n`` token lengths drawn from the data set's (:data:`TOKEN_LENGTHS`), truncated at max_length."""
    import numpy as np

    counts = TOKEN_LENGTHS.get(config.dataset)
    if not counts:
        return [config.max_length] * n
    values = np.array(list(counts), dtype=int)
    weights = np.array(list(counts.values()), dtype=float)
    return np.minimum(rng.choice(values, size=n, p=weights / weights.sum()), config.max_length).tolist()


def _text_sets(config: Any):
    """(model factory, data(n, seed, train) -> (dataset, lengths or None), fit's keyword arguments) of a
    sentiment run's shape."""
    import numpy as np

    from mdlib.experiments.sentiment import run, tokens

    def examples(n: int, seed: int, train: bool):
        rng = np.random.default_rng(seed)
        lengths = _lengths(config, n, rng)
        if not train:  # the evaluated splits are sorted by length (``tokens.by_length``)
            lengths = sorted(lengths)
        ids = [[101, *rng.integers(1000, 20000, max(length - 2, 0)).tolist(), 102] for length in lengths]
        return tokens.TokenizedDataset(ids, np.arange(n) % 2), lengths

    return (lambda: run.initial_model(config)), examples, {"collate_fn": tokens.collate}


def _image_sets(config: Any):
    """``_text_sets`` for a vision run: random images through the run's transforms."""
    import numpy as np

    from mdlib.experiments import data, vision

    name, size = config.data.dataset, config.data.image_size
    channels, classes, native = vision.dataset_shape(name)

    def examples(n: int, seed: int, train: bool):
        rng = np.random.default_rng(seed)
        images = rng.integers(0, 256, (n, native, native, channels), dtype=np.uint8)
        return data.ImageDataset(images, np.arange(n) % classes, data.ImageTransform(name, train, size)), None

    return (lambda: vision.make_model(config)), examples, {}


def measure(kind: str, config: Any, device: str = "cpu", target: float = TARGET_SECONDS) -> Timing:
    """Time a training batch, an evaluated batch and a checkpoint of ``config``'s shape here (the module's
    docstring), on one thread."""
    import torch

    from mdlib.experiments import train

    make_model, examples, extra = (_image_sets if kind == "e7-vit" else _text_sets)(config)
    batch_size = config.fit.batch_size
    options = dataclasses.replace(config.fit, epochs=1, stop_train_accuracy=None)

    def clock() -> float:
        if device != "cpu":
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.process_time()

    def fitted(batches: int, seed: int) -> tuple[float, Any, Any]:
        dataset, lengths = examples(batches * batch_size, seed, True)
        model = make_model()
        optimizer = config.optimizer.make(model.parameters())
        start = clock()
        train.fit(model, optimizer, dataset, None, options, lengths=lengths, progress=False, device=device, **extra)
        return clock() - start, model, optimizer

    def evaluated(model, batches: int, seed: int) -> float:
        dataset, _ = examples(batches * batch_size, seed, False)
        start = clock()
        train.evaluate(model, dataset, batch_size=batch_size, loss=options.loss, device=device,
                       precision=options.precision, **extra)
        return clock() - start

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rough, model, optimizer = fitted(2, 1)  # the warm-up, and a first measure of a batch
        k = int(min(64, max(1, target / max(rough / 2, 1e-6))))
        small = min(fitted(k, 2 + 2 * i)[0] for i in range(REPEATS))
        large, model, optimizer = min((fitted(2 * k, 3 + 2 * i) for i in range(REPEATS)), key=lambda found: found[0])
        batch = max(large - small, 0.0) / k
        evaluated(model, 1, 4)
        evaluation = max(min(evaluated(model, 2 * k, 5 + i) for i in range(REPEATS))
                         - min(evaluated(model, k, 7 + i) for i in range(REPEATS)), 0.0) / k
        with tempfile.TemporaryDirectory() as folder:  # the checkpoint of every epoch (``train.fit``)
            start = time.perf_counter()
            path = Path(folder) / "checkpoint.pt"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
            checkpoint = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return Timing(batch, evaluation, checkpoint, _dt.date.today().isoformat(), device)


#: The speed probe (:func:`probe`): the median of this many training steps, after a few unmeasured (about 3 s).
PROBE_STEPS = 30
#: What the probe reads, in words (an executed chapter's ``mdlib.speed`` metadata says it).
PROBE_TEXT = ("the median wall seconds of a training step of chapter 04's default l_1.1 model on a synthetic batch, "
              "one thread")
#: ``$MDLIB_SPEED_PROBE``: on (the default) or off, whether an execution of a chapter reads the probe.
PROBE_ENV = "MDLIB_SPEED_PROBE"


def probe_shape() -> tuple[str, Any]:
    """The speed probe's run: chapter 04's default l_1.1 run (the book's longest training) as (kind, config)."""
    from mdlib.experiments import sentiment

    return "e4-sentiment", sentiment.run_config(layers=3, optimizer="md", p=1.1, lr=2.4e-3, width=24,
                                                train_size=None, seed=0)


def probe(steps: int = PROBE_STEPS) -> float:
    """How fast this machine is now: the median wall seconds of ``steps`` training steps (forward, backward
    and the optimizer's step, one thread, in this process) of :func:`probe_shape`'s model on one fixed
    synthetic batch of its shape. On the clock, so that what a neighbour takes from the machine shows; a
    median, so that a stray pause does not (on an idle 2-core machine, readings a few seconds apart differ
    by up to about 10 %). A chapter's execution reads it before and after the chapter (``mdlib.book.execute``), the plan
    with its timings (:meth:`Timings.probe`); ``plan --against`` sets them side by side to tell the plan's
    error from the machine's drift."""
    import statistics

    import torch
    import torch.nn.functional as F

    _, config = probe_shape()
    make_model, examples, extra = _text_sets(config)
    dataset, _ = examples(config.fit.batch_size, 0, True)
    inputs, labels = extra["collate_fn"]([dataset[i] for i in range(len(dataset))])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = make_model().train()
        optimizer = config.optimizer.make(model.parameters())
        seconds = []
        for _ in range(steps + 3):
            start = time.perf_counter()
            loss = F.binary_cross_entropy_with_logits(model(**inputs), labels, reduction="sum")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(seconds[3:])


def probing() -> bool:
    """``$MDLIB_SPEED_PROBE``: on (default) or off; a ValueError otherwise."""
    value = os.environ.get(PROBE_ENV, "").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ValueError(f"${PROBE_ENV} is {value!r}: give on (read the machine's speed before and after each "
                         "chapter) or off")
    return value == "on"


def _timed_here(items: list[tuple[str, Any]], device: str, barrier, results, index: int) -> None:
    """A process of ``measure_all``: each shape timed after every process is ready for it."""
    try:
        out = []
        for kind, config in items:
            barrier.wait()
            out.append(dataclasses.asdict(measure(kind, config, device)))
        results.put((index, out, None))
    except BaseException as error:  # noqa: BLE001 - the parent raises it
        barrier.abort()
        results.put((index, None, f"{type(error).__name__}: {error}"))


def measure_all(items: list[tuple[str, Any]], device: str = "cpu", at_once: int = 1) -> list[Timing]:
    """``measure`` of each (kind, config), in ``at_once`` processes at once timing the same shape (their
    mean); in this process when ``at_once`` is 1 or on a GPU."""
    if at_once <= 1 or device != "cpu" or not items:
        return [measure(kind, config, device) for kind, config in items]
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(at_once), context.Queue()
    workers = [context.Process(target=_timed_here, args=(items, device, barrier, results, i), daemon=True)
               for i in range(at_once)]
    for worker in workers:
        worker.start()
    found = []
    try:
        while len(found) < len(workers):
            try:
                found.append(results.get(timeout=1.0))
            except queue.Empty:
                if any(worker.exitcode not in (None, 0) for worker in workers):  # died before it answered
                    raise RuntimeError("timing the plan's model shapes failed: a timing process died (exit codes "
                                       f"{[worker.exitcode for worker in workers]})") from None
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
    errors = [error for _, _, error in found if error]
    if errors:
        raise RuntimeError(f"timing the plan's model shapes failed: {errors[0]}")
    timings = [out for _, out, _ in found]
    return [Timing(**{**each[0], **{name: sum(t[name] for t in each) / len(each)
                                    for name in ("batch", "evaluate", "checkpoint")}})
            for each in zip(*timings)]


# ---------------------------------------------------------------------------------------------
# the cache


class Timings:
    """This machine's timings on ``device`` ("cpu" or "cuda"), each shape timed in ``at_once`` processes at
    once, read from and written to ``path`` (default ``<user cache>/plan-timings.json``). ``prepare``
    times the shapes the cache lacks where ``policy`` allows, all at once: "cached" (none), "short"
    (where :data:`SHORT_SECONDS` allow, by their ``estimate``: the seconds the timing would take) or
    "all" (every shape, timed anew); ``get`` answers from what is cached or prepared (timing a shape
    alone that was not prepared, by the same policy)."""

    def __init__(self, device: str = "cpu", policy: str = "short", path: Path | None = None, at_once: int = 1):
        if policy not in ("cached", "short", "all"):
            raise ValueError(f"policy {policy!r}: cached, short or all")
        self.device, self.policy, self.at_once = device, policy, max(int(at_once), 1)
        self.path = Path(path) if path is not None else paths.user_cache_dir() / CACHE_NAME
        self.machine = machine(device)
        self._fresh: dict[str, Timing | None] = {}
        self._probe: tuple[float, str] | None = None
        self.measured: list[str] = []  #: the shapes this object timed

    def _read(self) -> dict[str, Any]:
        try:
            found = json.loads(self.path.read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def cached(self, key: str) -> Timing | None:
        entry = self._read().get(self.machine, {}).get(key)
        if not isinstance(entry, dict):
            return None
        try:
            return Timing(**entry)
        except TypeError:  # written by another version: timed again
            return None

    def _write(self, found: Mapping[str, Timing | dict]) -> None:
        if not found:
            return
        held = self._read()
        mine = held.setdefault(self.machine, {})
        mine.update({key: dataclasses.asdict(entry) if isinstance(entry, Timing) else dict(entry)
                     for key, entry in found.items()})
        atomic_write(self.path, lambda tmp: tmp.write_text(json.dumps(held, indent=1, sort_keys=True) + "\n",
                                                                 "utf-8"))

    def _wanted(self, estimate: float | None) -> bool:
        limit = {"short": SHORT_SECONDS, "all": MEASURE_SECONDS}.get(self.policy)
        return limit is not None and (estimate is None or estimate <= limit)

    def prepare(self, items: list[tuple[str, Any, float | None]]) -> None:
        """Read or time the shapes of ``items`` (kind, config, the seconds its timing would take)."""
        todo: dict[str, tuple[str, Any]] = {}
        about = 0.0
        for kind, config, estimate in items:
            key = shape(kind, config, self.at_once)
            if key in self._fresh or key in todo:
                continue
            found = None if self.policy == "all" else self.cached(key)
            if found is None and self._wanted(estimate):
                todo[key] = (kind, config)
                about += estimate or 0.0
            else:
                self._fresh[key] = found
        if todo:
            print(f"plan: timing {len(todo)} model shape{'s' * (len(todo) > 1)} on this machine's {self.device}, "
                  f"{self.at_once} at once (about {max(about, 1):.0f} s), once: cached in {self.path}",
                  file=sys.stderr, flush=True)
            before = probe() if self.device == "cpu" else None
            timed = dict(zip(todo, measure_all(list(todo.values()), self.device, self.at_once)))
            self._write(timed)
            if before is not None:  # the machine's speed as of these timings (``plan --against``)
                self._read_probe(before)
            self._fresh.update(timed)
            self.measured += list(timed)

    def probe(self) -> tuple[float, str] | None:
        """(seconds, when) of the speed probe (:func:`probe`) as of these timings (the mean of its readings
        before and after shapes are timed, cached beside them); None where it has not been read on this
        machine."""
        if self._probe is None:
            entry = self._read().get(self.machine, {}).get(PROBE_KEY)
            if isinstance(entry, dict) and {"seconds", "when"} <= set(entry):
                self._probe = (float(entry["seconds"]), str(entry["when"]))
        return self._probe

    def _read_probe(self, before: float) -> tuple[float, str]:
        """Read the speed probe now, and cache the mean of that and its reading ``before`` the timings (as a
        chapter's execution reads it: the machine's speed drifts by a fifth within minutes)."""
        self._probe = ((before + probe()) / 2, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        self._write({PROBE_KEY: {"seconds": self._probe[0], "when": self._probe[1]}})
        return self._probe

    def get(self, kind: str, config: Any, estimate: float | None = None) -> Timing | None:
        """The shape's timing: cached or prepared, else measured now where the policy allows, else None."""
        key = shape(kind, config, self.at_once)
        if key not in self._fresh:
            self.prepare([(kind, config, estimate)])
        return self._fresh[key]
