"""The dense families beyond Llama, each as its declared differences from it.

Every family here runs on the one decoder of `llama.py`. A `Family` says how its
`config.json` reads into `ModelConfig` (HF key names, the fields it sets) and how its
checkpoint's tensors map onto the decoder's parameters (renames, tensors that are
buffers, layouts that differ). Llama, Mistral, Qwen2 and Qwen3 need none of this:
`ModelConfig.from_hf` reads them directly.

What differs from Llama:

- Gemma 2: (1 + w) RMSNorm before and after attention and MLP, GeGLU (tanh GELU),
  embeddings scaled by sqrt(hidden), softmax scale query_pre_attn_scalar ** -0.5,
  soft-capped attention scores and logits, sliding window on alternate layers.
- Gemma 3 (text): Gemma 2 without soft caps by default, with per-head q/k norms, five
  sliding layers per full one, and a RoPE base of their own for the sliding layers.
  (Gemma 1: Gemma's norm, GeGLU and embedding scale on Llama's layer.)
- Phi-3: q/k/v and gate/up stored fused, a partial rotary factor.
- OLMo 2: norms after attention and after the MLP only, q/k RMSNorm over the whole
  projection.
- GPT-NeoX: LayerNorm with bias, attention and MLP in parallel, partial rotary, a plain
  GELU MLP with biases, q/k/v interleaved per head in the checkpoint.
- GPT-2: LayerNorm with bias, learned positions, Conv1D weights stored transposed, a
  plain GELU MLP with biases.
- Mamba-2: no attention and no MLP; each layer an RMSNorm and a Mamba-2 mixer
  (`model.mamba`), no positions; the checkpoint under `backbone.`.
- Bamba: Llama's decoder (half-rotary RoPE) with a Mamba-2 mixer in place of attention
  in every layer but those of `attn_layer_indices`; its MLP is `feed_forward`, the norm
  before it `pre_ff_layernorm`.
- DeepSeek-V2/V3: multi-head latent attention (`model.deepseek`) with interleaved RoPE
  and, under YaRN, a softmax scale multiplied by mscale(mscale_all_dim) squared; their
  MoE layers (`MoEConfig`) have shared experts and group-limited routers; V3's
  multi-token-prediction layers in the checkpoint are skipped.
- BERT (an encoder, run by `model.bert`, not the decoder): bidirectional attention,
  learned absolute positions and token types, LayerNorm with bias after each residual
  add, a plain GELU MLP, biases everywhere; a classification head on the [CLS] token
  for BertForSequenceClassification.
- LLaVA (`model.llava`): the decoder on its text_config, plus a CLIP vision tower and a
  projector whose rows replace the image tokens' embeddings; checkpoints in llava-hf's
  or transformers 5's layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..ops.rope import ROPE_TYPES

SLIDING, FULL, MAMBA = "sliding_attention", "full_attention", "mamba"


@dataclass(frozen=True)
class Family:
    """How one architecture's HF files read into the decoder.

    hf_keys: config.json -> config.json with Llama's key names (GPT-2's n_embd, ...).
    fields: (config.json, the fields read the Llama way) -> the fields this family sets.
    renames: (HF, ours) replacements applied in order to each tensor name: one that
        starts with "." replaces inside the name, any other replaces a prefix.
    ignored: name suffixes of checkpoint tensors that are buffers, not parameters.
    reshape: (our parameter name, tensor, fields) -> the tensor in our layout.
    skipped: (checkpoint tensor name, fields) -> whether the tensor belongs to a part of
        the checkpoint the model does not run (DeepSeek-V3's multi-token prediction).
    """

    fields: Callable[[dict, dict], dict]
    hf_keys: Callable[[dict], dict] = lambda cfg: cfg
    renames: tuple[tuple[str, str], ...] = ()
    ignored: tuple[str, ...] = ()
    reshape: Callable[[str, Any, Any], Any] | None = None
    skipped: Callable[[str, Any], bool] = lambda name, fields: False


HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}


def hf_activation(name: str, key: str) -> str:
    """Our activation for an HF activation name; ValueError naming the config key."""
    if name not in HF_ACTIVATIONS:
        raise ValueError(
            f"config.json {key}={name!r} is not supported; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


def check_rope_scaling(rope: dict, key: str) -> dict:
    """A rope_scaling dict without its default type (an empty dict then), or ValueError
    naming the config key when the type is one `ops.rope` lacks (Phi-3's longrope, ...)."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return {}
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"config.json {key} of type {rope_type!r} is not supported; supported: {ROPE_TYPES}"
        )
    return rope


def refuse(cfg: dict, key: str, supported: Any) -> None:
    """ValueError naming `key` when the config sets it to anything but `supported`."""
    if cfg.get(key, supported) != supported:
        raise ValueError(f"config.json {key}={cfg[key]!r} is not supported (only {supported!r})")


# --- Gemma ----------------------------------------------------------------------------------


def gemma2_fields(cfg: dict, fields: dict) -> dict:
    act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    layer_types = fields["layer_types"]
    if not cfg.get("layer_types") and fields["sliding_window"]:  # transformers 4.x
        layer_types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(len(layer_types)))
    return dict(
        norm="gemma_rms",
        norm_placement="sandwich",
        hidden_act=hf_activation(act, "hidden_activation"),
        embedding_multiplier=cfg["hidden_size"] ** 0.5,
        attention_scale=cfg.get("query_pre_attn_scalar", fields["head_dim"]) ** -0.5,
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        layer_types=layer_types,
    )


