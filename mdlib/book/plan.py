"""What a profile costs before anything runs: ``python -m mdlib plan --profile NAME``.

Per notebook, from its parameters at the profile: the training runs (the distinct runs of its grids,
as the results store keys them), their epochs and steps, the data it reads, and an estimated time.
Nothing is trained, fetched or installed: the counts come from the run configs
(``mdlib.experiments.workload``), the times from measured costs, each named:

- the transformer chapters (04-07): FLOPs at a measured throughput. On a GPU, the paper's own: one
  V100 ran its vision transformer on CIFAR-10 for 2,000 epochs in 29 hours (Appendix G.7), which
  fixes seconds per FLOP of that model; on a CPU, one core's measured throughput
  (:data:`CPU_SECONDS_PER_TFLOP`, or ``--measure`` on this machine).
- the synthetic chapters (01-03), the cost benchmark (08) and the step-size guide (09, whose tiny
  model's steps cost far more than their FLOPs), which run on the CPU: their measured time at the
  default profile (``mdlib.book.chapters.OnCpu``), scaled by their steps.

What each chapter runs, its data and its measured time are the registry's (``mdlib.book.chapters``);
this module turns them into counts and hours.

Hours are one device's (one GPU, or one CPU core): runs trained at once on N GPUs or ``workers`` CPU
processes divide the wall time by up to N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from mdlib.experiments import paper, workload
from mdlib.book import chapters, profiles

__all__ = ["CPU_SECONDS_PER_TFLOP", "Costs", "FlopRate", "Stage", "StepTimer", "chapter_runs", "default_costs",
           "gpu_seconds_per_tflop", "markdown", "measure_cpu", "measured_costs", "plan", "planned_seconds", "text"]

#: Seconds per 10^12 training FLOPs on one core of this project's 2-core CPU machine (torch 2.14.1,
#: float32, one thread), as :func:`measure_cpu` measures it: 14.5-14.8 on an idle machine, 14.9-16.4
#: beside another busy process (2026-12-02).
CPU_SECONDS_PER_TFLOP = 14.6
CPU_SOURCE = "one core of a 2-core CPU at its measured throughput (2026-12-02), by FLOPs"


def gpu_seconds_per_tflop() -> float:
    """Seconds per 10^12 training FLOPs on one V100, from the paper: 29 hours for 2,000 epochs of its
    vision transformer on CIFAR-10 (50,000 images, batch 100; Appendix G.7), its evaluations not
    counted."""
    from mdlib.experiments import vision

    config = vision.run_config("cifar10", optimizer="adam", lr=1e-4, seed=0, epochs=paper.VIT_EPOCHS,
                               image_size=paper.VIT_IMAGE_SIZE, eval_every=paper.VIT_EPOCHS, model=paper.VIT_MODEL)
    work = workload.vision_work(config)
    train_flops = 3 * work.forward_flops * work.batch_size * work.steps_per_epoch * work.epochs
    return paper.VIT_HOURS["cifar10"] * 3600 / (train_flops / 1e12)


GPU_SOURCE = "one V100 at the paper's throughput (its ViT: 29 h for 2,000 CIFAR-10 epochs, Appendix G.7), by FLOPs"


class FlopRate:
    """Time from FLOPs at a fixed throughput: ``seconds_per_tflop`` (``source`` names it)."""

    def __init__(self, seconds_per_tflop: float, source: str):
        self.seconds_per_tflop, self.source = seconds_per_tflop, source

    def run_seconds(self, kind: str, config: Mapping[str, Any], work: workload.RunWork) -> float:
        return work.flops() / 1e12 * self.seconds_per_tflop

    def forward_seconds(self, kind: str, config: Mapping[str, Any], examples: float) -> float:
        return examples * workload.run_work(kind, config).forward_flops / 1e12 * self.seconds_per_tflop


class StepTimer:
    """Time from training steps measured here, on ``device``: per model shape, the median of three
    steps (after a warm-up) of the config's model with ℓ1.1 mirror descent on ``small`` and on
    ``large`` random examples, fitted as ``overhead + examples * per_example`` (the fixed cost of a
    step, which dominates small models, and the cost of each example); a step of the config's batch
    is priced by that line, an evaluated example at a third of a trained one."""

    def __init__(self, device: str, source: str, small: int = 2, large: int = 8):
        self.device, self.source, self.small, self.large = device, source, small, large
        self._cache: dict[str, tuple[float, float]] = {}

    def step_cost(self, kind: str, config: Mapping[str, Any]) -> tuple[float, float]:
        """(seconds of a step's fixed cost, seconds per example) of the config's model, cached per shape."""
        import json

        shape = {"model": config.model.to_dict(), **({"data": [config.data.dataset, config.data.image_size]}
                                                      if kind == "e7-vit" else {"tokens": config.max_length})}
        key = json.dumps([kind, shape], sort_keys=True, default=str)
        if key not in self._cache:
            small, large = (_time_steps(kind, config, n, self.device) for n in (self.small, self.large))
            per_example = max(large - small, 0.0) / (self.large - self.small)
            self._cache[key] = (max(small - self.small * per_example, 0.0), per_example)
        return self._cache[key]

    def run_seconds(self, kind: str, config: Mapping[str, Any], work: workload.RunWork) -> float:
        overhead, per_example = self.step_cost(kind, config)
        train = work.steps_per_epoch * (overhead + work.batch_size * per_example)
        evaluate = work.eval_examples_per_epoch / work.batch_size * (overhead + work.batch_size * per_example / 3)
        return work.epochs * (train + evaluate)

    def forward_seconds(self, kind: str, config: Mapping[str, Any], examples: float) -> float:
        overhead, per_example = self.step_cost(kind, config)
        batch = workload.run_work(kind, config).batch_size
        return examples / batch * (overhead + batch * per_example / 3)


def _time_steps(kind: str, config: Mapping[str, Any], examples: int, device: str) -> float:
    """The median seconds of three training steps (after one warm-up; ``bench.training_step_time``) of
    the config's model on ``examples`` random inputs of its shape (texts at ``max_length`` tokens)."""
    import torch
    import torch.nn.functional as F

    from mdlib import LpMirrorDescent
    from mdlib.book import bench
    from mdlib.experiments import sentiment, vision

    if kind == "e7-vit":
        model = vision.make_model(config)
        channels, classes, _ = vision.DATASETS[config.data.dataset]
        size = config.data.image_size
        inputs, labels = torch.randn(examples, channels, size, size), torch.randint(0, classes, (examples,))
        loss = F.cross_entropy
    else:
        model = sentiment.initial_model(config)
        ids = torch.randint(1000, 2000, (examples, config.max_length))
        inputs, labels = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.randint(0, 2, (examples,))
        loss = lambda logits, y: F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))  # noqa: E731
    model.to(device).train()
    inputs = {k: v.to(device) for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.to(device)
    optimizer = LpMirrorDescent(model.parameters(), lr=1e-6, p=1.1)
    return bench.training_step_time(model, optimizer, inputs, labels.to(device), loss, repeats=3)


@dataclass(frozen=True)
class Costs:
    """How the plan turns work into hours: on a GPU and on a CPU (``FlopRate`` or ``StepTimer``)."""

    gpu: FlopRate | StepTimer
    cpu: FlopRate | StepTimer


def default_costs() -> Costs:
    """The paper's V100 throughput and this project's measured CPU core, both by FLOPs."""
    return Costs(FlopRate(gpu_seconds_per_tflop(), GPU_SOURCE), FlopRate(CPU_SECONDS_PER_TFLOP, CPU_SOURCE))


def measured_costs() -> Costs:
    """Steps timed on this machine: on its GPU when torch sees one (the CPU column then by FLOPs),
    else on one CPU thread (the GPU column then the paper's V100 by FLOPs)."""
    import torch

    costs = default_costs()
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return Costs(StepTimer("cuda", f"{name}, training steps measured here now (plan --measure)"), costs.cpu)
    torch.set_num_threads(1)
    return Costs(costs.gpu, StepTimer("cpu", "one thread of this machine's CPU, training steps measured here now "
                                             "(plan --measure)"))


@dataclass(frozen=True)
class Stage:
    """One line of the plan: what a notebook runs and what it costs. ``runs``: training runs (for the
    synthetic chapters: trials; 0: an analysis or benchmark); ``epochs`` per run, expected, and
    ``epochs_cap``, the most; ``steps`` in all, expected and at most (``steps_cap``), in ``unit``;
    ``gpu_hours`` (None: the chapter runs on the CPU) and ``cpu_hours``, expected; ``bound``: these
    expectations are upper bounds (runs a stop rule may end sooner); ``note``: where they come from."""

    notebook: str
    what: str
    runs: int
    epochs: float | None
    epochs_cap: int | None
    steps: float
    steps_cap: float
    unit: str
    data: tuple[str, ...]
    gpu_hours: float | None
    cpu_hours: float
    note: str
    bound: bool = False


def _runs_stage(notebook: str, what: str, runs: Mapping[str, tuple[str, Mapping[str, Any]]], data: tuple[str, ...],
                costs: Costs) -> Stage:
    works = [(kind, config, workload.run_work(kind, config)) for kind, config in runs.values()]
    note = "; ".join(sorted({w.expected_from for _, _, w in works}))
    if any(w.tokens_bound for _, _, w in works):
        note += "; texts counted at max_length tokens (an upper bound)"

    def hours(rate: FlopRate | StepTimer) -> float:
        return sum(rate.run_seconds(kind, config, w) for kind, config, w in works) / 3600

    return Stage(notebook, what, len(works), sum(w.epochs for _, _, w in works) / max(len(works), 1),
                 max((w.epochs_cap for _, _, w in works), default=0), sum(w.steps() for _, _, w in works),
                 sum(w.steps(w.epochs_cap) for _, _, w in works), "steps", data, hours(costs.gpu), hours(costs.cpu),
                 note, any(w.bound for _, _, w in works))


def _evaluation_stage(notebook: str, what: str, kind: str, config: Mapping[str, Any], examples: float,
                      data: tuple[str, ...], costs: Costs) -> Stage:
    return Stage(notebook, what, 0, None, None, examples, examples, "evaluated examples", data,
                 costs.gpu.forward_seconds(kind, config, examples) / 3600,
                 costs.cpu.forward_seconds(kind, config, examples) / 3600, "forward passes only")


def _on_cpu(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], costs: Costs) -> list[Stage]:
    """A CPU chapter's stage: (trials, steps) from its parameters, its time scaled from its measured
    time at the default profile."""
    work = chapters.chapter(notebook).work
    trials, count = work.count(values)
    hours = _cpu_seconds(notebook, values) / 3600
    return [Stage(notebook, work.what, trials, None, None, count, count, work.unit, data, None, hours,
                  f"{work.where}; scaled from its measured {work.measured.seconds:.0f} s at the default profile "
                  f"({work.measured.when})")]


