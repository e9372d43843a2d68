r"""The paper's models.

Single-head attention classifier (experiments E1-E3), for example i with tokens X_i (T x d), a
comparison token z_i (d) and label y_i in {-1, +1}:

    f(X_i, z_i) = v^T X_i^T softmax(X_i W z_i),    L(W, v) = mean_i log(1 + exp(-y_i f(X_i, z_i)))

(softmax over the T tokens, no 1/sqrt(d) scaling). Everything accepts leading batch dimensions that
index independent trials: W (*B, d, d), v (*B, d), X (*B, n, T, d), z (*B, n, d), y (*B, n).
The synthetic data generators of E1 (Gaussian, unit-norm tokens) and the fixed data of E3 are here.

The encoder classifier of the sentiment experiments (E4-E6): a post-LN transformer without biases
whose attention maps and query/key/value weights can be read out; and the vision transformer of E7
(pre-LN, [CLS] pooling), with the same attention module.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = [
    "SyntheticData",
    "attention_logits",
    "single_head_output",
    "logistic_loss",
    "SingleHeadAttention",
    "gaussian_instances",
    "joint_training_data",
    "SETUPS",
    "VISION_SETUPS",
    "check_setup",
    "reference_kernels",
    "dropout_mask",
    "dropout",
    "Dropout",
    "SelfAttention",
    "EncoderBlock",
    "EncoderClassifier",
    "PreNormBlock",
    "VisionTransformer",
]


@dataclass(frozen=True)
class SyntheticData:
    """A batch of single-head attention problems: X (B, n, T, d), z (B, n, d), y (B, n), v (B, d)."""

    X: Tensor
    z: Tensor
    y: Tensor
    v: Tensor

    @property
    def trials(self) -> int:
        return self.X.shape[0]

    def trial(self, b: int) -> "SyntheticData":
        """Trial ``b`` as a batch of one."""
        return SyntheticData(self.X[b:b + 1], self.z[b:b + 1], self.y[b:b + 1], self.v[b:b + 1])

    def numpy(self) -> dict:
        return {name: getattr(self, name).numpy() for name in ("X", "z", "y", "v")}


def attention_logits(W: Tensor, X: Tensor, z: Tensor) -> Tensor:
    r"""The attention logits :math:`s_{it} = x_{it}^\top W z_i`, shape ``(*B, n, T)``."""
    return torch.einsum("...ntd,...de,...ne->...nt", X, W, z)


def single_head_output(W: Tensor, v: Tensor, X: Tensor, z: Tensor) -> Tensor:
    r"""The model's output :math:`f_i = v^\top X_i^\top \operatorname{softmax}(X_i W z_i)`, shape ``(*B, n)``."""
    attention = torch.softmax(attention_logits(W, X, z), dim=-1)
    return torch.einsum("...nt,...ntd,...d->...n", attention, X, v)


def logistic_loss(W: Tensor, v: Tensor, X: Tensor, y: Tensor, z: Tensor) -> Tensor:
    r"""The logistic loss :math:`L = \frac1n \sum_i \log(1 + e^{-y_i f_i})` per trial, shape ``(*B)``."""
    return F.softplus(-y * single_head_output(W, v, X, z)).mean(dim=-1)


class SingleHeadAttention(nn.Module):
    r""":math:`f(X, z) = v^\top X^\top \operatorname{softmax}(X W z)` as a torch module, for ``LpMirrorDescent`` and autograd.

    ``trials`` independent copies are held in one batched parameter (W: (trials, d, d)).
    With ``train_decoder=False`` the decoder v is a fixed buffer (experiments E1, E2).
    """

    def __init__(self, W: Tensor, v: Tensor, train_decoder: bool = False):
        super().__init__()
        if W.shape[-1] != W.shape[-2] or W.shape[:-1] != v.shape:
            raise ValueError(f"W must be (..., d, d) and v (..., d); got {tuple(W.shape)} and {tuple(v.shape)}")
        self.W = nn.Parameter(W.clone())
        if train_decoder:
            self.v = nn.Parameter(v.clone())
        else:
            self.register_buffer("v", v.clone())

    def forward(self, X: Tensor, z: Tensor) -> Tensor:
        """The outputs :func:`single_head_output` of every trial, shape ``(trials, n)``."""
        return single_head_output(self.W, self.v, X, z)

    def loss(self, X: Tensor, y: Tensor, z: Tensor) -> Tensor:
        """Sum over trials of each trial's mean logistic loss (so each trial gets its own gradient)."""
        return logistic_loss(self.W, self.v, X, y, z).sum()


