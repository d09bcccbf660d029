"""BERT: an encoder on the paged KV cache (embeddings, rerankers, classifiers).

An encoder reads its whole prompt at once, every token attending to every token of its
sequence (`ops.attention.paged_attention` with causal=False), and emits no token: a
pooling request takes its final hidden states (`model.pooling`). What differs from the
decoder of `llama.py`:

- the input is word + learned absolute position + token type embeddings (segment A = 0,
  segment B = 1 of a sentence pair, as a cross-encoder reads a query and a document),
  then a LayerNorm;
- each layer normalises *after* adding its residual: x = LN(x + attn(x)), then
  x = LN(x + mlp(x)) (post-LN), with LayerNorm biases, a plain GELU MLP and biases on
  every projection;
- no final norm and no vocabulary head. `BertForSequenceClassification` adds BERT's
  pooler (tanh(W h_[CLS] + b)) and a linear classifier on it: `classification_head`.

The engine schedules an encoder prompt whole in one step (a chunk could not see the
tokens after it) and keeps no KV after it: the cache holds a prompt's K/V only while its
step runs. Positions are the tokens' indices in their prompt, so position embeddings
match HF's `position_ids` (0 .. n-1).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from .. import ops as reference_ops
from .config import ModelConfig
from .llama import MLP, AttentionMetadata, LlamaForCausalLM, Norm


class BertAttention(nn.Module):
    """Bidirectional multi-head self-attention over the paged cache, q/k/v fused in
    `qkv_proj` (the loader fills it from HF's query, key and value)."""

    def __init__(self, config: ModelConfig, ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.size = self.num_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * self.size, bias=True)
        self.o_proj = nn.Linear(self.size, config.hidden_size, bias=True)
        self.scale = self.head_dim**-0.5

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata, kv_cache) -> torch.Tensor:
        n = hidden.shape[0]
        q, k, v = (
            x.reshape(n, self.num_heads, self.head_dim)
            for x in self.qkv_proj(hidden).split(self.size, dim=-1)
        )
        key_cache, value_cache = kv_cache
        attention = self.ops.attention
        attention.reshape_and_cache(k, v, key_cache, value_cache, meta.slot_mapping)
        out = attention.paged_attention(
            q,
            key_cache,
            value_cache,
            meta.block_table,
            meta.query_start_loc,
            meta.seq_lens,
            self.scale,
            causal=False,
        )
        return self.o_proj(out.reshape(n, self.size))


class EncoderLayer(nn.Module):
    """x = LN(x + attn(x)); x = LN(x + mlp(x)) (BERT's post-LN layer)."""

    def __init__(self, config: ModelConfig, ops: ModuleType) -> None:
        super().__init__()
        self.self_attn = BertAttention(config, ops)
        self.attention_norm = Norm(config.hidden_size, config, ops)
        self.mlp = MLP(config, ops)
        self.output_norm = Norm(config.hidden_size, config, ops)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata, kv_cache) -> torch.Tensor:
        hidden, _ = self.attention_norm(self.self_attn(hidden, meta, kv_cache), hidden)
        hidden, _ = self.output_norm(self.mlp(hidden), hidden)
        return hidden


class BertModel(nn.Module):
    """The BERT encoder (`BertModel`): final hidden states of every token, for pooling.

    `ops` is the ops namespace every layer calls (default: the reference ops).
    """

    uses_token_types = True  # forward takes token_type_ids (the runner passes them)
    supports_cuda_graphs = False  # no decode step to capture: prompts run whole

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        super().__init__()
        if config.type_vocab_size < 1:
            raise ValueError(
                f"a BERT model needs type_vocab_size >= 1, got {config.type_vocab_size}"
            )
        self.config = config
        self.ops = ops
        size = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, size)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, size)
        self.embed_token_types = nn.Embedding(config.type_vocab_size, size)
        self.embed_norm = Norm(size, config, ops)
        self.layers = nn.ModuleList(
            EncoderLayer(config, ops) for _ in range(config.num_hidden_layers)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata | list[AttentionMetadata],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states, shape (num_tokens, hidden), of the flattened batch; each
        request's query tokens must be its whole prompt (seq_len == q_len).
        token_type_ids: (num_tokens,) in [0, type_vocab_size), None for all zeros."""
        metas = [meta] * len(self.layers) if isinstance(meta, AttentionMetadata) else meta
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = (
            self.embed_tokens(input_ids)
            + self.embed_positions(positions)
            + self.embed_token_types(token_type_ids)
        )
        hidden = self.embed_norm(hidden)
        for layer, layer_meta, kv_cache in zip(self.layers, metas, kv_caches, strict=True):
            hidden = layer(hidden, layer_meta, kv_cache)
        return hidden

    def build_rotary(self) -> None:
        """No RoPE: positions are learned embeddings (loaded, not computed)."""

    def required_ops(self) -> list[str]:
        """The ops ("module.name") a forward pass of this model calls."""
        return [
            "layers.layer_norm",
            "layers.gelu",
            "attention.reshape_and_cache",
            "attention.paged_attention",
        ]

    use_ops = LlamaForCausalLM.use_ops
    new_kv_cache = LlamaForCausalLM.new_kv_cache  # (key_cache, value_cache)
    kv_cache_dtype = "auto"  # an encoder's cache is never fp8 (the engine refuses it)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        cfg = self.config
        return (num_blocks, block_size, cfg.num_attention_heads, cfg.head_dim)


class BertForSequenceClassification(BertModel):
    """BERT with its classification head (`BertForSequenceClassification`): a
    cross-encoder scoring a (query, document) pair, or a classifier of one text."""

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        super().__init__(config, ops)
        if config.num_labels < 1:
            raise ValueError(
                f"a classification model needs num_labels >= 1, got {config.num_labels}"
            )
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def classification_head(self, cls_states: torch.Tensor) -> torch.Tensor:
        """The logits, shape (n, num_labels) in float32, of the [CLS] states (n, hidden):
        classifier(tanh(pooler(h)))."""
        weight = self.pooler.weight
        return self.classifier(torch.tanh(self.pooler(cls_states.to(weight.dtype)))).float()
