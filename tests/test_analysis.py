"""Token scores, interventions, weight counts and pruning, on small models with known answers."""


import numpy as np

import pytest
import torch
from torch import nn

from mdlib.experiments import analysis, paper
from mdlib.models import EncoderClassifier


def encoder():
    torch.manual_seed(0)
    return EncoderClassifier(vocab_size=30, max_length=8, width=12, layers=2, heads=3, mlp=24, dropout=0.3)


def test_cls_attention_is_min_max_normalized_over_real_tokens():
    model = encoder()
    ids = torch.tensor([[2, 5, 6, 7, 3, 0], [2, 9, 3, 0, 0, 0]])
    mask = (ids != 0).long()
    scores = analysis.cls_attention(model, ids, mask)
    assert torch.isnan(scores[0, 5]) and torch.isnan(scores[1, 3:]).all()
    for b, n in ((0, 5), (1, 3)):
        real = scores[b, :n]
        assert real.min().item() == pytest.approx(0) and real.max().item() == pytest.approx(1)
    _, maps = model.eval()(ids, mask, return_attention=True)
    raw = maps[-1][1, :, 0, :3].mean(0)
    torch.testing.assert_close(scores[1, :3], (raw - raw.min()) / (raw.max() - raw.min()))
    assert model.training is False  # eval() above; cls_attention restores whatever mode it found
    model.train()
    analysis.cls_attention(model, ids, mask)
    assert model.training


def test_win_loss_tie():
    assert analysis.win_loss_tie(torch.tensor([0.5, 0.2, 0.3]), torch.tensor([0.4, 0.2, 0.9])) == (1, 1, 1)


def test_delete_tokens_shifts_left_and_pads():
    ids = torch.tensor([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    new_ids, new_mask = analysis.delete_tokens(ids, mask, torch.tensor([2, 1]))
    assert new_ids.tolist() == [[2, 5, 3, 0, 0], [2, 3, 0, 0, 0]]
    assert new_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]


class Counter(nn.Module):
    """A 'classifier' whose logit is 4 x (number of token 4s) - 2: deleting the one 4 flips it."""

    def forward(self, input_ids, attention_mask=None):
        return (input_ids == 4).sum(dim=1).float() * 4 - 2


def test_probability_drop_measures_the_removed_tokens_effect():
    ids = torch.tensor([[2, 4, 5, 3], [2, 5, 5, 3]])
    mask = torch.ones_like(ids)
    drop = analysis.probability_drop(Counter(), ids, mask, torch.tensor([1, 1]))
    expected_first = torch.sigmoid(torch.tensor(2.0)) - torch.sigmoid(torch.tensor(-2.0))
    assert drop[0].item() == pytest.approx(expected_first.item())
    assert drop[1].item() == pytest.approx(0.0)  # deleting a 5 changes nothing


def test_count_above_and_magnitude_pruning():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3), nn.LayerNorm(3))
    assert [name for name, _ in analysis.prunable_weights(model)] == ["1.weight"]  # no embedding table by default
    weights = [w for _, w in analysis.prunable_weights(model, embeddings=True)]
    assert [tuple(w.shape) for w in weights] == [(10, 4), (3, 4)]
    assert analysis.count_above(weights, 0.5) == sum(int((w.abs() > 0.5).sum()) for w in weights)
    values = analysis.magnitudes(weights)
    assert values.shape == (sum(w.numel() for w in weights),) and (values >= 0).all()
    assert int((values > 0.5).sum()) == analysis.count_above(weights, 0.5)
    pruned = analysis.magnitude_prune(model, 0.5, embeddings=True)
    kept = torch.cat([w.flatten() for _, w in analysis.prunable_weights(pruned, embeddings=True)])
    everything = torch.cat([w.detach().flatten() for w in weights])
    assert int((kept == 0).sum()) == 26  # half of the 52 prunable entries
    threshold = everything.abs().sort().values[25]
    assert torch.all(kept[kept != 0].abs() >= threshold)
    torch.testing.assert_close(pruned[1].bias, model[1].bias)  # biases and norms untouched
    assert int((weights[0] == 0).sum()) == 0  # the original model is not modified
    with pytest.raises(ValueError):
        analysis.magnitude_prune(model, 1.0)
    matrices = analysis.magnitude_prune(model, 0.5)  # the Linear matrix alone: 6 of its 12 entries
    assert int((matrices[1].weight == 0).sum()) == 6 and torch.equal(matrices[0].weight, model[0].weight)


@pytest.mark.parametrize("paper_width", [paper.KQV_WIDTH, paper.VIT_WIDTH])
def test_scaled_threshold_keeps_the_papers_multiple_of_the_init_bound(paper_width):
    assert analysis.scaled_threshold(paper_width, paper_width) == paper.WEIGHT_THRESHOLD  # the paper's own width
    for width in (8, 24, 64, 1024):
        scaled = analysis.scaled_threshold(width, paper_width)
        assert scaled == pytest.approx(0.06 * (paper_width / width) ** 0.5)
        # threshold / (1 / sqrt(width)) is the paper's 0.06 * sqrt(paper_width) at every width
        assert scaled * width ** 0.5 == pytest.approx(0.06 * paper_width ** 0.5)
    assert analysis.scaled_threshold(96, 384, threshold=0.1) == pytest.approx(0.2)
    assert paper.KQV_ENTRIES == 6 * 384 * 384 and (paper.KQV_WIDTH, paper.VIT_WIDTH) == (384, 512)


