"""Prefix-cache block hashes in Rust: drop-in replacements for `pyagent_ref.ops.hashing`.

Same functions, signatures, exceptions and bytes as the reference (whose module
docstring specifies the encoding): hash_i = H(cbor([hash_{i-1}, tokens_i, keys_i])),
H = SHA-256 or XXH3-128 (big-endian digest, as xxhash's `digest()`). `hash_blocks`
hashes the whole chain in one native call with the GIL released. The xxhash package
is not needed.

Differences from the reference: token ids given as a torch tensor must be on the CPU
(TypeError otherwise); nesting deeper than Python's recursion limit (or 10000 levels)
in `cbor_encode` raises RecursionError at a slightly different depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as _np

from .. import _native
from . import _common as _c

__all__ = ["ALGORITHMS", "DIGEST_SIZES", "cbor_encode", "root_hash", "hash_block", "hash_blocks"]

ALGORITHMS = ("sha256", "xxh3_128")
DIGEST_SIZES = {"sha256": 32, "xxh3_128": 16}
ROOT_LABEL = "pyagent.prefix-cache.v1"
EXTRA_KEY_ARITY = {"lora": 2, "mm": 3, "salt": 2}

ExtraKey = tuple[Any, ...]

_CODES = {"sha256": 0, "xxh3_128": 1}
_ROOTS: dict[int, bytes] = {}


def _algorithm_code(algorithm: Any) -> int:
    """The reference's `_digest` dispatch (equality with the names)."""
    if algorithm == "sha256":
        return 0
    if algorithm == "xxh3_128":
        return 1
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def _root(code: int) -> bytes:
    root = _ROOTS.get(code)
    if root is None:
        root = _ROOTS[code] = _native.root_hash(code)
    return root


def _check_parent(parent: Any, algorithm: Any, name: str) -> bytes:
    size = DIGEST_SIZES.get(algorithm)
    if size is None:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if not isinstance(parent, (bytes, bytearray)):
        raise TypeError(f"{name} must be bytes, got {type(parent).__name__}")
    if len(parent) != size:
        raise ValueError(f"{name} must be {size} bytes for {algorithm}, got {len(parent)} bytes")
    return bytes(parent)


def _tokens(token_ids: Any, name: str = "token_ids") -> _np.ndarray:
    """Token ids (sequence or 1-D integer array) as a contiguous uint64 array."""
    if hasattr(token_ids, "dtype"):
        kind = _c.dtype_name(token_ids)
        if "int" not in kind:
            raise TypeError(f"{name} must hold integers, got dtype {kind}")
        if token_ids.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(token_ids.shape)}")
        if _c.is_torch(token_ids):
            _c.check_cpu(token_ids, name)
            if str(token_ids.dtype).startswith("torch.q"):  # quantized ints: go by value
                return _native.tokens_from_seq(token_ids.tolist(), name)
            arr = _c.tensor_to_numpy(token_ids)
        else:
            arr = _np.asarray(token_ids)
        if arr.dtype.kind == "u":
            return _c.native_array(arr.astype(_np.uint64, copy=False))
        if arr.dtype.kind == "i":
            signed = _c.native_array(arr.astype(_np.int64, copy=False))
            row = _native.first_bad(signed, _c.Check.NONNEG)
            if row >= 0:
                raise ValueError(f"{name}[{row}] must be in [0, 2**64), got {int(signed[row])}")
            return signed.view(_np.uint64)
        return _native.tokens_from_seq(list(token_ids.tolist()), name)
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(token_ids).__name__}")
    if not isinstance(token_ids, (list, tuple)):
        token_ids = list(token_ids)
    return _native.tokens_from_seq(token_ids, name)


def cbor_encode(value: Any) -> bytes:
    """Deterministic CBOR (RFC 8949 4.2.1) of ints, bytes, str and lists/tuples of them.

    Contract: `pyagent_ref.ops.hashing.cbor_encode`.
    """
    return _native.cbor_encode(value)


def root_hash(algorithm: str = "sha256") -> bytes:
    """The parent of a sequence's first block: H(cbor("pyagent.prefix-cache.v1"))."""
    return _root(_algorithm_code(algorithm))


def hash_block(
    parent_hash: bytes,
    token_ids: Any,
    extra_keys: Sequence[ExtraKey] = (),
    algorithm: str = "sha256",
) -> bytes:
    """Hash one block: H(cbor([parent_hash, token_ids, extra_keys])).

    Contract: `pyagent_ref.ops.hashing.hash_block`.
    """
    parent = _check_parent(parent_hash, algorithm, "parent_hash")
    tokens = _tokens(token_ids)
    return _native.hash_block(parent, tokens, extra_keys, _CODES[algorithm])


def hash_blocks(
    token_ids: Any,
    block_size: int,
    extra_keys: Sequence[Sequence[ExtraKey]] | None = None,
    algorithm: str = "sha256",
    parent: bytes | None = None,
) -> list[bytes]:
    """Chained hashes of every full block of `token_ids`; a trailing partial block is skipped.

    Contract: `pyagent_ref.ops.hashing.hash_blocks`.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if parent is None:
        code = _algorithm_code(algorithm)
        prev = None
    else:
        prev = _check_parent(parent, algorithm, "parent")
        code = _CODES[algorithm]
    tokens = _tokens(token_ids)
    num_blocks = len(tokens) // block_size
    if extra_keys is not None and len(extra_keys) != num_blocks:
        raise ValueError(
            f"extra_keys must have one entry per full block ({num_blocks}), got {len(extra_keys)}"
        )
    if num_blocks == 0:
        return []
    if extra_keys is not None and not isinstance(extra_keys, (list, tuple)):
        extra_keys = [extra_keys[i] for i in range(num_blocks)]
    return _native.hash_blocks(
        tokens, block_size, extra_keys, code, _root(code) if prev is None else prev
    )
