"""GPTQ checkpoints (`quant_method: "gptq"`, as AutoGPTQ, GPTQModel and optimum write them).

Each quantized linear layer, weight W (out, in), stores unsigned b-bit codes u in
[0, 2^b) and zero points u_z, with W[o, i] = (u[o, i] - u_z[g, o]) * scales[g, o] for
g = g_idx[i]:

- `qweight`: int32 (in * b / 32, out), packed along the INPUT axis: word [r, o] holds
  u[o, r*k + j] (k = 32 / b) in bits [j*b, (j+1)*b);
- `qzeros`: int32 (groups, out * b / 32), packed along the OUTPUT axis: word [g, c] holds
  the zero of output c*k + j in bits [j*b, (j+1)*b); checkpoint_format "gptq" (v1, the
  default) stores u_z - 1 (mod 2^b), "gptq_v2" stores u_z;
- `scales`: float16 (groups, out);
- `g_idx`: int32 (in,), the group of each input column: i // group_size, or with
  act-order (`desc_act`) the group of the column's place in the order GPTQ quantized the
  columns (descending Hessian diagonal).

    qweight[r, o], int4:  bits 31 ............................................ 0
                          [ u(o,8r+7) | u(o,8r+6) | ... | u(o,8r+1) | u(o,8r+0) ]
    qzeros[g, c],  int4:  [ z(g,8c+7) | z(g,8c+6) | ... | z(g,8c+1) | z(g,8c+0) ]  (v1: z - 1)

`group_size` -1 is one group of every column. Symmetric checkpoints (`sym: true`) store
u_z = 2^(b-1) everywhere (v1: 7 for int4), read here as no zero points. The ops' signed
layout is q = u - 2^(b-1), z = u_z - 2^(b-1); act-order columns are sorted by group (a
permutation of the layer's input, `QuantWeight.perm`), which requires every group to
hold exactly group_size columns, as GPTQ writes them. Bits 2, 3 (codes across words) are
not supported. A v1 checkpoint's zero point 0, stored as -1, can spill into its
neighbour's field (the "qzeros overflow" of asymmetric v1 checkpoints); that cannot be
undone and is read as written.
"""

from __future__ import annotations

import torch

from ..ops import quant as quant_ops
from . import QuantScheme, QuantWeight, check_bits, check_group_size, pack_fields, unpack_fields
from ._tensors import expect

SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


def parse(qc: dict) -> QuantScheme:
    """The scheme of a GPTQ quantization_config (ValueError naming a bad field)."""
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"quantization_config checkpoint_format must be 'gptq' or 'gptq_v2', got {fmt!r}"
        )
    return QuantScheme(
        method="gptq",
        bits=check_bits(qc.get("bits"), (4, 8)),
        group_size=check_group_size(qc.get("group_size", -1)),
        symmetric=bool(qc.get("sym", True)),
        desc_act=bool(qc.get("desc_act", False)),
        v1_zeros=fmt == "gptq",
    )


def convert(module: str, stored: dict[str, torch.Tensor], scheme: QuantScheme) -> QuantWeight:
    """A GPTQ layer's tensors (`SUFFIXES`; g_idx optional) in the ops' layout.

    Raises:
        ValueError: a tensor missing, of the wrong dtype or shape, a g_idx out of range or
            whose groups are not group_size columns each (the message names the tensor).
    """
    bits, k = scheme.bits, 32 // scheme.bits
    qweight = expect(stored, module, "qweight", torch.int32, 2)
    in_features, out_features = qweight.shape[0] * k, qweight.shape[1]
    scales = expect(stored, module, "scales", None, 2)
    groups = scales.shape[0]
    size = scheme.group_size or in_features
    if scales.shape != (in_features // size, out_features) or in_features % size:
        raise ValueError(
            f"{module}.scales has shape {tuple(scales.shape)}, expected "
            f"({in_features} / group_size {scheme.group_size}, {out_features})"
        )
    qzeros = expect(stored, module, "qzeros", torch.int32, 2, (groups, out_features // k))
    g_idx = stored.get("g_idx")
    if g_idx is None:
        g_idx = torch.arange(in_features) // size
    g_idx = expect({"g_idx": g_idx}, module, "g_idx", None, 1, (in_features,)).long()
    half = 2 ** (bits - 1)
    codes = (unpack_fields(qweight.T.contiguous(), bits) - half).to(torch.int8)  # (out, in)
    u_zeros = unpack_fields(qzeros, bits)
    if scheme.v1_zeros:
        u_zeros = (u_zeros + 1) % 2**bits
    zeros = (u_zeros - half).T.contiguous().to(torch.int8)  # (out, groups)
    perm = None
    if not torch.equal(g_idx, torch.arange(in_features) // size):
        perm = torch.sort(g_idx, stable=True).indices
        if not torch.equal(g_idx[perm], torch.arange(in_features) // size):
            raise ValueError(
                f"{module}.g_idx must give each of the {groups} groups {size} columns, "
                f"got group sizes {torch.bincount(g_idx, minlength=groups).tolist()[:8]}..."
            )
        codes = codes[:, perm]
    return QuantWeight(
        quant_ops.pack_int32(codes, bits),
        scales.T.float().contiguous(),
        None if not torch.any(zeros) else zeros,
        bits,
        in_features,
        perm,
    )


def store(
    module: str,
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    scheme: QuantScheme,
    g_idx: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """A layer's GPTQ tensors from signed codes (out, in) in the input's column order,
    scales and zeros (out, groups) indexed by group, and g_idx (None: i // group_size)."""
    bits, half = scheme.bits, 2 ** (scheme.bits - 1)
    in_features = codes.shape[1]
    size = scheme.group_size or in_features
    if g_idx is None:
        g_idx = torch.arange(in_features) // size
    u_zeros = (
        torch.full_like(scales, half, dtype=torch.int64) if zeros is None else zeros.long() + half
    )
    if scheme.v1_zeros:
        u_zeros = (u_zeros - 1) % 2**bits
    return {
        f"{module}.qweight": pack_fields(codes.long() + half, bits).T.contiguous(),
        f"{module}.qzeros": pack_fields(u_zeros.T.contiguous().long(), bits),
        f"{module}.scales": scales.T.to(torch.float16).contiguous(),
        f"{module}.g_idx": g_idx.to(torch.int32),
    }


def config(scheme: QuantScheme) -> dict:
    """The quantization_config of a checkpoint `store` writes."""
    return {
        "quant_method": "gptq",
        "bits": scheme.bits,
        "group_size": scheme.group_size or -1,
        "desc_act": scheme.desc_act,
        "sym": scheme.symmetric,
        "checkpoint_format": "gptq" if scheme.v1_zeros else "gptq_v2",
    }
