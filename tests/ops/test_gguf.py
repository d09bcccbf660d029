"""ops.gguf against llama.cpp's gguf-py (its dequantizers of every format, its Q8_0 and Q4_0
quantizers), known-answer blocks built by hand from the layouts, numpy against torch, and
the errors that name the bad value.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from pyagent_ref.ops import gguf as G  # noqa: E402


def _weights(rows: int, fmt: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, 2 * G.BLOCKS[fmt][0])) * rng.uniform(0.01, 2, (rows, 1))
    w[0, : G.BLOCKS[fmt][0]] = 0  # a block of zeros
    w[1, 3] = 40.0  # an outlier
    return w.astype(np.float32)


def _finite_bytes(fmt: str, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = G.BLOCKS[fmt][1]
    raw = rng.integers(0, 256, (rows * 3, size), dtype=np.uint8)
    for offset in {"Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}[fmt]:
        halves = rng.uniform(-2, 2, rows * 3).astype(np.float16)
        raw[:, offset : offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, 3 * size)


@pytest.mark.parametrize("fmt", G.FORMATS)
def test_dequantize_equals_gguf_py_bit_for_bit(fmt):
    raw = _finite_bytes(fmt, 7, seed=len(fmt))
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt])
    ours = G.dequantize(raw, fmt)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_quantize_equals_gguf_py_bit_for_bit(fmt):
    w = _weights(9, fmt, seed=3)
    theirs = gguf.quants.quantize(w, gguf.GGMLQuantizationType[fmt])
    assert np.array_equal(G.quantize(w, fmt), theirs)


def test_known_blocks():
    """One block per format written by hand from the module docstring's layouts."""
    half = np.array([0.5], np.float16).view(np.uint8)
    q8 = np.concatenate([half, np.arange(-16, 16, dtype=np.int8).view(np.uint8)])[None]
    assert np.array_equal(G.dequantize(q8, "Q8_0")[0], np.arange(-16, 16) * 0.5)
    q4 = np.concatenate([half, np.full(16, 0x9 << 4 | 0x7, np.uint8)])[None]  # low 7, high 9
    assert np.array_equal(G.dequantize(q4, "Q4_0")[0], np.repeat([-0.5, 0.5], 16))
    # Q4_K: d = 1, dmin = 0.5; sub-block s has sc = s + 1, m = 2 (s < 4) or sc = 40 + s,
    # m = 33 (s >= 4: high bits in bytes 0-7); every code 3 (low) / 5 (high nibble)
    sc, m = [1, 2, 3, 4, 44, 45, 46, 47], [2, 2, 2, 2, 33, 33, 33, 33]
    scales = np.zeros(12, np.uint8)
    for s in range(4):
        scales[s] = sc[s] | (sc[s + 4] >> 4) << 6
        scales[s + 4] = m[s] | (m[s + 4] >> 4) << 6
        scales[s + 8] = (sc[s + 4] & 15) | (m[s + 4] & 15) << 4
    halves = np.array([1.0, 0.5], np.float16).view(np.uint8)
    q4k = np.concatenate([halves, scales, np.full(128, 0x53, np.uint8)])[None]
    want = np.concatenate(
        [np.full(32, sc[s] * (3 if s % 2 == 0 else 5) - 0.5 * m[s]) for s in range(8)]
    )
    assert np.array_equal(G.dequantize(q4k, "Q4_K")[0], want)
    # Q6_K: every six-bit code 0b10_0101 = 37 (q - 32 = 5), scales 1..16, d = 0.25
    ql, qh = np.full(128, 0x55, np.uint8), np.full(64, 0b10101010, np.uint8)
    scales = np.arange(1, 17, dtype=np.int8).view(np.uint8)
    q6k = np.concatenate([ql, qh, scales, np.array([0.25], np.float16).view(np.uint8)])[None]
    assert np.array_equal(G.dequantize(q6k, "Q6_K")[0], np.repeat(np.arange(1, 17) * 0.25 * 5, 16))


@pytest.mark.parametrize("fmt", G.FORMATS)
def test_numpy_and_torch_agree(fmt):
    w = _weights(4, fmt, seed=5)
    raw = G.quantize(w, fmt)
    raw_t = G.quantize(torch.from_numpy(w).to(torch.bfloat16).float(), fmt)
    assert np.array_equal(G.quantize(w.astype(np.float64), fmt), raw)
    assert np.array_equal(
        raw_t.numpy(), G.quantize(torch.from_numpy(w).to(torch.bfloat16).float().numpy(), fmt)
    )
    assert torch.equal(
        G.dequantize(torch.from_numpy(raw), fmt), torch.from_numpy(G.dequantize(raw, fmt))
    )
    x = np.random.default_rng(1).standard_normal((3, w.shape[1])).astype(np.float32)
    y = G.gguf_matmul(x, raw, fmt)
    y_t = G.gguf_matmul(torch.from_numpy(x), torch.from_numpy(raw), fmt)
    np.testing.assert_allclose(y_t.numpy(), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, x @ G.dequantize(raw, fmt).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("fmt", "bound"), [("Q8_0", 0.005), ("Q4_0", 0.13), ("Q4_K", 0.1), ("Q6_K", 0.02)]
)
def test_round_trip_error_within_the_block_bound(fmt, bound):
    w = _weights(16, fmt, seed=7)
    back = G.dequantize(G.quantize(w, fmt), fmt)
    top = np.repeat(np.abs(w).reshape(16, 2, -1).max(axis=2), G.BLOCKS[fmt][0], axis=1)
    assert np.all(np.abs(back - w) <= bound * top)


def test_more_bits_less_error():
    """Relative RMS error on normal weights: Q8_0 < Q6_K < Q4_K < Q4_0 (the K-quants' fitted
    scales and mins beat Q4_0's absmax scale at the same four bits)."""
    rms = {}
    for fmt in G.FORMATS:
        w = np.random.default_rng(11).standard_normal((32, 256)).astype(np.float32)
        back = G.dequantize(G.quantize(w, fmt), fmt)
        rms[fmt] = float(np.sqrt(np.mean((back - w) ** 2) / np.mean(w**2)))
    assert rms["Q8_0"] < rms["Q6_K"] < rms["Q4_K"] < rms["Q4_0"] < 0.15, rms


def test_errors_name_the_value():
    w = np.zeros((2, 32), np.float32)
    with pytest.raises(ValueError, match="'Q5_K'"):
        G.quantize(w, "Q5_K")
    with pytest.raises(TypeError, match="fmt must be a str"):
        G.dequantize(np.zeros((1, 34), np.uint8), 8)
    with pytest.raises(ValueError, match=r"\(1, 35\)"):
        G.dequantize(np.zeros((1, 35), np.uint8), "Q8_0")
    with pytest.raises(ValueError, match="block size 256"):
        G.quantize(w, "Q4_K")
    bad = w.copy()
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="row 1"):
        G.quantize(bad, "Q8_0")
    with pytest.raises(ValueError, match="in_features 64"):
        G.gguf_matmul(np.zeros((1, 64), np.float32), np.zeros((1, 34), np.uint8), "Q8_0")
