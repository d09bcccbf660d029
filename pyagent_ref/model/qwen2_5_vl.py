"""Qwen2.5-VL: Qwen2-VL (`qwen2_vl`) with window attention in the vision tower.

The image processor, the placeholders, the patch merger's 2 x 2 join, the decoder
(Qwen2 with M-RoPE) and the positions of an image's tokens are Qwen2-VL's. The tower
differs:

1. its blocks normalise by RMSNorm (no bias) and their MLP is gated:
   down(act(gate(x)) * up(x)) (SiLU for the released models), all with biases; the
   merger's ln_q is an RMSNorm too;
2. most blocks attend within *windows* only: the merged grid of each image (its m x m
   merge units, one per decoder row) is cut into windows of side
   window_size / (patch_size * m) units (window_size is in pixels: 112 with patches of
   14 and m = 2 gives 4 x 4 units, 8 x 8 patches), row-major from the top left, the
   last row and column of windows cut short where the grid is not a multiple of that
   side. The blocks listed in `fullatt_block_indexes` attend over the whole image;
3. before the first block the rows are regrouped window by window (units row-major
   inside a window, windows row-major; each unit's m^2 patches stay together), so that
   every window, and every image, is a run of consecutive rows (`window_order`); the
   2-D RoPE positions move with their rows. The merger joins each unit's m^2
   consecutive rows, and its output is put back into the image processor's order
   (the inverse permutation), the order of the placeholders.

Checkpoint names are Qwen2-VL's (`families.QWEN2_VL`); vision_config names the tower's
width hidden_size, the decoder's out_hidden_size and the MLP's intermediate_size.
Videos are not supported: the engine takes images only (a `multi_modal_data` video is
refused by name), so second_per_grid_ts never enters the positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import ops as reference_ops
from .qwen2_vl import (
    Qwen2VLForConditionalGeneration,
    Qwen2VLVisionConfig,
    VisionAttention,
    VisionTower,
    _activation,
    _bad,
    _sizes,
)


@dataclass(frozen=True)
class Qwen2_5_VLVisionConfig(Qwen2VLVisionConfig):
    """Qwen2-VL's vision config (`Qwen2VLVisionConfig`) with the windows: window_size
    in pixels and the blocks of full attention. Defaults are HF's.

    Raises (from_hf): ValueError naming the key of a missing or unsupported value: a
    window smaller than one merge unit (patch_size * spatial_merge_size pixels), block
    indexes that are not distinct ints in [0, depth).
    """

    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)

    default_act = "silu"

    @property
    def window_units(self) -> int:
        """The side of a window in merge units: window_size / (patch_size * m)."""
        return self.window_size // (self.patch_size * self.spatial_merge_size)

    @classmethod
    def tower_fields(cls, vision: dict[str, Any]) -> dict[str, Any]:
        """The tower's sizes from `vision_config` (Qwen2.5-VL's key names)."""
        sizes = _sizes(
            vision,
            dict(
                depth=32,
                hidden_size=3584,
                out_hidden_size=3584,
                intermediate_size=3420,
                num_heads=16,
                in_channels=3,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                window_size=112,
            ),
        )
        unit = sizes["patch_size"] * sizes["spatial_merge_size"]
        if sizes["window_size"] < unit:
            raise _bad(
                "vision_config.window_size",
                sizes["window_size"],
                f"at least patch_size * spatial_merge_size = {unit} pixels",
            )
        full = vision.get("fullatt_block_indexes", (7, 15, 23, 31))
        if (
            not isinstance(full, (list, tuple))
            or any(isinstance(i, bool) or not isinstance(i, int) for i in full)
            or not all(0 <= i < sizes["depth"] for i in full)
            or len(set(full)) != len(full)
        ):
            raise _bad(
                "vision_config.fullatt_block_indexes",
                full,
                f"distinct block indexes in [0, depth = {sizes['depth']})",
            )
        sizes["embed_dim"] = sizes.pop("hidden_size")
        sizes["out_size"] = sizes.pop("out_hidden_size")
        return {**sizes, "fullatt_block_indexes": tuple(full)}


def window_order(grid_thw: torch.Tensor, merge: int, side: int) -> tuple[torch.Tensor, list[int]]:
    """The merge units of the images regrouped window by window (see the module
    docstring): grid_thw (images, 3) patch grids, m = `merge`, windows of side x side
    units -> (order, lengths): order, int64 (units,), the index in the image processor's
    order (per image, per frame, units row-major) of each unit in window order; lengths,
    the units of each window, in order (side * side, fewer at the right and bottom
    edges of a grid that is not a multiple of side).

    >>> order, lengths = window_order(torch.tensor([[1, 6, 4]]), merge=2, side=2)
    >>> order.tolist(), lengths  # a 3 x 2 unit grid: windows of 2 x 2, then 1 x 2
    ([0, 1, 2, 3, 4, 5], [4, 2])
    >>> window_order(torch.tensor([[1, 4, 6]]), merge=2, side=2)[0].tolist()
    [0, 1, 3, 4, 2, 5]
    """
    order, lengths, start = [], [], 0
    for t, h, w in grid_thw.tolist():
        h, w = h // merge, w // merge
        across = -(-w // side)  # windows per row of windows
        frame, row, col = torch.meshgrid(
            torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"
        )
        window = ((frame * -(-h // side) + row // side) * across + col // side).flatten()
        inside = ((row % side) * side + col % side).flatten()
        order.append(torch.argsort(window * side * side + inside) + start)
        lengths += torch.bincount(window).tolist()  # every window holds a unit
        start += t * h * w
    return torch.cat(order), lengths


class RMSNorm(nn.Module):
    """`ops.layers.rms_norm` with a learned scale: normalised in float32, rounded to
    x's dtype, then scaled (HF's order, which torch's nn.RMSNorm does not keep in
    bfloat16)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reference_ops.layers.rms_norm(x, self.weight, self.eps)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), with biases."""

    def __init__(self, cfg: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.gate_proj = nn.Linear(cfg.embed_dim, cfg.intermediate_size)
        self.up_proj = nn.Linear(cfg.embed_dim, cfg.intermediate_size)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(_activation(self.act, self.gate_proj(x)) * self.up_proj(x))


class WindowBlock(nn.Module):
    """x += attn(RMSNorm1(x)); x += mlp(RMSNorm2(x)): Qwen2-VL's attention within the
    runs of rows it is given (windows or whole images)."""

    def __init__(self, cfg: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.embed_dim, eps=1e-6)
        self.norm2 = RMSNorm(cfg.embed_dim, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = GatedMLP(cfg)

    def forward(self, x, positions, inv_freq, lengths) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), positions, inv_freq, lengths)
        return x + self.mlp(self.norm2(x))


class WindowVisionTower(VisionTower):
    """Qwen2-VL's tower with `WindowBlock`s, an RMSNorm ln_q and the window layout."""

    block = WindowBlock
    norm = RMSNorm

    def layout(self, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
        """Units in window order (`window_order`); the blocks of
        fullatt_block_indexes attend within each image, the others within each window."""
        cfg = self.cfg
        unit = cfg.spatial_merge_size**2
        order, windows = window_order(grid_thw, cfg.spatial_merge_size, cfg.window_units)
        images = grid_thw.prod(-1).tolist()
        windows = [n * unit for n in windows]
        full = set(cfg.fullatt_block_indexes)
        return order, [images if i in full else windows for i in range(cfg.depth)]


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL (see the module docstring): `Qwen2VLForConditionalGeneration` with
    the windowed tower."""

    vision_config_class = Qwen2_5_VLVisionConfig
    tower_class = WindowVisionTower
