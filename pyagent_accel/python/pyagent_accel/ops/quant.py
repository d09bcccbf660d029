"""Weight-only integer quantization in Rust: drop-in replacements for `pyagent_ref.ops.quant`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors (float16, bfloat16, float32 or float64 floats); results come back in the input's
library. Each op is one native call with the GIL released.

`dequant_matmul` is a fused kernel that never builds the float weight matrix: for 1-3
tokens each row's codes are decoded in registers and dotted with the token, a block's sum
scaled once; for more, each row is decoded into float weights (the values `dequantize`
gives) and dotted with four tokens per read (float32 with AVX2: a tile of 16 rows decoded
once for every token); rows in parallel for large layers. Its sums
run in another order than BLAS's: results agree with the reference within the
specification's tolerance. The other ops give the reference's results bit for bit.

`dequant_matmul_fp8` never builds the float weight either: each row's codes are decoded
(the format's value times the row's scale, rounded once in float32) into a buffer of one
row and dotted with four tokens per read; its sums too run in another order than BLAS's.
`quantize_fp8` and `dequantize_fp8` give the reference's results bit for bit.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Non-contiguous inputs are copied to a contiguous array first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = [
    "quantize",
    "dequantize",
    "pack_int32",
    "unpack_int32",
    "dequant_matmul",
    "quantize_fp8",
    "dequantize_fp8",
    "dequant_matmul_fp8",
]

BITS = (2, 4, 8)
FP8_FORMATS = ("e4m3", "e5m2")


def _array(x: Any, name: str, ndim: int, kinds: tuple[str, ...], what: str) -> bool:
    """The reference's `_array`: returns whether x is a torch tensor."""
    torch_in = _c.array_library(x, name)
    if _c.dtype_name(x) not in kinds:
        raise TypeError(f"{name} must be {what}, got dtype {_c.dtype_name(x)}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(x.shape)}")
    return torch_in


def _float(x: Any, name: str, ndim: int) -> bool:
    return _array(x, name, ndim, _c.FLOAT_KINDS, "a float array")


def _bits(bits: Any) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, got {type(bits).__name__}")
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    return bits


def _groups(scales: Any, zeros: Any, rows: int, in_features: int) -> int:
    """The reference's `_groups`."""
    _float(scales, "scales", 2)
    groups = scales.shape[1]
    if scales.shape[0] != rows or groups == 0 or in_features % groups:
        raise ValueError(
            f"scales must have shape ({rows}, groups) with groups dividing in_features "
            f"{in_features}, got {tuple(scales.shape)}"
        )
    if zeros is not None:
        _array(zeros, "zeros", 2, ("int8",), "int8 (or None: symmetric)")
        if tuple(zeros.shape) != tuple(scales.shape):
            raise ValueError(
                f"zeros must have scales' shape {tuple(scales.shape)}, got {tuple(zeros.shape)}"
            )
    return in_features // groups


def _ints(x: Any, torch_in: bool) -> np.ndarray:
    """An integer array as the contiguous numpy array Rust reads."""
    if torch_in:
        _c.check_cpu(x, "array")
        x = _c.tensor_to_numpy(x)
    return np.ascontiguousarray(x)


def _floats(x: Any, name: str, torch_in: bool) -> np.ndarray:
    return np.ascontiguousarray(_c.float_view(x, name, torch_in))


def quantize(
    weight: Any, bits: int, group_size: int | None = None, symmetric: bool = True
) -> tuple[Any, Any, Any]:
    """Round-to-nearest quantization of a weight to signed b-bit codes per row and group.

    Contract: `pyagent_ref.ops.quant.quantize`.
    """
    torch_in = _float(weight, "weight", 2)
    bits = _bits(bits)
    out_features, in_features = weight.shape
    if in_features == 0:
        raise ValueError(f"weight must have in_features >= 1, got shape {tuple(weight.shape)}")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise TypeError(f"group_size must be an int or None, got {type(group_size).__name__}")
        if group_size < 1 or in_features % group_size:
            raise ValueError(
                f"group_size must be >= 1 and divide in_features {in_features}, got {group_size}"
            )
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    _finite_rows(weight, torch_in)
    result = _native.quantize(
        _floats(weight, "weight", torch_in), bits, group_size or in_features, symmetric
    )
    return tuple(None if r is None else _c.wrap(r, torch_in) for r in result)


