from typing import Any

__all__ = ["causal_conv1d", "selective_scan", "ssd_scan", "selective_state_update"]

ACTIVATIONS: tuple[str | None, ...]

def causal_conv1d(
    x: Any,
    weight: Any,
    bias: Any,
    conv_state: Any,
    query_start_loc: Any,
    activation: str | None = None,
) -> tuple[Any, Any]: ...
def selective_scan(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    state: Any,
    query_start_loc: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    chunk_size: int | None = None,
) -> tuple[Any, Any]: ...
def ssd_scan(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    state: Any,
    query_start_loc: Any,
    chunk_size: int = 256,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]: ...
def selective_state_update(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]: ...
