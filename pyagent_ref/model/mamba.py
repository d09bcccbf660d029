"""State-space models: Mamba-2, and Bamba (Mamba-2 layers among attention layers).

A Mamba-2 layer (Dao and Gu 2024) mixes tokens with a selective state space instead of
attention. With H heads of P channels, G groups of N state features:

    [z ; xBC ; dt] = in_proj(h)                  the gate, the convolution's input, H steps
    xBC = silu(conv1d(xBC))                      causal, depthwise (`ops.ssm.causal_conv1d`)
    [x ; B ; C] = xBC                            H x P, G x N, G x N
    y = SSD(x, dt, A = -exp(A_log), B, C, D)     softplus(dt + dt_bias) steps (`ops.ssm`)
    out = out_proj(norm.weight * RMSNorm_per_group(y * silu(z)))

A Mamba layer keeps no keys or values: a request carries, per Mamba layer, the last
conv_kernel - 1 inputs of its convolution and its SSM state (H x P x N, float32), of a
fixed size whatever its length. The KV cache gives each request one state slot for its
whole life (`kv_cache.MambaSpec`): the layer's metadata has one block per request in its
block table, the slot, which indexes the layer's state tensors (`new_state_cache`).

A step runs, for each request, from the state its slot holds: zeros when the step
starts its sequence (seq_len equals its query tokens: a new or recomputed request),
else the state its previous chunk or decode left, which is how chunked prefill carries
the state across chunks. Prefills and mixed batches scan with `ssd_scan` (the chunked
dual form); batches of decodes (`AttentionMetadata.decode_only`) take one step with
`selective_state_update`, static-shaped, so a CUDA graph records it; padding rows
(seq_len 0) read zeros and write the null slot 0. The new states go back to the slots.

`Mamba2ForCausalLM` is a stack of (RMSNorm, mixer) layers with no MLP and no positions;
`BambaForCausalLM` is Llama's decoder (half-rotary RoPE) whose non-attention layers have
the mixer in place of attention (`ModelConfig.layer_types` "mamba").
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from .. import ops as reference_ops
from .config import MambaConfig, ModelConfig
from .llama import AttentionMetadata, LlamaForCausalLM


def state_cache(
    m: MambaConfig, num_slots: int, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """num_slots zeroed state slots of a mixer of `m`: the convolution's (num_slots,
    conv_dim, conv_kernel - 1) in like's dtype, the SSM's (num_slots, heads, head_dim,
    state_size) in float32, both on like's device."""
    conv = torch.zeros(
        (num_slots, m.conv_dim, m.conv_kernel - 1), dtype=like.dtype, device=like.device
    )
    shape = (num_slots, m.num_heads, m.head_dim, m.state_size)
    return conv, torch.zeros(shape, dtype=torch.float32, device=like.device)


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm: y * silu(z), RMS-normalised within each of the groups,
    times `weight`, in float32 (as HF's MambaRMSNormGated)."""

    def __init__(self, size: int, groups: int, eps: float, ops: ModuleType) -> None:
        super().__init__()
        self.ops, self.groups, self.eps = ops, groups, eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        layers, n = self.ops.layers, y.shape[0]
        gated = layers.silu_and_mul(torch.cat([gate.to(y.dtype), y], dim=-1))
        grouped = gated.reshape(n, self.groups, -1)
        unit = torch.ones(grouped.shape[-1], dtype=y.dtype, device=y.device)
        return layers.rms_norm(grouped, unit, self.eps).reshape(n, -1) * self.weight


class Mamba2Mixer(nn.Module):
    """One Mamba-2 layer's token mixer (see the module docstring). Parameters carry HF's
    names; `kv_cache` is the layer's (conv_state, ssm_state) of `new_state_cache`."""

    def __init__(self, config: ModelConfig, ops: ModuleType) -> None:
        super().__init__()
        m: MambaConfig = config.mamba
        self.ops, self.mamba = ops, m
        inter = m.intermediate_size
        self.in_proj = nn.Linear(config.hidden_size, inter + m.conv_dim + m.num_heads, m.proj_bias)
        # holds the depthwise weights (conv_dim, 1, conv_kernel) and bias; never called
        self.conv1d = nn.Conv1d(m.conv_dim, m.conv_dim, m.conv_kernel, groups=m.conv_dim)
        if not m.conv_bias:
            self.conv1d.bias = None
        self.dt_bias = nn.Parameter(torch.ones(m.num_heads))
        self.A_log = nn.Parameter(torch.zeros(m.num_heads))
        self.D = nn.Parameter(torch.ones(m.num_heads))
        self.norm = GatedRMSNorm(inter, m.n_groups, m.norm_eps, ops)
        self.out_proj = nn.Linear(inter, config.hidden_size, m.proj_bias)
        self.sliding_window = None  # the decoder asks; a mixer has no window

    def forward(self, positions, hidden, meta: AttentionMetadata, kv_cache, rotary):
        m, ssm, n = self.mamba, self.ops.ssm, hidden.shape[0]
        inter, groups = m.intermediate_size, m.n_groups * m.state_size
        gate, xbc, dt = self.in_proj(hidden).split([inter, m.conv_dim, m.num_heads], dim=-1)
        conv_cache, ssm_cache = kv_cache
        # each request's slot (padding rows, seq_len 0: the null slot) and whether it
        # continues from the state there (its sequence began before this step)
        query_lens = meta.query_start_loc[1:] - meta.query_start_loc[:-1]
        slots = torch.where(meta.seq_lens > 0, meta.block_table[:, 0], 0)
        carried = meta.seq_lens > query_lens
        conv_state = torch.where(carried[:, None, None], conv_cache[slots], 0)
        weight, bias = self.conv1d.weight[:, 0, :], self.conv1d.bias
        xbc, conv_cache[slots] = ssm.causal_conv1d(
            xbc, weight, bias, conv_state, meta.query_start_loc, "silu"
        )
        x, b, c = xbc.split([inter, groups, groups], dim=-1)
        x = x.reshape(n, m.num_heads, m.head_dim)
        b, c = (v.reshape(n, m.n_groups, m.state_size) for v in (b, c))
        a = -torch.exp(self.A_log.float())
        state = torch.where(carried[:, None, None, None], ssm_cache[slots], 0)
        if meta.decode_only:
            y, new_state = ssm.selective_state_update(
                state, x, dt, a, b, c, self.D, self.dt_bias, dt_softplus=True
            )
        else:
            y, new_state = ssm.ssd_scan(
                x,
                dt,
                a,
                b,
                c,
                state,
                meta.query_start_loc,
                m.chunk_size,
                self.D,
                self.dt_bias,
                True,
            )
        ssm_cache[slots] = new_state.to(ssm_cache.dtype)
        y = self.norm(y.reshape(n, inter), gate)
        return self.out_proj(y.to(hidden.dtype))


class MambaHybridForCausalLM(LlamaForCausalLM):
    """Llama's decoder with a Mamba-2 mixer in place of attention in its "mamba" layers
    (`BambaForCausalLM`): MLPs, norms and the attention layers as the decoder has them.
    Each Mamba layer's cache is a state tuple (`new_state_cache`), each attention
    layer's the usual K and V (`new_kv_cache`)."""

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        if config.mamba is None:
            raise ValueError(f"{type(self).__name__} needs a mamba config, got mamba=None")
        super().__init__(config, ops)

    def make_attention(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> nn.Module:
        if config.layer_types[layer_index] == "mamba":
            return Mamba2Mixer(config, ops)
        return super().make_attention(config, layer_index, ops)

    def state_layers(self) -> list[int]:
        """The layers that keep a state instead of KV, in order."""
        return [i for i, kind in enumerate(self.config.layer_types) if kind == "mamba"]

    def new_state_cache(self, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One Mamba layer's state slots, zeroed: the convolution's (num_slots, conv_dim,
        conv_kernel - 1) in the parameters' dtype, the SSM's (num_slots, heads, head_dim,
        state_size) in float32 (as Mamba's kernels keep it)."""
        return state_cache(self.config.mamba, num_slots, self.embed_tokens.weight)

    def required_ops(self) -> list[str]:
        names = ["ssm.causal_conv1d", "ssm.ssd_scan", "ssm.selective_state_update"]
        return [*super().required_ops(), "layers.silu_and_mul", *names]

    def checkpoint_name(self, param: str, shard: object) -> str | None:
        """HF's names of Bamba's tensors that ours rename: the mixer (`mamba`), the MLP
        (`feed_forward`, its gate and up shards), the norm before it (`pre_ff_layernorm`)
        and the final norm (`final_layernorm`)."""
        if param == "norm.weight":
            return "model.final_layernorm.weight"
        if not param.startswith("layers."):
            return None
        layer = int(param.split(".")[1])
        if self.config.layer_types[layer] == "mamba":
            param = param.replace(".self_attn.", ".mamba.")
        if shard in (0, 1):
            param = param.replace(".gate_up_proj.", (".gate_proj.", ".up_proj.")[shard])
        param = param.replace(".mlp.", ".feed_forward.")
        return "model." + param.replace(".post_attention_layernorm.", ".pre_ff_layernorm.")


class Mamba2ForCausalLM(MambaHybridForCausalLM):
    """Mamba-2: every layer an RMSNorm and a Mamba-2 mixer, no MLP, no positions; the
    checkpoint's tensors live under `backbone.` (`embeddings`, `layers.<i>.mixer`,
    `norm_f`)."""

    def make_mlp(self, config: ModelConfig, layer_index: int, ops: ModuleType) -> None:
        return None

    def required_ops(self) -> list[str]:
        names = ["ssm.causal_conv1d", "ssm.ssd_scan", "ssm.selective_state_update"]
        return ["layers.rms_norm", "layers.silu_and_mul", *names]

    def checkpoint_name(self, param: str, shard: object) -> str | None:
        if param == "lm_head.weight":
            return None
        special = {"embed_tokens.weight": "embeddings.weight", "norm.weight": "norm_f.weight"}
        return "backbone." + special.get(param, param.replace(".self_attn.", ".mixer."))
