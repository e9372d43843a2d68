"""What a profile costs before anything runs: ``python -m mdlib plan --profile NAME``.

Per notebook, from its parameters at the profile: the training runs (the distinct runs of its grids,
as the results store keys them), their epochs and steps, the data it reads, the device hours and the
wall time on the chapter's ``workers``. Nothing is trained, fetched or installed: the counts come from
the run configs (``mdlib.experiments.workload``), and each estimate names its basis (the notes):

- epochs: a run with a stop rule takes the mean epochs of the runs already known of its setting,
  stored or committed (``mdlib.book.epochs``), else the authors' measured mean in the paper's own
  setting, else the mean at the nearest step known, else its cap (an upper bound, "<=");
- a run's time: its epochs at its shape's measured cost on this machine (``mdlib.book.steptimes``:
  a training batch, an evaluated batch and a checkpoint, timed once by the trainer on synthetic data
  of the shape and cached under the machine's name; ``plan --measure`` times them again). A shape not
  timed, one whose timing would take long (the paper's models on a CPU), is priced by FLOPs: on a GPU
  at the paper's own throughput (one V100 ran its vision transformer on CIFAR-10 for 2,000 epochs in
  29 hours, Appendix G.7), on a CPU at one core's measured throughput (:data:`CPU_SECONDS_PER_TFLOP`),
  which underestimates a small model several times (its steps are dominated by fixed costs);
- the synthetic chapters (01-03), the cost benchmark (08) and the step-size guide (09), which run on
  the CPU: their measured time at the default profile (``mdlib.book.chapters.OnCpu``), scaled by their
  steps;
- wall time: a chapter's runs in the rounds its pools train them (a sweep, then the runs its choices
  decide), ``workers`` at a time, each to the worker free first; on a CPU with fewer cores than
  workers, each run slowed in proportion; then its forward passes and its other cells (``Chapter.rest``);
  the chapters in the book's groups (``chapters.side_by_side``: 01-03 side by side), and the HTML book.

Device hours are one device's (one GPU, or one CPU core): the sum of the runs' times.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from mdlib.book import chapters, epochs as known_epochs, profiles, steptimes
from mdlib.experiments import paper, workload
from mdlib.runs import identity

__all__ = ["CPU_SECONDS_PER_TFLOP", "HTML", "WITHIN", "ChapterWall", "Costs", "FlopRate", "Plan", "Planned", "Stage",
           "StepTimer", "against", "chapter_runs", "default_costs", "Executed", "executed", "gpu_seconds_per_tflop",
           "known_epochs_of", "machine_costs", "markdown", "measure_cpu", "measured_costs", "plan", "planned_runs",
           "PlannedTime", "planned_time", "schedule", "text"]

#: Seconds per 10^12 training FLOPs on one core of this project's 2-core CPU machine (torch 2.14.1,
#: float32, one thread), as :func:`measure_cpu` measures it: 14.5-14.8 on an idle machine, 14.9-16.4
#: beside another busy process (2026-12-02).
CPU_SECONDS_PER_TFLOP = 14.6
CPU_SOURCE = "one core of a 2-core CPU at its measured throughput (2026-12-02), by FLOPs"

#: A run's seconds besides its epochs where its epochs are timed: its data, model and stored result (the
#: stored entries' seconds less their epochs', 1-4 s on the 2-core machine, 2026-12-06).
RUN_SECONDS = 3.0

#: The book after its chapters (``mdlib book``: the generated pages, the archive and ``jupyter-book build``)
#: on the 2-core machine: what the fresh clone's default build of 2026-12-07 (3,069 s) took after its
#: chapters (3,057 s, 01-03 side by side), jupyter-book's 7 s included.
HTML = chapters.Measured(12.0, "2026-12-07")


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

    def run_seconds(self, kind: str, config: Any, work: workload.RunWork) -> float:
        return work.flops() / 1e12 * self.seconds_per_tflop

    def forward_seconds(self, kind: str, config: Any, examples: float) -> float:
        return examples * workload.run_work(kind, config).forward_flops / 1e12 * self.seconds_per_tflop

    def basis(self, kind: str, config: Any) -> str:
        return "by FLOPs"


class StepTimer:
    """Time from this machine's measured costs of each shape (``steptimes.Timings``: a training batch, an
    evaluated batch and a checkpoint per epoch), by FLOPs (``fallback``) for a shape it has no timing of."""

    def __init__(self, timings: steptimes.Timings, fallback: FlopRate):
        self.timings, self.fallback = timings, fallback
        self.timed = self.untimed = False  #: whether a timing, and FLOPs, priced something

    @property
    def source(self) -> str:
        """What priced the plan's rows: the timings, FLOPs (``fallback``) or both."""
        if not self.timed:
            return self.fallback.source
        where = ("one thread of this machine's CPU (in as many processes at once as a chapter's workers)"
                 if self.timings.device == "cpu" else "this machine's GPU")
        text = (f"{where}: a run's batches, evaluations and checkpoints timed here once per model shape, cached with "
                f"the machine's name (`plan --measure` times them again)")
        return text + (f"; a shape not timed: {self.fallback.source}" if self.untimed else "")

    @staticmethod
    def estimate(kind: str, config: Any) -> float:
        """About the seconds timing a shape takes on a CPU (``steptimes.measure``): at least 5 training
        batches and their evaluations, by FLOPs at one core's throughput, and its epochs' target time six
        times over (a small model's fixed costs)."""
        work = workload.run_work(kind, config)
        return 7 * 3 * work.forward_flops * work.batch_size / 1e12 * CPU_SECONDS_PER_TFLOP + 6 * steptimes.TARGET_SECONDS

    def prepare(self, runs: Iterable[tuple[str, Any]], at_once: int = 1) -> None:
        """Read or time, all at once in ``at_once`` processes (on a CPU), the shapes of the (kind, config)
        ``runs``."""
        if self.timings.device == "cpu":
            self.timings.at_once = max(int(at_once), 1)
        self.timings.prepare([(kind, config, self.estimate(kind, config)) for kind, config in runs])

    def timing(self, kind: str, config: Any) -> steptimes.Timing | None:
        found = self.timings.get(kind, config, estimate=self.estimate(kind, config))
        self.timed, self.untimed = self.timed or found is not None, self.untimed or found is None
        return found

    def run_seconds(self, kind: str, config: Any, work: workload.RunWork) -> float:
        found = self.timing(kind, config)
        if found is None:
            return self.fallback.run_seconds(kind, config, work)
        return RUN_SECONDS + work.epochs * found.epoch(work.steps_per_epoch, work.eval_examples_per_epoch,
                                                       work.batch_size)

    def forward_seconds(self, kind: str, config: Any, examples: float) -> float:
        found = self.timing(kind, config)
        if found is None:
            return self.fallback.forward_seconds(kind, config, examples)
        return examples / config.fit.batch_size * found.evaluate

    def basis(self, kind: str, config: Any) -> str:
        found = self.timing(kind, config)
        return f"timed here {found.when}" if found is not None else self.fallback.basis(kind, config)


