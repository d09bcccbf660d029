"""Multi-LoRA serving: adapters in PEFT's format, applied per token in batched steps.

- `request`: `LoRARequest` (name, id, path: what a request asks for) and `LoRAConfig`
  (the engine's slots).
- `adapter`: reading and validating an adapter directory, fitting it to the model's
  fused layers; scaling (alpha / r, rsLoRA's alpha / sqrt(r)) and DoRA's g.
- `layers`: `LoRALinear`, a projection with adapter slots, applying `ops.lora`.
- `manager`: `LoRAManager`, the host cache (LRU, pinning) and the slots, and the
  per-token slot indices of each step.
"""

from .request import LoRAConfig, LoRARequest

__all__ = ["LoRAConfig", "LoRARequest"]
