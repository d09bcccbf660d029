"""The `compressed-tensors` package (the library that writes and reads vLLM's
compressed-tensors checkpoints) behind the `ops.quant` signatures.

    python -m conformance conformance.adapters.compressed_tensors quant

``pack_int32(codes, bits)`` is its ``pack_to_int32(codes, bits)`` (pack-quantized
checkpoints' weight_packed) and ``unpack_int32(packed, bits, size)`` its
``unpack_from_int32(packed, bits, (rows, size))``. ``quantize_fp8(weight, "e4m3", per)``
is its float-quantized observer-and-quantize path: ``calculate_qparams`` of the weight's
min and max (over the tensor, or each row: QuantizationArgs(num_bits=8, type="float",
strategy=per)) and ``quantize(weight, scale, zero_point, args, float8_e4m3fn)``;
``dequantize_fp8(codes, scales, "e4m3")`` its ``dequantize`` of the codes viewed as
float8_e4m3fn. It is torch-only: numpy inputs go through torch and come back as numpy.
Its fp8 quantization is e4m3 only (quantize_fp8 with "e5m2" raises NotImplementedError: a
registered divergence; its dequantize casts any float8 dtype, so e5m2 codes are read). A
weight or words of no rows, which it cannot reduce or view, is answered by the adapter
(empty). Its int RTN quantize and dequantize are not adapted here and it has no fused
matmul (CONFORMANCE_MISSING).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import contract
from ..core import library_of, to_numpy
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    "quant.quantize": "compressed-tensors' RTN is tested against ours in tests/ops/test_quant.py",
    "quant.dequantize": "compressed-tensors' int dequantize is not adapted here",
    "quant.dequant_matmul": "compressed-tensors has no fused matmul (vLLM's kernels do it)",
    "quant.dequant_matmul_fp8": "compressed-tensors has no fused matmul (vLLM's kernels do it)",
    **{
        f"{m}.*": "compressed-tensors implements only quantized weight formats"
        for m in contract.modules()
        if m != "quant"
    },
}

VERSION: str | None = None


def _ct() -> Any:
    """The compressed_tensors module, or an ImportError that says what to install."""
    global VERSION
    try:
        import compressed_tensors
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.compressed_tensors needs compressed-tensors: "
            "pip install compressed-tensors"
        ) from exc
    from importlib.metadata import version

    VERSION = f"compressed-tensors {version('compressed-tensors')}"
    return compressed_tensors


def _torch(x: Any) -> Any:
    import torch

    return x if library_of(x) == "torch" else torch.from_numpy(np.ascontiguousarray(x))


def _like(like: Any, t: Any) -> Any:
    return t if library_of(like) == "torch" else to_numpy(t)


def pack_int32(codes: Any, bits: int) -> Any:
    _ct()
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    return _like(codes, pack_to_int32(_torch(codes), bits))


def unpack_int32(packed: Any, bits: int, size: int) -> Any:
    _ct()
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    p = _torch(packed)
    if p.ndim == 2 and p.dtype == torch.int32 and p.numel() == 0:  # it cannot view no words
        return _like(packed, torch.zeros((p.shape[0], size), dtype=torch.int8))
    return _like(packed, unpack_from_int32(p, bits, torch.Size((p.shape[0], size))))


def _args(per: str) -> Any:
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", strategy=per, symmetric=True)


def _e4m3(fmt: str) -> None:
    if fmt != "e4m3":
        raise NotImplementedError(f"compressed-tensors' fp8 is e4m3 only, got fmt {fmt!r}")


def quantize_fp8(weight: Any, fmt: str = "e4m3", per: str = "tensor") -> tuple[Any, Any]:
    _ct()
    _e4m3(fmt)
    import torch
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = _torch(weight)
    if w.ndim == 2 and w.shape[0] == 0 and w.is_floating_point():  # it cannot reduce nothing
        empty = (torch.zeros(w.shape, dtype=torch.uint8), torch.ones((int(per == "tensor"), 1)))
        return tuple(_like(weight, t) for t in empty)
    w = w.float()
    if per == "channel":
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    else:
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    args = _args(per)
    scale, zero = calculate_qparams(lo, hi, args)
    codes = quantize(w, scale, zero, args, dtype=torch.float8_e4m3fn)
    scales = scale.reshape(-1, 1).float()
    return _like(weight, codes.view(torch.uint8)), _like(weight, scales)


def dequantize_fp8(codes: Any, scales: Any, fmt: str = "e4m3") -> Any:
    _ct()
    import torch
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    # its dequantize casts any float8 dtype: e5m2 codes are read as well
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    q = _torch(codes).view(dtype)
    s = _torch(scales).float()
    per = "tensor" if s.shape[0] == 1 else "channel"
    scale = s.reshape(1) if per == "tensor" else s
    return _like(codes, dequantize(q, scale, None, _args(per), dtype=torch.float32))


# `compressed_tensors.quant`: the functions above, named like the reference's ops.
__getattr__ = lazy_namespaces(__name__, globals(), ("quant",), _ct)