Rate = FlopRate | StepTimer


@dataclass(frozen=True)
class Costs:
    """How the plan turns work into hours: on a GPU and on a CPU (``FlopRate`` or ``StepTimer``)."""

    gpu: Rate
    cpu: Rate


def default_costs() -> Costs:
    """The paper's V100 throughput and this project's measured CPU core, both by FLOPs: nothing timed or
    read from this machine (the README's paper plan)."""
    return Costs(FlopRate(gpu_seconds_per_tflop(), GPU_SOURCE), FlopRate(CPU_SECONDS_PER_TFLOP, CPU_SOURCE))


def machine_costs(measure: bool = False) -> Costs:
    """This machine's costs (``plan``'s default): the CPU's from the cached timings of each shape, a shape
    not cached timed now where that is short (``steptimes.SHORT_SECONDS``), else by FLOPs; with a CUDA
    GPU, the GPU's from its cached timings, else the paper's V100 by FLOPs. ``measure`` (``plan
    --measure``): time every shape anew where the build trains, on the GPU where torch sees one, else on
    the CPU (a shape whose timing would take over ``steptimes.MEASURE_SECONDS`` stays by FLOPs)."""
    import torch

    base = default_costs()
    cuda = torch.cuda.is_available()
    cpu = StepTimer(steptimes.Timings("cpu", "all" if measure and not cuda else "short"), base.cpu)
    gpu = StepTimer(steptimes.Timings("cuda", "all" if measure else "cached"), base.gpu) if cuda else base.gpu
    return Costs(gpu, cpu)


def measured_costs() -> Costs:
    """``machine_costs(measure=True)``: every shape timed here now."""
    return machine_costs(measure=True)


# ---------------------------------------------------------------------------------------------
# the runs a chapter trains, in the rounds its pools train them


@dataclass(frozen=True)
class Planned:
    """A training run of a chapter: its store ``key`` and ``config`` (for a final run whose step the sweep
    chooses, the first candidate's, as ``workload.grid_runs`` counts it), the configs it may be
    (``alternatives``: one per candidate the choice may pick; its cost is their mean), the ``round`` of
    pools it trains in (1: the sweeps and the runs no choice decides; 2: the runs the sweeps decide and
    the grids that follow another's choice; ...), its plan row (``stage``) and whether its step follows
    a choice (``chosen``: counted at one candidate, it stands for the run of its cell and seed at the step
    the sweep picks, or, with ``tied_finals``, for one that may not be trained)."""

    key: str
    kind: str
    config: Any
    alternatives: tuple
    round: int
    stage: str
    chosen: bool = False


def _design_runs(design, first: int, stage: Callable[[Any], str] | str, seen: set[str],
                 follows: bool = False, reserved: frozenset[str] = frozenset()) -> list[Planned]:
    """A grid's runs (``step_grid.Design``) not in ``seen`` (which they join), as ``workload.grid_runs``
    counts them: its sweep in round ``first``, its finals in the next where a sweep chooses their step
    (else in ``first``), each final at every candidate (``alternatives``) unless ``tied_finals`` counts
    every candidate's as a run of its own (at most). ``follows``: every step of the grid follows another
    grid's choice. ``reserved``: the keys of runs another grid trains at a fixed step; a final whose step
    the sweep chooses stands in at the first candidate that is not one of them, so that the two count as
    two runs (as they are unless the sweep chooses that very step)."""
    from mdlib.experiments import step_grid

    candidates = {cell: list(design.candidates(cell)) for cell in design.cells}
    chosen = {cell: step_grid.Choice(values[0], tuple(values) if design.tied_finals else (values[0],), values[0])
              for cell, values in candidates.items()}
    rounds = {cell: first + 1 if list(design.sweep_seeds(cell)) else first for cell in design.cells}
    out: list[Planned] = []

    def add(config: Any, alternatives: tuple, round_: int, chosen: bool) -> None:
        key = identity.config_key(design.run_kind, config)
        if key not in seen:
            seen.add(key)
            out.append(Planned(key, design.run_kind, config, alternatives, round_,
                               stage if isinstance(stage, str) else stage(config), chosen or follows))

    for item in design.sweep_items():
        config = design.sweep_config(*item)
        add(config, (config,), first, False)
    for cell, value, seed in design.final_items(chosen):
        config = design.final_config(cell, value, seed)
        alternatives = ((config,) if design.tied_finals
                        else tuple(design.final_config(cell, c, seed) for c in candidates[cell]))
        if rounds[cell] > first and not design.tied_finals:
            config = next((c for c in alternatives if identity.config_key(design.run_kind, c) not in reserved), config)
        add(config, alternatives, rounds[cell], rounds[cell] > first)
    return out


ARMS = "Table 1, the 2 x 2s' per-tensor arms"


def _sentiment_designs(values: Mapping[str, Any], choice: int = 0) -> list[tuple[str, list, int]]:
    """Chapter 04's stages as (what, designs, first round): the replication's grid, the variation's, the
    series (its runs that the variation does not hold) and the 2 x 2s' arms (their steps follow the bases'
    candidates numbered ``choice``, the first by default: the same count of runs whatever the sweep
    chooses; they start once their base has chosen, in round 2). Grown candidates are not counted; a grid
    with ``tied_finals`` counts every seed at every candidate (at most)."""
    from mdlib.experiments import sentiment
    from mdlib.experiments.sentiment import allocation, chapter

    table1, variation = sentiment.chapter_grids(**values)
    chosen = {(L, key): variation.multiples[key][min(choice, len(variation.multiples[key]) - 1)]
              for L in variation.layers[:1] for key in variation.methods}
    series = chapter.series_grids(variation, values.get("series_stds") or [], values.get("series_epochs", 0),
                                     values.get("series_multiples", {}), min(variation.seeds_of(k) for k in variation.methods),
                                     values.get("grow", 0))
    by_std = {allocation.SMALL_EMBEDDING_STD: variation} | {g.embedding_std: g for g in series}
    arms = [allocation.ArmGrid(base=by_std[std], multiples=list(values.get("allocation_multiples", [1.0])),
                               seeds=variation.seeds_of(variation.methods[0]), grow=values.get("grow", 0),
                               tied_finals=bool(values.get("tied_finals")))
            for std in values.get("allocation_stds") or [] if std in by_std]
    return [("Table 1 grid (replication)", [table1.design()], 1),
            (f"Table 1, variation ({variation.setup})", [variation.design()], 1),
            ("embedding-scale series", [g.design() for g in series], 1),
            (ARMS, [a.design(chosen) for a in arms], 2)]