def _cpu_seconds(notebook: str, values: Mapping[str, Any]) -> float:
    """A CPU chapter's time at ``values``: its measured time at the default profile, scaled by its steps."""
    work = chapters.chapter(notebook).work
    _, count = work.count(values)
    _, default_count = work.count(profiles.executed_parameters(notebook, "default"))
    return work.measured.seconds * count / default_count


def _sentiment(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], costs: Costs) -> list[Stage]:
    """Chapter 04's stages: the replication's grid, the variation's, the series (its runs that the variation
    does not hold) and the 2 x 2s' arms (their steps follow the bases' first candidates: the same count of
    runs whatever the sweep chooses); a run two stages hold counts in the first. Grown candidates are not
    counted; a grid with ``tied_finals`` counts every seed at every candidate (at most)."""
    out = []
    for what, runs in _sentiment_runs(values):
        if runs or what.startswith("Table 1 grid"):
            out.append(_runs_stage(notebook, what, runs, data, costs))
    return out


def _sentiment_runs(values: Mapping[str, Any]) -> list[tuple[str, dict[str, tuple[str, Any]]]]:
    """Chapter 04's stages (``_sentiment``) as (what, the runs by store key that no earlier stage holds)."""
    from mdlib.experiments import allocation, sentiment

    table1, variation = sentiment.chapter_grids(**values)
    chosen = {(L, key): variation.multiples[key][0] for L in variation.layers[:1] for key in variation.methods}
    series = allocation.series_grids(variation, values.get("series_stds") or [], values.get("series_epochs", 0),
                                     values.get("series_multiples", {}), min(variation.seeds_of(k) for k in variation.methods),
                                     values.get("grow", 0))
    by_std = {allocation.SMALL_EMBEDDING_STD: variation} | {g.embedding_std: g for g in series}
    arms = [allocation.ArmGrid(base=by_std[std], multiples=list(values.get("allocation_multiples", [1.0])),
                               seeds=variation.seeds_of(variation.methods[0]), grow=values.get("grow", 0),
                               tied_finals=bool(values.get("tied_finals")))
            for std in values.get("allocation_stds") or [] if std in by_std]
    stages = [("Table 1 grid (replication)", workload.grid_runs([table1.design()])),
              (f"Table 1, variation ({variation.setup})", workload.grid_runs([variation.design()])),
              ("embedding-scale series", workload.grid_runs([g.design() for g in series])),
              ("Table 1, the 2 x 2s' per-tensor arms", workload.grid_runs([a.design(chosen) for a in arms]))]
    seen: set[str] = set()
    out = []
    for what, runs in stages:
        runs = {key: run for key, run in runs.items() if key not in seen}
        seen |= set(runs)
        out.append((what, runs))
    return out


