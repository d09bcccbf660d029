"""llguidance's bitmask functions behind the `ops.structured` signature.

    python -m conformance conformance.adapters.llguidance structured

`structured` (built on first access, which imports llguidance) provides:

    apply_token_bitmask  llguidance.numpy.apply_token_bitmask_inplace on a copy of numpy
                         logits; llguidance.torch.apply_token_bitmask_inplace on a clone
                         of a tensor (both mask in place)

Each library's arrays go to llguidance's function for that library; a bitmask of the
other library is converted to the logits' library (a copy). Anything else is passed on
as it is: llguidance's own checks (assertions) are what is tested. The other ops modules
and `tokenize` have no counterpart (CONFORMANCE_MISSING).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import contract
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    f"{m}.*": "llguidance is a structured-output library: it has no such op"
    for m in contract.modules()
    if m != "structured"
} | {"tokenize.*": "llguidance has no tokenizer of its own (it reads HF tokenizers)"}

VERSION: str | None = None


def _llguidance() -> Any:
    """The llguidance module, or an ImportError that says what to install."""
    global VERSION
    try:
        from importlib.metadata import version

        import llguidance
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.llguidance needs llguidance: pip install llguidance"
        ) from exc
    VERSION = f"llguidance {version('llguidance')}"
    return llguidance


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    _llguidance()
    if isinstance(logits, np.ndarray):
        from llguidance.numpy import apply_token_bitmask_inplace

        out = np.array(logits, copy=True)
        if hasattr(bitmask, "numpy"):
            bitmask = bitmask.numpy()
    else:
        import torch
        from llguidance.torch import apply_token_bitmask_inplace

        out = logits.clone() if isinstance(logits, torch.Tensor) else logits
        if isinstance(bitmask, np.ndarray):
            bitmask = torch.from_numpy(np.array(bitmask, copy=True))
    apply_token_bitmask_inplace(out, bitmask)
    return out


# `llguidance.structured`: the op above, named like the reference's.
__getattr__ = lazy_namespaces(__name__, globals(), ("structured",), _llguidance)
