"""What chapter 04 trains and reads: ``train_chapter`` trains its grids and 2 x 2s in as few pools as the
choices allow, and its long part (the embedding-scale series and the 2 x 2s at two scales) is built here
(``long_part``, ``long_tables``) or read as committed.

The long profile (``overnight``) trains the series and the 2 x 2s; ``overnight_tables`` gathers their runs
and per-sentence predictions, which the default chapter reads as committed under ``data/``
(``committed``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from mdlib.experiments import estimates, paths, step_grid
from mdlib.experiments.sentiment import grids
from mdlib.experiments.sentiment.allocation import Allocation, ArmGrid, allocation, embedding_ratio, embedding_std
from mdlib.experiments.sentiment.run import SentimentRun
from mdlib.models import SMALL_EMBEDDING_STD
from mdlib.runs import identity, store

__all__ = ["COMMITTED", "absent", "committed", "long_part", "long_predictions", "long_tables", "overnight_tables",
           "predictions_table", "same_variation", "series_grids", "series_points", "tied_at", "train_chapter",
           "two_by_two"]

def series_grids(base: grids.SentimentGrid, stds: Sequence[float], epochs: int | Sequence[int],
                 multiples: Mapping[str, list[float]], seeds: int, grow: int = 0) -> list[grids.SentimentGrid]:
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


def train_chapter(configs: Sequence[grids.SentimentGrid], arms: Sequence[ArmGrid] = (), *, workers: int = 1,
                  progress: bool = True) -> None:
    """Train what chapter 04 reads in as few pools of ``workers`` as the choices allow (``step_grid.train``):
    every grid's sweep, grown sweeps, final runs, and each 2 x 2's arms once its base grid has chosen its
    steps. ``grids.grid`` and ``allocation`` then read them back."""
    designs = {identity.canonical_json(g): g.design() for g in [*configs, *(a.base for a in arms)]}

    def round_designs(failed: frozenset[str]) -> list[step_grid.Design]:
        out = list(designs.values())
        for arm in arms:
            chosen = step_grid.decided(designs[identity.canonical_json(arm.base)], failed)
            if chosen is not None:
                out.append(arm.design({cell: choice.value for cell, choice in chosen.items()}))
        return out

    step_grid.train(round_designs, grids.train_runs, workers=workers, progress=progress)


def long_part(variation: grids.SentimentGrid, *, series_stds: Sequence[float], series_epochs: int | Sequence[int],
              series_multiples: Mapping[str, list[float]], allocation_stds: Sequence[float],
              allocation_multiples: Sequence[float], grow: int, tied_finals: bool
              ) -> tuple[list[grids.SentimentGrid], list[ArmGrid]]:
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


def long_tables(variation: grids.Grid, series: Sequence[grids.SentimentGrid], twos: Sequence[ArmGrid], *,
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
    runs, predictions = overnight_tables([variation, *(grids.grid(g, workers=workers) for g in series)],
                                         [allocation(a, workers=workers) for a in twos])
    return runs, predictions, None


def predictions_table(configs: Mapping[tuple, SentimentRun], results: Mapping[tuple, store.RunResult],
                      keys: Sequence[str]) -> pd.DataFrame:
    """One row per run of ``configs`` (keyed by tuples named ``keys``) with ``correct``, its per-sentence
    correctness on the test split as a string of 0 and 1 in the split's order (1,057 characters a run: a
    compact form to commit), besides the key's columns."""
    rows = []
    for key, config in configs.items():
        correct = grids.test_correct(config, results[key])
        rows.append(dict(zip(keys, key)) | {"correct": "".join("1" if c else "0" for c in correct)})
    return pd.DataFrame(rows, columns=[*keys, "correct"])


def overnight_tables(series: Sequence[grids.Grid], twos: Sequence[Allocation]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the long profile commits of chapter 04: (runs, predictions). ``runs``: every run of the series'
    grids (``part`` "series") and of the 2 x 2s' arms (``part`` "2x2"), ``Grid.runs``' columns with
    ``embedding_std`` and ``tied``; ``predictions``: per run whose test predictions an interval reads
    (every seed at the chosen steps, and at each tied step where the grid trained every seed), ``part``,
    embedding_std, method, multiple, seed and ``correct`` (``predictions_table``)."""
    frames, predicted = [], []
    keys = ["part", "embedding_std", "method", "multiple", "seed"]
    for grid in series:
        std = embedding_std(grid.config)
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


def same_variation(record: Mapping[str, Any] | None, variation: grids.SentimentGrid) -> bool:
    """Whether the long build a committed ``record`` describes (None: this execution) ran the same variation
    grid as ``variation`` (every setting but ``tied_finals``): only then are its runs at the variation's
    tied steps this variation's. A build without a long part (``absent``) ran none."""
    if record is None:
        return True
    if absent(record):
        return False
    built = grids.chapter_grids(**record.get("parameters", {}))[1]
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
