"""Quantized checkpoints: reading GPTQ, AWQ and compressed-tensors weights into the ops' layout.

A quantized checkpoint is an HF model directory whose config.json has a
`quantization_config`; its linear layers store integer codes, scales and zero points in
the layout of the tool that wrote them instead of a float `weight`. Each format has a
module here that spells out its layout (a bit figure in its docstring) and converts a
layer's stored tensors into the one layout `pyagent_ref.ops.quant` computes with: signed
codes packed along the input axis (`ops.quant.pack_int32`), scales (out, groups) and int8
zero points (or None), plus an input permutation for GPTQ's act-order:

| `quant_method` | module | stored per linear layer |
|---|---|---|
| "gptq" | `gptq` | qweight, qzeros, scales, g_idx |
| "awq" | `awq` | qweight, qzeros, scales |
| "compressed-tensors" | `compressed_tensors` | weight_packed, weight_scale, weight_shape |
| "fp8", "compressed-tensors" float-quantized | `fp8` | weight (fp8), weight_scale, input_scale |

(asymmetric compressed-tensors layers add weight_zero_point). FP8 layers become
`fp8.Fp8Linear` (on `ops.quant.dequant_matmul_fp8`) instead of `QuantLinear`.

`quant_scheme(config)` reads and checks the config's `quantization_config`, and
`load_quantized` (called by `model.loader.load_model`) converts every quantized layer,
puts a `QuantLinear` (`linear`) in place of the model's float projection (the fused
qkv_proj and gate_up_proj take their q/k/v or gate/up layers' codes stacked by rows),
and loads the remaining float tensors (norms, embeddings, biases) as usual. The layers
call `ops.quant.dequant_matmul` of the model's ops namespace, so the accelerator's fused
kernel reads the packed codes directly.

llama.cpp's GGUF files are read by `gguf` (`LLM(model="x.gguf")`): their block formats
are `pyagent_ref.ops.gguf`'s, not this package's layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["QuantScheme", "QuantWeight", "load_quantized", "quant_scheme"]


@dataclass(frozen=True)
class QuantScheme:
    """What a checkpoint's `quantization_config` says about its linear layers.

    method: "gptq", "awq" or "compressed-tensors". bits: 4 or 8. group_size: the input
    columns that share a scale, None for one group per row (per channel). symmetric:
    no zero points. desc_act: GPTQ's act-order (columns quantized in a permuted order,
    `g_idx` giving each column's group). v1_zeros: GPTQ's "gptq" checkpoint_format, which
    stores zero points minus one ("gptq_v2" stores them as they are). ignore: module
    names kept in float (compressed-tensors' `ignore`, GPTQ's modules_in_block_to_quantize
    is not read: a layer is quantized exactly when its codes are in the checkpoint).
    fp8: the fp8 format of method "fp8" ("e4m3"), else None. activations: how method "fp8"
    quantizes the activations: None (weight-only), "static", "dynamic" or
    "dynamic_per_token" (`ops.quant.dequant_matmul_fp8`'s input_scale).
    """

    method: str
    bits: int
    group_size: int | None
    symmetric: bool = True
    desc_act: bool = False
    v1_zeros: bool = False
    ignore: tuple[str, ...] = ()
    fp8: str | None = None
    activations: str | None = None


@dataclass
class QuantWeight:
    """One linear layer's weight in the ops' layout (see `ops.quant`).

    packed: int32 (out, in * bits / 32). scales: float32 (out, groups). zeros: int8
    (out, groups) or None. perm: None, or int64 (in,): the layer computes x[:, perm] @ W^T
    (GPTQ act-order: the columns sorted by group, so that groups are contiguous).
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bits: int
    in_features: int
    perm: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]


def _formats() -> dict[str, Any]:
    from . import awq, compressed_tensors, fp8, gptq

    return {"gptq": gptq, "awq": awq, "compressed-tensors": compressed_tensors, "fp8": fp8}


def quant_scheme(config: dict) -> QuantScheme | None:
    """The scheme of an HF config dict's `quantization_config`, or None without one.

    Raises:
        ValueError: quantization_config is not an object, its quant_method is unknown,
            or the format's own checks fail (bits, group_size, ...): the message names
            the field and the value.
    """
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"config.json quantization_config must be an object, got {qc!r:.80}")
    method = qc.get("quant_method")
    formats = _formats()
    if method not in formats:
        raise ValueError(
            f"quantization_config quant_method must be one of {sorted(formats)}, got {method!r}"
        )
    return formats[method].parse(qc)


