"""Waiting-queue policies: who is admitted next, and who is preempted first.

Every policy keeps preempted requests apart and hands them out first (they already
waited once and hold generated tokens), then orders new requests its own way:

    fcfs      arrival order
    priority  lowest `priority` value first, arrival breaks ties
    deadline  earliest `deadline` first (EDF), arrival breaks ties
    fair      the client that has received the fewest scheduled tokens so far
              (`charge` accounts them), arrival order within a client
    mlfq      multi-level feedback: new requests enter level 0; a request drops a
              level each time it consumes `quantum * 2**level` scheduled tokens; one
              that waited `aging_s` seconds rises a level; lowest level first

`victim(running)` names the running request to preempt when the KV cache cannot grow:
the one the policy values least (fcfs: latest arrival; priority: lowest priority, then
latest arrival; deadline: latest deadline; fair: of the most-served client; mlfq:
deepest level, then latest arrival).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence

from .request import Request, RequestStatus


class WaitingQueue:
    """Base: preempted requests first (FIFO), then the policy's order (`_key`)."""

    name = "fcfs"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._resumed: deque[Request] = deque()
        self._heap: list[tuple[tuple, int, Request]] = []
        self._removed: set[str] = set()
        self._seq = itertools.count()
        self._clock = clock

    def _key(self, request: Request) -> tuple:
        return (request.times.arrival,)

    def victim_key(self, request: Request) -> tuple:
        """Larger is preempted first."""
        return (request.times.arrival,)

    # --- queue ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._resumed) + len(self._heap) - len(self._removed)

    def __iter__(self) -> Iterator[Request]:
        """The waiting requests in admission order (without removing them)."""
        yield from self._resumed
        live = [e for e in self._heap if e[2].request_id not in self._removed]
        yield from (e[2] for e in sorted(live, key=lambda e: (self._key(e[2]), e[1])))

    def push(self, request: Request) -> None:
        """Queue a new request."""
        heapq.heappush(self._heap, (self._key(request), next(self._seq), request))

    def push_preempted(self, request: Request) -> None:
        """Queue a preempted request: it is admitted before every new one."""
        self._resumed.append(request)

    def peek(self) -> Request:
        if self._resumed:
            return self._resumed[0]
        self._refresh()
        self._drop_removed()
        if not self._heap:
            raise IndexError("the waiting queue is empty")
        return self._heap[0][2]

    def pop(self) -> Request:
        request = self.peek()
        if self._resumed and self._resumed[0] is request:
            self._resumed.popleft()
        else:
            heapq.heappop(self._heap)
        return request

    def requeue(self, requests: Sequence[Request]) -> None:
        """Put back requests popped in this order but not admitted, at their places:
        preempted ones at the front of the resumed (still before every new one), new
        ones by the policy's key."""
        resumed = [r for r in requests if r.status == RequestStatus.PREEMPTED]
        self._resumed.extendleft(reversed(resumed))
        for request in requests:
            if request.status != RequestStatus.PREEMPTED:
                self.push(request)

    def remove(self, request: Request) -> None:
        """Drop a waiting request (aborted); lazy for the heap, O(n) for the resumed."""
        if request in self._resumed:
            self._resumed.remove(request)
        elif any(entry[2] is request for entry in self._heap):
            self._removed.add(request.request_id)

    def victim(self, running: Sequence[Request]) -> Request:
        return max(running, key=self.victim_key)

    def charge(self, request: Request, num_tokens: int) -> None:
        """Account `num_tokens` scheduled for `request` (used by fair and mlfq)."""

    def _drop_removed(self) -> None:
        while self._heap and self._heap[0][2].request_id in self._removed:
            self._removed.discard(heapq.heappop(self._heap)[2].request_id)

    def _refresh(self) -> None:
        """Re-key the heap if the policy's order changed since the last look."""


class PriorityQueue(WaitingQueue):
    name = "priority"

    def _key(self, request: Request) -> tuple:
        return (request.priority, request.times.arrival)

    def victim_key(self, request: Request) -> tuple:
        return (request.priority, request.times.arrival)


class DeadlineQueue(WaitingQueue):
    name = "deadline"

    def _key(self, request: Request) -> tuple:
        return (request.deadline, request.times.arrival)

    def victim_key(self, request: Request) -> tuple:
        return (request.deadline, request.times.arrival)


class _RekeyedQueue(WaitingQueue):
    """A policy whose order changes as service is charged or time passes: the heap is
    rebuilt when asked (O(n), n = waiting requests)."""

    def _refresh(self) -> None:
        live = [e for e in self._heap if e[2].request_id not in self._removed]
        self._removed.clear()
        self._heap = [(self._key(r), seq, r) for _, seq, r in live]
        heapq.heapify(self._heap)


class FairShareQueue(_RekeyedQueue):
    name = "fair"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.service: defaultdict[str, int] = defaultdict(int)

    def _key(self, request: Request) -> tuple:
        return (self.service[request.client_id], request.times.arrival)

    def victim_key(self, request: Request) -> tuple:
        return (self.service[request.client_id], request.times.arrival)

    def charge(self, request: Request, num_tokens: int) -> None:
        self.service[request.client_id] += num_tokens


class MLFQQueue(_RekeyedQueue):
    name = "mlfq"

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        levels: int = 4,
        quantum: int = 256,
        aging_s: float = 5.0,
    ) -> None:
        super().__init__(clock)
        if levels < 1 or quantum < 1 or aging_s <= 0:
            raise ValueError(
                f"mlfq needs levels >= 1, quantum >= 1, aging_s > 0, "
                f"got {levels}, {quantum}, {aging_s}"
            )
        self.levels, self.quantum, self.aging_s = levels, quantum, aging_s
        self.level: dict[str, int] = {}
        self.used: defaultdict[str, int] = defaultdict(int)

    def level_of(self, request: Request) -> int:
        """The request's level now, after aging (one level up per aging_s waited)."""
        base = self.level.get(request.request_id, 0)
        since = request.times.queued if request.times.queued is not None else request.times.arrival
        waited = self._clock() - since
        return max(0, base - int(waited // self.aging_s))

    def _key(self, request: Request) -> tuple:
        return (self.level_of(request), request.times.arrival)

    def victim_key(self, request: Request) -> tuple:
        return (self.level.get(request.request_id, 0), request.times.arrival)

    def charge(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        self.used[rid] += num_tokens
        level = self.level.get(rid, 0)
        while level + 1 < self.levels and self.used[rid] >= self.quantum * 2**level:
            self.used[rid] -= self.quantum * 2**level
            level += 1
        self.level[rid] = level


POLICIES: dict[str, type[WaitingQueue]] = {
    "fcfs": WaitingQueue,
    "priority": PriorityQueue,
    "deadline": DeadlineQueue,
    "fair": FairShareQueue,
    "mlfq": MLFQQueue,
}


def make_queue(name: str, clock: Callable[[], float] = time.monotonic) -> WaitingQueue:
    """A waiting queue by policy name."""
    try:
        return POLICIES[name](clock)
    except KeyError:
        raise ValueError(
            f"scheduling policy must be one of {sorted(POLICIES)}, got {name!r}"
        ) from None
