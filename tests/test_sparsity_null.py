"""The init-weighting null of ΔW (mdlib.experiments.sparsity_null): the null against numpy float64 and the
first-order theory, its pairing with each model's own initialization, and, by simulation, the verdict it
feeds (estimates.weighting_gap, rules.weighting_rule): "no sparser" when ΔW is exactly the init
weighting of an unstructured dual change, "sparser" when the dual change itself is concentrated."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdlib.book.scorecard import rules
from mdlib.book.scorecard.rules import DIFFERS, HOLDS, SMALLER
from mdlib.experiments import estimates, sparsity, sparsity_null
from mdlib.mirror import inverse_mirror_map, mirror_map
from mdlib.models import EncoderClassifier

UNIFORM_WEIGHTING = 2.8 / 1.9 ** 2  #: the effective density of |w|^0.9 for w uniform on (-a, a)


def density(arrays) -> float:
    x = np.concatenate([np.ravel(a) for a in arrays])
    return float(np.abs(x).sum() ** 2 / (x.size * (x ** 2).sum()))


def reference(before, dual, p, noises) -> float:
    """The null in numpy float64, written from its definition: per matrix, ξ = z sqrt(mean Δu²),
    ΔW = sign(v)|v|^(1/(p-1)) - W(0) with v = sign(W(0))|W(0)|^(p-1) + ξ; the mean density over draws."""
    values = []
    for draw in noises:
        change = []
        for w0, u, z in zip(before, dual, draw):
            v = np.sign(w0) * np.abs(w0) ** (p - 1) + np.sqrt(np.mean(u ** 2)) * z
            change.append(np.sign(v) * np.abs(v) ** (1 / (p - 1)) - w0)
        values.append(density(change))
    return float(np.mean(values))


@pytest.mark.parametrize("p", [1.1, 1.75, 2.0, 3.0])
def test_null_density_matches_numpy_float64(p):
    rng = np.random.default_rng(1)
    before = [rng.uniform(-0.2, 0.2, (5, 7)), rng.uniform(-0.2, 0.2, (3, 4))]
    dual = [0.05 * rng.standard_normal((5, 7)), 0.5 * rng.standard_normal((3, 4))]  # the second far from first order
    noises = [[rng.standard_normal(w.shape) for w in before] for _ in range(3)]
    got = sparsity_null.null_density([torch.from_numpy(w) for w in before], [torch.from_numpy(u) for u in dual], p,
                                     [[torch.from_numpy(z) for z in draw] for draw in noises])
    assert got == pytest.approx(reference(before, dual, p, noises), rel=1e-10)
    assert math.isnan(sparsity_null.null_density([torch.from_numpy(w) for w in before],
                                                 [torch.from_numpy(u) for u in dual], p, []))


def test_weighting_null_takes_the_dual_change_and_its_seeded_noise():
    """From W(0) and W: the dual change m(W) - m(W(0)) sets each matrix's scale; the noise is numpy's
    default_rng(seed), draw by draw and matrix by matrix, so one seed gives one null on every machine."""
    rng = np.random.default_rng(2)
    before = [rng.uniform(-0.2, 0.2, (6, 6)), rng.uniform(-0.2, 0.2, (6, 2))]
    dual = [1e-2 * rng.standard_normal(w.shape) for w in before]
    after = [np.sign(v) * np.abs(v) ** 10 for v in (np.sign(w) * np.abs(w) ** 0.1 + u for w, u in zip(before, dual))]
    draws = np.random.default_rng(7)
    noises = [[draws.standard_normal(w.shape) for w in before] for _ in range(4)]
    got = sparsity_null.weighting_null([torch.from_numpy(w) for w in before], [torch.from_numpy(w) for w in after],
                                       1.1, draws=4, seed=7)
    assert got == pytest.approx(reference(before, dual, 1.1, noises), rel=1e-8)
    again = sparsity_null.weighting_null([torch.from_numpy(w) for w in before], [torch.from_numpy(w) for w in after],
                                         1.1, draws=4, seed=8)
    assert again != got


def test_first_order_null_is_the_weighting_times_gaussian_noise():
    """Small dual changes: ΔW_null ≈ |W(0)|^0.9 ξ / 0.1, whose density for W(0) uniform is the weighting's,
    2.8 / 1.9², times the Gaussian's, 2/π (a product of independent factors); a matrix whose dual did not
    move adds zeros (twice the entries, half the density); the dual change's scale does not matter."""
    torch.manual_seed(0)
    before = [(2 * torch.rand(96, 96, dtype=torch.float64) - 1) / 96 ** 0.5 for _ in range(6)]
    after = [inverse_mirror_map(mirror_map(w, 1.1) + 1e-5 * torch.randn_like(w), 1.1) for w in before]
    null = sparsity_null.weighting_null(before, after, 1.1)
    assert null == pytest.approx(UNIFORM_WEIGHTING * 2 / math.pi, abs=0.005)
    assert sparsity_null.weighting_null(before, before[:3] + after[3:], 1.1) == pytest.approx(null / 2, abs=0.005)
    larger = [inverse_mirror_map(mirror_map(w, 1.1) + 1e-3 * torch.randn_like(w), 1.1) for w in before]
    assert sparsity_null.weighting_null(before, larger, 1.1) == pytest.approx(null, abs=0.005)
    gd = sparsity_null.weighting_null(before, [w + 1e-3 * torch.randn_like(w) for w in before], 2.0)
    assert gd == pytest.approx(2 / math.pi, abs=0.005)  # p = 2: no weighting, Gaussian noise


