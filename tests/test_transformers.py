"""The E4 encoder classifier and the E7 vision transformer: shapes, masking, attention maps, weights."""

import pytest
import torch

from mdlib.models import EncoderClassifier


def small(**kw):
    torch.manual_seed(0)
    return EncoderClassifier(**{**dict(vocab_size=50, max_length=16, width=12, layers=2, heads=3, mlp=24,
                                       dropout=0.2), **kw})


def batch():
    ids = torch.tensor([[2, 7, 9, 11, 3, 0, 0], [2, 5, 3, 0, 0, 0, 0]])
    return ids, (ids != 0).long()


def test_shapes_and_attention_maps():
    model = small().eval()
    ids, mask = batch()
    logits, maps = model(ids, mask, return_attention=True)
    assert logits.shape == (2,)
    assert len(maps) == 2 and maps[0].shape == (2, 3, 7, 7)
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 3, 7))
    assert torch.all(maps[0][0, :, :, 5:] == 0) and torch.all(maps[1][1, :, :, 3:] == 0)  # padding keys get none
    torch.testing.assert_close(model(ids, mask), logits, rtol=1e-5, atol=1e-6)  # fused path == explicit path


def test_padding_does_not_change_the_prediction():
    model = small().eval()
    ids, mask = batch()
    short = model(ids[1:, :3], mask[1:, :3])
    torch.testing.assert_close(model(ids, mask)[1:], short, rtol=1e-5, atol=1e-6)


def test_no_biases_in_blocks_and_kqv_access():
    model = small()
    for module in model.blocks.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
            assert module.bias is None
    weights = model.attention_weights()
    assert set(weights) == {"query", "key", "value"}
    assert [w.shape for w in weights["key"]] == [(12, 12), (12, 12)]
    qkv = model.blocks[1].attention.qkv.weight  # fused (3 width, width): queries, keys, values
    for k, kind in enumerate(("query", "key", "value")):
        assert weights[kind][1].data_ptr() == qkv[12 * k:12 * (k + 1)].data_ptr()  # views, not copies


@pytest.mark.parametrize("setup, classifier_bias", [("authors", 0), ("modern", 1)])
def test_paper_scale_parameter_count(setup, classifier_bias):
    model = EncoderClassifier(layers=3, heads=3, setup=setup)
    block = 4 * 384 * 384 + 2 * 384 * 1536 + 2 * 384  # q, k, v, out; MLP; two LayerNorm weights
    expected = 30522 * 384 + 512 * 384 + 3 * block + 384 + classifier_bias
    assert sum(p.numel() for p in model.parameters()) == expected


def test_dropout_is_active_in_training_only():
    model = small()
    ids, mask = batch()
    model.train()
    assert not torch.equal(model(ids, mask), model(ids, mask))
    model.eval()
    assert torch.equal(model(ids, mask), model(ids, mask))


def test_errors():
    with pytest.raises(ValueError, match="divisible"):
        EncoderClassifier(width=10, heads=3)
    with pytest.raises(ValueError, match="unknown setup 'bert'; choose one of authors, small-embeddings, modern"):
        EncoderClassifier(setup="bert")
    model = small()
    with pytest.raises(ValueError, match="positions"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_vision_transformer_shapes_patches_and_weights():
    from mdlib.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=8, patch=4, channels=1, classes=5, width=16, depth=2, heads=4, mlp=32).eval()
    images = torch.randn(3, 1, 8, 8)
    logits, maps = model(images, return_attention=True)
    assert logits.shape == (3, 5) and len(maps) == 2 and maps[0].shape == (3, 4, 5, 5)
    torch.testing.assert_close(model(images), logits, rtol=1e-5, atol=1e-6)
    rgb = VisionTransformer(image_size=8, patch=4, channels=3, width=16, depth=1, heads=4, mlp=32)
    pictures = torch.randn(2, 3, 8, 8)
    patches = rgb.patchify(pictures)
    assert patches.shape == (2, 4, 48)
    for k, (row, col) in enumerate([(0, 0), (0, 4), (4, 0), (4, 4)]):  # row-major patches, channels last
        patch = pictures[:, :, row:row + 4, col:col + 4].permute(0, 2, 3, 1)
        torch.testing.assert_close(patches[:, k], patch.reshape(2, 48))
    assert [w.shape for w in model.attention_weights()["query"]] == [(16, 16), (16, 16)]
    with pytest.raises(ValueError, match="expected images"):
        model(torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="multiple"):
        VisionTransformer(image_size=10, patch=4)


def test_vision_transformer_paper_scale():
    from mdlib.models import VisionTransformer

    model = VisionTransformer()  # CIFAR: 48 px, patch 4 -> 144 patches + [CLS]
    assert model.position.shape == (1, 145, 512)
    assert model(torch.randn(2, 3, 48, 48)).shape == (2, 10)