def _sentiment_planned(values: Mapping[str, Any]) -> list[Planned]:
    """Chapter 04's runs (``_sentiment_designs``); a run two stages hold counts in the first. The arms of a
    2 x 2 are counted at their base's first candidates and cost the mean over its candidates (the arms'
    steps are matched to the steps their base chooses)."""
    from mdlib.experiments import sentiment

    variation = sentiment.chapter_grids(**values)[1]
    choices = max(len(m) for m in variation.multiples.values())
    stages = [_sentiment_designs(values, j) for j in range(choices)]
    seen: set[str] = set()
    out = []
    for i, (what, designs, first) in enumerate(stages[0]):
        for d, design in enumerate(designs):
            runs = _design_runs(design, first, what, set(), follows=what == ARMS)
            if what == ARMS and choices > 1:  # every base choice's runs, in the same order
                others = [_design_runs(stage[i][1][d], first, what, set(), follows=True) for stage in stages[1:]]
                runs = [dataclasses.replace(run, alternatives=run.alternatives + tuple(
                    c for other in others for c in other[k].alternatives)) for k, run in enumerate(runs)]
            for run in runs:
                if run.key not in seen:
                    seen.add(run.key)
                    out.append(run)
    return out


SWEEP, FINALS, AT_PAPER = "step-size sweep (validation images)", "final runs", "Adam and l_1.1 at the paper's steps"


def _vision_planned(values: Mapping[str, Any]) -> list[Planned]:
    """Chapter 07's runs: its sweep (on validation images) and finals, then the grid at the paper's steps
    (``vision.grid`` of each, one after the other)."""
    from mdlib.experiments import vision

    swept, at_paper = vision.chapter_grids(**values)
    seen: set[str] = set()
    stage = lambda config: SWEEP if config.data.validation else FINALS  # noqa: E731
    fixed = frozenset(workload.grid_runs([at_paper.design()]))  # at the paper's steps, whatever the sweep chooses
    first = _design_runs(swept.design(), 1, stage, seen, reserved=fixed)
    return first + _design_runs(at_paper.design(), max((r.round for r in first), default=0) + 1, AT_PAPER, seen)


def planned_runs(notebook: str, values: Mapping[str, Any]) -> list[Planned] | None:
    """The training runs chapter ``notebook`` trains at its parameter ``values`` (``Planned``); None for a
    chapter whose work the plan counts otherwise (trials, timed steps, forward passes)."""
    work = chapters.chapter(notebook).work
    if isinstance(work, chapters.SentimentGrids):
        return _sentiment_planned(values)
    if isinstance(work, chapters.VisionGrids):
        return _vision_planned(values)
    return None


def chapter_runs(notebook: str, values: Mapping[str, Any]) -> dict[str, Planned] | None:
    """The distinct training runs (``Planned``), by store key, that chapter ``notebook`` trains at its
    parameter ``values``, as the plan counts them (grown candidates not counted); None for a chapter
    whose work the plan counts otherwise (trials, timed steps, forward passes)."""
    found = planned_runs(notebook, values)
    return None if found is None else {run.key: run for run in found}


def known_epochs_of(runs: Iterable[Planned]) -> dict[str, float]:
    """The epochs of every config the ``runs`` may train (each one's ``alternatives``), by store key, where
    the stored or committed runs tell them (``epochs.expect``: the same run's, its setting's at its step or
    at the nearest step; not a cap, a bound or the authors' mean)."""
    ctx = _cached_context()
    out = {}
    for run in runs:
        for config in run.alternatives:
            expected = ctx.work(run.kind, config)[1]
            if expected.how in ("run", "setting", "nearest") and not (expected.bound or expected.at_least):
                out[identity.config_key(run.kind, config)] = expected.epochs
    return out


@dataclass(frozen=True)
class PlannedTime:
    """The plan's wall ``seconds`` of a chapter for the live progress, and what they cover: ``whole``, the
    whole chapter, its training runs included (a CPU chapter priced from its measured time, ``OnCpu``),
    else its cells besides its pools of training runs (forward passes, analyses, figures)."""

    seconds: float
    whole: bool


def planned_time(notebook: str, values: Mapping[str, Any]) -> PlannedTime:
    """The plan's wall seconds of chapter ``notebook`` at its parameter ``values`` (``PlannedTime``): a CPU
    chapter's whole time, another's besides its pools of training runs; on this machine's CPU as of its
    cached timings (nothing is timed here: a shape not timed yet goes by FLOPs)."""
    work = chapters.chapter(notebook).work
    if isinstance(work, chapters.OnCpu):
        found = steptimes.Timings("cpu", "cached").probe()
        return PlannedTime(_cpu_seconds(notebook, values, None if found is None else found[0])[0], whole=True)
    parameters = {name: profiles.executed_parameters(name, values["profile"]) for name in chapters.NAMES}
    ctx = _cached_context(_at_once({**parameters, notebook: values}, steptimes.cores()))  # as the plan timed them
    wall = STAGES[type(work)](notebook, values, (), ctx)[1]
    return PlannedTime(wall.forward + wall.rest, whole=False)


def _cached_context(at_once: int = 1) -> _Context:
    """A plan's context for the live progress: this machine's CPU as of its cached timings of shapes timed
    ``at_once`` processes at once (nothing timed: a shape not timed yet by FLOPs), the known runs."""
    base = default_costs()
    cpu = StepTimer(steptimes.Timings("cpu", "cached", at_once=at_once), base.cpu)
    return _Context(Costs(base.gpu, cpu), "cpu", steptimes.cores(), known_epochs.Index(known_epochs.known_runs()))


def schedule(rounds: Mapping[int, Sequence[float]], workers: int) -> float:
    """The wall time of runs of the given seconds trained ``workers`` at a time, round after round (a
    round's pool ends when its last run does), each run, in order, to the worker free first."""
    total = 0.0
    for round_ in sorted(rounds):
        free = [0.0] * max(int(workers), 1)
        for seconds in rounds[round_]:
            i = min(range(len(free)), key=free.__getitem__)
            free[i] += seconds
        total += max(free)
    return total


def _side_by_side(seconds: Sequence[float], cores: int) -> float:
    """The wall time of chapters of the given seconds executed side by side, one per core."""
    return schedule({0: list(seconds)}, min(cores, len(seconds)))


