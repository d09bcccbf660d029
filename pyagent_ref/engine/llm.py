"""The user-facing engines: `LLM` (offline, batched) and `AsyncLLM` (streaming).

    llm = LLM()                                    # the embedded default model
    outs = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32))
    print(outs[0].outputs[0].text)

Both feed the same `EngineCore`; a prompt is text (tokenized here), token ids, or a
chat conversation rendered with the model's chat template (`LLM.chat`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from ..sample.params import SamplingParams
from ..sched.request import Request
from .core import EngineConfig, EngineCore
from .output_processor import OutputProcessor
from .outputs import RequestOutput

Prompt = str | Sequence[int]


class _Frontend:
    """Tokenization, request creation (n > 1 fans out into children), seeding."""

    def __init__(
        self, config: EngineConfig | None = None, core: EngineCore | None = None, tokenizer=None
    ):
        from ..model import default_model_path
        from ..tokenize import load_tokenizer

        self.config = config or EngineConfig()
        model_dir = Path(self.config.model or default_model_path())
        self.core = core or EngineCore.from_config(self.config)
        self.tokenizer = tokenizer or load_tokenizer(model_dir)
        self.processor = OutputProcessor(self.tokenizer)
        self._extra_eos = self._generation_eos_ids(model_dir)
        self._ids = itertools.count()
        self._rng = random.Random()

    def _generation_eos_ids(self, model_dir: Path) -> list[int]:
        """End-of-sequence ids that generation_config.json adds to the tokenizer's EOS (a chat
        model's end-of-turn token, say): they stop a request like EOS unless ignore_eos."""
        path = model_dir / "generation_config.json"
        if not path.is_file():
            return []
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
        return [int(t) for t in ids if t != self.tokenizer.eos_token_id]

    def _prompt_ids(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt must not be empty")
        return None, ids

    def _add(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None = None,
        stream: bool = False,
    ) -> str:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        text, ids = self._prompt_ids(prompt)
        rid = request_id or str(next(self._ids))
        if self._extra_eos and not params.ignore_eos:
            stops = params.stop_token_ids + [
                t for t in self._extra_eos if t not in params.stop_token_ids
            ]
            params = dataclasses.replace(params, stop_token_ids=stops)
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(64)
        max_tokens = params.max_tokens or self.core.max_model_len - len(ids)
        children = []
        for i in range(params.n):
            child_id = rid if params.n == 1 else f"{rid}#{i}"
            children.append(
                Request(
                    child_id,
                    ids,
                    sampling_params=params,
                    seed=(base_seed + i) % 2**64,
                    eos_token_id=self.tokenizer.eos_token_id,
                    max_tokens=max_tokens,
                )
            )
        self.processor.add_request(rid, text, ids, params, children, stream)
        for child in children:
            self.core.add_request(child)
        return rid

    def _step(self) -> list[RequestOutput]:
        outputs = self.core.step()
        to_abort, finished = self.processor.process(outputs.outputs)
        if to_abort:
            self.core.abort_requests(to_abort)
        return finished


class LLM(_Frontend):
    """Offline batched generation. Arguments: see `EngineConfig` (model=None runs the
    embedded default model; ops="ref" | "accel" | "auto")."""

    def __init__(self, model: str | Path | None = None, **engine_args) -> None:
        super().__init__(EngineConfig(model=model, **engine_args))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns one finished RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = _per_prompt(params, len(prompts))
        order = [self._add(p, sp) for p, sp in zip(prompts, params_list, strict=True)]
        done: dict[str, RequestOutput] = {}
        while self.core.has_unfinished_requests():
            for out in self._step():
                done[out.request_id] = out
        return [done[rid] for rid in order]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs,
    ) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.apply_chat_template(
                conv,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                **template_kwargs,
            )
            for conv in conversations
        ]
        return self.generate(prompts, params)


class AsyncLLM(_Frontend):
    """Streaming generation on an asyncio event loop.

    One background task steps the engine (in a worker thread, so the loop stays
    responsive) while requests are in flight; `generate` is an async generator of
    RequestOutput deltas. Cancelling the consumer aborts the request and frees its KV
    blocks at once.
    """

    def __init__(self, model: str | Path | None = None, **engine_args) -> None:
        super().__init__(EngineConfig(model=model, **engine_args))
        self._queues: dict[str, asyncio.Queue] = {}
        self._loop_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        params = params or SamplingParams()
        async with self._lock:  # the engine is not touched while a step runs
            rid = self._add(prompt, params, request_id, stream=True)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = queue
        self._ensure_loop()
        try:
            while True:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if rid in self.processor.requests:  # left early: cancelled or closed
                await self.abort(rid)

    async def abort(self, request_id: str) -> None:
        async with self._lock:
            children = self.processor.abort(request_id)
            self.core.abort_requests(children)

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            async with self._lock:
                if not self.core.has_unfinished_requests():
                    return
                try:
                    outputs = await asyncio.to_thread(self.core.step)
                    to_abort, _ = self.processor.process(outputs.outputs)
                    if to_abort:
                        self.core.abort_requests(to_abort)
                except Exception as exc:  # surface engine errors to every consumer
                    for queue in self._queues.values():
                        queue.put_nowait(exc)
                    raise
            for rid, delta in self.processor.take_deltas():
                queue = self._queues.get(rid)
                if queue is not None:
                    queue.put_nowait(delta)
            await asyncio.sleep(0)


def _per_prompt(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(
            f"params must be one SamplingParams or one per prompt ({n}), got {len(params)}"
        )
    return params
