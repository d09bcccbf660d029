"""Ranks, process groups and the collectives the parallel layers call.

A world of tensor_parallel_size * pipeline_parallel_size ranks is laid out stage-major:
global rank = pp_rank * tp_size + tp_rank. The ranks of one pipeline stage form a
tensor-parallel group (they split every layer of the stage); the ranks with the same
tp_rank form a pipeline group (they hand activations from stage to stage).

Every collective is spelled out here, once: `all_reduce` (sum over the TP group: the
partial outputs of a row-parallel linear), `all_gather` (concatenation over the TP group
along the last axis: the vocabulary shards of the logits), `send` / `recv` (activations
from one stage to the next) and `broadcast_from_last_stage` (the final hidden states,
from the last stage to the others). A group of one rank makes each of them the identity,
without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BACKENDS = ("uni", "mp", "ray")


def check_parallel_sizes(config, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """Raise ValueError (naming the value) if a model of `config` (`ModelConfig`) cannot be
    split over tensor_parallel_size ranks per stage and pipeline_parallel_size stages.

    Tensor parallelism splits the query heads (their count must divide), the KV heads
    (their count must divide, or divide the TP size: each KV head is then replicated on
    tp / kv_heads ranks), the MLP's intermediate size, each MoE expert's intermediate
    size, and a Mamba-2 mixer's heads and groups (n_groups must divide, or be 1: B and C
    replicated). Pipeline parallelism needs at least one decoder layer per stage, and a
    decoder: an encoder (BERT) runs whole on each stage or with tensor parallelism."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    for name, value in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if pp > config.num_hidden_layers:
        raise ValueError(
            f"pipeline_parallel_size={pp} exceeds the {config.num_hidden_layers} decoder "
            f"layers of {config.architecture}: each stage needs at least one"
        )
    if pp > 1 and not config.is_causal:
        raise ValueError(
            f"pipeline_parallel_size={pp}: {config.architecture} is an encoder, which this "
            "engine does not split into stages; use tensor_parallel_size instead"
        )
    if tp == 1:
        return
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    sizes = [("num_attention_heads", heads), ("intermediate_size", config.intermediate_size)]
    if config.moe is not None:
        sizes.append(("moe.intermediate_size", config.moe.intermediate_size))
        if config.moe.shared_expert_intermediate_size:
            sizes.append(
                ("moe.shared_expert_intermediate_size", config.moe.shared_expert_intermediate_size)
            )
    for name, size in sizes:
        if size % tp:
            raise ValueError(
                f"tensor_parallel_size={tp} does not divide {name}={size} of {config.architecture}"
            )
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"tensor_parallel_size={tp} neither divides nor is a multiple of "
            f"num_key_value_heads={kv_heads} of {config.architecture}"
        )
    if config.mamba is not None:
        m = config.mamba
        if m.num_heads % tp:
            raise ValueError(
                f"tensor_parallel_size={tp} does not divide the Mamba-2 num_heads={m.num_heads} "
                f"of {config.architecture}"
            )
        if m.n_groups % tp and m.n_groups != 1:
            raise ValueError(
                f"tensor_parallel_size={tp} neither divides the Mamba-2 n_groups={m.n_groups} "
                f"of {config.architecture} nor is n_groups 1 (B and C replicated)"
            )


@dataclass
class ParallelContext:
    """This rank's place in the world and its process groups (None: a group of one)."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    tp_group: object | None = None
    pp_group: object | None = None

    @property
    def rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def stage_rank(self, pp_rank: int) -> int:
        """The global rank of this rank's peer (same tp_rank) in stage `pp_rank`."""
        return pp_rank * self.tp_size + self.tp_rank

    @classmethod
    def create(cls, rank: int, tp_size: int, pp_size: int) -> ParallelContext:
        """After `torch.distributed.init_process_group` over tp_size * pp_size ranks: this
        rank's context. Every rank creates every group, in the same order (the rule of
        `new_group`)."""
        import torch.distributed as dist

        ctx = cls(rank % tp_size, tp_size, rank // tp_size, pp_size)
        for stage in range(pp_size):  # the TP group of each stage
            group = dist.new_group([stage * tp_size + t for t in range(tp_size)])
            if stage == ctx.pp_rank:
                ctx.tp_group = group
        for t in range(tp_size):  # the pipeline group of each tp_rank
            group = dist.new_group([s * tp_size + t for s in range(pp_size)])
            if t == ctx.tp_rank:
                ctx.pp_group = group
        return ctx

    # --- tensor parallelism ------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the TP group, in place; every rank gets the sum."""
        if self.tp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.tp_group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """The TP group's `x`, concatenated along the last axis in tp_rank order."""
        if self.tp_size == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.tp_group)
        return torch.cat(parts, dim=-1)

    # --- pipeline parallelism ----------------------------------------------------------

    def send(self, x: torch.Tensor):
        """Start sending `x` to the next stage; returns the request to wait on."""
        import torch.distributed as dist

        return dist.isend(x.contiguous(), dst=self.stage_rank(self.pp_rank + 1))

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        """Receive a tensor of `shape` from the previous stage (blocks until it arrives)."""
        import torch.distributed as dist

        x = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(x, src=self.stage_rank(self.pp_rank - 1))
        return x

    def broadcast_from_last_stage(self, x: torch.Tensor) -> torch.Tensor:
        """`x` of the last stage, in place on every stage of the pipeline group."""
        if self.pp_size > 1:
            import torch.distributed as dist

            dist.broadcast(x, src=self.stage_rank(self.pp_size - 1), group=self.pp_group)
        return x
