"""FP8 weight checkpoints: vLLM's `quant_method: "fp8"` and compressed-tensors'
`format: "float-quantized"`, read into `Fp8Linear` layers on `ops.quant`'s fp8 ops.

Both store each quantized linear layer, weight W (out, in), as one fp8 code per weight
and a float32 scale, W[o, i] = fp8(weight[o, i]) * weight_scale (`ops.quant.quantize_fp8`):

- `weight`: float8_e4m3fn (out, in), the codes (torch holds them as an
  fp8 dtype; the ops read the same bytes as uint8);
- `weight_scale`: float, one per tensor (shape () or (1,)) or one per output row
  ((out, 1), compressed-tensors' strategy "channel");
- `input_scale` (static activations only): float, shape () or (1,): the activations are
  quantized to e4m3 with this scale before the matmul.

    weight[o, i], e4m3:  [ s | e e e e | m m m ]   value (-1)^s (1 + m/8) 2^(e-7)
                                                   (e = 0: (-1)^s (m/8) 2^-6; 0x7F NaN)

A layer is quantized exactly when its `weight_scale` is in the checkpoint; the others
(norms, embeddings, lm_head) are float and load as usual.

The configs read:

- `quant_method: "fp8"` (vLLM, HF): `activation_scheme` "static" or "dynamic" (a scale
  per tensor), `fmt` "e4m3"; a block-wise `weight_block_size` is refused.
- `quant_method: "compressed-tensors"`, `format: "float-quantized"` (or
  "naive-quantized" with float weights; llm-compressor's FP8 schemes): one config group,
  weights `type: "float", num_bits: 8`, strategy "tensor" or "channel"; input_activations
  null (weight-only) or 8-bit float, strategy "tensor" (static or dynamic) or "token"
  (dynamic).

`Fp8Linear` computes y = ops.quant.dequant_matmul_fp8(x, codes, scales, fmt,
input_scale) + bias, input_scale the static scale (the largest of a fused projection's
parts, as vLLM takes it), "dynamic", "dynamic_per_token" or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from . import QuantScheme

SUFFIXES = ("weight", "weight_scale", "input_scale")
DTYPES = {"e4m3": torch.float8_e4m3fn}  # vLLM's fp8 method: e4m3 weights and activations


@dataclass
class Fp8Weight:
    """One linear layer's fp8 weight: codes uint8 (out, in), scales float32 (1, 1) or
    (out, 1), and its activations' quantization: `dequant_matmul_fp8`'s input_scale (the
    static scale, "dynamic", "dynamic_per_token", or None)."""

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: str
    input_scale: float | str | None = None

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]


def _scheme(fmt: Any, activations: Any, ignore: Any) -> QuantScheme:
    if fmt not in DTYPES:
        raise ValueError(f"quantization_config fmt must be one of {tuple(DTYPES)}, got {fmt!r}")
    return QuantScheme(
        method="fp8",
        bits=8,
        group_size=None,
        ignore=tuple(ignore or ()),
        fp8=fmt,
        activations=activations,
    )


def parse(qc: dict) -> QuantScheme:
    """The scheme of a vLLM / HF `quant_method: "fp8"` config (ValueError naming a bad
    field: an unknown fmt or activation_scheme, a block-wise weight_block_size)."""
    if qc.get("weight_block_size") is not None:
        raise ValueError(
            f"quantization_config weight_block_size {qc['weight_block_size']!r}: block-wise "
            f"fp8 scales are not supported (per-tensor scales only)"
        )
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("static", "dynamic"):
        raise ValueError(
            f"quantization_config activation_scheme must be 'static' or 'dynamic', got {scheme!r}"
        )
    ignore = qc.get("ignored_layers") or qc.get("modules_to_not_convert")
    return _scheme(qc.get("fmt", "e4m3"), scheme, ignore)


def parse_compressed_tensors(qc: dict, group: dict) -> QuantScheme:
    """The scheme of a compressed-tensors float-quantized config whose one config group is
    `group` (ValueError naming a bad field)."""
    weights = group.get("weights") or {}
    for key, want in (("type", "float"), ("num_bits", 8), ("symmetric", True)):
        if weights.get(key, want) != want:
            raise ValueError(
                f"quantization_config weights {key} must be {want!r} for float-quantized "
                f"checkpoints, got {weights.get(key)!r}"
            )
    if weights.get("strategy") not in ("tensor", "channel"):
        raise ValueError(
            f"quantization_config weights strategy must be 'tensor' or 'channel' for fp8, "
            f"got {weights.get('strategy')!r}"
        )
    acts = group.get("input_activations")
    activations = None
    if acts is not None:
        if acts.get("type") != "float" or acts.get("num_bits") != 8:
            raise ValueError(
                f"quantization_config input_activations must be 8-bit float, got type "
                f"{acts.get('type')!r}, num_bits {acts.get('num_bits')!r}"
            )
        strategy, dynamic = acts.get("strategy"), bool(acts.get("dynamic"))
        activations = {
            ("tensor", False): "static",
            ("tensor", True): "dynamic",
            ("token", True): "dynamic_per_token",
        }.get((strategy, dynamic))
        if activations is None:
            raise ValueError(
                f"quantization_config input_activations strategy {strategy!r} with dynamic "
                f"{dynamic} is not supported (tensor static or dynamic, token dynamic)"
            )
    return _scheme("e4m3", activations, qc.get("ignore"))


def quantized(stored: dict[str, torch.Tensor]) -> bool:
    """Whether a module's tensors are an fp8 layer's (it has a weight_scale)."""
    return "weight_scale" in stored


def _scalar(tensor: torch.Tensor, name: str) -> float:
    if not tensor.is_floating_point() or tensor.numel() != 1 or tensor.ndim > 1:
        raise ValueError(
            f"checkpoint tensor {name!r} must be one float (shape () or (1,)), got "
            f"{tensor.dtype} of shape {tuple(tensor.shape)}"
        )
    value = float(tensor.float().reshape(()))
    if not 0 < value < float("inf"):
        raise ValueError(f"checkpoint tensor {name!r} must be positive and finite, got {value}")
    return value


def convert(module: str, stored: dict[str, torch.Tensor], scheme: QuantScheme) -> Fp8Weight:
    """An fp8 layer's tensors in the ops' layout: the codes as uint8, scales (1, 1) or
    (out, 1) float32, the static input scale.

    Raises:
        ValueError: a tensor missing, of the wrong dtype or shape (the message names it).
    """
    weight = stored.get("weight")
    if weight is None:
        raise ValueError(f"quantized checkpoint lacks tensor '{module}.weight'")
    dtype = DTYPES[scheme.fp8]
    if weight.dtype != dtype or weight.ndim != 2:
        raise ValueError(
            f"checkpoint tensor '{module}.weight' must be 2-D {dtype}, got {weight.dtype} of "
            f"shape {tuple(weight.shape)}"
        )
    scale = stored["weight_scale"]
    out_features = weight.shape[0]
    if scale.is_floating_point() and tuple(scale.shape) == (out_features, 1):
        scales = scale.float()
    else:
        scales = torch.tensor([[_scalar(scale, f"{module}.weight_scale")]])
    input_scale = scheme.activations
    if scheme.activations == "static":
        if "input_scale" not in stored:
            raise ValueError(
                f"quantized checkpoint lacks tensor '{module}.input_scale' (static activations)"
            )
        input_scale = _scalar(stored["input_scale"], f"{module}.input_scale")
    return Fp8Weight(weight.view(torch.uint8), scales, scheme.fp8, input_scale)


def store(module: str, codes: torch.Tensor, scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """A layer's checkpoint tensors from e4m3 codes (uint8) and a (1, 1) or (out, 1) scale,
    as vLLM's fp8 checkpoints hold them (a per-tensor scale as one float of shape ())."""
    weight_scale = scales.reshape(()) if scales.shape == (1, 1) else scales
    return {
        f"{module}.weight": codes.view(torch.float8_e4m3fn),
        f"{module}.weight_scale": weight_scale.to(torch.float32),
    }


