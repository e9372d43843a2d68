"""Table 1's gap taken apart: the l_p geometry of a step against how large a step each tensor gets.

Under mirror descent one global step size is a different effective step per tensor: to first order an
entry w moves by lr |g| |w|^(2-p) / (p-1) (``mirror.matched_lr``), so at p = 1.1 a tensor's step is
lr |w|^0.9 / 0.1 where GD's is lr everywhere, and a change of a tensor's scale (the embeddings' std)
changes exactly what separates the two methods. Three measurements separate the factors (chapter 04):

- ``effective_steps``: the first-order effective step of every parameter group of a run's model at
  initialization, the mean over the group's entries of lr_t |w|^(2-p) / (p-1), from the optimizer the
  run builds (lr_t: its tensor's step);
- the 2 x 2 {ℓ1.1, GD} x {one global step, steps per tensor} (``allocation``): besides the two global
  runs of a grid, ℓ1.1 with each tensor's step matched to GD's chosen step (arm ``"1.1@2"``: ℓ1.1's
  geometry, GD's allocation) and GD with each tensor's step matched to ℓ1.1's chosen step (``"2@1.1"``:
  GD's geometry, ℓ1.1's allocation), at the grid's seeds, with no step choice of their own;
  ``estimates.allocation_effects`` reads the geometry effect (1.1@2 − 2) and the allocation effect
  (2@1.1 − 2) beside the gap (1.1 − 2), seed by seed;
- the embedding-scale series (``series``): the grid at several embedding stds, each scale with its own
  steps chosen on validation, with ``equal_step_std``, the scale at which the two methods' embedding
  steps are equal to first order.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from mdlib.experiments import step_grid
from mdlib.experiments import estimates, methods, paths, sentiment, store
from mdlib.experiments.train import Optimizer
from mdlib.models import SMALL_EMBEDDING_STD

__all__ = ["ARMS", "Allocation", "SERIES_FILE", "SERIES_RECORD", "allocation", "arm_config",
           "committed_series", "effective_steps", "equal_step_std", "runs_view", "series", "series_gaps", "series_grids", "series_reading",
           "multiples_text", "series_text", "source_text", "step_table", "steps_view", "train_chapter"]

#: The arms of the 2 x 2 besides the grid's global runs: key -> (the method trained, the method whose
#: chosen global step each tensor's step is matched to).
ARMS = {methods.arm_key(trained, matched): (trained, matched)
        for trained, matched in ((methods.L1_1, methods.GD), (methods.GD, methods.L1_1))}


def arm_config(config: sentiment.SentimentGrid, chosen: Mapping[tuple[int, str], float], arm: str, seed: int,
               layers: int | None = None) -> sentiment.SentimentRun:
    """The run config of ``arm`` (``ARMS``) at ``seed`` in a grid (``config``, whose ``chosen`` multiples are
    {(layers, method): multiple}): the trained method's run (its model, data and seed) with each tensor's
    step matched, at its initial mean |w|, to the step chosen for the matched method
    (``grid.Optimizer.matched_p``). ``layers``: the grid's first depth when None."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    L = config.layers[0] if layers is None else layers
    trained, matched = ARMS[arm]
    base = config.run((L, trained), chosen[L, trained], seed)
    reference = config.run((L, matched), chosen[L, matched], seed).optimizer
    name, p = methods.method(trained)
    if name != "md" or reference.p is None:
        raise ValueError(f"arm {arm!r}: both methods must be l_p mirror descent")
    return dataclasses.replace(base, optimizer=Optimizer("md", reference.lr, p, reference.p))


@dataclass
class Allocation:
    """The 2 x 2 (``allocation``). ``runs``: one row per run, the grid's chosen ℓ1.1 and GD runs
    (``steps`` "global") and the arms' (``steps`` "per tensor", ``method`` the arm's key, ``multiple``
    and ``lr`` those of the matched method's chosen step), with ``Grid.runs``' columns; ``configs`` /
    ``results``: the arms' runs that finished, keyed (layers, arm, seed) as a grid's are."""

    runs: pd.DataFrame
    configs: dict[tuple[int, str, int], sentiment.SentimentRun]
    results: dict[tuple[int, str, int], store.RunResult]


