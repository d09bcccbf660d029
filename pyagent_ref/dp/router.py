"""Which data-parallel replica serves a request: by load, with prefix-cache affinity.

A replica's load is its queue: the requests it holds (waiting or running) plus its KV
cache usage in [0, 1] (which only breaks ties between equal queues). Policies:

    round_robin   replicas in turn, whatever they hold
    p2c           power of two choices: two distinct replicas drawn at random, the less
                  loaded one wins (ties: the first drawn); near the least-loaded choice
                  at the cost of two looks, without herding onto one replica
    prefix        prefix-cache affinity: the replica caching the longest prefix of the
                  request's blocks, found by block hashes in a `PrefixIndex`, unless its
                  load exceeds the least load by more than `slack`; otherwise (or with
                  no block cached anywhere) p2c. Equal prefixes go to the less loaded.

The index is kept from each replica's KV events (`dp.kv_events`: BlockStored adds
hashes, BlockRemoved drops them, AllBlocksCleared empties it) and, so that a burst of
requests sharing a prefix is not spread before the first one's blocks are stored, from
the router's own decisions: a request's full-block hashes are noted at once for the
replica it went to (an eviction event drops them later like any other).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

POLICIES = ("round_robin", "p2c", "prefix")


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router reads of a replica: requests held, KV cache usage in [0, 1]."""

    num_requests: int
    kv_usage: float = 0.0

    @property
    def score(self) -> float:
        return self.num_requests + self.kv_usage


class PrefixIndex:
    """The block hashes each replica caches (external hashes: ints or bytes)."""

    def __init__(self, num_replicas: int) -> None:
        self.hashes: list[set] = [set() for _ in range(num_replicas)]

    def apply(self, replica: int, events: Iterable) -> None:
        """Apply a batch's events (`dp.kv_events` wire structs) of one replica."""
        cached = self.hashes[replica]
        for event in events:
            kind = type(event).__name__
            if kind == "BlockStored":
                cached.update(event.block_hashes)
            elif kind == "BlockRemoved":
                cached.difference_update(event.block_hashes)
            elif kind == "AllBlocksCleared":
                cached.clear()

    def note(self, replica: int, hashes: Sequence) -> None:
        """The router sent a request with these block hashes to `replica`."""
        self.hashes[replica].update(hashes)

    def matched_blocks(self, replica: int, hashes: Sequence) -> int:
        """How many leading blocks of `hashes` the replica caches (a chain stops at
        the first miss: a later block's hash covers every block before it)."""
        cached, n = self.hashes[replica], 0
        for h in hashes:
            if h not in cached:
                break
            n += 1
        return n


class Router:
    """Routes requests to one of `num_replicas` replicas (see the module docstring).

    Args:
        num_replicas: >= 1.
        policy: "round_robin", "p2c" or "prefix".
        slack: with "prefix", how much more load (requests) than the least loaded
            replica the replica with the longest cached prefix may have and still win.
        seed: the random draws of p2c (a router is reproducible given its inputs).
    Raises:
        ValueError: num_replicas < 1, an unknown policy, slack < 0.
    """

    def __init__(self, num_replicas: int, policy: str = "prefix", slack: float = 4.0, seed=0):
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int):
            raise TypeError(f"num_replicas must be an int, got {num_replicas!r}")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        self.num_replicas, self.policy, self.slack = num_replicas, policy, slack
        self.index = PrefixIndex(num_replicas)
        self._rng = random.Random(seed)
        self._next = 0

    def route(self, hashes: Sequence, loads: Sequence[ReplicaLoad]) -> int:
        """The replica for a request whose full blocks hash to `hashes` (external
        form, as in the events), given every replica's load; notes the hashes for it.

        Raises:
            ValueError: len(loads) != num_replicas.
        """
        if len(loads) != self.num_replicas:
            raise ValueError(f"loads must have {self.num_replicas} entries, got {len(loads)}")
        if self.policy == "round_robin":
            choice, self._next = self._next, (self._next + 1) % self.num_replicas
        elif self.policy == "p2c":
            choice = self._two_choices(loads)
        else:
            choice = self._by_prefix(hashes, loads)
        self.index.note(choice, hashes)
        return choice

    def _two_choices(self, loads: Sequence[ReplicaLoad]) -> int:
        if self.num_replicas == 1:
            return 0
        a, b = self._rng.sample(range(self.num_replicas), 2)
        return b if loads[b].score < loads[a].score else a

    def _by_prefix(self, hashes: Sequence, loads: Sequence[ReplicaLoad]) -> int:
        matched = [self.index.matched_blocks(r, hashes) for r in range(self.num_replicas)]
        best = max(range(self.num_replicas), key=lambda r: (matched[r], -loads[r].score))
        least = min(load.score for load in loads)
        if matched[best] > 0 and loads[best].score <= least + self.slack:
            return best
        return self._two_choices(loads)
