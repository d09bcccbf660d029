from typing import Any

__all__ = ["route_topk_softmax", "route_grouped_topk", "fused_moe"]

def route_topk_softmax(logits: Any, k: int, renormalize: bool) -> tuple[Any, Any]: ...
def route_grouped_topk(
    logits: Any,
    k: int,
    num_groups: int,
    topk_groups: int,
    correction_bias: Any = None,
    scoring: str = "sigmoid",
    routed_scaling_factor: float = 1.0,
    renormalize: bool = True,
    group_score: str = "top2_sum",
) -> tuple[Any, Any]: ...
def fused_moe(
    hidden: Any,
    w_gate_up: Any,
    w_down: Any,
    topk_weights: Any,
    topk_ids: Any,
    activation: str = "silu",
) -> Any: ...
