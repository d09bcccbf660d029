"""Positions, slot mappings and logits indices of a flattened, padded batch."""

from __future__ import annotations

import numpy as np
import pytest

BLOCK_TABLE = [[3, 7, 0], [5, 0, 0], [9, 2, 4]]
QSL = [0, 3, 4, 6]  # request 0: 3 tokens, 1: 1 token (a decode), 2: 2 tokens


def test_positions_continue_after_the_computed_tokens(ops, lib):
    pos = ops.block_table.compute_positions(lib(QSL, "int64"), lib([2, 9, 0], "int64"), 8)
    assert lib.np(pos).tolist() == [2, 3, 4, 9, 0, 1, 0, 0]


def test_slot_mapping_follows_the_block_table(ops, lib):
    positions = lib([2, 3, 4, 9, 0, 1, 0, 0], "int64")
    slots = ops.block_table.compute_slot_mapping(
        lib(BLOCK_TABLE, "int32"), lib(QSL, "int64"), positions, 4
    )
    # request 0: positions 2, 3 in block 3, position 4 opens block 7; padding gets -1
    assert lib.np(slots).tolist() == [14, 15, 28, 1, 36, 37, -1, -1]
    assert str(slots.dtype).endswith("int64")


def test_empty_batch_is_all_padding(ops, lib):
    slots = ops.block_table.compute_slot_mapping(
        lib(np.zeros((0, 2)), "int64"), lib([0], "int64"), lib([0, 0], "int64"), 16
    )
    assert lib.np(slots).tolist() == [-1, -1]


def test_logits_indices_are_last_tokens(ops, lib):
    assert lib.np(ops.block_table.compute_logits_indices(lib(QSL, "int64"))).tolist() == [2, 3, 5]


def test_position_past_the_table_is_named(ops, lib):
    with pytest.raises(ValueError, match=r"positions\[0\] = 12"):
        ops.block_table.compute_slot_mapping(
            lib([[1, 2, 3]], "int64"), lib([0, 1], "int64"), lib([12], "int64"), 4
        )


@pytest.mark.parametrize(
    ("qsl", "match"),
    [([1, 2], "start with 0"), ([0, 3, 2], "non-decreasing")],
)
def test_malformed_query_start_loc(ops, lib, qsl, match):
    with pytest.raises(ValueError, match=match):
        ops.block_table.compute_slot_mapping(
            lib([[1], [2]], "int64"), lib(qsl, "int64"), lib([0, 0, 0], "int64"), 4
        )


def test_float_inputs_are_type_errors(ops, lib):
    with pytest.raises(TypeError, match="block_table"):
        ops.block_table.compute_slot_mapping(
            lib([[1.0]]), lib([0, 1], "int64"), lib([0], "int64"), 4
        )


def test_logits_indices_reject_empty_requests(ops, lib):
    with pytest.raises(ValueError, match="request 1"):
        ops.block_table.compute_logits_indices(lib([0, 2, 2], "int64"))


def test_padding_only_batch_with_an_empty_table(ops, lib):
    slots = ops.block_table.compute_slot_mapping(
        lib(np.zeros((2, 0)), "int64"), lib([0, 0, 0], "int64"), lib([0], "int64"), 4
    )
    assert lib.np(slots).tolist() == [-1]


def test_int32_query_start_loc_cannot_wrap_past_the_check(ops, lib):
    with pytest.raises(ValueError, match="non-decreasing"):
        ops.block_table.compute_logits_indices(lib([0, 2**31 - 1, -2], "int32"))
