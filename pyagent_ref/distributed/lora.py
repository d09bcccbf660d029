"""LoRA adapters on a rank: read against the whole model's shapes, cut like the base.

Every rank keeps a `lora.manager.LoRAManager` over its share of the model (its
projections, already parallel, wrapped in `LoRALinear`), with the same slots, and reads
each adapter itself from the same path, in the same steps, so that the slots of every
rank hold the same adapters and each token's slot index is the same everywhere (the
ranks receive the same `SchedulerOutput`). An adapter is checked against the whole
model (a meta skeleton: shapes, no weights), then each adapted layer's factors are cut
by the `tensor_parallel.Cut` of its base weight:

- column-parallel base (qkv_proj, gate_up_proj, up_proj; W's rows cut): B's rows cut
  alike, A whole. q/k/v and gate/up are cut per sub-projection, as the base is (whole
  heads, replicated KV heads included; gate and up alike), since the cut lists the
  rows of every slice.
- row-parallel base (o_proj, down_proj; W's columns cut): A's columns cut alike, B
  whole. The rank adds s B (A_r x_r) to its partial sum x_r W_r^T before the layer's
  existing all-reduce, so the sum over ranks is x W^T + s B (A x): exact up to the
  order of the float additions, with no collective added.

With pipeline parallelism a rank adapts only its stage's layers (the adapter's other
layers are read, then left unused). DoRA is refused under either: its magnitude scale
divides by the norm of each row of W + s B A, which needs the whole base weight.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ..lora.adapter import AdapterLayer, LoRAAdapter, load_adapter
from ..lora.manager import adaptable_layers
from ..lora.request import LoRARequest
from .tensor_parallel import Cut


class AdapterShare:
    """The `share` of a rank's `LoRAManager` (see the module docstring).

    Args:
        whole: the whole model, on the meta device (its shapes name and check an
            adapter's modules), not wrapped.
        plan: this rank's `tensor_parallel.split_plan` of `whole` (empty: adapters kept
            whole, as the engine's process validates them).
    """

    def __init__(self, whole: nn.Module, plan: dict[str, Cut]) -> None:
        self.model, self.plan = whole, plan
        self.layers = adaptable_layers(whole)

    @classmethod
    def of_rank(cls, model_dir: str, dtype: str, ctx) -> AdapterShare:
        """The share of rank `ctx` (a `ParallelContext`) of the model in `model_dir`."""
        from .engine import model_skeleton
        from .tensor_parallel import split_plan

        whole = model_skeleton(model_dir, dtype)
        return cls(whole, split_plan(whole, ctx) if ctx.tp_size > 1 else {})

    def fit(self, request: LoRARequest, max_rank: int) -> LoRAAdapter:
        """The adapter of `request`, checked against the whole model (`load_adapter`,
        DoRA refused: ValueError), each layer's factors cut to this rank's share."""
        adapter = load_adapter(request, self.model, self.layers, max_rank, dora=False)
        return dataclasses.replace(
            adapter, layers={path: self.cut(path, layer) for path, layer in adapter.layers.items()}
        )

    def cut(self, path: str, layer: AdapterLayer) -> AdapterLayer:
        """One layer's factors (A (slices, r, in), B (out, r)) cut as its base weight."""
        cut = self.plan.get(f"{path}.weight")
        if cut is None:  # a layer kept whole
            return layer
        if cut.dim == 0:  # column-parallel: W's rows, so B's rows
            return AdapterLayer(layer.a, cut.apply(layer.b), None)
        return AdapterLayer(Cut(2, cut.index).apply(layer.a), layer.b, None)  # W's columns
