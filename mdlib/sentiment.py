"""The sentiment experiments (E4-E6): tokenized data, and one training run per config.

A run config (a plain dict, hashed by the results store) names everything that changes the numbers::

    {"dataset": "rotten_tomatoes", "split_seed": 0, "max_length": 64, "train_size": 1000,
     "model": {"width": 48, "layers": 3, "heads": 3, "mlp": 192, "dropout": 0.2, "setup": "authors"},
     "optimizer": {"name": "md", "lr": 8e-4, "p": 1.1},
     "evaluate_on": "test",                      # or "validation" (step-size sweeps)
     "fit": {"epochs": 600, "batch_size": 100, "seed": 0, "loss": "binary", "reduction": "sum",
             "stop_train_accuracy": 0.995}}

``fit.seed`` seeds the initialization as well as the data order and dropout, so seeds are distinct
initializations (the authors' code reused one). ``train_size`` trains on a seeded, stratified subset
of the training split (the same sentences for every method and seed; None: all of it). The loss is
the batch's summed binary cross-entropy, as in the authors' code (their step sizes assume the sum). ``train_run(config)`` trains it (or reads it back from
the store) and keeps the final weights; ``trained_model(result, config)`` rebuilds the model.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.utils.data import Dataset

from mdlib import analysis, data, paths, runs, train
from mdlib.models import EncoderClassifier, check_setup

__all__ = ["KIND", "PAPER_STEP_SIZES", "PAPER_TABLE_1", "TokenizedDataset", "attention_scores", "build",
           "collate", "config", "deletion_drops", "designated_positions", "encode", "grid",
           "lexicon_pivots", "method", "method_key", "pad", "pivotal_sentences", "splits", "sweep",
           "table_models", "table_step_sizes", "tokens", "train_run", "train_runs", "trained_model"]

KIND = "e4-sentiment"
#: Bumped when a change of this module changes the numbers of a run with the same config.
VERSION = 2
#: The paper's Table 1 (IMDb, best test accuracy %, mean of the authors' runs): layers -> method -> value.
PAPER_TABLE_1 = {3: {"1.1": 83.47, "2": 81.66, "3": 82.57}, 4: {"1.1": 83.36, "2": 81.05, "3": 82.40},
                 6: {"1.1": 83.65, "2": 82.23, "3": 81.98}}
#: The paper's step sizes for IMDb (PAPER.md, E4): layers -> method key -> lr.
PAPER_STEP_SIZES = {3: {"1.1": 8e-4, "2": 4e-4, "3": 4e-6}, 4: {"1.1": 6e-4, "2": 4e-4, "3": 6e-6},
                    6: {"1.1": 1e-3, "2": 1e-3, "3": 1e-5}}


class TokenizedDataset(Dataset):
    """(token ids, label) pairs, ids unpadded ([CLS] ... [SEP], truncated to the tokenizer's length)."""

    def __init__(self, ids: list[list[int]], labels, texts: list[str] | None = None):
        if len(ids) != len(labels):
            raise ValueError(f"{len(ids)} token sequences but {len(labels)} labels")
        self.ids = [torch.tensor(x, dtype=torch.long) for x in ids]
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.texts = texts

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.ids[index], self.labels[index]


def collate(batch: list[tuple[Tensor, Tensor]], pad_id: int = 0) -> tuple[dict[str, Tensor], Tensor]:
    """Pad a list of (ids, label) to the batch's longest sequence: ({input_ids, attention_mask}, labels)."""
    ids, labels = zip(*batch)
    input_ids = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=pad_id)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(x) for x in ids], batch_first=True)
    return {"input_ids": input_ids, "attention_mask": mask}, torch.stack(labels).float()


@functools.lru_cache(maxsize=4)
def _tokenizer(max_length: int, hub: bool):
    tokenizer = data.wordpiece_tokenizer(max_length, hub=hub)
    tokenizer.no_padding()
    return tokenizer


def encode(texts: list[str], max_length: int, hub: bool = False) -> list[list[int]]:
    """WordPiece ids of each text ([CLS] first, [SEP] last, at most ``max_length``), unpadded."""
    return [e.ids for e in _tokenizer(max_length, hub).encode_batch(list(texts))]


@functools.lru_cache(maxsize=2)
def splits(dataset: str = "rotten_tomatoes", split_seed: int = 0, max_length: int = 64) -> dict[str, TokenizedDataset]:
    """The train / validation / test splits of a sentiment source, tokenized (cached per process)."""
    source = data.sentiment_dataset(dataset, seed=split_seed)
    hub = dataset != "rotten_tomatoes"  # IMDb needs the internet anyway: take the hub's tokenizer
    return {name: TokenizedDataset(encode(part["text"], max_length, hub), part["label"], list(part["text"]))
            for name, part in source.items()}