# ---------------------------------------------------------------------------------------------
# rows


@dataclass(frozen=True)
class Stage:
    """One line of the plan: what a notebook runs and what it costs. ``runs``: training runs (for the
    synthetic chapters: trials; 0: an analysis or benchmark); ``epochs`` per run, expected, and
    ``epochs_cap``, the most; ``steps`` in all, expected and at most (``steps_cap``), in ``unit``;
    ``gpu_hours`` (None: the chapter runs on the CPU) and ``cpu_hours``, expected; ``wall``: its seconds
    on the clock (a training row: its share of its chapter's training wall time, by its device hours);
    ``bound``: these expectations are upper bounds (runs a stop rule may end sooner, counted at their
    cap); ``note``: their basis."""

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
    wall: float | None = None


@dataclass(frozen=True)
class ChapterWall:
    """A chapter's wall time in seconds: ``training`` (its runs' pools on ``workers``), ``forward`` (its
    forward passes), ``rest`` (its other cells, or the whole chapter scaled from its measured time) and
    ``total``."""

    notebook: str
    workers: int
    training: float
    forward: float
    rest: float

    @property
    def total(self) -> float:
        return self.training + self.forward + self.rest


@dataclass(frozen=True)
class Plan:
    """A profile's plan: its rows (``stages``; iterating a plan gives them), each chapter's wall time
    (``walls``), the book's (``wall``: its chapter groups and the HTML book), and where the wall times
    are counted (``device``: "cpu" or "gpu", on ``cores`` CPU cores)."""

    profile: str
    stages: list[Stage]
    walls: list[ChapterWall]
    device: str
    cores: int
    groups: list[list[str]] = field(default_factory=list)

    def __iter__(self) -> Iterator[Stage]:
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def wall_of(self, group: Sequence[str]) -> float:
        """The wall time of chapters executed side by side, one per core (one chapter: its own)."""
        by_name = {w.notebook: w.total for w in self.walls}
        return _side_by_side([by_name[name] for name in group], self.cores)

    @property
    def wall(self) -> float:
        """The book's wall time: its groups of chapters one after another, then the HTML book."""
        return sum(self.wall_of(group) for group in self.groups) + HTML.seconds


@dataclass
class _Context:
    """What costing one profile's chapters shares: the costs, the device and cores of the wall time, the
    runs known, and each config's work (expected epochs) once."""

    costs: Costs
    device: str
    cores: int
    index: known_epochs.Index
    works: dict[str, tuple[workload.RunWork, known_epochs.Expected]] = field(default_factory=dict)

    @property
    def wall_rate(self) -> Rate:
        return self.costs.gpu if self.device == "gpu" else self.costs.cpu

    @property
    def speed(self) -> float | None:
        """The speed probe's reading as of the CPU's timings (seconds), where it was read."""
        return machine_speed(self.costs)

    def work(self, kind: str, config: Any) -> tuple[workload.RunWork, known_epochs.Expected]:
        """A run's work at its expected epochs (``epochs.expect``), and that expectation."""
        key = identity.config_key(kind, config)
        if key not in self.works:
            work = workload.run_work(kind, config)
            if kind != "e4-sentiment":
                expected = known_epochs.Expected(work.epochs, "fixed")
            else:
                authors = None if work.bound else (work.epochs, work.expected_from)
                expected = known_epochs.expect(kind, config, self.index, authors)
                _, validation, test = workload.SPLITS[config.dataset]
                work = dataclasses.replace(work, epochs=expected.epochs, bound=expected.bound,
                                           eval_examples_per_epoch=test + validation / expected.epochs)
            self.works[key] = (work, expected)
        return self.works[key]

    def seconds(self, run: Planned, rate: Rate) -> float:
        """A run's seconds at ``rate``: the mean over its alternatives."""
        return sum(rate.run_seconds(run.kind, c, self.work(run.kind, c)[0]) for c in run.alternatives) / len(
            run.alternatives)

    def slowdown(self, workers: int) -> float:
        """How much slower each of ``workers`` runs trains on this device: on a CPU with fewer cores than
        workers, in proportion; one GPU per worker otherwise."""
        return max(1.0, workers / self.cores) if self.device == "cpu" else 1.0


def _runs_stages(notebook: str, planned: list[Planned], order: Sequence[str], data: tuple[str, ...],
                 workers: int, ctx: _Context, grown: Mapping[str, int] | None = None) -> tuple[list[Stage], float]:
    """A training chapter's rows (one per stage of ``order`` that holds runs, the first always) and its
    training wall time: its runs by round on ``workers``, split over the rows by their device hours.
    ``grown``: the most runs each stage's grids may add by growing (``Design.grown_at_most``), named in
    its row's note (not counted: which grids grow is known only once their sweeps have chosen)."""
    wall_seconds = {run.key: ctx.seconds(run, ctx.wall_rate) * ctx.slowdown(workers) for run in planned}
    rounds: dict[int, list[float]] = {}
    for run in planned:
        rounds.setdefault(run.round, []).append(wall_seconds[run.key])
    training = schedule(rounds, workers)
    device_total = sum(wall_seconds.values())
    stages = []
    for i, what in enumerate(order):
        runs = [run for run in planned if run.stage == what]
        if not runs and i:
            continue
        alternatives = [(run, c) for run in runs for c in run.alternatives]
        expected = [ctx.work(run.kind, c)[1] for run, c in alternatives]
        weights = [1 / len(run.alternatives) for run, _ in alternatives]

        def mean_sum(value: Callable[[Planned, Any], float]) -> float:
            return sum(w * value(run, c) for w, (run, c) in zip(weights, alternatives))

        steps = mean_sum(lambda run, c: ctx.work(run.kind, c)[0].steps())
        epochs = mean_sum(lambda run, c: ctx.work(run.kind, c)[0].epochs) / max(len(runs), 1)
        caps = [ctx.work(run.kind, run.config)[0] for run in runs]
        gpu = sum(ctx.seconds(run, ctx.costs.gpu) for run in runs) / 3600
        cpu = sum(ctx.seconds(run, ctx.costs.cpu) for run in runs) / 3600
        share = sum(wall_seconds[run.key] for run in runs) / device_total if device_total else 0.0
        notes = [known_epochs.describe(expected, weights)] if expected else []
        notes += _time_basis(runs, ctx)
        if any(w.tokens_bound for w in caps):
            notes.append("texts counted at max_length tokens (an upper bound)")
        if (grown or {}).get(what):
            notes.append(f"not counted: up to {grown[what]} more runs where a choice sits at an end of its grid "
                         "and the grid grows")
        stages.append(Stage(notebook, what, len(runs), epochs, max((w.epochs_cap for w in caps), default=0), steps,
                            sum(w.steps(w.epochs_cap) for w in caps), "steps", data, gpu, cpu, "; ".join(notes),
                            any(e.bound for e in expected), training * share))
    return stages, training