def dequantize(codes: Any, scales: Any, zeros: Any = None) -> Any:
    """The float weight of codes, scales and zero points: W = (q - z) * s per group.

    Contract: `pyagent_ref.ops.quant.dequantize`.
    """
    torch_in = _array(codes, "codes", 2, ("int8",), "int8")
    _groups(scales, zeros, *codes.shape)
    s_torch = _c.is_torch(scales)
    z = None if zeros is None else _ints(zeros, _c.is_torch(zeros))
    out = _native.dequantize(_ints(codes, torch_in), _floats(scales, "scales", s_torch), z)
    return _c.wrap(out, torch_in)


def pack_int32(codes: Any, bits: int) -> Any:
    """Signed b-bit codes packed 32 / b to an int32 word along the last axis.

    Contract: `pyagent_ref.ops.quant.pack_int32`.
    """
    torch_in = _array(codes, "codes", 2, ("int8",), "int8")
    bits = _bits(bits)
    q = _ints(codes, torch_in)
    half = 2 ** (bits - 1)
    outside = (q < -half) | (q >= half)
    if outside.any():
        row = int(np.argmax(outside.any(axis=1)))
        raise ValueError(
            f"codes row {row} holds {int(q[row][outside[row]][0])}, outside the {bits}-bit "
            f"range [{-half}, {half})"
        )
    return _c.wrap(_native.pack_int32(q, bits), torch_in)


