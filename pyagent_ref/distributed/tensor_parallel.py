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

Every split is described once, as a `Cut` of a parameter of the whole model (the
indices a rank keeps along one axis): `shard_model` applies the cuts to a loaded model,
`loading.load_share` reads just those parts of a checkpoint; `localize` then turns the
cut modules into the parallel layers.

A norm over features that the heads split (OLMo 2's q/k norms over the whole
projection, Mamba-2's gated norm with one group) is a sharded RMSNorm
(`sharded_rms_norms`): each rank sums the squares of its features, the sums are
all-reduced (OLMo 2's q and k sums stacked in one all-reduce), and each rank normalises
its features by the full width's mean square, times its slice of the weight.
Multi-head latent attention (DeepSeek) splits its heads (q and kv_b projections
column-parallel, o_proj row-parallel) and keeps the latent
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


class ColumnParallelLinear(nn.Linear):
    """x -> x W_r^T + b_r, where W_r, b_r are this rank's rows (given, already sliced):
    this rank's slice of the output features. No communication. An `nn.Linear` of the
    local shape (in_features, out_features: W_r's), so that a LoRA adapter wraps it as
    any projection (`lora.layers.LoRALinear`, its B cut like W's rows)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Linear):
    """x_r -> sum over ranks of x_r W_r^T, then + b: W_r is this rank's columns (given,
    already sliced), x_r the matching input slice. With reduce=False the partial sum is
    returned (the caller all-reduces a larger sum once) and b is added on tp_rank 0 only.
    An `nn.Linear` of the local shape (in_features: this rank's columns); a LoRA
    adapter adds its partial product to the partial sum before `reduce_output`."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        ctx: ParallelContext,
        reduce: bool = True,
    ) -> None:
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.ctx, self.reduce = ctx, reduce
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce_output(F.linear(x, self.weight))

    def reduce_output(self, y: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum y -> the layer's output: all-reduced, then + b (with
        reduce=False: as it is, + b on tp_rank 0 only)."""
        if self.reduce:
            y = self.ctx.all_reduce(y)
        if self.bias is not None and (self.reduce or self.ctx.tp_rank == 0):
            y = y + self.bias
        return y


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding matrix (given, already cut: `vocab_cut`'s rows,
    zero past the vocabulary of `vocab_size` ids); forward: the embeddings of the ids in
    the slice, zero for the others, all-reduced, so every rank gets every id's embedding."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.ctx, self.vocab_size = ctx, vocab_size
        self.rows = weight.shape[0]
        self.start = ctx.tp_rank * self.rows
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)

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


class ReducedBlock(nn.Module):
    """A block whose output is a sum of per-rank partial outputs: all-reduced once. The
    block's attributes read through the wrapper, so that its submodules keep their
    paths in the model (`layers.i.mlp.shared_expert`, as a LoRA adapter names it)."""

    def __init__(self, block: nn.Module, ctx: ParallelContext) -> None:
        super().__init__()
        self.block, self.ctx = block, ctx

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "block":  # not set yet
                raise
            return getattr(self.block, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ctx.all_reduce(self.block(x))


def sharded_rms_norms(
    parts: list[tuple[torch.Tensor, torch.Tensor, float, int, int]], ctx: ParallelContext
) -> list[torch.Tensor]:
    """RMSNorms over features the ranks split, their statistics in one all-reduce. Each
    part (x, weight, eps, size, copies): an RMSNorm over `size` features of which this
    rank holds x's last axis: the local sum of squares (float32; float64 for float64 x),
    summed over the TP group, divided by `copies` (features replicated on that many
    ranks are summed that many times), then weight * x / sqrt(sum / size + eps) as
    `ops.layers.rms_norm` rounds it (normalised in the compute dtype, rounded to x's
    dtype, times the weight slice). The parts' sums travel stacked in one all_reduce
    (SUM): one float per token and part."""
    hs = [x.to(torch.float64 if x.dtype == torch.float64 else torch.float32) for x, *_ in parts]
    wide = torch.float64 if any(h.dtype == torch.float64 for h in hs) else torch.float32
    sums = ctx.all_reduce(torch.cat([(h * h).sum(-1, keepdim=True).to(wide) for h in hs], -1))
    out = []
    for i, (h, (x, weight, eps, size, copies)) in enumerate(zip(hs, parts, strict=True)):
        squares = sums[..., i : i + 1].to(h.dtype) / copies
        normed = h / torch.sqrt(squares / size + eps)
        out.append(weight.to(x.dtype) * normed.to(x.dtype))
    return out


def sharded_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, size: int, ctx: ParallelContext, copies: int
) -> torch.Tensor:
    """One `sharded_rms_norms` part: one float per token all-reduced."""
    return sharded_rms_norms([(x, weight, eps, size, copies)], ctx)[0]


class ShardedQKNormProjection(nn.Module):
    """OLMo 2's qkv projection with its q and k norms over the whole projection, under
    TP: this rank's column-parallel qkv (`sizes`: its features of q and of each of k
    and v), then q and k normalised by sharded RMSNorms over the whole projection's
    `widths` (a replicated KV head's features summed `copies` times), their sums of
    squares in one all-reduce (`sharded_rms_norms`: 8 bytes per token)."""

    def __init__(
        self,
        qkv: ColumnParallelLinear,
        q_norm: nn.Module,
        k_norm: nn.Module,
        sizes: tuple[int, int],
        widths: tuple[int, int],
        ctx: ParallelContext,
        copies: int,
    ) -> None:
        super().__init__()
        self.qkv, self.ctx, self.copies = qkv, ctx, copies
        self.sizes, self.widths, self.eps = sizes, widths, (q_norm.eps, k_norm.eps)
        self.q_weight = nn.Parameter(q_norm.weight.data.contiguous(), requires_grad=False)
        self.k_weight = nn.Parameter(k_norm.weight.data.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q_size, kv_size = self.sizes
        q, k, v = self.qkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q, k = sharded_rms_norms(
            [
                (q, self.q_weight, self.eps[0], self.widths[0], 1),
                (k, self.k_weight, self.eps[1], self.widths[1], self.copies),
            ],
            self.ctx,
        )
        return torch.cat([q, k, v], dim=-1)


class ShardedGatedRMSNorm(nn.Module):
    """Mamba-2's gated norm with one group (the whole inner dimension, `size` channels)
    whose channels the ranks split: y * silu(z) as `GatedRMSNorm`, then
    `sharded_rms_norm` times this rank's slice of the weight (`norm`'s, already cut)."""

    def __init__(self, norm: GatedRMSNorm, size: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.ops, self.eps, self.ctx, self.size = norm.ops, norm.eps, ctx, size
        self.weight = nn.Parameter(norm.weight.data.contiguous(), requires_grad=False)

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        gated = self.ops.layers.silu_and_mul(torch.cat([gate.to(y.dtype), y], dim=-1))
        unit = torch.ones((), dtype=y.dtype, device=y.device)
        return sharded_rms_norm(gated, unit, self.eps, self.size, self.ctx, 1) * self.weight


@dataclasses.dataclass(frozen=True)
class Cut:
    """This rank's part of one parameter of the whole model: the indices it keeps along
    axis `dim`, in order (int64; -1 is a zero row of padding: the vocabulary's last
    slice). The one description of a split: `cut_parameters` applies it to a loaded (or
    meta) parameter, `loading.load_share_weights` reads just those rows or columns."""

    dim: int
    index: torch.Tensor

    def apply(self, whole: torch.Tensor) -> torch.Tensor:
        """`whole` (the whole parameter, any device, meta included) cut to this part."""
        index = self.index.to(whole.device)
        part = whole.index_select(self.dim, index.clamp(min=0))
        shape = [1] * whole.dim()
        shape[self.dim] = -1
        return part.masked_fill((index < 0).view(shape), 0)


def _cut(dim: int, index) -> Cut:
    return Cut(dim, torch.as_tensor(index, dtype=torch.int64))


def _head_rows(first: int, heads: list[int], size: int) -> list[int]:
    """Rows first + h * size + i of the given heads (i < size): their features."""
    return [first + h * size + i for h in heads for i in range(size)]


def _column_cuts(name: str, linear: nn.Module, rows: list[int]) -> dict[str, Cut]:
    """A column-parallel linear: this rank's output features `rows` of weight and bias."""
    cut = _cut(0, rows)
    return {f"{name}.weight": cut} | ({} if linear.bias is None else {f"{name}.bias": cut})