def _read_grid(notebook: str, values: Mapping[str, Any]):
    """The grid a reading chapter analyses: the one the chapter it reads builds for it (its parameter
    ``analysed``) at the profile it reads (``table1``, else its own), from that chapter's parameters."""
    from mdlib.experiments import sentiment

    (builder,) = chapters.chapter(notebook).reads
    built = profiles.executed_parameters(builder, chapters.table1_profile(values))
    grids = dict(zip(sentiment.GRIDS, sentiment.chapter_grids(**built)))
    return grids[built["analysed"]]


def _evaluates(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], costs: Costs) -> list[Stage]:
    """Forward passes through the models at ``depth`` of the grid the chapter reads (no training)."""
    chapter = chapters.chapter(notebook)
    work = chapter.work
    grid = _read_grid(notebook, values)
    runs = [config for _, config in workload.grid_runs([grid.design()]).values()
            if config.model.layers == values["depth"]]
    if not runs:
        return [Stage(notebook, work.what, 0, None, None, 0, 0, "evaluated examples", data, 0.0, 0.0,
                      f"no models of depth {values['depth']} in the grid of {', '.join(chapter.reads)}")]
    examples = len(runs) * work.per_model(values, workload.SPLITS[grid.dataset])
    return [_evaluation_stage(notebook, work.what, "e4-sentiment", runs[0], examples, data, costs)]