def test_pruning_scope_of_the_encoder_leaves_the_embedding_table():
    model = encoder()
    names = [name for name, _ in analysis.prunable_weights(model)]
    assert "token.weight" not in names and "position.weight" not in names
    assert set(names) == {n for n in model.parameter_groups()["attention"] + model.parameter_groups()["mlp"]
                          + model.parameter_groups()["classifier"]}
    pruned = analysis.magnitude_prune(model, 0.9)
    assert torch.equal(pruned.token.weight, model.token.weight)
    total = sum(w.numel() for _, w in analysis.prunable_weights(pruned))
    assert sum(int((w == 0).sum()) for _, w in analysis.prunable_weights(pruned)) == round(0.9 * total)


def test_relative_movement_per_group():
    model, start = encoder(), encoder()
    groups = model.parameter_groups()
    with torch.no_grad():
        model.classifier.weight.mul_(3.0)  # moved by 2x its size
        model.blocks[0].attention.qkv.weight.zero_()
    moved = analysis.relative_movement(model, start, groups)
    assert moved["classifier"] == pytest.approx(2.0) and moved["embeddings"] == 0 and moved["mlp"] == 0
    qkv0 = start.blocks[0].attention.qkv.weight
    attention = [dict(start.named_parameters())[n] for n in groups["attention"]]
    expected = (qkv0.norm() / torch.sqrt(sum(w.pow(2).sum() for w in attention))).item()
    assert moved["attention"] == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="empty"):
        analysis.relative_movement(model, start, {"none": []})


def test_cls_row_and_concentration():
    model = encoder()
    ids = torch.tensor([[2, 5, 6, 7, 3, 0], [2, 9, 3, 0, 0, 0]])
    mask = (ids != 0).long()
    row = analysis.cls_row(model, ids, mask)
    torch.testing.assert_close(row.nansum(dim=1), torch.ones(2))
    assert torch.isnan(row[1, 3:]).all()
    entropy, top = analysis.concentration(row[1])
    p = row[1, :3].double().numpy()
    assert entropy == pytest.approx(-(p * np.log(p)).sum() / np.log(3)) and top == pytest.approx(p.max())
    assert analysis.concentration([0.25] * 4) == pytest.approx((1.0, 0.25))
    assert analysis.concentration([0.0, 1.0, 0.0]) == pytest.approx((0.0, 1.0))
    with pytest.raises(ValueError, match="probability"):
        analysis.concentration([0.5, 0.2])


def test_scale_free_sparsity_measures():
    spike = [torch.tensor([0.0, 0.0, 3.0]), torch.zeros(2, 3)]
    flat = [torch.full((10,), -2.0), torch.full((90,), 2.0)]
    assert analysis.top_share(spike, 0.01) == 1.0 and analysis.effective_density(spike) == 1 / 9
    assert abs(analysis.top_share(flat, 0.1) - 0.1) < 1e-12 and abs(analysis.effective_density(flat) - 1) < 1e-12
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000)
    scaled = [torch.tensor(x * 37.0)]
    assert abs(analysis.top_share([torch.tensor(x)], 0.05) - analysis.top_share(scaled, 0.05)) < 1e-12
    assert abs(analysis.effective_density([torch.tensor(x)]) - 2 / np.pi) < 0.05  # Gaussian: 2/pi
    with pytest.raises(ValueError, match="fraction"):
        analysis.top_share(spike, 0.0)


def test_late_change_compares_window_means_a_fraction_apart():
    flat = np.full(40, 0.5)
    assert analysis.late_change(flat) == 0.0
    falling = 1.0 / np.arange(1, 101)  # span 25, window 5: last five vs the five ending 25 earlier
    expected = falling[-5:].mean() / falling[-30:-25].mean() - 1
    assert analysis.late_change(falling) == pytest.approx(expected, rel=1e-12)
    assert analysis.late_change(falling, fraction=0.5, window=1) == pytest.approx(falling[-1] / falling[-51] - 1)
    noisy = 0.5 + 0.05 * np.resize([1.0, -1.0], 100)  # alternating noise: windowed means cancel it
    assert abs(analysis.late_change(noisy, window=2)) < 1e-12 and abs(analysis.late_change(noisy, window=1)) > 0.1
    assert np.isnan(analysis.late_change([1.0])) and np.isnan(analysis.late_change(np.ones(5), window=5))


def test_late_share_is_the_last_fraction_of_the_total_change():
    line = np.linspace(2.0, 1.0, 101)  # straight: the last quarter holds a quarter of the change (window 1)
    assert analysis.late_share(line, window=1) == pytest.approx(0.25)
    t = np.arange(1, 401.0)
    power = t ** -0.5  # relative change stays (3/4)^-0.5 - 1 per quarter; the share shrinks with length
    assert analysis.late_change(power[:100], window=1) == pytest.approx(analysis.late_change(power, window=1), abs=2e-3)
    assert analysis.late_share(power, window=1) < analysis.late_share(power[:100], window=1) < 0.25
    last, before = power[-5:].mean(), power[-105:-100].mean()
    assert analysis.late_share(power, window=5) == pytest.approx((last - before) / (last - power[0]), rel=1e-12)
    assert np.isnan(analysis.late_share(np.ones(40))) and np.isnan(analysis.late_share([3.0]))
    assert analysis.late_share([3.0, 2.0]) == 1.0  # two epochs: all of the change came in the last
