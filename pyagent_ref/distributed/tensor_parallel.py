"""Tensor parallelism: the layers that split one matrix across the ranks of a TP group,
and `shard_model`, which cuts a loaded model down to one rank's share.

A linear layer y = x W^T + b of W (out, in) splits two ways:
  - column-parallel: rank r keeps rows [r * out/tp, (r+1) * out/tp) of W (and of b) and
    computes its slice of y; no communication. q/k/v and gate/up are column-parallel:
    each rank owns whole heads and a slice of the intermediate features.
  - row-parallel: rank r keeps columns [r * in/tp, ...) of W, takes the matching slice
    of x (what a column-parallel layer left it) and computes a partial y; the sum over
    ranks (`all_reduce`) is y, and b is added once, after the sum. o_proj and down_proj
    are row-parallel: one all-reduce after attention and one after the MLP, per layer.
The vocabulary splits into tp slices of ceil(vocab / tp) rows (the last one padded with
zero rows): the embedding looks up the ids of its slice, zeroes the others and
all-reduces; the LM head computes its slice of the logits and all-gathers them.

KV heads: with at least as many KV heads as ranks each rank keeps kv_heads / tp of them;
with fewer, each KV head is replicated on tp / kv_heads ranks, the ones whose query heads
read it (rank r keeps KV head r // (tp / kv_heads)).

An MoE layer's experts split like the MLP, along each expert's intermediate size (every
rank keeps every expert, a slice of each), and so does the shared expert: the block's
output is a sum of partial outputs, all-reduced once (`ReducedBlock`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model.llama import MLP, Attention, LlamaForCausalLM
from .parallel import ParallelContext


class ColumnParallelLinear(nn.Module):
    """x -> x W_r^T + b_r, where W_r, b_r are this rank's rows (given, already sliced):
    this rank's slice of the output features. No communication."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """x_r -> sum over ranks of x_r W_r^T, then + b: W_r is this rank's columns (given,
    already sliced), x_r the matching input slice. With reduce=False the partial sum is
    returned (the caller all-reduces a larger sum once) and b is added on tp_rank 0 only."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        ctx: ParallelContext,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        self.ctx, self.reduce = ctx, reduce
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.reduce:
            y = self.ctx.all_reduce(y)
        if self.bias is not None and (self.reduce or self.ctx.tp_rank == 0):
            y = y + self.bias
        return y


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + rows) of the embedding matrix (zero rows past the
    vocabulary); forward: the embeddings of the ids in the slice, zero for the others,
    all-reduced, so every rank gets every id's embedding."""

    def __init__(self, weight: torch.Tensor, ctx: ParallelContext) -> None:
        super().__init__()
        vocab, hidden = weight.shape
        self.ctx, self.vocab_size = ctx, vocab
        self.rows = -(-vocab // ctx.tp_size)
        self.start = ctx.tp_rank * self.rows
        local = torch.zeros(self.rows, hidden, dtype=weight.dtype, device=weight.device)
        part = weight[self.start : self.start + self.rows]
        local[: part.shape[0]] = part
        self.weight = nn.Parameter(local, requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.ctx.all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The LM head over the vocabulary slices of `weight` (default: this embedding's,
        tied): (tokens, vocab), every rank's slice all-gathered, padding dropped."""
        local = hidden @ (self.weight if weight is None else weight).T
        return self.ctx.all_gather(local)[..., : self.vocab_size]


def vocab_slice(weight: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """This rank's rows of a (vocab, hidden) matrix, zero-padded as `VocabParallelEmbedding`."""
    return VocabParallelEmbedding(weight, ctx).weight.data


class ReducedBlock(nn.Module):
    """A block whose output is a sum of per-rank partial outputs: all-reduced once."""

    def __init__(self, block: nn.Module, ctx: ParallelContext) -> None:
        super().__init__()
        self.block, self.ctx = block, ctx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ctx.all_reduce(self.block(x))


def _slice(n: int, ctx: ParallelContext) -> slice:
    """This rank's share of n features, n divisible by tp_size."""
    size = n // ctx.tp_size
    return slice(ctx.tp_rank * size, (ctx.tp_rank + 1) * size)


def _kv_heads(num_kv_heads: int, ctx: ParallelContext) -> list[int]:
    """The KV heads this rank keeps (see the module docstring)."""
    tp = ctx.tp_size
    if num_kv_heads >= tp:
        per = num_kv_heads // tp
        return list(range(ctx.tp_rank * per, (ctx.tp_rank + 1) * per))
    return [ctx.tp_rank // (tp // num_kv_heads)]


def shard_attention(attn: Attention, ctx: ParallelContext) -> None:
    """qkv_proj column-parallel by heads, o_proj row-parallel; the head counts become
    this rank's."""
    d, heads = attn.head_dim, attn.num_heads
    q_heads = list(range(heads))[_slice(heads, ctx)]
    kv_heads = _kv_heads(attn.num_kv_heads, ctx)
    rows = lambda first, hs: [first + h * d + i for h in hs for i in range(d)]  # noqa: E731
    q_rows = rows(0, q_heads)
    k_rows, v_rows = rows(attn.q_size, kv_heads), rows(attn.q_size + attn.kv_size, kv_heads)
    keep = torch.tensor(q_rows + k_rows + v_rows, device=attn.qkv_proj.weight.device)
    qkv, o = attn.qkv_proj, attn.o_proj
    attn.qkv_proj = ColumnParallelLinear(
        qkv.weight.data[keep], None if qkv.bias is None else qkv.bias.data[keep]
    )
    cols = torch.tensor(q_rows, device=o.weight.device)
    attn.o_proj = RowParallelLinear(
        o.weight.data[:, cols], None if o.bias is None else o.bias.data, ctx
    )
    attn.num_heads, attn.num_kv_heads = len(q_heads), len(kv_heads)
    attn.q_size, attn.kv_size = len(q_heads) * d, len(kv_heads) * d


def shard_mlp(mlp: MLP, ctx: ParallelContext, reduce: bool = True) -> None:
    """gate_up_proj (or up_proj) column-parallel over the intermediate features, each of
    gate and up sliced alike; down_proj row-parallel (see `RowParallelLinear`'s reduce)."""
    if mlp.gated:
        gate_up = mlp.gate_up_proj
        inter = gate_up.weight.shape[0] // 2
        part = _slice(inter, ctx)
        halves = [slice(part.start + h * inter, part.stop + h * inter) for h in (0, 1)]
        weight = torch.cat([gate_up.weight.data[s] for s in halves])
        bias = None if gate_up.bias is None else torch.cat([gate_up.bias.data[s] for s in halves])
        mlp.gate_up_proj = ColumnParallelLinear(weight, bias)
    else:
        up = mlp.up_proj
        part = _slice(up.weight.shape[0], ctx)
        mlp.up_proj = ColumnParallelLinear(
            up.weight.data[part], None if up.bias is None else up.bias.data[part]
        )
    down = mlp.down_proj
    mlp.down_proj = RowParallelLinear(
        down.weight.data[:, part], None if down.bias is None else down.bias.data, ctx, reduce
    )


def shard_moe(block: nn.Module, ctx: ParallelContext) -> nn.Module:
    """Every expert keeps its slice of the intermediate features (gate and up rows, down
    columns), the shared expert too (unreduced); returns the block wrapped so that its
    output, a sum of partial outputs, is all-reduced once (`ReducedBlock`)."""
    experts = block.experts
    inter = experts.down_proj.shape[2]
    part = _slice(inter, ctx)
    gate_up = experts.gate_up_proj.data
    halves = [slice(part.start + h * inter, part.stop + h * inter) for h in (0, 1)]
    experts.gate_up_proj = nn.Parameter(
        torch.cat([gate_up[:, s] for s in halves], dim=1).contiguous(), requires_grad=False
    )
    experts.down_proj = nn.Parameter(
        experts.down_proj.data[:, :, part].contiguous(), requires_grad=False
    )
    if block.shared_expert is not None:
        shard_mlp(block.shared_expert, ctx, reduce=False)
    return ReducedBlock(block, ctx)


def shard_model(model: LlamaForCausalLM, ctx: ParallelContext) -> None:
    """Cut a loaded model (every weight present) down to this rank's share, in place:
    attention and dense MLPs as above, MoE blocks `shard_moe`, the embedding
    vocab-parallel, the LM head's rows sliced alike (`lm_head` None when tied). Norms,
    RoPE tables, routers and learned position embeddings stay whole on every rank.
    The sizes must split (`parallel.check_parallel_sizes`)."""
    from ..model.moe import SparseMoeBlock

    for layer in model.layers:
        if isinstance(layer.self_attn, Attention):
            shard_attention(layer.self_attn, ctx)
        if isinstance(layer.mlp, MLP):
            shard_mlp(layer.mlp, ctx)
        elif isinstance(layer.mlp, SparseMoeBlock):
            layer.mlp = shard_moe(layer.mlp, ctx)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens.weight.data, ctx)
    if model.lm_head is not None:
        head = vocab_slice(model.lm_head.weight.data, ctx)
        model.lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False, device=head.device)
        model.lm_head.weight = nn.Parameter(head, requires_grad=False)
