"""How many epochs a run that ends at a stop rule takes: from the runs already known of its setting,
stored or committed (the plan's epoch basis, ``mdlib.book.plan``).

A *setting* is a run config less its seed, its epoch cap and its step size (:func:`setting`): runs of
one setting at one step differ by their seed only, and take similar numbers of epochs. The runs known:

- the results store's entries of the kind (``<build>/runs/<kind>/*/``: the config, and the history's
  epochs; an entry of another code fingerprint counts, the same config under several fingerprints
  once), read without checking their hashes (an estimate, not a result);
- the committed runs of chapter 04: ``data/sentiment_pilots.csv`` (the pilots that sized the default;
  their settings as ``data/README.md`` describes them) and ``data/sentiment_overnight_runs.csv`` (the
  long profile's series and 2 x 2s, their settings from the parameters its record
  ``sentiment_overnight.json`` holds), once it is there.

:func:`expect` gives a run's expected epochs (at most its cap) and names the basis: the same run's
where it is known (on the CPU a seed gives the same numbers); else the mean of the known runs of its
setting at its step; else the authors' measured mean where the paper's own setting is run
(``workload``); else the mean at the nearest step known of its setting (by the ratio of steps); else
the cap (an upper bound).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from mdlib.experiments import paths

__all__ = ["COMMITTED", "Expected", "Known", "committed_runs", "expect", "known_runs", "setting", "stored_runs"]

#: The committed files of known runs, and what ``stored`` calls the results store.
PILOTS, OVERNIGHT, OVERNIGHT_RECORD = "sentiment_pilots.csv", "sentiment_overnight_runs.csv", "sentiment_overnight.json"
COMMITTED = (PILOTS, OVERNIGHT)
STORE = "the results store"

#: The pilots' settings besides their ``setup``, method and step (``data/README.md``): chapter 04's
#: encoder on all Rotten Tomatoes training sentences, at most 150 epochs.
PILOT_SETTINGS = {"dataset": "rotten_tomatoes", "max_length": 64, "train_size": None, "width": 24, "layers": 3,
                  "epochs": 150}


@dataclass(frozen=True)
class Known:
    """A finished run: its ``setting`` (``setting``), step ``lr``, ``seed``, ``epochs``, whether it ``reached``
    the stop rule, and where it is known from (``source``: ``STORE`` or a committed file's name)."""

    setting: str
    lr: float
    seed: int
    epochs: int
    reached: bool
    source: str


@dataclass(frozen=True)
class Expected:
    """A run's expected ``epochs`` and its basis: ``how`` ("run": the same run's, known: on the CPU a seed
    gives the same numbers; "setting": the known runs of its setting at its step; "authors": the paper's; "nearest": its setting's at the nearest step known; "cap"; "fixed": a
    run without a stop rule), ``runs``: the known runs it averages, ``ratio``: the nearest step over the
    run's; ``bound``: only an upper bound (the cap) or, ``at_least``, a lower one (a known run stopped at
    a smaller cap)."""

    epochs: float
    how: str
    runs: tuple[Known, ...] = ()
    ratio: float | None = None
    bound: bool = False
    at_least: bool = False
    text: str = ""

    @property
    def sources(self) -> Counter:
        return Counter(run.source for run in self.runs)


def setting(kind: str, config: Mapping[str, Any]) -> str:
    """A run config (as ``to_dict()`` gives it, or a stored ``config.json``) less its seed, epoch cap and
    step size, as a canonical JSON text."""
    plain = json.loads(json.dumps(config, default=str))
    plain["fit"] = {k: v for k, v in plain.get("fit", {}).items() if k not in ("seed", "epochs")}
    plain["optimizer"] = {k: v for k, v in plain.get("optimizer", {}).items() if k != "lr"}
    return json.dumps({"kind": kind, **plain}, sort_keys=True)


def stored_runs(kind: str) -> list[Known]:
    """The finished runs of ``kind`` in the results store (``<build>/runs/<kind>/``), one per config."""
    import pandas as pd

    folder = paths.runs_dir() / kind
    found: dict[str, Known] = {}
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            config = json.loads((entry / "config.json").read_text("utf-8"))
            history = pd.read_parquet(entry / "history.parquet", columns=["train_accuracy"])
        except (OSError, ValueError, KeyError, ImportError):
            continue
        fit = config.get("fit", {})
        stop = fit.get("stop_train_accuracy")
        if "lr" not in config.get("optimizer", {}) or not len(history):
            continue
        reached = stop is not None and float(history.train_accuracy.iloc[-1]) >= stop
        key = json.dumps(config, sort_keys=True)
        found.setdefault(key, Known(setting(kind, config), float(config["optimizer"]["lr"]), int(fit.get("seed", 0)),
                                    len(history), reached, STORE))
    return list(found.values())


def _config(key: str, lr: float, seed: int, *, dataset: str, max_length: int, train_size: int | None, width: int,
            layers: int, setup: str, epochs: int, embedding_std: float | None = None) -> dict[str, Any]:
    """The config (``to_dict()``) of a chapter 04 run of method or arm ``key`` ("1.1", "1.1@2") at ``lr``."""
    from mdlib.experiments import methods, sentiment
    from mdlib.models import SMALL_EMBEDDING_STD

    trained, _, matched = str(key).partition("@")
    name, p = methods.method(trained)
    matched_p = methods.method(matched)[1] if matched else None
    std = None if embedding_std is None or math.isclose(embedding_std, SMALL_EMBEDDING_STD) else float(embedding_std)
    return sentiment.run_config(layers=layers, optimizer=name, lr=lr, p=p, seed=seed, dataset=dataset,
                                max_length=max_length, train_size=train_size, width=width, setup=setup,
                                epochs=epochs, embedding_std=std, matched_p=matched_p).to_dict()


def _data_file(name: str):
    """``data/<name>`` where it is (a checkout, or the installed package's copy), else None."""
    try:
        path = paths.data_file(name)
    except FileNotFoundError:
        return None
    return path if path.is_file() else None


def _pilots() -> list[Known]:
    import pandas as pd

    from mdlib.experiments import sentiment

    path = _data_file(PILOTS)
    if path is None:
        return []
    out = []
    for row in pd.read_csv(path, dtype={"method": str}).itertuples():
        trained, _, matched = row.method.partition("@")
        lr = float(row.multiple) * sentiment.reference_step(PILOT_SETTINGS["layers"], matched or trained)
        config = _config(row.method, lr, int(row.seed), setup=row.setup, **PILOT_SETTINGS)
        out.append(Known(setting("e4-sentiment", config), lr, int(row.seed), int(row.epochs), bool(row.reached), PILOTS))
    return out


def _overnight() -> list[Known]:
    import pandas as pd

    runs, record = _data_file(OVERNIGHT), _data_file(OVERNIGHT_RECORD)
    if runs is None or record is None:
        return []
    p = json.loads(record.read_text("utf-8")).get("parameters", {})
    settings = dict(dataset=p.get("dataset", "rotten_tomatoes"), max_length=p.get("max_length", 64),
                    train_size=p.get("train_size"), width=p.get("width", 24), layers=(p.get("layers") or [3])[0],
                    setup=p.get("variation_setup", "small-embeddings"), epochs=int(p.get("variation_epochs", 100)))
    out = []
    for row in pd.read_csv(runs, dtype={"method": str}).to_dict("records"):
        lr, epochs = row.get("lr"), row.get("epochs")
        if lr is None or not math.isfinite(float(lr)) or epochs is None or not math.isfinite(float(epochs)):
            continue  # a run that diverged has no epochs to the stop rule
        config = _config(row["method"], float(lr), int(row["seed"]), embedding_std=float(row["embedding_std"]), **settings)
        out.append(Known(setting("e4-sentiment", config), float(lr), int(row["seed"]), int(row["epochs"]),
                         bool(row["reached"]), OVERNIGHT))
    return out


def committed_runs() -> list[Known]:
    """Chapter 04's committed runs (``COMMITTED``) that are there."""
    return _pilots() + _overnight()


def known_runs(kinds: Iterable[str] = ("e4-sentiment",)) -> list[Known]:
    """The stored runs of ``kinds`` and the committed ones."""
    return [run for kind in kinds for run in stored_runs(kind)] + committed_runs()


@dataclass
class Index:
    """Known runs by setting."""

    runs: Sequence[Known]
    by_setting: dict[str, list[Known]] = field(default_factory=dict)

    def __post_init__(self):
        for run in self.runs:
            self.by_setting.setdefault(run.setting, []).append(run)


def _mean(runs: Sequence[Known], cap: int, how: str, ratio: float | None = None) -> Expected:
    epochs = sum(min(run.epochs, cap) for run in runs) / len(runs)
    at_least = any(not run.reached and run.epochs < cap for run in runs)
    return Expected(epochs, how, tuple(runs), ratio, False, at_least)


def expect(kind: str, config: Any, known: Index | Sequence[Known], authors: tuple[float, str] | None = None
           ) -> Expected:
    """The expected epochs of a run (``config``, capped at its ``fit.epochs``) from the ``known`` runs (the
    module's docstring); ``authors``: (epochs, source) where the paper measured its setting."""
    index = known if isinstance(known, Index) else Index(list(known))
    cap, lr = int(config.fit.epochs), float(config.optimizer.lr)
    same = index.by_setting.get(setting(kind, config.to_dict()), [])
    at = [run for run in same if math.isclose(run.lr, lr, rel_tol=1e-6)]
    itself = [run for run in at if run.seed == config.fit.seed]
    if itself:
        return _mean(itself, cap, "run")
    if at:
        return _mean(at, cap, "setting")
    if authors is not None:
        return Expected(min(authors[0], cap), "authors", text=authors[1])
    if same:
        distance = {run.lr: abs(math.log(run.lr / lr)) for run in same if run.lr > 0}
        if distance:
            nearest = min(distance.values())
            runs = [run for run in same if run.lr > 0 and math.isclose(distance[run.lr], nearest, abs_tol=1e-9)]
            return _mean(runs, cap, "nearest", max(run.lr for run in runs) / lr)
    return Expected(float(cap), "cap", bound=True)


def describe(expected: Sequence[Expected], weights: Sequence[float] | None = None) -> str:
    """The epoch basis of a row's runs in words: how many runs each basis gives (``weights``: each
    expectation's share of a run, a run that may take several configs counting once), and the known runs
    it used."""
    if not expected:
        return ""
    weights = [1.0] * len(expected) if weights is None else list(weights)
    total = sum(weights)
    parts = []
    for how, words in (("run", "the same runs' epochs, known"),
                       ("setting", "the mean of the known runs of their setting at their step"),
                       ("nearest", "the mean at the nearest step known of their setting"),
                       ("authors", None), ("cap", "the epoch cap (no run of their setting known)"),
                       ("fixed", "a fixed number of epochs")):
        these = [(e, w) for e, w in zip(expected, weights) if e.how == how]
        if not these:
            continue
        if how == "authors":
            words = these[0][0].text
        share = sum(w for _, w in these)
        runs = {run for e, _ in these for run in e.runs}
        used = Counter(run.source for run in runs)
        text = words if math.isclose(share, total) else f"{share:.0f} runs {words}"
        if used:
            text += " (" + ", ".join(f"{n} {'stored' if source == STORE else 'in ' + source}"
                                     for source, n in sorted(used.items())) + ")"
        ratios = sorted({e.ratio for e, _ in these if e.ratio is not None})
        if ratios:
            text += ", at " + ", ".join(f"{r:.3g}x" for r in ratios) + " their step"
        if any(e.at_least for e, _ in these):
            text += "; some stopped at a smaller cap: at least"
        parts.append(text)
    return "epochs: " + "; ".join(parts)
