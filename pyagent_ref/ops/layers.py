"""Per-token layer ops of Llama-family models: RMS normalisation and the gated MLP activation.

Both work on the last axis of numpy arrays or torch tensors of any float dtype
(float16/bfloat16 are computed in float32 and rounded back once, as HF transformers does).
"""

from __future__ import annotations

from typing import Any

from ._arrays import ANY_FLOAT_DTYPE_NAMES, dtype_name, namespace

__all__ = ["rms_norm", "silu_and_mul"]


def _float_input(x: Any, name: str) -> Any:
    xp = namespace(x, name)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis, got a scalar")
    return xp


def rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any | tuple[Any, Any]:
    """Root-mean-square normalisation (Zhang and Sennrich 2019) with a learned scale.

    y = weight * (x / sqrt(mean(x**2, last axis) + eps)), where the normalisation is
    computed in float32 (float64 for float64 input), rounded to x's dtype, and then
    multiplied by `weight` in x's dtype (HF Llama's order). With `residual`, the input
    is first h = x + residual and the op returns (rms_norm(h), h): the fused form a
    decoder layer uses to carry the residual stream.

    Args:
        x: float array, shape (..., hidden).
        weight: float array, shape (hidden,).
        eps: float > 0.
        residual: optional array like x.
    Returns:
        An array like x, or (normalised, new residual).
    Raises:
        TypeError: non-float x or weight.
        ValueError: weight of the wrong shape, eps <= 0, residual of another shape.
    """
    xp = _float_input(x, "x")
    _float_input(weight, "weight")
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if residual is not None:
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(
                f"residual must have shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
        x = x + residual
    compute = xp.float64 if dtype_name(x) == "float64" else xp.float32
    h = xp.astype(x, compute, copy=False)
    normed = h / xp.sqrt(xp.mean(h * h, axis=-1, keepdims=True) + eps)
    out = xp.astype(weight, x.dtype, copy=False) * xp.astype(normed, x.dtype, copy=False)
    return out if residual is None else (out, x)


def silu_and_mul(x: Any) -> Any:
    """The SwiGLU activation of a fused gate/up projection: silu(gate) * up.

    x holds [gate, up] concatenated on the last axis; silu(g) = g * sigmoid(g) =
    g / (1 + exp(-g)). Computed in float32 (float64 for float64 input), returned in
    x's dtype.

    Args:
        x: float array, shape (..., 2 * d).
    Returns:
        An array of shape (..., d), x's dtype.
    Raises:
        TypeError: a non-float x. ValueError: an odd last axis.
    """
    xp = _float_input(x, "x")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and up halves), got {x.shape[-1]}")
    d = x.shape[-1] // 2
    compute = xp.float64 if dtype_name(x) == "float64" else xp.float32
    gate, up = (
        xp.astype(x[..., :d], compute, copy=False),
        xp.astype(x[..., d:], compute, copy=False),
    )
    return xp.astype(gate / (1.0 + xp.exp(-gate)) * up, x.dtype, copy=False)