def encoder(seed: int, width: int = 48) -> EncoderClassifier:
    torch.manual_seed(seed)
    return EncoderClassifier(vocab_size=40, max_length=8, width=width, layers=2, heads=2, mlp=12).eval()


def moved(start: EncoderClassifier, dual, seed: int) -> EncoderClassifier:
    """An ℓ1.1 model whose fused q/k/v matrices moved in the dual by ``dual(w0, generator)``, exactly:
    W = m⁻¹(m(W(0)) + Δu) (float32 weights, computed in float64)."""
    model = encoder(seed, start.blocks[0].attention.qkv.weight.shape[1])
    model.load_state_dict(start.state_dict())
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for block in model.blocks:
            w0 = block.attention.qkv.weight.double()
            block.attention.qkv.weight.copy_(inverse_mirror_map(mirror_map(w0, 1.1) + dual(w0, generator), 1.1).float())
    return model


def noise(w0, generator):
    """Unstructured: independent Gaussian, the same scale everywhere."""
    return 1e-3 * torch.randn(w0.shape, generator=generator, dtype=torch.float64)


def concentrated(w0, generator):
    """Concentrated on a random 5 % of the entries, independent of W(0)."""
    return noise(w0, generator) * (torch.rand(w0.shape, generator=generator, dtype=torch.float64) < 0.05)


def aligned(w0, generator):
    """Dense, but larger where |W(0)| is (the entries the weighting favours)."""
    return noise(w0, generator) * w0.abs() / w0.abs().mean()


def spread(w0, generator):
    """Denser than noise: the same magnitude everywhere, random signs."""
    return 1e-3 * torch.sign(torch.randn(w0.shape, generator=generator, dtype=torch.float64))


def judged(dual, seeds=range(6)):
    """The K/Q/V verdict against the init-weighting null of ℓ1.1 models moved by ``dual``, one per seed, as
    chapter 06 and the scorecard compute it; and the estimate."""
    initial = {s: encoder(s) for s in seeds}
    models = {("1.1", s): moved(initial[s], dual, s) for s in seeds}
    change = sparsity.change_table(models, initial).merge(sparsity_null.null_table(models, initial))
    gap = estimates.weighting_gap(change)
    paper = rules.KQV_PAPER_REDUCTION * change.weighting_null_density.mean()
    return rules.weighting_rule(gap.low, gap.high, gap.n, paper_effect=paper), gap, change