def check_bits(bits: Any, allowed: tuple[int, ...]) -> int:
    """`bits` if it is one of `allowed`, else ValueError naming it."""
    if isinstance(bits, bool) or bits not in allowed:
        raise ValueError(f"quantization_config bits must be one of {allowed}, got {bits!r}")
    return bits


def check_group_size(group_size: Any) -> int | None:
    """A config's group_size: -1 (or None) means per channel; else an int >= 1."""
    if group_size is None or group_size == -1:
        return None
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"quantization_config group_size must be -1 or >= 1, got {group_size!r}")
    return group_size


# --- int32 words of unsigned fields, as GPTQ and AWQ store them ------------------------------


def unpack_fields(words: torch.Tensor, bits: int, order: tuple[int, ...] | None = None):
    """The unsigned b-bit fields of int32 words along the last axis: (..., n) -> (..., n * k),
    k = 32 / b, field j of a word in bits [j * b, (j + 1) * b). With `order`, field j of a
    word holds element order[j] of its k elements (AWQ's interleaving)."""
    k = 32 // bits
    fields = torch.stack([(words >> (j * bits)) & (2**bits - 1) for j in range(k)], dim=-1)
    if order is not None:
        fields = fields[..., [order.index(e) for e in range(k)]]
    return fields.reshape(*words.shape[:-1], words.shape[-1] * k).to(torch.int32)


def pack_fields(values: torch.Tensor, bits: int, order: tuple[int, ...] | None = None):
    """`unpack_fields`' inverse: unsigned values (..., n * k) in [0, 2^b) to int32 words."""
    k = 32 // bits
    grouped = values.to(torch.int64).reshape(*values.shape[:-1], values.shape[-1] // k, k)
    if order is not None:
        grouped = grouped[..., list(order)]
    words = sum(grouped[..., j] << (j * bits) for j in range(k))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# --- loading ---------------------------------------------------------------------------------


def load_quantized(
    model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]], scheme: QuantScheme, ops: Any
) -> list[tuple[str, torch.Tensor]]:
    """Convert the quantized layers among `tensors` and put `QuantLinear`s in their places
    in `model`; return the other (float) tensors, for the loader to fill as usual.

    A layer's tensors are grouped by their module name (the name before the format's
    suffixes); the fused projections wait for all their parts (q, k, v; gate, up).

    Raises:
        ValueError: a layer's tensors are missing, mis-shaped or of the wrong dtype, a
            layer has no place in the model, or the parts of a fused projection disagree
            (the message names the checkpoint tensor or module).
    """
    from ..model.loader import _shards, checkpoint_target
    from .linear import QuantLinear

    fmt = _formats()[scheme.method]
    layers: dict[str, dict[str, torch.Tensor]] = {}
    rest = []
    for name, tensor in tensors:
        module, _, suffix = name.rpartition(".")
        if suffix in fmt.SUFFIXES:
            layers.setdefault(module, {})[suffix] = tensor
        else:
            rest.append((name, tensor))
    quantized = getattr(fmt, "quantized", None)
    if quantized is not None:  # fp8 keeps the name `weight`: float layers lack a scale
        for module in [m for m, stored in layers.items() if not quantized(stored)]:
            rest += [(f"{module}.{suffix}", t) for suffix, t in layers.pop(module).items()]
    fused: dict[str, dict[Any, Any]] = {}
    for module, stored in layers.items():
        target, shard = checkpoint_target(model, f"{module}.weight")
        path = target.removesuffix(".weight")
        try:
            linear = model.get_submodule(path)
        except AttributeError:
            linear = None
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"quantized checkpoint layer {module!r} has no place in the model")
        fused.setdefault(path, {})[shard] = fmt.convert(module, stored, scheme)
    for path, parts in fused.items():
        linear = model.get_submodule(path)
        shards = _shards(path + ".weight", linear.weight)
        missing = shards - set(parts)
        if missing:
            raise ValueError(
                f"quantized checkpoint lacks the {sorted(missing, key=repr)} part(s) of {path}"
            )
        order = ["q", "k", "v"] if "q" in shards else [0, 1] if 0 in shards else [None]
        quant = getattr(fmt, "Fp8Linear", QuantLinear).stack(
            [parts[s] for s in order],
            linear.in_features,
            linear.out_features,
            path,
            ops,
            linear.weight.dtype,
        )
        quant = quant.to(linear.weight.device)  # the codes were read on the CPU
        quant.bias = linear.bias
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, quant)
    return rest