def unpack_int32(packed: Any, bits: int, size: int) -> Any:
    """The first `size` codes of each row of `pack_int32`'s words (its inverse).

    Contract: `pyagent_ref.ops.quant.unpack_int32`.
    """
    torch_in = _array(packed, "packed", 2, ("int32",), "int32")
    bits = _bits(bits)
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    words = packed.shape[1]
    per_word = 32 // bits
    if size < 0 or -(-size // per_word) != words:
        raise ValueError(f"size must fill packed's {words} words of {per_word} codes, got {size}")
    return _c.wrap(_native.unpack_int32(_ints(packed, torch_in), bits, size), torch_in)


def dequant_matmul(x: Any, packed: Any, scales: Any, zeros: Any, bits: int) -> Any:
    """A linear layer on a packed quantized weight: y = x @ W^T.

    Contract: `pyagent_ref.ops.quant.dequant_matmul`.
    """
    torch_in = _float(x, "x", 2)
    p_torch = _array(packed, "packed", 2, ("int32",), "int32")
    bits = _bits(bits)
    in_features = x.shape[1]
    per_word = 32 // bits
    if in_features % per_word or packed.shape[1] != in_features // per_word:
        raise ValueError(
            f"packed must have shape (out_features, {in_features} / {per_word}) for x's "
            f"{in_features} features ({bits}-bit codes, a whole number of words), "
            f"got {tuple(packed.shape)}"
        )
    _groups(scales, zeros, packed.shape[0], in_features)
    z = None if zeros is None else _ints(zeros, _c.is_torch(zeros))
    out = _native.dequant_matmul(
        _floats(x, "x", torch_in),
        _ints(packed, p_torch),
        _floats(scales, "scales", _c.is_torch(scales)),
        z,
        bits,
    )
    return _c.wrap_float(out, x, torch_in)


# --- fp8 ------------------------------------------------------------------------------------


def _fp8_format(fmt: Any) -> bool:
    """The reference's `_fp8_format`: returns whether fmt is e5m2."""
    if not isinstance(fmt, str) or fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {FP8_FORMATS}, got {fmt!r}")
    return fmt == "e5m2"


def _fp8_scales(scales: Any, rows: int) -> None:
    """The reference's `_fp8_scales`."""
    _float(scales, "scales", 2)
    if tuple(scales.shape) not in ((1, 1), (rows, 1)):
        raise ValueError(
            f"scales must have shape (1, 1) (per tensor) or ({rows}, 1) (per channel), "
            f"got {tuple(scales.shape)}"
        )


DYNAMIC_SCALES = ("dynamic", "dynamic_per_token")


def _input_scale(input_scale: Any) -> float | str | None:
    """The reference's `_input_scale`."""
    if input_scale is None or input_scale in DYNAMIC_SCALES:
        return input_scale
    if isinstance(input_scale, str):
        raise ValueError(
            f"input_scale must be None, one of {DYNAMIC_SCALES} or a float, got {input_scale!r}"
        )
    if isinstance(input_scale, bool) or not isinstance(input_scale, (int, float)):
        raise TypeError(
            f"input_scale must be None, a string or a float, got {type(input_scale).__name__}"
        )
    if not 0 < float(input_scale) < float("inf"):
        raise ValueError(f"input_scale must be a positive finite float, got {input_scale!r}")
    return float(input_scale)


def _finite_rows(weight: Any, torch_in: bool) -> None:
    if torch_in:
        _c.check_cpu(weight, "weight")
        finite = _c.tensor_to_numpy(weight.detach().isfinite().all(dim=1))
    else:
        finite = np.isfinite(weight).all(axis=1)
    if not finite.all():
        raise ValueError(f"weight row {int(np.argmin(finite))} contains NaN or inf")


def quantize_fp8(weight: Any, fmt: str = "e4m3", per: str = "tensor") -> tuple[Any, Any]:
    """Quantize a weight to fp8 codes with a float32 scale per tensor or per output row.

    Contract: `pyagent_ref.ops.quant.quantize_fp8`.
    """
    torch_in = _float(weight, "weight", 2)
    e5m2 = _fp8_format(fmt)
    if per not in ("tensor", "channel"):
        raise ValueError(f"per must be 'tensor' or 'channel', got {per!r}")
    if weight.shape[1] == 0:
        raise ValueError(f"weight must have in_features >= 1, got shape {tuple(weight.shape)}")
    _finite_rows(weight, torch_in)
    codes, scales = _native.quantize_fp8(
        _floats(weight, "weight", torch_in), e5m2, per == "channel"
    )
    return _c.wrap(codes, torch_in), _c.wrap(scales, torch_in)


def dequantize_fp8(codes: Any, scales: Any, fmt: str = "e4m3") -> Any:
    """The float32 weight of fp8 codes and scales: W[o, i] = fp8(codes[o, i]) * s.

    Contract: `pyagent_ref.ops.quant.dequantize_fp8`.
    """
    torch_in = _array(codes, "codes", 2, ("uint8",), "uint8 (the fp8 bit patterns)")
    _fp8_scales(scales, codes.shape[0])
    e5m2 = _fp8_format(fmt)
    s = _floats(scales, "scales", _c.is_torch(scales))
    return _c.wrap(_native.dequantize_fp8(_ints(codes, torch_in), s, e5m2), torch_in)


def dequant_matmul_fp8(
    x: Any, codes: Any, scales: Any, fmt: str = "e4m3", input_scale: Any = None
) -> Any:
    """A linear layer on an fp8 weight: y = x' @ W^T, optionally with fp8 activations.

    Contract: `pyagent_ref.ops.quant.dequant_matmul_fp8`.
    """
    torch_in = _float(x, "x", 2)
    c_torch = _array(codes, "codes", 2, ("uint8",), "uint8 (the fp8 bit patterns)")
    if codes.shape[1] != x.shape[1]:
        raise ValueError(
            f"codes must have shape (out_features, {x.shape[1]}) for x's features, "
            f"got {tuple(codes.shape)}"
        )
    _fp8_scales(scales, codes.shape[0])
    e5m2 = _fp8_format(fmt)
    input_scale = _input_scale(input_scale)
    out = _native.dequant_matmul_fp8(
        _floats(x, "x", torch_in),
        _ints(codes, c_torch),
        _floats(scales, "scales", _c.is_torch(scales)),
        e5m2,
        None if input_scale is None or isinstance(input_scale, str) else input_scale,
        {"dynamic": "tensor", "dynamic_per_token": "token"}.get(input_scale),
    )
    return _c.wrap_float(out, x, torch_in)
