"""Which extra keys go on which block of a request, and its incremental block hashes.

The hash function itself is the op `ops.hashing.hash_blocks`; this module is the policy
around it. Block i of a request (tokens [i * B, (i + 1) * B)) carries, in this order:
    ("lora", id)                   on every block, when the request uses an adapter
    ("mm", hash, offset)           for every multimodal item whose span overlaps the
                                   block, by increasing offset
    ("salt", salt)                 on block 0 only: the chain carries it to the rest
"""

from __future__ import annotations

from types import ModuleType

from .block import BlockContent
from .protocol import KVRequest


def block_extra_keys(request: KVRequest, index: int, block_size: int) -> tuple[tuple, ...]:
    """The extra keys of block `index` of `request` (see the module docstring)."""
    start, end = index * block_size, (index + 1) * block_size
    keys: list[tuple] = []
    if request.lora_id is not None:
        keys.append(("lora", request.lora_id))
    for mm in sorted(request.mm_features, key=lambda f: f.offset):
        if mm.offset < end and mm.offset + mm.length > start:
            keys.append(("mm", mm.content_hash, mm.offset))
    if index == 0 and request.cache_salt is not None:
        keys.append(("salt", request.cache_salt))
    return tuple(keys)


class RequestBlockHasher:
    """Keeps `request.block_hashes` up to date as the request's tokens grow.

    Args:
        block_size: tokens per block.
        ops: the ops namespace (`pyagent_ref.ops.load(...)`); its `hashing.hash_blocks`
            does the hashing, so the accelerated ops speed this up.
        algorithm: "sha256" or "xxh3_128".
    """

    def __init__(self, block_size: int, ops: ModuleType, algorithm: str = "sha256") -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.algorithm = algorithm
        self._hashing = ops.hashing
        self.root = self._hashing.root_hash(algorithm)

    def update(self, request: KVRequest) -> None:
        """Append the hashes of the request's newly completed full blocks."""
        done = len(request.block_hashes)
        total = request.num_tokens // self.block_size
        if total <= done:
            return
        tokens = request.token_ids(done * self.block_size, total * self.block_size)
        keys = [block_extra_keys(request, i, self.block_size) for i in range(done, total)]
        parent = request.block_hashes[-1] if done else None
        request.block_hashes.extend(
            self._hashing.hash_blocks(tokens, self.block_size, keys, self.algorithm, parent)
        )

    def content(self, request: KVRequest, index: int) -> BlockContent:
        """What block `index` of `request` hashes, to verify a cache hit on it."""
        bs = self.block_size
        return BlockContent(
            parent_hash=request.block_hashes[index - 1] if index else self.root,
            token_ids=tuple(request.token_ids(index * bs, (index + 1) * bs)),
            extra_keys=block_extra_keys(request, index, bs),
        )
