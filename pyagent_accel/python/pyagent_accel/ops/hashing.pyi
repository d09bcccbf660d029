from collections.abc import Sequence
from typing import Any

__all__ = ["ALGORITHMS", "DIGEST_SIZES", "cbor_encode", "root_hash", "hash_block", "hash_blocks"]

ALGORITHMS: tuple[str, ...]
DIGEST_SIZES: dict[str, int]
ROOT_LABEL: str
EXTRA_KEY_ARITY: dict[str, int]

ExtraKey = tuple[Any, ...]

def cbor_encode(value: Any) -> bytes: ...
def root_hash(algorithm: str = "sha256") -> bytes: ...
def hash_block(
    parent_hash: bytes,
    token_ids: Any,
    extra_keys: Sequence[ExtraKey] = (),
    algorithm: str = "sha256",
) -> bytes: ...
def hash_blocks(
    token_ids: Any,
    block_size: int,
    extra_keys: Sequence[Sequence[ExtraKey]] | None = None,
    algorithm: str = "sha256",
    parent: bytes | None = None,
) -> list[bytes]: ...
