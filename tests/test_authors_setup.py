"""The authors' setup (PAPER.md 5a) against a reference written here from that description.

The reference models below are written independently of ``mdlib.models``, in plain torch, module by
module as the authors' public code builds them (construction order included, so that one seed gives
one set of initial weights). The SMD step is their formula, applied to the parameter itself each step.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mdlib.experiments import analysis, train
from mdlib.models import EncoderClassifier, VisionTransformer
from mdlib.optim import LpMirrorDescent


class RefAttention(nn.Module):
    def __init__(self, width, heads, dropout, out_bias=False, probability_dropout=True):
        super().__init__()
        self.attn_matrix = nn.Linear(width, 3 * width, bias=False)
        self.linear = nn.Linear(width, width, bias=out_bias)
        self.heads, self.p, self.probability_dropout = heads, dropout, probability_dropout

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.attn_matrix(x).split(C, 2))
        weight = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:  # queries and keys masked, the [CLS] key always visible; NaN rows -> 0
            both = mask.view(B, 1, T) & mask.view(B, T, 1)
            both[:, :, 0] = True
            weight = weight + torch.zeros(B, T, T, dtype=x.dtype).masked_fill(~both, -math.inf).view(B, 1, T, T)
        weight = torch.softmax(weight, -1).nan_to_num(0)
        if self.probability_dropout:
            weight = F.dropout(weight, self.p, self.training)
        y = (weight @ v).transpose(1, 2).reshape(B, T, C)
        return F.dropout(self.linear(y), self.p, self.training)


class RefEncoder(nn.Module):
    """The authors' sentiment classifier: post-LN, no biases, sigmoid output."""

    def __init__(self, vocab, length, width, layers, mlp, dropout):
        super().__init__()
        self.emb_static = nn.Embedding(vocab, width)
        self.emb_pos = nn.Embedding(length, width)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            block = nn.Module()
            block.ln1 = nn.LayerNorm(width, bias=False)
            block.attn = RefAttention(width, layers, dropout)
            block.ln2 = nn.LayerNorm(width, bias=False)
            block.lin1 = nn.Linear(width, mlp, bias=False)
            block.lin2 = nn.Linear(mlp, width, bias=False)
            self.blocks.append(block)
        self.lin = nn.Linear(width, 1, bias=False)
        self.p = dropout

    def forward(self, ids):
        B, T = ids.shape
        mask = ids != 0
        x = self.emb_static(ids) + self.emb_pos(torch.arange(T))
        for b in self.blocks:
            x = b.ln1(x + b.attn(x, mask))
            x = b.ln2(x + F.dropout(b.lin2(F.gelu(b.lin1(x))), self.p, self.training))
        return torch.sigmoid(self.lin(x[:, 0])).flatten()

    def mine(self) -> dict[str, torch.Tensor]:
        """The parameters under mdlib.models.EncoderClassifier's names."""
        names = {"token.weight": self.emb_static.weight, "position.weight": self.emb_pos.weight,
                 "classifier.weight": self.lin.weight}
        for i, b in enumerate(self.blocks):
            names |= {f"blocks.{i}.attention.qkv.weight": b.attn.attn_matrix.weight,
                      f"blocks.{i}.attention.out.weight": b.attn.linear.weight,
                      f"blocks.{i}.norm1.weight": b.ln1.weight, f"blocks.{i}.norm2.weight": b.ln2.weight,
                      f"blocks.{i}.mlp.0.weight": b.lin1.weight, f"blocks.{i}.mlp.2.weight": b.lin2.weight}
        return names


class RefViT(nn.Module):
    """The authors' (lucidrains-style) ViT: patches flattened (row, column, channel), positions and
    [CLS] N(0, 1), pre-norm blocks, an output map with bias."""

    def __init__(self, image, patch, channels, classes, width, depth, heads, mlp, dropout, emb_dropout):
        super().__init__()
        self.patch, self.n = patch, (image // patch) ** 2
        self.to_patch_embedding = nn.Linear(channels * patch * patch, width)
        self.pos_embedding = nn.Parameter(torch.randn(1, self.n + 1, width))
        self.cls_token = nn.Parameter(torch.randn(1, 1, width))
        self.layers = nn.ModuleList()
        for _ in range(depth):
            layer = nn.Module()
            layer.norm1 = nn.LayerNorm(width)
            layer.attn = RefAttention(width, heads, dropout, out_bias=True, probability_dropout=False)
            layer.norm2 = nn.LayerNorm(width)
            layer.ff = nn.Sequential(nn.Linear(width, mlp), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp, width),
                                     nn.Dropout(dropout))
            self.layers.append(layer)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))
        self.emb_dropout = emb_dropout

    def forward(self, img):
        B, C, H, W = img.shape
        p = self.patch
        x = img.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1).reshape(B, self.n, -1)
        x = torch.cat([self.cls_token.expand(B, -1, -1), self.to_patch_embedding(x)], 1) + self.pos_embedding
        x = F.dropout(x, self.emb_dropout, self.training)
        for layer in self.layers:
            x = x + layer.attn(layer.norm1(x))
            x = x + layer.ff(layer.norm2(x))
        return self.head(x[:, 0])


