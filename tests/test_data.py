"""Data readers on tiny fixtures in the real files' on-disk formats (no network)."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import FIXTURES, install_idx
from mdlib.experiments import data, fetch



def install(cache: Path, name: str) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    (cache / name).write_bytes((FIXTURES / name).read_bytes())


def test_stratified_split_is_seeded_disjoint_and_keeps_label_shares():
    labels = np.array([0] * 300 + [1] * 100)
    split = data.stratified_split(labels, {"train": 0.8, "validation": 0.1, "test": 0.1}, seed=3)
    together = np.concatenate(list(split.values()))
    assert sorted(together.tolist()) == list(range(400))
    assert [len(split[k]) for k in ("train", "validation", "test")] == [320, 40, 40]
    assert labels[split["test"]].mean() == pytest.approx(0.25)
    again = data.stratified_split(labels, {"train": 0.8, "validation": 0.1, "test": 0.1}, seed=3)
    assert all(np.array_equal(split[k], again[k]) for k in split)
    other = data.stratified_split(labels, {"train": 0.8, "validation": 0.1, "test": 0.1}, seed=4)
    assert not np.array_equal(split["test"], other["test"])
    with pytest.raises(ValueError):
        data.stratified_split(labels, {"train": 0.8, "test": 0.1}, seed=0)


def test_rotten_tomatoes_drops_neutral_and_labels_by_sign(cache):
    install(cache, "movieReviewSnippets_GroundTruth.txt")
    ds = data.rotten_tomatoes(seed=0, validation=0.2, test=0.2)
    rows = pd.concat([ds[s].to_pandas() for s in ("train", "validation", "test")])
    assert len(rows) == 9  # ten snippets, one rated exactly 0
    assert "A film about a thing." not in set(rows.text)
    labels = dict(zip(rows.text, rows.label))
    assert labels["Effective but too tepid biopic"] == 0 and labels["Good enough."] == 1
    assert not any(t.endswith("\r") for t in rows.text)


def test_missing_or_corrupt_files_name_the_fetch_command(cache):
    with pytest.raises(fetch.DataError, match="python -m mdlib fetch rotten_tomatoes"):
        data.rotten_tomatoes()
    install(cache, "vocab.txt")
    (cache / "vocab.txt").write_text("[PAD]\nedited\n")
    with pytest.raises(fetch.DataError, match="sha256.*python -m mdlib fetch wordpiece_vocab"):
        data.wordpiece_tokenizer()


def test_imdb_from_the_hub_parquet_layout(tmp_path, monkeypatch):
    folder = tmp_path / "imdb" / "plain_text"
    folder.mkdir(parents=True)
    train = pd.DataFrame({"text": [f"review {i}" for i in range(40)], "label": [i % 2 for i in range(40)]})
    test = pd.DataFrame({"text": ["a", "b", "c"], "label": [0, 1, 1]})
    train.to_parquet(folder / "train-00000-of-00001.parquet")
    test.to_parquet(folder / "test-00000-of-00001.parquet")
    monkeypatch.setattr(fetch, "IMDB_FILES", {f"plain_text/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
                                              for p in folder.iterdir()})  # the fixtures stand in for the hub's files
    ds = data.sentiment_dataset("imdb", local_dir=tmp_path / "imdb", validation=0.25)
    assert (len(ds["train"]), len(ds["validation"]), len(ds["test"])) == (30, 10, 3)
    assert set(ds["validation"]["label"]) == {0, 1}
    assert ds["test"]["text"] == ["a", "b", "c"]
    with pytest.raises(fetch.DataError, match="parquet"):
        data.imdb(local_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown sentiment"):
        data.sentiment_dataset("sst2")


def test_wordpiece_tokenizer_from_a_vocabulary_file(cache):
    install(cache, "vocab.txt")
    tok = data.wordpiece_tokenizer(max_length=6)
    first, second = tok.encode_batch(["An amazing, heart-warming film!", "Terrible"])
    assert first.tokens == ["[CLS]", "an", "amazing", ",", "heart", "[SEP]"]  # truncated to 6
    assert second.tokens[:3] == ["[CLS]", "terrible", "[SEP]"]
    assert second.ids[3:] == [0, 0, 0] and second.attention_mask == [1, 1, 1, 0, 0, 0]
    assert tok.encode("warming").tokens == ["[CLS]", "warm", "##ing", "[SEP]"]
    with pytest.raises(ValueError):
        data.wordpiece_tokenizer(max_length=1)


def test_fashion_mnist_reads_gzipped_idx_files(cache, monkeypatch):
    rng = np.random.default_rng(0)
    files = {"train-images-idx3-ubyte.gz": rng.integers(0, 256, (6, 28, 28)), "train-labels-idx1-ubyte.gz":
             np.array([0, 1, 2, 9, 9, 3]), "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (2, 28, 28)),
             "t10k-labels-idx1-ubyte.gz": np.array([5, 7])}
    install_idx(cache, monkeypatch, files)
    train = data.fashion_mnist("train", data.ImageTransform("fashion_mnist", train=True))
    test = data.fashion_mnist("test")
    assert (len(train), len(test)) == (6, 2)
    image, label = test[1]
    assert image.shape == (1, 28, 28) and label == 7
    np.testing.assert_allclose(image[0].numpy(), files["t10k-images-idx3-ubyte.gz"][1] / 255, rtol=1e-6)
    assert train[0][0].shape == (1, 28, 28)
    with pytest.raises(ValueError):
        data.fashion_mnist("validation")


def test_read_idx_rejects_other_files(tmp_path):
    path = tmp_path / "x.idx"
    path.write_bytes(b"not an idx file")
    with pytest.raises(fetch.DataError, match="IDX"):
        data.read_idx(path)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_reads_torchvision_layout(tmp_path, name):
    import pickle

    folder, train_files, test_file, label_key = fetch.CIFAR_FILES[name]
    rng = np.random.default_rng(1)
    (tmp_path / folder).mkdir()
    for file, count in [(f, 3) for f in train_files] + [(test_file, 2)]:
        batch = {b"data": rng.integers(0, 256, (count, 3072)).astype(np.uint8),
                 label_key: rng.integers(0, 10, count).tolist()}
        with open(tmp_path / folder / file, "wb") as handle:
            pickle.dump(batch, handle)
    train = data.cifar(name, "train", tmp_path, transform=data.ImageTransform(name, train=True, image_size=48))
    test = data.cifar(name, "test", tmp_path)
    assert len(train) == 3 * len(train_files) and len(test) == 2
    assert train[0][0].shape == (3, 48, 48) and test[0][0].shape == (3, 32, 32)
    with open(tmp_path / folder / test_file, "rb") as handle:
        raw = pickle.load(handle)
    # channel-first rows of 1024 values: red plane, then green, then blue
    np.testing.assert_allclose(test[1][0][2].numpy().ravel(), raw[b"data"][1, 2048:] / 255, rtol=1e-6)
    with pytest.raises(fetch.DataError, match="download=True"):
        data.cifar(name, "test", tmp_path / "empty")


def test_a_planted_cifar_batch_is_refused_before_it_runs_code(tmp_path):
    import pickle

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    folder, _, test_file, _ = fetch.CIFAR_FILES["cifar10"]
    (tmp_path / folder).mkdir()
    for protocol in (2, 5):
        (tmp_path / folder / test_file).write_bytes(pickle.dumps({b"data": Payload(), b"labels": [1]}, protocol))
        with pytest.raises(fetch.DataError, match=r"is not a CIFAR batch: its pickle names posix\.system"):
            data.cifar("cifar10", "test", tmp_path)
        assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("name, size", [("cifar10", 48), ("fashion_mnist", None), ("fashion_mnist", 36)])
def test_batched_image_transform_equals_torchvision_per_image(name, size):
    """The batch transform against torchvision's per-image functional ops, given the same draws: a crop
    offset (top, left) per image, then a flip per image, from torch's global RNG in that order."""
    import torch
    from torchvision.transforms.v2 import functional as TF

    channels, native = (1, 28) if name == "fashion_mnist" else (3, 32)
    pad = 2 if native == 28 else 4
    images = torch.rand(40, channels, native, native, generator=torch.Generator().manual_seed(0))
    transform = data.ImageTransform(name, train=True, image_size=size)
    torch.manual_seed(7)
    batch = transform(images)
    torch.manual_seed(7)
    top, left = torch.randint(0, 2 * pad + 1, (40,)), torch.randint(0, 2 * pad + 1, (40,))
    flip = torch.rand(40) < 0.5
    mean, std = data.NORMALIZATION[name]
    for i in range(40):
        image = TF.crop(TF.pad(images[i], [pad]), int(top[i]), int(left[i]), native, native)
        image = TF.resize(image, size, antialias=True) if size else image
        image = TF.horizontal_flip(image) if flip[i] else image
        torch.testing.assert_close(batch[i], TF.normalize(image, mean, std), rtol=1e-6, atol=1e-6)
    assert 0.2 < flip.float().mean() < 0.8 and len(set(top.tolist())) > 1
    # evaluation: resize and normalize only, no randomness
    evaluation = data.ImageTransform(name, train=False, image_size=size)
    expected = TF.normalize(TF.resize(images, size, antialias=True) if size else images, mean, std)
    torch.testing.assert_close(evaluation(images), expected, rtol=1e-6, atol=1e-6)


