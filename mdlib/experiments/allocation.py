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
- the embedding-scale series (``series_grids``): the grid at several embedding stds, each scale with its
  own steps chosen on validation, with ``equal_step_std``, the scale at which the two methods' embedding
  steps are equal to first order at given steps.

The long profile (``overnight``) trains the series and the 2 x 2s; ``overnight_tables`` gathers their runs
and per-sentence predictions, which the default chapter reads as committed under ``data/``
(``committed``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from mdlib.experiments import estimates, methods, paths, sentiment, step_grid
from mdlib.experiments.train import Optimizer
from mdlib.models import SMALL_EMBEDDING_STD
from mdlib.runs import identity, store

__all__ = ["ARMS", "ARM_KIND", "Allocation", "ArmGrid", "COMMITTED", "allocation", "arm_config", "committed", "contrasts_table", "long_part", "long_tables",
           "effective_steps", "embedding_ratio", "equal_step_std", "long_predictions", "overnight_tables",
           "predictions_table", "same_variation", "series_grids", "series_points", "step_table", "tied_at",
           "train_chapter", "two_by_two"]

#: The arms of the 2 x 2 besides the grid's global runs: key -> (the method trained, the method whose
#: chosen global step each tensor's step is matched to).
ARMS = {methods.arm_key(trained, matched): (trained, matched)
        for trained, matched in ((methods.L1_1, methods.GD), (methods.GD, methods.L1_1))}

ARM_KIND = identity.kind("e4-arms", __name__)


def arm_config(config: sentiment.SentimentGrid, chosen: Mapping[tuple[int, str], float], arm: str, seed: int,
               layers: int | None = None, multiple: float = 1.0) -> sentiment.SentimentRun:
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
    ``sentiment.choose`` (the grids' rule), growing ``grow`` times past an end, then every seed of
    ``seeds`` at the choice (and with ``tied_finals`` at each tied multiple). ``to_dict()`` is what the
    store keeps (kind ``ARM_KIND``)."""

    WHAT = "a 2 x 2 arms config"

    base: sentiment.SentimentGrid
    multiples: list[float]
    seeds: int
    grow: int = 0
    tied_finals: bool = False

    def design(self, chosen: Mapping[tuple[int, str], float]) -> step_grid.Design:
        """The arms' grid, given the base grid's ``chosen`` multiples {(layers, method): multiple}."""
        L = self.base.layers[0]

        def run(cell: tuple[int, str], multiple: float, seed: int) -> sentiment.SentimentRun:
            return arm_config(self.base, chosen, cell[1], seed, cell[0], multiple)

        def correct(layers: int, arm: str, multiple: float, seed: int) -> np.ndarray:
            return sentiment.stored_correct(run((layers, arm), multiple, seed))

        return step_grid.Design(
            kind=ARM_KIND, run_kind=sentiment.KIND, config=self, cells=[(L, arm) for arm in ARMS],
            candidates=lambda cell: self.multiples, seeds=lambda cell: self.seeds,
            sweep_seeds=lambda cell: range(self.seeds if len(self.multiples) == 1 else min(sentiment.SWEEP_SEEDS,
                                                                                             self.seeds)),
            sweep_config=run, final_config=run, summary=sentiment.run_row, columns=("layers", "method"),
            candidate="multiple", choose=lambda rows: sentiment.choose(rows, correct),
            train_runs=sentiment.train_runs, summarise_finals=True, grow=self.grow, tied_finals=self.tied_finals)


@dataclass
class Allocation:
    """The 2 x 2 at one embedding scale (``allocation``). ``runs``: one row per run, the base grid's chosen
    ℓ1.1 and GD runs (``steps`` "global") and every run of the arms' grid (``steps`` "per tensor",
    ``method`` the arm's key, ``multiple`` its multiplier of the matched steps, ``chosen`` and ``tied``),
    with ``Grid.runs``' columns and ``embedding_std``; ``configs`` / ``results``: the arms' chosen runs
    that finished, keyed (layers, arm, seed) as a grid's are; ``tied_configs`` / ``tied_results``: with
    ``tied_finals``, every seed at every tied multiple, keyed (layers, arm, multiple, seed)."""

    runs: pd.DataFrame
    configs: dict[tuple[int, str, int], sentiment.SentimentRun]
    results: dict[tuple[int, str, int], store.RunResult]
    tied_configs: dict[tuple, sentiment.SentimentRun] = field(default_factory=dict)
    tied_results: dict[tuple, store.RunResult] = field(default_factory=dict)


def _std(config: sentiment.SentimentGrid) -> float:
    return SMALL_EMBEDDING_STD if config.embedding_std is None else float(config.embedding_std)


def allocation(arms: ArmGrid, grid: sentiment.Grid | None = None, *, workers: int = 1, progress: bool = True,
               stored_only: bool = False) -> Allocation:
    """The 2 x 2 of ``arms`` (its base grid built as ``grid`` when given, else read back or trained): the
    base grid's chosen ℓ1.1 and GD runs beside the arms' grid, trained when missing; ``stored_only``:
    read them back, never train (LookupError when one is missing)."""
    base = grid or sentiment.grid(arms.base, workers=workers, progress=progress, stored_only=stored_only,
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
    runs = runs.assign(embedding_std=_std(arms.base), tied=runs.tied.fillna(runs.chosen).astype(bool))
    lead = ["embedding_std", "layers", "method", "steps"]
    return Allocation(runs[lead + [c for c in runs.columns if c not in lead]], built.configs, built.results,
                      built.tied_configs, built.tied_results)


def effective_steps(config: sentiment.SentimentRun) -> dict[str, float]:
    """The first-order effective step of each parameter group (``EncoderClassifier.parameter_groups``) of
    the run's model at initialization: the mean over the group's entries of lr_t |w|^(2-p) / (p-1), lr_t
    the step the run's optimizer gives the entry's tensor (GD: lr_t). Mirror-descent runs only."""
    if config.optimizer.name != "md":
        raise ValueError(f"effective steps are for mirror descent, got optimizer {config.optimizer.name!r}")
    p = config.optimizer.p
    model = sentiment.initial_model(config)
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


def step_table(configs: Mapping[tuple[str, str], sentiment.SentimentRun]) -> pd.DataFrame:
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


def series_grids(base: sentiment.SentimentGrid, stds: Sequence[float], epochs: int | Sequence[int],
                 multiples: Mapping[str, list[float]], seeds: int, grow: int = 0) -> list[sentiment.SentimentGrid]:
    """The embedding-scale series: ``base`` (a small-embeddings grid) at each std of ``stds`` (BERT's 0.02
    is ``base``'s own scale, its ``embedding_std`` None, so that its runs are ``base``'s where they agree),
    ℓ1.1 and GD at its first depth with ``multiples`` as candidates, growing ``grow`` times past an end,
    and ``seeds`` seeds per method, at most ``epochs`` epochs (one per std, or one number for all; no std:
    no grid, whatever ``epochs`` holds)."""
    if base.setup != "small-embeddings":
        raise ValueError(f"the series varies the small-embeddings setup's std; the base grid has setup {base.setup!r}")
    caps = [epochs] * len(stds) if isinstance(epochs, int) else list(epochs)
    if stds and len(caps) != len(stds):
        raise ValueError(f"series_epochs gives {len(caps)} epoch caps for {len(stds)} stds: give one per std "
                         "(or one number for all)")
    keys = list(estimates.COMPARED)
    return [dataclasses.replace(base, layers=list(base.layers[:1]), methods=keys, seeds=seeds,
                                multiples={k: list(multiples[k]) for k in keys}, epochs=int(cap), grow=grow,
                                tied_finals=False, embedding_std=None if std == SMALL_EMBEDDING_STD else float(std))
            for std, cap in zip(stds, caps)]


def train_chapter(grids: Sequence[sentiment.SentimentGrid], arms: Sequence[ArmGrid] = (), *, workers: int = 1,
                  progress: bool = True) -> None:
    """Train what chapter 04 reads in as few pools of ``workers`` as the choices allow (``step_grid.train``):
    every grid's sweep, grown sweeps, final runs, and each 2 x 2's arms once its base grid has chosen its
    steps. ``sentiment.grid`` and ``allocation`` then read them back."""
    designs = {identity.canonical_json(g): g.design() for g in [*grids, *(a.base for a in arms)]}

    def round_designs(failed: frozenset[str]) -> list[step_grid.Design]:
        out = list(designs.values())
        for arm in arms:
            chosen = step_grid.decided(designs[identity.canonical_json(arm.base)], failed)
            if chosen is not None:
                out.append(arm.design({cell: choice.value for cell, choice in chosen.items()}))
        return out

    step_grid.train(round_designs, sentiment.train_runs, workers=workers, progress=progress)


def long_part(variation: sentiment.SentimentGrid, *, series_stds: Sequence[float], series_epochs: int | Sequence[int],
              series_multiples: Mapping[str, list[float]], allocation_stds: Sequence[float],
              allocation_multiples: Sequence[float], grow: int, tied_finals: bool
              ) -> tuple[list[sentiment.SentimentGrid], list[ArmGrid]]:
    """Chapter 04's long part from its parameters: the series' grids at ``series_stds`` (its 0.02 point is
    ``variation`` itself, not among them) and the 2 x 2s at ``allocation_stds`` (each on the variation or
    on the series' grid of that std), which need a series trained beside them."""
    seeds = min(variation.seeds_of(k) for k in variation.methods)
    series = series_grids(variation, series_stds, series_epochs, series_multiples, seeds, grow)
    by_std = {SMALL_EMBEDDING_STD: variation} | {g.embedding_std: g for g in series}
    if allocation_stds and not series_stds:
        raise ValueError("allocation_stds trains 2 x 2s beside a series trained here: give series_stds too")
    if unknown := [std for std in allocation_stds if std not in by_std]:
        raise ValueError(f"allocation_stds {unknown} are neither the variation's 0.02 nor in series_stds {list(series_stds)}")
    return series, [ArmGrid(base=by_std[std], multiples=list(allocation_multiples), seeds=seeds, grow=grow,
                            tied_finals=tied_finals) for std in allocation_stds]


def long_tables(variation: sentiment.Grid, series: Sequence[sentiment.SentimentGrid], twos: Sequence[ArmGrid], *,
                read_committed: bool = True, workers: int = 1) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any] | None]:
    """(runs, compact predictions, record) of chapter 04's long part: built here from the stored runs of
    ``variation`` (the series' 0.02 point), the series' other grids and the 2 x 2s when ``series`` is not
    empty (record None); else as committed under ``data/`` (``committed``) when ``read_committed``; else
    none: empty tables with the columns of built ones and a record that says so (``absent``)."""
    if not series:
        if not read_committed:
            keys = ["part", "embedding_std", "method", "multiple", "seed"]
            empty = variation.runs.iloc[:0].assign(part=pd.Series(dtype=str), embedding_std=pd.Series(dtype=float))
            return (empty[keys[:2] + [c for c in empty.columns if c not in keys[:2]]],
                    pd.DataFrame(columns=[*keys, "correct"]), {"absent": True})
        return committed()
    runs, predictions = overnight_tables([variation, *(sentiment.grid(g, workers=workers) for g in series)],
                                         [allocation(a, workers=workers) for a in twos])
    return runs, predictions, None


def contrasts_table(effects: Mapping[float, Mapping[str, estimates.Estimate]]) -> pd.DataFrame:
    """The 2 x 2s' contrasts ({std: ``estimates.allocation_effects``}) as one table, a row per (std, contrast)."""
    return pd.DataFrame([{"embedding_std": std, "contrast": name, "n": e.n, "value": e.value, "low": e.low,
                          "high": e.high, "seeds_low": e.seeds_low, "seeds_high": e.seeds_high,
                          "detectable": e.detectable, "sd": e.sd}
                         for std, named in effects.items() for name, e in named.items()])


def predictions_table(configs: Mapping[tuple, sentiment.SentimentRun], results: Mapping[tuple, store.RunResult],
                      keys: Sequence[str]) -> pd.DataFrame:
    """One row per run of ``configs`` (keyed by tuples named ``keys``) with ``correct``, its per-sentence
    correctness on the test split as a string of 0 and 1 in the split's order (1,057 characters a run: a
    compact form to commit), besides the key's columns."""
    rows = []
    for key, config in configs.items():
        correct = sentiment.test_correct(config, results[key])
        rows.append(dict(zip(keys, key)) | {"correct": "".join("1" if c else "0" for c in correct)})
    return pd.DataFrame(rows, columns=[*keys, "correct"])


def overnight_tables(series: Sequence[sentiment.Grid], twos: Sequence[Allocation]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the long profile commits of chapter 04: (runs, predictions). ``runs``: every run of the series'
    grids (``part`` "series") and of the 2 x 2s' arms (``part`` "2x2"), ``Grid.runs``' columns with
    ``embedding_std`` and ``tied``; ``predictions``: per run whose test predictions an interval reads
    (every seed at the chosen steps, and at each tied step where the grid trained every seed), ``part``,
    embedding_std, method, multiple, seed and ``correct`` (``predictions_table``)."""
    frames, predicted = [], []
    keys = ["part", "embedding_std", "method", "multiple", "seed"]
    for grid in series:
        std = _std(grid.config)
        frames.append(grid.runs.assign(part="series", embedding_std=std))
        chosen = {("series", std, key, grid.chosen[L, key], seed): c for (L, key, seed), c in grid.configs.items()}
        tied = {("series", std, key, m, seed): c for (L, key, m, seed), c in grid.tied_configs.items()}
        results = {("series", std, key, grid.chosen[L, key], seed): grid.results[L, key, seed]
                   for (L, key, seed) in grid.configs} | {
            ("series", std, key, m, seed): r for (L, key, m, seed), r in grid.tied_results.items()}
        predicted.append(predictions_table(chosen | tied, results, keys))
    for two in twos:
        std = float(two.runs.embedding_std.iloc[0])
        frames.append(two.runs[two.runs.steps == "per tensor"].assign(part="2x2"))
        multiple = {key[1]: float(two.runs[(two.runs.method == key[1]) & two.runs.chosen.astype(bool)].multiple.iloc[0])
                    for key in two.configs}
        chosen = {("2x2", std, arm, multiple[arm], seed): c for (L, arm, seed), c in two.configs.items()}
        tied = {("2x2", std, arm, m, seed): c for (L, arm, m, seed), c in two.tied_configs.items()}
        results = {("2x2", std, arm, multiple[arm], seed): two.results[L, arm, seed] for (L, arm, seed) in two.configs} | {
            ("2x2", std, arm, m, seed): r for (L, arm, m, seed), r in two.tied_results.items()}
        predicted.append(predictions_table(chosen | tied, results, keys))
    runs = pd.concat(frames, ignore_index=True)
    lead = ["part", "embedding_std"]
    runs = runs[lead + [c for c in runs.columns if c not in lead]]
    return runs, pd.concat(predicted, ignore_index=True).drop_duplicates(subset=keys, ignore_index=True)


#: The long profile's chapter 04 as committed under ``data/``: its runs, their per-sentence test
#: predictions and the provenance record of the build that measured them.
COMMITTED = {"runs": "sentiment_overnight_runs.csv", "predictions": "sentiment_overnight_predictions.csv",
             "record": "sentiment_overnight.json"}


def absent(record: Mapping[str, Any] | None) -> bool:
    """Whether ``long_tables`` found no long part: none trained by this execution, none read as committed."""
    return record is not None and bool(record.get("absent"))


def same_variation(record: Mapping[str, Any] | None, variation: sentiment.SentimentGrid) -> bool:
    """Whether the long build a committed ``record`` describes (None: this execution) ran the same variation
    grid as ``variation`` (every setting but ``tied_finals``): only then are its runs at the variation's
    tied steps this variation's. A build without a long part (``absent``) ran none."""
    if record is None:
        return True
    if absent(record):
        return False
    built = sentiment.chapter_grids(**record.get("parameters", {}))[1]
    return (dataclasses.replace(built, tied_finals=False).to_dict()
            == dataclasses.replace(variation, tied_finals=False).to_dict())


def committed() -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(runs, predictions, record) of the long profile's chapter 04 as committed (``COMMITTED``)."""
    runs = pd.read_csv(paths.data_file(COMMITTED["runs"]), dtype={"method": str})
    predictions = pd.read_csv(paths.data_file(COMMITTED["predictions"]), dtype={"method": str, "correct": str})
    return runs, predictions, json.loads(paths.data_file(COMMITTED["record"]).read_text("utf-8"))


def long_predictions(table: pd.DataFrame) -> pd.DataFrame:
    """``predictions_table``'s compact rows (a string of 0 and 1 per run) as one row per run and test
    sentence: the run's columns, ``example`` (its index in the test split) and ``correct`` (0 or 1)."""
    keys = [c for c in table.columns if c != "correct"]
    frames = [pd.DataFrame({**{k: row[k] for k in keys}, "example": np.arange(len(row.correct)),
                            "correct": np.frombuffer(row.correct.encode("ascii"), dtype=np.uint8) - ord("0")})
              for _, row in table.iterrows()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*keys, "example", "correct"])


def _at(frame: pd.DataFrame, part: str, std: float) -> pd.DataFrame:
    rows = frame[(frame.part == part) & np.isclose(frame.embedding_std.astype(float), std)]
    return rows.assign(method=estimates.keyed(rows.method))


def series_points(runs: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """The series per embedding std (``overnight_tables``' runs and ``long_predictions``): the chosen
    multiples and steps of ℓ1.1 and GD and the steps tied with each choice, the ratio of their first-order
    embedding steps at the chosen steps (``embedding_ratio``), how many of the chosen runs reached the stop
    rule (``reached``: all of them), and ℓ1.1 − GD at the chosen steps over the seed pairs and test
    sentences (``estimates.crossed``: value, low, high, seeds_low, seeds_high, n, detectable)."""
    first, second = estimates.COMPARED
    columns = ["embedding_std", *(f"{c}_{k}" for c in ("multiple", "lr") for k in (first, second)), "embedding_ratio",
               f"tied_{first}", f"tied_{second}", "runs", "reached_runs", "reached", "n", "value", "low", "high",
               "seeds_low", "seeds_high", "detectable"]
    rows = []
    for std in sorted(set(runs[runs.part == "series"].embedding_std.astype(float))):
        grid = _at(runs, "series", std)
        chosen = grid[grid.chosen.astype(bool)]
        if not {first, second} <= set(chosen.method):
            continue
        multiple = {k: float(chosen[chosen.method == k].multiple.iloc[0]) for k in (first, second)}
        lr = {k: float(chosen[chosen.method == k].lr.iloc[0]) for k in (first, second)}
        tied = {k: sorted(set(grid[(grid.method == k) & grid.tied.astype(bool)].multiple)) for k in (first, second)}
        at = _at(predictions, "series", std)
        at = at[((at.method == first) & np.isclose(at.multiple, multiple[first]))
                | ((at.method == second) & np.isclose(at.multiple, multiple[second]))]
        gap = estimates.crossed(at, first, second) if len(at) else estimates.NONE
        rows.append({"embedding_std": std, f"multiple_{first}": multiple[first], f"multiple_{second}": multiple[second],
                     f"lr_{first}": lr[first], f"lr_{second}": lr[second],
                     "embedding_ratio": embedding_ratio(lr[first], lr[second], std),
                     f"tied_{first}": " ".join(f"{m:g}" for m in tied[first]),
                     f"tied_{second}": " ".join(f"{m:g}" for m in tied[second]),
                     "runs": len(chosen), "reached_runs": int(chosen.reached.astype(bool).sum()),
                     "reached": bool(chosen.reached.astype(bool).all()), "n": gap.n, "value": gap.value,
                     "low": gap.low, "high": gap.high, "seeds_low": gap.seeds_low, "seeds_high": gap.seeds_high,
                     "detectable": gap.detectable})
    return pd.DataFrame(rows, columns=columns)


def tied_at(runs: pd.DataFrame, predictions: pd.DataFrame, std: float, contrast: str, least: int = 2) -> pd.DataFrame:
    """A contrast of ``estimates.CONTRASTS`` at every combination of tied steps at embedding std ``std``
    (``estimates.tied_contrasts`` over the series' and the 2 x 2s' runs there, ``overnight_tables``' runs and
    ``long_predictions``), with ``embedding_std`` and ``contrast``; combinations trained at fewer than
    ``least`` common seeds are left out."""
    parts = ("series", "2x2")
    tied = estimates.tied_contrasts(pd.concat([_at(runs, part, std) for part in parts], ignore_index=True),
                                    pd.concat([_at(predictions, part, std) for part in parts], ignore_index=True),
                                    estimates.CONTRASTS[contrast], least)
    return tied.assign(embedding_std=std, contrast=contrast)


def two_by_two(runs: pd.DataFrame, predictions: pd.DataFrame, std: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The 2 x 2 at embedding std ``std`` from ``overnight_tables``' runs and ``long_predictions``: (its four
    arms' chosen runs: the series' ℓ1.1 and GD at their chosen steps, ``steps`` "global", and the arms',
    "per tensor"; their per-example predictions), what ``estimates.allocation_effects`` reads."""
    grid = _at(runs, "series", std)
    arms = _at(runs, "2x2", std)
    chosen = pd.concat([grid[grid.chosen.astype(bool) & grid.method.isin(estimates.COMPARED)].assign(steps="global"),
                        arms[arms.chosen.astype(bool)].assign(steps="per tensor")], ignore_index=True)
    keep = pd.concat([_at(predictions, "series", std), _at(predictions, "2x2", std)], ignore_index=True)
    at = {(k, float(m)) for k, m in zip(chosen.method, chosen.multiple)}
    keep = keep[[(k, float(m)) in at for k, m in zip(keep.method, keep.multiple)]]
    return chosen, keep
