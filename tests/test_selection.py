"""Token selection (mdlib.experiments.selection): on small random models, the per-seed counts, the clustered
summary and the concentration of the [CLS] row against independent computations; on the fixture data,
pivotal-token designation, the authors' sentences and the token measurements."""

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import FIXTURES
from mdlib.experiments import analysis, paths, selection, sentiment, stats
from mdlib.models import EncoderClassifier


def models():
    out = {}
    for key in ("1.1", "2"):
        for seed in (0, 1, 2):
            torch.manual_seed(100 * seed + len(key))
            out[key, seed] = EncoderClassifier(vocab_size=30, max_length=12, width=6, layers=2, heads=2, mlp=12,
                                               dropout=0.2).eval()
    return out


def sentences():
    g = torch.Generator().manual_seed(0)
    ids = [[1, *torch.randint(4, 30, (int(n),), generator=g).tolist(), 2] for n in torch.randint(2, 9, (25,), generator=g)]
    positions = np.array([1 + int(torch.randint(0, len(x) - 2, (1,), generator=g)) for x in ids])
    return selection.SentenceSet("authors", "the authors' sentences", ids, positions)


def test_win_table_counts_each_seed_pair():
    nets, s = models(), sentences()
    scored = selection.scores(nets, {"authors": s})
    outcomes = selection.win_table(scored, {"authors": s}, [0, 1, 2])
    assert len(outcomes) == 3 * 25 and (outcomes.wins + outcomes.losses + outcomes.ties == 1).all()
    table = selection.seed_counts(outcomes)
    assert table.seed.tolist() == [0, 1, 2] and (table.wins + table.losses + table.ties == 25).all()
    for seed in (0, 1, 2):
        pivot = lambda key: np.array([r[j] for r, j in zip(scored[key, seed]["authors"], s.positions)])  # noqa: E731
        assert tuple(table.loc[table.seed == seed, ["wins", "losses", "ties"]].iloc[0]) == \
            analysis.win_loss_tie(pivot("1.1"), pivot("2"))
    summary = selection.summary(outcomes, scored, {"authors": s}, ["1.1", "2"])
    row = summary.iloc[0]
    assert row.rate == pytest.approx(stats.clustered_rate(table.wins, table.losses)[0])
    assert (row.seeds_low, row.seeds_high) == pytest.approx(stats.clustered_rate(table.wins, table.losses)[1:])
    assert row.low <= row.seeds_low + 1e-12 and row.high >= row.seeds_high - 1e-12  # sentences widen it
    assert (row.pooled_low, row.pooled_high) == pytest.approx(
        stats.wilson_interval(table.wins.sum(), table.wins.sum() + table.losses.sum()))
    assert summary.key.tolist() == ["authors", "paper"] and summary.wins.iloc[1] == 22
    assert "3 seed pairs" in selection.summary_text(row)
    assert list(selection.summary_view(summary).columns)[0] == "sentences"


def test_concentration_table_matches_one_sentence_at_a_time():
    nets, s = models(), sentences()
    table = selection.concentration_table({k: nets[k] for k in [("1.1", 0), ("2", 0)]}, s, batch_size=7)
    for key in ("1.1", "2"):
        by_hand = [analysis.concentration(analysis.cls_row(nets[key, 0], torch.tensor([x]),
                                                           torch.ones(1, len(x), dtype=torch.long))[0].double().numpy())
                   for x in s.ids]  # unpadded, one at a time: padding must not change the row
        entropy, top = np.mean(by_hand, axis=0)
        row = table[table.method == key].iloc[0]
        assert row.entropy == pytest.approx(entropy, rel=1e-5) and row.top_share == pytest.approx(top, rel=1e-5)
        assert 0 < row.entropy <= 1 and row.sentences == 25


def test_pad_pads_to_the_longest_and_masks_padding():
    ids, mask = selection.pad([[1, 2], [3]])
    assert ids.tolist() == [[1, 2], [3, 0]] and mask.tolist() == [[1, 1], [1, 0]]


def test_lexicon_designates_the_strongest_whole_word(fixture_data):
    vocab = {t: i for i, t in enumerate((FIXTURES / "vocab.txt").read_text().split())}
    ids = lambda words: [vocab[w] for w in ["[CLS]", *words, "[SEP]"]]  # noqa: E731
    sequences = [ids(["an", "amazing", "terrible", "film"]),  # |2.8| beats |-2.1|
                 ids(["terrible", "##ing", "film"]),  # 'terrible' is only a piece of a longer word here
                 ids(["an", "terrible", "film"]),
                 ids(["an", "film"])]
    positions, words = selection.lexicon_pivots(sequences, min_valence=2.0, max_length=16)
    assert positions.tolist() == [2, -1, 2, -1] and words == ["amazing", "", "terrible", ""]
    assert selection.lexicon_pivots(sequences[:1], min_valence=3.0, max_length=16)[0].tolist() == [-1]
    assert selection.designated_positions(sequences[:1], ["film"], 16).tolist() == [4]
    with pytest.raises(ValueError, match="'warming' is not a single WordPiece token"):
        selection.designated_positions(sequences[:1], ["warming"], 16)


