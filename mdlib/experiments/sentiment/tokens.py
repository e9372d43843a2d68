"""Chapter 04's data as the models see it: the WordPiece-tokenized splits (``splits``), a seeded,
stratified training subset (``training_subset``), and their batches (``collate``, ``by_length``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Iterable

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from mdlib.experiments import data

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    from tokenizers import Tokenizer

__all__ = ["TokenizedDataset", "by_length", "collate", "encode", "splits", "tokenizer", "training_subset"]

class TokenizedDataset(Dataset):
    """(token ids, label) pairs, ids unpadded ([CLS] ... [SEP], truncated to the tokenizer's length)."""

    def __init__(self, ids: list[list[int]], labels: ArrayLike, texts: list[str] | None = None):
        if len(ids) != len(labels):
            raise ValueError(f"{len(ids)} token sequences but {len(labels)} labels")
        self.ids = [torch.tensor(x, dtype=torch.long) for x in ids]
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.texts = texts

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.ids[index], self.labels[index]

    def subset(self, indices: Iterable[int]) -> "TokenizedDataset":
        """The examples at ``indices``, in that order."""
        indices = [int(i) for i in indices]
        return TokenizedDataset([self.ids[i].tolist() for i in indices], self.labels[indices],
                                None if self.texts is None else [self.texts[i] for i in indices])


def collate(batch: list[tuple[Tensor, Tensor]], pad_id: int = 0) -> tuple[dict[str, Tensor], Tensor]:
    """Pad a list of (ids, label) to the batch's longest sequence: ({input_ids, attention_mask}, labels)."""
    ids, labels = zip(*batch)
    input_ids = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=pad_id)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(x) for x in ids], batch_first=True)
    return {"input_ids": input_ids, "attention_mask": mask}, torch.stack(labels).float()


@functools.lru_cache(maxsize=4)
def tokenizer(max_length: int) -> Tokenizer:
    """The runs' WordPiece tokenizer (``data.wordpiece_tokenizer``) without padding, cached per ``max_length``."""
    wordpiece = data.wordpiece_tokenizer(max_length)
    wordpiece.no_padding()
    return wordpiece


def encode(texts: list[str], max_length: int) -> list[list[int]]:
    """WordPiece ids of each text ([CLS] first, [SEP] last, at most ``max_length``), unpadded."""
    return [e.ids for e in tokenizer(max_length).encode_batch(list(texts))]


@functools.lru_cache(maxsize=2)
def splits(dataset: str = "rotten_tomatoes", split_seed: int = 0, max_length: int = 64) -> dict[str, TokenizedDataset]:
    """The train / validation / test splits of a sentiment source, tokenized (cached per process)."""
    source = data.sentiment_dataset(dataset, seed=split_seed)
    return {name: TokenizedDataset(encode(part["text"], max_length), part["label"], list(part["text"]))
            for name, part in source.items()}


def training_subset(dataset: TokenizedDataset, train_size: int | None, seed: int) -> TokenizedDataset:
    """A seeded, label-stratified subset of ``train_size`` examples (all of them when None)."""
    if train_size is None or train_size >= len(dataset):
        return dataset
    share = train_size / len(dataset)
    keep = data.stratified_split(dataset.labels.numpy(), {"train": share, "unused": 1 - share}, seed)["train"]
    return dataset.subset(keep)


def by_length(dataset: TokenizedDataset) -> TokenizedDataset:
    """The same examples sorted by length (stable): evaluation batches of similar lengths, less padding
    (accuracy and mean loss do not depend on the order)."""
    return dataset.subset(sorted(range(len(dataset)), key=lambda i: len(dataset.ids[i])))
