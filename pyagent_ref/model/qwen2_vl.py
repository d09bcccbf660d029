"""Qwen2-VL: a vision transformer at the image's own resolution, and Qwen2 with M-RoPE.

An image becomes a variable number of decoder rows (dynamic resolution):

1. the image processor (HF's Qwen2VLImageProcessor: `multimodal.processor`) resizes it
   so that both sides are multiples of patch_size * spatial_merge_size (28 for the
   released models) within min/max_pixels, and cuts it into a grid (t, h, w) of patches
   of temporal_patch_size x patch_size x patch_size pixels (an image is repeated over
   the temporal patch: t = 1), each flattened to C * T * P * P values, in the order
   (t, h / m, w / m, m, m): every m x m merge window's patches are consecutive;
2. the vision tower embeds each patch linearly (HF's Conv3d with kernel = stride = the
   patch is that linear map), runs pre-LN blocks (x += attn(LN1(x)); x += mlp(LN2(x)),
   quick-GELU MLP) whose attention is bidirectional within each image and rotates
   queries and keys by a 2-D RoPE: the first half of the frequencies by the patch's row,
   the second by its column (`ops.rope.apply_mrope` with two position rows);
3. the patch merger normalises each patch (LayerNorm), concatenates each m x m window
   (m = spatial_merge_size = 2) and maps it by a GELU MLP to the decoder's width:
   t * h * w / m^2 rows, one per placeholder token.

The decoder is Qwen2 (`LlamaForCausalLM` on the text config, q/k/v biases) whose RoPE
is M-RoPE: each token has three positions (temporal, height, width) and the rotary
frequencies are split by `mrope_section` among them (`MRotary`). `forward` takes them
as `positions` of shape (3, num_tokens) (`multimodal.mrope.mrope_positions` computes
them from the tokens' sequence indices and the prompt's image grids); 1-D positions
(text only) stand for three equal rows.

Checkpoints: transformers 5's layout (model.language_model.*, model.visual.*,
lm_head.*) and 4.x's (model.*, visual.*, lm_head.*), with the text config nested
(text_config) or at the top level. Qwen2.5-VL (`qwen2_5_vl`) is this model with
window attention, RMSNorm and a gated MLP in the tower (`VisionTower`'s block, norm and
layout).
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
from .llama import LlamaForCausalLM, Rotary

DEFAULT_MAX_PIXELS = 28 * 28 * 1280  # Qwen2VLImageProcessor's


def _bad(key: str, value: Any, expected: str) -> ValueError:
    return ValueError(f"config.json for Qwen2-VL: {key} must be {expected}, got {value!r}")


def _sizes(vision: dict[str, Any], defaults: dict[str, int]) -> dict[str, int]:
    """The ints >= 1 of `vision_config` at `defaults`' keys (their defaults where absent)."""
    sizes = {}
    for key, default in defaults.items():
        value = vision.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(f"vision_config.{key}", value, "an int >= 1")
        sizes[key] = value
    return sizes