def _unit_gaussian(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True)).to(dtype)


def gaussian_instances(trials: int, n: int = 6, T: int = 8, d: int = 10, seed: int = 0,
                       dtype: torch.dtype = torch.float64) -> SyntheticData:
    """E1 data: every token x_it, every comparison token z_i and the decoder v drawn N(0, I_d) and
    scaled to unit l2 norm; labels uniform on {-1, +1}. Trial b is drawn from seed ``seed + b``
    alone, so a trial's data does not depend on how many trials are batched with it."""
    if min(trials, n, T, d) < 1 or T < 2:
        raise ValueError(f"need trials, n, d >= 1 and T >= 2; got trials={trials}, n={n}, T={T}, d={d}")
    parts = []
    for b in range(trials):
        g = torch.Generator().manual_seed(seed + b)
        X = _unit_gaussian((n, T, d), g, dtype)
        z = _unit_gaussian((n, d), g, dtype)
        v = _unit_gaussian((d,), g, dtype)
        y = (torch.randint(0, 2, (n,), generator=g) * 2 - 1).to(dtype)
        parts.append((X, z, y, v))
    X, z, y, v = (torch.stack(items) for items in zip(*parts))
    return SyntheticData(X=X, z=z, y=y, v=v)


def joint_training_data(dtype: torch.dtype = torch.float64) -> SyntheticData:
    """E3's fixed instance (n = 2, T = 3, d = 2), z_i = the first token of X_i, v = 0 (trained)."""
    X = torch.tensor([[[-2.7, 1.2], [1.4, 2.1], [1.3, -0.1]],
                      [[0.4, -2.2], [-1.1, -0.4], [0.9, 0.1]]], dtype=dtype)
    y = torch.tensor([1.0, -1.0], dtype=dtype)
    return SyntheticData(X=X[None], z=X[None, :, 0, :].clone(), y=y[None], v=torch.zeros(1, 2, dtype=dtype))


#: Initializations of the real-data models: "authors" reproduces the authors' public code (torch's
#: defaults: N(0, 1) token and position embeddings, U(±1/sqrt(fan_in)) matrices), "modern" the
#: project's earlier choice (BERT-style embeddings, Glorot-normal matrices). "small-embeddings" (the
#: text encoder only) changes one factor of the authors' setup: embeddings drawn N(0, sigma^2), sigma 0.02
#: unless ``EncoderClassifier(embedding_std=...)`` says otherwise.
SETUPS = ("authors", "small-embeddings", "modern")
#: The setups of the vision transformer (no single-factor variant there).
VISION_SETUPS = ("authors", "modern")
#: The standard deviation of the token and position embeddings of "small-embeddings" and "modern" (BERT's).
SMALL_EMBEDDING_STD = 0.02


def check_setup(setup: str, setups: tuple[str, ...] = SETUPS) -> None:
    if setup not in setups:
        raise ValueError(f"unknown setup {setup!r}; choose one of {', '.join(setups)}")


_reference = threading.local()


@contextlib.contextmanager
def reference_kernels() -> Iterator[None]:
    """Within the block (in this thread), the models use torch's own kernels on every device:
    ``torch.nn.functional.dropout`` and ``scaled_dot_product_attention``, the implementation before the
    CPU fast path (:func:`dropout`, attention as written). The same functions up to float rounding and
    the draw of the dropout masks; for the tests and ``python -m mdlib bench training``."""
    before = getattr(_reference, "on", False)
    _reference.on = True
    try:
        yield
    finally:
        _reference.on = before


