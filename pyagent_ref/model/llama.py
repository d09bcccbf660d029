"""The Llama decoder on a paged KV cache, and the dense families built from it.

One decoder covers Llama 2/3, Mistral, Qwen2, Qwen3 and the families of `families`
(Gemma 1/2/3, Phi-3, OLMo 2, GPT-NeoX, GPT-2); the differences are configuration
(`ModelConfig`): grouped-query attention, q/k/v biases (Qwen2), q/k norms per head
(Qwen3, Gemma 3) or over the projection (OLMo 2), sliding window layers (Mistral, Gemma),
RoPE scaling and partial rotary, tied embeddings; the norm (RMSNorm, Gemma's (1 + w)
RMSNorm, LayerNorm) and where the layer applies it (`DecoderLayer`), the MLP's activation
and gate, soft-capped attention scores and logits, scaled or learned embeddings.

A forward pass takes the flattened batch of a step — token ids and positions of every
scheduled token of every request, prefill chunks and decodes mixed — and the
`AttentionMetadata` that says where each request's KV lives: one for every layer, or
one per layer when the layers belong to different KV cache groups (a hybrid model's
full-attention and sliding-window layers hold different blocks). Every layer writes its
new K/V into its paged cache (`ops.attention.reshape_and_cache`) and attends over it
(`ops.attention.paged_attention`). The ops come from the namespace the model is built
with (`pyagent_ref.ops.load(...)`: reference, accelerator, or per-device "auto"); the
model never branches on the backend. Parameters are fused as inference engines keep them:
q/k/v in one `qkv_proj`, gate/up in one `gate_up_proj` (`loader` fills them from HF's
separate tensors).

The KV cache may be kept in FP8 (`set_kv_cache_dtype`): uint8 tensors of e4m3 or e5m2
codes, written and read by the same ops with the layer's k_scale and v_scale (from the
checkpoint, `model.kv_scales`, or computed from the first batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .. import ops as reference_ops
from ..ops._fp8 import KV_CACHE_DTYPES, KV_CACHE_FORMATS
from .config import ModelConfig


@dataclass
class AttentionMetadata:
    """Where the flattened batch's KV goes and comes from (see `ops.attention`).

    slot_mapping: int64 (num_tokens,), PAD_SLOT_ID for padding tokens.
    block_table: int32/int64 (num_reqs, max_blocks). query_start_loc: (num_reqs + 1,).
    seq_lens: (num_reqs,) sequence lengths including this step's tokens.
    decode_only: every request has exactly one query token (num_tokens == num_reqs;
        padding requests have seq_len 0): attention takes the static-shape path
        `paged_decode_attention`, which a CUDA graph can capture.
    custom_masks: None, or per request None or a bool tensor (q_len, seq_len) AND-ed with
        the causal mask (a speculative draft tree: `ops.spec_decode.tree_attention_mask`).
    """

    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    decode_only: bool = False
    custom_masks: list[torch.Tensor | None] | None = None


class Norm(nn.Module):
    """The model's normalisation of the last axis (`ModelConfig.norm`): `rms_norm`,
    `gemma_rms_norm` or `layer_norm` (which alone has a bias); with `residual`, the fused
    add-then-normalise that returns (normalised, sum). `eps` overrides the config's."""

    def __init__(
        self, size: int, config: ModelConfig, ops: ModuleType, eps: float | None = None
    ) -> None:
        super().__init__()
        self.kind, self.ops = config.norm, ops
        self.eps = config.rms_norm_eps if eps is None else eps
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size)) if self.kind == "layer" else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        layers = self.ops.layers
        if self.kind == "layer":
            return layers.layer_norm(x, self.weight, self.bias, self.eps, residual)
        norm = layers.gemma_rms_norm if self.kind == "gemma_rms" else layers.rms_norm
        return norm(x, self.weight, self.eps, residual)