def test_weighting_times_unstructured_noise_reads_no_sparser():
    """ΔW exactly the init weighting of an unstructured dense dual change: the null is true (ΔW's density is
    its null's, up to sampling), and the verdict reads no sparser than the weighting predicts, its interval
    excluding the paper's effect (a 95 % interval: under the null, 1 build in 40 reads sparser; these seeds
    are not that one). A dual change denser than noise is denser than its null. Yet ΔW is sparser than its
    own dual change: the weighting's doing, which the null keeps."""
    verdict, gap, change = judged(noise)
    assert gap.n == 6 and abs(gap.value) < 0.01
    assert verdict.outcome in (SMALLER, DIFFERS) and verdict.why.startswith("no sparser than its init weighting")
    assert gap.low > rules.KQV_PAPER_REDUCTION * change.weighting_null_density.mean()
    assert (change.effective_density < change.dual_density - 0.1).all()  # the weighting alone: ~0.78 x
    verdict, gap, _ = judged(spread)
    assert verdict.outcome == DIFFERS and verdict.why.startswith("no sparser") and gap.low > 0


def test_the_null_follows_the_exact_map_far_from_first_order():
    """A dual change as large as m(W(0)) itself: m⁻¹ (a tenth power) concentrates ΔW far beyond the first-order
    weighting, and the null, which uses the exact map, predicts it (the first-order product does not)."""
    def large(w0, generator):
        return 0.3 * torch.randn(w0.shape, generator=generator, dtype=torch.float64)

    _, gap, change = judged(large)
    assert (change.effective_density < 0.1).all() and (change.null_density > 0.4).all()
    assert abs(gap.value) < 0.01 and change.weighting_null_density.mean() < 0.1


@pytest.mark.parametrize("dual", [concentrated, aligned])
def test_a_concentrated_dual_change_reads_sparser(dual):
    """A dual change concentrated on few entries, or on those the weighting favours: sparser than the weighting
    predicts, by more than the paper's effect."""
    verdict, gap, change = judged(dual)
    assert verdict.outcome == HOLDS and verdict.why == "sparser than its init weighting predicts"
    assert gap.high < rules.KQV_PAPER_REDUCTION * change.weighting_null_density.mean()


def test_null_table_pairs_each_model_with_its_own_initialization():
    """One row per model, at its method's exponent (GD: the identity), against its seed's initialization,
    all K/Q/V matrices together; seeded, so the same on a second call."""
    initial = {s: encoder(s) for s in (0, 1)}
    models = {("1.1", s): moved(initial[s], noise, s) for s in (0, 1)}
    gd = encoder(0)
    gd.load_state_dict(initial[0].state_dict())
    with torch.no_grad():
        gd.blocks[1].attention.qkv.weight += 1e-3  # only the last of the two layers moves
    models["2", 0] = gd
    table = sparsity_null.null_table(models, initial)
    assert table[["method", "seed"]].values.tolist() == [["1.1", 0], ["1.1", 1], ["2", 0]]
    pairs = [(initial[s].attention_weights(), m.attention_weights()) for (_, s), m in models.items()]
    expected = [sparsity_null.weighting_null([w for k in sparsity.KINDS for w in a[k]],
                                             [w for k in sparsity.KINDS for w in b[k]], p, seed=seed)
                for (a, b), p, seed in zip(pairs, (1.1, 1.1, 2.0), (sparsity_null._seed(0, 0), sparsity_null._seed(0, 1),
                                                                       sparsity_null._seed(0, 0)))]
    assert table.weighting_null_density.tolist() == pytest.approx(expected, rel=1e-12)
    assert table.weighting_null_density.iloc[2] == pytest.approx(2 / math.pi / 2, abs=0.02)  # half the matrices move
    assert sparsity_null.null_table(models, initial).equals(table)
    assert table.weighting_null_density.iloc[0] != table.weighting_null_density.iloc[1]
