from typing import Any

__all__ = ["verify_greedy", "rejection_sample"]

def verify_greedy(target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any) -> Any: ...
def rejection_sample(
    target_logits: Any,
    draft_token_ids: Any,
    num_draft_tokens: Any,
    draft_probs: Any,
    temperature: Any,
    seeds: Any,
    positions: Any,
) -> Any: ...