def allocation(grid: sentiment.Grid, seeds: int, *, workers: int = 1, progress: bool = True,
               stored_only: bool = False) -> Allocation:
    """The 2 x 2 of ``grid``'s first depth: its chosen ℓ1.1 and GD runs and the two arms (``ARMS``) at
    seeds 0..``seeds``-1, trained when missing (a diverged arm run: a row with ``diverged``);
    ``stored_only``: read them back, never train (LookupError when one is missing)."""
    L = grid.config.layers[0]
    missing = [k for k in estimates.COMPARED if (L, k) not in grid.chosen]
    if missing:
        raise ValueError(f"the grid has no chosen {missing} runs at {L} layers: the 2 x 2 needs ℓ1.1 and GD")
    items = [(arm, seed) for arm in ARMS for seed in range(seeds)]
    configs = [arm_config(grid.config, grid.chosen, arm, seed, L) for arm, seed in items]
    if stored_only:
        results = [store.load(sentiment.KIND, c) for c in configs]
        if any(r is None for r in results):
            raise LookupError(f"{sum(r is None for r in results)} runs of the 2 x 2 are not in the results store: "
                              "build chapter 04 at this profile")
    else:
        results = sentiment.train_runs(configs, workers, progress, skip=step_grid.DIVERGED)
    rows = [sentiment.run_row((L, arm), grid.chosen[L, ARMS[arm][1]], seed, c, r) | {"steps": "per tensor",
                                                                                      "chosen": True}
            for (arm, seed), c, r in zip(items, configs, results)]
    chosen = grid.runs[grid.runs.chosen.astype(bool) & (grid.runs.layers == L)
                       & grid.runs.method.isin(estimates.COMPARED)]
    runs = pd.concat([chosen.assign(steps="global"), pd.DataFrame(rows)], ignore_index=True)
    lead = ["layers", "method", "steps"]
    kept = {(L, *item): (c, r) for item, c, r in zip(items, configs, results) if r is not None}
    return Allocation(runs[lead + [c for c in runs.columns if c not in lead]],
                      {k: c for k, (c, _) in kept.items()}, {k: r for k, (_, r) in kept.items()})


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


def steps_view(table: pd.DataFrame) -> pd.DataFrame:
    """``step_table`` as the book shows it: one row per (setup, method or arm), one column per parameter
    group, each cell the effective step and, in brackets, its ratio to GD's in the same setup."""
    cells = table.assign(cell=[f"{step:.2g} ({ratio:.2g}×)" if ratio == ratio else f"{step:.2g}"
                               for step, ratio in zip(table.effective_step, table.vs_gd)])
    wide = cells.pivot_table(index=["setup", "method"], columns="group", values="cell", aggfunc="first", sort=False)
    wide = wide[list(dict.fromkeys(table.group))].reset_index()
    lrs = table.groupby(["setup", "method"], sort=False).lr.first()
    return pd.concat([pd.DataFrame({"setup": wide.setup, "method": [methods.arm_text(k) for k in wide.method],
                                    "lr": [f"{lrs[s, k]:.2g}" for s, k in zip(wide.setup, wide.method)]}),
                      wide.drop(columns=["setup", "method"])], axis=1)


def runs_view(runs: pd.DataFrame) -> pd.DataFrame:
    """The 2 x 2 (``Allocation.runs``) as the book shows it: one row per method or arm, with its steps,
    the test accuracy at the stop rule and the best over epochs (mean ± sd over seeds, %), the epochs
    (mean, and how many runs reached the stop rule) and the validation accuracy."""
    def shown(x: pd.Series) -> str:
        return f"{100 * x.mean():.2f}" + (f" ± {100 * x.std():.2f}" if len(x) > 1 else "")

    rows = []
    for (key, steps), part in runs.groupby(["method", "steps"], sort=False):
        matched = f"per tensor, matched to {methods.arm_text(ARMS[key][1])}'s {part.lr.iloc[0]:.2g}" if key in ARMS else ""
        rows.append({"method": methods.arm_text(key), "steps": matched or f"one global step, {part.lr.iloc[0]:.2g}",
                     "test acc. at the stop (%)": shown(part.last_test.dropna()),
                     "best over epochs (%)": shown(part.best_test.dropna()),
                     "epochs (reached / runs)": f"{part.epochs.mean():.0f} ({int(part.reached.sum())}/{len(part)})",
                     "validation acc. (%)": shown(part.validation.dropna())})
    return pd.DataFrame(rows)


def equal_step_std(lr_md: float, lr_gd: float, p: float = 1.1) -> float:
    """The embedding std sigma at which ℓ_p mirror descent at ``lr_md`` and GD at ``lr_gd`` give N(0, sigma^2)
    entries the same mean first-order step: lr_md E|w|^(2-p) / (p-1) = lr_gd, with E|w|^a = sigma^a
    2^(a/2) Gamma((a+1)/2) / sqrt(pi) for a Gaussian (a = 2 - p)."""
    a = 2.0 - p
    moment = 2 ** (a / 2) * math.gamma((a + 1) / 2) / math.sqrt(math.pi)  # E|z|^a, z ~ N(0, 1)
    return (lr_gd * (p - 1.0) / (lr_md * moment)) ** (1.0 / a)


