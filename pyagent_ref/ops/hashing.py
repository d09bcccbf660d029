"""Prefix-cache block hashes: chained, content-addressed keys for full KV blocks.

A KV block holding tokens [i * block_size, (i + 1) * block_size) of a sequence is
reusable by another request exactly when everything that determined its KV is equal:
the tokens of this block, every token before it, and whatever else changes the KV
(the LoRA adapter, multimodal inputs, a cache salt). The hash of block i therefore
covers the hash of block i - 1 (its parent), its own tokens and its extra keys:

    hash_i = H(cbor([hash_{i-1}, [t_0, ..., t_{block_size-1}], [key, ...]]))
    hash_{-1} = root_hash(algorithm) = H(cbor("pyagent.prefix-cache.v1"))

`cbor` is the deterministic encoding of RFC 8949 section 4.2.1 restricted to what
appears here (unsigned and negative integers, byte strings, text strings, arrays, all
with the shortest head), so any language reproduces the bytes. H is SHA-256 (32-byte
digest) or XXH3-128 (16-byte digest, big-endian, as xxhash's `digest()`).

Extra keys are tagged tuples, encoded as CBOR arrays in the order given:
    ("lora", name_or_id)       the adapter the block was computed with (str or int)
    ("mm", content_hash, offset)  a multimodal item overlapping the block: its content
                               hash (str or bytes) and its start offset in the prompt
    ("salt", salt)             a cache salt (str), usually on the first block only
Which keys go on which block is the caller's policy (see `pyagent_ref.kv_cache`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

__all__ = ["ALGORITHMS", "DIGEST_SIZES", "cbor_encode", "root_hash", "hash_block", "hash_blocks"]

ALGORITHMS = ("sha256", "xxh3_128")
DIGEST_SIZES = {"sha256": 32, "xxh3_128": 16}
ROOT_LABEL = "pyagent.prefix-cache.v1"
EXTRA_KEY_ARITY = {"lora": 2, "mm": 3, "salt": 2}

ExtraKey = tuple[Any, ...]


def _head(major: int, n: int) -> bytes:
    """A CBOR head: major type in the top 3 bits, the argument n in the shortest form."""
    if n < 24:
        return bytes([major << 5 | n])
    for info, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | info]) + struct.pack(fmt, n)
    raise ValueError(f"integer {n} does not fit in 64 bits")


def cbor_encode(value: Any) -> bytes:
    """Deterministic CBOR (RFC 8949 4.2.1) of ints, bytes, str and lists/tuples of them.

    Raises:
        TypeError: a value of any other type (bool and float included).
        ValueError: an integer outside [-2**64, 2**64).
    """
    if isinstance(value, bool):
        raise TypeError(f"cannot encode {value!r}: bool is not part of the encoding")
    if isinstance(value, int):
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, (bytes, bytearray)):
        return _head(2, len(value)) + bytes(value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return _head(3, len(raw)) + raw
    if isinstance(value, (list, tuple)):
        return _head(4, len(value)) + b"".join(cbor_encode(v) for v in value)
    raise TypeError(f"cannot encode a value of type {type(value).__name__}")


def _digest(data: bytes, algorithm: str) -> bytes:
    if algorithm == "sha256":
        return hashlib.sha256(data).digest()
    if algorithm == "xxh3_128":
        try:
            import xxhash
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError(
                "algorithm 'xxh3_128' needs the xxhash package: pip install 'pyagent[hashing]'"
            ) from None
        return xxhash.xxh3_128(data).digest()
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def root_hash(algorithm: str = "sha256") -> bytes:
    """The parent of a sequence's first block: H(cbor("pyagent.prefix-cache.v1"))."""
    return _digest(cbor_encode(ROOT_LABEL), algorithm)


def _check_extra_keys(keys: Any, name: str) -> list[list[Any]]:
    if not isinstance(keys, (list, tuple)):
        raise TypeError(f"{name} must be a sequence of tagged tuples, got {keys!r}")
    checked = []
    for key in keys:
        if not isinstance(key, (list, tuple)) or not key or key[0] not in EXTRA_KEY_ARITY:
            raise ValueError(
                f"{name} entries must be tuples tagged {sorted(EXTRA_KEY_ARITY)}, got {key!r}"
            )
        tag = key[0]
        if len(key) != EXTRA_KEY_ARITY[tag]:
            raise ValueError(
                f"{name}: a {tag!r} key has {EXTRA_KEY_ARITY[tag]} fields, got {key!r}"
            )
        ok = {
            "lora": lambda k: isinstance(k[1], (str, int)) and not isinstance(k[1], bool),
            "mm": lambda k: (
                isinstance(k[1], (str, bytes))
                and isinstance(k[2], int)
                and not isinstance(k[2], bool)
                and k[2] >= 0
            ),
            "salt": lambda k: isinstance(k[1], str),
        }[tag](key)
        if not ok:
            raise ValueError(f"{name}: malformed {tag!r} key {key!r}")
        checked.append(list(key))
    return checked


