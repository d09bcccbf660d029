"""Which extra keys go on which block of a request, and its incremental block hashes.

The hash function itself is the op `ops.hashing.hash_blocks`; this module is the policy
around it. Block i of a request (tokens [i * B, (i + 1) * B)) carries, in this order:
    ("lora", id)                   on every block, when the request uses an adapter
    ("mm", hash, offset)           for every multimodal item whose span overlaps the
                                   block, by increasing offset
    ("salt", salt)                 on block 0 only: the chain carries it to the rest

The algorithm "sha256_cbor" hashes as vLLM does instead (its root, keys and encoding of
a block without keys: `vllm_hashing`), so that routers built for vLLM's KV events key
pyagent's blocks alike.
"""

from __future__ import annotations

from types import ModuleType

from .block import BlockContent
from .protocol import KVRequest
from .vllm_hashing import vllm_block_extra_keys, vllm_hash_block, vllm_root_hash

HASH_ALGORITHMS = ("sha256", "xxh3_128", "sha256_cbor")


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
        algorithm: "sha256" or "xxh3_128" (pyagent's scheme, `ops.hashing`), or
            "sha256_cbor" (vLLM's, `vllm_hashing`; its root reads PYTHONHASHSEED now).
    """

    def __init__(self, block_size: int, ops: ModuleType, algorithm: str = "sha256") -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if algorithm not in HASH_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {HASH_ALGORITHMS}, got {algorithm!r}")
        self.block_size = block_size
        self.algorithm = algorithm
        self._ops = ops
        self._hashing = ops.hashing
        self.vllm = algorithm == "sha256_cbor"
        self.root = vllm_root_hash(ops) if self.vllm else self._hashing.root_hash(algorithm)
        self._keys = vllm_block_extra_keys if self.vllm else block_extra_keys

    def update(self, request: KVRequest) -> None:
        """Append the hashes of the request's newly completed full blocks."""
        done = len(request.block_hashes)
        total = request.num_tokens // self.block_size
        if total <= done:
            return
        bs = self.block_size
        tokens = request.token_ids(done * bs, total * bs)
        keys = [self._keys(request, i, bs) for i in range(done, total)]
        parent = request.block_hashes[-1] if done else None
        if not self.vllm:
            request.block_hashes.extend(
                self._hashing.hash_blocks(tokens, bs, keys, self.algorithm, parent)
            )
            return
        prev = self.root if parent is None else parent
        for i, block_keys in enumerate(keys):
            prev = vllm_hash_block(self._ops, prev, tokens[i * bs : (i + 1) * bs], block_keys)
            request.block_hashes.append(prev)

    def content(self, request: KVRequest, index: int) -> BlockContent:
        """What block `index` of `request` hashes, to verify a cache hit on it."""
        bs = self.block_size
        return BlockContent(
            parent_hash=request.block_hashes[index - 1] if index else self.root,
            token_ids=tuple(request.token_ids(index * bs, (index + 1) * bs)),
            extra_keys=self._keys(request, index, bs) or (),
        )
