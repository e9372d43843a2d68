"""Table 1's gap taken apart: the l_p geometry of a step against how large a step each tensor gets.

Under mirror descent one global step size is a different effective step per tensor: to first order an
entry w moves by lr |g| |w|^(2-p) / (p-1) (``mirror.matched_lr``), so at p = 1.1 a tensor's step is
lr |w|^0.9 / 0.1 where GD's is lr everywhere, and a change of a tensor's scale (the embeddings' std)
changes exactly what separates the two methods. Three measurements separate the factors (chapter 04):

- ``effective_steps``: the first-order effective step of every parameter group of a run's model at
  initialization, the mean over the group's entries of lr_t |w|^(2-p) / (p-1), from the optimizer the
  run builds (lr_t: its tensor's step); ``embedding_ratio``: ℓ1.1's embedding step over GD's;
- the 2 x 2 {ℓ1.1, GD} x {one global step, steps per tensor} (``ArmGrid``, ``allocation``): besides the
  two global runs of a grid, ℓ1.1 with each tensor's step matched to GD's chosen step (arm ``"1.1@2"``:
  ℓ1.1's geometry, GD's allocation) and GD with each tensor's step matched to ℓ1.1's chosen step
  (``"2@1.1"``: GD's geometry, ℓ1.1's allocation), each arm with a global multiplier of its matched steps
  chosen on validation by the grids' rule (``step_grid.tie_choice``), at the grid's seeds;
  ``estimates.allocation_effects`` reads the four simple effects and the interaction;
- the embedding-scale series (``chapter.series_grids``): the grid at several embedding stds, each scale with its
  own steps chosen on validation, with ``equal_step_std``, the scale at which the two methods' embedding
  steps are equal to first order at given steps.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from mdlib.experiments import estimates, methods, step_grid
from mdlib.experiments.sentiment import grids
from mdlib.experiments.sentiment.run import KIND, SentimentRun, initial_model
from mdlib.experiments.train import Optimizer
from mdlib.models import SMALL_EMBEDDING_STD
from mdlib.runs import identity, store

__all__ = ["ARMS", "ARM_KIND", "Allocation", "ArmGrid", "allocation", "arm_config", "contrasts_table", "embedding_std",
           "effective_steps", "embedding_ratio", "equal_step_std", "step_table"]

#: The arms of the 2 x 2 besides the grid's global runs: key -> (the method trained, the method whose
#: chosen global step each tensor's step is matched to).
ARMS = {methods.arm_key(trained, matched): (trained, matched)
        for trained, matched in ((methods.L1_1, methods.GD), (methods.GD, methods.L1_1))}


ARM_KIND = identity.kind("e4-arms", __name__)


def arm_config(config: grids.SentimentGrid, chosen: Mapping[tuple[int, str], float], arm: str, seed: int,
               layers: int | None = None, multiple: float = 1.0) -> SentimentRun:
    """The run config of ``arm`` (``ARMS``) at ``seed`` in a grid (``config``, whose ``chosen`` multiples are
    {(layers, method): multiple}): the trained method's run (its model, data and seed) with each tensor's
    step matched, at its initial mean |w|, to ``multiple`` times the step chosen for the matched method
    (``train.Optimizer.matched_p``). ``layers``: the grid's first depth when None."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    L = config.layers[0] if layers is None else layers
    trained, matched = ARMS[arm]
    base = config.run((L, trained), chosen[L, trained], seed)
    reference = config.run((L, matched), chosen[L, matched], seed).optimizer
    name, p = methods.method(trained)
    if name != "md" or reference.p is None:
        raise ValueError(f"arm {arm!r}: both methods must be l_p mirror descent")
    return dataclasses.replace(base, optimizer=Optimizer("md", float(multiple) * reference.lr, p, reference.p))