def gemma3_fields(cfg: dict, fields: dict) -> dict:
    refuse(cfg, "use_bidirectional_attention", False)
    out = gemma2_fields(cfg, fields) | dict(qk_norm="head")
    num_layers = cfg["num_hidden_layers"]
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
    if not cfg.get("layer_types") and fields["sliding_window"] and pattern:  # 4.x
        out["layer_types"] = tuple(
            FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)
        )
    params = cfg.get("rope_parameters") or {}
    if FULL in params:  # transformers 5.x: one RoPE per layer type
        full, local = dict(params[FULL]), dict(params.get(SLIDING) or {})
        out["rope_theta"] = float(full.pop("rope_theta", 1_000_000.0))
        out["rope_scaling"] = check_rope_scaling(full, "rope_parameters.full_attention") or None
        out["local_rope_theta"] = float(local.pop("rope_theta", 10_000.0))
        local_scaling = check_rope_scaling(local, "rope_parameters.sliding_attention")
        out["local_rope_scaling"] = local_scaling or None
    else:  # 4.x: rope_scaling applies to full layers only
        out["local_rope_theta"] = float(cfg.get("rope_local_base_freq", 10_000.0))
    return out


def gemma_fields(cfg: dict, fields: dict) -> dict:
    """Gemma 1: Gemma's norm, activation and embedding scale on Llama's layer."""
    return gemma2_fields(cfg, fields) | dict(
        norm_placement="pre",
        attention_scale=None,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        sliding_window=None,
        layer_types=(FULL,) * cfg["num_hidden_layers"],
    )


GEMMA = Family(gemma2_fields)
GEMMA3 = Family(gemma3_fields)


# --- Phi-3, OLMo 2 --------------------------------------------------------------------------

# Phi-3 stores qkv_proj and gate_up_proj fused in our layout already; its partial rotary
# factor and its rope_scaling (longrope is refused, naming the key) are read the Llama way.
PHI3 = Family(lambda cfg, fields: {})

OLMO2 = Family(lambda cfg, fields: dict(norm_placement="post", qk_norm="projection"))


# --- GPT-NeoX -------------------------------------------------------------------------------


def neox_keys(cfg: dict) -> dict:
    """transformers 4.x keys: rotary_pct and rotary_emb_base."""
    cfg = dict(cfg)
    if "rotary_pct" in cfg:
        cfg.setdefault("partial_rotary_factor", cfg["rotary_pct"])
    if "rotary_emb_base" in cfg:
        cfg.setdefault("rope_theta", cfg["rotary_emb_base"])
    return cfg


def neox_fields(cfg: dict, fields: dict) -> dict:
    bias = bool(cfg.get("attention_bias", True))
    parallel = cfg.get("use_parallel_residual", True)
    return dict(
        norm="layer",
        norm_placement="parallel" if parallel else "pre",
        num_key_value_heads=fields["num_attention_heads"],  # no GQA
        rms_norm_eps=cfg.get("layer_norm_eps", 1e-5),
        gated_mlp=False,
        mlp_bias=True,
        attention_bias=bias,
        o_proj_bias=bias,
    )


def neox_reshape(name: str, tensor: Any, fields: Any) -> Any:
    """query_key_value holds [q, k, v] per head; ours holds all q, then all k, then all v."""
    if ".qkv_proj." not in name:
        return tensor
    heads, d = fields.num_attention_heads, fields.head_dim
    per_head = tensor.reshape(heads, 3, d, *tensor.shape[1:])
    return per_head.transpose(0, 1).reshape(tensor.shape)


