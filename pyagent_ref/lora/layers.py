"""The adapted linear layer: the base projection plus each token's LoRA update.

`LoRALinear` takes the place of one of the decoder's projections (qkv_proj, o_proj,
gate_up_proj or up_proj, down_proj) and keeps its parameters (same names, so nothing
else changes). It holds the adapters in slots: buffers of max_loras stacked factors
padded to max_lora_rank, which `LoRAManager` fills; B is stored rank-major, (max_loras,
max_lora_rank, out), and handed to the ops as its transposed view (the contract's
(max_loras, out, rank)): the expand then reads each rank column of a slot's B as one
contiguous row (the accelerator's fast path). Per step the runner sets
`LoRAState.indices`, each token's slot (-1: no adapter); the layer then adds

    out[t] += s_i * B_i (A_i x[t])      (`ops.lora.lora_shrink`, then `lora_expand`)

and, when a slot of the step holds a DoRA adapter, applies its g (`adapter`):

    out[t] = out[t] + (g_i - 1) * (out[t] - bias) + g_i * s_i * B_i A_i x[t]

(PEFT's form of bias + g * (W x + s B A x); g = 1 for rows and slots without DoRA). With
`indices` None (no token of the step has an adapter) the layer is the base projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LoRAState:
    """What the runner sets before each forward pass and clears after it.

    indices: per token of the flattened batch, its adapter's slot or -1; None when no
        token of the step has an adapter (the layers then add nothing).
    dora: whether a slot that a token of the step uses holds a DoRA adapter.
    """

    indices: torch.Tensor | None = None
    dora: bool = False

    def clear(self) -> None:
        self.indices, self.dora = None, False


class LoRALinear(nn.Linear):
    """A projection of the decoder with adapter slots (see the module docstring).

    Args:
        base: the projection it replaces (its weight and bias are taken, not copied), an
            `nn.Linear` or a quantized `QuantLinear` (kept as `quant_base`, which computes
            the base projection).
        slices: the sizes of its output slices (q, k, v for qkv_proj; gate, up for
            gate_up_proj; one slice otherwise).
        max_loras, max_rank: the slots.
        state: the per-step state every adapted layer shares.
        ops: the ops namespace (`use_ops` switches it with the model's).
    """

    def __init__(
        self,
        base: nn.Linear,
        slices: tuple[int, ...],
        max_loras: int,
        max_rank: int,
        state: LoRAState,
        ops: ModuleType,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        # a quantized base (`pyagent_ref.quant.linear.QuantLinear`, QLoRA) computes its
        # own projection from packed codes; a float one lends its weight
        self.quant_base = None if isinstance(base, nn.Linear) else base
        self.weight = base.weight if self.quant_base is None else None
        self.bias = base.bias
        # a row-parallel base (`distributed.tensor_parallel.RowParallelLinear`) computes
        # this rank's partial sum, completed by its all-reduce: the update is added to
        # the partial sum first (sum over ranks of B (A_r x_r) = B A x: exact)
        self.reduce_output = getattr(base, "reduce_output", None)
        if sum(slices) != self.out_features:
            raise ValueError(f"slices {slices} must sum to out_features={self.out_features}")
        self.slices = tuple(slices)
        self.max_rank = max_rank
        self.state = state
        self.ops = ops
        dtype = base.dtype if self.quant_base is not None else base.weight.dtype
        device = base.device if self.quant_base is not None else base.weight.device
        like = dict(dtype=dtype, device=device)
        buffer = lambda *shape, **kw: torch.zeros(*shape, **(like | kw))  # noqa: E731
        self.register_buffer(
            "lora_a", buffer(max_loras, len(slices) * max_rank, self.in_features), persistent=False
        )
        self.register_buffer(
            "lora_b_rank_major", buffer(max_loras, max_rank, self.out_features), persistent=False
        )
        self.register_buffer("scaling", buffer(max_loras, dtype=torch.float32), persistent=False)
        self.register_buffer(
            "dora_scale",
            torch.ones(max_loras, self.out_features, device=like["device"]),
            persistent=False,
        )

    def set_slot(
        self,
        slot: int,
        a: torch.Tensor | None,
        b: torch.Tensor | None,
        scaling: float,
        dora_scale: torch.Tensor | None,
    ) -> None:
        """Fill slot `slot` with an adapter's factors of this layer: a (num_slices, r, in),
        b (out, r), r <= max_rank, zero-padded to the slot's rank; None for an adapter
        that does not adapt this layer (the slot then adds exact zeros)."""
        r = 0 if a is None else a.shape[1]
        per_slice = self.lora_a[slot].view(len(self.slices), self.max_rank, self.in_features)
        per_slice.zero_()
        self.lora_b_rank_major[slot].zero_()
        if a is not None:
            per_slice[:, :r].copy_(a)
            self.lora_b_rank_major[slot, :r].copy_(b.T)
        self.scaling[slot] = scaling
        self.dora_scale[slot].fill_(1.0)
        if dora_scale is not None:
            self.dora_scale[slot].copy_(dora_scale)

    @property
    def lora_b(self) -> torch.Tensor:
        """The slots' B as the ops take it, (max_loras, out, max_rank): a view."""
        return self.lora_b_rank_major.transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_base is not None:
            out = self.quant_base(x)
        elif self.reduce_output is not None:  # a partial sum; its bias comes after
            out = F.linear(x, self.weight)
        else:
            out = F.linear(x, self.weight, self.bias)
        out = self._update(x, out)
        return out if self.reduce_output is None else self.reduce_output(out)

    def _update(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out` (the base projection) with each token's adapter update."""
        indices = self.state.indices
        if indices is None:
            return out
        lora = self.ops.lora
        y = lora.lora_shrink(x, self.lora_a, indices)
        if not self.state.dora:
            return lora.lora_expand(y, self.lora_b, indices, self.scaling, out, self.slices)
        delta = lora.lora_expand(y, self.lora_b, indices, self.scaling, None, self.slices)
        g = self.dora_scale[indices.clamp(min=0)].masked_fill((indices < 0)[:, None], 1.0)
        bias = None if self.reduce_output is not None else self.bias
        base = out.float() if bias is None else out.float() - bias.float()
        return (out.float() + (g - 1) * base + g * delta.float()).to(out.dtype)

    def extra_repr(self) -> str:
        slots, rank = self.lora_a.shape[0], self.max_rank
        return f"{super().extra_repr()}, slices={self.slices}, slots={slots}, max_rank={rank}"