@dataclass(frozen=True)
class ArmGrid(identity.Config):
    """The 2 x 2's arms on a grid (``base``, whose ℓ1.1 and GD steps it chooses first): each arm (``ARMS``)
    at ``multiples`` (candidates, in order) times its matched steps, swept at the sweep seeds, chosen by
    ``grids.choose`` (the grids' rule), growing ``grow`` times past an end, then every seed of
    ``seeds`` at the choice (and with ``tied_finals`` at each tied multiple). ``to_dict()`` is what the
    store keeps (kind ``ARM_KIND``)."""

    WHAT = "a 2 x 2 arms config"

    base: grids.SentimentGrid
    multiples: list[float]
    seeds: int
    grow: int = 0
    tied_finals: bool = False

    def design(self, chosen: Mapping[tuple[int, str], float]) -> step_grid.Design:
        """The arms' grid, given the base grid's ``chosen`` multiples {(layers, method): multiple}."""
        L = self.base.layers[0]

        def run(cell: tuple[int, str], multiple: float, seed: int) -> SentimentRun:
            return arm_config(self.base, chosen, cell[1], seed, cell[0], multiple)

        def correct(layers: int, arm: str, multiple: float, seed: int) -> np.ndarray:
            return grids.stored_correct(run((layers, arm), multiple, seed))

        return step_grid.Design(
            kind=ARM_KIND, run_kind=KIND, config=self, cells=[(L, arm) for arm in ARMS],
            candidates=lambda cell: self.multiples, seeds=lambda cell: self.seeds,
            sweep_seeds=lambda cell: range(self.seeds if len(self.multiples) == 1 else min(grids.SWEEP_SEEDS,
                                                                                             self.seeds)),
            sweep_config=run, final_config=run, summary=grids.run_row, columns=("layers", "method"),
            candidate="multiple", choose=lambda rows: grids.choose(rows, correct),
            train_runs=grids.train_runs, summarise_finals=True, grow=self.grow, tied_finals=self.tied_finals)


@dataclass
class Allocation:
    """The 2 x 2 at one embedding scale (``allocation``). ``runs``: one row per run, the base grid's chosen
    ℓ1.1 and GD runs (``steps`` "global") and every run of the arms' grid (``steps`` "per tensor",
    ``method`` the arm's key, ``multiple`` its multiplier of the matched steps, ``chosen`` and ``tied``),
    with ``Grid.runs``' columns and ``embedding_std``; ``configs`` / ``results``: the arms' chosen runs
    that finished, keyed (layers, arm, seed) as a grid's are; ``tied_configs`` / ``tied_results``: with
    ``tied_finals``, every seed at every tied multiple, keyed (layers, arm, multiple, seed)."""

    runs: pd.DataFrame
    configs: dict[tuple[int, str, int], SentimentRun]
    results: dict[tuple[int, str, int], store.RunResult]
    tied_configs: dict[tuple, SentimentRun] = field(default_factory=dict)
    tied_results: dict[tuple, store.RunResult] = field(default_factory=dict)


def embedding_std(config: grids.SentimentGrid) -> float:
    """The std of the embeddings' initialization of ``config``'s runs (the model's default when it names none)."""
    return SMALL_EMBEDDING_STD if config.embedding_std is None else float(config.embedding_std)


def allocation(arms: ArmGrid, grid: grids.Grid | None = None, *, workers: int = 1, progress: bool = True,
               stored_only: bool = False) -> Allocation:
    """The 2 x 2 of ``arms`` (its base grid built as ``grid`` when given, else read back or trained): the
    base grid's chosen ℓ1.1 and GD runs beside the arms' grid, trained when missing; ``stored_only``:
    read them back, never train (LookupError when one is missing)."""
    base = grid or grids.grid(arms.base, workers=workers, progress=progress, stored_only=stored_only,
                                  missing_hint="build chapter 04 at this profile")
    L = arms.base.layers[0]
    missing = [k for k in estimates.COMPARED if (L, k) not in base.chosen]
    if missing:
        raise ValueError(f"the grid has no chosen {missing} runs at {L} layers: the 2 x 2 needs ℓ1.1 and GD")
    built = step_grid.build(arms.design(base.chosen), workers=workers, progress=progress, stored_only=stored_only,
                            missing_hint="build chapter 04 at this profile", what="2 x 2")
    arm_runs = pd.concat([t for t in (built.sweep, built.finals) if t is not None and len(t)], ignore_index=True)
    chosen = base.runs[base.runs.chosen.astype(bool) & (base.runs.layers == L) & base.runs.method.isin(estimates.COMPARED)]
    runs = pd.concat([chosen.assign(steps="global"), arm_runs.assign(steps="per tensor")], ignore_index=True)
    runs = runs.assign(embedding_std=embedding_std(arms.base), tied=runs.tied.fillna(runs.chosen).astype(bool))
    lead = ["embedding_std", "layers", "method", "steps"]
    return Allocation(runs[lead + [c for c in runs.columns if c not in lead]], built.configs, built.results,
                      built.tied_configs, built.tied_results)


