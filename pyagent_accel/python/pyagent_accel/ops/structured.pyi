from typing import Any

__all__ = ["apply_token_bitmask"]

def apply_token_bitmask(logits: Any, bitmask: Any) -> Any: ...