def _fast_path(x: Tensor) -> bool:
    return x.device.type == "cpu" and not getattr(_reference, "on", False)


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A float32 inverted-dropout mask on the CPU: each entry 1 / q with probability q and 0 otherwise,
    where q = round((1 - p) 2^16) / 2^16 is the keep probability 1 - p rounded to 16 bits (0.8000031
    for p = 0.2), so that E[mask] = 1 exactly. The entries come from 16-bit uniform integers of a numpy
    SFC64 generator seeded by one draw from torch's global generator: ``torch.manual_seed`` makes the
    masks reproducible and a checkpoint of torch's RNG state resumes them. (On the CPU, torch's
    Bernoulli draws cost more than the rest of a small model's dropout layers together.)"""
    threshold = round((1 - p) * 65536)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    count = math.prod(shape)
    draws = np.frombuffer(np.random.Generator(np.random.SFC64(seed)).bytes(2 * count), dtype=np.uint16)
    mask = np.multiply(draws < threshold, np.float32(65536 / threshold), dtype=np.float32)
    return torch.from_numpy(mask).view(shape)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of rate ``p``: ``x * dropout_mask(x.shape, p)`` on the CPU (float32 and
    float64), ``torch.nn.functional.dropout`` elsewhere (and under :func:`reference_kernels`); the
    identity when not training or p = 0."""
    if not training or p == 0:
        return x
    if not 0 < p < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not _fast_path(x) or x.dtype not in (torch.float32, torch.float64):
        return F.dropout(x, p, training=True)
    return x * dropout_mask(x.shape, p).to(x.dtype)


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its masks with :func:`dropout` (fast on the CPU)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class SelfAttention(nn.Module):
    """Multi-head self-attention: one fused query/key/value map ``qkv`` = Linear(width, 3 width) without
    bias (rows: queries, keys, values), scaled dot products softmax(q k^T / sqrt(d_head)), padding keys
    masked out, dropout ``attention_dropout`` on the attention probabilities, an output map (bias
    ``out_bias``) and dropout ``dropout`` on the result. On the CPU (or with ``return_attention``) the
    attention is computed as written; elsewhere (and under :func:`reference_kernels`) by
    ``scaled_dot_product_attention``, the same function up to float rounding, with torch's own dropout."""

    def __init__(self, width: int, heads: int, dropout: float, attention_dropout: float = 0.0,
                 out_bias: bool = False):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by the number of heads {heads}")
        self.heads, self.width, self.attention_dropout = heads, width, attention_dropout
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=out_bias)
        self.dropout = Dropout(dropout)

    def _split(self, x: Tensor) -> Tensor:
        B, T, width = x.shape
        return x.reshape(B, T, self.heads, width // self.heads).transpose(1, 2)  # (B, heads, T, dh)

    def weights(self) -> dict[str, Tensor]:
        """The query, key and value matrices (width, width): views of the rows of ``qkv.weight``."""
        return dict(zip(("query", "key", "value"), self.qkv.weight.split(self.width)))

    def forward(self, x: Tensor, key_mask: Tensor | None, return_attention: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """The attention output (B, T, width) and, with ``return_attention``, the maps (B, heads, T, T)."""
        q, k, v = (self._split(part) for part in self.qkv(x).split(self.width, dim=-1))
        p = self.attention_dropout if self.training else 0.0
        attention, bias = None, None
        if key_mask is not None:  # (B, T) True for real tokens -> additive -inf on padding keys
            bias = torch.zeros(key_mask.shape, dtype=x.dtype, device=x.device).masked_fill(~key_mask, -torch.inf)
            bias = bias[:, None, None, :]
        if return_attention or _fast_path(x):
            scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
            attention = torch.softmax(scores if bias is None else scores + bias, dim=-1)
            mixed = dropout(attention, p) @ v
        else:
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        B, _, T, _ = mixed.shape
        out = self.dropout(self.out(mixed.transpose(1, 2).reshape(B, T, -1)))
        return out, attention if return_attention else None


def _glorot_init(module: nn.Module) -> None:
    """The "modern" matrices: Glorot normal, each query/key/value block of a fused map on its own."""
    for child in module.modules():
        if isinstance(child, nn.Linear):
            nn.init.xavier_normal_(child.weight)
    for child in module.modules():
        if isinstance(child, SelfAttention):
            for block in child.weights().values():
                nn.init.xavier_normal_(block)


class EncoderBlock(nn.Module):
    """Post-LN transformer block without biases: x = LN(x + Attn(x)); x = LN(x + MLP(x)),
    MLP = Linear(width, mlp) -> GELU -> Linear(mlp, width) -> dropout."""

    def __init__(self, width: int, heads: int, mlp: int, dropout: float, attention_dropout: float = 0.0):
        super().__init__()
        self.attention = SelfAttention(width, heads, dropout, attention_dropout)
        self.norm1 = nn.LayerNorm(width, bias=False)
        self.mlp = nn.Sequential(nn.Linear(width, mlp, bias=False), nn.GELU(), nn.Linear(mlp, width, bias=False),
                                 Dropout(dropout))
        self.norm2 = nn.LayerNorm(width, bias=False)

    def forward(self, x: Tensor, key_mask: Tensor | None, return_attention: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """The block's output (B, T, width) and its attention maps (None without ``return_attention``)."""
        mixed, attention = self.attention(x, key_mask, return_attention)
        x = self.norm1(x + mixed)
        return self.norm2(x + self.mlp(x)), attention


class EncoderClassifier(nn.Module):
    """The sentiment model of experiments E4-E6: token + learned position embeddings, ``layers``
    post-LN blocks with ``heads`` heads, and a linear classifier on the first ([CLS]) token that
    returns one logit per sequence. Padding (``attention_mask`` 0) is masked out as attention keys.

    Paper scale: vocab 30,522, 512 positions, width 384, MLP 1536, dropout 0.2, layers = heads in
    {3, 4, 6}. ``setup="authors"`` is the authors' model as their code builds it: torch's default
    initialization (embeddings N(0, 1), matrices U(+-1/sqrt(fan_in))), dropout on the attention
    probabilities and on both residual branches, none on the embeddings, a classifier without bias.
    With the same seed its initial weights are those of the authors' code. ``setup="small-embeddings"``:
    the authors' model with one factor changed, token and position embeddings drawn N(0, sigma^2),
    sigma = ``embedding_std`` (None: 0.02, BERT's; 1.0 is the authors' scale, drawn afresh).
    ``setup="modern"``: embeddings N(0, 0.02^2) as BERT, Glorot-normal matrices, dropout on the
    embeddings and on both residual branches (not on the probabilities), a classifier with bias.
    """

    def __init__(self, vocab_size: int = 30522, max_length: int = 512, width: int = 384, layers: int = 3,
                 heads: int = 3, mlp: int = 1536, dropout: float = 0.2, setup: str = "authors",
                 embedding_std: float | None = None):
        super().__init__()
        check_setup(setup)
        if embedding_std is not None and (setup != "small-embeddings" or not 0 < embedding_std < math.inf):
            raise ValueError(f"embedding_std={embedding_std!r}: a finite standard deviation > 0, for setup "
                             f"'small-embeddings' only (got setup {setup!r}; the other setups fix their own)")
        authors = setup != "modern"  # the authors' layers, dropout and classifier
        self.setup = setup
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(max_length, width)
        self.dropout = Dropout(0.0 if authors else dropout)
        self.blocks = nn.ModuleList(EncoderBlock(width, heads, mlp, dropout, dropout if authors else 0.0)
                                    for _ in range(layers))
        self.classifier = nn.Linear(width, 1, bias=not authors)
        if setup != "authors":
            std = SMALL_EMBEDDING_STD if embedding_std is None else float(embedding_std)
            nn.init.normal_(self.token.weight, std=std)
            nn.init.normal_(self.position.weight, std=std)
        if not authors:
            _glorot_init(self)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, return_attention: bool = False
                ) -> Tensor | tuple[Tensor, list[Tensor | None]]:
        """Logits (B,); with ``return_attention`` also each layer's attention maps (B, heads, T, T)."""
        T = input_ids.shape[1]
        if T > self.position.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds the model's {self.position.num_embeddings} positions")
        positions = torch.arange(T, device=input_ids.device)
        x = self.dropout(self.token(input_ids) + self.position(positions))
        key_mask = None if attention_mask is None else attention_mask.bool()
        maps = []
        for block in self.blocks:
            x, attention = block(x, key_mask, return_attention)
            maps.append(attention)
        logits = self.classifier(x[:, 0]).squeeze(-1)
        return (logits, maps) if return_attention else logits

    def attention_weights(self) -> dict[str, list[Tensor]]:
        """The query, key and value weight matrices of every layer: {"query": [...], "key": [...],
        "value": [...]}, one (width, width) view per layer."""
        return _attention_weights(block.attention for block in self.blocks)

    def parameter_groups(self) -> dict[str, list[str]]:
        """The parameter names by role: embeddings (token, position), attention (query/key/value and
        output maps), mlp, norms (LayerNorm gains), classifier (weight and bias)."""
        return _groups(self, {"embeddings": ("token.", "position."), "classifier": ("classifier.",)})


def _groups(model: nn.Module, prefixes: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Parameter names by role: the ``prefixes`` given, then the blocks' attention, mlp and norms."""
    groups: dict[str, list[str]] = {"embeddings": [], "attention": [], "mlp": [], "norms": [], "classifier": []}
    norms = {f"{name}.{p}" for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)
             for p, _ in m.named_parameters(recurse=False)}
    for name, _ in model.named_parameters():
        role = next((g for g, starts in prefixes.items() if name.startswith(starts)), None)
        if role is None:
            role = "norms" if name in norms else "attention" if ".attention." in name else "mlp" if ".mlp." in name else None
        if role is None:
            raise ValueError(f"parameter {name!r} has no role")  # a new layer must be given one
        groups[role].append(name)
    return groups


def _attention_weights(attentions) -> dict[str, list[Tensor]]:
    maps = [a.weights() for a in attentions]
    return {kind: [m[kind] for m in maps] for kind in ("query", "key", "value")}


class PreNormBlock(nn.Module):
    """Pre-LN transformer block: x = x + Attn(LN(x)); x = x + MLP(LN(x)),
    MLP = Linear(width, mlp) -> GELU -> dropout -> Linear(mlp, width) -> dropout."""

    def __init__(self, width: int, heads: int, mlp: int, dropout: float, out_bias: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, dropout, out_bias=out_bias)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp), nn.GELU(), Dropout(dropout), nn.Linear(mlp, width),
                                 Dropout(dropout))

    def forward(self, x: Tensor, return_attention: bool = False) -> tuple[Tensor, Tensor | None]:
        """The block's output (B, T, width) and its attention maps (None without ``return_attention``)."""
        mixed, attention = self.attention(self.norm1(x), None, return_attention)
        x = x + mixed
        return x + self.mlp(self.norm2(x)), attention


