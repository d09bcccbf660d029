"""Mixture-of-experts families on the Llama decoder: Mixtral, Qwen2-MoE, Qwen3-MoE (and
the MoE layers of DeepSeek-V2/V3, `model.deepseek`).

These models are the Llama-family decoder (`model.llama`: attention, RoPE, norms, the
paged cache) with the MLP of some or all layers replaced by a sparse MoE block
(`SparseMoeBlock`): a router (`gate`, a linear map to one logit per expert) picks each
token's top-k experts by softmax (`ops.moe.route_topk_softmax`), the experts' gated
MLPs run on the tokens routed to them (`ops.moe.fused_moe`), and their outputs are
summed with the routing weights. Qwen2-MoE adds a shared expert that every token goes
through, scaled by a sigmoid gate. What differs between the families is configuration
(`ModelConfig.moe`): which layers are sparse (Qwen's `decoder_sparse_step` and
`mlp_only_layers`), whether the top-k weights are renormalised (Mixtral always,
Qwen's `norm_topk_prob`), the shared expert; and the checkpoint's tensor names.

With an expert placement (`model.eplb`, `MoEForCausalLM.apply_expert_placement`) a layer
keeps one weight copy per physical slot and sends each routing choice to one replica of
its expert, as expert parallelism lays experts out over ranks; `record_expert_load`
counts each expert's tokens for the rebalancing.

The experts of a layer are kept stacked, as `fused_moe` takes them: `gate_up_proj`
(experts, 2 * inter, hidden) and `down_proj` (experts, hidden, inter). HF checkpoints
hold one tensor per expert and projection; `checkpoint_target` says where each goes and
`checkpoint_name` names the tensor a missing piece should have come from.

DeepSeek's MoE layers are the same block with another router (`MoEConfig.grouped`):
`ops.moe.route_grouped_topk` on router logits computed in float32 (softmax scores and
group-limited choice for V2, sigmoid scores steered by `gate.e_score_correction_bias` for
V3, the weights times `routed_scaling_factor`), and an ungated shared expert.
"""

from __future__ import annotations

import re
from types import ModuleType

import torch
from torch import nn

from .. import ops as reference_ops
from .config import ModelConfig
from .eplb import ExpertLoadWindow, ExpertPlacement
from .llama import MLP, LlamaForCausalLM


class Experts(nn.Module):
    """The stacked weights of a layer's experts (the layout `ops.moe.fused_moe` takes)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size)
        )
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))


class Router(nn.Module):
    """A layer's router: one logit per expert, x W^T with `weight` (experts, hidden);
    with `float32` (DeepSeek's routers, as HF runs them) computed in float32 and its
    parameters kept in float32 whatever the model's dtype (`keep_float32`, which the
    loader honours: a correction bias rounded to bfloat16 would pick other experts).
    DeepSeek-V3's `e_score_correction_bias` (experts,) when `correction_bias`, else None."""

    def __init__(
        self, hidden_size: int, num_experts: int, float32: bool, correction_bias: bool
    ) -> None:
        super().__init__()
        self.float32 = self.keep_float32 = float32
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.e_score_correction_bias = None
        if correction_bias:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.float32:
            return nn.functional.linear(x.float(), self.weight.float())
        return nn.functional.linear(x, self.weight)