def _time_basis(runs: Iterable[Planned], ctx: _Context) -> list[str]:
    """The basis of the rows' times: of the CPU hours, and of the GPU hours where they are timed."""
    out = []
    for name, rate in (("CPU", ctx.costs.cpu), ("GPU", ctx.costs.gpu)):
        if name == "GPU" and not isinstance(rate, StepTimer):
            continue
        bases = sorted({rate.basis(run.kind, c) for run in runs for c in run.alternatives})
        if bases:
            out.append(f"{name} time: {', '.join(bases)}")
    return out


def _evaluation_stage(notebook: str, what: str, kind: str, config: Any, examples: float, data: tuple[str, ...],
                      ctx: _Context) -> Stage:
    cpu = ctx.costs.cpu.forward_seconds(kind, config, examples)
    gpu = ctx.costs.gpu.forward_seconds(kind, config, examples)
    wall = gpu if ctx.device == "gpu" else cpu
    runs = [Planned("", kind, config, (config,), 0, what)]
    return Stage(notebook, what, 0, None, None, examples, examples, "evaluated examples", data, gpu / 3600,
                 cpu / 3600, "; ".join(["forward passes only", *_time_basis(runs, ctx)]), wall=wall)


#: The least a chapter's other cells take at any profile: a kernel, its imports, the store's reads.
REST_FLOOR = 10.0


def machine_speed(costs: Costs) -> float | None:
    """The speed probe's reading (``steptimes.probe``, seconds) as of ``costs``' CPU timings, where they
    are this machine's and it was read with them."""
    found = costs.cpu.timings.probe() if isinstance(costs.cpu, StepTimer) else None
    return None if found is None else found[0]


def _at_speed(measured: chapters.Measured, speed: float | None) -> tuple[float, str]:
    """(seconds, words): a ``measured`` time at the machine's ``speed`` (the probe's reading as of the plan's
    timings) where the probe was read then and during the measured execution, else as measured."""
    if speed is None or not measured.probe:
        return measured.seconds, ""
    factor = speed / measured.probe
    return measured.seconds * factor, (f", at this machine's speed as of its timings ({factor:.2f}x: the speed probe "
                                       f"read {speed * 1e3:.0f} ms then, {measured.probe * 1e3:.0f} ms in that build)")


def _rest_stage(notebook: str, values: Mapping[str, Any], ctx: _Context) -> Stage | None:
    """A chapter's other cells: their time at the default profile (``Chapter.rest``); at a profile where the
    chapter does less (its runs' and forward passes' FLOPs), that much less, at least :data:`REST_FLOOR` (or
    the default's time, where that is less)."""
    rest = chapters.chapter(notebook).rest
    if rest is None:
        return None
    scale = min(1.0, _flops(notebook, values, ctx) / max(_flops(notebook, profiles.executed_parameters(
        notebook, "default"), ctx), 1.0))
    default, speed = _at_speed(rest, ctx.speed)
    seconds = default if math.isclose(scale, 1.0) else max(min(REST_FLOOR, default), default * scale)
    where = "" if math.isclose(scale, 1.0) else f", scaled by its work here ({scale:.2g}x)"
    return Stage(notebook, "the other cells (analyses, tables, figures)", 0, None, None, 0, 0, "", (), None, 0.0,
                 f"{rest.seconds:.0f} s at the default profile: {rest.how} ({rest.when}){speed}{where}", wall=seconds)


def _flops(notebook: str, values: Mapping[str, Any], ctx: _Context) -> float:
    """A chapter's work at ``values`` in FLOPs: its runs' at their expected epochs, or its forward passes'."""
    planned = planned_runs(notebook, values)
    if planned is not None:
        return sum(sum(ctx.work(run.kind, c)[0].flops() for c in run.alternatives) / len(run.alternatives)
                   for run in planned)
    config, examples = _evaluated(notebook, values)
    return 0.0 if config is None else examples * workload.run_work("e4-sentiment", config).forward_flops


def _on_cpu(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], ctx: _Context
            ) -> tuple[list[Stage], ChapterWall]:
    """A CPU chapter's stage: (trials, steps) from its parameters, its time scaled from its measured
    time at the default profile."""
    work = chapters.chapter(notebook).work
    trials, count = work.count(values)
    seconds, speed = _cpu_seconds(notebook, values, ctx.speed)
    stage = Stage(notebook, work.what, trials, None, None, count, count, work.unit, data, None, seconds / 3600,
                  f"{work.where}; scaled from its measured {work.measured.seconds:.0f} s at the default profile "
                  f"({work.measured.when}){speed}", wall=seconds)
    return [stage], ChapterWall(notebook, 1, 0.0, 0.0, seconds)


def _cpu_seconds(notebook: str, values: Mapping[str, Any], speed: float | None) -> tuple[float, str]:
    """A CPU chapter's time at ``values`` and the machine's ``speed`` (``_at_speed``): its measured time
    at the default profile, scaled by its steps; and the words for the speed."""
    work = chapters.chapter(notebook).work
    _, count = work.count(values)
    _, default_count = work.count(profiles.executed_parameters(notebook, "default"))
    seconds, words = _at_speed(work.measured, speed)
    return seconds * count / default_count, words


def _workers(values: Mapping[str, Any]) -> int:
    return max(int(values.get("workers") or 1), 1)


def _with_rest(notebook: str, values: Mapping[str, Any], ctx: _Context, stages: list[Stage], training: float,
               forward: float, workers: int) -> tuple[list[Stage], ChapterWall]:
    rest = _rest_stage(notebook, values, ctx)
    return stages + ([rest] if rest else []), ChapterWall(notebook, workers, training, forward,
                                                          rest.wall if rest else 0.0)


def _sentiment(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], ctx: _Context
               ) -> tuple[list[Stage], ChapterWall]:
    """Chapter 04's rows (``_sentiment_designs``' stages that hold runs, the replication's always)."""
    designs = _sentiment_designs(values)
    grown = {what: sum(design.grown_at_most() for design in stage) for what, stage, _ in designs}
    stages, training = _runs_stages(notebook, _sentiment_planned(values), [what for what, _, _ in designs], data,
                                    _workers(values), ctx, grown)
    return _with_rest(notebook, values, ctx, stages, training, 0.0, _workers(values))