NEOX = Family(
    neox_fields,
    hf_keys=neox_keys,
    renames=(
        ("gpt_neox.embed_in.", "embed_tokens."),
        ("gpt_neox.final_layer_norm.", "norm."),
        ("gpt_neox.layers.", "layers."),
        ("embed_out.", "lm_head."),
        (".attention.query_key_value.", ".self_attn.qkv_proj."),
        (".attention.dense.", ".self_attn.o_proj."),
        (".mlp.dense_h_to_4h.", ".mlp.up_proj."),
        (".mlp.dense_4h_to_h.", ".mlp.down_proj."),
    ),
    ignored=(".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq"),
    reshape=neox_reshape,
)


# --- GPT-2 ----------------------------------------------------------------------------------


def gpt2_keys(cfg: dict) -> dict:
    hidden = cfg.get("n_embd", 768)
    return cfg | dict(
        hidden_size=hidden,
        num_hidden_layers=cfg.get("n_layer", 12),
        num_attention_heads=cfg.get("n_head", 12),
        max_position_embeddings=cfg.get("n_positions", 1024),
        intermediate_size=cfg.get("n_inner") or 4 * hidden,
        hidden_act=cfg.get("activation_function", "gelu_new"),
    )


def gpt2_fields(cfg: dict, fields: dict) -> dict:
    refuse(cfg, "scale_attn_by_inverse_layer_idx", False)
    refuse(cfg, "add_cross_attention", False)
    return dict(
        norm="layer",
        rms_norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        gated_mlp=False,
        mlp_bias=True,
        attention_bias=True,
        o_proj_bias=True,
        position_embedding="learned",
        attention_scale=None if cfg.get("scale_attn_weights", True) else 1.0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
    )


def gpt2_reshape(name: str, tensor: Any, fields: Any) -> Any:
    """GPT-2's Conv1D keeps its weights as (in, out), the transpose of a Linear's."""
    conv1d = (".qkv_proj.weight", ".o_proj.weight", ".up_proj.weight", ".down_proj.weight")
    return tensor.T if name.endswith(conv1d) else tensor


GPT2 = Family(
    gpt2_fields,
    hf_keys=gpt2_keys,
    renames=(
        ("transformer.", ""),  # hub checkpoints of GPT-2 itself lack this prefix
        ("wte.", "embed_tokens."),
        ("wpe.", "embed_positions."),
        ("ln_f.", "norm."),
        ("h.", "layers."),
        (".attn.c_attn.", ".self_attn.qkv_proj."),
        (".attn.c_proj.", ".self_attn.o_proj."),
        (".mlp.c_fc.", ".mlp.up_proj."),
        (".mlp.c_proj.", ".mlp.down_proj."),
        (".ln_1.", ".input_layernorm."),
        (".ln_2.", ".post_attention_layernorm."),
    ),
    ignored=(".attn.bias", ".attn.masked_bias"),
    reshape=gpt2_reshape,
)


# --- DeepSeek-V2 / V3 -----------------------------------------------------------------------


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def deepseek_fields(cfg: dict, fields: dict) -> dict:
    """The decoder's side of DeepSeek (`ModelConfig.mla` and `.moe` are read by
    `config`): q/k heads of nope + rope features, one latent "KV head", interleaved RoPE
    pairs (V2 always; V3 unless rope_interleave is false), and the softmax scale
    qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under a RoPE scaling
    that sets mscale_all_dim (DeepSeek's YaRN: the cos/sin carry the rest of the mscale)."""
    refuse(cfg, "mlp_bias", False)
    if cfg.get("quantization_config"):  # DeepSeek-V3's own release: FP8 blocks + scales
        method = cfg["quantization_config"].get("quant_method", "?")
        raise ValueError(
            f"config.json quantization_config ({method!r}) is not supported: load a "
            f"bfloat16 or float32 checkpoint"
        )
    head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    scale = head_dim**-0.5
    rope = fields["rope_scaling"] or {}
    if rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(_rope_factor(rope)), float(rope["mscale_all_dim"])) ** 2
    v3 = fields["architecture"] == "DeepseekV3ForCausalLM"
    return dict(
        head_dim=head_dim,
        num_key_value_heads=1,
        attention_scale=scale,
        rope_interleaved=bool(cfg.get("rope_interleave", True)) if v3 else True,
    )


def _rope_factor(rope: dict) -> Any:
    if "factor" not in rope:
        raise ValueError(f"config.json rope_scaling with mscale_all_dim needs 'factor', got {rope}")
    return rope["factor"]


