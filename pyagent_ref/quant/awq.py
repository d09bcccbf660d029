"""AWQ checkpoints (`quant_method: "awq"`, `version: "gemm"`, as AutoAWQ and llm-compressor
write them).

Each quantized linear layer, weight W (out, in), stores unsigned 4-bit codes u and zero
points u_z with W[o, i] = (u[o, i] - u_z[g, o]) * scales[g, o], g = i // group_size:

- `qweight`: int32 (in, out / 8), packed along the OUTPUT axis in AWQ's interleaved
  order: word [i, c] holds outputs 8c .. 8c+7 of input i, output 8c + ORDER[j] in bits
  [4j, 4j+4), ORDER = (0, 2, 4, 6, 1, 3, 5, 7);
- `qzeros`: int32 (groups, out / 8), the zero points packed the same way (stored as
  they are, no offset);
- `scales`: float16 (groups, out).

    qweight[i, c]:  bits 31 ................................................... 0
                    [ u7 | u5 | u3 | u1 | u6 | u4 | u2 | u0 ]   u_m = u(8c+m, i)
    qzeros[g, c]:   [ z7 | z5 | z3 | z1 | z6 | z4 | z2 | z0 ]   z_m = u_z(g, 8c+m)

(the interleaving lets a GEMM kernel turn a word into two halves of four fp16 values with
one shift). The ops' signed layout is q = u - 8, z = u_z - 8. Only 4 bits and zero points
(`zero_point: true`) are supported, as AWQ's GEMM checkpoints have them.
"""

from __future__ import annotations

import torch

from ..ops import quant as quant_ops
from . import QuantScheme, QuantWeight, check_bits, check_group_size, pack_fields, unpack_fields
from ._tensors import expect

SUFFIXES = ("qweight", "qzeros", "scales")
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Field j of an AWQ word holds element ORDER[j] of its eight."""


def parse(qc: dict) -> QuantScheme:
    """The scheme of an AWQ quantization_config (ValueError naming a bad field)."""
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"quantization_config version must be 'gemm' for AWQ, got {version!r}")
    if qc.get("zero_point", True) is not True:
        raise ValueError(
            f"quantization_config zero_point must be true for AWQ, got {qc['zero_point']!r}"
        )
    bits = qc.get("bits", qc.get("w_bit"))
    group_size = qc.get("group_size", qc.get("q_group_size", -1))
    return QuantScheme(
        method="awq",
        bits=check_bits(bits, (4,)),
        group_size=check_group_size(group_size),
        symmetric=False,
        ignore=tuple(qc.get("modules_to_not_convert") or ()),
    )


def convert(module: str, stored: dict[str, torch.Tensor], scheme: QuantScheme) -> QuantWeight:
    """An AWQ layer's tensors in the ops' layout.

    Raises:
        ValueError: a tensor missing, of the wrong dtype or shape (the message names it).
    """
    qweight = expect(stored, module, "qweight", torch.int32, 2)
    in_features, out_features = qweight.shape[0], qweight.shape[1] * 8
    size = scheme.group_size or in_features
    if in_features % size:
        raise ValueError(
            f"{module}: quantization_config group_size {scheme.group_size} does not divide "
            f"the layer's in_features {in_features}"
        )
    groups = in_features // size
    scales = expect(stored, module, "scales", None, 2, (groups, out_features))
    qzeros = expect(stored, module, "qzeros", torch.int32, 2, (groups, out_features // 8))
    codes = (unpack_fields(qweight, 4, ORDER) - 8).T.contiguous().to(torch.int8)  # (out, in)
    zeros = (unpack_fields(qzeros, 4, ORDER) - 8).T.contiguous().to(torch.int8)  # (out, groups)
    return QuantWeight(
        quant_ops.pack_int32(codes, 4), scales.T.float().contiguous(), zeros, 4, in_features
    )


def store(
    module: str,
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    scheme: QuantScheme,
    g_idx: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """A layer's AWQ tensors from signed codes (out, in), scales and zeros (out, groups)
    (zeros None: all zero)."""
    if g_idx is not None:
        raise ValueError("AWQ checkpoints have no act-order (g_idx)")
    zeros = torch.zeros_like(scales, dtype=torch.int8) if zeros is None else zeros
    return {
        f"{module}.qweight": pack_fields((codes.long() + 8).T.contiguous(), 4, ORDER),
        f"{module}.qzeros": pack_fields((zeros.long() + 8).T.contiguous(), 4, ORDER),
        f"{module}.scales": scales.T.to(torch.float16).contiguous(),
    }


def config(scheme: QuantScheme) -> dict:
    """The quantization_config of a checkpoint `store` writes."""
    return {
        "quant_method": "awq",
        "bits": 4,
        "group_size": scheme.group_size or -1,
        "zero_point": True,
        "version": "gemm",
    }
