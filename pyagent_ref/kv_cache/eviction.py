"""Eviction policies: which evictable entry to give up when space is needed.

Both the block pool (entries: free blocks that still hold cached KV) and the offload
tiers (entries: stored block hashes) ask the same question, so the policies are written
once, over any list type with O(1) `append`, `remove`, `popleft`, `__contains__`:
`BlockList` for blocks (intrusive), `KeyList` for hashable keys.

Interface (what a cache calls):
    push(item, key, frequent)  item became evictable; `frequent` if it was reused
    take(item)                 item is in use again; it is no longer evictable
    pop() -> item              the victim; IndexError when nothing is evictable
    readmit(key) -> bool       key is being cached again; True if the policy
                               remembered evicting it (ARC treats it as frequent)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class OrderedList(Protocol[T]):
    def __len__(self) -> int: ...
    def __contains__(self, item: T) -> bool: ...
    def __iter__(self) -> Iterator[T]: ...
    def append(self, item: T) -> None: ...
    def remove(self, item: T) -> None: ...
    def popleft(self) -> T: ...


class KeyList(Generic[T]):
    """Insertion-ordered set of hashable keys with O(1) remove (an OrderedDict)."""

    def __init__(self) -> None:
        self._keys: OrderedDict[T, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: T) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[T]:
        return iter(self._keys)

    def append(self, key: T) -> None:
        if key in self._keys:
            raise ValueError(f"{key!r} is already in the list")
        self._keys[key] = None

    def remove(self, key: T) -> None:
        del self._keys[key]

    def popleft(self) -> T:
        if not self._keys:
            raise IndexError("pop from an empty list")
        return self._keys.popitem(last=False)[0]


class LRUPolicy(Generic[T]):
    """Least recently released first: one list, oldest at the head."""

    name = "lru"

    def __init__(self, make_list: Callable[[], OrderedList[T]]) -> None:
        self._items = make_list()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        """Evictable items in the order `pop` would return them."""
        return iter(self._items)

    def push(self, item: T, key: Hashable, frequent: bool = False) -> None:
        self._items.append(item)

    def take(self, item: T) -> None:
        self._items.remove(item)

    def pop(self) -> T:
        return self._items.popleft()

    def readmit(self, key: Hashable) -> bool:
        return False


class ARCPolicy(Generic[T]):
    """Adaptive Replacement Cache (Megiddo and Modha, FAST'03) over evictable entries.

    T1 holds entries used once (recency), T2 entries reused at least once
    (frequency); B1 and B2 remember the keys lately evicted from each. The target
    size `p` of T1 adapts: re-caching a key found in B1 means T1 was too small
    (p grows by max(|B2| / |B1|, 1)), one found in B2 means T2 was (p shrinks by
    max(|B1| / |B2|, 1)). The victim is T1's oldest while |T1| > p (or T2 is empty),
    else T2's oldest. Entries in use are not in T1/T2 at all: only evictable entries
    are counted, which is how ARC fits a cache whose residents can be pinned. A
    one-off scan fills T1 only, so it cannot flush a hot prefix held in T2.
    """

    name = "arc"

    def __init__(
        self, capacity: int, make_list: Callable[[], OrderedList[T]], key_of: Callable[[T], Any]
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.p = 0.0
        self._t1, self._t2 = make_list(), make_list()
        self._b1: KeyList[Hashable] = KeyList()
        self._b2: KeyList[Hashable] = KeyList()
        self._key_of = key_of

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __iter__(self) -> Iterator[T]:
        """Evictable items, T1 then T2 (the order `pop` uses while |T1| > p)."""
        yield from self._t1
        yield from self._t2

    def push(self, item: T, key: Hashable, frequent: bool = False) -> None:
        (self._t2 if frequent else self._t1).append(item)

    def take(self, item: T) -> None:
        (self._t1 if item in self._t1 else self._t2).remove(item)

    def pop(self) -> T:
        if not self._t1 and not self._t2:
            raise IndexError("nothing to evict")
        if self._t1 and (len(self._t1) > self.p or not self._t2):
            victim, ghosts = self._t1.popleft(), self._b1
        else:
            victim, ghosts = self._t2.popleft(), self._b2
        key = self._key_of(victim)
        if key not in self._b1 and key not in self._b2:
            ghosts.append(key)
        for ghost in (self._b1, self._b2):
            while len(ghost) > self.capacity:
                ghost.popleft()
        return victim

    def readmit(self, key: Hashable) -> bool:
        if key in self._b1:
            self.p = min(float(self.capacity), self.p + max(len(self._b2) / len(self._b1), 1.0))
            self._b1.remove(key)
            return True
        if key in self._b2:
            self.p = max(0.0, self.p - max(len(self._b1) / len(self._b2), 1.0))
            self._b2.remove(key)
            return True
        return False


EVICTION_POLICIES = ("lru", "arc")


def make_policy(name: str, capacity: int, make_list: Callable[[], Any], key_of: Callable) -> Any:
    """An eviction policy by name, one of EVICTION_POLICIES."""
    if name == "lru":
        return LRUPolicy(make_list)
    if name == "arc":
        return ARCPolicy(capacity, make_list, key_of)
    raise ValueError(f"eviction policy must be one of {EVICTION_POLICIES}, got {name!r}")