@dataclass(frozen=True)
class Qwen2VLVisionConfig:
    """The vision side of a Qwen2-VL config.json (`vision_config`), the image token and
    the decoder's `mrope_section`.

    Raises (from_hf): ValueError naming the key of a missing or unsupported value.
    """

    depth: int
    embed_dim: int
    out_size: int  # the decoder's hidden size (vision_config.hidden_size)
    intermediate_size: int  # of the blocks' MLP (embed_dim * mlp_ratio)
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    hidden_act: str
    image_token_id: int
    mrope_section: tuple[int, ...]
    rope_theta: float = 10000.0  # of the tower's 2-D RoPE

    default_act = "quick_gelu"  # of a config.json without vision_config.hidden_act

    @property
    def patch_values(self) -> int:
        """Values of one flattened patch: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    def max_image_tokens(self, max_pixels: int = DEFAULT_MAX_PIXELS) -> int:
        """Decoder positions of the largest image the image processor makes at
        `max_pixels` (HF's default 28 * 28 * 1280 unless the preprocessor says
        otherwise: `multimodal.processor.max_image_positions`): max_pixels / (P * m)^2.
        The processor's resize can exceed max_pixels at extreme aspect ratios (a side
        is never below P * m); the engine refuses such an image at admission."""
        return max_pixels // (self.patch_size * self.spatial_merge_size) ** 2

    def image_tokens(self, grid_thw: Sequence[int]) -> int:
        """Decoder positions of an image of patch grid (t, h, w): t * h * w / m^2."""
        t, h, w = (int(n) for n in grid_thw)
        return t * h * w // self.spatial_merge_size**2

    def llm_grid(self, grid_thw: Sequence[int]) -> tuple[int, int, int]:
        """The image's grid in decoder tokens: (t, h / m, w / m)."""
        t, h, w = (int(n) for n in grid_thw)
        return t, h // self.spatial_merge_size, w // self.spatial_merge_size

    @classmethod
    def tower_fields(cls, vision: dict[str, Any]) -> dict[str, Any]:
        """The tower's sizes from `vision_config` (Qwen2-VL's key names)."""
        sizes = _sizes(
            vision,
            dict(
                depth=32,
                embed_dim=1280,
                hidden_size=3584,
                num_heads=16,
                in_channels=3,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
            ),
        )
        ratio = vision.get("mlp_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            raise _bad("vision_config.mlp_ratio", ratio, "a number > 0")
        sizes["out_size"] = sizes.pop("hidden_size")
        sizes["intermediate_size"] = int(sizes["embed_dim"] * ratio)
        return sizes

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> Qwen2VLVisionConfig:
        vision = cfg.get("vision_config")
        if not isinstance(vision, dict):
            raise _bad("vision_config", vision, "an object")
        fields = cls.tower_fields(vision)
        embed, heads = fields["embed_dim"], fields["num_heads"]
        if embed % heads or (embed // heads) % 4:
            raise _bad(
                "vision_config.num_heads",
                heads,
                "a divisor of the width leaving a head size divisible by 4 (the 2-D RoPE)",
            )
        act = vision.get("hidden_act", cls.default_act)
        if act not in ("quick_gelu", "gelu", "gelu_pytorch_tanh", "silu"):
            raise _bad(
                "vision_config.hidden_act", act, "quick_gelu, gelu, gelu_pytorch_tanh or silu"
            )
        section = cfg.get("mrope_section")  # `families.qwen2_vl_hf_keys` put it there
        if not isinstance(section, (list, tuple)) or len(section) != 3:
            raise _bad("rope_scaling.mrope_section", section, "three ints")
        token = cfg.get("image_token_id")
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise _bad("image_token_id", token, "a token id")
        return cls(
            **fields,
            hidden_act=act,
            image_token_id=token,
            mrope_section=tuple(int(n) for n in section),
            rope_theta=float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        )


def _activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "silu":
        return nn.functional.silu(x)
    return nn.functional.gelu(x, approximate="tanh" if name == "gelu_pytorch_tanh" else "none")


def patch_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """(row, column) of every patch of the images, int64 (2, patches), in the image
    processor's order: per image, t times its h x w patches by m x m merge windows,
    row-major within a window and windows row-major."""
    out = []
    for t, h, w in grid_thw.tolist():
        bh, bw, ih, iw = torch.meshgrid(
            torch.arange(h // merge),
            torch.arange(w // merge),
            torch.arange(merge),
            torch.arange(merge),
            indexing="ij",
        )
        rows, cols = (bh * merge + ih).flatten(), (bw * merge + iw).flatten()
        out.append(torch.stack([rows, cols]).repeat(1, t))
    return torch.cat(out, dim=1)


class VisionAttention(nn.Module):
    """Bidirectional attention within runs of consecutive rows, with the 2-D RoPE."""

    def __init__(self, cfg: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim)
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)

    def forward(self, x, positions, inv_freq, lengths: list[int]) -> torch.Tensor:
        """x (n, embed_dim); `lengths` cut its rows into runs (summing to n), each row
        attending to the rows of its own run only."""
        n, size = x.shape
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)
        quarter = inv_freq.shape[0] // 2
        q, k = reference_ops.rope.apply_mrope(
            positions, q.float(), k.float(), inv_freq, (quarter, quarter)
        )
        q, k, v = (t.to(x.dtype).transpose(0, 1) for t in (q, k, v))
        runs = zip(q.split(lengths, 1), k.split(lengths, 1), v.split(lengths, 1), strict=True)
        out = torch.cat([nn.functional.scaled_dot_product_attention(*run) for run in runs], 1)
        return self.proj(out.transpose(0, 1).reshape(n, size))


class VisionBlock(nn.Module):
    """x += attn(LN1(x)); x += fc2(act(fc1(LN2(x))))."""

    def __init__(self, cfg: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = (
            nn.Linear(cfg.embed_dim, cfg.intermediate_size),
            nn.Linear(cfg.intermediate_size, cfg.embed_dim),
        )

    def forward(self, x, positions, inv_freq, lengths) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), positions, inv_freq, lengths)
        return x + self.mlp.fc2(_activation(self.act, self.mlp.fc1(self.norm2(x))))


class VisionTower(nn.Module):
    """Patch embedding, blocks and the patch merger (HF's parameter names). A subclass
    (Qwen2.5-VL's) may use other blocks (`block`), another norm in the merger (`norm`)
    and its own `layout` of the rows the blocks see."""

    block: type[nn.Module] = VisionBlock
    norm: type[nn.Module] = nn.LayerNorm

    def __init__(self, cfg: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Module()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Module()
        self.patch_embed.proj.weight = nn.Parameter(
            torch.zeros(cfg.embed_dim, cfg.in_channels, *kernel)
        )
        self.blocks = nn.ModuleList(self.block(cfg) for _ in range(cfg.depth))
        window = cfg.embed_dim * cfg.spatial_merge_size**2
        self.merger = nn.Module()
        self.merger.ln_q = self.norm(cfg.embed_dim, eps=1e-6)
        self.merger.mlp = nn.Sequential(
            nn.Linear(window, window), nn.GELU(), nn.Linear(window, cfg.out_size)
        )

    def layout(self, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
        """(order, lengths): the order in which the blocks see the merge units (the m x m
        patches that become one decoder row), as indices into the image processor's
        order, int64 (units,); and per block the runs of consecutive rows (in that
        order) that attend among themselves (`VisionAttention`). Qwen2-VL: the
        processor's order, every block attending within each image."""
        images = grid_thw.prod(-1).tolist()
        order = torch.arange(sum(images) // self.cfg.spatial_merge_size**2)
        return order, [images] * self.cfg.depth

    def forward(self, patches: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """patches (sum of t*h*w, C*T*P*P) of the images of `grid_thw` (images, 3), in
        order -> their merged rows (sum of t*h*w / m^2, out_size), in the same order."""
        cfg, weight = self.cfg, self.patch_embed.proj.weight
        x = patches.to(weight.dtype) @ weight.reshape(cfg.embed_dim, -1).T
        positions = patch_positions(grid_thw, cfg.spatial_merge_size).to(x.device)
        order, lengths = self.layout(grid_thw)
        unit = cfg.spatial_merge_size**2  # rows of a merge unit, consecutive in both orders
        rows = (order[:, None] * unit + torch.arange(unit)).flatten().to(x.device)
        x, positions = x[rows], positions[:, rows]
        # computed here, never a buffer: the loader builds the model on the meta device,
        # and a non-persistent buffer would come out of `to_empty` uninitialised
        quarter = cfg.embed_dim // cfg.num_heads // 4
        freq = 1.0 / cfg.rope_theta ** (
            torch.arange(quarter, dtype=torch.float32, device=x.device) / quarter
        )
        inv_freq = torch.cat([freq, freq])
        for block, runs in zip(self.blocks, lengths, strict=True):
            x = block(x, positions, inv_freq, runs)
        x = self.merger.mlp(self.merger.ln_q(x).reshape(-1, cfg.embed_dim * unit))
        return x[torch.argsort(order).to(x.device)]  # back to the processor's order


class MRotary(Rotary):
    """The decoder's M-RoPE: positions (3, num_tokens), frequencies split by
    mrope_section among temporal, height and width (`ops.rope.apply_mrope`); 1-D
    positions are three equal rows."""

    def __init__(self, config: ModelConfig, ops: ModuleType, mrope_section) -> None:
        super().__init__(config, ops)
        self.mrope_section = tuple(mrope_section)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if positions.ndim == 1:
            positions = positions.expand(len(self.mrope_section), -1)
        return self.ops.rope.apply_mrope(
            positions, q, k, self.inv_freq, self.mrope_section, self.scale, is_neox=self.is_neox
        )


@dataclass(frozen=True)
class ImagePatches:
    """One image as Qwen2-VL's image processor makes it: pixel_values (t*h*w, C*T*P*P)
    float32 and its patch grid (t, h, w) (a request's `MultiModalFeature.data`)."""

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]


class Qwen2VLForConditionalGeneration(LlamaForCausalLM):
    """Qwen2-VL (see the module docstring): the Qwen2 decoder with M-RoPE and `visual`,
    the vision tower with its patch merger. `forward` is `LlamaForCausalLM.forward` with
    positions of shape (3, num_tokens) (or 1-D for text). The tower is plain torch (it
    runs once per image, outside the paged cache)."""

    uses_mrope = True
    vision_config_class: type[Qwen2VLVisionConfig] = Qwen2VLVisionConfig
    tower_class: type[VisionTower] = VisionTower

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        self.vision = self.vision_config_class.from_hf(config.raw)
        super().__init__(config, ops)
        if sum(self.vision.mrope_section) != config.rotary_dim // 2:
            raise _bad(
                "rope_scaling.mrope_section",
                list(self.vision.mrope_section),
                f"three ints summing to head_dim / 2 = {config.rotary_dim // 2}",
            )
        self.visual = self.tower_class(self.vision)

    def build_rotary(self) -> None:
        device = self.embed_tokens.weight.device
        self.rotary = MRotary(self.config, self.ops, self.vision.mrope_section).to(device)
        self.rotary_local = None

    def required_ops(self) -> list[str]:
        return [n for n in super().required_ops() if n != "rope.apply_rope"] + ["rope.apply_mrope"]

    @property
    def supports_cuda_graphs(self) -> bool:
        return False  # a graph replays 1-D positions

    def encode_images(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> list[torch.Tensor]:
        """The decoder rows of each image: pixel_values (sum of t*h*w, C*T*P*P) and
        grid_thw (images, 3) as the image processor makes them -> per image a tensor
        (t*h*w / m^2, hidden) in the decoder's dtype.

        Raises:
            ValueError: a grid that is not (images, 3) of ints >= 1 with h and w
                multiples of the merge size, or pixel_values whose shape disagrees
                with it (the message gives both).
        """
        cfg = self.vision
        grid = torch.as_tensor(grid_thw, dtype=torch.int64).cpu()
        m = cfg.spatial_merge_size
        if grid.ndim != 2 or grid.shape[1] != 3 or (grid < 1).any() or (grid[:, 1:] % m).any():
            raise ValueError(
                f"grid_thw must be (images, 3) of ints >= 1 with h and w multiples of "
                f"spatial_merge_size {m}, got {grid.tolist()}"
            )
        expected = (int(grid.prod(-1).sum()), cfg.patch_values)
        if tuple(pixel_values.shape) != expected:
            raise ValueError(
                f"pixel_values must have shape {expected} for grid_thw {grid.tolist()}, "
                f"got {tuple(pixel_values.shape)}"
            )
        rows = self.visual(pixel_values, grid).to(self.embed_tokens.weight.dtype)
        return list(rows.split([cfg.image_tokens(g) for g in grid.tolist()]))

    def encode_image_data(self, images: Sequence[ImagePatches]) -> list[torch.Tensor]:
        """`encode_images` of the images' patches together: per image its decoder rows."""
        if not images:
            return []
        device = self.embed_tokens.weight.device
        pixels = torch.cat([image.pixel_values for image in images]).to(device)
        return self.encode_images(pixels, torch.tensor([image.grid_thw for image in images]))

    def mrope_positions(self, positions, mm_features: Sequence[Any]) -> Any:
        """The (3, n) int64 numpy positions of a request's tokens at sequence indices
        `positions`, its images being `mm_features` (`MultiModalFeature`s whose data
        are `ImagePatches`): `multimodal.mrope.mrope_positions`."""
        from ..multimodal.mrope import mrope_positions

        spans = [(f.offset, self.vision.llm_grid(f.data.grid_thw)) for f in mm_features]
        return mrope_positions(positions, spans)
