"""rms_norm and silu_and_mul against HF transformers' Llama modules."""

from __future__ import annotations

import numpy as np
import pytest

from pyagent_ref.ops import layers

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_matches_hf(dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        hf.weight.copy_(torch.linspace(0.5, 1.5, 16))
    hf = hf.to(dtype)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    # HF multiplies by rsqrt, the op divides by sqrt: at most an ulp apart in float32,
    # and identical once rounded to a half-precision dtype
    tol = 1e-6 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(
        layers.rms_norm(x, hf.weight.detach(), 1e-5), hf(x).detach(), rtol=tol, atol=tol
    )
    del transformers


def test_rms_norm_with_residual_returns_the_sum():
    x, res, w = np.ones((2, 4)), np.full((2, 4), 2.0), np.full(4, 0.5)
    out, h = layers.rms_norm(x, w, 1e-6, residual=res)
    np.testing.assert_array_equal(h, 3.0)
    np.testing.assert_allclose(out, 0.5, rtol=1e-6)


def test_silu_and_mul():
    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    expected = torch.nn.functional.silu(x[:, :5]) * x[:, 5:]
    torch.testing.assert_close(layers.silu_and_mul(x), expected)
    np.testing.assert_allclose(
        layers.silu_and_mul(x.double().numpy()), expected.double().numpy(), rtol=1e-6
    )


def test_layer_errors():
    with pytest.raises(ValueError, match="even"):
        layers.silu_and_mul(np.ones((2, 3)))
    with pytest.raises(ValueError, match="weight"):
        layers.rms_norm(np.ones((2, 3)), np.ones(4), 1e-5)
    with pytest.raises(ValueError, match="eps"):
        layers.rms_norm(np.ones((2, 3)), np.ones(3), 0.0)
    with pytest.raises(TypeError, match="x"):
        layers.rms_norm(np.ones((2, 3), dtype=np.int64), np.ones(3), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_matches_hf(dtype):
    pytest.importorskip("transformers")
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    hf = Gemma2RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.linspace(-0.5, 0.5, 16))
    hf = hf.to(dtype)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    tol = 1e-6 if dtype == torch.float32 else 0.0
    got = layers.gemma_rms_norm(x, hf.weight.detach(), 1e-6)
    torch.testing.assert_close(got, hf(x).detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_matches_torch(dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 24, generator=g) * 3 + 1).to(dtype)
    w, b = torch.randn(24, generator=g).to(dtype), torch.randn(24, generator=g).to(dtype)
    want = torch.nn.functional.layer_norm(x, (24,), w, b, 1e-5)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.0, atol=0.0)
    torch.testing.assert_close(layers.layer_norm(x, w, b, 1e-5), want, **tol)
    out, h = layers.layer_norm(x, w, b, 1e-5, residual=x)
    torch.testing.assert_close(h, x + x, rtol=0, atol=0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_gelu_and_mul_match_torch(approximate):
    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(3)) * 4
    want = torch.nn.functional.gelu(x, approximate=approximate)
    torch.testing.assert_close(layers.gelu(x, approximate), want, rtol=1e-6, atol=1e-6)
    got = layers.gelu(x.numpy(), approximate)  # numpy: erf through math.erf
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)
    gated = layers.gelu_and_mul(x, approximate)
    # 1 + erf cancels for negative gates (|error| ~ 1 ulp of 1): absolute tolerance
    torch.testing.assert_close(gated, want[:, :5] * x[:, 5:], rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="approximate must be one of"):
        layers.gelu(x, "erf")
