"""QuantLinear: the layer of stacked parts (some with act-order permutations of their
input) computes x @ W^T + b for the weight its parts describe, on the reference ops and
on the default ones (the accelerator's fused kernel where it is installed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.ops import quant as quant_ops  # noqa: E402
from pyagent_ref.quant import QuantWeight  # noqa: E402
from pyagent_ref.quant.linear import QuantLinear  # noqa: E402


def _part(seed, rows, in_features, bits, group_size, permuted, symmetric):
    """(QuantWeight, its float weight W with W[:, i] the weight of input column i)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, in_features, generator=g)
    codes, scales, zeros = quant_ops.quantize(w, bits, group_size, symmetric)
    sorted_weight = quant_ops.dequantize(codes, scales, zeros)  # column j: input perm[j]
    perm = torch.randperm(in_features, generator=g) if permuted else None
    weight = sorted_weight if perm is None else torch.empty_like(sorted_weight)
    if perm is not None:
        weight[:, perm] = sorted_weight
    part = QuantWeight(quant_ops.pack_int32(codes, bits), scales, zeros, bits, in_features, perm)
    return part, weight


@pytest.mark.parametrize("ops", ["ref", "auto"])
@pytest.mark.parametrize(
    "bits,group_size,perms,symmetric",
    [
        (4, 16, (False, False, False), True),
        (4, 16, (True, True, False), False),
        (8, None, (True, False, True), True),
        (4, None, (False, True, False), False),
    ],
)
def test_stacked_parts_compute_x_times_the_weight(ops, bits, group_size, perms, symmetric):
    rows = (32, 16, 16)
    made = [
        _part(i, r, 64, bits, group_size, p, symmetric)
        for i, (r, p) in enumerate(zip(rows, perms, strict=True))
    ]
    parts, weights = [m[0] for m in made], [m[1] for m in made]
    layer = QuantLinear.stack(parts, 64, sum(rows), "test", load_ops(ops))
    layer.bias = torch.nn.Parameter(torch.randn(sum(rows)))
    # neighbours without a permutation merge; a permuted part (its own random order)
    # stays a part of its own
    merges = sum(1 for a, b in zip(perms, perms[1:], strict=False) if not a and not b)
    assert layer.num_parts == len(rows) - merges
    weight = torch.cat(weights)
    torch.testing.assert_close(layer.dequantized(), weight, rtol=0, atol=0)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(layer(x), x @ weight.T + layer.bias, rtol=1e-5, atol=1e-5)


def test_parts_that_do_not_make_the_layer_are_named():
    part, _ = _part(0, 8, 32, 4, None, False, True)
    with pytest.raises(
        ValueError, match=r"layers.0.qkv_proj: quantized parts of shapes \[\(8, 32\)\]"
    ):
        QuantLinear.stack([part], 32, 16, "layers.0.qkv_proj", load_ops("ref"))


@pytest.mark.parametrize(
    "bits,group_size,symmetric", [(4, 16, True), (4, 16, False), (8, None, True)]
)
def test_a_share_of_rows_or_columns_holds_those_of_the_weight(bits, group_size, symmetric):
    """take_rows (column-parallel) across parts, take_columns (row-parallel) in whole
    words and groups: the dequantized share is that slice of the weight, exactly."""
    made = [_part(i, r, 64, bits, group_size, False, symmetric) for i, r in enumerate((8, 24))]
    weights = torch.cat([m[1] for m in made])
    layer = QuantLinear([m[0] for m in made], 64, 32, load_ops("ref"))  # two parts
    rows = torch.tensor([1, 2, 9, 30])
    torch.testing.assert_close(layer.take_rows(rows).dequantized(), weights[rows], rtol=0, atol=0)
    share = layer.take_columns(32, 64, "test")
    assert share.in_features == 32
    torch.testing.assert_close(share.dequantized(), weights[:, 32:], rtol=0, atol=0)
    x = torch.randn(3, 32)
    torch.testing.assert_close(share(x), x @ weights[:, 32:].T, rtol=1e-5, atol=1e-5)


def test_a_share_that_cuts_a_word_a_group_or_an_act_order_is_refused():
    part, _ = _part(0, 8, 64, 4, 16, False, True)
    layer = QuantLinear.stack([part], 64, 8, "o_proj", load_ops("ref"))
    with pytest.raises(ValueError, match=r"o_proj: .*\[8, 64\) cut a group of 16 columns"):
        layer.take_columns(8, 64, "o_proj")
    with pytest.raises(ValueError, match=r"\[4, 64\) cut a packed int32 word of 8 columns"):
        layer.take_columns(4, 64, "o_proj")
    permuted, _ = _part(0, 8, 64, 4, 16, True, True)
    layer = QuantLinear.stack([permuted], 64, 8, "o_proj", load_ops("ref"))
    with pytest.raises(ValueError, match="desc_act=True"):
        layer.take_columns(0, 32, "o_proj")