def train_chapter(grids: Sequence[sentiment.SentimentGrid], variation: sentiment.SentimentGrid | None, seeds: int, *,
                  workers: int = 1, progress: bool = True) -> None:
    """Train what chapter 04 reads in two pools of ``workers``, so that no worker waits for one grid while
    another has runs left: every grid's sweep, then every grid's remaining final runs with the 2 x 2's
    arms at ``seeds`` seeds (``allocation``) of ``variation`` (one of ``grids``; None: no arms), whose
    steps follow the sweep's choices. ``sentiment.grid`` and ``allocation`` then read them back."""
    sentiment.train_grids(list(grids), workers=workers, progress=progress)
    finals, seen = [], set()
    for config in grids:
        design = config.design()
        _, choices = step_grid.sweep(design, workers=workers, progress=False)  # stored: trains nothing
        chosen = {cell: choice.value for cell, choice in choices.items()}
        runs = [design.final_config(*item) for item in design.final_items(choices)]
        if config is variation:
            runs += [arm_config(config, chosen, arm, seed) for arm in ARMS for seed in range(seeds)]
        for run in runs:
            if (key := store.canonical_json(run)) not in seen:
                seen.add(key)
                finals.append(run)
    sentiment.train_runs(finals, workers, progress, skip=step_grid.DIVERGED)


def series_grids(base: sentiment.SentimentGrid, stds: Sequence[float], epochs: int | Sequence[int],
                 multiples: Mapping[str, list[float]], seeds: int) -> list[sentiment.SentimentGrid]:
    """The embedding-scale series: ``base`` (a small-embeddings grid) at each std of ``stds`` (BERT's 0.02
    is ``base``'s own scale, its ``embedding_std`` None, so that its runs are ``base``'s where they agree),
    ℓ1.1 and GD at its first depth with ``multiples`` as candidates and ``seeds`` seeds per method, at most
    ``epochs`` epochs (one per std, or one number for all; no std: no grid, whatever ``epochs`` holds)."""
    if base.setup != "small-embeddings":
        raise ValueError(f"the series varies the small-embeddings setup's std; the base grid has setup {base.setup!r}")
    caps = [epochs] * len(stds) if isinstance(epochs, int) else list(epochs)
    if stds and len(caps) != len(stds):
        raise ValueError(f"series_epochs gives {len(caps)} epoch caps for {len(stds)} stds: give one per std "
                         "(or one number for all)")
    keys = list(estimates.COMPARED)
    return [dataclasses.replace(base, layers=list(base.layers[:1]), methods=keys, seeds=seeds,
                                multiples={k: list(multiples[k]) for k in keys}, epochs=int(cap),
                                embedding_std=None if std == SMALL_EMBEDDING_STD else float(std))
            for std, cap in zip(stds, caps)]


def series(grids: Sequence[sentiment.SentimentGrid], *, workers: int = 1, progress: bool = True) -> pd.DataFrame:
    """The runs of the series' grids (``series_grids``) in one table, ``Grid.runs``' columns led by
    ``embedding_std``; every grid's sweep trains in one pool."""
    sentiment.train_grids(list(grids), workers=workers, progress=progress)
    frames = [sentiment.grid(g, workers=workers, progress=progress).runs.assign(
        embedding_std=SMALL_EMBEDDING_STD if g.embedding_std is None else g.embedding_std) for g in grids]
    runs = pd.concat(frames, ignore_index=True)
    return runs[["embedding_std"] + [c for c in runs.columns if c != "embedding_std"]]


#: The committed series (``python -m mdlib run 04 --profile overnight``'s ``fig-sentiment-scale-series``):
#: its per-run CSV and the provenance record of the build that wrote it, in ``data/``.
SERIES_FILE, SERIES_RECORD = "embedding_scale_series.csv", "embedding_scale_series.json"


def committed_series() -> tuple[pd.DataFrame, dict[str, Any]]:
    """The series' runs as committed under ``data/`` (``SERIES_FILE``, measured once by the overnight
    profile) and the provenance record of the build that measured them (commit, command, machine)."""
    table = pd.read_csv(paths.data_file(SERIES_FILE), dtype={"method": str})
    return table, json.loads(paths.data_file(SERIES_RECORD).read_text("utf-8"))