def _token_list(token_ids: Any, name: str = "token_ids") -> list[int]:
    """Token ids (sequence or 1-D integer array) as a list of Python ints in [0, 2**64)."""
    if hasattr(token_ids, "dtype"):
        kind = str(token_ids.dtype).removeprefix("torch.")
        if "int" not in kind:
            raise TypeError(f"{name} must hold integers, got dtype {kind}")
        if token_ids.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(token_ids.shape)}")
        tokens = token_ids.tolist()
    elif isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {type(token_ids).__name__}")
    else:
        tokens = list(token_ids)
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"{name}[{i}] must be an int, got {t!r}")
        if not 0 <= t < 1 << 64:
            raise ValueError(f"{name}[{i}] must be in [0, 2**64), got {t}")
    return tokens


def _check_parent(parent: Any, algorithm: str, name: str) -> bytes:
    size = DIGEST_SIZES.get(algorithm)
    if size is None:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if not isinstance(parent, (bytes, bytearray)):
        raise TypeError(f"{name} must be bytes, got {type(parent).__name__}")
    if len(parent) != size:
        raise ValueError(f"{name} must be {size} bytes for {algorithm}, got {len(parent)} bytes")
    return bytes(parent)


def hash_block(
    parent_hash: bytes,
    token_ids: Any,
    extra_keys: Sequence[ExtraKey] = (),
    algorithm: str = "sha256",
) -> bytes:
    """Hash one block: H(cbor([parent_hash, token_ids, extra_keys])).

    Args:
        parent_hash: the previous block's hash, or `root_hash(algorithm)` for block 0;
            exactly the algorithm's digest size.
        token_ids: the block's tokens, a sequence of ints or a 1-D integer array, each
            in [0, 2**64). Any length (the caller decides what a full block is).
        extra_keys: tagged tuples (see the module docstring), in a fixed order.
        algorithm: "sha256" or "xxh3_128".
    Returns:
        The digest, 32 bytes (sha256) or 16 bytes (xxh3_128).
    Raises:
        TypeError: a parent that is not bytes, non-integer tokens, extra_keys that is not
            a sequence.
        ValueError: unknown algorithm, wrong parent length, a token out of range, an
            extra key that is not a tuple with a known tag, or a malformed one.
    """
    parent = _check_parent(parent_hash, algorithm, "parent_hash")
    tokens = _token_list(token_ids)
    keys = _check_extra_keys(extra_keys, "extra_keys")
    return _digest(cbor_encode([parent, tokens, keys]), algorithm)


def hash_blocks(
    token_ids: Any,
    block_size: int,
    extra_keys: Sequence[Sequence[ExtraKey]] | None = None,
    algorithm: str = "sha256",
    parent: bytes | None = None,
) -> list[bytes]:
    """Chained hashes of every full block of `token_ids`; a trailing partial block is skipped.

    hashes[0] = hash_block(parent or root_hash(algorithm), token_ids[:block_size],
    extra_keys[0], algorithm) and hashes[i] chains on hashes[i - 1].

    Args:
        token_ids: a sequence of ints or a 1-D integer array.
        block_size: int >= 1.
        extra_keys: None (no keys on any block) or one sequence of tagged tuples per
            full block, len(extra_keys) == len(token_ids) // block_size.
        algorithm: "sha256" or "xxh3_128".
        parent: the hash the first block chains on; None means the root hash.
    Returns:
        A list of len(token_ids) // block_size digests.
    Raises:
        TypeError / ValueError: as `hash_block`, plus block_size < 1 and an extra_keys
            list of the wrong length.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    prev = root_hash(algorithm) if parent is None else _check_parent(parent, algorithm, "parent")
    tokens = _token_list(token_ids)
    num_blocks = len(tokens) // block_size
    if extra_keys is not None and len(extra_keys) != num_blocks:
        raise ValueError(
            f"extra_keys must have one entry per full block ({num_blocks}), got {len(extra_keys)}"
        )
    hashes = []
    for i in range(num_blocks):
        keys = () if extra_keys is None else extra_keys[i]
        block = tokens[i * block_size : (i + 1) * block_size]
        prev = hash_block(prev, block, keys, algorithm)
        hashes.append(prev)
    return hashes
