"""compressed-tensors checkpoints (`quant_method: "compressed-tensors"`, `format:
"pack-quantized"`, as llm-compressor writes them and vLLM reads them; its fp8 format
"float-quantized" is `pyagent_ref.quant.fp8`'s).

This format is the ops' own layout (`pyagent_ref.ops.quant`): each quantized linear
layer, weight W (out, in), stores signed b-bit codes q and zero points z with
W[o, i] = (q[o, i] - z[o, g]) * weight_scale[o, g], g = i // group_size:

- `weight_packed`: int32 (out, in * b / 32), packed along the INPUT axis, code j of a word
  in bits [j*b, (j+1)*b) stored as q + 2^(b-1) (`ops.quant.pack_int32`);
- `weight_scale`: float (out, groups), one group per row for strategy "channel";
- `weight_shape`: int (2,), (out, in);
- `weight_zero_point` (asymmetric only): int32 (out * b / 32, groups), the zero points
  packed the same way along the OUTPUT axis.

    weight_packed[o, w], int4:  bits 31 ..................................... 0
                                [ q(o,8w+7)+8 | ... | q(o,8w+1)+8 | q(o,8w+0)+8 ]

The scheme comes from `config_groups`: one group whose `weights` are type "int",
num_bits 4 or 8, strategy "channel" or "group" (with group_size); weight-only
(`input_activations` null). Layers named in `ignore` (e.g. "lm_head") stay in float.
"""

from __future__ import annotations

import torch

from ..ops import quant as quant_ops
from . import QuantScheme, QuantWeight, check_bits, check_group_size
from ._tensors import expect

SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


def parse(qc: dict) -> QuantScheme:
    """The scheme of a compressed-tensors quantization_config (ValueError naming a bad field)."""
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ValueError(
            f"quantization_config config_groups must hold one scheme, got {groups!r:.100}"
        )
    (group,) = groups.values()
    weights = group.get("weights") or {}
    float_weights = fmt == "float-quantized" or (
        fmt == "naive-quantized" and weights.get("type") == "float"
    )
    if float_weights:  # fp8 weights: `pyagent_ref.quant.fp8`
        from . import fp8

        return fp8.parse_compressed_tensors(qc, group)
    if fmt != "pack-quantized":
        raise ValueError(
            f"quantization_config format must be 'pack-quantized' or 'float-quantized' for "
            f"compressed-tensors, got {fmt!r}"
        )
    if weights.get("type", "int") != "int" or group.get("input_activations") is not None:
        raise ValueError(
            f"quantization_config config_groups must be weight-only int quantization, got "
            f"weights type {weights.get('type')!r}, input_activations "
            f"{group.get('input_activations')!r}"
        )
    strategy = weights.get("strategy")
    if strategy not in ("channel", "group"):
        raise ValueError(
            f"quantization_config weights strategy must be 'channel' or 'group', got {strategy!r}"
        )
    group_size = check_group_size(weights.get("group_size")) if strategy == "group" else None
    if strategy == "group" and group_size is None:
        raise ValueError("quantization_config weights strategy 'group' needs a group_size")
    return QuantScheme(
        method="compressed-tensors",
        bits=check_bits(weights.get("num_bits"), (4, 8)),
        group_size=group_size,
        symmetric=bool(weights.get("symmetric", True)),
        ignore=tuple(qc.get("ignore") or ()),
    )


def convert(module: str, stored: dict[str, torch.Tensor], scheme: QuantScheme) -> QuantWeight:
    """A compressed-tensors layer's tensors in the ops' layout (they are already in it).

    Raises:
        ValueError: a tensor missing, of the wrong dtype or shape (the message names it).
    """
    bits, k = scheme.bits, 32 // scheme.bits
    shape = expect(stored, module, "weight_shape", None, 1, (2,))
    out_features, in_features = (int(v) for v in shape)
    packed = expect(
        stored, module, "weight_packed", torch.int32, 2, (out_features, -(-in_features // k))
    )
    if in_features % k:
        raise ValueError(
            f"{module}.weight_shape: in_features {in_features} is not a multiple of {k} "
            f"({bits}-bit codes per int32 word)"
        )
    size = scheme.group_size or in_features
    if in_features % size:
        raise ValueError(
            f"{module}: quantization_config group_size {scheme.group_size} does not divide "
            f"the layer's in_features {in_features}"
        )
    groups = in_features // size
    scales = expect(stored, module, "weight_scale", None, 2, (out_features, groups))
    zeros = None
    if not scheme.symmetric:
        words = expect(
            stored, module, "weight_zero_point", torch.int32, 2, (-(-out_features // k), groups)
        )
        zeros = quant_ops.unpack_int32(words.T.contiguous(), bits, out_features).T.contiguous()
    return QuantWeight(packed, scales.float(), zeros, bits, in_features)


def store(
    module: str,
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    scheme: QuantScheme,
    g_idx: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """A layer's compressed-tensors tensors from signed codes (out, in), scales and zeros
    (out, groups)."""
    if g_idx is not None:
        raise ValueError("compressed-tensors pack-quantized checkpoints have no act-order")
    tensors = {
        f"{module}.weight_packed": quant_ops.pack_int32(codes, scheme.bits),
        f"{module}.weight_scale": scales.to(torch.float32),
        f"{module}.weight_shape": torch.tensor(codes.shape, dtype=torch.int64),
    }
    if not scheme.symmetric:
        packed = quant_ops.pack_int32(zeros.T.contiguous(), scheme.bits)
        tensors[f"{module}.weight_zero_point"] = packed.T.contiguous()
    return tensors


def config(scheme: QuantScheme) -> dict:
    """The quantization_config of a checkpoint `store` writes."""
    weights = {
        "num_bits": scheme.bits,
        "type": "int",
        "symmetric": scheme.symmetric,
        "strategy": "group" if scheme.group_size else "channel",
        "group_size": scheme.group_size,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}
        },
        "ignore": ["lm_head"],
    }
