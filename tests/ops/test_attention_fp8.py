"""FP8 KV cache writes and reads (`ops.attention` with kv_cache_dtype): every code
decodes as torch reads it, and a write equals torch's saturating cast bit for bit, on
the reference and on the accelerator, for numpy and torch caches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.ops import _fp8, load  # noqa: E402

TORCH_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def namespaces():
    out = [pytest.param(load("ref"), id="ref")]
    try:
        out.append(pytest.param(load("accel"), id="accel"))
    except ImportError:
        pass
    return out


def hard_values(dtype: torch.dtype) -> torch.Tensor:
    """Random floats over every magnitude, each code, each midpoint between two codes,
    values past the largest finite, infinities, NaNs, signed zeros."""
    g = torch.Generator().manual_seed(0)
    scales = (1e-7, 1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6)
    x = torch.cat([torch.randn(20_000, generator=g) * s for s in scales])
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    finite = codes[codes.isfinite()].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    special = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    return torch.cat([x, finite, mids, -mids, finite * 1.001, special])


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_every_code_decodes_as_torch_reads_it(name):
    want = torch.arange(256, dtype=torch.uint8).view(TORCH_DTYPES[name]).float().numpy()
    got = _fp8.values(_fp8.KV_CACHE_FORMATS[name])
    np.testing.assert_array_equal(got, want)  # NaNs compare equal here


@pytest.mark.parametrize("ops", namespaces())
@pytest.mark.parametrize("name", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_writes_equal_torchs_saturating_cast(ops, name, library):
    dtype = TORCH_DTYPES["fp8_e4m3" if name == "fp8" else name]
    x = hard_values(dtype)
    n = x.shape[0] // 8 * 8
    key = x[:n].reshape(-1, 2, 4)  # (tokens, kv heads, head size)
    scale = 0.375
    top = torch.finfo(dtype).max
    want = torch.clamp(key / torch.tensor(scale), -top, top).to(dtype).view(torch.uint8)
    caches = [torch.zeros((key.shape[0], 1, 2, 4), dtype=torch.uint8) for _ in range(2)]
    slots = torch.arange(key.shape[0])
    args = [key, key.flip(0), *caches, slots]
    if library == "numpy":
        args = [a.numpy() for a in args]
    ops.attention.reshape_and_cache(*args, name, scale, 2.0)
    got = torch.as_tensor(np.asarray(args[2])).reshape(want.shape)
    bad = (got != want).nonzero()
    assert not len(bad), f"{len(bad)} codes differ, first for {float(key.flatten()[bad[0]])}"


@pytest.mark.parametrize("ops", namespaces())
def test_decode_reads_the_scaled_codes(ops):
    """One request attending to one position reads back code value x v_scale."""
    rng = np.random.default_rng(0)
    cache = rng.integers(0, 0x7C, (2, 4, 1, 8)).astype(np.uint8)  # finite e5m2 codes
    out = ops.attention.paged_decode_attention(
        np.ones((1, 1, 8), np.float32),
        cache,
        cache,
        np.array([[1]]),
        np.array([1]),
        1.0,
        kv_cache_dtype="fp8_e5m2",
        k_scale=3.0,
        v_scale=0.5,
    )
    want = _fp8.values(_fp8.E5M2)[cache[1, 0, 0]] * 0.5
    np.testing.assert_allclose(out[0, 0], want, rtol=1e-6)
