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
(text_config) or at the top level. Qwen2.5-VL (window attention, RMSNorm and SwiGLU
in the tower) is not implemented.
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


@dataclass(frozen=True)
class Qwen2VLVisionConfig:
    """The vision side of a Qwen2-VL config.json (`vision_config`), the image token and
    the decoder's `mrope_section`.

    Raises (from_hf): ValueError naming the key of a missing or unsupported value.
    """

    depth: int
    embed_dim: int
    out_size: int  # the decoder's hidden size (vision_config.hidden_size)
    mlp_ratio: float
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    hidden_act: str
    image_token_id: int
    mrope_section: tuple[int, ...]
    rope_theta: float = 10000.0  # of the tower's 2-D RoPE

    @property
    def patch_values(self) -> int:
        """Values of one flattened patch: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def num_image_tokens(self) -> int:
        """Decoder positions of the largest image the image processor makes at HF's
        default max_pixels (28 * 28 * 1280, the released checkpoints' value): the
        engine's encoder budget and cache hold at least this much. Each image's own
        count is `image_tokens` of its grid; one above the budget (a preprocessor with
        a larger max_pixels) is refused at admission."""
        return DEFAULT_MAX_PIXELS // (self.patch_size * self.spatial_merge_size) ** 2

    def image_tokens(self, grid_thw: Sequence[int]) -> int:
        """Decoder positions of an image of patch grid (t, h, w): t * h * w / m^2."""
        t, h, w = (int(n) for n in grid_thw)
        return t * h * w // self.spatial_merge_size**2

    def llm_grid(self, grid_thw: Sequence[int]) -> tuple[int, int, int]:
        """The image's grid in decoder tokens: (t, h / m, w / m)."""
        t, h, w = (int(n) for n in grid_thw)
        return t, h // self.spatial_merge_size, w // self.spatial_merge_size

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> Qwen2VLVisionConfig:
        vision = cfg.get("vision_config")
        if not isinstance(vision, dict):
            raise _bad("vision_config", vision, "an object")
        sizes = {}
        for key, default in (
            ("depth", 32),
            ("embed_dim", 1280),
            ("hidden_size", 3584),
            ("num_heads", 16),
            ("in_channels", 3),
            ("patch_size", 14),
            ("spatial_merge_size", 2),
            ("temporal_patch_size", 2),
        ):
            value = vision.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(f"vision_config.{key}", value, "an int >= 1")
            sizes[key] = value
        if (
            sizes["embed_dim"] % sizes["num_heads"]
            or (sizes["embed_dim"] // sizes["num_heads"]) % 4
        ):
            raise _bad(
                "vision_config.num_heads",
                sizes["num_heads"],
                "a divisor of embed_dim leaving a head size divisible by 4 (the 2-D RoPE)",
            )
        act = vision.get("hidden_act", "quick_gelu")
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
            depth=sizes["depth"],
            embed_dim=sizes["embed_dim"],
            out_size=sizes["hidden_size"],
            mlp_ratio=float(vision.get("mlp_ratio", 4)),
            num_heads=sizes["num_heads"],
            in_channels=sizes["in_channels"],
            patch_size=sizes["patch_size"],
            spatial_merge_size=sizes["spatial_merge_size"],
            temporal_patch_size=sizes["temporal_patch_size"],
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
    """Attention of every patch to the patches of its own image, with the 2-D RoPE."""

    def __init__(self, cfg: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim)
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)

    def forward(self, x, positions, inv_freq, mask) -> torch.Tensor:
        n, size = x.shape
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)
        quarter = inv_freq.shape[0] // 2
        q, k = reference_ops.rope.apply_mrope(
            positions, q.float(), k.float(), inv_freq, (quarter, quarter)
        )
        q, k, v = (t.to(x.dtype).transpose(0, 1) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
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
        hidden = int(cfg.embed_dim * cfg.mlp_ratio)
        self.mlp.fc1, self.mlp.fc2 = (
            nn.Linear(cfg.embed_dim, hidden),
            nn.Linear(hidden, cfg.embed_dim),
        )

    def forward(self, x, positions, inv_freq, mask) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), positions, inv_freq, mask)
        return x + self.mlp.fc2(_activation(self.act, self.mlp.fc1(self.norm2(x))))


class VisionTower(nn.Module):
    """Patch embedding, blocks and the patch merger (HF's parameter names)."""

    def __init__(self, cfg: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Module()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Module()
        self.patch_embed.proj.weight = nn.Parameter(
            torch.zeros(cfg.embed_dim, cfg.in_channels, *kernel)
        )
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        window = cfg.embed_dim * cfg.spatial_merge_size**2
        self.merger = nn.Module()
        self.merger.ln_q = nn.LayerNorm(cfg.embed_dim, eps=1e-6)
        self.merger.mlp = nn.Sequential(
            nn.Linear(window, window), nn.GELU(), nn.Linear(window, cfg.out_size)
        )

    def forward(self, patches: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """patches (sum of t*h*w, C*T*P*P) of the images of `grid_thw` (images, 3), in
        order -> their merged rows (sum of t*h*w / m^2, out_size)."""
        cfg, weight = self.cfg, self.patch_embed.proj.weight
        x = patches.to(weight.dtype) @ weight.reshape(cfg.embed_dim, -1).T
        positions = patch_positions(grid_thw, cfg.spatial_merge_size).to(x.device)
        image = torch.repeat_interleave(torch.arange(len(grid_thw)), grid_thw.prod(-1).cpu())
        mask = (image[:, None] == image[None, :]).to(x.device)  # attention within an image
        # computed here, never a buffer: the loader builds the model on the meta device,
        # and a non-persistent buffer would come out of `to_empty` uninitialised
        quarter = cfg.embed_dim // cfg.num_heads // 4
        freq = 1.0 / cfg.rope_theta ** (
            torch.arange(quarter, dtype=torch.float32, device=x.device) / quarter
        )
        inv_freq = torch.cat([freq, freq])
        for block in self.blocks:
            x = block(x, positions, inv_freq, mask)
        x = self.merger.ln_q(x).reshape(-1, cfg.embed_dim * cfg.spatial_merge_size**2)
        return self.merger.mlp(x)


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

    def __init__(self, config: ModelConfig, ops: ModuleType = reference_ops) -> None:
        self.vision = Qwen2VLVisionConfig.from_hf(config.raw)
        super().__init__(config, ops)
        if sum(self.vision.mrope_section) != config.rotary_dim // 2:
            raise _bad(
                "rope_scaling.mrope_section",
                list(self.vision.mrope_section),
                f"three ints summing to head_dim / 2 = {config.rotary_dim // 2}",
            )
        self.visual = VisionTower(self.vision)

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