def deepseek_skipped(name: str, fields: Any) -> bool:
    """DeepSeek-V3 checkpoints carry `num_nextn_predict_layers` multi-token-prediction
    layers after the decoder's (model.layers.<num_hidden_layers + i>.*), for speculative
    decoding; the decoder does not run them."""
    extra = int(fields.raw.get("num_nextn_predict_layers") or 0)
    first = fields.num_hidden_layers
    return any(name.startswith(f"model.layers.{first + i}.") for i in range(extra))


DEEPSEEK = Family(
    deepseek_fields,
    renames=((".mlp.shared_experts.", ".mlp.shared_expert."),),
    skipped=deepseek_skipped,
)


# --- state-space models: Mamba-2, Bamba ---------------------------------------------------


def mamba2_keys(cfg: dict) -> dict:
    """Mamba-2's config.json has no attention or MLP: the decoder's required keys are
    filled from the mixer's (heads), and its norm eps is layer_norm_epsilon."""
    return cfg | dict(
        num_attention_heads=cfg.get("num_heads", 128),
        intermediate_size=cfg.get("expand", 2) * cfg["hidden_size"],
        rms_norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
    )


def mamba2_fields(cfg: dict, fields: dict) -> dict:
    return dict(
        layer_types=(MAMBA,) * cfg["num_hidden_layers"],
        norm_placement="mamba",
        position_embedding="none",
        sliding_window=None,
    )


def bamba_fields(cfg: dict, fields: dict) -> dict:
    attention = set(cfg.get("attn_layer_indices") or ())
    bias = bool(cfg.get("attention_bias", False))
    return dict(
        layer_types=tuple(
            FULL if i in attention else MAMBA for i in range(cfg["num_hidden_layers"])
        ),
        attention_bias=bias,
        o_proj_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
    )


MAMBA2 = Family(
    mamba2_fields,
    hf_keys=mamba2_keys,
    renames=(
        ("backbone.embeddings.", "embed_tokens."),
        ("backbone.embedding.", "embed_tokens."),  # older checkpoints
        ("backbone.norm_f.", "norm."),
        ("backbone.layers.", "layers."),
        (".mixer.", ".self_attn."),
    ),
)

BAMBA = Family(
    bamba_fields,
    renames=(
        (".feed_forward.", ".mlp."),
        (".pre_ff_layernorm.", ".post_attention_layernorm."),
        (".mamba.", ".self_attn."),
        ("model.final_layernorm.", "model.norm."),
    ),
)


# --- BERT -----------------------------------------------------------------------------------


def bert_fields(cfg: dict, fields: dict) -> dict:
    refuse(cfg, "position_embedding_type", "absolute")
    refuse(cfg, "is_decoder", False)
    refuse(cfg, "add_cross_attention", False)
    labels = 0
    if fields["architecture"] == "BertForSequenceClassification":
        id2label = cfg.get("id2label")
        labels = len(id2label) if isinstance(id2label, dict) else int(cfg.get("num_labels", 2))
    return dict(
        norm="layer",
        norm_placement="post",
        rms_norm_eps=cfg.get("layer_norm_eps", 1e-12),
        gated_mlp=False,
        mlp_bias=True,
        attention_bias=True,
        o_proj_bias=True,
        position_embedding="learned",
        tie_word_embeddings=False,
        is_causal=False,
        type_vocab_size=int(cfg.get("type_vocab_size", 2)),
        num_labels=labels,
    )


