"""M-RoPE (`ops.rope.apply_mrope`) against HF transformers' Qwen2-VL rotary embeddings
(the decoder's three rows and the vision tower's two) and against `apply_rope`."""

from __future__ import annotations

import numpy as np
import pytest

from pyagent_ref.ops import rope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import modeling_qwen2_vl as hf  # noqa: E402

SECTION = (2, 3, 3)  # head_dim 16


def qk(n, heads=(4, 2), dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, heads[0], dim, generator=gen),
        torch.randn(n, heads[1], dim, generator=gen),
    )


@pytest.mark.parametrize("is_neox", [True, False])
def test_equal_rows_are_plain_rope(is_neox):
    q, k = qk(7)
    p = torch.tensor([0, 1, 5, 9, 100, 3, 2])
    inv, _ = rope.rope_inv_freq(16, 10000.0, like=q)
    want = rope.apply_rope(p, q, k, inv, 1.07, is_neox)
    got = rope.apply_mrope(p.expand(3, -1), q, k, inv, SECTION, 1.07, is_neox)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_rows_differ_only_in_their_sections():
    """Changing the height row moves only the pairs of the height section."""
    q, k = qk(3)
    inv, _ = rope.rope_inv_freq(16, 10000.0, like=q)
    p = torch.tensor([[4, 5, 6]] * 3)
    moved = p.clone()
    moved[1] += 7
    a, b = (
        rope.apply_mrope(p, q, k, inv, SECTION)[0],
        rope.apply_mrope(moved, q, k, inv, SECTION)[0],
    )
    changed = (a != b).any(0).any(0)  # per feature
    pairs = changed[:8] | changed[8:]
    assert pairs.tolist() == [False, False, True, True, True, False, False, False]


def test_matches_hf_decoder_rotary():
    config = transformers.Qwen2VLTextConfig(
        hidden_size=64,
        num_attention_heads=4,
        rope_parameters={"rope_type": "default", "mrope_section": list(SECTION), "rope_theta": 1e4},
    )
    emb = hf.Qwen2VLRotaryEmbedding(config)
    q, k = qk(9)
    positions = torch.randint(0, 50, (3, 9))
    cos, sin = emb(q, positions[:, None])
    want = hf.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got = rope.apply_mrope(positions, q, k, emb.inv_freq, SECTION)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w[0].transpose(0, 1), rtol=1e-6, atol=1e-6)


def test_two_rows_are_the_vision_towers_2d_rope():
    """Qwen2-VL's ViT: the d/4 frequencies by the patch row, then by the column."""
    config = transformers.Qwen2VLVisionConfig(embed_dim=32, num_heads=2)  # head_dim 16
    emb = hf.Qwen2VLVisionRotaryEmbedding(config)
    q, k = qk(6, heads=(2, 2))
    positions = torch.randint(0, 12, (2, 6))
    cos, sin = emb(q, positions.T)
    want = hf.apply_rotary_pos_emb_vision(q, k, cos, sin)
    inv = torch.cat([emb.inv_freq, emb.inv_freq])
    got = rope.apply_mrope(positions, q, k, inv, (4, 4))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_numpy_inputs():
    q, k = (x.numpy() for x in qk(4))
    inv, _ = rope.rope_inv_freq(16, 10000.0)
    p = np.array([[0, 1, 2, 3], [0, 1, 1, 2], [0, 2, 1, 3]])
    got = rope.apply_mrope(p, q, k, inv, SECTION)
    want = rope.apply_mrope(
        torch.from_numpy(p),
        torch.from_numpy(q),
        torch.from_numpy(k),
        torch.from_numpy(inv),
        SECTION,
    )
    np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "positions, section, error, match",
    [
        (np.zeros((3, 4), np.int64), (2, 3, 2), ValueError, "mrope_section"),
        (np.zeros((3, 4), np.int64), (4, -1, 5), ValueError, "mrope_section"),
        (np.zeros((2, 4), np.int64), (2, 3, 3), ValueError, "positions must have shape"),
        (np.zeros(4, np.int64), (2, 3, 3), ValueError, "positions must have shape"),
        (np.zeros((3, 5), np.int64), (2, 3, 3), ValueError, "query must have shape"),
        (np.zeros((3, 4), np.float32), (2, 3, 3), TypeError, "integers"),
    ],
)
def test_bad_input_is_named(positions, section, error, match):
    q, k = (x.numpy() for x in qk(4))
    inv, _ = rope.rope_inv_freq(16, 10000.0)
    with pytest.raises(error, match=match):
        rope.apply_mrope(positions, q, k, inv, section)
