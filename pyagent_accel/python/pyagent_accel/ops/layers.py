"""RMS norm and SwiGLU in Rust: drop-in replacements for `pyagent_ref.ops.layers`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors of float16, bfloat16, float32 or float64 (torch is optional and never imported
here); results come back in the input's library and dtype, tensors as zero-copy views
of the Rust-filled buffers. Each op is one native call, rows in parallel with the GIL
released.

Exactness: the reference's operations in its order and dtypes (half types in float32,
rounded where the reference rounds), so results are its bits except for the last bit of
two library functions, within the specification's tolerance: `rms_norm` sums the squares
in numpy's pairwise order (torch's own sum differs from numpy's there), `silu_and_mul`
uses an exp accurate to 1 ulp (numpy's and torch's differ from each other as well).
Rounded to float16/bfloat16 these rarely show; the residual sum of `rms_norm` is exact.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Strided views are read in place as long as the last axis is contiguous; an array
  whose last axis is strided raises ValueError naming it (the reference copies).
- torch inputs that require grad are read through `detach()`; results carry no graph.
"""

from __future__ import annotations

from typing import Any

from .. import _native
from . import _common as _c

__all__ = ["rms_norm", "silu_and_mul"]


def _float_input(x: Any, name: str) -> bool:
    """The reference's `_float_input`: returns whether x is a torch tensor."""
    torch_in = _c.array_library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be a float array, got dtype {kind}")
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis, got a scalar")
    return torch_in


def rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any | tuple[Any, Any]:
    """Root-mean-square normalisation with a learned scale, optionally fused with the
    residual add (returns (normalised, x + residual) then).

    Contract: `pyagent_ref.ops.layers.rms_norm`.
    """
    torch_in = _float_input(x, "x")
    _float_input(weight, "weight")
    if weight.shape != (x.shape[-1],):  # tuples (torch.Size is one)
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    kind = _c.dtype_name(x)
    res = None
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(
                f"residual must have shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
        if type(residual) is not type(x) or residual.dtype != x.dtype:
            # another library or dtype: the reference's sum (its type promotion), unfused
            h = x + residual
            return rms_norm(h, weight, eps), h
        res = _c.float_view(residual, "residual", torch_in)
    w = _c.float_as(weight, kind)
    w = _c.float_view(w, "weight", _c.is_torch(w))
    out = _native.rms_norm(_c.float_view(x, "x", torch_in), w, float(eps), res)
    if res is None:
        return _c.wrap_float(out, x, torch_in)
    return _c.wrap_float(out[0], x, torch_in), _c.wrap_float(out[1], x, torch_in)


def silu_and_mul(x: Any) -> Any:
    """silu(gate) * up for x = [gate, up] on the last axis.

    Contract: `pyagent_ref.ops.layers.silu_and_mul`.
    """
    torch_in = _float_input(x, "x")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and up halves), got {x.shape[-1]}")
    return _c.wrap_float(_native.silu_and_mul(_c.float_view(x, "x", torch_in)), x, torch_in)