def config(*, layers: int, optimizer: str, lr: float, p: float | None = None, seed: int = 0,
           dataset: str = "rotten_tomatoes", max_length: int = 64, train_size: int | None = None,
           width: int = 48, mlp: int | None = None, dropout: float = 0.2, setup: str = "authors",
           epochs: int = 600, batch_size: int = 100, stop_train_accuracy: float = 0.995,
           evaluate_on: str = "test", split_seed: int = 0) -> dict[str, Any]:
    """A run config (see the module docstring); heads = layers as in the paper, MLP 4 x width."""
    check_setup(setup)
    if train_size is not None and (not isinstance(train_size, int) or train_size < batch_size):
        raise ValueError(f"train_size must be None (the whole training split) or an integer >= the batch "
                         f"size {batch_size}, got {train_size!r}")
    if evaluate_on not in ("test", "validation"):
        raise ValueError(f"evaluate_on must be 'test' or 'validation', got {evaluate_on!r}")
    if width % layers:
        raise ValueError(f"width {width} is not divisible by {layers} heads (heads = layers)")
    return {"kind_version": VERSION, "dataset": dataset, "split_seed": split_seed, "max_length": max_length,
            "train_size": train_size,
            "model": {"width": width, "layers": layers, "heads": layers, "mlp": mlp or 4 * width,
                      "dropout": dropout, "setup": setup},
            "optimizer": {"name": optimizer, "lr": float(lr), "p": None if p is None else float(p)},
            "evaluate_on": evaluate_on,
            "fit": {"epochs": epochs, "batch_size": batch_size, "seed": seed, "loss": "binary", "reduction": "sum",
                    "stop_train_accuracy": stop_train_accuracy}}


def initial_model(config: Mapping[str, Any]) -> EncoderClassifier:
    """The run's model as initialized (seeded by ``fit.seed``), before any training step."""
    torch.manual_seed(config["fit"]["seed"])
    return EncoderClassifier(max_length=config["max_length"], **config["model"])


def training_subset(dataset: TokenizedDataset, train_size: int | None, seed: int) -> TokenizedDataset:
    """A seeded, label-stratified subset of ``train_size`` examples (all of them when None)."""
    if train_size is None or train_size >= len(dataset):
        return dataset
    share = train_size / len(dataset)
    keep = data.stratified_split(dataset.labels.numpy(), {"train": share, "unused": 1 - share}, seed)["train"]
    return TokenizedDataset([dataset.ids[i].tolist() for i in keep], dataset.labels[keep],
                            None if dataset.texts is None else [dataset.texts[i] for i in keep])


def build(config: Mapping[str, Any]) -> train.Setup:
    """The Setup of a run: the seeded model, its optimizer, train split and the evaluation split."""
    parts = splits(config["dataset"], config["split_seed"], config["max_length"])
    train_set = training_subset(parts["train"], config["train_size"], config["split_seed"])
    model = initial_model(config)
    spec = config["optimizer"]
    optimizer = train.make_optimizer(model.parameters(), spec["name"], spec["lr"], spec["p"])
    lengths = [len(ids) for ids in train_set.ids]
    return train.Setup(model, optimizer, train_set, by_length(parts[config["evaluate_on"]]), collate, lengths)