class SparseMoeBlock(nn.Module):
    """Router, routed experts and the optional (gated) shared expert of one layer."""

    def __init__(self, config: ModelConfig, ops: ModuleType) -> None:
        super().__init__()
        moe = config.moe
        self.ops = ops
        self.top_k = moe.top_k
        self.renormalize = moe.renormalize
        self.grouped = moe.grouped
        bias = moe.grouped is not None and moe.grouped.correction_bias
        self.gate = Router(config.hidden_size, moe.num_experts, moe.grouped is not None, bias)
        self.experts = Experts(moe.num_experts, config.hidden_size, moe.intermediate_size)
        self.shared_expert = None
        self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = MLP(config, ops, moe.shared_expert_intermediate_size)
        if moe.shared_expert_gate:
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)
        self.placement: tuple[torch.Tensor, ...] | None = None
        self.load_window: tuple[ExpertLoadWindow, int] | None = None

    def set_placement(self, physical_to_logical: torch.Tensor | None) -> None:
        """Run the experts as an EPLB placement lays them out (`model.eplb`): one weight
        copy per physical slot (slot p holds logical expert physical_to_logical[p]), and
        the j-th choice of token t, logical expert e, goes to e's replica number
        (t * top_k + j) mod replicas[e] (its slots in increasing order). The output is
        the logical experts' (replicas have the same weights). None: no placement.
        """
        if physical_to_logical is None:
            self.placement = None
            return
        weights = self.experts.gate_up_proj
        p2l = torch.as_tensor(physical_to_logical, dtype=torch.int64, device=weights.device)
        counts = torch.bincount(p2l, minlength=weights.shape[0])
        if p2l.ndim != 1 or len(counts) != weights.shape[0] or bool((counts == 0).any()):
            raise ValueError(
                f"physical_to_logical must place each of the {weights.shape[0]} experts, "
                f"got {p2l.tolist()}"
            )
        slots = torch.argsort(p2l, stable=True)  # each expert's slots, together, in order
        first = torch.cumsum(counts, 0) - counts
        self.placement = (
            slots,
            first,
            counts,
            weights[p2l].contiguous(),
            self.experts.down_proj[p2l].contiguous(),
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights, topk_ids) of the router: logical expert ids (tokens, top_k)."""
        moe, logits = self.ops.moe, self.gate(x)
        if self.grouped is None:
            return moe.route_topk_softmax(logits, self.top_k, self.renormalize)
        g = self.grouped
        return moe.route_grouped_topk(
            logits,
            self.top_k,
            g.num_groups,
            g.topk_groups,
            self.gate.e_score_correction_bias,
            g.scoring,
            g.routed_scaling_factor,
            self.renormalize,
            g.group_score,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        if self.load_window is not None:  # EPLB statistics (reads the choices on the host)
            window, index = self.load_window
            window.record(index, ids.cpu().numpy())
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        if self.placement is not None:  # each choice to one replica of its expert
            slots, first, counts, gate_up, down = self.placement
            spread = torch.arange(ids.numel(), device=ids.device).reshape(ids.shape)
            ids = slots[first[ids] + spread % counts[ids]]
        out = self.ops.moe.fused_moe(x, gate_up, down, weights, ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


class MoEForCausalLM(LlamaForCausalLM):
    """A Llama-family decoder whose sparse layers (`config.moe.sparse_layers`) have a
    `SparseMoeBlock` for an MLP. Subclasses name the checkpoint's expert tensors:
    `BLOCK`, the layer's submodule in HF names, and `PROJECTIONS`, the HF names of each
    expert's gate, up and down projections."""

    BLOCK = "mlp"
    PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        if config.moe is None:
            raise ValueError(f"{type(self).__name__} needs an MoE config, got moe=None")
        super().__init__(config, ops)

    def make_mlp(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> nn.Module:
        if layer_index in config.moe.sparse_layers:
            return SparseMoeBlock(config, ops)
        return MLP(config, ops)

    @property
    def supports_cuda_graphs(self) -> bool:
        """False: the reference `fused_moe` reads on the host how many tokens each expert
        got (one matmul per expert), which a CUDA graph cannot capture; decode steps run
        eagerly."""
        return False

    def moe_blocks(self) -> list[SparseMoeBlock]:
        """The sparse MoE blocks, in layer order (EPLB's "MoE layers")."""
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, SparseMoeBlock)]

    def record_expert_load(self, window: int | None) -> ExpertLoadWindow | None:
        """Count the tokens routed to each expert of each MoE layer over the last `window`
        steps (`model.eplb.ExpertLoadWindow`; the caller advances it each step), or stop
        counting (None). Recording reads the routing choices on the host every forward.

        Returns:
            The window, or None.
        """
        blocks = self.moe_blocks()
        found = None
        if window is not None:
            found = ExpertLoadWindow(len(blocks), self.config.moe.num_experts, window)
        for i, block in enumerate(blocks):
            block.load_window = None if found is None else (found, i)
        return found

    def apply_expert_placement(self, placement: ExpertPlacement | None) -> None:
        """Lay out every MoE layer's experts as `placement` says (one row per MoE layer,
        `model.eplb.rebalance_experts`), or as the logical experts (None).

        Raises:
            ValueError: a placement for another number of MoE layers or experts.
        """
        blocks = self.moe_blocks()
        if placement is not None and (
            placement.physical_to_logical.shape[0] != len(blocks)
            or placement.num_experts != self.config.moe.num_experts
        ):
            raise ValueError(
                f"placement must cover {len(blocks)} MoE layers of "
                f"{self.config.moe.num_experts} experts, got "
                f"{placement.physical_to_logical.shape[0]} of {placement.num_experts}"
            )
        for i, block in enumerate(blocks):
            block.set_placement(None if placement is None else placement.physical_to_logical[i])

    def required_ops(self) -> list[str]:
        """The decoder's ops and the MoE block's router and experts."""
        router = "route_topk_softmax" if self.config.moe.grouped is None else "route_grouped_topk"
        return [*super().required_ops(), f"moe.{router}", "moe.fused_moe"]

    def checkpoint_target(self, name: str) -> tuple[str, tuple[int, int | None]] | None:
        """Where checkpoint tensor `name` ("model." removed) goes if it belongs to the MoE
        block: (our stacked parameter, (expert, 0 gate / 1 up / None down)), or (our name,
        None) for the router under another block name; None for anything else."""
        gate, up, down = self.PROJECTIONS
        found = re.fullmatch(
            rf"layers\.(\d+)\.{self.BLOCK}\.experts\.(\d+)\.({gate}|{up}|{down})\.weight", name
        )
        if found is None:
            if self.BLOCK != "mlp" and f".{self.BLOCK}." in name:
                return name.replace(f".{self.BLOCK}.", ".mlp."), None
            return None
        layer, expert, proj = int(found[1]), int(found[2]), found[3]
        if expert >= self.config.moe.num_experts:
            return None  # no place in the model: the loader names the tensor
        param = "down_proj" if proj == down else "gate_up_proj"
        half = {gate: 0, up: 1, down: None}[proj]
        return f"layers.{layer}.mlp.experts.{param}", (expert, half)

    def checkpoint_name(self, param: str, shard: object) -> str | None:
        """The checkpoint tensor that fills `shard` of our parameter `param` if it belongs
        to the MoE block (see `checkpoint_target`), else None."""
        layer = param.split(".")[1] if param.startswith("layers.") else None
        if isinstance(shard, tuple):  # (expert, half) of the stacked experts
            expert, half = shard
            proj = self.PROJECTIONS[2 if half is None else half]
            return f"model.layers.{layer}.{self.BLOCK}.experts.{expert}.{proj}.weight"
        if param == f"layers.{layer}.mlp.gate.weight":
            return f"model.layers.{layer}.{self.BLOCK}.gate.weight"
        return None


class MixtralForCausalLM(MoEForCausalLM):
    """Mixtral: every layer sparse, top-k renormalised; HF's `block_sparse_moe` with
    experts' `w1` (gate), `w3` (up), `w2` (down)."""

    BLOCK = "block_sparse_moe"
    PROJECTIONS = ("w1", "w3", "w2")


class QwenMoeForCausalLM(MoEForCausalLM):
    """Qwen2-MoE and Qwen3-MoE: sparse layers by decoder_sparse_step / mlp_only_layers,
    norm_topk_prob, and (Qwen2-MoE) a shared expert with a sigmoid gate."""