def _vision(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], costs: Costs) -> list[Stage]:
    sweep, finals = _vision_runs(values)
    stages = [_runs_stage(notebook, "step-size sweep (validation images)", sweep, data, costs),
              _runs_stage(notebook, "final runs", finals, data, costs)]
    tests = sum(workload.SPLITS[config.data.dataset][2] for _, config in finals.values())
    stages.append(_evaluation_stage(notebook, "pruning curves of the final runs", "e7-vit",
                                    next(iter(finals.values()))[1], tests * len(values["sparsities"]), data, costs))
    return stages


def _vision_runs(values: Mapping[str, Any]) -> tuple[dict[str, tuple[str, Any]], dict[str, tuple[str, Any]]]:
    """Chapter 07's runs by store key: (the sweep's, on validation images; the final runs)."""
    from mdlib.experiments import vision

    swept, at_paper = vision.chapter_grids(**values)
    sweep = {key: run for key, run in workload.grid_runs([swept.design()]).items() if run[1].data.validation}
    finals = {key: run for key, run in workload.grid_runs([swept.design(), at_paper.design()]).items()
              if key not in sweep}
    return sweep, finals


def chapter_runs(notebook: str, values: Mapping[str, Any]) -> dict[str, tuple[str, Any]] | None:
    """The distinct training runs, by store key (``(kind, config)``), that chapter ``notebook`` trains at
    its parameter ``values``, as the plan counts them (grown candidates not counted); None for a chapter
    whose work the plan counts otherwise (trials, timed steps, forward passes)."""
    work = chapters.chapter(notebook).work
    if isinstance(work, chapters.SentimentGrids):
        return {key: run for _, runs in _sentiment_runs(values) for key, run in runs.items()}
    if isinstance(work, chapters.VisionGrids):
        sweep, finals = _vision_runs(values)
        return sweep | finals
    return None


