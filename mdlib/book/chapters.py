"""The book's chapters, each in one place: :data:`CHAPTERS`, in the book's order (``_toc.yml``'s), one
:class:`Chapter` per notebook ``notebooks/<name>.py``, with

- ``reads``: the chapters whose outputs it analyses (05 and 06 read the Table 1 grid 04 builds);
- ``data``: the data sources (``mdlib.experiments.fetch.NAMES``) it reads, from its parameters as it
  executes (``Chapter.needed``; ``execute.run_notebook`` fetches them first, the plan lists them);
- ``claims``: the labels of the figures and tables its scorecard claims judge (``BY_CLAIM``: label -> chapter);
- ``work``: what it runs, which ``mdlib.book.plan`` costs: on the CPU (``OnCpu``: its steps and its
  measured time), transformer grids (``SentimentGrids``, ``VisionGrids``), or forward passes through the
  models of a chapter it reads (``Evaluates``);
- ``at_scale``: what the paper profile trains at the paper's scale, for the chapters that need a GPU
  there (``execute.gpu_warning``);
- ``rest``: for a chapter that trains transformer grids or evaluates their models, the time of its
  cells besides that work (loading, analyses, tables, figures) at the default profile (the plan adds it
  to the chapter's wall time, scaled at another profile by the chapter's runs or evaluated examples);
- ``one_thread``: its work runs in one thread, so ``mdlib book`` executes it beside the neighbouring such
  chapters (``side_by_side``); the others keep every core busy, or time themselves (08), and run
  alone.

:data:`NAMES` is the one list of the book's chapters: the build, the plan, the parameters page and the
CLI read it, never the ``notebooks/`` folder. ``profiles.check_notebooks`` holds ``notebooks/`` to it (a
chapter notebook it lacks gets its entry here), ``book._check_toc`` holds ``_toc.yml`` to it, and a test
every profile's sections (a profile names only the chapters it changes, each one of these). No other
module of mdlib types a chapter's name: each looks its chapter up here (``chapter``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["BY_CLAIM", "CHAPTERS", "Chapter", "Evaluates", "Measured", "NAMES", "OnCpu", "SentimentGrids",
           "VisionGrids", "chapter", "side_by_side", "table1_profile"]

Parameters = Mapping[str, Any]  #: every parameter as the notebook executes (``profiles.executed_parameters``)


@dataclass(frozen=True)
class Measured:
    """A notebook's wall time at the default profile on the 2-core CPU machine: ``seconds``, on the
    date ``when`` (``python -m mdlib run NAME`` with an empty results store); ``how`` it was found where
    that is not a notebook's whole execution timed; ``probe``: the speed probe's reading around that
    execution (``steptimes.probe``, seconds; None where it was not read), by which the plan scales the
    time to the machine's speed as of its own timings."""

    seconds: float
    when: str
    how: str = "measured"
    probe: float | None = None


@dataclass(frozen=True)
class OnCpu:
    """A chapter that runs on the CPU: ``count(parameters)`` gives (trials, steps in ``unit``); the plan
    scales its wall time ``measured`` at the default profile by its steps. ``what`` and ``where`` are
    the plan's words for it."""

    what: str
    count: Callable[[Parameters], tuple[int, float]]
    measured: Measured
    unit: str = "trial steps"
    where: str = "runs on the CPU"


@dataclass(frozen=True)
class SentimentGrids:
    """A chapter that trains the sentiment grids ``sentiment.chapter_grids(**parameters)``."""


@dataclass(frozen=True)
class VisionGrids:
    """A chapter that trains the vision grids ``vision.chapter_grids(**parameters)`` and prunes its final
    runs at each of its ``sparsities``."""


@dataclass(frozen=True)
class Evaluates:
    """A chapter that trains nothing: forward passes through the models of depth ``depth`` of the grid
    the chapter it reads built (at its ``table1`` profile, else its own), ``per_model(parameters,
    splits)`` examples per model (``splits``: the (train, validation, test) sizes of the grid's data)."""

    what: str
    per_model: Callable[[Parameters, tuple[int, int, int]], float]


Work = OnCpu | SentimentGrids | VisionGrids | Evaluates


def _reads_nothing(parameters: Parameters) -> list[str]:
    return []


