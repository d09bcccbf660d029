"""DeepSeek-V2 and V3: multi-head latent attention (MLA) on the MoE decoder.

MLA (DeepSeek-V2, Liu et al. 2024) compresses what a token leaves in the KV cache. With
H heads, r = kv_lora_rank, n = qk_nope_head_dim, p = qk_rope_head_dim, v = v_head_dim:

    c_t = RMSNorm(W_dkv x_t)                 the latent, r features
    k_pe_t = RoPE(W_kr x_t)                  the rotary key, p features, shared by all heads
    k_t,h = [W_uk[h] c_t ; k_pe_t]           key of head h: n + p features
    v_t,h = W_uv[h] c_t                      value of head h: v features
    q_t,h = [q_nope_t,h ; RoPE(q_pe_t,h)]    from x_t directly or through a low-rank q_lora_rank

(W_dkv and W_kr are HF's `kv_a_proj_with_mqa`, W_uk and W_uv the rows of `kv_b_proj`).
Only c_t and k_pe_t are cached: r + p numbers per token and layer
(`ops.attention.concat_and_cache_mla`), 576 for DeepSeek-V2/V3 where grouped-query
attention with 8 KV heads of 128 would keep 2048.

Two ways to attend, equal up to rounding:

- naive: gather every request's latents from the cache, expand them to per-head keys
  and values with W_uk and W_uv, and run `paged_attention` over the expanded sequences
  (one cache block per request). Per (query, key) pair it costs H (n + p + v) multiply-
  adds, plus the expansion of every cached token: cheap when a request has many query
  tokens (a prefill), since the expansion is shared by all of them.
- absorbed: since q_nope . (W_uk[h] c) = (W_uk[h]^T q_nope) . c, fold W_uk into the
  query, q'_h = [W_uk[h]^T q_nope_h ; q_pe_h] (r + p features), and attend over the
  cached [c ; k_pe] directly: multi-query attention with one KV head whose values are
  the first r features of its keys (the latent cache passed as both caches). Since
  sum_j w_j W_uv[h] c_j = W_uv[h] sum_j w_j c_j, W_uv is applied after attention. Each
  (query, key) pair costs H (2r + p), no expansion: the decode path, static-shaped
  (`paged_decode_attention`) so a CUDA graph captures it.

`MLAAttention.prefill_path` picks the path of batches with prefill tokens ("naive" by
default, or "absorbed"); a batch of decodes only (`AttentionMetadata.decode_only`)
always takes the absorbed one. The softmax scale is (n + p) ** -0.5, times YaRN's
mscale(mscale_all_dim) squared when the RoPE scaling sets it (`families.deepseek_fields`).

Everything else is the MoE decoder of `model.moe` (RMSNorm before attention and MLP,
dense MLPs in the first `first_k_dense_replace` layers, the MoE block with DeepSeek's
router and an ungated shared expert after them).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from .config import ModelConfig
from .llama import AttentionMetadata, Norm
from .moe import MoEForCausalLM

PREFILL_PATHS = ("naive", "absorbed")
# HF's and DeepSeek's code build the q and kv latents' RMSNorms with eps 1e-6, whatever
# rms_norm_eps says (real checkpoints set rms_norm_eps to 1e-6 anyway)
LATENT_NORM_EPS = 1e-6


class MLAAttention(nn.Module):
    """Multi-head latent attention of one layer over its paged latent cache (see the
    module docstring). Parameters carry HF's names; `kv_cache` is the one tensor
    (num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)."""

    def __init__(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> None:
        super().__init__()
        mla = config.mla
        self.ops = ops
        self.num_heads = heads = config.num_attention_heads
        self.rank, self.nope, self.rope = (
            mla.kv_lora_rank,
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim,
        )
        self.v_dim = mla.v_head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        q_out = heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = Norm(mla.q_lora_rank, config, ops, eps=LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, mla.latent_size, bias=bias)
        self.kv_a_layernorm = Norm(self.rank, config, ops, eps=LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.rank, heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=bias)
        self.scale = config.attention_scale
        self.sliding_window = None  # the decoder asks; MLA attends to the whole sequence
        self.prefill_path = "naive"

    def forward(self, positions, hidden, meta: AttentionMetadata, kv_cache, rotary):
        n, heads = hidden.shape[0], self.num_heads
        if hasattr(self, "q_proj"):
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.reshape(n, heads, self.nope + self.rope).split([self.nope, self.rope], -1)
        kv_c, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.rank, self.rope], -1)
        kv_c = self.kv_a_layernorm(kv_c.contiguous())
        q_pe, k_pe = rotary(positions, q_pe, k_pe.reshape(n, 1, self.rope))
        (cache,) = kv_cache
        self.ops.attention.concat_and_cache_mla(
            kv_c, k_pe.reshape(n, self.rope), cache, meta.slot_mapping
        )
        if meta.decode_only or self.prefill_path == "absorbed":
            out = self.absorbed(q_nope, q_pe, cache, meta)
        else:
            out = self.naive(q_nope, q_pe, cache, meta)
        return self.o_proj(out.reshape(n, heads * self.v_dim))

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_uk, W_uv): views of kv_b_proj's weight, (heads, nope, rank) and
        (heads, v_head_dim, rank)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def absorbed(self, q_nope, q_pe, cache, meta: AttentionMetadata) -> torch.Tensor:
        """Attention over the latents with W_uk folded into the queries and W_uv applied
        to the output: (tokens, heads, v_head_dim)."""
        w_uk, w_uv = self.up_projections()
        query = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)
        latent = cache.unsqueeze(2)  # one KV head: its keys, and its values' first `rank`
        attention = self.ops.attention
        if meta.decode_only:
            out = attention.paged_decode_attention(
                query, latent, latent, meta.block_table, meta.seq_lens, self.scale
            )
        else:
            out = attention.paged_attention(
                query,
                latent,
                latent,
                meta.block_table,
                meta.query_start_loc,
                meta.seq_lens,
                self.scale,
                custom_masks=meta.custom_masks,
            )
        return torch.einsum("thr,hvr->thv", out[..., : self.rank], w_uv)

    def naive(self, q_nope, q_pe, cache, meta: AttentionMetadata) -> torch.Tensor:
        """Attention over keys and values expanded from each request's cached latents:
        (tokens, heads, v_head_dim)."""
        num_reqs, block_size = meta.seq_lens.shape[0], cache.shape[1]
        longest = int(meta.seq_lens.max()) if num_reqs else 0
        dev = cache.device
        pos = torch.arange(longest, device=dev)
        used = pos[None, :] < meta.seq_lens[:, None].to(dev)
        blocks = meta.block_table[:, pos // block_size].to(dev, torch.int64)
        slots = torch.where(used, blocks * block_size + pos % block_size, 0)
        latents = cache.reshape(-1, cache.shape[-1])[slots]  # (requests, longest, rank + rope)
        c, k_pe = latents.split([self.rank, self.rope], dim=-1)
        kv = self.kv_b_proj(c).view(num_reqs, longest, self.num_heads, self.nope + self.v_dim)
        k_nope, values = kv.split([self.nope, self.v_dim], dim=-1)
        keys = torch.cat([k_nope, k_pe[:, :, None].expand(-1, -1, self.num_heads, -1)], dim=-1)
        query = torch.cat([q_nope, q_pe], dim=-1)
        # the attention ops take one head size: zeros widen the narrower of q/k and v,
        # changing no score (q . k) and no output feature kept
        width = max(query.shape[-1], self.v_dim)
        query, keys, values = (
            nn.functional.pad(x, (0, width - x.shape[-1])) for x in (query, keys, values)
        )
        table = torch.arange(num_reqs, device=dev)[:, None]  # request r's sequence: block r
        out = self.ops.attention.paged_attention(
            query,
            keys.contiguous(),
            values.contiguous(),
            table,
            meta.query_start_loc,
            meta.seq_lens,
            self.scale,
            custom_masks=meta.custom_masks,
        )
        return out[..., : self.v_dim]


class DeepseekForCausalLM(MoEForCausalLM):
    """DeepSeek-V2 and V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): the MoE
    decoder with multi-head latent attention; each layer caches one latent tensor."""

    def make_attention(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> nn.Module:
        return MLAAttention(config, layer_index, ops)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int]:
        """(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim): the latent cache."""
        return (num_blocks, block_size, self.config.mla.latent_size)

    def new_kv_cache(self, num_blocks: int, block_size: int) -> tuple[torch.Tensor, ...]:
        """One layer's latent cache, zeroed: a tuple of one tensor of `kv_cache_shape`."""
        weight = self.embed_tokens.weight
        shape = self.kv_cache_shape(num_blocks, block_size)
        return (torch.zeros(shape, dtype=weight.dtype, device=weight.device),)

    def required_ops(self) -> list[str]:
        names = super().required_ops()
        names[names.index("attention.reshape_and_cache")] = "attention.concat_and_cache_mla"
        return names

    def set_prefill_path(self, path: str) -> None:
        """How every layer attends in batches with prefill tokens: "naive" (expanded keys
        and values) or "absorbed" (over the latents, as decode batches always do).

        Raises:
            ValueError: another path.
        """
        if path not in PREFILL_PATHS:
            raise ValueError(f"path must be one of {PREFILL_PATHS}, got {path!r}")
        for layer in self.layers:
            layer.self_attn.prefill_path = path

    def checkpoint_name(self, param: str, shard: object) -> str | None:
        """HF's names of the MoE tensors (`MoEForCausalLM.checkpoint_name`) and of the
        shared expert, `mlp.shared_experts.{gate,up,down}_proj`."""
        found = super().checkpoint_name(param, shard)
        if found is not None or ".mlp.shared_expert." not in param:
            return found
        proj = {0: "gate_proj", 1: "up_proj"}.get(shard, param.split(".")[-2])
        layer = param.split(".")[1]
        return f"model.layers.{layer}.mlp.shared_experts.{proj}.weight"
