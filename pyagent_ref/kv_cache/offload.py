"""KV offload: keep evicted KV blocks in slower tiers (CPU memory, then local disk).

Blocks are addressed by keys derived from their prefix-cache identity
(`BlockOffloader.key`), so a block offloaded by one request is found by any later
request with the same prefix. Transfers are two-phase, as they are asynchronous on a
GPU: `prepare_store` reserves room and says what to copy, `complete_store` publishes
the copies; `prepare_load` pins what will be read so it cannot be evicted mid-copy,
`complete_load` unpins. Until `complete_store`, an entry is invisible to `lookup`.

Tiers are ordered fastest first. When a tier is full its policy (LRU or ARC) picks a
victim; the victim moves down to the next tier, or is dropped from the last one. Disk
files are written atomically (temporary file, then rename) and carry a checksum; a
missing, truncated or corrupted file is a miss, never wrong KV.

`BlockOffloader` connects the tiers to an engine's device KV cache, synchronously (the
engine's scheduler and model runner share one thread): a cached block the pool evicts is
stored at once, and a prefix lookup brings offloaded blocks back at once
(`KVCacheManager.enable_offload`). It needs neither the pins nor the two phases, which
exist for copies that run while the scheduler goes on.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .block import BlockContent, KVCacheBlock
from .events import BlockRemoved, BlockStored, KVCacheEvent
from .eviction import KeyList, make_policy


def _torch():
    import torch

    return torch


class CPUTier:
    """KV blocks in host memory (pinned when CUDA is present, for async copies)."""

    medium = "cpu"

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._data: dict[bytes, Any] = {}

    def write(self, key: bytes, src: Any) -> None:
        torch = _torch()
        dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=torch.cuda.is_available())
        dst.copy_(src, non_blocking=src.device.type != "cpu")
        self._data[key] = dst

    def get(self, key: bytes) -> Any | None:
        return self._data.get(key)

    def delete(self, key: bytes) -> None:
        self._data.pop(key, None)


class DiskTier:
    """KV blocks as files `<hash hex>.safetensors` under `directory`.

    Each file holds the tensor and, in its metadata, the SHA-256 of the tensor bytes;
    `get` recomputes it, so a corrupted file is detected and reported as a miss.
    """

    medium = "disk"

    def __init__(self, directory: str | os.PathLike, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}.safetensors"

    @staticmethod
    def _checksum(t: Any) -> str:
        return hashlib.sha256(t.contiguous().view(-1).view(_torch().uint8).numpy()).hexdigest()

    def write(self, key: bytes, src: Any) -> None:
        from safetensors.torch import save

        cpu = src.detach().to("cpu").contiguous()
        data = save({"kv": cpu}, metadata={"sha256": self._checksum(cpu)})
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: bytes) -> Any | None:
        from safetensors import safe_open

        try:
            with safe_open(self._path(key), framework="pt") as f:
                expected = (f.metadata() or {}).get("sha256")
                t = f.get_tensor("kv")
        except Exception:  # missing, truncated or garbled: a miss, not an error
            return None
        return t if expected == self._checksum(t) else None

    def delete(self, key: bytes) -> None:
        self._path(key).unlink(missing_ok=True)


@dataclass
class _TierState:
    tier: Any
    policy: Any
    ready: set[bytes] = field(default_factory=set)  # stored and published
    pending: set[bytes] = field(default_factory=set)  # reserved by prepare_store
    pins: dict[bytes, int] = field(default_factory=dict)  # readers in flight


@dataclass(frozen=True)
class StorePlan:
    """What `prepare_store` decided: hashes to copy into tier 0, and what it evicted."""

    to_store: tuple[bytes, ...]
    evicted: tuple[bytes, ...]


@dataclass(frozen=True)
class LoadPlan:
    """What `prepare_load` pinned: for each hash, the index of the tier holding it."""

    tiers: tuple[int, ...]
    hashes: tuple[bytes, ...]


class OffloadManager:
    """Tiered KV block storage keyed by block hash.

    Args:
        tiers: fastest first, e.g. [CPUTier(1024), DiskTier(path, 65536)].
        policy: "lru" or "arc", one instance per tier.
        enable_events: record `KVCacheEvent`s for `take_events` (an engine that never
            drains them turns this off).
    """

    def __init__(
        self, tiers: Sequence[Any], policy: str = "lru", enable_events: bool = True
    ) -> None:
        if not tiers:
            raise ValueError("tiers must not be empty")
        self._tiers = [
            _TierState(t, make_policy(policy, t.capacity_blocks, KeyList, lambda k: k))
            for t in tiers
        ]
        self._events: list[KVCacheEvent] | None = [] if enable_events else None
        self.hits = 0
        self.misses = 0

    def _holder(self, key: bytes) -> int | None:
        for i, state in enumerate(self._tiers):
            if key in state.ready:
                return i
        return None

    def lookup(self, hashes: Sequence[bytes]) -> int:
        """How many leading `hashes` are stored and published (in any tier)."""
        n = 0
        for key in hashes:
            if self._holder(key) is None:
                break
            n += 1
        return n

    def prepare_store(self, hashes: Sequence[bytes]) -> StorePlan | None:
        """Reserve room in tier 0 for the hashes not stored yet; None if pins prevent it."""
        top = self._tiers[0]
        new = [k for k in dict.fromkeys(hashes) if self._holder(k) is None and k not in top.pending]
        room = top.tier.capacity_blocks - len(top.ready) - len(top.pending)
        evictable = sum(1 for k in top.ready if not top.pins.get(k))
        if len(new) - room > evictable:
            return None
        evicted = [self._evict_one(0) for _ in range(max(0, len(new) - room))]
        top.pending.update(new)
        return StorePlan(tuple(new), tuple(evicted))

    def store(self, key: bytes, src: Any) -> None:
        """Copy one block's KV (a torch tensor on any device) into tier 0."""
        top = self._tiers[0]
        if key not in top.pending:
            raise ValueError(f"block {key.hex()} was not reserved by prepare_store")
        top.tier.write(key, src)

    def complete_store(self, hashes: Sequence[bytes], success: bool = True) -> None:
        """Publish stored blocks (or release the reservation if the copy failed)."""
        top = self._tiers[0]
        published = []
        for key in hashes:
            if key not in top.pending:
                continue
            top.pending.discard(key)
            if success:
                top.ready.add(key)
                top.policy.push(key, key, top.policy.readmit(key))
                published.append(key)
            else:
                top.tier.delete(key)
        if published:
            self._record(BlockStored(tuple(published), None, (), 0, top.tier.medium))

    def prepare_load(self, hashes: Sequence[bytes]) -> LoadPlan:
        """Pin the leading stored hashes for reading (stops at the first one missing)."""
        tiers, keys = [], []
        for key in hashes:
            i = self._holder(key)
            if i is None:
                break
            state = self._tiers[i]
            if not state.pins.get(key):
                state.policy.take(key)
            state.pins[key] = state.pins.get(key, 0) + 1
            tiers.append(i)
            keys.append(key)
        return LoadPlan(tuple(tiers), tuple(keys))

    def load(self, plan: LoadPlan, index: int, dst: Any) -> bool:
        """Copy block `index` of the plan into `dst`; False (and the entry dropped) if the
        stored copy is gone or corrupted — the caller recomputes that block."""
        state = self._tiers[plan.tiers[index]]
        key = plan.hashes[index]
        src = state.tier.get(key)
        if src is not None and src.shape == dst.shape and src.dtype == dst.dtype:
            dst.copy_(src, non_blocking=dst.device.type != "cpu")
            self.hits += 1
            return True
        self._lost(state, key)
        return False

    def read(self, key: bytes) -> Any | None:
        """The stored copy of `key` from the fastest tier holding it, for a caller that
        uses it before anything else runs (nothing is pinned); None if it is not stored,
        or its copy is gone or corrupted (the entry is dropped)."""
        level = self._holder(key)
        if level is None:
            return None
        state = self._tiers[level]
        data = state.tier.get(key)
        if data is None:
            self._lost(state, key)
            return None
        self.hits += 1
        if not state.pins.get(key):  # a reused entry now, and the most recent one
            state.policy.take(key)
            state.policy.push(key, key, True)
        return data

    def clear(self) -> None:
        """Drop every stored block (say, the model's weights changed).

        Raises:
            RuntimeError: a transfer is in flight (pinned or reserved blocks).
        """
        if any(state.pins or state.pending for state in self._tiers):
            raise RuntimeError("cannot clear offload tiers while transfers are in flight")
        for state in self._tiers:
            while len(state.policy):
                key = state.policy.pop()
                state.ready.discard(key)
                self._drop(state, key)

    def complete_load(self, plan: LoadPlan) -> None:
        """Unpin the plan's blocks; they become evictable again (as reused entries)."""
        for i, key in zip(plan.tiers, plan.hashes, strict=True):
            state = self._tiers[i]
            state.pins[key] -= 1
            if state.pins[key] == 0:
                del state.pins[key]
                if key in state.ready:
                    state.policy.push(key, key, True)

    def take_events(self) -> list[KVCacheEvent]:
        """The events recorded since the last call (empty if events are disabled)."""
        if self._events is None:
            return []
        events, self._events = self._events, []
        return events

    def _record(self, event: KVCacheEvent) -> None:
        if self._events is not None:
            self._events.append(event)

    def _evict_one(self, level: int) -> bytes:
        """Evict tier `level`'s victim, moving it down to the next tier if there is one
        (which may evict in turn), else dropping it."""
        state = self._tiers[level]
        key = state.policy.pop()
        state.ready.discard(key)
        data = state.tier.get(key) if level + 1 < len(self._tiers) else None
        self._drop(state, key)
        if data is not None:
            below = self._tiers[level + 1]
            full = len(below.ready) + len(below.pending) >= below.tier.capacity_blocks
            if full and len(below.policy):
                self._evict_one(level + 1)
                full = False
            if not full:
                below.tier.write(key, data)
                below.ready.add(key)
                below.policy.push(key, key, below.policy.readmit(key))
                self._record(BlockStored((key,), None, (), 0, below.tier.medium))
        return key

    def _drop(self, state: _TierState, key: bytes) -> None:
        state.tier.delete(key)
        self._record(BlockRemoved((key,), state.tier.medium))

    def _lost(self, state: _TierState, key: bytes) -> None:
        """A published entry whose copy turned out gone or corrupted: a miss, dropped."""
        self.misses += 1
        state.ready.discard(key)
        if not state.pins.get(key):
            state.policy.take(key)
        self._drop(state, key)


