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


def test_change_table_reads_the_dual_change_and_the_init_weighting_null():
    """An ℓ1.1 model whose dual moved by one dense step, u = m(W0) - c G (G uniform, independent of W0),
    has the dual change -c G exactly (its density G's, about 3/4 for uniform entries); its ΔW is weighted
    by |W0|^0.9, whose density for W0 uniform is 2.8 / 1.9^2 = 0.776, and the null (their product)
    predicts ΔW's density; GD's dual change is ΔW itself, with weighting 1."""
    from mdlib.mirror import inverse_mirror_map, mirror_map

    torch.manual_seed(0)
    start = EncoderClassifier(vocab_size=40, max_length=8, width=96, layers=2, heads=2, mlp=12).eval()
    model = EncoderClassifier(vocab_size=40, max_length=8, width=96, layers=2, heads=2, mlp=12).eval()
    model.load_state_dict(start.state_dict())
    steps = []
    with torch.no_grad():
        for block in model.blocks:
            w = block.attention.qkv.weight.double()
            step = 1e-4 * torch.rand_like(w)
            steps.append(step)
            block.attention.qkv.weight.copy_(inverse_mirror_map(mirror_map(w, 1.1) - step, 1.1).float())
    row = sparsity.change_table({("1.1", 0): model}, {0: start}).iloc[0]
    assert row.dual_density == pytest.approx(analysis.effective_density(steps), rel=2e-3)  # float32 rounding
    assert row.dual_density == pytest.approx(0.75, abs=0.01)
    assert row.weighting_density == pytest.approx(2.8 / 1.9 ** 2, abs=0.01)
    assert row.null_density == pytest.approx(row.dual_density * row.weighting_density)
    assert row.effective_density == pytest.approx(row.null_density, rel=0.03)  # independent: the null holds
    gd = sparsity.change_table({("2", 0): model, ("adam", 0): model}, {0: start})
    assert (gd.dual_density == gd.effective_density).all() and (gd.weighting_density == 1.0).all()


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
