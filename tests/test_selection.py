"""Token selection tables (mdlib.experiments.selection) on small random models: per-seed counts, the clustered
summary, and the concentration of the [CLS] row against independent computations."""

import numpy as np
import pytest
import torch

from mdlib.experiments import analysis, selection, stats
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
    table = selection.win_table(scored, {"authors": s}, [0, 1, 2])
    assert table.seed.tolist() == [0, 1, 2] and (table.wins + table.losses + table.ties == 25).all()
    for seed in (0, 1, 2):
        pivot = lambda key: np.array([r[j] for r, j in zip(scored[key, seed]["authors"], s.positions)])  # noqa: E731
        assert tuple(table.loc[table.seed == seed, ["wins", "losses", "ties"]].iloc[0]) == \
            analysis.win_loss_tie(pivot("1.1"), pivot("2"))
    summary = selection.summary(table, scored, {"authors": s}, ["1.1", "2"])
    row = summary.iloc[0]
    assert (row.rate, row.low, row.high) == pytest.approx(stats.clustered_rate(table.wins, table.losses))
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