def _text(parameters: Parameters) -> list[str]:
    """A sentiment data set and the WordPiece vocabulary that tokenizes it."""
    return [parameters["dataset"], "wordpiece_vocab"]


def _images(parameters: Parameters) -> list[str]:
    return list(parameters["datasets"])


def table1_profile(parameters: Parameters) -> str:
    """The profile at which a reading chapter reads chapter 04's Table 1 grid: its ``table1`` parameter,
    else ("") its own profile."""
    return parameters.get("table1") or parameters["profile"]


def _built_grid(parameters: Parameters) -> list[str]:
    """The data set of the Table 1 grid built at the chapter's ``table1`` profile, else its own (known
    once built: read from the results store), and the vocabulary that tokenizes it."""
    from mdlib.experiments import sentiment

    config = sentiment.built_config(table1_profile(parameters))
    return ([config.dataset] if config is not None else []) + ["wordpiece_vocab"]


def _built_grid_and_lexicon(parameters: Parameters) -> list[str]:
    """``_built_grid``'s, and the VADER lexicon, which comes with ``rotten_tomatoes``."""
    return _built_grid(parameters) + ["rotten_tomatoes"]


def _e1(p: Parameters) -> tuple[int, float]:
    trials = (p["seeds"] + p["stall_seeds"]) * len(p["train_ps"])
    return trials, (p["seeds"] + p["stall_seeds"]) * sum(p["steps"])


def _e2(p: Parameters) -> tuple[int, float]:
    return 2 * len(p["ps"]), len(p["ps"]) * (p["normalized_steps"] + p["plain_steps"])


def _e3(p: Parameters) -> tuple[int, float]:
    return len(p["ps"]), sum(p["steps"])


def _e8(p: Parameters) -> tuple[int, float]:
    return 0, len(p["ps"]) * len(p["modes"]) * p["repeats"] * len(p["sizes"]) + p["training_repeats"] + p["vit_repeats"]


def _e9(p: Parameters) -> tuple[int, float]:
    from mdlib.experiments import step_size_guide

    return step_size_guide.work(**p)


@dataclass(frozen=True)
class Chapter:
    """One chapter: see the module's docstring for each field."""

    name: str
    work: Work
    data: Callable[[Parameters], list[str]] = _reads_nothing
    reads: tuple[str, ...] = ()
    claims: tuple[str, ...] = ()
    at_scale: str | None = None
    one_thread: bool = False
    rest: Measured | None = None

    def needed(self, parameters: Parameters) -> list[str]:
        """The data sources (``fetch.NAMES``) the chapter reads at ``parameters``, each once; a
        ValueError for a source ``fetch`` does not know."""
        from mdlib.experiments import fetch

        names = list(dict.fromkeys(self.data(parameters)))
        unknown = [name for name in names if name not in fetch.NAMES]
        if unknown:
            raise ValueError(f"{self.name} reads unknown data {', '.join(map(repr, unknown))}; known: "
                             f"{', '.join(fetch.NAMES)}")
        return names