def smd_step(model: nn.Module, lr: float, p: float) -> None:
    """The authors' SMD step on every parameter: w <- m^-1(m(w) - lr g)."""
    with torch.no_grad():
        for w in model.parameters():
            u = torch.sign(w) * w.abs() ** (p - 1) - lr * w.grad
            w.copy_(torch.sign(u) * u.abs() ** (1 / (p - 1)))


SMALL = dict(vocab_size=40, max_length=12, width=12, layers=3, heads=3, mlp=48, dropout=0.2)


def both_encoders(seed=0, **kw):
    s = {**SMALL, **kw}
    torch.manual_seed(seed)
    mine = EncoderClassifier(**s)
    torch.manual_seed(seed)
    ref = RefEncoder(s["vocab_size"], s["max_length"], s["width"], s["layers"], s["mlp"], s["dropout"])
    return mine, ref


def padded_batch(n=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 11, (n,), generator=g)
    ids = torch.zeros(n, 10, dtype=torch.long)
    for i, length in enumerate(lengths):
        ids[i, :length] = torch.randint(4, 40, (int(length),), generator=g)
        ids[i, 0] = 1  # [CLS]
    return ids, (ids != 0).long(), torch.randint(0, 2, (n,), generator=g).float()


def test_encoder_initial_weights_and_output_equal_the_authors():
    mine, ref = both_encoders()
    state = mine.state_dict()
    assert set(state) == set(ref.mine())
    for name, value in ref.mine().items():
        assert torch.equal(state[name], value), name  # same seed, same draws, same order
    ids, mask, _ = padded_batch()
    torch.testing.assert_close(torch.sigmoid(mine.eval()(ids, mask)), ref.eval()(ids), rtol=1e-5, atol=1e-6)


def test_encoder_dropout_sites_are_the_authors():
    mine = EncoderClassifier(**SMALL)
    attention = mine.blocks[0].attention
    assert attention.attention_dropout == 0.2 and attention.dropout.p == 0.2  # probabilities, residual branch
    assert mine.blocks[0].mlp[-1].p == 0.2 and mine.dropout.p == 0.0  # MLP branch; none on the embeddings
    assert mine.classifier.bias is None
    modern = EncoderClassifier(**SMALL, setup="modern")
    assert modern.blocks[0].attention.attention_dropout == 0.0 and modern.dropout.p == 0.2
    assert modern.classifier.bias is not None


@pytest.mark.parametrize("layers", [3, 4, 6])
def test_paper_scale_shapes_equal_the_authors(layers):
    torch.manual_seed(0)
    mine = EncoderClassifier(layers=layers, heads=layers)
    ref = RefEncoder(30522, 512, 384, layers, 1536, 0.2)
    shapes = {name: tuple(v.shape) for name, v in mine.state_dict().items()}
    assert shapes == {name: tuple(v.shape) for name, v in ref.mine().items()}
    assert sum(p.numel() for p in mine.parameters()) == sum(p.numel() for p in ref.parameters())


def test_paper_scale_initialization_statistics():
    torch.manual_seed(0)
    model = EncoderClassifier(layers=3, heads=3)
    assert abs(model.token.weight.std().item() - 1) < 0.01 and abs(model.position.weight.std().item() - 1) < 0.01
    for module in model.modules():
        if isinstance(module, nn.Linear):
            bound = 1 / math.sqrt(module.in_features)
            assert module.weight.abs().max().item() <= bound
            assert module.weight.abs().max().item() > 0.99 * bound  # uniform up to the bound
    kqv = [w for ws in model.attention_weights().values() for w in ws]
    assert analysis.count_above(kqv, 0.06) == 0  # 1/sqrt(384) = 0.051: every large entry has grown
    modern = EncoderClassifier(layers=3, heads=3, setup="modern")
    assert abs(modern.token.weight.std().item() - 0.02) < 0.001
    q = modern.attention_weights()["query"][0]
    assert abs(q.std().item() - math.sqrt(1 / 384)) < 0.002  # Glorot normal of a (384, 384) block


