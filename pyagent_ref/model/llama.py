"""The Llama family on a paged KV cache: Llama 2/3, Mistral, Qwen2, Qwen3.

One decoder covers the family; the differences are configuration (`ModelConfig`):
grouped-query attention, q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3), sliding
window layers (Mistral), RoPE scaling (Llama 3.1 and others), tied embeddings.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .. import ops as reference_ops
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
    """

    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    decode_only: bool = False


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: ModuleType) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.ops.layers.rms_norm(x, self.weight, self.eps, residual)


class Rotary(nn.Module):
    """RoPE tables for the model; recomputed per step only for dynamic NTK scaling."""

    def __init__(self, config: ModelConfig, ops: ModuleType) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        inv_freq, self.scale = ops.rope.rope_inv_freq(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            config.max_position_embeddings,
            like=torch.empty(0),
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.dynamic = (config.rope_scaling or {}).get("rope_type") == "dynamic"

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        inv_freq, scale = self.inv_freq, self.scale
        if self.dynamic and positions.numel():
            cfg = self.config
            inv_freq, scale = self.ops.rope.rope_inv_freq(
                cfg.head_dim,
                cfg.rope_theta,
                cfg.rope_scaling,
                cfg.max_position_embeddings,
                seq_len=int(positions.max()) + 1,
                like=positions,
            )
        return self.ops.rope.apply_rope(positions, q, k, inv_freq, scale, is_neox=True)


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
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops) if config.qk_norm else None
        is_sliding = config.layer_types[layer_index] == "sliding_attention"
        self.sliding_window = config.sliding_window if is_sliding else None
        self.scale = self.head_dim**-0.5

    def forward(self, positions, hidden, meta: AttentionMetadata, kv_cache, rotary: Rotary):
        n = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        key_cache, value_cache = kv_cache
        attention = self.ops.attention
        attention.reshape_and_cache(k, v, key_cache, value_cache, meta.slot_mapping)
        if meta.decode_only:
            out = attention.paged_decode_attention(
                q,
                key_cache,
                value_cache,
                meta.block_table,
                meta.seq_lens,
                self.scale,
                sliding_window=self.sliding_window,
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
            )
        return self.o_proj(out.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(self.ops.layers.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_index, ops)
        self.mlp = MLP(config, ops)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(self, positions, hidden, residual, meta, kv_cache, rotary):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta, kv_cache, rotary)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    """Decoder-only causal LM of the Llama family (see the module docstring).

    `ops` is the ops namespace every layer calls (default: the reference ops);
    `use_ops` switches it after construction.
    """

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ops) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.rotary = Rotary(config, ops)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata | Sequence[AttentionMetadata],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Final hidden states, shape (num_tokens, hidden), for the flattened batch.
        `meta` serves every layer, or is a sequence of one per layer; kv_caches holds
        each layer's (key_cache, value_cache)."""
        metas = [meta] * len(self.layers) if isinstance(meta, AttentionMetadata) else meta
        hidden, residual = self.embed_tokens(input_ids), None
        for layer, layer_meta, kv_cache in zip(self.layers, metas, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, layer_meta, kv_cache, self.rotary)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def use_ops(self, ops: ModuleType) -> None:
        """Make every layer call the ops of `ops` (a `pyagent_ref.ops.load` namespace)."""
        for module in self.modules():
            if "ops" in vars(module):
                module.ops = ops

    @property
    def supports_cuda_graphs(self) -> bool:
        """Whether a decode step can be captured: everything but dynamic NTK RoPE, which
        reads the longest position on the host to pick its frequencies."""
        return not self.rotary.dynamic

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of the given hidden states, in float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ weight.T).float()

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        cfg = self.config
        return (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)


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