def _read_grid(notebook: str, values: Mapping[str, Any]):
    """The grid a reading chapter analyses: the one the chapter it reads builds for it (its parameter
    ``analysed``) at the profile it reads (``table1``, else its own), from that chapter's parameters."""
    from mdlib.experiments import sentiment

    (builder,) = chapters.chapter(notebook).reads
    built = profiles.executed_parameters(builder, chapters.table1_profile(values))
    grids = dict(zip(sentiment.GRIDS, sentiment.chapter_grids(**built)))
    return grids[built["analysed"]]


def _evaluated(notebook: str, values: Mapping[str, Any]) -> tuple[Any, float]:
    """(a model's config, the examples evaluated) of a reading chapter: forward passes through the models at
    ``depth`` of the grid it reads; (None, 0) where that grid has none."""
    work = chapters.chapter(notebook).work
    grid = _read_grid(notebook, values)
    runs = [config for _, config in workload.grid_runs([grid.design()]).values()
            if config.model.layers == values["depth"]]
    if not runs:
        return None, 0.0
    return runs[0], len(runs) * work.per_model(values, workload.SPLITS[grid.dataset])


def _evaluates(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], ctx: _Context
               ) -> tuple[list[Stage], ChapterWall]:
    """Forward passes through the models at ``depth`` of the grid the chapter reads (no training)."""
    chapter = chapters.chapter(notebook)
    config, examples = _evaluated(notebook, values)
    if config is None:
        stage = Stage(notebook, chapter.work.what, 0, None, None, 0, 0, "evaluated examples", data, 0.0, 0.0,
                      f"no models of depth {values['depth']} in the grid of {', '.join(chapter.reads)}", wall=0.0)
        return _with_rest(notebook, values, ctx, [stage], 0.0, 0.0, 1)
    stage = _evaluation_stage(notebook, chapter.work.what, "e4-sentiment", config, examples, data, ctx)
    return _with_rest(notebook, values, ctx, [stage], 0.0, stage.wall, 1)


def _vision(notebook: str, values: Mapping[str, Any], data: tuple[str, ...], ctx: _Context
            ) -> tuple[list[Stage], ChapterWall]:
    from mdlib.experiments import vision

    planned = _vision_planned(values)
    swept, at_paper = vision.chapter_grids(**values)
    grown = {SWEEP: swept.design().grown_at_most(), AT_PAPER: at_paper.design().grown_at_most()}
    stages, training = _runs_stages(notebook, planned, [SWEEP, FINALS, AT_PAPER], data, _workers(values), ctx, grown)
    finals = [run.config for run in planned if run.stage == FINALS]  # the pruning curves' (not the paper steps')
    tests = sum(workload.SPLITS[config.data.dataset][2] for config in finals)
    pruning = _evaluation_stage(notebook, "pruning curves of the final runs", "e7-vit", finals[0],
                                tests * len(values["sparsities"]), data, ctx)
    return _with_rest(notebook, values, ctx, stages + [pruning], training, pruning.wall, _workers(values))


#: How the plan costs each kind of chapter work (``mdlib.book.chapters``).
STAGES: Mapping[type, Callable[[str, Mapping[str, Any], tuple[str, ...], _Context], tuple[list[Stage], ChapterWall]]] = {
    chapters.OnCpu: _on_cpu, chapters.SentimentGrids: _sentiment, chapters.VisionGrids: _vision,
    chapters.Evaluates: _evaluates}


def _gpu_profile(profile: str) -> bool:
    """Whether the build of ``profile`` trains on a GPU: torch sees one, or it is the paper's scale (the
    profile whose chapters ``at_scale`` name, ``execute.gpu_warning``)."""
    import torch

    return torch.cuda.is_available() or (profile == "paper" and any(c.at_scale for c in chapters.CHAPTERS))


def _prepare(parameters: Mapping[str, Mapping[str, Any]], ctx: _Context) -> None:
    """Time the shapes of every run and model the chapters cost (``StepTimer.prepare``) before costing
    them: all at once, in as many processes as the chapters train runs at once (at most one per core)."""
    runs: list[tuple[str, Any]] = []
    for name, values in parameters.items():
        planned = planned_runs(name, values)
        if planned is not None:
            runs += [(run.kind, c) for run in planned for c in run.alternatives]
        elif isinstance(chapters.chapter(name).work, chapters.Evaluates):
            config = _evaluated(name, values)[0]
            runs += [("e4-sentiment", config)] if config is not None else []
    for rate in (ctx.costs.cpu, ctx.costs.gpu):
        if isinstance(rate, StepTimer):
            rate.prepare(runs, _at_once(parameters, ctx.cores))


def _at_once(parameters: Mapping[str, Mapping[str, Any]], cores: int) -> int:
    """In how many processes at once the plan times the shapes of chapters at ``parameters`` (by name): as
    many as its chapters train runs at once (their ``workers``), at most one per core."""
    training = (chapters.SentimentGrids, chapters.VisionGrids)
    return min(max([_workers(values) for name, values in parameters.items()
                    if isinstance(chapters.chapter(name).work, training)], default=1), cores)


def plan(profile: str, costs: Costs | None = None, *, workers: int | None = None, device: str | None = None,
         cores: int | None = None, known: Sequence[known_epochs.Known] | None = None) -> Plan:
    """Every chapter's rows at ``profile`` (``params/<profile>.yaml``), in the book's order, costed by
    ``costs`` (default: ``default_costs()``, by FLOPs), the wall times on each chapter's ``workers``
    parameter (or ``workers``) on ``device`` ("cpu" or "gpu"; default: a GPU where torch sees one or
    the profile is the paper's, else the CPU) with ``cores`` CPU cores (default: this machine's); the
    epochs from the ``known`` runs (default: the stored and committed ones, ``epochs.known_runs``)."""
    profiles.load_profile(profile)
    profiles.check_notebooks()
    if device not in (None, "cpu", "gpu"):
        raise ValueError(f"device {device!r}: cpu or gpu")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    costs = costs or default_costs()
    ctx = _Context(costs, device or ("gpu" if _gpu_profile(profile) else "cpu"), cores or steptimes.cores(),
                   known_epochs.Index(known_epochs.known_runs() if known is None else known))
    parameters = {}
    for name in chapters.NAMES:
        values = profiles.executed_parameters(name, profile)
        parameters[name] = {**values, "workers": workers} if workers is not None and "workers" in values else values
    _prepare(parameters, ctx)
    stages: list[Stage] = []
    walls: list[ChapterWall] = []
    for name in chapters.NAMES:
        chapter = chapters.chapter(name)
        values = parameters[name]
        data = chapter.needed(values)
        if chapter.reads:  # before the chapter it reads has run, the store cannot name its grid's data set
            data = [_read_grid(name, values).dataset] + data
        rows, wall = STAGES[type(chapter.work)](name, values, tuple(dict.fromkeys(data)), ctx)
        stages += rows
        walls.append(wall)
    return Plan(profile, stages, walls, ctx.device, ctx.cores, chapters.side_by_side(list(chapters.NAMES), ctx.cores))


