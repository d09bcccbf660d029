"""Prefix-cache hashing: the byte encoding and the chain, checked independently.

The expected digests are rebuilt here with hashlib/xxhash over bytes written out by
hand from the module docstring, so an implementation cannot pass by agreeing with
itself.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from conformance.oracles import RFC8949_EXAMPLES  # RFC 8949 Appendix A

xxhash = pytest.importorskip("xxhash")


@pytest.mark.parametrize(("value", "hexbytes"), RFC8949_EXAMPLES)
def test_cbor_matches_rfc_8949(ops, value, hexbytes):
    assert ops.hashing.cbor_encode(value).hex() == hexbytes


@pytest.mark.parametrize("bad", [True, 1.5, None, {"a": 1}, 2**64])
def test_cbor_rejects_values_outside_the_encoding(ops, bad):
    with pytest.raises((TypeError, ValueError)):
        ops.hashing.cbor_encode(bad)


def _digest(data: bytes, algorithm: str) -> bytes:
    if algorithm == "sha256":
        return hashlib.sha256(data).digest()
    return xxhash.xxh3_128(data).digest()


@pytest.mark.parametrize("algorithm", ["sha256", "xxh3_128"])
def test_root_and_first_block_bytes(ops, algorithm):
    label = b"pyagent.prefix-cache.v1"
    root = _digest(bytes([0x60 + len(label)]) + label, algorithm)
    assert ops.hashing.root_hash(algorithm) == root
    # [root, [1, 2, 300], [["lora", 7]]]
    body = (
        b"\x83"
        + (bytes([0x40 + len(root)]) if len(root) < 24 else bytes([0x58, len(root)]))
        + root
        + b"\x83\x01\x02\x19\x01\x2c"
        + b"\x81\x82\x64lora\x07"
    )
    got = ops.hashing.hash_block(root, [1, 2, 300], [("lora", 7)], algorithm)
    assert got == _digest(body, algorithm)
    assert len(got) == {"sha256": 32, "xxh3_128": 16}[algorithm]


@pytest.mark.parametrize("algorithm", ["sha256", "xxh3_128"])
def test_hash_blocks_folds_hash_block_over_full_blocks(ops, algorithm):
    tokens = list(range(100, 111))  # two full blocks of 4 and a partial one
    keys = [[("salt", "s")], [("mm", "img0", 3), ("lora", "ad")]]
    got = ops.hashing.hash_blocks(tokens, 4, keys, algorithm)
    h0 = ops.hashing.hash_block(ops.hashing.root_hash(algorithm), tokens[:4], keys[0], algorithm)
    h1 = ops.hashing.hash_block(h0, tokens[4:8], keys[1], algorithm)
    assert got == [h0, h1]
    # continuing from a parent gives the same chain as hashing from the start
    assert ops.hashing.hash_blocks(tokens[4:8], 4, [keys[1]], algorithm, parent=h0) == [h1]


def test_hash_blocks_accepts_arrays(ops, lib):
    tokens = list(range(33))
    expected = ops.hashing.hash_blocks(tokens, 16)
    assert ops.hashing.hash_blocks(lib(tokens, "int64"), 16) == expected
    assert ops.hashing.hash_blocks(np.arange(33, dtype=np.int32), 16) == expected


def test_every_input_changes_the_hash(ops):
    root = ops.hashing.root_hash()
    base = ops.hashing.hash_block(root, [1, 2, 3])
    variants = [
        ops.hashing.hash_block(root, [1, 2, 4]),
        ops.hashing.hash_block(root, [1, 2]),
        ops.hashing.hash_block(base, [1, 2, 3]),
        ops.hashing.hash_block(root, [1, 2, 3], [("salt", "")]),
        ops.hashing.hash_block(root, [1, 2, 3], [("lora", 0)]),
        ops.hashing.hash_block(root, [1, 2, 3], [("lora", "0")]),
        ops.hashing.hash_block(root, [1, 2, 3], [("mm", "x", 0)]),
        ops.hashing.hash_block(root, [1, 2, 3], [("mm", b"x", 0)]),
    ]
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda h: h.hash_blocks([1, 2], 0), ValueError, "block_size"),
        (lambda h: h.hash_blocks([1, 2], 1, [[]]), ValueError, "extra_keys"),
        (lambda h: h.hash_blocks([1, -2], 1), ValueError, r"token_ids\[1\]"),
        (lambda h: h.hash_blocks([1, 2.5], 1), TypeError, r"token_ids\[1\]"),
        (lambda h: h.hash_blocks([1], 1, algorithm="md5"), ValueError, "algorithm"),
        (lambda h: h.hash_block(b"short", [1]), ValueError, "parent_hash"),
        (lambda h: h.hash_block("x" * 32, [1]), TypeError, "parent_hash"),
        (lambda h: h.hash_block(h.root_hash(), [1], [("adapter", 1)]), ValueError, "extra_keys"),
        (lambda h: h.hash_block(h.root_hash(), [1], [("mm", "x", -1)]), ValueError, "mm"),
        (lambda h: h.hash_block(h.root_hash(), [1], [("salt", 3)]), ValueError, "salt"),
    ],
)
def test_bad_inputs_name_the_parameter(ops, call, exc, match):
    with pytest.raises(exc, match=match):
        call(ops.hashing)