def effective_steps(config: SentimentRun) -> dict[str, float]:
    """The first-order effective step of each parameter group (``EncoderClassifier.parameter_groups``) of
    the run's model at initialization: the mean over the group's entries of lr_t |w|^(2-p) / (p-1), lr_t
    the step the run's optimizer gives the entry's tensor (GD: lr_t). Mirror-descent runs only."""
    if config.optimizer.name != "md":
        raise ValueError(f"effective steps are for mirror descent, got optimizer {config.optimizer.name!r}")
    p = config.optimizer.p
    model = initial_model(config)
    optimizer = config.optimizer.make(model.parameters())
    step_of = {id(w): group["lr"] for group in optimizer.param_groups for w in group["params"]}
    tensors = dict(model.named_parameters())
    out = {}
    for group, names in model.parameter_groups().items():
        total = count = 0.0
        for name in names:
            w = tensors[name].detach().double()
            total += step_of[id(tensors[name])] * float((w.abs() ** (2.0 - p)).sum()) / (p - 1.0)
            count += w.numel()
        if count:
            out[group] = total / count
    return out


def embedding_ratio(lr_md: float, lr_gd: float, std: float, p: float = 1.1) -> float:
    """ℓ_p's mean first-order step on N(0, std^2) embeddings over GD's, at steps ``lr_md`` and ``lr_gd``:
    lr_md E|w|^(2-p) / ((p-1) lr_gd), E|w|^a = std^a 2^(a/2) Gamma((a+1)/2) / sqrt(pi) (the mean of
    ``effective_steps``' embeddings group, in expectation): what the embedding scale acts on (1: the two
    methods start moving the embeddings alike; ``equal_step_std`` is the std where it is 1)."""
    a = 2.0 - p
    moment = std ** a * 2 ** (a / 2) * math.gamma((a + 1) / 2) / math.sqrt(math.pi)
    return lr_md * moment / ((p - 1.0) * lr_gd)


def step_table(configs: Mapping[tuple[str, str], SentimentRun]) -> pd.DataFrame:
    """``effective_steps`` of each (setup name, method or arm key) run config, one row per parameter group:
    setup, method, lr (the run's step, or the matched step for an arm), group, effective_step and
    vs_gd (over the effective step of the same setup's global GD run, "2", when there is one)."""
    rows = [{"setup": setup, "method": key, "lr": config.optimizer.lr, "group": group, "effective_step": step}
            for (setup, key), config in configs.items() for group, step in effective_steps(config).items()]
    table = pd.DataFrame(rows)
    gd = table[table.method == methods.GD].set_index(["setup", "group"]).effective_step
    return table.assign(vs_gd=[step / gd.get((s, g), math.nan) for s, g, step in
                               zip(table.setup, table.group, table.effective_step)])


def equal_step_std(lr_md: float, lr_gd: float, p: float = 1.1) -> float:
    """The embedding std sigma at which ℓ_p mirror descent at ``lr_md`` and GD at ``lr_gd`` give N(0, sigma^2)
    entries the same mean first-order step: lr_md E|w|^(2-p) / (p-1) = lr_gd, with E|w|^a = sigma^a
    2^(a/2) Gamma((a+1)/2) / sqrt(pi) for a Gaussian (a = 2 - p)."""
    a = 2.0 - p
    moment = 2 ** (a / 2) * math.gamma((a + 1) / 2) / math.sqrt(math.pi)  # E|z|^a, z ~ N(0, 1)
    return (lr_gd * (p - 1.0) / (lr_md * moment)) ** (1.0 / a)


def contrasts_table(effects: Mapping[float, Mapping[str, estimates.Estimate]]) -> pd.DataFrame:
    """The 2 x 2s' contrasts ({std: ``estimates.allocation_effects``}) as one table, a row per (std, contrast)."""
    return pd.DataFrame([{"embedding_std": std, "contrast": name, "n": e.n, "value": e.value, "low": e.low,
                          "high": e.high, "seeds_low": e.seeds_low, "seeds_high": e.seeds_high,
                          "detectable": e.detectable, "sd": e.sd}
                         for std, named in effects.items() for name, e in named.items()])