def planned_seconds(notebook: str, values: Mapping[str, Any]) -> float | None:
    """The time chapter ``notebook`` takes at its parameter ``values`` where the plan scales it from the
    chapter's measured time (a chapter that runs on the CPU, ``chapters.OnCpu``); None otherwise."""
    if not isinstance(chapters.chapter(notebook).work, chapters.OnCpu):
        return None
    return _cpu_seconds(notebook, values)


#: How the plan costs each kind of chapter work (``mdlib.book.chapters``).
STAGES: Mapping[type, Callable[[str, Mapping[str, Any], tuple[str, ...], Costs], list[Stage]]] = {
    chapters.OnCpu: _on_cpu, chapters.SentimentGrids: _sentiment, chapters.VisionGrids: _vision,
    chapters.Evaluates: _evaluates}


def plan(profile: str, costs: Costs | None = None) -> list[Stage]:
    """Every chapter's stages at ``profile`` (``params/<profile>.yaml``), in the book's order, costed
    by ``costs`` (default: ``default_costs()``)."""
    profiles.load_profile(profile)
    profiles.check_notebooks()
    costs = costs or default_costs()
    stages: list[Stage] = []
    for name in chapters.NAMES:
        chapter = chapters.chapter(name)
        values = profiles.executed_parameters(name, profile)
        data = chapter.needed(values)
        if chapter.reads:  # before the chapter it reads has run, the store cannot name its grid's data set
            data = [_read_grid(name, values).dataset] + data
        stages += STAGES[type(chapter.work)](name, values, tuple(dict.fromkeys(data)), costs)
    return stages