def by_length(dataset: TokenizedDataset) -> TokenizedDataset:
    """The same examples sorted by length (stable): evaluation batches of similar lengths, less padding
    (accuracy and mean loss do not depend on the order)."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.ids[i]))
    return TokenizedDataset([dataset.ids[i].tolist() for i in order], dataset.labels[order],
                            None if dataset.texts is None else [dataset.texts[i] for i in order])


def train_run(config: Mapping[str, Any], progress: bool = True) -> runs.RunResult:
    """The stored result of one run (history + final weights), training it when missing."""
    return train.run(KIND, config, build, extras=train.model_state, progress=progress)


def train_runs(configs: list[Mapping[str, Any]], workers: int = 1, progress: bool = True,
               skip: tuple[type[BaseException], ...] = ()) -> list[runs.RunResult | None]:
    """``train_run`` for each config, the missing ones ``workers`` at a time (None for a run that
    raised one of ``skip``)."""
    return train.run_many(KIND, configs, build, extras=train.model_state, workers=workers, skip=skip, progress=progress)


def table_models(layers: int, methods: list[str], seeds: int, *, sweep_lrs: Mapping[str, list[float]],
                 sweep_layers: int, step_sizes: str = "sweep", workers: int = 1, **settings):
    """The trained models of one Table 1 row, as chapter 04 trains them (read back from the store, or
    trained when missing): {(method, seed): model}, and {(method, seed): config}."""
    _, chosen = sweep(sweep_lrs, workers=workers, layers=sweep_layers, **settings)
    lrs = table_step_sizes([layers], methods, chosen, step_sizes)
    configs, results, _ = grid(lrs, seeds, workers=workers, **settings)
    keys = [(method_key(c["optimizer"]["name"], c["optimizer"]["p"]), c["fit"]["seed"]) for c in configs]
    return ({k: trained_model(r, c) for k, c, r in zip(keys, configs, results)}, dict(zip(keys, configs)))


def trained_model(result: Mapping[str, Any], config: Mapping[str, Any]) -> EncoderClassifier:
    """The model of a stored run with its final weights, in eval mode."""
    return train.load_model_state(initial_model(config), result).eval()


def method(key: str) -> tuple[str, float | None]:
    """A method key as (optimizer, p): ``"adam"`` -> ("adam", None), ``"1.1"`` -> ("md", 1.1)."""
    if key in ("adam", "sgd"):
        return key, None
    try:
        return "md", float(key)
    except ValueError:
        raise ValueError(f"unknown method {key!r}: an l_p exponent such as '1.1', or 'adam' / 'sgd'") from None


def method_key(optimizer: str, p: float | None = None) -> str:
    """The inverse of ``method``: ("md", 2.0) -> "2", ("adam", None) -> "adam"."""
    return f"{p:g}" if optimizer == "md" else optimizer


def _history_table(configs: list[Mapping[str, Any]], results: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (run, epoch): layers, method, seed and ``fit``'s history columns (lr included)."""
    frames = []
    for c, r in zip(configs, results):
        h = r["history"].copy()
        spec = c["optimizer"]
        h.insert(0, "layers", c["model"]["layers"])
        h.insert(1, "method", method_key(spec["name"], spec["p"]))
        h.insert(2, "seed", c["fit"]["seed"])
        h["lr"] = spec["lr"]
        frames.append(h)
    return pd.concat(frames, ignore_index=True)


def sweep(lrs: Mapping[str, list[float]], *, workers: int = 1, **settings) -> tuple[pd.DataFrame, dict[str, float]]:
    """The step-size sweep on the validation split: one run per (method, lr) with ``config(**settings,
    evaluate_on="validation")``. Returns (per (method, lr): best and last validation accuracy, NaN for
    a run mirror descent stopped as diverging), {method: the lr with the best validation accuracy (ties:
    the smaller lr)}. The test split is never used."""
    configs = [config(optimizer=method(key)[0], p=method(key)[1], lr=lr, evaluate_on="validation", **settings)
               for key, values in lrs.items() for lr in values]
    results = train_runs(configs, workers, skip=(FloatingPointError,))
    done = [(c, r) for c, r in zip(configs, results) if r is not None]
    history = _history_table(*zip(*done)) if done else pd.DataFrame(columns=["method", "lr", "test_accuracy", "epoch"])
    table = (history.groupby(["method", "lr"], sort=False)
             .agg(best_validation=("test_accuracy", "max"), last_validation=("test_accuracy", "last"),
                  epochs=("epoch", "max")).reset_index())
    diverged = [{"method": method_key(c["optimizer"]["name"], c["optimizer"]["p"]), "lr": c["optimizer"]["lr"]}
                for c, r in zip(configs, results) if r is None]
    table = pd.concat([table, pd.DataFrame(diverged)], ignore_index=True) if diverged else table
    order = {(k, lr): i for i, (k, values) in enumerate(lrs.items()) for lr in values}
    table = table.assign(order=[order[k, lr] for k, lr in zip(table.method, table.lr)]).sort_values("order")
    chosen = train.choose_step_sizes(table, "best_validation", "method")
    return table.drop(columns="order").reset_index(drop=True), chosen


def table_step_sizes(layers: list[int], methods: list[str], chosen: Mapping[str, float], source: str = "sweep"):
    """{layers: {method: lr}}: the sweep's ``chosen`` lr for every depth, or with ``source="paper"``
    the paper's table for the l_p methods it covers (``chosen`` for the others, e.g. Adam)."""
    if source not in ("sweep", "paper"):
        raise ValueError(f"step sizes come from 'sweep' or 'paper', got {source!r}")
    table = PAPER_STEP_SIZES if source == "paper" else {}
    missing = [k for k in methods if k not in chosen and any(k not in table.get(L, {}) for L in layers)]
    if missing:
        raise ValueError(f"no step size for {missing}: add candidates for them to the sweep")
    return {L: {k: table.get(L, {}).get(k, chosen.get(k)) for k in methods} for L in layers}