BERT_CLASSIFIER = Family(
    bert_fields,
    renames=(
        ("bert.", ""),  # BertForSequenceClassification keeps the encoder under bert.
        ("embeddings.word_embeddings.", "embed_tokens."),
        ("embeddings.position_embeddings.", "embed_positions."),
        ("embeddings.token_type_embeddings.", "embed_token_types."),
        ("embeddings.LayerNorm.", "embed_norm."),
        ("encoder.layer.", "layers."),
        (".attention.self.query.", ".self_attn.q_proj."),
        (".attention.self.key.", ".self_attn.k_proj."),
        (".attention.self.value.", ".self_attn.v_proj."),
        (".attention.output.dense.", ".self_attn.o_proj."),
        (".attention.output.LayerNorm.", ".attention_norm."),
        (".intermediate.dense.", ".mlp.up_proj."),
        (".output.dense.", ".mlp.down_proj."),
        (".output.LayerNorm.", ".output_norm."),
        ("pooler.dense.", "pooler."),
    ),
    ignored=("embeddings.position_ids",),
)
# BertModel keeps only the token states: the [CLS] pooler of HF's BertModel is unused
BERT = dataclasses.replace(
    BERT_CLASSIFIER, ignored=("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
)


# --- LLaVA ----------------------------------------------------------------------------------


def llava_hf_keys(cfg: dict) -> dict:
    """A LLaVA config.json read as its text model's (the text_config's keys at the top
    level), the vision keys kept beside them for `llava.VisionConfig`."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"config.json for LLaVA: text_config must be an object, got {text!r}")
    kind = text.get("model_type", "llama")
    if kind not in ("llama", "mistral"):
        raise ValueError(
            f"config.json for LLaVA: text_config.model_type {kind!r} is not supported "
            f"(only 'llama' and 'mistral')"
        )
    return {**text, **{k: v for k, v in cfg.items() if k != "text_config"}}


def llava_skipped(name: str, fields: Any) -> bool:
    """The vision tower's layers past the last one LLaVA reads, its final norm and
    SigLIP's pooling head: they feed the pooled output only (`llava.VisionTower`)."""
    if "vision_tower." not in name:
        return False
    if "post_layernorm." in name or ".head." in name:  # SigLIP's pooling head too
        return True
    depth = fields.raw["vision_config"]["num_hidden_layers"]
    layers = fields.raw.get("vision_feature_layer", -2)
    last = max(i % (depth + 1) for i in ((layers,) if isinstance(layers, int) else layers))
    return any(f".encoder.layers.{i}." in name for i in range(last, depth))


LLAVA = Family(
    lambda cfg, fields: {},
    hf_keys=llava_hf_keys,
    renames=(
        ("language_model.model.", ""),  # llava-hf's checkpoints
        ("language_model.lm_head.", "lm_head."),
        ("model.language_model.", ""),  # transformers 5's
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("vision_tower.vision_model.", "vision_tower."),
    ),
    ignored=("embeddings.position_ids",),
    skipped=llava_skipped,
)


# --- Qwen2-VL -------------------------------------------------------------------------------


def qwen2_vl_hf_keys(cfg: dict) -> dict:
    """A Qwen2-VL config.json read as Qwen2's (the text_config's keys at the top level in
    transformers 5's layout; 4.x keeps them there): q/k/v biases, and the M-RoPE's
    `mrope_section` taken out of rope_scaling / rope_parameters into a key of its own
    (`qwen2_vl.Qwen2VLVisionConfig`), the rest of the RoPE read as the default type."""
    text = cfg.get("text_config", cfg)
    if not isinstance(text, dict):
        raise ValueError(f"config.json for Qwen2-VL: text_config must be an object, got {text!r}")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    section = rope.pop("mrope_section", None)
    if rope.get("rope_type", rope.get("type")) == "mrope":
        rope.pop("type", None)
        rope["rope_type"] = "default"
    top = {k: v for k, v in cfg.items() if k != "text_config"}
    merged = {**text, **top} if text is not cfg else dict(cfg)
    merged.pop("rope_scaling", None)
    return {**merged, "rope_parameters": rope, "mrope_section": section, "attention_bias": True}


QWEN2_VL = Family(
    lambda cfg, fields: {},
    hf_keys=qwen2_vl_hf_keys,
    renames=(
        ("model.language_model.", ""),  # transformers 5's
        ("model.visual.", "visual."),
    ),
)


FAMILIES: dict[str, Family] = {
    "GemmaForCausalLM": Family(gemma_fields),
    "Gemma2ForCausalLM": GEMMA,
    "Gemma3ForCausalLM": GEMMA3,
    "Phi3ForCausalLM": PHI3,
    "Olmo2ForCausalLM": OLMO2,
    "GPTNeoXForCausalLM": NEOX,
    "GPT2LMHeadModel": GPT2,
    "DeepseekV2ForCausalLM": DEEPSEEK,
    "DeepseekV3ForCausalLM": DEEPSEEK,
    "Mamba2ForCausalLM": MAMBA2,
    "BambaForCausalLM": BAMBA,
    "BertModel": BERT,
    "BertForSequenceClassification": BERT_CLASSIFIER,
    "LlavaForConditionalGeneration": LLAVA,
    "Qwen2VLForConditionalGeneration": QWEN2_VL,
    "Qwen2_5_VLForConditionalGeneration": QWEN2_VL,  # the same decoder and names
}


def rename(family: Family, hf_name: str) -> str:
    """Our name for a checkpoint tensor of `family` (see `Family.renames`)."""
    name = hf_name
    for theirs, ours in family.renames:
        if theirs.startswith("."):
            name = name.replace(theirs, ours)
        elif name.startswith(theirs):
            name = ours + name.removeprefix(theirs)
    return name
