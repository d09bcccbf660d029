from typing import Any

__all__ = [
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_penalties",
    "apply_logit_bias",
    "log_softmax",
    "topk_logprobs",
    "philox_uniform",
    "sample",
]

PHILOX_M0: int
PHILOX_M1: int
PHILOX_W0: int
PHILOX_W1: int

def apply_temperature(logits: Any, temperature: Any) -> Any: ...
def apply_top_k(logits: Any, k: Any) -> Any: ...
def apply_top_p(logits: Any, p: Any) -> Any: ...
def apply_min_p(logits: Any, min_p: Any) -> Any: ...
def apply_penalties(
    logits: Any,
    prompt_ids: Any,
    output_ids: Any,
    repetition_penalty: Any,
    frequency_penalty: Any,
    presence_penalty: Any,
) -> Any: ...
def apply_logit_bias(logits: Any, token_ids: Any, bias: Any) -> Any: ...
def log_softmax(logits: Any) -> Any: ...
def topk_logprobs(logprobs: Any, num: int, sampled: Any) -> tuple[Any, Any, Any, Any]: ...
def philox_uniform(seeds: Any, positions: Any, num: int) -> Any: ...
def sample(logits: Any, temperature: Any, seeds: Any, positions: Any) -> Any: ...