class Rotary(nn.Module):
    """RoPE tables for the model; recomputed per step only for dynamic NTK scaling.
    `local` builds the table of the sliding layers where they have their own (Gemma 3).
    Pairs are NeoX's (i, i + d/2), or (2i, 2i + 1) with `config.rope_interleaved`."""

    def __init__(self, config: ModelConfig, ops: ModuleType, local: bool = False) -> None:
        super().__init__()
        self.ops = ops
        self.local = local
        self.theta = config.local_rope_theta if local else config.rope_theta
        self.scaling = config.local_rope_scaling if local else config.rope_scaling
        self.rotary_dim, self.max_positions = config.rotary_dim, config.max_position_embeddings
        inv_freq, self.scale = self._table()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.dynamic = (self.scaling or {}).get("rope_type") == "dynamic"
        self.is_neox = not config.rope_interleaved

    def _table(self, seq_len: int | None = None, like: torch.Tensor | None = None):
        return self.ops.rope.rope_inv_freq(
            self.rotary_dim,
            self.theta,
            self.scaling,
            self.max_positions,
            seq_len=seq_len,
            like=torch.empty(0) if like is None else like,
        )

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        inv_freq, scale = self.inv_freq, self.scale
        if self.dynamic and positions.numel():
            inv_freq, scale = self._table(int(positions.max()) + 1, positions)
        return self.ops.rope.apply_rope(positions, q, k, inv_freq, scale, is_neox=self.is_neox)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        # q/k norms per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)
        self.qk_norm = config.qk_norm
        per_head = config.qk_norm == "head"
        q_size, kv_size = (self.head_dim,) * 2 if per_head else (self.q_size, self.kv_size)
        self.q_norm = Norm(q_size, config, ops) if config.qk_norm else None
        self.k_norm = Norm(kv_size, config, ops) if config.qk_norm else None
        is_sliding = config.layer_types[layer_index] == "sliding_attention"
        self.sliding_window = config.sliding_window if is_sliding else None
        self.scale = config.attention_scale or self.head_dim**-0.5
        self.soft_cap = config.attn_logit_softcapping
        # the cache's format and scales, passed to the attention ops ({}: the model's dtype)
        self.kv_args: dict[str, Any] = {}
        self.calculate_kv_scales = False

    def forward(self, positions, hidden, meta: AttentionMetadata, kv_cache, rotary):
        """`rotary` is the layer's RoPE, or None for a model without (learned positions)."""
        n = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = rotary(positions, q, k)
        key_cache, value_cache = kv_cache
        attention = self.ops.attention
        if self.calculate_kv_scales:
            self._calculate_kv_scales(k, v)
        kv_args = self.kv_args
        attention.reshape_and_cache(k, v, key_cache, value_cache, meta.slot_mapping, **kv_args)
        if meta.decode_only:
            out = attention.paged_decode_attention(
                q,
                key_cache,
                value_cache,
                meta.block_table,
                meta.seq_lens,
                self.scale,
                sliding_window=self.sliding_window,
                soft_cap=self.soft_cap,
                **kv_args,
            )
        else:
            out = attention.paged_attention(
                q,
                key_cache,
                value_cache,
                meta.block_table,
                meta.query_start_loc,
                meta.seq_lens,
                self.scale,
                sliding_window=self.sliding_window,
                soft_cap=self.soft_cap,
                custom_masks=meta.custom_masks,
                **kv_args,
            )
        return self.o_proj(out.reshape(n, self.q_size))

    def _calculate_kv_scales(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """This batch's scales, once: the largest |k| (|v|) lands at a quarter of the
        format's largest finite (headroom for larger values later); 1.0 when it is 0."""
        top = KV_CACHE_FORMATS[self.kv_args["kv_cache_dtype"]].max
        for name, x in (("k_scale", k), ("v_scale", v)):
            largest = float(x.detach().abs().max()) if x.numel() else 0.0
            self.kv_args[name] = largest / (top / 4) if 0 < largest < float("inf") else 1.0
        self.calculate_kv_scales = False


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused in `gate_up_proj` (silu: SwiGLU,
    gelu: GeGLU), or down(act(up(x))) without a gate (GPT-2, GPT-NeoX); of the config's
    intermediate_size unless `intermediate_size` says otherwise (an MoE model's shared
    expert)."""

    def __init__(
        self, config: ModelConfig, ops: ModuleType, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        self.ops = ops
        hidden, bias = config.hidden_size, config.mlp_bias
        inter = config.intermediate_size if intermediate_size is None else intermediate_size
        self.act, self.gated = config.hidden_act, config.gated_mlp
        if self.gated:
            self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)
        else:
            self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x):
        layers = self.ops.layers
        approximate = "tanh" if self.act == "gelu_tanh" else "none"
        if not self.gated:
            return self.down_proj(layers.gelu(self.up_proj(x), approximate))
        gate_up = self.gate_up_proj(x)
        if self.act == "silu":
            return self.down_proj(layers.silu_and_mul(gate_up))
        return self.down_proj(layers.gelu_and_mul(gate_up, approximate))


# Where a layer normalises, by `ModelConfig.norm_placement`: the HF module name of the norm
# (None: no norm there) before attention, after attention, before the MLP, after the MLP.
# Llama's "post_attention_layernorm" is the norm before its MLP; Gemma's and OLMo's is
# applied to the attention output. "parallel" (GPT-NeoX) feeds its two norms the same input.
NORM_PLACES: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
    "parallel": ("input_layernorm", None, "post_attention_layernorm", None),
    "mamba": ("norm", None, None, None),  # Mamba-2: a norm and the mixer, no MLP
}


def add_and_norm(norm: Norm | None, hidden, residual):
    """(norm(stream), stream) for the residual stream = hidden + residual (hidden alone
    when residual is None); without a norm, (stream, stream)."""
    if norm is None:
        stream = hidden if residual is None else hidden + residual
        return stream, stream
    return (norm(hidden), hidden) if residual is None else norm(hidden, residual)


class DecoderLayer(nn.Module):
    """Attention and MLP, each added to the residual stream, with the family's norms.

    `self_attn` is the layer's token mixer: attention, MLA or a Mamba-2 mixer
    (`model.mamba`); `mlp` may be None (Mamba-2's layers have none). The stream travels
    as (hidden, residual), its value hidden + residual (residual None before the first
    layer), so that each add fuses into the next norm."""

    def __init__(
        self,
        config: ModelConfig,
        layer_index: int,
        ops: ModuleType,
        mlp: nn.Module | None,
        attention: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_index, ops) if attention is None else attention
        self.mlp = mlp
        self.parallel = config.norm_placement == "parallel"
        self.norm_names = NORM_PLACES[config.norm_placement]
        for name in filter(None, self.norm_names):
            setattr(self, name, Norm(config.hidden_size, config, ops))

    def forward(self, positions, hidden, residual, meta, kv_cache, rotary):
        before_attn, after_attn, before_mlp, after_mlp = (
            getattr(self, name) if name else None for name in self.norm_names
        )
        hidden, residual = add_and_norm(before_attn, hidden, residual)
        attn = self.self_attn(positions, hidden, meta, kv_cache, rotary)
        if self.mlp is None:
            return attn, residual
        if self.parallel:  # x + attn(norm1(x)) + mlp(norm2(x)), x = residual
            return attn + self.mlp(before_mlp(residual)), residual
        if after_attn is not None:
            attn = after_attn(attn)
        hidden, residual = add_and_norm(before_mlp, attn, residual)
        hidden = self.mlp(hidden)
        return (hidden if after_mlp is None else after_mlp(hidden)), residual


class LlamaForCausalLM(nn.Module):
    """Decoder-only causal LM of the Llama family and its relatives (see the module
    docstring and `families`).

    `ops` is the ops namespace every layer calls (default: the reference ops);
    `use_ops` switches it after construction.
    """

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = None
        if config.position_embedding == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(
                config, i, ops, self.make_mlp(config, i, ops), self.make_attention(config, i, ops)
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = Norm(config.hidden_size, config, ops)
        self.build_rotary()
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def make_mlp(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> nn.Module | None:
        """The MLP of decoder layer `layer_index`: the gated MLP (MoE families override it;
        Mamba-2's layers have none)."""
        return MLP(config, ops)

    def make_attention(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> nn.Module:
        """The token mixer of decoder layer `layer_index`: `Attention` (DeepSeek overrides it
        with multi-head latent attention, the state-space families with a Mamba-2 mixer in
        their "mamba" layers)."""
        return Attention(config, layer_index, ops)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata | Sequence[AttentionMetadata],
        kv_caches: Sequence[tuple[torch.Tensor, ...]],
        mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final hidden states, shape (num_tokens, hidden), for the flattened batch.
        `meta` serves every layer, or is a sequence of one per layer; kv_caches holds
        each layer's cache tensors (`new_kv_cache`: (key_cache, value_cache)).
        `mm_embeds`: None, or (rows int64 (n,), embeddings (n, hidden)): the input rows
        of the flattened batch whose token embeddings are replaced by these (an image's
        rows at its placeholder tokens, `llava`)."""
        metas = [meta] * len(self.layers) if isinstance(meta, AttentionMetadata) else meta
        hidden = self.embed(input_ids, positions)
        if mm_embeds is not None:
            rows, embeds = mm_embeds
            hidden = hidden.index_copy(0, rows, embeds.to(hidden.dtype))
        layers = range(len(self.layers))
        hidden, residual = self.run_layers(layers, positions, hidden, None, metas, kv_caches)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def run_layers(self, layers: range, positions, hidden, residual, metas, kv_caches):
        """The residual stream (hidden, residual) after decoder layers `layers` (a range
        of layer indices; a pipeline stage runs its own), each with its metadata and KV
        cache (`metas[i]`, `kv_caches[i]`, indexed by layer)."""
        for i in layers:
            layer = self.layers[i]
            sliding = layer.self_attn.sliding_window is not None
            rotary = self.rotary_local if sliding and self.rotary_local else self.rotary
            hidden, residual = layer(positions, hidden, residual, metas[i], kv_caches[i], rotary)
        return hidden, residual

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings, times the family's multiplier (Gemma: sqrt(hidden), rounded
        to the embeddings' dtype), plus learned position embeddings (GPT-2)."""
        hidden = self.embed_tokens(input_ids)
        if self.config.embedding_multiplier is not None:
            hidden = hidden * torch.tensor(self.config.embedding_multiplier, dtype=hidden.dtype)
        if self.embed_positions is not None:
            hidden = hidden + self.embed_positions(positions)
        return hidden

    def build_rotary(self) -> None:
        """(Re)compute the RoPE tables, in float32 on the current device of the model:
        `rotary` for every layer (None with learned positions), `rotary_local` for the
        sliding layers when they have their own base (Gemma 3), else None."""
        cfg, device = self.config, self.embed_tokens.weight.device
        rope = cfg.position_embedding == "rope"
        self.rotary = Rotary(cfg, self.ops).to(device) if rope else None
        local = rope and cfg.local_rope_theta is not None
        self.rotary_local = Rotary(cfg, self.ops, local=True).to(device) if local else None

    def required_ops(self) -> list[str]:
        """The ops ("module.name") a forward pass of this model calls."""
        cfg = self.config
        norm = {"rms": "rms_norm", "gemma_rms": "gemma_rms_norm", "layer": "layer_norm"}
        act = "silu_and_mul" if cfg.hidden_act == "silu" else "gelu_and_mul"
        names = [f"layers.{norm[cfg.norm]}", f"layers.{act if cfg.gated_mlp else 'gelu'}"]
        names += ["attention.reshape_and_cache", "attention.paged_attention"]
        names += ["attention.paged_decode_attention"]
        if cfg.position_embedding == "rope":
            names += ["rope.rope_inv_freq", "rope.apply_rope"]
        return names

    def use_ops(self, ops: ModuleType) -> None:
        """Make every layer call the ops of `ops` (a `pyagent_ref.ops.load` namespace).

        Raises:
            ValueError: the namespace lacks an op this model needs (an accelerator
                without some twin, a partial namespace of your own): the message names
                the ops and the namespaces that have them ("auto" runs the reference
                for ops the accelerator lacks, "ref").
        """
        missing = [
            name
            for name in self.required_ops()
            if not hasattr(getattr(ops, name.split(".")[0], None), name.split(".")[1])
        ]
        if missing:
            raise ValueError(
                f"the ops namespace {getattr(ops, '__name__', ops)!r} lacks {missing}, which "
                f"{self.config.architecture} needs; use ops='auto' (the reference runs what "
                f"the accelerator lacks) or ops='ref'"
            )
        for module in self.modules():
            if "ops" in vars(module):
                module.ops = ops

    @property
    def supports_cuda_graphs(self) -> bool:
        """Whether a decode step can be captured: everything but dynamic NTK RoPE, which
        reads the longest position on the host to pick its frequencies."""
        return not any(r is not None and r.dynamic for r in (self.rotary, self.rotary_local))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of the given hidden states, in float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = (hidden @ weight.T).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        """The shape of each of a layer's cache tensors (`new_kv_cache`)."""
        cfg = self.config
        return (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)

    kv_cache_dtype = "auto"

    def set_kv_cache_dtype(
        self,
        kv_cache_dtype: str,
        scales: dict[int, tuple[float, float]] | None = None,
        calculate: bool = False,
    ) -> None:
        """Keep the KV cache in `kv_cache_dtype` from the next `new_kv_cache` on: "auto"
        (the parameters' dtype) or an fp8 format ("fp8" = "fp8_e4m3", "fp8_e5m2"; uint8
        tensors of its codes, see `ops.attention.reshape_and_cache`). An fp8 layer i
        writes and reads with scales[i] = (k_scale, v_scale) (default 1.0, 1.0), or with
        calculate=True computes them from the first batch it runs.

        Raises:
            ValueError: an unknown kv_cache_dtype, an fp8 one for a layer that does not
                keep its KV with `Attention` (MLA), scales or calculate with "auto", a
                scales key that is not an attention layer.
        """
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
            )
        fp8 = kv_cache_dtype != "auto"
        scales = scales or {}
        if not fp8 and (scales or calculate):
            raise ValueError("KV scales and calculate_kv_scales need an fp8 kv_cache_dtype")
        attention = {
            i: layer.self_attn
            for i, layer in enumerate(self.layers)
            if isinstance(layer.self_attn, Attention)
        }
        if fp8 and self.config.mla is not None:
            raise ValueError(
                f"kv_cache_dtype={kv_cache_dtype!r}: {self.config.architecture}'s multi-head "
                "latent attention keeps an MLA cache, which has no fp8 form here; use 'auto'"
            )
        unknown = sorted(set(scales) - set(attention))
        if unknown:
            raise ValueError(f"KV scales for layers {unknown}, which are not attention layers")
        self.kv_cache_dtype = kv_cache_dtype
        for i, attn in attention.items():
            k_scale, v_scale = scales.get(i, (1.0, 1.0))
            attn.kv_args = (
                {"kv_cache_dtype": kv_cache_dtype, "k_scale": k_scale, "v_scale": v_scale}
                if fp8
                else {}
            )
            attn.calculate_kv_scales = fp8 and calculate

    def new_kv_cache(self, num_blocks: int, block_size: int) -> tuple[torch.Tensor, ...]:
        """One layer's paged cache, zeroed, in the parameters' dtype (uint8 with an fp8
        `kv_cache_dtype`) and device: the tuple its attention takes, (key_cache,
        value_cache) here, both of `kv_cache_shape`."""
        weight = self.embed_tokens.weight
        dtype = weight.dtype if self.kv_cache_dtype == "auto" else torch.uint8
        shape = self.kv_cache_shape(num_blocks, block_size)
        return tuple(torch.zeros(shape, dtype=dtype, device=weight.device) for _ in range(2))


def param_mapping() -> list[tuple[str, str, Any]]:
    """(fused parameter, HF parameter, shard) pairs: how separate HF tensors fill the
    fused ones. Shards are "q", "k", "v" for qkv_proj and 0, 1 for gate_up_proj."""
    return [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]
