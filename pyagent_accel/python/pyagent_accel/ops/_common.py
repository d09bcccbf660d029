"""Argument normalisation shared by the ops wrappers (private).

The checks mirror `pyagent_ref.ops._arrays` step for step (same order, exception
classes and messages) for the two array libraries pyagent_accel supports: numpy
arrays and torch CPU tensors. torch is never imported here: a value is a tensor only
if torch is already loaded and the value is an instance of `torch.Tensor`.

Main arrays (logits, logprobs) are handed to Rust as zero-copy numpy views. Rows may
be strided (e.g. `logits[:, :vocab]` of a padded array), but each row must be
contiguous: a hidden copy of a (batch, vocab) array would cost more than the op.
Per-row parameters and id arrays are small and are converted like the reference
converts them.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import _native

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
FLOAT_DTYPE_NAMES = ("float32", "float64")


def torch_module() -> Any:
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def dtype_name(x: Any) -> str:
    """'float32', 'int64', ... for a numpy array or torch tensor."""
    return str(x.dtype).removeprefix("torch.")


def check_cpu(x: Any, name: str) -> None:
    """TypeError for a tensor that is not on the CPU (never copied silently)."""
    if x.device.type != "cpu":
        raise TypeError(
            f"{name} is a torch tensor on device {x.device}; pyagent_accel works on CPU "
            f"arrays only (move it with .cpu(), or use pyagent_ref for {x.device.type} tensors)"
        )


def torch_dtype(dtype: np.dtype) -> Any:
    torch = sys.modules["torch"]
    return {F32: torch.float32, F64: torch.float64, I64: torch.int64}[dtype]


def tensor_to_numpy(t: Any) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor."""
    return t.detach().resolve_neg().numpy()


def native_array(arr: np.ndarray) -> np.ndarray:
    """`arr` as a contiguous, aligned array (copies only small, non-contiguous input)."""
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.array(arr, order="C", copy=True)
    return arr


def logits_array(x: Any, name: str = "logits") -> tuple[np.ndarray, bool]:
    """The cheap checks of `check_logits`; returns (numpy view, input was torch).

    The row checks (NaN/+inf, all -inf) run in Rust, fused with each op.
    """
    if isinstance(x, np.ndarray):
        torch_in = False
    elif is_torch(x):
        check_cpu(x, name)
        torch_in = True
    elif isinstance(x, np.generic):
        x, torch_in = np.asarray(x), False
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")
    kind = dtype_name(x)
    if kind not in FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be float32 or float64, got dtype {kind}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, vocab), got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have a non-empty vocab axis, got shape {tuple(x.shape)}")
    arr = tensor_to_numpy(x) if torch_in else x
    rows_ok = arr.flags.c_contiguous or arr.strides[1] == arr.itemsize or arr.shape[1] == 1
    if not (rows_ok and arr.flags.aligned):
        raise ValueError(
            f"{name} must have contiguous rows (unit stride along the vocab axis), got "
            f"strides {arr.strides} for shape {tuple(arr.shape)}; pyagent_accel does not "
            "copy it silently (pass np.ascontiguousarray(x) or x.contiguous())"
        )
    return arr, torch_in


def wrap(out: Any, torch_in: bool) -> Any:
    """A result array in the input's library (torch: zero-copy)."""
    if torch_in:
        return sys.modules["torch"].from_numpy(out)
    return out


def row_param(torch_in: bool, batch: int, value: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """`_arrays.row_param`: a (batch,) array of `dtype`, converted like the reference."""
    if (
        not torch_in
        and type(value) is np.ndarray
        and value.dtype == dtype
        and value.ndim == 1
        and value.shape[0] == batch
    ):
        return native_array(value)
    kind = dtype_name(value) if hasattr(value, "dtype") else None
    if kind is not None and not ("float" in kind or "int" in kind):
        raise TypeError(f"{name} must hold numbers, got dtype {kind}")
    if kind is not None and "float" in kind and dtype == I64:
        raise TypeError(f"{name} must hold integers, got dtype {kind}")
    if is_torch(value):
        check_cpu(value, name)
    try:
        if torch_in:
            torch = sys.modules["torch"]
            arr = torch.asarray(value, dtype=torch_dtype(dtype), device="cpu")
        else:
            arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise TypeError(f"{name} must be array-like of numbers, got {value!r}") from exc
    if arr.ndim != 1 or arr.shape[0] != batch:
        raise ValueError(
            f"{name} must have shape ({batch},) to match the batch, got shape {tuple(arr.shape)}"
        )
    return native_array(tensor_to_numpy(arr) if torch_in else arr)


def token_ids(torch_in: bool, batch: int, vocab: int, ids: Any, name: str) -> np.ndarray:
    """`sampling._token_ids`: padded (batch, n) int64 ids; entries < 0 are padding."""
    kind = str(getattr(ids, "dtype", "int")).removeprefix("torch.")
    if "int" not in kind:
        raise TypeError(f"{name} must be an integer array, got dtype {kind}")
    if is_torch(ids):
        check_cpu(ids, name)
    if torch_in:
        torch = sys.modules["torch"]
        arr = torch.asarray(ids, dtype=torch.int64, device="cpu")
    else:
        arr = np.asarray(ids, dtype=I64)
    if arr.ndim != 2 or arr.shape[0] != batch:
        raise ValueError(f"{name} must have shape ({batch}, n), got shape {tuple(arr.shape)}")
    arr = native_array(tensor_to_numpy(arr) if torch_in else arr)
    if arr.size:
        top = int(arr.max())
        if top >= vocab:
            raise ValueError(f"{name} holds token id {top}, outside the vocab of {vocab}")
    return arr


def check_values(arr: np.ndarray, kind: str, message: str, bound: int = 0) -> None:
    """ValueError `message` (formatted with row and value) for the first bad entry.

    The scan runs in Rust (`_native.first_bad`); the message is formatted here so
    values print exactly as the reference prints them (Python float/int repr).
    """
    row = _native.first_bad(arr, kind, bound)
    if row >= 0:
        value = arr[row]
        value = int(value) if arr.dtype.kind == "i" else float(value)
        raise ValueError(message.format(row=row, value=value))


def check_logits(x: np.ndarray, name: str = "logits") -> None:
    """The row checks of `check_logits` (NaN/+inf, then all -inf), in Rust."""
    _native.check_logits(x, name)
