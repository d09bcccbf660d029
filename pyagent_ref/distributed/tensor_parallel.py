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

A norm over features that the heads split (OLMo 2's q/k norms over the whole
projection, Mamba-2's gated norm with one group) is a sharded RMSNorm
(`sharded_rms_norm`): each rank sums the squares of its features, the sums are
all-reduced, and each rank normalises its features by the full width's mean square,
times its slice of the weight. Multi-head latent attention (DeepSeek) splits its heads
(q and kv_b projections column-parallel, o_proj row-parallel) and keeps the latent
projection, its norm and the latent cache whole on every rank. A Mamba-2 mixer splits
its heads (z, x, dt, the SSM state and conv channels of x) and its groups of B and C
(one group: replicated on every rank); out_proj is row-parallel.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ..model.bert import BertAttention
from ..model.config import MambaConfig
from ..model.deepseek import MLAAttention
from ..model.llama import MLP, Attention, LlamaForCausalLM
from ..model.mamba import GatedRMSNorm, Mamba2Mixer
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


def sharded_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, size: int, ctx: ParallelContext, copies: int
) -> torch.Tensor:
    """RMSNorm over `size` features of which this rank holds x's last axis: the local sum
    of squares (float32; float64 for float64 x), all_reduce(SUM) over the TP group,
    divided by `copies` (features replicated on that many ranks are summed that many
    times), then weight * x / sqrt(sum / size + eps) as `ops.layers.rms_norm` rounds it
    (normalised in the compute dtype, rounded to x's dtype, times the weight slice).
    Communication: one float per token."""
    h = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    squares = ctx.all_reduce((h * h).sum(-1, keepdim=True)) / copies
    normed = h / torch.sqrt(squares / size + eps)
    return weight.to(x.dtype) * normed.to(x.dtype)


class ShardedRMSNorm(nn.Module):
    """`Norm` (RMSNorm) of a projection whose features the ranks split: this rank's
    slice of the weight (`sharded_rms_norm`). OLMo 2's q/k norms."""

    def __init__(
        self, weight: torch.Tensor, size: int, eps: float, ctx: ParallelContext, copies: int = 1
    ) -> None:
        super().__init__()
        self.size, self.eps, self.ctx, self.copies = size, eps, ctx, copies
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sharded_rms_norm(x, self.weight, self.eps, self.size, self.ctx, self.copies)


class ShardedGatedRMSNorm(nn.Module):
    """Mamba-2's gated norm with one group (the whole inner dimension) whose channels
    the ranks split: y * silu(z) as `GatedRMSNorm`, then `sharded_rms_norm` times this
    rank's slice of the weight."""

    def __init__(self, norm: GatedRMSNorm, keep: torch.Tensor, ctx: ParallelContext) -> None:
        super().__init__()
        self.ops, self.eps, self.ctx, self.size = norm.ops, norm.eps, ctx, norm.weight.shape[0]
        self.weight = nn.Parameter(norm.weight.data[keep].contiguous(), requires_grad=False)

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        gated = self.ops.layers.silu_and_mul(torch.cat([gate.to(y.dtype), y], dim=-1))
        unit = torch.ones((), dtype=y.dtype, device=y.device)
        return sharded_rms_norm(gated, unit, self.eps, self.size, self.ctx, 1) * self.weight


def _head_rows(first: int, heads: list[int], size: int) -> list[int]:
    """Rows first + h * size + i of the given heads (i < size): their features."""
    return [first + h * size + i for h in heads for i in range(size)]


def _column(linear: nn.Module, rows: list[int]) -> ColumnParallelLinear:
    """`linear` cut to the output features `rows` (this rank's)."""
    keep = torch.tensor(rows, device=linear.weight.device)
    bias = None if linear.bias is None else linear.bias.data[keep]
    return ColumnParallelLinear(linear.weight.data[keep], bias)


def _row(linear: nn.Module, cols: list[int], ctx: ParallelContext) -> RowParallelLinear:
    """`linear` cut to the input features `cols` (this rank's), all-reduced."""
    keep = torch.tensor(cols, device=linear.weight.device)
    bias = None if linear.bias is None else linear.bias.data
    return RowParallelLinear(linear.weight.data[:, keep], bias, ctx)


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
    this rank's. Norms over the whole q/k projection (OLMo 2) become sharded norms of
    this rank's features (a replicated KV head's features counted once)."""
    d, heads = attn.head_dim, attn.num_heads
    q_heads = list(range(heads))[_slice(heads, ctx)]
    kv_heads = _kv_heads(attn.num_kv_heads, ctx)
    q_rows = _head_rows(0, q_heads, d)
    k_rows = _head_rows(attn.q_size, kv_heads, d)
    v_rows = _head_rows(attn.q_size + attn.kv_size, kv_heads, d)
    attn.qkv_proj = _column(attn.qkv_proj, q_rows + k_rows + v_rows)
    attn.o_proj = _row(attn.o_proj, q_rows, ctx)
    if attn.qk_norm == "projection":
        q_norm, k_norm = attn.q_norm, attn.k_norm
        copies = max(1, ctx.tp_size // attn.num_kv_heads)
        k_local = _head_rows(0, kv_heads, d)
        attn.q_norm = ShardedRMSNorm(q_norm.weight.data[q_rows], attn.q_size, q_norm.eps, ctx)
        attn.k_norm = ShardedRMSNorm(
            k_norm.weight.data[k_local], attn.kv_size, k_norm.eps, ctx, copies
        )
    attn.num_heads, attn.num_kv_heads = len(q_heads), len(kv_heads)
    attn.q_size, attn.kv_size = len(q_heads) * d, len(kv_heads) * d


def shard_bert_attention(attn: BertAttention, ctx: ParallelContext) -> None:
    """BERT's attention (as many KV heads as query heads) split as `shard_attention`."""
    d, size = attn.head_dim, attn.size
    heads = list(range(attn.num_heads))[_slice(attn.num_heads, ctx)]
    rows = _head_rows(0, heads, d)
    attn.qkv_proj = _column(
        attn.qkv_proj, rows + [size + r for r in rows] + [2 * size + r for r in rows]
    )
    attn.o_proj = _row(attn.o_proj, rows, ctx)
    attn.num_heads, attn.size = len(heads), len(heads) * d


