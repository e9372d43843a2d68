"""The bag-of-words baselines of every sentiment page (kind ``e4-baseline``): two scikit-learn classifiers
on exactly the runs' WordPiece tokens, training sentences and splits; a model that learned something about
sentiment beats them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mdlib.experiments.sentiment.tokens import TokenizedDataset, splits, tokenizer, training_subset
from mdlib.runs import identity, store
from mdlib.runs.identity import RunId

__all__ = ["BASELINES", "BASELINE_C", "BASELINE_KIND", "baseline"]

#: The baselines of every sentiment page (``baseline``); the first is the one the verdicts' gates use.
BASELINES = {"naive_bayes": "multinomial Naive Bayes (token counts, alpha = 1)",
             "logistic_regression": "logistic regression (token presence, l2, C chosen on validation)"}


#: The inverse regularization strengths the logistic-regression baseline chooses among (by validation).
BASELINE_C = (0.01, 0.1, 1.0, 10.0, 100.0)


def _bag_of_tokens(dataset: TokenizedDataset, binary: bool):
    """A sparse (examples x 30,522) matrix of WordPiece token counts (or presence), [CLS], [SEP] and
    [PAD] left out."""
    from scipy import sparse

    special = {tokenizer(8).token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
    rows, cols = [], []
    for i, ids in enumerate(dataset.ids):
        kept = [t for t in ids.tolist() if t not in special]
        rows += [i] * len(kept)
        cols += kept
    counts = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(dataset), tokenizer(8).get_vocab_size()))
    counts.sum_duplicates()
    if binary:
        counts.data[:] = 1.0
    return counts


BASELINE_KIND = identity.kind("e4-baseline", __name__)


def baseline(dataset: str = "rotten_tomatoes", split_seed: int = 0, max_length: int = 64,
             train_size: int | None = None) -> pd.DataFrame:
    """The bag-of-words baselines (``BASELINES``) on the same WordPiece tokens, training (sub)set and
    splits as the runs of a Table 1 grid with these settings: one row per classifier with its
    validation and test accuracy (and the chosen C of the logistic regression). Stored (kind
    ``BASELINE_KIND``), so every page reads the same numbers."""
    config = {"dataset": dataset, "split_seed": split_seed, "max_length": max_length, "train_size": train_size,
              "C": list(BASELINE_C)}
    return store.load_or_run(RunId.of(BASELINE_KIND, config), lambda: {"table": _baselines(**config)})["table"]


def _baselines(dataset: str, split_seed: int, max_length: int, train_size: int | None, C) -> pd.DataFrame:
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import MultinomialNB

    parts = splits(dataset, split_seed, max_length)
    train_set = training_subset(parts["train"], train_size, split_seed)
    y = {name: part.labels.numpy() for name, part in (("train", train_set), ("validation", parts["validation"]),
                                                       ("test", parts["test"]))}
    rows = []
    for name, binary in (("naive_bayes", False), ("logistic_regression", True)):
        X = {key: _bag_of_tokens(part, binary) for key, part in (("train", train_set),
                                                                ("validation", parts["validation"]), ("test", parts["test"]))}
        candidates = [(None, MultinomialNB(alpha=1.0))] if name == "naive_bayes" else [
            (c, LogisticRegression(C=c, max_iter=2000)) for c in C]
        scored = []
        for c, model in candidates:
            model.fit(X["train"], y["train"])
            scored.append((model.score(X["validation"], y["validation"]), -(c or 0), c, model))
        validation, _, c, model = max(scored, key=lambda item: item[:2])  # ties: the smaller C
        rows.append({"baseline": name, "description": BASELINES[name], "C": c, "validation_accuracy": float(validation),
                     "test_accuracy": float(model.score(X["test"], y["test"])), "train_size": len(train_set)})
    return pd.DataFrame(rows)
