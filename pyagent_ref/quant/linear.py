"""The quantized linear layer: a projection whose weight stays packed codes.

`QuantLinear` takes the place of one of the model's `nn.Linear` projections when a
quantized checkpoint loads (`pyagent_ref.quant.load_quantized`). It keeps, as buffers, the
weight in `ops.quant`'s layout — int32 words of signed codes packed along the input axis,
float32 scales (out, groups), int8 zero points or None — and computes

    y = ops.quant.dequant_matmul(x[..., perm], packed, scales, zeros, bits) + bias

with the ops namespace the model was given (the accelerator's kernel reads the codes
without building the float weight; the reference dequantizes, then multiplies). `perm`
is GPTQ's act-order permutation of the input columns (None without act-order). A fused
projection (q/k/v, gate/up) stacks its parts' rows when they share a permutation, and
otherwise keeps one part per permutation and concatenates their outputs.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from . import QuantWeight


class QuantLinear(nn.Module):
    """A linear layer on packed quantized codes (see the module docstring).

    Args:
        parts: the weights whose outputs, in order, make the layer's output rows; each
            has the layer's in_features.
        in_features: the layer's input size.
        out_features: its output size.
        ops: the ops namespace (`use_ops` switches it with the model's).
        dtype: the dtype of the activations it computes on (the model's).
    """

    def __init__(
        self,
        parts: list[QuantWeight],
        in_features: int,
        out_features: int,
        ops: ModuleType,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.dtype = dtype
        self.bits = parts[0].bits
        self.num_parts = len(parts)
        self.ops = ops
        for i, part in enumerate(parts):
            self.register_buffer(f"packed{i}", part.packed)
            self.register_buffer(f"scales{i}", part.scales.float())
            self.register_buffer(f"zeros{i}", part.zeros)
            self.register_buffer(f"perm{i}", part.perm)
        self.bias: nn.Parameter | None = None

    @classmethod
    def stack(
        cls,
        parts: list[QuantWeight],
        in_features: int,
        out_features: int,
        name: str,
        ops: ModuleType,
        dtype: torch.dtype = torch.float32,
    ) -> QuantLinear:
        """The layer of `parts` stacked by rows (a fused projection's q, k, v or gate, up),
        merging neighbours with the same permutation, bits and groups.

        Raises:
            ValueError: a part's in_features or bits differ from the layer's, or the rows
                do not add up to out_features (the message names the layer `name`).
        """
        rows = sum(p.out_features for p in parts)
        if rows != out_features or any(p.in_features != in_features for p in parts):
            shapes = [(p.out_features, p.in_features) for p in parts]
            raise ValueError(
                f"{name}: quantized parts of shapes {shapes} do not make the layer's "
                f"({out_features}, {in_features})"
            )
        if len({p.bits for p in parts}) != 1:
            raise ValueError(f"{name}: quantized parts of different bits {[p.bits for p in parts]}")
        merged = [parts[0]]
        for part in parts[1:]:
            last = merged[-1]
            same_perm = (last.perm is None and part.perm is None) or (
                last.perm is not None
                and part.perm is not None
                and torch.equal(last.perm, part.perm)
            )
            same_groups = last.scales.shape[1] == part.scales.shape[1]
            same_zeros = (last.zeros is None) == (part.zeros is None)
            if not (same_perm and same_groups and same_zeros):
                merged.append(part)
                continue
            cat = lambda a, b: None if a is None else torch.cat([a, b])  # noqa: E731
            merged[-1] = QuantWeight(
                torch.cat([last.packed, part.packed]),
                torch.cat([last.scales.float(), part.scales.float()]),
                cat(last.zeros, part.zeros),
                last.bits,
                in_features,
                last.perm,
            )
        return cls(merged, in_features, out_features, ops, dtype)

    @property
    def device(self) -> torch.device:
        return self.packed0.device

    def part(self, i: int) -> QuantWeight:
        """Part `i` of the layer, as stored."""
        get = lambda what: getattr(self, f"{what}{i}")  # noqa: E731
        return QuantWeight(
            get("packed"), get("scales"), get("zeros"), self.bits, self.in_features, get("perm")
        )

    def take_rows(self, rows: torch.Tensor) -> QuantLinear:
        """The layer of output rows `rows` (int64, increasing; a column-parallel rank's
        rows): each part keeps the rows it holds, its codes and scales as they are. The
        bias is not taken (the caller cuts it)."""
        parts, start = [], 0
        for i in range(self.num_parts):
            p = self.part(i)
            local = rows[(rows >= start) & (rows < start + p.out_features)] - start
            start += p.out_features
            if len(local):
                local = local.to(p.packed.device)
                zeros = None if p.zeros is None else p.zeros[local]
                parts.append(
                    QuantWeight(
                        p.packed[local], p.scales[local], zeros, p.bits, p.in_features, p.perm
                    )
                )
        return QuantLinear(parts, self.in_features, len(rows), self.ops, self.dtype)

    def take_columns(self, start: int, stop: int, name: str) -> QuantLinear:
        """The layer of input columns [start, stop) (a row-parallel rank's): the packed
        words and the groups of scales (and zero points) they fill. The bias is not taken.

        Raises:
            ValueError: a bound cuts a packed int32 word (32 / bits columns) or a group
                of the scales, or the layer has act-order (its permutation scatters a
                rank's columns over the groups): the message names the layer `name`.
        """
        per_word = 32 // self.bits
        parts = []
        for i in range(self.num_parts):
            p = self.part(i)
            if p.perm is not None:
                raise ValueError(
                    f"{name}: desc_act=True (act-order) scatters columns [{start}, {stop}) "
                    "over the groups: a row-parallel rank cannot take them"
                )
            groups = p.scales.shape[1]
            size = self.in_features // groups  # the group size (the whole row: per channel)
            units = [("a packed int32 word", per_word)] + (
                [("a group", size)] if groups > 1 else []
            )
            for what, unit in units:  # (one scale per row: any columns share it)
                if start % unit or (stop % unit and stop != self.in_features):
                    raise ValueError(
                        f"{name}: a rank's input columns [{start}, {stop}) cut {what} "
                        f"of {unit} columns (bits={self.bits}, group_size="
                        f"{None if groups == 1 else size}); choose a tensor_parallel_size "
                        "whose share is whole groups"
                    )
            g0, g1 = (0, 1) if groups == 1 else (start // size, -(-stop // size))
            zeros = None if p.zeros is None else p.zeros[:, g0:g1].contiguous()
            packed = p.packed[:, start // per_word : -(-stop // per_word)].contiguous()
            scales = p.scales[:, g0:g1].contiguous()
            parts.append(QuantWeight(packed, scales, zeros, p.bits, stop - start))
        return QuantLinear(parts, stop - start, self.out_features, self.ops, self.dtype)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight (out_features, in_features) the layer computes with."""
        rows = []
        for i in range(self.num_parts):
            p = self.part(i)
            quant = self.ops.quant
            codes = quant.unpack_int32(p.packed, self.bits, self.in_features)
            w = quant.dequantize(codes, p.scales, p.zeros)
            if p.perm is not None:  # column j of w is input column perm[j]
                w = torch.empty_like(w).index_copy_(1, p.perm, w)
            rows.append(w)
        return torch.cat(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        outs = []
        for i in range(self.num_parts):
            p = self.part(i)
            xi = flat if p.perm is None else flat.index_select(1, p.perm)
            outs.append(self.ops.quant.dequant_matmul(xi, p.packed, p.scales, p.zeros, p.bits))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bits={self.bits}, groups={self.scales0.shape[1]}, parts={self.num_parts}, "
            f"zeros={self.zeros0 is not None}, act_order={self.perm0 is not None}"
        )
