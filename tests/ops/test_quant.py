"""ops.quant against compressed-tensors' own quantization and packing (the library that
writes vLLM's `compressed-tensors` checkpoints), numpy against torch, and the accelerator's
fused dequant-matmul against the reference at the shapes its GEMV path takes.

compressed-tensors computes the RTN parameters from each group's min and max
(`calculate_qparams`), quantizes with them (`quantize`) and packs int8 codes into int32
words (`pack_to_int32`, `unpack_from_int32`): our codes, scales, zero points and words must
equal theirs. The one documented difference is a group of zeros: they give it scale eps,
we give it 1 (its codes dequantize to 0 either way), so weights here have no zero group.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ct_forward = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")

from compressed_tensors.compressors.pack_quantized.helpers import (  # noqa: E402
    pack_to_int32,
    unpack_from_int32,
)
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from pyagent_ref.ops import quant  # noqa: E402

FORMATS = [  # (bits, group_size, symmetric)
    (4, 32, True),
    (4, 32, False),
    (4, None, True),
    (8, None, True),
    (8, 16, False),
    (2, 16, False),
]


def weight(out: int = 12, n: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, n, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize(("bits", "group_size", "symmetric"), FORMATS)
def test_quantize_equals_compressed_tensors(bits, group_size, symmetric):
    w = weight()
    out, n = w.shape
    size = group_size or n
    args = QuantizationArgs(
        num_bits=bits,
        symmetric=symmetric,
        strategy="group" if group_size else "channel",
        group_size=group_size,
    )
    groups = w.reshape(out, n // size, size)
    scales, zeros = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    ct_codes = ct_forward.quantize(w, scales, zeros, args, dtype=torch.int8)
    codes, our_scales, our_zeros = quant.quantize(w, bits, group_size, symmetric)
    assert torch.equal(our_scales, scales)
    assert torch.equal(codes, ct_codes)
    if symmetric:
        assert our_zeros is None and not zeros.any()
    else:
        assert torch.equal(our_zeros, zeros)
    ct_weight = ct_forward.dequantize(ct_codes, scales, zeros, args)
    torch.testing.assert_close(quant.dequantize(codes, our_scales, our_zeros), ct_weight)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_int32_is_compressed_tensors_layout(bits):
    half = 2 ** (bits - 1)
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(-half, half, (5, 96), generator=gen, dtype=torch.int8)
    packed = quant.pack_int32(codes, bits)
    assert torch.equal(packed, pack_to_int32(codes, bits))
    assert torch.equal(quant.unpack_int32(packed, bits, 96), codes)
    assert torch.equal(unpack_from_int32(packed, bits, codes.shape), codes)


@pytest.mark.parametrize(("bits", "group_size", "symmetric"), FORMATS)
def test_numpy_and_torch_agree(bits, group_size, symmetric):
    w = weight(seed=1)
    t = quant.quantize(w, bits, group_size, symmetric)
    n = quant.quantize(w.numpy(), bits, group_size, symmetric)
    for a, b in zip(t, n, strict=True):
        assert (a is None and b is None) or np.array_equal(a.numpy(), b)
    codes, scales, zeros = n
    packed = quant.pack_int32(codes, bits)
    x = np.random.default_rng(2).normal(size=(3, w.shape[1])).astype(np.float32)
    got = quant.dequant_matmul(
        torch.from_numpy(x),
        torch.from_numpy(packed),
        torch.from_numpy(scales),
        None if zeros is None else torch.from_numpy(zeros),
        bits,
    )
    want = quant.dequant_matmul(x, packed, scales, zeros, bits)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(want, x @ quant.dequantize(codes, scales, zeros).T, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 3, 4, 9])
@pytest.mark.parametrize(("bits", "group_size", "symmetric"), [(4, 128, False), (8, None, True)])
def test_accel_fused_kernel_matches_reference(tokens, bits, group_size, symmetric):
    """1-3 tokens take the accelerator's register-decoding GEMV (blocks of 128 int4 or 64
    int8 codes inside one group), more its row-buffer GEMM; both within the spec's
    tolerance of the reference, in float32 and bfloat16."""
    accel = pytest.importorskip("pyagent_accel.ops.quant")
    w = weight(out=40, n=256, seed=3)
    codes, scales, zeros = quant.quantize(w, bits, group_size, symmetric)
    packed = quant.pack_int32(codes, bits)
    x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(4))
    mag = x.abs() @ quant.dequantize(codes, scales, zeros).abs().T
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        got = accel.dequant_matmul(xd, packed, scales, zeros, bits)
        want = quant.dequant_matmul(xd, packed, scales, zeros, bits)
        assert got.dtype == dtype and got.shape == (tokens, 40)
        ulp = 2e-6 if dtype == torch.float32 else 2.0**-8
        assert ((got.float() - want.float()).abs() <= ulp * (mag + want.float().abs())).all()
