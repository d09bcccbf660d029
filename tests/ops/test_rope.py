"""RoPE frequencies and rotation against HF transformers' own implementation."""

from __future__ import annotations

import numpy as np
import pytest

from pyagent_ref.ops import rope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402

SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 16,
        "mscale": 0.7,
        "mscale_all_dim": 0.5,
    },
]


def hf_inv_freq(scaling, head_dim, theta, max_pos, seq_len):
    params = {"rope_type": "default", "rope_theta": theta} | (scaling or {})
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    rope_type = params["rope_type"]
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("seq_len", [50, 300])
def test_inv_freq_matches_hf(scaling, seq_len):
    theta, head_dim, max_pos = 10000.0, 32, 128
    expected, expected_scale = hf_inv_freq(scaling, head_dim, theta, max_pos, seq_len)
    got, scale = rope.rope_inv_freq(
        head_dim, theta, scaling, max_pos, seq_len=seq_len, like=torch.empty(0)
    )
    torch.testing.assert_close(got, expected.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(expected_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_neox_rotation_matches_hf(dtype):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 16, generator=gen).to(dtype)
    k = torch.randn(6, 2, 16, generator=gen).to(dtype)
    positions = torch.tensor([0, 1, 2, 7, 100, 5000])
    inv_freq, scale = rope.rope_inv_freq(16, 10000.0, like=q)
    got_q, got_k = rope.apply_rope(positions, q, k, inv_freq, scale)
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    exp_q, exp_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    torch.testing.assert_close(got_q, exp_q, rtol=0, atol=0)
    torch.testing.assert_close(got_k, exp_k, rtol=0, atol=0)


def test_gptj_layout_rotates_adjacent_pairs():
    x = np.zeros((1, 1, 4), dtype=np.float64)
    x[0, 0, 0] = 1.0  # pair (0, 1) holds (1, 0)
    inv_freq = np.array([1.0, 0.0], dtype=np.float32)
    q, _ = rope.apply_rope(np.array([1]), x, x, inv_freq, is_neox=False)
    np.testing.assert_allclose(q[0, 0], [np.cos(1.0), np.sin(1.0), 0.0, 0.0], rtol=1e-6)


def test_partial_rotary_leaves_the_tail():
    x = np.ones((2, 1, 6), dtype=np.float32)
    inv_freq, _ = rope.rope_inv_freq(4, 10000.0)
    q, _ = rope.apply_rope(np.array([3, 4]), x, x, inv_freq)
    np.testing.assert_array_equal(q[:, :, 4:], 1.0)
    assert not np.allclose(q[:, :, :4], 1.0)


def test_bad_rope_configs_are_named():
    with pytest.raises(ValueError, match="'ntk'"):
        rope.rope_inv_freq(8, 1e4, {"rope_type": "ntk"})
    with pytest.raises(ValueError, match="'factor'"):
        rope.rope_inv_freq(8, 1e4, {"rope_type": "linear"})
    with pytest.raises(ValueError, match="rotary_dim"):
        rope.rope_inv_freq(7, 1e4)