# The CPU chapters' measured wall times, in the fresh clone's default `make book` of 2026-12-07 05:00-06:08
# UTC on 2 otherwise idle cores (4,077 s), each with the speed probe's reading around it (the mean of
# its readings before and after, seconds: ``steptimes.probe``), by which the plan scales it to the
# machine's speed as of its own timings: 01-03 side by side as the book runs them (01 then 03 on one
# core, 02 on the other), 08, and 09 with its runs in 2 worker processes. The other chapters' other
# cells (``rest``): the same build's cells besides their runs and forward passes, by papermill's cell
# durations (04: 2,389 s less its cell of pools; 05: 26 s less its deletion and concentration cells; 06:
# 53 s less its pruning cell; 07: 1,006 s less its sweep, finals and paper-step cells and its pruning
# cell). (The idle build of 2026-12-07 01:00, 3,069 s, the plan's reference before, read no probe: its
# times were 0.65-0.8x these, the machine faster then.)
_BUILD = "2026-12-07"
_REST_04 = Measured(25.0, _BUILD, "that build's 2,389 s less its cell of pools of runs", probe=0.0840)
_REST_05 = Measured(16.2, _BUILD, "that build's 26 s less its two cells of forward passes", probe=0.0952)
_REST_06 = Measured(12.9, _BUILD, "that build's 53 s less its cell of forward passes", probe=0.1005)
_REST_07 = Measured(12.6, _BUILD, "that build's 1,006 s less its cells of runs and of pruning curves", probe=0.0842)
#: The chapters, in the book's order.
CHAPTERS: tuple[Chapter, ...] = (
    # 01-03 train in one thread (``synthetic.train``): the book runs them side by side
    Chapter("01_fixed_decoder_paths", OnCpu("fixed-decoder paths (trials)", _e1, Measured(121.9, _BUILD, probe=0.0793)),
            claims=("fig-e1-paths",), one_thread=True),
    Chapter("02_single_instance_path", OnCpu("single-instance paths (normalized and plain)", _e2,
                                             Measured(155.4, _BUILD, probe=0.0811)),
            claims=("fig-e2-norm-growth",), one_thread=True),
    Chapter("03_joint_training", OnCpu("joint training of W and v", _e3, Measured(25.3, _BUILD, probe=0.0805)),
            claims=("table-e3-final",), one_thread=True),
    Chapter("04_sentiment", SentimentGrids(), _text, claims=("table-1", "table-1-variation", "table-sentiment-allocation", "fig-sentiment-scale-series"),
            at_scale="about a hundred encoder runs of up to 1,000 epochs on IMDb", rest=_REST_04),
    # 05: attention on the lexicon-pivot sentences and on every test sentence, then two deletions each
    Chapter("05_token_selection", Evaluates("attention of chapter 04's models", lambda p, splits: 4 * splits[2]),
            _built_grid_and_lexicon, reads=("04_sentiment",),
            claims=("table-token-selection", "fig-token-concentration"), rest=_REST_05),
    Chapter("06_weights", Evaluates("pruning curves of chapter 04's models",
                                    lambda p, splits: len(p["sparsities"]) * splits[2]),
            _built_grid, reads=("04_sentiment",), claims=("table-weights-change", "fig-pruning"), rest=_REST_06),
    Chapter("07_vision", VisionGrids(), _images, claims=("table-vit", "table-vit-change"),
            at_scale="vision-transformer runs of up to 2,000 epochs on CIFAR-10 and CIFAR-100", rest=_REST_07),
    Chapter("08_cost", OnCpu("timed steps of the optimizers and the chapters' models", _e8,
                             Measured(187.7, _BUILD, probe=0.0820), "timed steps",
                             "times its steps on the GPU when there is one, on the CPU here"),
            claims=("table-cost-training",)),
    Chapter("09_step_sizes", OnCpu("lr x p sweep of a tiny sentiment encoder", _e9, Measured(178.9, _BUILD, probe=0.0848),
                                   "steps", "trains on the GPU when there is one, else in `workers` CPU processes"),
            _text),
)
#: The chapters' names, in the book's order.
NAMES = tuple(c.name for c in CHAPTERS)
_BY_NAME = {c.name: c for c in CHAPTERS}
#: A scorecard claim's label -> the name of the chapter that makes its figure or table.
BY_CLAIM: Mapping[str, str] = {label: c.name for c in CHAPTERS for label in c.claims}


def chapter(name: str) -> Chapter:
    """The chapter ``name``; a ValueError naming the registry when it holds no such chapter."""
    if name not in _BY_NAME:
        raise ValueError(f"no chapter {name!r} in mdlib.book.chapters.CHAPTERS (the chapters: {', '.join(NAMES)}); "
                         "a new notebook gets its entry there")
    return _BY_NAME[name]



def side_by_side(names: list[str], cores: int) -> list[list[str]]:
    """The chapters ``names`` (in the book's order) as the groups ``mdlib book`` executes one after another
    (and the plan counts): a run of consecutive chapters whose work runs in one thread
    (``Chapter.one_thread``) and read none of each other is one group, whose chapters run side by side,
    ``cores`` at a time; every other chapter is a group of its own. With one core, every chapter is."""
    groups: list[list[str]] = []
    for name in names:
        found = chapter(name)
        last = groups[-1] if groups else []
        if (cores > 1 and found.one_thread and last and chapter(last[0]).one_thread
                and not set(found.reads) & set(last)):
            last.append(name)
        else:
            groups.append([name])
    return groups