def measure_cpu() -> float:
    """Seconds per 10^12 training FLOPs of one CPU thread here (how :data:`CPU_SECONDS_PER_TFLOP` was
    measured): ``StepTimer``'s steps of the sentiment encoder at width 128, 4 layers, 128 tokens,
    batch 32, counted by ``workload.encoder_flops``."""
    import torch

    from mdlib.experiments import sentiment

    config = sentiment.run_config(layers=4, width=128, max_length=128, optimizer="md", lr=1e-6, p=1.1, batch_size=32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = _time_steps("e4-sentiment", config, 32, "cpu")
    finally:
        torch.set_num_threads(threads)
    return seconds / (3 * 32 * workload.encoder_flops(128, 128, 512, 4) / 1e12)


def _count(value: float) -> str:
    """A count as the plan prints it: millions with one decimal, else a whole number."""
    return f"{value / 1e6:.1f} M" if value >= 1e6 else f"{value:,.0f}"


def _hours(value: float | None, bound: bool = False) -> str:
    if value is None:
        return "-"
    if value < 0.05:
        return "< 0.1"
    return ("<= " if bound else "") + f"{value:,.1f}"


def _row(stage: Stage) -> list[str]:
    at_most = "<= " if stage.bound else ""
    if stage.epochs is None:
        epochs = "-"
    elif stage.bound or stage.epochs == stage.epochs_cap:
        epochs = f"{at_most}{stage.epochs:,.0f}"
    else:
        epochs = f"{stage.epochs:,.0f} (<= {stage.epochs_cap:,})"
    steps = at_most + _count(stage.steps) + ("" if stage.bound or math.isclose(stage.steps, stage.steps_cap)
                                             else f" (<= {_count(stage.steps_cap)})")
    return [stage.notebook, stage.what, f"{stage.runs:,}" if stage.runs else "-", epochs, f"{steps} {stage.unit}",
            _hours(stage.gpu_hours, stage.bound), _hours(stage.cpu_hours, stage.bound), ", ".join(stage.data) or "-"]


HEADER = ["notebook", "what", "runs", "epochs a run", "steps", "GPU h", "CPU h", "data"]


def _totals(stages: Iterable[Stage]) -> tuple[int, float, float]:
    """(training runs, GPU hours with the CPU chapters' CPU hours, CPU hours) over the stages."""
    stages = list(stages)
    gpu = sum(s.gpu_hours if s.gpu_hours is not None else s.cpu_hours for s in stages)
    return sum(s.runs for s in stages if s.unit == "steps"), gpu, sum(s.cpu_hours for s in stages)


def _legend(profile: str, costs: Costs) -> list[str]:
    return [f"GPU h: {costs.gpu.source}; a chapter that runs on the CPU counts its CPU hours there.",
            f"CPU h: {costs.cpu.source}.",
            "runs: training runs (trials for the synthetic chapters; the total counts training runs). Epochs and "
            "steps: expected, with the most the epoch caps allow (<=) where the stop rule decides. Hours are one "
            "device's: N GPUs (one run each) or N CPU workers divide them by up to N.",
            f"`python -m mdlib plan --profile {profile}` estimates this without training, fetching or installing anything."]


def _notes(stages: list[Stage]) -> list[str]:
    return [f"- {s.notebook}, {s.what}: {s.note}" for s in stages if s.note]


def text(stages: list[Stage], profile: str, costs: Costs | None = None) -> str:
    """The plan as an aligned text table, with totals, the sources of its estimates and notes."""
    costs = costs or default_costs()
    rows = [HEADER] + [_row(s) for s in stages]
    runs, gpu, cpu = _totals(stages)
    bound = any(s.bound for s in stages)
    rows.append(["total", "", f"{runs:,}", "", "", _hours(gpu, bound), _hours(cpu, bound), ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([f"plan of profile {profile!r}", *lines, "", *_legend(profile, costs), "", *_notes(stages)]) + "\n"


def markdown(stages: list[Stage], profile: str, costs: Costs | None = None) -> str:
    """The plan as a markdown table (README, the reproduce page), with totals, sources and notes."""
    costs = costs or default_costs()
    rows = [_row(s) for s in stages]
    runs, gpu, cpu = _totals(stages)
    bound = any(s.bound for s in stages)
    rows.append(["**total**", "", f"**{runs:,}**", "", "", f"**{_hours(gpu, bound)}**", f"**{_hours(cpu, bound)}**", ""])
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in r) + " |" for r in rows]
    return "\n".join(lines + [""] + [f"- {line}" for line in _legend(profile, costs)] + ["", "Notes:", ""]
                     + _notes(stages)) + "\n"
