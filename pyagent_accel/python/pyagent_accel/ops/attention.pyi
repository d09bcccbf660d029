from collections.abc import Sequence
from typing import Any

__all__ = [
    "reshape_and_cache",
    "concat_and_cache_mla",
    "paged_attention",
    "paged_decode_attention",
]

def reshape_and_cache(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None: ...
def concat_and_cache_mla(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any) -> None: ...
def paged_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    query_start_loc: Any,
    seq_lens: Any,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: Any = None,
    custom_masks: Sequence[Any | None] | None = None,
    causal: bool = True,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Any: ...
def paged_decode_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    seq_lens: Any,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: Any = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Any: ...