def measure_cpu() -> float:
    """Seconds per 10^12 training FLOPs of one CPU thread here (how :data:`CPU_SECONDS_PER_TFLOP` was
    measured): steps of the sentiment encoder at width 128, 4 layers, 128 tokens, batch 32
    (``cost.training_step_time``), counted by ``workload.encoder_flops``."""
    import torch
    import torch.nn.functional as F

    from mdlib import LpMirrorDescent
    from mdlib.experiments import cost, sentiment

    config = sentiment.run_config(layers=4, width=128, max_length=128, optimizer="md", lr=1e-6, p=1.1, batch_size=32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = sentiment.initial_model(config).train()
        ids = torch.randint(1000, 2000, (32, config.max_length))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        loss = lambda logits, y: F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype))  # noqa: E731
        seconds = cost.training_step_time(model, LpMirrorDescent(model.parameters(), lr=1e-6, p=1.1), inputs,
                                          torch.randint(0, 2, (32,)), loss, repeats=3)
    finally:
        torch.set_num_threads(threads)
    return seconds / (3 * 32 * workload.encoder_flops(128, 128, 512, 4) / 1e12)


# ---------------------------------------------------------------------------------------------
# printing


def _count(value: float) -> str:
    """A count as the plan prints it: millions with one decimal, else a whole number."""
    return f"{value / 1e6:.1f} M" if value >= 1e6 else f"{value:,.0f}"


def _hours(value: float | None, bound: bool = False) -> str:
    if value is None:
        return "-"
    if value < 0.05:
        return "< 0.1"
    return ("<= " if bound else "") + f"{value:,.1f}"


def _wall(seconds: float | None, bound: bool = False) -> str:
    """Seconds on the clock as the plan prints them: minutes below 100, else hours."""
    if seconds is None:
        return "-"
    at_most = "<= " if bound else ""
    if seconds < 30:
        return "< 1 min" if seconds > 0 else "-"
    if seconds < 6000:
        return f"{at_most}{seconds / 60:.0f} min"
    return f"{at_most}{seconds / 3600:,.1f} h" if seconds < 360000 else f"{at_most}{seconds / 3600:,.0f} h"


def _row(stage: Stage) -> list[str]:
    at_most = "<= " if stage.bound else ""
    if not stage.unit:  # a chapter's other cells: only a wall time
        return [stage.notebook, stage.what, "-", "-", "-", "-", "-", _wall(stage.wall), "-"]
    if stage.epochs is None:
        epochs = "-"
    elif stage.bound or round(stage.epochs) == stage.epochs_cap:
        epochs = f"{at_most}{stage.epochs:,.0f}"
    else:
        epochs = f"{stage.epochs:,.0f} (<= {stage.epochs_cap:,})"
    steps = at_most + _count(stage.steps) + ("" if stage.bound or math.isclose(stage.steps, stage.steps_cap)
                                             else f" (<= {_count(stage.steps_cap)})")
    return [stage.notebook, stage.what, f"{stage.runs:,}" if stage.runs else "-", epochs, f"{steps} {stage.unit}",
            _hours(stage.gpu_hours, stage.bound), _hours(stage.cpu_hours, stage.bound), _wall(stage.wall, stage.bound),
            ", ".join(stage.data) or "-"]


HEADER = ["notebook", "what", "runs", "epochs a run", "steps", "GPU h", "CPU h", "wall", "data"]


def _totals(stages: Iterable[Stage]) -> tuple[int, float, float]:
    """(training runs, GPU hours with the CPU chapters' CPU hours, CPU hours) over the stages."""
    stages = list(stages)
    gpu = sum(s.gpu_hours if s.gpu_hours is not None else s.cpu_hours for s in stages)
    return sum(s.runs for s in stages if s.unit == "steps"), gpu, sum(s.cpu_hours for s in stages)


def _legend(found: Plan, profile: str, costs: Costs) -> list[str]:
    where = ("one GPU per worker (a chapter's `workers`; the CPU chapters on the CPU)" if found.device == "gpu"
             else "this machine's CPU, each run in one of a chapter's `workers` processes of one thread")
    return [f"GPU h: {costs.gpu.source}; a chapter that runs on the CPU counts its CPU hours there.",
            f"CPU h: {costs.cpu.source}.",
            f"wall: the time on the clock on {where}: a chapter's runs in the rounds its pools train them, each to "
            "the worker free first; its forward passes and other cells after them; chapters 01-03 side by side, "
            f"one per core; the HTML book after the chapters ({HTML.seconds:.0f} s, measured). A training row "
            "holds its share of its chapter's training time (by its device hours).",
            "runs: training runs (trials for the synthetic chapters; the total counts training runs). Epochs and "
            "steps: expected, with the most the epoch caps allow (<=) where the stop rule decides and no run of "
            "the setting is known. Device hours are one device's: the sum of the runs' times.",
            f"`python -m mdlib plan --profile {profile}` estimates this without training, fetching or installing anything."]


def _chapter_walls(found: Plan) -> list[str]:
    out = []
    for wall in found.walls:
        parts = []
        if wall.training:
            parts.append(f"training {_wall(wall.training)} on {wall.workers} worker{'s' * (wall.workers > 1)}")
        if wall.forward:
            parts.append(f"forward passes {_wall(wall.forward)}")
        if wall.rest and (wall.training or wall.forward):
            parts.append(f"other cells {_wall(wall.rest)}")
        out.append(f"- {wall.notebook}: {_wall(wall.total)}" + (f" ({', '.join(parts)})" if parts else ""))
    side = [group for group in found.groups if len(group) > 1]
    for group in side:
        out.append(f"- {', '.join(group)} side by side: {_wall(found.wall_of(group))}")
    out.append(f"- the HTML book: {_wall(HTML.seconds)}")
    out.append(f"- the book: {_wall(found.wall)}")
    return out


