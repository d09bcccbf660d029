"""xgrammar's bitmask kernel behind the `ops.structured` signature.

    python -m conformance conformance.adapters.xgrammar structured

`structured` (built on first access, which imports xgrammar) provides:

    apply_token_bitmask  xgrammar.apply_token_bitmask_inplace(logits, bitmask) on a copy
                         of the logits (xgrammar masks in place), vocab_size left to its
                         default, backend "auto" (its C++ kernel for CPU tensors)

xgrammar takes torch tensors only: numpy arguments go in as tensors and the result comes
back as numpy; anything else is passed on as it is. It validates nothing here: what
xgrammar accepts or rejects is what is tested.

The logits are handed over as a C-contiguous copy followed by SPARE unused elements.
xgrammar 0.2.8's CPU kernel writes -inf for the clear bits of a row's last word even past
the vocabulary: into the next row's first tokens (which shows, see the registered
divergences) and, after the last row, past the end of the tensor, which corrupted the
heap and aborted the process in a direct test (vocab 40, two rows); the spare elements
take those writes. The bitmask is passed as it is (a numpy one as a tensor sharing its
memory), strides included.
The other ops modules and `tokenize` have no counterpart (CONFORMANCE_MISSING).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import contract
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    f"{m}.*": "xgrammar is a structured-output library: it has no such op"
    for m in contract.modules()
    if m != "structured"
} | {"tokenize.*": "xgrammar has no tokenizer of its own (it reads HF tokenizers)"}

VERSION: str | None = None


def _xgrammar() -> Any:
    """The xgrammar module, or an ImportError that says what to install."""
    global VERSION
    try:
        from importlib.metadata import version

        import xgrammar
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.xgrammar needs xgrammar and torch: pip install xgrammar"
        ) from exc
    VERSION = f"xgrammar {version('xgrammar')}"
    return xgrammar


SPARE = 64
"""Elements after the last row of the logits copy: room for the kernel's overrun."""


def _tensor(x: Any) -> Any:
    """A numpy array as a tensor (sharing its memory); a tensor or anything else as it is."""
    import torch

    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _padded_copy(x: Any) -> Any:
    """A C-contiguous copy of tensor `x` followed by SPARE unused elements in memory."""
    import torch

    buffer = torch.empty(x.numel() + SPARE, dtype=x.dtype)
    out = buffer[: x.numel()].view(x.shape)
    out.copy_(x)
    return out


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    import torch

    out = _tensor(logits)
    if isinstance(out, torch.Tensor):
        out = _padded_copy(out)
    _xgrammar().apply_token_bitmask_inplace(out, _tensor(bitmask))
    return out.numpy() if isinstance(logits, np.ndarray) else out


# `xgrammar.structured`: the op above, named like the reference's.
__getattr__ = lazy_namespaces(__name__, globals(), ("structured",), _xgrammar)