def grid(lrs: Mapping[int, Mapping[str, float]], seeds: int, *, workers: int = 1, **settings):
    """Every (layers, method, seed) run of Table 1: ``lrs[layers][method]`` the step size, seeds 0 ..
    seeds-1 (distinct initializations). Returns (configs, results, history table)."""
    configs = [config(layers=layers, optimizer=method(key)[0], p=method(key)[1], lr=lr, seed=seed, **settings)
               for layers, by_method in lrs.items() for key, lr in by_method.items() for seed in range(seeds)]
    results = train_runs(configs, workers)
    return configs, results, _history_table(configs, results)


# --- token selection (E5) -------------------------------------------------------------------------


def pivotal_sentences() -> pd.DataFrame:
    """The project's hand-written sentences (data/pivotal_sentences.csv): sentence, pivotal, label."""
    return pd.read_csv(paths.ROOT / "data" / "pivotal_sentences.csv")


def pad(ids: list[list[int]] | list[Tensor], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask) of unpadded id sequences, padded to the longest."""
    inputs, _ = collate([(torch.as_tensor(x), torch.tensor(0)) for x in ids], pad_id)
    return inputs["input_ids"], inputs["attention_mask"]


def tokens(ids: list[int], max_length: int = 64) -> list[str]:
    """The WordPiece strings of an id sequence."""
    tokenizer = _tokenizer(max_length, False)
    return [tokenizer.id_to_token(i) for i in ids]


def designated_positions(ids: list[list[int]], words: list[str], max_length: int = 64) -> np.ndarray:
    """The position of each sequence's designated word (first occurrence); the word must be a single
    WordPiece token of the vocabulary."""
    tokenizer = _tokenizer(max_length, False)
    positions = []
    for sequence, word in zip(ids, words):
        token = tokenizer.token_to_id(word)
        if token is None or token not in sequence:
            raise ValueError(f"the pivotal word {word!r} is not a single WordPiece token of its sentence; "
                             "choose a word the uncased vocabulary holds whole")
        positions.append(list(sequence).index(token))
    return np.asarray(positions)


def lexicon_pivots(ids: list[list[int]], min_valence: float = 2.0, max_length: int = 64) -> tuple[np.ndarray, list[str]]:
    """The automatically designated pivotal token of each sequence: the whole-word token (not a piece
    of a longer word) with the largest VADER |valence|, when that is at least ``min_valence`` and no
    other word of the sequence ties with it. Returns (positions, -1 where none; the words)."""
    lexicon = data.sentiment_lexicon()
    positions, words = [], []
    for sequence in ids:
        pieces = tokens(sequence, max_length)
        scored = [(abs(lexicon.get(t, 0.0)), j) for j, t in enumerate(pieces)
                  if not t.startswith("##") and not (j + 1 < len(pieces) and pieces[j + 1].startswith("##"))]
        scored.sort(reverse=True)
        top = scored[0] if scored else (0.0, -1)
        unique = len(scored) < 2 or scored[1][0] < top[0] or pieces[scored[1][1]] == pieces[top[1]]
        if top[0] >= min_valence and unique:
            positions.append(top[1])
            words.append(pieces[top[1]])
        else:
            positions.append(-1)
            words.append("")
    return np.asarray(positions), words


def attention_scores(model, ids: list[list[int]], batch_size: int = 256) -> list[np.ndarray]:
    """Each sequence's normalized [CLS] attention scores (``analysis.cls_attention``), unpadded."""
    scores = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        input_ids, mask = pad(chunk)
        block = analysis.cls_attention(model, input_ids, mask).numpy()
        scores.extend(block[b, :len(sequence)] for b, sequence in enumerate(chunk))
    return scores


def deletion_drops(model, ids: list[list[int]], positions, batch_size: int = 256) -> np.ndarray:
    """``analysis.probability_drop`` of deleting the token at ``positions[b]`` from each sequence."""
    drops = []
    for start in range(0, len(ids), batch_size):
        input_ids, mask = pad(ids[start:start + batch_size])
        where = torch.as_tensor(np.asarray(positions[start:start + batch_size]), dtype=torch.long)
        drops.append(analysis.probability_drop(model, input_ids, mask, where).numpy())
    return np.concatenate(drops)