def config(scheme: QuantScheme | None = None) -> dict:
    """The quantization_config of a checkpoint `store` writes: vLLM's dynamic fp8 (as
    the other formats' `config`, which read the scheme)."""
    return {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "ignored_layers": ["lm_head"],
    }


class Fp8Linear(nn.Module):
    """A linear layer on fp8 codes (see the module docstring): QuantLinear's sibling.

    Args:
        weight: the layer's codes, scales, format and activations' input_scale.
        ops: the ops namespace (`use_ops` switches it with the model's).
        dtype: the dtype of the activations it computes on (the model's; a LoRA adapter
            on the layer takes it).
    """

    def __init__(
        self, weight: Fp8Weight, ops: ModuleType, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.dtype = dtype
        self.fmt = weight.fmt
        self.input_scale = weight.input_scale
        self.ops = ops
        self.register_buffer("codes", weight.codes)
        self.register_buffer("scales", weight.scales.float())
        self.bias: nn.Parameter | None = None

    @classmethod
    def stack(
        cls,
        parts: list[Fp8Weight],
        in_features: int,
        out_features: int,
        name: str,
        ops: ModuleType,
        dtype: torch.dtype = torch.float32,
    ) -> Fp8Linear:
        """The layer of `parts` stacked by rows (q, k, v or gate, up): their codes
        concatenated, each part's scale on its rows, the largest static input scale (as
        `QuantLinear.stack`).

        Raises:
            ValueError: the parts' shapes do not make the layer (the message names it).
        """
        rows = sum(p.out_features for p in parts)
        if rows != out_features or any(p.in_features != in_features for p in parts):
            shapes = [(p.out_features, p.in_features) for p in parts]
            raise ValueError(
                f"{name}: fp8 parts of shapes {shapes} do not make the layer's "
                f"({out_features}, {in_features})"
            )
        if len(parts) == 1:
            return cls(parts[0], ops, dtype)
        scales = torch.cat([p.scales.float().expand(p.out_features, 1) for p in parts])
        input_scale = parts[0].input_scale
        if isinstance(input_scale, float):
            input_scale = max(p.input_scale for p in parts)
        merged = Fp8Weight(torch.cat([p.codes for p in parts]), scales, parts[0].fmt, input_scale)
        return cls(merged, ops, dtype)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def dequantized(self) -> torch.Tensor:
        """The float32 weight (out_features, in_features) the layer computes with."""
        return self.ops.quant.dequantize_fp8(self.codes, self.scales, self.fmt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = self.ops.quant.dequant_matmul_fp8(
            flat, self.codes, self.scales, self.fmt, self.input_scale
        )
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        per = "tensor" if self.scales.shape[0] == 1 else "channel"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"fmt={self.fmt}, per={per}, input_scale={self.input_scale!r}"
        )