class Pairs(torch.utils.data.Dataset):
    def __init__(self, ids, mask, labels):
        self.items = [({"input_ids": i, "attention_mask": m}, y) for i, m, y in zip(ids, mask, labels)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


@pytest.mark.parametrize("p", [1.1, 2.0, 3.0])
def test_one_training_step_equals_the_authors_update(p):
    """fit (summed BCE, LpMirrorDescent) vs BCELoss(sum) on sigmoid outputs and the SMD formula, in
    float64 with dropout off: one step on one full batch."""
    mine, ref = both_encoders(dropout=0.0)
    mine, ref = mine.double(), ref.double()
    ids, mask, labels = padded_batch(n=8)
    lr = 1e-3
    train.fit(mine, LpMirrorDescent(mine.parameters(), lr=lr, p=p), Pairs(ids, mask, labels), None,
              train.FitOptions(epochs=1, batch_size=8, seed=0, loss="binary", reduction="sum"), progress=False,
              device="cpu")
    ref.train()
    loss = nn.BCELoss(reduction="sum")(ref(ids), labels.double())
    loss.backward()
    smd_step(ref, lr, p)
    state = mine.state_dict()
    moved = 0.0
    for name, value in ref.mine().items():
        torch.testing.assert_close(state[name], value.detach(), rtol=1e-9, atol=1e-12, msg=name)
        moved = max(moved, (state[name] - both_encoders(dropout=0.0)[0].double().state_dict()[name]).abs().max().item())
    assert moved > 1e-4  # the step did move the weights


def test_summed_loss_is_the_mean_times_the_batch():
    """reduction="sum" scales the gradient by the batch size and nothing else (p = 2: SGD)."""
    ids, mask, labels = padded_batch(n=8)
    after = {}
    for reduction, lr in (("mean", 8e-3), ("sum", 1e-3)):
        mine, _ = both_encoders(dropout=0.0)
        mine = mine.double()
        train.fit(mine, torch.optim.SGD(mine.parameters(), lr=lr), Pairs(ids, mask, labels), None,
                  train.FitOptions(epochs=1, batch_size=8, seed=0, reduction=reduction), progress=False, device="cpu")
        after[reduction] = mine.state_dict()
    for name in after["sum"]:
        torch.testing.assert_close(after["sum"][name], after["mean"][name], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="reduction must be one of"):
        train.FitOptions(epochs=1, batch_size=8, seed=0, reduction="total")


def test_vision_transformer_initial_weights_and_output_equal_the_authors():
    settings = dict(image_size=8, patch=4, channels=3, classes=5, width=16, depth=2, heads=4, mlp=32,
                    dropout=0.1, embedding_dropout=0.1)
    torch.manual_seed(0)
    mine = VisionTransformer(**settings)
    torch.manual_seed(0)
    ref = RefViT(8, 4, 3, 5, 16, 2, 4, 32, 0.1, 0.1)
    assert torch.equal(mine.position, ref.pos_embedding) and torch.equal(mine.cls, ref.cls_token)
    assert torch.equal(mine.embed.weight, ref.to_patch_embedding.weight)
    for block, layer in zip(mine.blocks, ref.layers):
        assert torch.equal(block.attention.qkv.weight, layer.attn.attn_matrix.weight)
        assert torch.equal(block.attention.out.bias, layer.attn.linear.bias)
        assert torch.equal(block.mlp[3].weight, layer.ff[3].weight)
    assert torch.equal(mine.head[1].weight, ref.head[1].weight)
    images = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(mine.eval()(images), ref.eval()(images), rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in mine.parameters()) == sum(p.numel() for p in ref.parameters())


def test_vision_transformer_paper_scale_initialization():
    torch.manual_seed(0)
    model = VisionTransformer()
    assert abs(model.position.std().item() - 1) < 0.01 and model.cls.abs().max() > 0.5
    modern = VisionTransformer(setup="modern")
    assert modern.cls.abs().max() == 0 and modern.position.std() < 0.03