def test_token_measurements_have_one_value_per_token_or_sentence():
    torch.manual_seed(0)
    model = EncoderClassifier(vocab_size=20, max_length=8, width=6, layers=2, heads=2, mlp=12, dropout=0.0).eval()
    ids = [[1, 5, 6, 2], [1, 7, 2], [1, 8, 9, 10, 2]]
    scores = selection.attention_scores(model, ids, batch_size=2)
    assert [len(s) for s in scores] == [4, 3, 5]
    assert all(np.isclose(s.max(), 1) and np.isclose(s.min(), 0) for s in scores)  # min-max normalized
    drops = selection.deletion_drops(model, ids, [1, 1, 2], batch_size=2)
    assert drops.shape == (3,) and np.isfinite(drops).all()
    with torch.no_grad():  # deleting token 1 of sequence 2 by hand gives the same drop
        full = torch.sigmoid(model(torch.tensor([ids[1]]), torch.ones(1, 3, dtype=torch.long)))
        cut = torch.sigmoid(model(torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.long)))
    expected = (full - cut) if full >= 0.5 else (cut - full)
    assert np.isclose(drops[1], expected.item(), atol=1e-6)


def test_length_batches_keep_each_sequence_in_its_place():
    """Batched by length, each sequence's scores, drop and concentration are what it gives alone (a batch
    of one, no padding), in the caller's order."""
    torch.manual_seed(1)
    model = EncoderClassifier(vocab_size=20, max_length=8, width=6, layers=2, heads=2, mlp=12, dropout=0.0).eval()
    ids = [[1, 5, 6, 7, 8, 9, 2], [1, 7, 2], [1, 8, 9, 10, 2], [1, 3, 2], [1, 4, 5, 6, 2]]
    positions = [3, 1, 2, 1, 4]
    batches = list(selection.length_batches(ids, 2))
    assert [b.tolist() for b in batches] == [[1, 3], [2, 4], [0]]  # stable: ties keep their order
    scores = selection.attention_scores(model, ids, batch_size=2)
    drops = selection.deletion_drops(model, ids, positions, batch_size=2)
    for i, sequence in enumerate(ids):
        np.testing.assert_allclose(scores[i], selection.attention_scores(model, [sequence], batch_size=1)[0], atol=1e-6)
        np.testing.assert_allclose(drops[i], selection.deletion_drops(model, [sequence], [positions[i]], 1)[0], atol=1e-6)
    s = selection.SentenceSet("test", "test", ids)
    alone = [selection.concentration_table({("gd", 0): model}, selection.SentenceSet("one", "one", [x]))
             for x in ids]
    both = selection.concentration_table({("gd", 0): model}, s, batch_size=2)
    np.testing.assert_allclose(both[["entropy", "top_share"]].to_numpy()[0],
                               np.mean([a[["entropy", "top_share"]].to_numpy()[0] for a in alone], axis=0), atol=1e-6)


def test_authors_sentences_keep_whole_token_pivots(cache, monkeypatch):
    """Their notebook keeps a sentence when its pivot is a whole WordPiece token of it: with a
    vocabulary that splits "breathtaking", "overpriced" and "overheats", 44 of 50 survive and the first
    40 are shown, as in their figures."""
    import hashlib

    from mdlib.experiments import fetch

    table = pd.read_csv(paths.root() / "data" / "authors_sentences.csv")
    assert len(table) == 50 and set(table.label) == {0, 1}
    split = {"breathtaking", "overpriced", "overheats"}
    words = {w.strip(".,!'").lower() for s in table.sentence for w in s.replace("-", " - ").split()} - split
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "-", "'", "breath", "##taking", "over", "##pri", "##ced",
             "##heat", "##s", *sorted(words)]
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "vocab.txt").write_text("\n".join(vocab) + "\n")
    files = dict(fetch.FILES)
    files["vocab.txt"] = fetch.RegistryFile(**{**files["vocab.txt"].__dict__,
                                               "sha256": hashlib.sha256((cache / "vocab.txt").read_bytes()).hexdigest()})
    monkeypatch.setattr(fetch, "FILES", files)
    sentiment.tokenizer.cache_clear()
    try:
        shown = selection.authors_sentences(32)
        everything = selection.authors_sentences(32, shown=50)
    finally:
        sentiment.tokenizer.cache_clear()
    assert len(everything) == 44 and len(shown) == selection.AUTHORS_SHOWN == 40
    assert not {12, 25, 28, 30, 34, 49} & set(everything.number)  # the six their notebook skips
    assert shown.number.tolist() == everything.number.tolist()[:40]