def shard_mla(attn: MLAAttention, ctx: ParallelContext) -> None:
    """Multi-head latent attention split by heads: q_proj (or q_b_proj) and kv_b_proj
    column-parallel (each head's q features, its W_uk and W_uv rows), o_proj
    row-parallel; q_a_proj, kv_a_proj_with_mqa and their norms stay whole, so every rank
    computes and caches the whole latent."""
    heads = list(range(attn.num_heads))[_slice(attn.num_heads, ctx)]
    q_name = "q_proj" if hasattr(attn, "q_proj") else "q_b_proj"
    setattr(
        attn, q_name, _column(getattr(attn, q_name), _head_rows(0, heads, attn.nope + attn.rope))
    )
    attn.kv_b_proj = _column(attn.kv_b_proj, _head_rows(0, heads, attn.nope + attn.v_dim))
    attn.o_proj = _row(attn.o_proj, _head_rows(0, heads, attn.v_dim), ctx)
    attn.num_heads = len(heads)


def local_mamba(m: MambaConfig, ctx: ParallelContext) -> MambaConfig:
    """This rank's share of a Mamba-2 mixer: num_heads / tp heads, and n_groups / tp
    groups (one group, replicated, when n_groups is 1)."""
    groups = 1 if m.n_groups == 1 else m.n_groups // ctx.tp_size
    return dataclasses.replace(m, num_heads=m.num_heads // ctx.tp_size, n_groups=groups)


def shard_mamba(mixer: Mamba2Mixer, ctx: ParallelContext) -> None:
    """A Mamba-2 mixer split by heads: in_proj column-parallel (this rank's rows of z and
    x, by heads; of B and C, by groups; of dt, by heads), the conv channels of its x, B
    and C, dt_bias / A_log / D by heads, the gated norm per local group (or sharded over
    the whole inner dimension when there is one group), out_proj row-parallel."""
    m = mixer.mamba
    heads = list(range(m.num_heads))[_slice(m.num_heads, ctx)]
    groups = [0] if m.n_groups == 1 else list(range(m.n_groups))[_slice(m.n_groups, ctx)]
    inter, n = m.intermediate_size, m.state_size
    x_rows = _head_rows(0, heads, m.head_dim)
    conv = x_rows + _head_rows(inter, groups, n) + _head_rows(inter + m.n_groups * n, groups, n)
    dt = [inter + m.conv_dim + h for h in heads]
    mixer.in_proj = _column(mixer.in_proj, x_rows + [inter + c for c in conv] + dt)
    keep = torch.tensor(conv, device=mixer.conv1d.weight.device)
    for name in ("weight", "bias"):
        if getattr(mixer.conv1d, name) is not None:
            tensor = getattr(mixer.conv1d, name).data[keep].contiguous()
            setattr(mixer.conv1d, name, nn.Parameter(tensor, requires_grad=False))
    per_head = torch.tensor(heads, device=mixer.A_log.device)
    for name in ("dt_bias", "A_log", "D"):
        tensor = getattr(mixer, name).data[per_head].contiguous()
        setattr(mixer, name, nn.Parameter(tensor, requires_grad=False))
    norm_keep = torch.tensor(x_rows, device=mixer.norm.weight.device)
    if m.n_groups == 1:
        mixer.norm = ShardedGatedRMSNorm(mixer.norm, norm_keep, ctx)
    else:
        norm = GatedRMSNorm(len(x_rows), len(groups), m.norm_eps, mixer.norm.ops)
        norm.weight = nn.Parameter(mixer.norm.weight.data[norm_keep], requires_grad=False)
        mixer.norm = norm
    mixer.out_proj = _row(mixer.out_proj, x_rows, ctx)
    mixer.mamba = local_mamba(m, ctx)


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
    each layer's token mixer (attention, BERT's, MLA, a Mamba-2 mixer) and dense MLP as
    above, MoE blocks `shard_moe`, the embedding vocab-parallel, the LM head's rows
    sliced alike (`lm_head` None when tied or absent). The decoder's norms, RoPE tables,
    routers, learned position and token type embeddings and LLaVA's vision tower and
    projector stay whole on every rank. The sizes must split
    (`parallel.check_parallel_sizes`)."""
    from ..model.moe import SparseMoeBlock

    shard_mixer = {
        Attention: shard_attention,
        BertAttention: shard_bert_attention,
        MLAAttention: shard_mla,
        Mamba2Mixer: shard_mamba,
    }
    for layer in model.layers:
        if type(layer.self_attn) in shard_mixer:
            shard_mixer[type(layer.self_attn)](layer.self_attn, ctx)
        if isinstance(layer.mlp, MLP):
            shard_mlp(layer.mlp, ctx)
        elif isinstance(layer.mlp, SparseMoeBlock):
            layer.mlp = shard_moe(layer.mlp, ctx)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens.weight.data, ctx)
    if getattr(model, "lm_head", None) is not None:
        head = vocab_slice(model.lm_head.weight.data, ctx)
        model.lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False, device=head.device)
        model.lm_head.weight = nn.Parameter(head, requires_grad=False)