def series_gaps(runs: pd.DataFrame) -> pd.DataFrame:
    """ℓ1.1 minus GD per embedding std and seed, in points of test accuracy at the stop rule (or the cap),
    over the chosen runs of a series table (``series``): embedding_std, seed, gap, reached (both runs
    reached the stop rule) and the chosen multiples of the two methods."""
    chosen = runs[runs.chosen.astype(bool)].assign(method=lambda t: t.method.map(estimates.key_of))
    wide = chosen.pivot_table(index=["embedding_std", "seed"], columns="method",
                              values=["last_test", "reached", "multiple"], aggfunc="first")
    first, second = estimates.COMPARED
    return pd.DataFrame({"gap": 100 * (wide["last_test", first] - wide["last_test", second]),
                         "reached": wide["reached", first].astype(bool) & wide["reached", second].astype(bool),
                         f"multiple_{first}": wide["multiple", first], f"multiple_{second}": wide["multiple", second]}
                        ).dropna(subset=["gap"]).reset_index()


def multiples_text(runs: pd.DataFrame) -> str:
    """The candidate multiples of a series table per method: "ℓ1.1 0.3× and 1×; GD 1× and 3×"."""
    keyed = runs.assign(method=runs.method.map(estimates.key_of))
    return "; ".join(f"{methods.arm_text(key).replace('ℓ2 (GD)', 'GD')} "
                     + " and ".join(f"{m:g}×" for m in sorted(set(part.multiple)))
                     for key, part in keyed.groupby("method", sort=False))


def series_text(gaps: pd.DataFrame) -> str:
    """``series_gaps`` per std in words: "σ 0.02: −2.71 (ℓ1.1 1×, GD 1×; 2 pairs, at the stop rule); ..."."""
    first, second = estimates.COMPARED
    parts = []
    for std, part in gaps.groupby("embedding_std"):
        reached = "at the stop rule" if part.reached.all() else f"{int((~part.reached).sum())} pair(s) at the epoch cap"
        parts.append(f"σ {std:g}: {estimates.number_text(part.gap.mean())} (ℓ1.1 {part[f'multiple_{first}'].iloc[0]:g}×, "
                     f"GD {part[f'multiple_{second}'].iloc[0]:g}×; {len(part)} pairs, {reached})")
    return "; ".join(parts) or "no pairs"


def series_reading(gaps: pd.DataFrame) -> str:
    """What the series says about the sign of the gap, in words that follow its numbers: the trend of
    ℓ1.1 − GD against log10 of the embedding std over the pairs at the stop rule
    (``estimates.scale_trend``), and the stds at which the mean gap is negative and positive there."""
    trend = estimates.scale_trend(gaps)
    if trend.low != trend.low:
        return f"the series has too few pairs at the stop rule for a trend ({trend.n})"
    means = gaps[gaps.reached.astype(bool)].groupby("embedding_std").gap.mean()
    signs = [f"{'negative' if negative else 'positive'} at σ " + " and ".join(f"{std:g}" for std in stds)
             for negative, stds in ((True, means.index[means < 0]), (False, means.index[means >= 0])) if len(stds)]
    capped = sorted(set(gaps.embedding_std) - set(means.index))
    slope = f"{trend.text()} points per tenfold std over {trend.n} seed pairs at the stop rule"
    moves = trend.low > 0 or trend.high < 0
    return ((f"the gap {'rises' if trend.low > 0 else 'falls'} with the embedding scale ({slope})" if moves else
             f"the series cannot tell a trend of the gap with the embedding scale from none ({slope})")
            + f"; its mean is {' and '.join(signs)}"
            + (f" (at σ {' and '.join(f'{std:g}' for std in capped)} the runs stopped at the epoch cap, out of the "
               "regime)" if capped else "")
            + ("; so the sign of ℓ1.1 − GD in this model moves with the scale its embeddings are drawn at"
               if moves else ""))


def source_text(record: Mapping[str, Any] | None, profile: str) -> str:
    """Where the series a page shows comes from: trained by this execution (``record`` None), or measured
    once by the build a committed record describes (its command, commit, time and CPU)."""
    if record is None:
        return f"here it was trained by this execution (profile {profile}), from its own runs"
    commit = (record.get("git") or {}).get("commit") or "an unknown commit"
    machine = (record.get("hardware") or {}).get("cpu") or "an unrecorded CPU"
    values = record.get("parameters") or {}
    layers = values.get("layers")
    layers = " / ".join(map(str, layers)) if isinstance(layers, list) else layers
    return (f"this page plots its runs as measured once by `{record.get('command')}` at commit {commit[:12]} "
            f"({str(record.get('time', ''))[:10]}, {machine}; {values.get('dataset')}, width {values.get('width')}, "
            f"{layers} layers), committed as `data/{SERIES_FILE}` with that build's record "
            f"(`data/{SERIES_RECORD}`); the overnight profile recomputes it from its own runs")
