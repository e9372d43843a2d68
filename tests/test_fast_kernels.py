"""The CPU fast path of the models (dropout masks from ``models.dropout_mask``, attention as written)
against today's model: an independent functional re-implementation of the authors' encoder fed the
same dropout masks, and torch's own kernels (``models.reference_kernels``: SDPA and F.dropout)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mdlib import models
from mdlib.models import EncoderClassifier, VisionTransformer, dropout_mask, reference_kernels
from mdlib.optim import LpMirrorDescent


def encoder(dropout=0.2, setup="authors"):
    torch.manual_seed(0)
    return EncoderClassifier(vocab_size=60, max_length=12, width=12, layers=2, heads=3, mlp=48, dropout=dropout,
                             setup=setup)


def batches(count=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        lengths = torch.randint(3, 11, (8,), generator=g)
        ids = torch.randint(4, 60, (8, 10), generator=g)
        mask = torch.arange(10)[None] < lengths[:, None]
        ids[:, 0] = 1  # [CLS]
        out.append((ids.masked_fill(~mask, 0), mask.long(), torch.randint(0, 2, (8,), generator=g).float()))
    return out


def reference_forward(params, ids, mask, masks, heads, training):
    """The authors' post-LN encoder written out from its definition, dropout masks taken from ``masks``
    (an iterator of the masks the model drew, in order): token + position embeddings; per block
    x = LN(x + drop(W_o drop(softmax(q k^T / sqrt(d) - inf on padding keys)) v)), x = LN(x + drop(W_2
    GELU(W_1 x))); a linear classifier on position 0."""
    def drop(x):
        return x * next(masks) if training else x

    B, T = ids.shape
    x = params["token.weight"][ids] + params["position.weight"][:T]
    width = x.shape[-1]
    blocks = sorted({int(name.split(".")[1]) for name in params if name.startswith("blocks.")})
    for b in blocks:
        w = lambda name: params[f"blocks.{b}.{name}"]  # noqa: E731
        q, k, v = (x @ w("attention.qkv.weight").T).split(width, dim=-1)
        q, k, v = (t.reshape(B, T, heads, width // heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // heads)
        scores = scores.masked_fill(~mask.bool()[:, None, None, :], -math.inf)
        attended = drop(torch.softmax(scores, dim=-1)) @ v
        mixed = drop(attended.transpose(1, 2).reshape(B, T, width) @ w("attention.out.weight").T)
        x = F.layer_norm(x + mixed, (width,), w("norm1.weight"))
        hidden = F.gelu(x @ w("mlp.0.weight").T) @ w("mlp.2.weight").T
        x = F.layer_norm(x + drop(hidden), (width,), w("norm2.weight"))
    return (x[:, 0] @ params["classifier.weight"].T).squeeze(-1)


def recorded_masks(monkeypatch):
    """Record every mask ``dropout_mask`` returns, in order."""
    drawn = []
    original = models.dropout_mask

    def record(shape, p):
        mask = original(shape, p)
        drawn.append(mask)
        return mask
    monkeypatch.setattr(models, "dropout_mask", record)
    return drawn


def test_fast_path_equals_the_written_out_model_over_20_steps(monkeypatch):
    """Training mode, dropout 0.2, 20 steps of l_1.1 mirror descent on a summed BCE: equal losses to
    1e-5 relative and equal gradients (first step) to float tolerance, with the same masks."""
    drawn = recorded_masks(monkeypatch)
    model = encoder().train()
    params = {name: w.detach().clone().requires_grad_(True) for name, w in model.named_parameters()}
    fast_opt = LpMirrorDescent(model.parameters(), lr=1e-3, p=1.1)
    ref_opt = LpMirrorDescent(params.values(), lr=1e-3, p=1.1)
    for step, (ids, mask, y) in enumerate(batches()):
        start = len(drawn)
        fast = F.binary_cross_entropy_with_logits(model(ids, mask), y, reduction="sum")
        fast_opt.zero_grad()
        fast.backward()
        masks = iter(drawn[start:])
        ref = F.binary_cross_entropy_with_logits(reference_forward(params, ids, mask, masks, 3, True), y,
                                                 reduction="sum")
        assert next(masks, None) is None  # every mask drawn was used, in the same order
        ref_opt.zero_grad()
        ref.backward()
        assert fast.item() == pytest.approx(ref.item(), rel=1e-5), step
        if step == 0:
            for name, w in model.named_parameters():
                torch.testing.assert_close(w.grad, params[name].grad, rtol=1e-4, atol=1e-6, msg=name)
        fast_opt.step()
        ref_opt.step()
    assert len(drawn) == 20 * 2 * 3  # per block: attention probabilities, attention output, MLP output


@pytest.mark.parametrize("setup", ["authors", "modern"])
def test_fast_path_equals_torch_kernels_without_dropout(setup):
    """Training mode without dropout: the fast path and torch's SDPA path give the same losses over 20
    steps and the same gradients."""
    fast, slow = encoder(0.0, setup).train(), encoder(0.0, setup).train()
    opts = [LpMirrorDescent(m.parameters(), lr=1e-3, p=1.1) for m in (fast, slow)]
    for ids, mask, y in batches():
        losses = []
        for model, opt, reference in ((fast, opts[0], False), (slow, opts[1], True)):
            with reference_kernels() if reference else torch.enable_grad():
                loss = F.binary_cross_entropy_with_logits(model(ids, mask), y, reduction="sum")
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        for (name, a), b in zip(fast.named_parameters(), slow.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
        for opt in opts:
            opt.step()


def test_vision_transformer_fast_path_equals_torch_kernels():
    torch.manual_seed(0)
    model = VisionTransformer(image_size=8, patch=4, channels=1, classes=5, width=16, depth=2, heads=4, mlp=32,
                              dropout=0.0, embedding_dropout=0.0).train()
    images = torch.randn(6, 1, 8, 8)
    fast = model(images)
    with reference_kernels():
        slow = model(images)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


def test_dropout_mask_distribution_and_seeding():
    torch.manual_seed(3)
    mask = dropout_mask((400, 500), 0.2)
    keep = round(0.8 * 65536) / 65536
    assert mask.dtype == torch.float32 and mask.unique().tolist() == [0.0, pytest.approx(1 / keep)]
    kept = (mask > 0).double().mean().item()
    assert abs(kept - keep) < 4 * math.sqrt(keep * (1 - keep) / mask.numel())  # 4 standard errors
    assert abs(mask.double().mean().item() - 1) < 4 * math.sqrt((1 - keep) / keep / mask.numel())
    torch.manual_seed(3)
    again = dropout_mask((400, 500), 0.2)
    assert torch.equal(mask, again)  # seeded by torch's generator
    state = torch.get_rng_state()
    first = dropout_mask((50, 7), 0.1)
    torch.set_rng_state(state)  # a checkpoint's RNG state resumes the masks
    assert torch.equal(first, dropout_mask((50, 7), 0.1))
    assert not torch.equal(first, dropout_mask((50, 7), 0.1))  # consecutive draws differ
    # neighbouring entries and consecutive calls are uncorrelated
    a, b = (dropout_mask((200_000,), 0.5).numpy() > 0 for _ in range(2))
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.02 and abs(np.corrcoef(a, b)[0, 1]) < 0.02


def test_dropout_modes():
    x = torch.randn(30, 20)
    assert models.dropout(x, 0.2, training=False) is x and models.dropout(x, 0.0) is x
    out = models.dropout(x, 0.2)
    dropped = out == 0
    torch.testing.assert_close(out[~dropped], x[~dropped] / (round(0.8 * 65536) / 65536))
    with reference_kernels():  # torch's own dropout: scale 1 / 0.8 exactly
        ref = models.dropout(x, 0.2)
    torch.testing.assert_close(ref[ref != 0], x[ref != 0] / 0.8)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        models.dropout(x, 1.0)
    half = models.dropout(x.double(), 0.5)
    assert half.dtype == torch.float64
