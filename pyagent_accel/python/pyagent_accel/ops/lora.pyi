from collections.abc import Sequence
from typing import Any

__all__ = ["lora_shrink", "lora_expand"]

def lora_shrink(x: Any, lora_a: Any, indices: Any) -> Any: ...
def lora_expand(
    y: Any,
    lora_b: Any,
    indices: Any,
    scaling: Any,
    out: Any = None,
    output_slices: Sequence[int] | None = None,
) -> Any: ...
