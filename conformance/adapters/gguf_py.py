"""The `gguf` package (llama.cpp's gguf-py) behind the `ops.gguf` signatures.

    python -m conformance conformance.adapters.gguf_py gguf

``dequantize(raw, fmt)`` is ``gguf.quants.dequantize(raw, GGMLQuantizationType[fmt])`` and
``quantize(weight, fmt)`` is ``gguf.quants.quantize(weight as float32, ...)``, on numpy
(a torch tensor is converted and the result converted back): this shows whether our
reading of each block format matches the one llama.cpp's own Python package implements,
bit for bit. gguf-py has no matmul (CONFORMANCE_MISSING) and quantizes only Q8_0 and
Q4_0 of our formats (Q4_K and Q6_K raise NotImplementedError: registered divergences). A
tensor of no rows, which gguf-py cannot reshape, is answered by the adapter (empty).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import contract
from ..core import library_of, to_numpy
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    "gguf.gguf_matmul": "gguf-py reads and writes tensors; it has no matmul",
    **{
        f"{m}.*": "gguf-py implements only llama.cpp's block formats"
        for m in contract.modules()
        if m != "gguf"
    },
}

VERSION: str | None = None


def _gguf() -> Any:
    """The gguf module, or an ImportError that says what to install."""
    global VERSION
    try:
        import gguf
    except ImportError as exc:
        raise ImportError("conformance.adapters.gguf_py needs gguf: pip install gguf") from exc
    from importlib.metadata import version

    VERSION = f"gguf {version('gguf')}"
    return gguf


def _like(like: Any, arr: np.ndarray) -> Any:
    if library_of(like) == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr))
    return arr


def _call(fn: Any, x: np.ndarray, fmt: str, empty: tuple[int, int], dtype: Any) -> np.ndarray:
    """fn(x, type); a tensor of no rows is answered here (gguf-py cannot reshape it)."""
    if x.ndim == 2 and x.shape[0] == 0:
        return np.zeros(empty, dtype)
    return fn(x, _gguf().GGMLQuantizationType[fmt])


def quantize(weight: Any, fmt: str) -> Any:
    w = np.asarray(to_numpy(weight), dtype=np.float32)
    size, type_size = _sizes(fmt)
    empty = (0, w.shape[-1] // size * type_size)
    return _like(weight, _call(_gguf().quants.quantize, w, fmt, empty, np.uint8))


def dequantize(raw: Any, fmt: str) -> Any:
    r = to_numpy(raw)
    size, type_size = _sizes(fmt)
    empty = (0, r.shape[-1] // type_size * size)
    return _like(raw, _call(_gguf().quants.dequantize, r, fmt, empty, np.float32))


def _sizes(fmt: str) -> tuple[int, int]:
    gguf = _gguf()
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]


# `gguf_py.gguf`: the functions above, named like the reference's ops.
__getattr__ = lazy_namespaces(__name__, globals(), ("gguf",), _gguf)
