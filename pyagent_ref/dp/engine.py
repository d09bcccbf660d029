"""`DPAsyncLLM`: N engine replicas behind a KV-aware router (data parallelism).

    DPAsyncLLM.generate ── Router.route ──► replica r: AsyncLLM (its engine core in a
         ▲                    ▲              process of its own with engine_process=True)
         │                    └── PrefixIndex ◄── KV events (ZeroMQ SUB, one per replica)
         └──── the replica's RequestOutput deltas ◄──┘

Each replica is a whole engine with its own KV cache, publishing its prefix cache's
changes on an ipc:// endpoint in a private temporary directory (`kv_events_endpoint`).
Before routing a request, the frontend applies the events that arrived, hashes the
prompt's full blocks as the replicas do (the same `RequestBlockHasher`, so the same
`prefix_caching_hash_algo`), reads each replica's load (its requests in flight and KV
usage) and lets the `Router` choose. Outputs are the replica's, unchanged.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .. import ops as ops_pkg
from ..engine.admission import prompt_token_ids
from ..engine.core import EngineConfig
from ..engine.llm import AsyncLLM, Prompt
from ..kv_cache.request_hashing import RequestBlockHasher
from ..lora import LoRARequest
from ..sample.params import SamplingParams
from ..sched.request import Request
from .kv_events import KVEventSubscriber, external_hash
from .router import ReplicaLoad, Router


class DPAsyncLLM:
    """`data_parallel_size` `AsyncLLM` replicas of one model behind a `Router`.

    Args:
        model: as `AsyncLLM`.
        data_parallel_size: the number of replicas, >= 1.
        policy: the router's policy, "prefix" (default), "p2c" or "round_robin".
        engine_process: run each replica's engine core in a process of its own.
        slack, seed: the router's (see `Router`).
        engine_args: `EngineConfig` fields, the same for every replica
            (kv_events_endpoint is set here, one per replica).
    Raises:
        ValueError / TypeError: a bad data_parallel_size, policy or engine argument,
            before any replica starts.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        data_parallel_size: int = 2,
        policy: str = "prefix",
        engine_process: bool = True,
        slack: float = 4.0,
        seed: int = 0,
        **engine_args: Any,
    ) -> None:
        if "kv_events_endpoint" in engine_args:
            raise ValueError("kv_events_endpoint is set per replica by DPAsyncLLM")
        self.router = Router(data_parallel_size, policy, slack, seed)
        config = EngineConfig(model=model, **engine_args)  # checks the arguments once
        self._hasher = RequestBlockHasher(
            config.block_size, ops_pkg.load("ref"), config.prefix_caching_hash_algo
        )
        self._dir = tempfile.mkdtemp(prefix="pyagent-dp-")
        self.replicas: list[AsyncLLM] = []
        self._events: list[KVEventSubscriber] = []
        self.routed = [0] * data_parallel_size  # requests sent to each replica
        try:
            for rank in range(data_parallel_size):
                endpoint = f"ipc://{self._dir}/kv-events-{rank}"
                self._events.append(KVEventSubscriber(endpoint))
                self.replicas.append(
                    AsyncLLM(
                        model,
                        engine_process=engine_process,
                        kv_events_endpoint=endpoint,
                        **engine_args,
                    )
                )
        except BaseException:
            self._close_replicas()
            raise

    def block_hashes(self, token_ids: list[int], lora_request: LoRARequest | None = None) -> list:
        """The external hashes of the full blocks of a prompt, as the replicas' events
        name them."""
        request = Request("router", token_ids, lora_request=lora_request)
        self._hasher.update(request)
        return [external_hash(h) for h in request.block_hashes]

    def loads(self) -> list[ReplicaLoad]:
        """Each replica's requests in flight (sent and not finished) and KV usage."""
        return [
            ReplicaLoad(len(r.processor.requests), r.core.kv.metrics().usage) for r in self.replicas
        ]

    def refresh(self) -> None:
        """Apply the KV events that arrived from every replica."""
        for rank, subscriber in enumerate(self._events):
            for _, batch in subscriber.receive(0):
                self.router.index.apply(rank, batch.events)

    def route(self, prompt: Prompt, lora_request: LoRARequest | None = None) -> int:
        """The replica the router picks for `prompt` now (and notes it there)."""
        self.refresh()
        _, ids = prompt_token_ids(prompt, self.replicas[0].tokenizer.encode)
        rank = self.router.route(self.block_hashes(ids, lora_request), self.loads())
        self.routed[rank] += 1
        return rank

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator:
        """`AsyncLLM.generate` on the replica the router picks."""
        replica = self.replicas[self.route(prompt, lora_request)]
        stream = replica.generate(prompt, params, request_id, lora_request)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    async def shutdown(self, drain: bool = True) -> None:
        """Shut every replica down (see `AsyncLLM.shutdown`) and close the subscribers."""
        try:
            for replica in self.replicas:
                await replica.shutdown(drain)
        finally:
            self._close_replicas()

    def _close_replicas(self) -> None:
        for replica in self.replicas:
            core = replica.core
            if hasattr(core, "close"):
                core.close()  # a process core; idempotent
            elif getattr(core, "kv_events", None) is not None:
                core.kv_events.close()
        for subscriber in self._events:
            subscriber.close()
        self._events = []
        shutil.rmtree(self._dir, ignore_errors=True)