def _row_cuts(name: str, cols: list[int]) -> dict[str, Cut]:
    """A row-parallel linear: this rank's input features `cols` (the bias stays whole)."""
    return {f"{name}.weight": _cut(1, cols)}


def _column(linear: nn.Module) -> nn.Module:
    """A linear already cut to this rank's output features, as column-parallel (a
    quantized one as it is: it computes its rows)."""
    if not isinstance(linear, nn.Linear):
        return linear
    return ColumnParallelLinear(
        linear.weight.data, None if linear.bias is None else linear.bias.data
    )


def _row(linear: nn.Module, ctx: ParallelContext, reduce: bool = True) -> nn.Module:
    """A linear already cut to this rank's input features, as row-parallel."""
    if not isinstance(linear, nn.Linear):  # quantized
        return QuantRowParallelLinear(linear, ctx, reduce)
    bias = None if linear.bias is None else linear.bias.data
    return RowParallelLinear(linear.weight.data, bias, ctx, reduce)


def _slice(n: int, ctx: ParallelContext) -> list[int]:
    """This rank's share of n features, n divisible by tp_size."""
    size = n // ctx.tp_size
    return list(range(ctx.tp_rank * size, (ctx.tp_rank + 1) * size))


def _kv_heads(num_kv_heads: int, ctx: ParallelContext) -> list[int]:
    """The KV heads this rank keeps (see the module docstring)."""
    tp = ctx.tp_size
    if num_kv_heads >= tp:
        per = num_kv_heads // tp
        return list(range(ctx.tp_rank * per, (ctx.tp_rank + 1) * per))
    return [ctx.tp_rank // (tp // num_kv_heads)]


def vocab_cut(vocab: int, ctx: ParallelContext) -> Cut:
    """This rank's rows of a (vocab, hidden) matrix: ceil(vocab / tp) of them, the ids
    past the vocabulary zero rows."""
    rows = -(-vocab // ctx.tp_size)
    index = torch.arange(ctx.tp_rank * rows, (ctx.tp_rank + 1) * rows)
    return Cut(0, index.masked_fill(index >= vocab, -1))


# Each token mixer and MLP has two functions: `*_cuts`, the split of its parameters (names
# relative to the module), and `localize_*`, which turns the module, its parameters
# already cut, into this rank's (parallel layers, local head counts, sharded norms).


def attention_cuts(attn: Attention, ctx: ParallelContext) -> dict[str, Cut]:
    """qkv_proj column-parallel by heads (this rank's query heads, its KV heads), o_proj
    row-parallel; norms over the whole q/k projection (OLMo 2) cut like q and k."""
    d = attn.head_dim
    q_heads = _slice(attn.num_heads, ctx)
    kv_heads = _kv_heads(attn.num_kv_heads, ctx)
    q_rows = _head_rows(0, q_heads, d)
    k_rows = _head_rows(attn.q_size, kv_heads, d)
    v_rows = _head_rows(attn.q_size + attn.kv_size, kv_heads, d)
    cuts = _column_cuts("qkv_proj", attn.qkv_proj, q_rows + k_rows + v_rows)
    cuts |= _row_cuts("o_proj", q_rows)
    if attn.qk_norm == "projection":
        cuts["q_norm.weight"] = _cut(0, q_rows)
        cuts["k_norm.weight"] = _cut(0, _head_rows(0, kv_heads, d))
    return cuts


def localize_attention(attn: Attention, ctx: ParallelContext) -> None:
    """The head counts become this rank's; OLMo 2's norms over the whole q/k projection
    join the projection (`ShardedQKNormProjection`: one all-reduce for both)."""
    d = attn.head_dim
    heads, kv_heads = attn.num_heads // ctx.tp_size, len(_kv_heads(attn.num_kv_heads, ctx))
    attn.qkv_proj, attn.o_proj = _column(attn.qkv_proj), _row(attn.o_proj, ctx)
    if attn.qk_norm == "projection":
        copies = max(1, ctx.tp_size // attn.num_kv_heads)
        attn.qkv_proj = ShardedQKNormProjection(
            attn.qkv_proj,
            attn.q_norm,
            attn.k_norm,
            (heads * d, kv_heads * d),
            (attn.q_size, attn.kv_size),
            ctx,
            copies,
        )
        attn.qk_norm, attn.q_norm, attn.k_norm = None, None, None  # applied in qkv_proj
    attn.num_heads, attn.num_kv_heads = heads, kv_heads
    attn.q_size, attn.kv_size = heads * d, kv_heads * d


def bert_attention_cuts(attn: BertAttention, ctx: ParallelContext) -> dict[str, Cut]:
    """BERT's attention (as many KV heads as query heads) split as `attention_cuts`."""
    rows = _head_rows(0, _slice(attn.num_heads, ctx), attn.head_dim)
    size = attn.size
    qkv = rows + [size + r for r in rows] + [2 * size + r for r in rows]
    return _column_cuts("qkv_proj", attn.qkv_proj, qkv) | _row_cuts("o_proj", rows)


def localize_bert_attention(attn: BertAttention, ctx: ParallelContext) -> None:
    attn.qkv_proj, attn.o_proj = _column(attn.qkv_proj), _row(attn.o_proj, ctx)
    attn.num_heads //= ctx.tp_size
    attn.size = attn.num_heads * attn.head_dim


def _mla_q_name(attn: MLAAttention) -> str:
    return "q_proj" if hasattr(attn, "q_proj") else "q_b_proj"


def mla_cuts(attn: MLAAttention, ctx: ParallelContext) -> dict[str, Cut]:
    """Multi-head latent attention split by heads: q_proj (or q_b_proj) and kv_b_proj
    column-parallel (each head's q features, its W_uk and W_uv rows), o_proj
    row-parallel; q_a_proj, kv_a_proj_with_mqa and their norms stay whole, so every rank
    computes and caches the whole latent."""
    heads = _slice(attn.num_heads, ctx)
    q_name = _mla_q_name(attn)
    q_rows = _head_rows(0, heads, attn.nope + attn.rope)
    cuts = _column_cuts(q_name, getattr(attn, q_name), q_rows)
    cuts |= _column_cuts("kv_b_proj", attn.kv_b_proj, _head_rows(0, heads, attn.nope + attn.v_dim))
    return cuts | _row_cuts("o_proj", _head_rows(0, heads, attn.v_dim))


def localize_mla(attn: MLAAttention, ctx: ParallelContext) -> None:
    q_name = _mla_q_name(attn)
    setattr(attn, q_name, _column(getattr(attn, q_name)))
    attn.kv_b_proj, attn.o_proj = _column(attn.kv_b_proj), _row(attn.o_proj, ctx)
    attn.num_heads //= ctx.tp_size


def local_mamba(m: MambaConfig, ctx: ParallelContext) -> MambaConfig:
    """This rank's share of a Mamba-2 mixer: num_heads / tp heads, and n_groups / tp
    groups (one group, replicated, when n_groups is 1)."""
    groups = 1 if m.n_groups == 1 else m.n_groups // ctx.tp_size
    return dataclasses.replace(m, num_heads=m.num_heads // ctx.tp_size, n_groups=groups)


def mamba_cuts(mixer: Mamba2Mixer, ctx: ParallelContext) -> dict[str, Cut]:
    """A Mamba-2 mixer split by heads: in_proj column-parallel (this rank's rows of z and
    x, by heads; of B and C, by groups, all of them with one group; of dt, by heads), the
    conv channels of its x, B and C, dt_bias / A_log / D by heads, the gated norm's
    weight by x's channels, out_proj row-parallel."""
    m = mixer.mamba
    heads = _slice(m.num_heads, ctx)
    groups = [0] if m.n_groups == 1 else _slice(m.n_groups, ctx)
    inter, n = m.intermediate_size, m.state_size
    x_rows = _head_rows(0, heads, m.head_dim)
    conv = x_rows + _head_rows(inter, groups, n) + _head_rows(inter + m.n_groups * n, groups, n)
    dt = [inter + m.conv_dim + h for h in heads]
    cuts = _column_cuts("in_proj", mixer.in_proj, x_rows + [inter + c for c in conv] + dt)
    for name in ("weight", "bias"):
        if getattr(mixer.conv1d, name) is not None:
            cuts[f"conv1d.{name}"] = _cut(0, conv)
    cuts |= {name: _cut(0, heads) for name in ("dt_bias", "A_log", "D")}
    cuts["norm.weight"] = _cut(0, x_rows)
    return cuts | _row_cuts("out_proj", x_rows)


def localize_mamba(mixer: Mamba2Mixer, ctx: ParallelContext) -> None:
    """The gated norm per local group, or sharded over the whole inner dimension when
    there is one group; the mixer's sizes become this rank's (`local_mamba`)."""
    m, local = mixer.mamba, local_mamba(mixer.mamba, ctx)
    mixer.in_proj, mixer.out_proj = _column(mixer.in_proj), _row(mixer.out_proj, ctx)
    if m.n_groups == 1:
        mixer.norm = ShardedGatedRMSNorm(mixer.norm, m.intermediate_size, ctx)
    else:
        weight = mixer.norm.weight.data
        norm = GatedRMSNorm(weight.shape[0], local.n_groups, m.norm_eps, mixer.norm.ops)
        norm.weight = nn.Parameter(weight, requires_grad=False)
        mixer.norm = norm
    mixer.mamba = local


def mlp_cuts(mlp: MLP, ctx: ParallelContext) -> dict[str, Cut]:
    """gate_up_proj (or up_proj) column-parallel over the intermediate features, each of
    gate and up sliced alike; down_proj row-parallel."""
    if mlp.gated:
        inter = mlp.gate_up_proj.out_features // 2
        part = _slice(inter, ctx)
        cuts = _column_cuts("gate_up_proj", mlp.gate_up_proj, part + [inter + i for i in part])
    else:
        part = _slice(mlp.up_proj.out_features, ctx)
        cuts = _column_cuts("up_proj", mlp.up_proj, part)
    return cuts | _row_cuts("down_proj", part)


def localize_mlp(mlp: MLP, ctx: ParallelContext, reduce: bool = True) -> None:
    """See `RowParallelLinear`'s reduce for down_proj."""
    if mlp.gated:
        mlp.gate_up_proj = _column(mlp.gate_up_proj)
    else:
        mlp.up_proj = _column(mlp.up_proj)
    mlp.down_proj = _row(mlp.down_proj, ctx, reduce)


def moe_cuts(block: nn.Module, ctx: ParallelContext) -> dict[str, Cut]:
    """Every expert keeps its slice of the intermediate features (gate and up rows, down
    columns), the shared expert too."""
    inter = block.experts.down_proj.shape[2]
    part = _slice(inter, ctx)
    cuts = {
        "experts.gate_up_proj": _cut(1, part + [inter + i for i in part]),
        "experts.down_proj": _cut(2, part),
    }
    if block.shared_expert is not None:
        shared = mlp_cuts(block.shared_expert, ctx)
        cuts |= {f"shared_expert.{name}": cut for name, cut in shared.items()}
    return cuts


def localize_moe(block: nn.Module, ctx: ParallelContext) -> nn.Module:
    """The shared expert unreduced; the block wrapped so that its output, a sum of
    partial outputs, is all-reduced once (`ReducedBlock`)."""
    if block.shared_expert is not None:
        localize_mlp(block.shared_expert, ctx, reduce=False)
    return ReducedBlock(block, ctx)


def _mixers() -> dict[type, tuple]:
    return {
        Attention: (attention_cuts, localize_attention),
        BertAttention: (bert_attention_cuts, localize_bert_attention),
        MLAAttention: (mla_cuts, localize_mla),
        Mamba2Mixer: (mamba_cuts, localize_mamba),
    }


def split_plan(model: LlamaForCausalLM, ctx: ParallelContext) -> dict[str, Cut]:
    """{parameter name: its `Cut`} for every parameter of `model` that this rank keeps
    part of (the others it keeps whole): each present layer's token mixer and MLP (or
    MoE block), the embedding and the LM head by vocabulary rows. Only the module
    structure and the shapes are read: `model` may live on the meta device."""
    from ..model.moe import SparseMoeBlock

    plan = {}
    for i, layer in enumerate(model.layers):
        mixer = _mixers().get(type(getattr(layer, "self_attn", None)))
        parts = [] if mixer is None else [("self_attn", mixer[0](layer.self_attn, ctx))]
        if isinstance(getattr(layer, "mlp", None), MLP):
            parts.append(("mlp", mlp_cuts(layer.mlp, ctx)))
        elif isinstance(getattr(layer, "mlp", None), SparseMoeBlock):
            parts.append(("mlp", moe_cuts(layer.mlp, ctx)))
        for module, cuts in parts:
            plan |= {f"layers.{i}.{module}.{name}": cut for name, cut in cuts.items()}
    vocab = vocab_cut(model.embed_tokens.weight.shape[0], ctx)
    plan["embed_tokens.weight"] = vocab
    if getattr(model, "lm_head", None) is not None:
        plan["lm_head.weight"] = vocab
    return plan


def cut_parameters(model: nn.Module, plan: dict[str, Cut]) -> None:
    """Replace each parameter the plan names by its cut (`Cut.apply`), in place; the
    weight of a quantized layer (`quant.linear.QuantLinear`, no float weight) by the
    layer of its cut (`cut_quantized`)."""
    from ..quant.linear import QuantLinear

    for name, cut in plan.items():
        path, _, leaf = name.rpartition(".")
        module = model.get_submodule(path)
        if isinstance(module, QuantLinear) and leaf == "weight":
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child, cut_quantized(module, cut, path))
            continue
        part = cut.apply(getattr(module, leaf).data)
        setattr(module, leaf, nn.Parameter(part, requires_grad=False))


def cut_quantized(linear, cut: Cut, name: str):
    """A quantized layer's share (its bias is cut apart, as a parameter): the output rows
    of a column-parallel cut (`QuantLinear.take_rows`), the input columns of a
    row-parallel one, which must be one run of whole words and groups
    (`QuantLinear.take_columns`: ValueError naming the layer otherwise)."""
    if cut.dim == 0:
        quant = linear.take_rows(cut.index)
    else:
        start, stop = int(cut.index[0]), int(cut.index[-1]) + 1
        if stop - start != len(cut.index):
            raise ValueError(f"{name}: a row-parallel cut of a quantized layer must be one run")
        quant = linear.take_columns(start, stop, name)
    quant.bias = linear.bias
    return quant


class QuantRowParallelLinear(nn.Module):
    """`RowParallelLinear` on a quantized layer's input columns (`quant`, its bias
    taken off): the partial sum of the packed codes, then `reduce_output`."""

    def __init__(self, quant: nn.Module, ctx: ParallelContext, reduce: bool = True) -> None:
        super().__init__()
        self.ctx, self.reduce = ctx, reduce
        self.in_features, self.out_features = quant.in_features, quant.out_features
        self.bias, quant.bias = quant.bias, None
        self.quant = quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce_output(self.quant(x))

    reduce_output = RowParallelLinear.reduce_output


def localize(model: LlamaForCausalLM, ctx: ParallelContext, vocab_size: int) -> None:
    """Turn `model`, its parameters already cut (`cut_parameters`), into this rank's:
    each layer's token mixer and MLP `localize_*`d, MoE blocks wrapped, the embedding
    vocab-parallel over `vocab_size` ids."""
    from ..model.moe import SparseMoeBlock

    for layer in model.layers:
        mixer = _mixers().get(type(getattr(layer, "self_attn", None)))
        if mixer is not None:
            mixer[1](layer.self_attn, ctx)
        if isinstance(getattr(layer, "mlp", None), MLP):
            localize_mlp(layer.mlp, ctx)
        elif isinstance(getattr(layer, "mlp", None), SparseMoeBlock):
            layer.mlp = localize_moe(layer.mlp, ctx)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens.weight.data, vocab_size, ctx)
    if getattr(model, "lm_head", None) is not None:
        model.lm_head.out_features = model.lm_head.weight.shape[0]


def shard_model(model: LlamaForCausalLM, ctx: ParallelContext) -> None:
    """Cut a loaded model (every weight present) down to this rank's share, in place:
    `split_plan`, `cut_parameters`, `localize`. Each layer's token mixer (attention,
    BERT's, MLA, a Mamba-2 mixer) and dense MLP as above, MoE blocks `localize_moe`, the
    embedding vocab-parallel, the LM head's rows sliced alike (`lm_head` None when tied
    or absent). The decoder's norms, RoPE tables, routers, learned position and token
    type embeddings and LLaVA's vision tower and projector stay whole on every rank. The
    sizes must split (`parallel.check_parallel_sizes`). `loading.load_share` reaches the
    same share reading only its parts of the checkpoint."""
    vocab_size = model.embed_tokens.weight.shape[0]
    cut_parameters(model, split_plan(model, ctx))
    localize(model, ctx, vocab_size)
