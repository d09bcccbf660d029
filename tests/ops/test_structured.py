"""apply_token_bitmask: worked examples of the layout, and its edges (the conformance spec
`conformance/specs/structured.py` holds the properties)."""

from __future__ import annotations

import numpy as np
import pytest

from pyagent_ref.ops import structured

torch = pytest.importorskip("torch")


def mask_of(batch_allowed: list[set[int]], words: int) -> np.ndarray:
    """The bitmask that allows exactly `batch_allowed[b]` in row b, written bit by bit."""
    out = np.zeros((len(batch_allowed), words), np.uint32)
    for b, allowed in enumerate(batch_allowed):
        for token in allowed:
            out[b, token // 32] |= np.uint32(1) << np.uint32(token % 32)
    return out.view(np.int32)


def test_bit_j_of_word_w_is_token_32w_plus_j():
    logits = np.arange(2 * 70, dtype=np.float32).reshape(2, 70)
    allowed = [{0, 31, 32, 69}, {5, 63, 64}]
    out = structured.apply_token_bitmask(logits, mask_of(allowed, 3))
    for b, keep in enumerate(allowed):
        assert set(np.flatnonzero(np.isfinite(out[b]))) == keep
        np.testing.assert_array_equal(out[b, sorted(keep)], logits[b, sorted(keep)])


def test_the_sign_bit_is_token_31():
    out = structured.apply_token_bitmask(np.zeros((1, 32)), np.array([[-(2**31)]], np.int32))
    assert list(np.flatnonzero(np.isfinite(out[0]))) == [31]


def test_tokens_past_the_mask_are_masked_and_bits_past_the_vocab_ignored():
    everything = np.full((1, 2), -1, np.int32)
    wide = structured.apply_token_bitmask(np.zeros((1, 80)), everything)
    assert np.isfinite(wide[0, :64]).all() and np.isneginf(wide[0, 64:]).all()
    narrow = structured.apply_token_bitmask(np.zeros((1, 3)), everything)
    np.testing.assert_array_equal(narrow, 0.0)
    none = structured.apply_token_bitmask(np.zeros((1, 3)), np.zeros((1, 0), np.int32))
    assert np.isneginf(none).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_torch_dtypes_are_kept_and_the_input_is_not_modified(dtype):
    logits = torch.linspace(-3, 3, 40, dtype=dtype).reshape(1, 40)
    before = logits.clone()
    out = structured.apply_token_bitmask(logits, torch.tensor([[0b110, 1]], dtype=torch.int32))
    assert out.dtype == dtype
    torch.testing.assert_close(logits, before, rtol=0, atol=0)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [1, 2, 32]


def test_values_are_not_read():
    logits = np.array([[np.nan, np.inf, np.nan, 1.0]])
    out = structured.apply_token_bitmask(logits, np.array([[0b0011]], np.int32))
    assert np.isnan(out[0, 0]) and out[0, 1] == np.inf and np.isneginf(out[0, 2:]).all()


def test_errors_name_the_parameter():
    logits, mask = np.zeros((2, 40), np.float32), np.zeros((2, 2), np.int32)
    with pytest.raises(TypeError, match="logits must be a float array, got dtype int64"):
        structured.apply_token_bitmask(np.zeros((2, 40), np.int64), mask)
    with pytest.raises(TypeError, match="bitmask must be int32.*uint32"):
        structured.apply_token_bitmask(logits, mask.view(np.uint32))
    with pytest.raises(TypeError, match="bitmask must be a numpy array or a torch tensor"):
        structured.apply_token_bitmask(logits, [[0, 0]])
    with pytest.raises(ValueError, match=r"logits must have shape \(batch, vocab\)"):
        structured.apply_token_bitmask(logits[0], mask)
    with pytest.raises(ValueError, match=r"bitmask must have shape \(batch, words\)"):
        structured.apply_token_bitmask(logits, mask[0])
    with pytest.raises(ValueError, match=r"bitmask must have 2 rows .* got shape \(3, 2\)"):
        structured.apply_token_bitmask(logits, np.zeros((3, 2), np.int32))


def _cuda_available() -> bool:
    return torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_a_host_mask_applies_to_cuda_logits():
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
    mask = torch.randint(-(2**31), 2**31, (4, 32), dtype=torch.int32)
    on_gpu = structured.apply_token_bitmask(logits.cuda(), mask)
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), structured.apply_token_bitmask(logits, mask))
