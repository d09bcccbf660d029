"""KV cache events and metrics, as plain data for a metrics layer or a KV router.

Events describe changes to the set of cached block hashes, in the order they happened
(the shape vLLM publishes to KV-aware routers). Metrics are snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockStored:
    """Blocks entered the prefix cache (consecutive blocks of one request)."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str = "device"
    lora_id: int | None = None  # the adapter the blocks were computed with, if any


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted, or dropped from an offload tier)."""

    block_hashes: tuple[bytes, ...]
    medium: str = "device"


@dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was reset."""

    medium: str = "device"


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class ResidencyStats:
    """How long cached content stayed before eviction, in seconds (running moments)."""

    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def record(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups: tokens asked for and tokens found, over requests (`hits`
    includes the blocks brought back from the KV offload tiers, `onboarded_blocks`)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    evictions: int = 0
    collisions: int = 0
    onboarded_blocks: int = 0
    residency: ResidencyStats = field(default_factory=ResidencyStats)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class KVCacheMetrics:
    """A snapshot for export: usage in [0, 1] plus the cumulative prefix-cache stats."""

    num_blocks: int
    num_free_blocks: int
    usage: float
    requests: int
    queries: int
    hits: int
    hit_rate: float
    evictions: int
    collisions: int
    mean_residency_s: float
    max_residency_s: float
    onboarded_blocks: int = 0
