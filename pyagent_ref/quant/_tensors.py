"""Checking a quantized layer's stored tensors, with errors that name the tensor."""

from __future__ import annotations

import torch


def expect(
    stored: dict[str, torch.Tensor],
    module: str,
    suffix: str,
    dtype: torch.dtype | None,
    ndim: int,
    shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """stored[suffix], which must exist, have `ndim` axes, `dtype` (None: any float dtype
    for scales, any integer dtype otherwise) and `shape` when given.

    Raises:
        ValueError: it is missing or not as expected; the message names `module.suffix`.
    """
    name = f"{module}.{suffix}"
    tensor = stored.get(suffix)
    if tensor is None:
        raise ValueError(f"quantized checkpoint lacks tensor {name!r}")
    if dtype is not None and tensor.dtype != dtype:
        raise ValueError(f"checkpoint tensor {name!r} has dtype {tensor.dtype}, expected {dtype}")
    if dtype is None and tensor.is_floating_point() != (
        suffix.endswith("scale") or suffix == "scales"
    ):
        raise ValueError(f"checkpoint tensor {name!r} has the wrong kind of dtype {tensor.dtype}")
    if tensor.ndim != ndim or (shape is not None and tuple(tensor.shape) != tuple(shape)):
        expected = shape if shape is not None else f"{ndim} axes"
        raise ValueError(
            f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected}"
        )
    return tensor
