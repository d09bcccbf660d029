from typing import Any

__all__ = [
    "verify_greedy",
    "rejection_sample",
    "tree_attention_mask",
    "verify_tree_greedy",
    "rejection_sample_tree",
    "propose_ngram",
]

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
def tree_attention_mask(draft_parents: Any) -> Any: ...
def verify_tree_greedy(
    target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any, draft_parents: Any
) -> Any: ...
def rejection_sample_tree(
    target_logits: Any,
    draft_token_ids: Any,
    num_draft_tokens: Any,
    draft_parents: Any,
    temperature: Any,
    seeds: Any,
    positions: Any,
) -> Any: ...
def propose_ngram(
    token_ids: Any, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int
) -> list[int]: ...
