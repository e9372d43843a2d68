"""The E6 tables (mdlib.experiments.sparsity): counts, the change W - W(0), pruning of the matrices only."""

import numpy as np
import pytest
import torch

from mdlib.experiments import analysis, sparsity
from mdlib.models import EncoderClassifier


def encoder(seed=0):
    torch.manual_seed(seed)
    return EncoderClassifier(vocab_size=40, max_length=8, width=6, layers=2, heads=2, mlp=12).eval()


def test_change_table_measures_the_learned_change_only():
    start, model = encoder(), encoder()
    with torch.no_grad():  # one entry of one query matrix moves: the sparsest possible change
        model.blocks[0].attention.qkv.weight[0, 0] += 1.0
    table = sparsity.change_table({("1.1", 0): model}, {0: start})
    row = table.iloc[0]
    n = 3 * 2 * 6 * 6
    assert row.effective_density == pytest.approx(1 / n) and row.top_share == pytest.approx(1.0)
    size = np.sqrt(sum(float(w.detach().pow(2).sum()) for ws in start.attention_weights().values() for w in ws))
    assert row.relative_change == pytest.approx(1 / size)
    with torch.no_grad():  # the same change everywhere: density 1
        for w in model.blocks[0].attention.qkv.weight, model.blocks[1].attention.qkv.weight:
            w.copy_(start.blocks[0].attention.qkv.weight if w is model.blocks[0].attention.qkv.weight
                    else start.blocks[1].attention.qkv.weight)
            w += 0.5
    assert sparsity.change_table({("2", 0): model}, {0: start}).effective_density.iloc[0] == pytest.approx(1.0)


def test_counts_and_pruning_tables():
    model = encoder()
    counts = sparsity.counts_table({("2", 0): model}, 0.2, 0.06)
    weights = model.attention_weights()
    assert counts.K.iloc[0] == analysis.count_above(weights["key"], 0.2)
    assert counts["V > 0.06"].iloc[0] == analysis.count_above(weights["value"], 0.06)
    seen = []
    table = sparsity.pruning_table({("2", 0): model}, [0.0, 0.5], lambda m: seen.append(m) or 0.5)
    assert table.sparsity.tolist() == [0.0, 0.5] and table.test_accuracy.tolist() == [0.5, 0.5]
    assert torch.equal(seen[1].token.weight, model.token.weight)  # the embedding table is never pruned
    matrices = [w for _, w in analysis.prunable_weights(seen[1])]
    assert sum(int((w == 0).sum()) for w in matrices) == round(0.5 * sum(w.numel() for w in matrices))