def test_crop_offsets_cover_the_padding_uniformly():
    import torch

    transform = data.ImageTransform("fashion_mnist", train=True)
    image = torch.zeros(2000, 1, 28, 28)
    image[:, :, 0, 0] = 1.0  # a marked corner pixel: where it lands gives the crop offset
    torch.manual_seed(0)
    out = transform(image)
    marked = out > out.amin()
    assert marked.flatten(1).sum(1).le(1).all()  # a shifted corner: one pixel, or cropped away
    landed = marked.flatten(1).float().argmax(1)[marked.flatten(1).any(1)]
    rows = landed // 28
    counts = np.bincount(rows.numpy(), minlength=5)[:5]  # corner row = pad - top in 0..2 (top 2..4 crop it)
    assert set(np.flatnonzero(counts)) == {0, 1, 2}
    assert counts[:3].min() > 0.8 * counts[:3].mean()


def test_image_dataset_fetches_a_batch_in_one_call():
    import torch

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), np.array([0, 1, 2, 3, 4, 5])
    plain = data.ImageDataset(images, labels)
    items = plain.__getitems__([4, 1])
    assert [label for _, label in items] == [4, 1]
    torch.testing.assert_close(items[0][0], plain[4][0])
    torch.testing.assert_close(plain[1][0][0], torch.from_numpy(images[1]).float() / 255)
    calls = []
    counted = data.ImageDataset(images, labels, transform=lambda batch: calls.append(len(batch)) or batch)
    loader = torch.utils.data.DataLoader(counted, batch_size=3)
    assert [tuple(x.shape) for x, _ in loader] == [(3, 1, 28, 28)] * 2 and calls == [3, 3]


def test_cifar_download_without_torchvision_says_what_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision raises ImportError
    with pytest.raises(fetch.DataError, match=r"attention-mirror-descent\[cifar\]"):
        data.cifar("cifar10", "train", tmp_path, download=True)
