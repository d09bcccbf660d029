"""KV cache events over ZeroMQ, in the wire format of vLLM's KV event publisher.

An engine started with `kv_events_endpoint` publishes, after every step, the prefix
cache's changes (`kv_cache.events`: BlockStored, BlockRemoved, AllBlocksCleared) to a
ZeroMQ PUB socket, so that a KV-aware router can tell which replica caches which prefix
(`dp.router.PrefixIndex` is one). The bytes are vLLM's, so routers written for vLLM's
events (with `prefix_caching_hash_algo="sha256_cbor"` on both sides, the block hashes
agree too):

    message = [topic, seq, payload]       three frames; seq: uint64 big-endian, +1 per batch
    payload = msgpack(EventBatch)         msgspec structs, array_like, omit_defaults
    EventBatch = [ts, [event, ...], data_parallel_rank?]
    event  = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
              lora_id, medium]
           | ["BlockRemoved", block_hashes, medium]
           | ["AllBlocksCleared"]

A block hash travels as vLLM's default `ExternalBlockHash`: the low 64 bits of the
digest as an unsigned int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), or the whole digest
as bytes with int_hashes=False. The first stored block of a request's chain has parent
None, as in vLLM (its parent is the root, which is no block). `medium` is "GPU" for the
device cache (vLLM's name) and the tier's name in capitals otherwise. lora_id is the
adapter's id (`LoRARequest.lora_int_id`) for blocks computed with one, else None.

With a replay endpoint, a ROUTER socket answers [identity, b"", start_seq] with every
buffered batch from start_seq on, as [identity, b"", seq, payload] frames, then
[identity, b"", seq = -1, b""] (vLLM's replay protocol).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable

import msgspec
import zmq

from ..kv_cache import events as kv

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEventPublisher",
    "KVEventSubscriber",
    "external_hash",
    "to_wire",
]

END_SEQ = (-1).to_bytes(8, "big", signed=True)
ExternalHash = int | bytes


class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    block_hashes: list[ExternalHash]
    parent_block_hash: ExternalHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    block_hashes: list[ExternalHash]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def external_hash(digest: bytes, int_hashes: bool = True) -> ExternalHash:
    """A block hash as the events carry it: its low 64 bits as an int, or the bytes."""
    return int.from_bytes(digest, "big") & (2**64 - 1) if int_hashes else digest


def _medium(medium: str) -> str:
    return "GPU" if medium == "device" else medium.upper()


def to_wire(
    events: Iterable[kv.KVCacheEvent], root: bytes | None = None, int_hashes: bool = True
) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
    """pyagent's events as vLLM's wire structs; a parent equal to `root` becomes None."""
    out: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for e in events:
        if isinstance(e, kv.BlockStored):
            parent = e.parent_block_hash
            out.append(
                BlockStored(
                    [external_hash(h, int_hashes) for h in e.block_hashes],
                    None if parent is None or parent == root else external_hash(parent, int_hashes),
                    list(e.token_ids),
                    e.block_size,
                    e.lora_id,
                    _medium(e.medium),
                )
            )
        elif isinstance(e, kv.BlockRemoved):
            hashes = [external_hash(h, int_hashes) for h in e.block_hashes]
            out.append(BlockRemoved(hashes, _medium(e.medium)))
        elif isinstance(e, kv.AllBlocksCleared):
            out.append(AllBlocksCleared())
        else:
            raise TypeError(f"events must be KV cache events, got {type(e).__name__}")
    return out


class KVEventPublisher:
    """Publishes batches of KV cache events on a PUB socket (see the module docstring).

    Args:
        endpoint: where the PUB socket binds, e.g. "tcp://127.0.0.1:0" (port 0: any
            free port; `endpoint` then names the bound one) or "ipc:///path".
        root: the prefix cache's root hash (`KVCacheManager.hasher.root`): a stored
            chain's parent equal to it is sent as None.
        topic: the first frame of every message (subscribers filter on its prefix).
        replay_endpoint: None, or where a ROUTER socket binds to replay buffered batches.
        buffer_steps: how many batches the replay buffer keeps.
        int_hashes: hashes as the low 64 bits (vLLM's default) rather than bytes.
        data_parallel_rank: sent in every batch when set.
    """

    def __init__(
        self,
        endpoint: str,
        root: bytes | None = None,
        topic: str = "",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        int_hashes: bool = True,
        data_parallel_rank: int | None = None,
    ) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self.root, self.topic, self.int_hashes = root, topic.encode(), int_hashes
        self.rank = data_parallel_rank
        self._encoder = msgspec.msgpack.Encoder()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._replay_thread: threading.Thread | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            replay = self._context.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.bind(replay_endpoint)
            self.replay_endpoint = replay.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._replay_thread = threading.Thread(
                target=self._serve_replay, args=(replay,), name="pyagent-kv-replay", daemon=True
            )
            self._replay_thread.start()

    def publish(self, events: Iterable[kv.KVCacheEvent]) -> int | None:
        """Send one batch of `events` (nothing when there are none); returns its seq."""
        wire = to_wire(events, self.root, self.int_hashes)
        if not wire:
            return None
        payload = self._encoder.encode(EventBatch(time.time(), wire, self.rank))
        with self._lock:
            seq, self._seq = self._seq, self._seq + 1
            self._buffer.append((seq, payload))
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve_replay(self, socket: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            identity, _, start = socket.recv_multipart()
            first = int.from_bytes(start, "big")
            with self._lock:
                batches = [(s, p) for s, p in self._buffer if s >= first]
            for seq, payload in batches:
                socket.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
            socket.send_multipart([identity, b"", END_SEQ, b""])
        socket.close(linger=0)

    def close(self) -> None:
        """Stop the replay thread and close the sockets (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._replay_thread is not None:
            self._replay_thread.join(timeout=2.0)
        self._pub.close(linger=0)
        self._context.term()


class KVEventSubscriber:
    """Receives a publisher's batches: `receive` returns [(seq, EventBatch), ...]."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        self._decoder = msgspec.msgpack.Decoder(EventBatch)
        self._context = zmq.Context()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)

    def receive(self, timeout_ms: int = 0) -> list[tuple[int, EventBatch]]:
        """Every batch that arrived, waiting up to timeout_ms for the first one."""
        batches = []
        while self._sub.poll(timeout_ms if not batches else 0):
            _, seq, payload = self._sub.recv_multipart()
            batches.append((int.from_bytes(seq, "big"), self._decoder.decode(payload)))
        return batches

    def close(self) -> None:
        if self._sub.closed:
            return
        self._sub.close(linger=0)
        self._context.term()