def _notes(stages: Iterable[Stage]) -> list[str]:
    return [f"- {s.notebook}, {s.what}: {s.note}" for s in stages if s.note]


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` of cells as lines of left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def text(found: Plan, profile: str, costs: Costs | None = None) -> str:
    """The plan as an aligned text table, with totals, the sources of its estimates, each chapter's wall time
    and the notes."""
    costs = costs or default_costs()
    rows = [HEADER] + [_row(s) for s in found.stages]
    runs, gpu, cpu = _totals(found.stages)
    bound = any(s.bound for s in found.stages)
    rows.append(["total", "", f"{runs:,}", "", "", _hours(gpu, bound), _hours(cpu, bound), _wall(found.wall, bound), ""])
    return "\n".join([f"plan of profile {profile!r}", *_aligned(rows), "", *_legend(found, profile, costs), "",
                      "Wall time per chapter:", *_chapter_walls(found), "", *_notes(found.stages)]) + "\n"


def markdown(found: Plan, profile: str, costs: Costs | None = None) -> str:
    """The plan as a markdown table (README, the reproduce page), with totals, sources, each chapter's wall
    time and notes."""
    costs = costs or default_costs()
    rows = [_row(s) for s in found.stages]
    runs, gpu, cpu = _totals(found.stages)
    bound = any(s.bound for s in found.stages)
    rows.append(["**total**", "", f"**{runs:,}**", "", "", f"**{_hours(gpu, bound)}**", f"**{_hours(cpu, bound)}**",
                 f"**{_wall(found.wall, bound)}**", ""])
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in r) + " |" for r in rows]
    return "\n".join(lines + [""] + [f"- {line}" for line in _legend(found, profile, costs)]
                     + ["", "Wall time per chapter:", ""] + _chapter_walls(found) + ["", "Notes:", ""]
                     + _notes(found.stages)) + "\n"


# ---------------------------------------------------------------------------------------------
# the plan against a build

#: How far a chapter's measured time may be from its plan and still be "within": 25 %.
WITHIN = 0.25


@dataclass(frozen=True)
class Executed:
    """A build's executed notebooks as ``plan --against`` reads them: their ``profile``, each chapter's
    seconds (``walls``: papermill's duration of the whole notebook, kernel start included) and, where the
    execution read the speed probe (``steptimes.probe``), the machine's speed around it (``speeds``: the
    mean of the readings before and after, seconds)."""

    profile: str | None
    walls: dict[str, float]
    speeds: dict[str, float]


def executed(folder: Path) -> Executed:
    """The executed notebooks ``<chapter>.ipynb`` in ``folder``, those there. A ValueError where they ran
    at different profiles."""
    import json

    walls, speeds, profiles_seen = {}, {}, set()
    for name in chapters.NAMES:
        path = Path(folder) / f"{name}.ipynb"
        if not path.is_file():
            continue
        metadata = json.loads(path.read_text("utf-8")).get("metadata", {})
        meta = metadata.get("papermill", {})
        if meta.get("duration") is None:
            continue
        walls[name] = float(meta["duration"])
        profiles_seen.add((meta.get("parameters") or {}).get("profile"))
        speed = (metadata.get("mdlib") or {}).get("speed") or {}
        if speed.get("before") and speed.get("after"):
            speeds[name] = (float(speed["before"]) + float(speed["after"])) / 2
    if len(profiles_seen) > 1:
        raise ValueError(f"the notebooks in {folder} ran at different profiles ({', '.join(sorted(map(str, profiles_seen)))}); "
                         "check one build's notebooks")
    return Executed(next(iter(profiles_seen)) if profiles_seen else None, walls, speeds)


def against(found: Plan, build: Executed, probe: tuple[float, str] | None = None) -> str:
    """Each chapter's planned and measured wall time (``executed``), their ratio and whether it is within
    :data:`WITHIN` of 1, and the chapters' total in the book's groups (01-03 side by side), the HTML book
    aside (a notebook does not record it). With the speed probe as of the plan's timings (``probe``:
    seconds, when) and the build's readings, also how fast the machine ran each chapter against the plan's
    timings (the machine's drift) and the ratio at the plan's speed (the plan's own error)."""
    planned = {w.notebook: w.total for w in found.walls}
    measured = build.walls
    drift = ({name: speed / probe[0] for name, speed in build.speeds.items()} if probe else {})
    header = ["chapter", "planned", "measured", "measured / planned", f"within {WITHIN:.0%}"]
    if drift:
        header += ["machine's time / plan's", "at the plan's speed", f"within {WITHIN:.0%}"]
    rows = [header]

    def judged(ratio: float) -> list[str]:
        return [f"{ratio:.2f}", "yes" if abs(ratio - 1) <= WITHIN else "no"]

    def row(what: str, plan_seconds: float, seconds: float, at_plan_speed: float | None, factor: str) -> list[str]:
        cells = [what, f"{plan_seconds:,.0f} s", f"{seconds:,.0f} s", *judged(seconds / max(plan_seconds, 1e-9))]
        if drift:
            cells += ([factor, *judged(at_plan_speed / max(plan_seconds, 1e-9))] if at_plan_speed is not None
                      else ["not read", "", ""])
        return cells

    for name in chapters.NAMES:
        if name not in measured:
            rows.append([name, _wall(planned[name]), "not executed", "", ""] + ["", "", ""] * bool(drift))
            continue
        factor = drift.get(name)
        rows.append(row(name, planned[name], measured[name], None if factor is None else measured[name] / factor,
                        "" if factor is None else f"{factor:.2f}"))
    groups = [group for group in found.groups if all(name in measured for name in group)]
    if groups:
        adjusted = None
        if all(name in drift for group in groups for name in group):
            adjusted = sum(_side_by_side([measured[name] / drift[name] for name in group], found.cores)
                           for group in groups)
        rows.append(row("the chapters" + ("" if len(groups) == len(found.groups) else " executed"),
                        sum(found.wall_of(group) for group in groups),
                        sum(_side_by_side([measured[name] for name in group], found.cores) for group in groups),
                        adjusted, ""))
    lines = [f"plan of profile {found.profile!r} against its executed notebooks (the plan from the committed runs "
             "alone, as before a build; measured: papermill's duration of each notebook)", *_aligned(rows)]
    if drift:
        lines.append(f"machine's time / plan's: the speed probe's reading during the chapter (the mean of its readings "
                     f"before and after it) over its reading as of the plan's timings ({probe[0] * 1e3:.1f} ms, "
                     f"{probe[1]}); at the plan's speed: the measured time over that factor. The probe: "
                     f"{steptimes.PROBE_TEXT}.")
    elif build.speeds:
        lines.append("the plan's timings hold no reading of the speed probe (`python -m mdlib plan --measure` takes one "
                     "with them): the machine's drift is not told apart from the plan's error")
    elif build.walls:
        lines.append("the notebooks hold no reading of the speed probe (built with $MDLIB_SPEED_PROBE off, or before "
                     "it): the machine's drift is not told apart from the plan's error")
    return "\n".join(lines) + "\n"
