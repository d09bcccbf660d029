"""Paged KV cache management: block pool, prefix cache, eviction, groups, state slots,
offload."""

from .block import BlockContent, BlockList, KVCacheBlock
from .block_pool import BlockPool
from .coordinator import KVCacheCoordinator
from .events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVCacheMetrics,
    PrefixCacheStats,
)
from .eviction import ARCPolicy, KeyList, LRUPolicy, make_policy
from .manager import KVCacheBlocks, KVCacheManager
from .offload import BlockOffloader, CPUTier, DiskTier, OffloadManager
from .request_hashing import RequestBlockHasher, block_extra_keys
from .specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
    group_layers,
)

__all__ = [
    "ARCPolicy",
    "AllBlocksCleared",
    "BlockContent",
    "BlockList",
    "BlockOffloader",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "CPUTier",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "DiskTier",
    "FullAttentionSpec",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheEvent",
    "KVCacheGroup",
    "KVCacheSpec",
    "KVCacheManager",
    "KVCacheMetrics",
    "KeyList",
    "LRUPolicy",
    "MLASpec",
    "MambaSpec",
    "OffloadManager",
    "PrefixCacheStats",
    "RequestBlockHasher",
    "SlidingWindowSpec",
    "block_extra_keys",
    "group_layers",
    "make_policy",
]
