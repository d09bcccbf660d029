"""vLLM's `sha256_cbor` prefix-cache block hashes, byte for byte.

A router built for vLLM's KV events keys a replica's cache by vLLM's block hashes; an
engine that hashes its blocks the same way can be routed by it unchanged. With the
hash algorithm "sha256_cbor" (`EngineConfig.prefix_caching_hash_algo`) pyagent hashes
as vLLM does under `--prefix-caching-hash-algo sha256_cbor`:

    hash_i    = SHA-256(cbor([hash_{i-1}, [t_0, ..., t_{B-1}], keys_i or null]))
    hash_{-1} = SHA-256(cbor(seed)),  seed = $PYTHONHASHSEED if set, else "vllm-none-hash"

`cbor` is the same deterministic encoding as `ops.hashing.cbor_encode` (what vLLM's
`cbor2.dumps(..., canonical=True)` writes for these values), plus null (0xf6) for a
block without extra keys. The differences from pyagent's own scheme
(`ops.hashing`) are exactly three: the root's label, null instead of an empty array,
and the keys' shapes, which are vLLM's untagged ones, in this order:
    lora_name                          on every block, when the request uses an adapter
    (mm identifier, offset - start)    per multimodal item overlapping the block, its
                                       offset relative to the block's first token
    cache_salt                         on block 0 only, when non-empty
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .protocol import KVRequest

__all__ = ["DEFAULT_SEED", "vllm_block_extra_keys", "vllm_hash_block", "vllm_root_hash"]

DEFAULT_SEED = "vllm-none-hash"  # vLLM's seed for cryptographic hashes without PYTHONHASHSEED
CBOR_NULL = b"\xf6"
CBOR_ARRAY_OF_3 = b"\x83"


def vllm_root_hash(ops: ModuleType, seed: str | None = None) -> bytes:
    """vLLM's NONE_HASH for sha256_cbor: SHA-256 of the CBOR text string `seed`; None
    reads PYTHONHASHSEED and falls back to "vllm-none-hash", as vLLM does at start."""
    if seed is None:
        seed = os.environ.get("PYTHONHASHSEED", DEFAULT_SEED)
    if not isinstance(seed, str):
        raise TypeError(f"seed must be a str, got {type(seed).__name__}")
    return hashlib.sha256(ops.hashing.cbor_encode(seed)).digest()


def vllm_hash_block(
    ops: ModuleType, parent: bytes, tokens: Sequence[int], keys: tuple[Any, ...] | None
) -> bytes:
    """SHA-256(cbor([parent, tokens, keys])) with keys None encoded as CBOR null."""
    encode = ops.hashing.cbor_encode
    tail = CBOR_NULL if keys is None else encode(list(keys))
    return hashlib.sha256(CBOR_ARRAY_OF_3 + encode(parent) + encode(list(tokens)) + tail).digest()


def vllm_block_extra_keys(
    request: KVRequest, index: int, block_size: int
) -> tuple[Any, ...] | None:
    """vLLM's extra keys of block `index` (see the module docstring); None when none.

    Raises:
        ValueError: the request has a LoRA adapter but no `lora_name` (vLLM keys
            adapters by name; dropping the key would share KV across adapters).
    """
    start, end = index * block_size, (index + 1) * block_size
    keys: list[Any] = []
    if request.lora_id is not None:
        name = getattr(request, "lora_name", None)
        if not isinstance(name, str):
            raise ValueError(
                f"request {request.request_id!r} has lora_id {request.lora_id} but no "
                f"lora_name: sha256_cbor hashes key adapters by name"
            )
        keys.append(name)
    for mm in sorted(request.mm_features, key=lambda f: f.offset):
        if mm.offset < end and mm.offset + mm.length > start:
            keys.append((mm.content_hash, mm.offset - start))
    if index == 0 and request.cache_salt:
        keys.append(request.cache_salt)
    return tuple(keys) if keys else None
