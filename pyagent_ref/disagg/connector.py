"""KV connectors: move a request's KV blocks from a prefill instance to a decode instance.

A block travels with what makes it reusable (`KVBlock`: its KV cache group, its content:
parent hash, tokens and extra keys, the prefix cache's identity) and its KV, a host tensor
as `ModelRunner.read_block` returns it. A transfer is acknowledged: `send` returns once
the consumer has stored every block, and raises `TransferError` if no acknowledgement
comes in `timeout_s` (the consumer died, or is gone), so a producer never waits forever
and never assumes a transfer it cannot prove.

    producer (prefill)                         consumer (decode)
    DEALER ── [transfer_id, header, data...] ─► ROUTER: receive() -> blocks, then ack
           ◄── [transfer_id, b"ok"] ──────────

`KVConnector` is the interface a backend implements (an LMCache- or NIXL-style store
would implement `send` / `receive` over its own transport). Two are here:

* `ZmqConnector`: the KV bytes ride in the ZeroMQ frames (tcp:// between hosts, ipc://
  on one).
* `ShmConnector`: the KV bytes go through one POSIX shared-memory segment per transfer
  (`multiprocessing.shared_memory`); only its name crosses the socket. The producer
  creates it and unlinks it when the transfer ends, acknowledged or not, so a consumer
  that dies leaves no segment behind.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any, Protocol

import msgspec
import torch
import zmq

from ..kv_cache.block import BlockContent

__all__ = ["KVBlock", "KVConnector", "ShmConnector", "TransferError", "ZmqConnector"]

CONNECTORS = ("zmq", "shm")


class TransferError(RuntimeError):
    """A transfer was not acknowledged in time (the consumer is gone or too slow)."""


@dataclass(frozen=True)
class KVBlock:
    """One full KV block: its group, its prefix-cache content, its KV (host tensor)."""

    group_id: int
    content: BlockContent
    data: torch.Tensor


class KVConnector(Protocol):
    """What a P/D transport provides. Producer side: `send`; consumer side: `receive`."""

    def send(self, transfer_id: str, blocks: Sequence[KVBlock]) -> None:
        """Deliver `blocks`; returns once the consumer stored them (TransferError if not)."""
        ...

    def receive(self, timeout_ms: int = 0) -> list[tuple[str, list[KVBlock]]]:
        """The transfers that arrived (each acknowledged once returned)."""
        ...

    def close(self) -> None: ...


class _Header(msgspec.Struct, array_like=True):
    blocks: list[tuple[int, bytes, list[int], Any, str, list[int]]]  # group, parent, ...
    shm: str | None = None  # ShmConnector: the segment's name


def _keys(value: Any) -> tuple:
    """Extra keys back from msgpack (lists) to the tuples a BlockContent holds."""
    return tuple(tuple(k) if isinstance(k, list) else k for k in value)


class ZmqConnector:
    """KV blocks in ZeroMQ frames (see the module docstring).

    Args:
        endpoint: the consumer's address; the consumer binds it ("tcp://127.0.0.1:0"
            picks a free port: read `endpoint` after), the producer connects to it.
        role: "producer" or "consumer".
        timeout_s: how long `send` waits for the acknowledgement.
    """

    def __init__(self, endpoint: str, role: str, timeout_s: float = 10.0) -> None:
        if role not in ("producer", "consumer"):
            raise ValueError(f"role must be 'producer' or 'consumer', got {role!r}")
        self.role, self.timeout_s = role, timeout_s
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER if role == "producer" else zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if role == "consumer":
            self._socket.bind(endpoint)
            endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        else:
            self._socket.connect(endpoint)
        self.endpoint = endpoint

    # the payload: what this transport puts in the frames, and reads back
    def _pack(self, blocks: Sequence[KVBlock]) -> tuple[str | None, list[bytes], Any]:
        return None, [b.data.contiguous().view(torch.uint8).numpy().tobytes() for b in blocks], None

    def _unpack(self, header: _Header, frames: list) -> list[bytes]:
        return [bytes(f) for f in frames]

    def send(self, transfer_id: str, blocks: Sequence[KVBlock]) -> None:
        shm, frames, resource = self._pack(blocks)
        try:
            header = _Header(
                [
                    (
                        b.group_id,
                        b.content.parent_hash,
                        list(b.content.token_ids),
                        list(b.content.extra_keys),
                        str(b.data.dtype).removeprefix("torch."),
                        list(b.data.shape),
                    )
                    for b in blocks
                ],
                shm,
            )
            tid = transfer_id.encode()
            self._socket.send_multipart([b"", tid, msgspec.msgpack.encode(header), *frames])
            deadline = time.monotonic() + self.timeout_s
            while True:  # an acknowledgement of an earlier, timed-out transfer is skipped
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not self._socket.poll(left_ms):
                    raise TransferError(
                        f"transfer {transfer_id!r}: no acknowledgement in {self.timeout_s:g} s "
                        f"from the decode instance at {self.endpoint}"
                    )
                _, ack_id, status = self._socket.recv_multipart()
                if ack_id == tid:
                    break
            if status != b"ok":
                raise TransferError(f"transfer {transfer_id!r}: the consumer answered {status!r}")
        finally:
            self._release(resource)

    def _release(self, resource: Any) -> None:
        pass

    def receive(self, timeout_ms: int = 0) -> list[tuple[str, list[KVBlock]]]:
        transfers = []
        while self._socket.poll(timeout_ms if not transfers else 0):
            identity, _, tid, raw, *frames = self._socket.recv_multipart(copy=False)
            header = msgspec.msgpack.decode(raw.bytes, type=_Header)
            payloads = self._unpack(header, [f.buffer for f in frames])
            blocks = []
            for (group, parent, tokens, keys, dtype, shape), data in zip(
                header.blocks, payloads, strict=True
            ):
                tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                tensor = tensor.view(getattr(torch, dtype)).reshape(shape)
                blocks.append(
                    KVBlock(group, BlockContent(parent, tuple(tokens), _keys(keys)), tensor)
                )
            transfers.append((tid.bytes.decode(), blocks))
            self._socket.send_multipart([identity.bytes, b"", tid.bytes, b"ok"])
        return transfers

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close(linger=0)
            self._context.term()


class ShmConnector(ZmqConnector):
    """KV blocks through a shared-memory segment per transfer; the socket carries only
    the header and the segment's name (see the module docstring)."""

    def _pack(self, blocks: Sequence[KVBlock]) -> tuple[str | None, list[bytes], Any]:
        raw = [b.data.contiguous().view(torch.uint8).numpy() for b in blocks]
        size = max(1, sum(r.nbytes for r in raw))
        segment = shared_memory.SharedMemory(
            name=f"pyagent-kv-{uuid.uuid4().hex[:16]}", create=True, size=size
        )
        offset = 0
        for r in raw:
            segment.buf[offset : offset + r.nbytes] = r.tobytes()
            offset += r.nbytes
        sizes = [str(r.nbytes).encode() for r in raw]
        return segment.name, sizes, segment

    def _release(self, resource: Any) -> None:
        if resource is not None:
            resource.close()
            resource.unlink()

    def _unpack(self, header: _Header, frames: list) -> list[bytes]:
        segment = _attach(header.shm)
        try:
            out, offset = [], 0
            for size in (int(bytes(f)) for f in frames):
                out.append(bytes(segment.buf[offset : offset + size]))
                offset += size
            return out
        finally:
            segment.close()


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open the producer's segment without registering it with the resource tracker,
    which the producer's process shares: the producer alone owns (and unlinks) it."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)
    except TypeError:  # Python < 3.13 registers every segment it opens
        from multiprocessing import resource_tracker

        register = resource_tracker.register
        resource_tracker.register = lambda *_: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = register


def make_connector(kind: str, endpoint: str, role: str, timeout_s: float = 10.0) -> ZmqConnector:
    """A connector by name: "zmq" or "shm"."""
    if kind not in CONNECTORS:
        raise ValueError(f"connector must be one of {CONNECTORS}, got {kind!r}")
    cls = ShmConnector if kind == "shm" else ZmqConnector
    return cls(endpoint, role, timeout_s)
