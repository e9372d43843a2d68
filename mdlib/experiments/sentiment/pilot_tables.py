"""Chapter 04's pilots, measured once and committed under ``data/``: what sized its default and what ruled
the authors' setup out as the default."""

from __future__ import annotations

import pandas as pd

from mdlib.experiments import paths

__all__ = ["authors_pilots", "pilots"]

def authors_pilots() -> pd.DataFrame:
    """The pilots of the authors' setup that ruled it out as the default (data/sentiment_authors_pilots.csv,
    measured once): one row per reading of a run (3 layers, seed 0): train_size, width, method, multiple
    (of the paper's step), epoch, train_accuracy and test_accuracy there, seconds an epoch (two runs sharing
    2 cores), and ``event``: how the run ended where this is its last reading (the stop rule, the cap, a
    collapse to chance), else empty."""
    return pd.read_csv(paths.data_file("sentiment_authors_pilots.csv"), dtype={"method": str, "event": str},
                       keep_default_na=False)


def pilots() -> pd.DataFrame:
    """The pilots that sized chapter 04's default (data/sentiment_pilots.csv, measured once): one row per
    run: setup, method, multiple (of the paper's step), seed, epochs, reached, train_accuracy,
    test_accuracy and validation_accuracy at the end, seconds an epoch (two runs sharing 2 cores)."""
    return pd.read_csv(paths.data_file("sentiment_pilots.csv"), dtype={"method": str})
