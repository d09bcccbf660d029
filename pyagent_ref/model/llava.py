"""LLaVA: a CLIP or SigLIP vision transformer, a projector, and the Llama decoder.

An image becomes `num_image_tokens` rows of the decoder's embedding space:

1. the vision tower cuts the preprocessed image (pixel_values, (3, S, S), from the
   model's image processor: `multimodal`) into (S / P)^2 patches of P x P pixels, embeds
   each with a strided convolution, adds learned position embeddings and runs pre-LN
   encoder layers (x += attn(LN1(x)); x += mlp(LN2(x)), full bidirectional attention,
   q/k/v/out biases). CLIP prepends a learned class token, applies a LayerNorm
   ("pre_layrnorm") before the layers and has a quick-GELU MLP by default; SigLIP has no
   class token, no norm before the layers, a bias on the patch convolution and a tanh-GELU
   MLP;
2. the states of `vision_feature_layer` (-2: the output of the next-to-last layer;
   hidden_states[0] is the embedding; a list concatenates several layers) are kept,
   without their first row under the "default" strategy (CLIP's class token; for
   SigLIP, which has none, HF drops the first patch all the same) ("full" keeps it);
3. the projector maps them to the decoder's width: linear_2(act(linear_1(x))).

The prompt holds `num_image_tokens` copies of the image token (`image_token_id`) per image;
the decoder embeds the prompt as usual and its rows at those positions are replaced by
the image's rows in order (`LlamaForCausalLM.forward`'s `mm_embeds`). The decoder is
`LlamaForCausalLM` on the `text_config`; its paged KV cache, chunked prefill and
sampling are the text model's: the image rows are computed once (`encode_images`) and
may be consumed over several prefill chunks.

Checkpoints: llava-hf's layout (language_model.model.*, language_model.lm_head.*,
vision_tower.vision_model.*, multi_modal_projector.*) and transformers 5's
(model.language_model.*, model.vision_tower.*, lm_head.*) both load. Only a CLIP vision
and a SigLIP tower are implemented; another `vision_config.model_type` is refused by
name.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .. import ops as reference_ops
from .config import ModelConfig
from .llama import LlamaForCausalLM

VISION_ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh")
PROJECTOR_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "silu")


def _bad(key: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"config.json for LLaVA: {key} must be {expected}, got {value!r}")


@dataclass(frozen=True)
class VisionConfig:
    """The vision side of a LLaVA config.json: its CLIP or SigLIP tower (`vision_config`;
    `kind` "clip" or "siglip"), which
    layers' states are taken and how (`vision_feature_layer`, `..._select_strategy`),
    the projector's activation and biases, and the image token.

    Raises (from_hf): ValueError naming the key of a missing or unsupported value.
    """

    kind: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str
    feature_layers: tuple[int, ...]
    full_features: bool  # "full" strategy: the first row (CLIP's class token) kept
    projector_act: str
    projector_bias: bool
    image_token_id: int

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_positions(self) -> int:
        """Rows of the tower's states: the patches, and CLIP's class token."""
        return self.num_patches + int(self.kind == "clip")

    @property
    def num_image_tokens(self) -> int:
        """Decoder positions one image fills: the tower's rows, less the first one under
        the "default" strategy."""
        return self.num_positions - int(not self.full_features)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> VisionConfig:
        vision = cfg.get("vision_config")
        if not isinstance(vision, dict):
            raise _bad("vision_config", vision, "an object")
        model_type = vision.get("model_type", "clip_vision_model")
        kinds = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}
        if model_type not in kinds:
            raise _bad("vision_config.model_type", model_type, f"one of {sorted(kinds)}")
        kind = kinds[model_type]
        sizes = {}
        for key, default in (
            ("hidden_size", None),
            ("intermediate_size", None),
            ("num_hidden_layers", None),
            ("num_attention_heads", None),
            ("image_size", 224),
            ("patch_size", 32),
            ("num_channels", 3),
        ):
            value = vision.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(f"vision_config.{key}", value, "an int >= 1")
            sizes[key] = value
        if sizes["image_size"] % sizes["patch_size"]:
            raise _bad("vision_config.patch_size", sizes["patch_size"], "a divisor of image_size")
        act = vision.get("hidden_act", "quick_gelu" if kind == "clip" else "gelu_pytorch_tanh")
        if act not in VISION_ACTIVATIONS:
            raise _bad("vision_config.hidden_act", act, f"one of {VISION_ACTIVATIONS}")
        layers = cfg.get("vision_feature_layer", -2)
        layers = (layers,) if isinstance(layers, int) else tuple(layers)
        depth = sizes["num_hidden_layers"]
        if not layers or not all(isinstance(i, int) and -depth - 1 <= i <= depth for i in layers):
            raise _bad("vision_feature_layer", layers, f"layers in [{-depth - 1}, {depth}]")
        strategy = cfg.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise _bad("vision_feature_select_strategy", strategy, "'default' or 'full'")
        projector_act = cfg.get("projector_hidden_act", "gelu")
        if projector_act not in PROJECTOR_ACTIVATIONS:
            raise _bad("projector_hidden_act", projector_act, f"one of {PROJECTOR_ACTIVATIONS}")
        token = cfg.get("image_token_id", cfg.get("image_token_index"))
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise _bad("image_token_index", token, "a token id")
        return cls(
            kind=kind,
            **sizes,
            layer_norm_eps=float(vision.get("layer_norm_eps", 1e-5 if kind == "clip" else 1e-6)),
            hidden_act=act,
            feature_layers=tuple(i % (depth + 1) for i in layers),
            full_features=strategy == "full",
            projector_act=projector_act,
            projector_bias=bool(cfg.get("multimodal_projector_bias", True)),
            image_token_id=token,
        )


def _activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "quick_gelu":  # CLIP's sigmoid approximation of GELU
        return x * torch.sigmoid(1.702 * x)
    if name == "silu":
        return nn.functional.silu(x)
    return nn.functional.gelu(x, approximate="tanh" if name == "gelu_pytorch_tanh" else "none")


class VisionAttention(nn.Module):
    """Multi-head attention of every patch to every patch of its image (no cache)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        size = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.q_proj, self.k_proj = nn.Linear(size, size), nn.Linear(size, size)
        self.v_proj, self.out_proj = nn.Linear(size, size), nn.Linear(size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, size = x.shape
        q, k, v = (
            p(x).reshape(b, n, self.num_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # scale head_dim ** -0.5
        return self.out_proj(out.transpose(1, 2).reshape(b, n, size))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(_activation(self.act, self.fc1(x)))


class VisionLayer(nn.Module):
    """x += attn(LN1(x)); x += mlp(LN2(x))."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = VisionAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionTower(nn.Module):
    """CLIP's or SigLIP's vision transformer up to the last layer LLaVA reads (parameter
    names as HF's, so the loader fills them as they are; the checkpoint's later layers,
    final norm and SigLIP's pooling head, which feed the pooled output, are skipped:
    `families.llava_skipped`)."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        size, clip = cfg.hidden_size, cfg.kind == "clip"
        self.embeddings = nn.Module()
        if clip:
            self.embeddings.class_embedding = nn.Parameter(torch.zeros(size))
        self.embeddings.patch_embedding = nn.Conv2d(
            cfg.num_channels, size, cfg.patch_size, stride=cfg.patch_size, bias=not clip
        )
        self.embeddings.position_embedding = nn.Embedding(cfg.num_positions, size)
        # HF's spelling; SigLIP normalises nothing before its layers
        self.pre_layrnorm = nn.LayerNorm(size, eps=cfg.layer_norm_eps) if clip else None
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            VisionLayer(cfg) for _ in range(max(cfg.feature_layers))
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(images, num_positions, hidden * len(feature_layers)): the selected layers'
        states, concatenated on the last axis (CLIP's class token first)."""
        emb = self.embeddings
        x = emb.patch_embedding(pixel_values.to(emb.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # (images, patches, hidden), row-major
        if self.pre_layrnorm is not None:
            x = torch.cat([emb.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        x = x + emb.position_embedding.weight
        states = [x if self.pre_layrnorm is None else self.pre_layrnorm(x)]
        for layer in self.encoder.layers:
            states.append(layer(states[-1]))
        return torch.cat([states[i] for i in self.cfg.feature_layers], dim=-1)


class Projector(nn.Module):
    """linear_2(act(linear_1(x))): vision features to the decoder's width."""

    def __init__(self, cfg: VisionConfig, text_size: int) -> None:
        super().__init__()
        self.act = cfg.projector_act
        width = cfg.hidden_size * len(cfg.feature_layers)
        self.linear_1 = nn.Linear(width, text_size, bias=cfg.projector_bias)
        self.linear_2 = nn.Linear(text_size, text_size, bias=cfg.projector_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(_activation(self.act, self.linear_1(x)))


class LlavaForConditionalGeneration(LlamaForCausalLM):
    """LLaVA (see the module docstring): the decoder of `LlamaForCausalLM` on the
    text_config, with `vision_tower` and `multi_modal_projector`.

    `ops` is the ops namespace the decoder calls; the vision tower is plain torch (it
    runs once per image, outside the paged cache).
    """

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        super().__init__(config, ops)
        self.vision = VisionConfig.from_hf(config.raw)
        self.vision_tower = VisionTower(self.vision)
        self.multi_modal_projector = Projector(self.vision, config.hidden_size)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The decoder rows of each image: pixel_values (images, channels, S, S) as the
        image processor makes them, S the config's image_size -> (images,
        num_image_tokens, hidden) in the decoder's dtype.

        Raises:
            ValueError: pixel_values of another shape (the message gives both).
        """
        cfg = self.vision
        expected = (cfg.num_channels, cfg.image_size, cfg.image_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"pixel_values must have shape (images, {', '.join(map(str, expected))}), "
                f"got {tuple(pixel_values.shape)}"
            )
        features = self.vision_tower(pixel_values)
        if not cfg.full_features:
            features = features[:, 1:]
        return self.multi_modal_projector(features)
