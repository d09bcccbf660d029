from typing import Any

__all__ = ["ROPE_TYPES", "rope_inv_freq", "apply_rope", "apply_mrope"]

ROPE_TYPES: tuple[str, ...]

def rope_inv_freq(
    rotary_dim: int,
    theta: float,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 2048,
    seq_len: int | None = None,
    like: Any = None,
) -> tuple[Any, float]: ...
def apply_rope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> tuple[Any, Any]: ...
def apply_mrope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    mrope_section: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> tuple[Any, Any]: ...