class BlockIO(Protocol):
    """The device KV of one block id in every layer of a KV cache group (the model
    runner provides it)."""

    def read_block(self, group_id: int, block_id: int) -> Any:
        """A copy of the block's KV, as one tensor."""
        ...

    def write_block(self, group_id: int, block_id: int, data: Any) -> None:
        """Overwrite the block's KV with `data`, a tensor as `read_block` returns."""
        ...


@dataclass(frozen=True)
class OffloadedBlock:
    """A block of a prefix hit that the offload tiers hold (under `key`), not the device."""

    key: bytes


class BlockOffloader:
    """Moves prefix-cache blocks between a device KV cache and the offload tiers.

    A block is stored under a key digesting `namespace` (what makes two engines' KV
    interchangeable: the model and the KV layout), its group id and its content (parent
    hash, tokens, extra keys — what the device cache verifies on a hit), so a hit here is
    as safe as a verified device hit, and a disk directory shared by engines of
    different layouts never mixes them.

    Args:
        tiers: the offload tiers.
        blocks: the device KV (`BlockIO`).
        namespace: the model and KV layout, e.g. the model name, dtype and group specs.
    """

    def __init__(self, tiers: OffloadManager, blocks: BlockIO, namespace: str) -> None:
        self.tiers = tiers
        self.blocks = blocks
        self.namespace = namespace

    def key(self, group_id: int, content: BlockContent) -> bytes:
        """SHA-256 of the namespace, the group id and the content, all by repr."""
        return hashlib.sha256(repr((self.namespace, group_id, content)).encode()).digest()

    def lookup(self, group_id: int, content: BlockContent) -> OffloadedBlock | None:
        """The offloaded copy of a block of `group_id` with this content, if stored."""
        key = self.key(group_id, content)
        return OffloadedBlock(key) if self.tiers.lookup([key]) else None

    def store(self, block: KVCacheBlock) -> None:
        """Copy a cached block's KV into the tiers (nothing if they hold it already)."""
        assert block.content is not None
        plan = self.tiers.prepare_store([self.key(block.group_id, block.content)])
        if plan is None:
            return  # every entry of the first tier is pinned: this block is not kept
        for key in plan.to_store:
            self.tiers.store(key, self.blocks.read_block(block.group_id, block.block_id))
        self.tiers.complete_store(plan.to_store)

    def load(self, offloaded: OffloadedBlock, group_id: int, block_id: int) -> bool:
        """Copy an offloaded block's KV into device block `block_id` of `group_id`;
        False if its stored copy is gone or corrupted (nothing is written)."""
        data = self.tiers.read(offloaded.key)
        if data is None:
            return False
        self.blocks.write_block(group_id, block_id, data)
        return True