class VisionTransformer(nn.Module):
    """The image classifier of experiment E7: non-overlapping ``patch`` x ``patch`` patches, linearly
    embedded, a learned [CLS] token and positions, embedding dropout, ``depth`` pre-LN blocks, and
    LayerNorm + Linear on the [CLS] output.

    Paper scale (CIFAR): 48 x 48 images, patch 4 (144 patches), width 512, depth 6, 8 heads of 64,
    MLP 512, dropout 0.1, embedding dropout 0.1. ``setup="authors"``: the authors' (lucidrains-style)
    model, positions and [CLS] token N(0, 1), torch's default Linear init, an output map with bias;
    with the same seed its initial weights are those of the authors' code. ``setup="modern"``: [CLS]
    token 0, positions N(0, 0.02^2), an output map without bias.
    """

    def __init__(self, image_size: int = 48, patch: int = 4, channels: int = 3, classes: int = 10,
                 width: int = 512, depth: int = 6, heads: int = 8, mlp: int = 512, dropout: float = 0.1,
                 embedding_dropout: float = 0.1, setup: str = "authors"):
        super().__init__()
        check_setup(setup, VISION_SETUPS)
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}")
        authors = setup == "authors"
        self.patch, self.channels, self.image_size, self.setup = patch, channels, image_size, setup
        patches = (image_size // patch) ** 2
        self.embed = nn.Linear(channels * patch * patch, width)
        if authors:  # drawn in the authors' order: positions, then the [CLS] token
            self.position = nn.Parameter(torch.randn(1, patches + 1, width))
            self.cls = nn.Parameter(torch.randn(1, 1, width))
        else:
            self.cls = nn.Parameter(torch.zeros(1, 1, width))
            self.position = nn.Parameter(torch.randn(1, patches + 1, width) * 0.02)
        self.dropout = Dropout(embedding_dropout)
        self.blocks = nn.ModuleList(PreNormBlock(width, heads, mlp, dropout, out_bias=authors) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, images: Tensor, return_attention: bool = False
                ) -> Tensor | tuple[Tensor, list[Tensor | None]]:
        """Logits (B, classes); with ``return_attention`` also each block's maps (B, heads, 1+P, 1+P)."""
        B, C, H, W = images.shape
        if (C, H, W) != (self.channels, self.image_size, self.image_size):
            raise ValueError(f"expected images (B, {self.channels}, {self.image_size}, {self.image_size}), "
                             f"got {tuple(images.shape)}")
        x = torch.cat([self.cls.expand(B, -1, -1), self.embed(self.patchify(images))], dim=1)
        x = self.dropout(x + self.position)
        maps = []
        for block in self.blocks:
            x, attention = block(x, return_attention)
            maps.append(attention)
        logits = self.head(x[:, 0])
        return (logits, maps) if return_attention else logits

    def patchify(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, H/p * W/p, p * p * C): patches in row-major order, each flattened row by
        row, pixel by pixel, channels last (the authors' order)."""
        B, C, H, W = images.shape
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)  # (B, C, H/p, W/p, p, p)
        return patches.permute(0, 2, 3, 4, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)

    def attention_weights(self) -> dict[str, list[Tensor]]:
        """The query, key and value weight matrices of every block (as :class:`EncoderClassifier`)."""
        return _attention_weights(block.attention for block in self.blocks)

    def parameter_groups(self) -> dict[str, list[str]]:
        """The parameter names by role (as :class:`EncoderClassifier`): embeddings (patch map,
        positions, [CLS] token), attention, mlp, norms (every LayerNorm, the head's included),
        classifier (the head's Linear)."""
        return _groups(self, {"embeddings": ("embed.", "position", "cls"), "classifier": ("head.1.",)})
