"""The encoder cache: which images' encoder outputs the runner holds, in tokens.

A vision encoder's output for an image (its decoder rows, `encode_images`) is computed
once and kept while any request still has the image's placeholders to compute: a
prefill chunk that cuts through an image reads its rows from here, and another request
with the same image (the same content hash) reads the same entry instead of encoding
again. The scheduler owns this bookkeeping; the runner holds the tensors and drops those
the scheduler evicts (`SchedulerOutput.free_encoder_hashes`).

Capacity is counted in decoder positions (an image's placeholder count). An entry is
referenced by the requests using it; one without references stays cached (a later
request may hit it) until its room is needed, least recently released first.
"""

from __future__ import annotations

from collections import OrderedDict


class EncoderCacheManager:
    """Reference-counted entries of content hash -> size, within `capacity` tokens.

    Raises:
        ValueError: capacity < 1.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"encoder cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.sizes: dict[str, int] = {}
        self.refs: dict[str, set[str]] = {}
        self.held: dict[str, set[str]] = {}  # request -> the hashes it references
        self.unreferenced: OrderedDict[str, None] = OrderedDict()  # evictable, oldest first
        self.evicted: list[str] = []  # not yet reported to the runner
        self.hits = 0
        self.misses = 0

    @property
    def used(self) -> int:
        return sum(self.sizes.values())

    def has(self, content_hash: str) -> bool:
        return content_hash in self.sizes

    def can_allocate(self, size: int, keep: set[str] = frozenset()) -> bool:
        """Whether `size` tokens of new entries fit, evicting unreferenced entries other
        than those in `keep` (entries about to be referenced) if needed."""
        free = self.capacity - self.used
        return size <= free + sum(self.sizes[h] for h in self.unreferenced if h not in keep)

    def reference(self, request_id: str, content_hash: str) -> None:
        """`request_id` uses the cached entry: a hit the first time it does."""
        holders = self.refs[content_hash]
        if request_id not in holders:
            self.hits += 1
            holders.add(request_id)
            self.held.setdefault(request_id, set()).add(content_hash)
        self.unreferenced.pop(content_hash, None)

    def allocate(self, request_id: str, content_hash: str, size: int) -> None:
        """Room for a new entry that `request_id` uses (a miss: the runner encodes it
        this step), evicting unreferenced entries, oldest first.

        Raises:
            ValueError: it does not fit (check `can_allocate` first), or it is cached.
        """
        if content_hash in self.sizes or not self.can_allocate(size):
            raise ValueError(f"cannot allocate encoder cache entry {content_hash[:12]} of {size}")
        while self.capacity - self.used < size:
            victim, _ = self.unreferenced.popitem(last=False)
            del self.sizes[victim], self.refs[victim]
            self.evicted.append(victim)
        self.misses += 1
        self.sizes[content_hash] = size
        self.refs[content_hash] = {request_id}
        self.held.setdefault(request_id, set()).add(content_hash)

    def release(self, request_id: str, content_hash: str) -> None:
        """`request_id` no longer needs the entry (no effect if it held no reference)."""
        holders = self.refs.get(content_hash)
        if holders is None or request_id not in holders:
            return
        holders.discard(request_id)
        self.held[request_id].discard(content_hash)
        if not self.held[request_id]:
            del self.held[request_id]
        if not holders:
            self.unreferenced[content_hash] = None

    def release_all(self, request_id: str) -> None:
        """`request_id` ended or lost its KV (preemption): drop all its references."""
        for content_hash in list(self.held.get(request_id, ())):
            self.release(request_id, content_hash)

    def discard(self, content_hash: str) -> None:
        """Drop an entry whatever its references (its encoding failed: the runner may not
        hold it); reported as evicted. No effect on a hash not cached."""
        if content_hash not in self.sizes:
            return
        for request_id in self.refs.pop(content_hash):
            self.held[request_id].discard(content_hash)
            if not self.held[request_id]:
                del self.held[request_id]
        del self.sizes[content_hash]
        self.unreferenced.pop(content_hash, None)
        self.evicted.append(content_hash)

    def take_evicted(self) -> list[str]:
        """The hashes evicted since the last call (the runner drops their tensors)."""
        out, self.evicted = self.evicted, []
        return out

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
