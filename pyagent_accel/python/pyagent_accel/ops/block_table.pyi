from typing import Any

__all__ = ["PAD_SLOT_ID", "compute_positions", "compute_slot_mapping", "compute_logits_indices"]

PAD_SLOT_ID: int

def compute_positions(query_start_loc: Any, num_computed_tokens: Any, num_tokens: int) -> Any: ...
def compute_slot_mapping(
    block_table: Any, query_start_loc: Any, positions: Any, block_size: int
) -> Any: ...
def compute_logits_indices(query_start_loc: Any) -> Any: ...
