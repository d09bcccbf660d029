"""The scheduler: continuous batching over the paged KV cache.

Each step has a token budget (`max_num_batched_tokens`) and a sequence cap
(`max_num_seqs`). `schedule()` fills it in two passes:

1. Running requests, in order: each gets the tokens it still lacks — 1 for a decode
   (plus lookahead slots for speculative drafts), the next chunk for a long prompt —
   within the budget. If the KV cache cannot grow it, the policy's victim among the
   running requests is preempted (blocks freed, recomputed later) until it fits; if
   the victim is the request itself, it waits.
2. Waiting requests, in the queue's order, while budget and seats remain and no
   request was preempted this step: the prefix cache skips the tokens it already holds
   (`get_computed_blocks`), the rest is scheduled, chunked to the budget when
   `enable_chunked_prefill` (else a prompt that does not fit waits).

Progress guarantee: the head of `running` (the request running longest without a
preemption) is never preempted for another request, so it is scheduled every step,
advances by at least one token and finishes within max_model_len steps; a request that
could never be scheduled even alone (its KV does not fit in the whole cache, or its
prompt in the whole budget without chunked prefill) finishes with FINISHED_ERROR and a
message instead of waiting forever. So while requests are unfinished, some request
finishes at least every max_model_len steps, and none waits forever for the impossible.

A request's computed-token count advances at scheduling time, as the runner will
compute those tokens in this step. `update_from_output` appends each sampled token and
applies the stop conditions: EOS (unless ignore_eos), stop token ids, both only from
min_tokens on, and max_tokens / the model's context length.

LoRA: with `max_loras` set, the running requests use at most that many distinct
adapters, so no step needs more adapter slots than the model has. A waiting request
whose adapter would be one too many waits at its place: later requests with an adapter
wait behind it (so it cannot starve), requests without one are admitted past it; it is
admitted once a running adapter's last request ends. Never refused for that.
An encoder (bidirectional attention: BERT) cannot split a prompt, as a chunk would not see
the tokens after it: with `SchedulerConfig.bidirectional` every prompt is scheduled whole
in one step (one that exceeds max_num_batched_tokens fails at once with a message) and
never from the prefix cache (an encoder's KV of a block depends on every token of its
prompt, so equal prefixes do not share it). Its requests are pooling requests: they finish
in the step that computes them, and their blocks go back to the pool.

Speculative decoding: a decoding request with drafts (`Request.spec_token_ids`) is
scheduled 1 + k tokens, its last token and the k drafts (fewer if the budget is short),
and the runner emits 1 to k + 1 tokens for it. Drafts may form a tree
(`Request.spec_parents`): the runner then emits the accepted path plus one token, and
moves the path's KV next to the known tokens, so the rollback below stays the same.
The KV of rejected drafts is rolled
back: the computed count drops by their number (the next step overwrites their slots)
and blocks that held nothing else are freed (`KVCacheManager.free_tail`). Drafts never
enter the prefix cache: it takes only full blocks of known tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..kv_cache import KVCacheManager
from ..spec_decode.tree import node_depths
from .outputs import (
    CachedRequestData,
    EngineCoreOutput,
    EngineCoreOutputs,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    SpecDecodeStats,
    StepStats,
)
from .policy import make_queue
from .request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step. max_model_len caps prompt + output tokens per request.
    bidirectional: the model is an encoder (prompts scheduled whole, see the module)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    num_lookahead_tokens: int = 0
    max_loras: int = 0  # distinct LoRA adapters among the running requests; 0: no bound
    bidirectional: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got {self.max_loras}")
        if self.num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be >= 0, got {self.num_lookahead_tokens}")


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache: KVCacheManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.kv = kv_cache
        self.clock = clock
        self.waiting = make_queue(config.policy, clock)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        self._failed: list[EngineCoreOutput] = []  # finished by schedule(), not yet reported
        self._known_to_runner: set[str] = set()
        self._kept_blocks: dict[str, tuple[int, ...]] = {}  # trimmed, runner not yet told

    # --- requests ----------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        # a pooling request generates nothing: its prompt may fill the context
        longest = self.config.max_model_len - (request.pooling_params is None)
        if request.num_prompt_tokens > longest:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens leaves no room in "
                f"max_model_len={self.config.max_model_len}"
            )
        request.times.queued = self.clock()
        self.requests[request.request_id] = request
        self.waiting.push(request)

    def finish_requests(
        self, request_ids: Iterable[str], status: RequestStatus, error: str | None = None
    ) -> list[EngineCoreOutput]:
        """End requests from outside a step (abort, error) and free their blocks. Unknown
        or already finished ids are ignored; returns the final output of each one ended."""
        outputs = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.error = error
            self._finish(request, status)
            outputs.append(_final_output(request))
        return outputs

    def fail_step(self, sched: SchedulerOutput, error: str) -> None:
        """Finish the requests of a step whose forward pass failed with `error`
        (FINISHED_ERROR); the next update_from_output reports them. The blocks cached
        for the tokens of that step leave the prefix cache first: their KV was never
        written (`KVCacheManager.uncache_blocks`)."""
        for rid, num_new in sched.num_scheduled_tokens.items():
            request = self.requests[rid]
            self.kv.uncache_blocks(request, request.num_computed_tokens - num_new)
        self._failed += self.finish_requests(
            sched.num_scheduled_tokens, RequestStatus.FINISHED_ERROR, error
        )

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def has_finished_requests(self) -> bool:
        """Requests finished since the last schedule(), whose output names them for the
        runner to forget."""
        return bool(self._finished_ids)

    # --- scheduling --------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        lookahead = cfg.num_lookahead_tokens
        scheduled: dict[str, int] = {}
        new_blocks: dict[str, tuple[list[int], ...]] = {}
        drafts: dict[str, list[int]] = {}
        parents: dict[str, list[int]] = {}
        preempted: list[Request] = []

        for request in list(self.running):
            if budget == 0 or request.status != RequestStatus.RUNNING:
                continue  # out of budget, or preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new == 1 and request.spec_token_ids:  # a decode with drafts to verify
                drafts[request.request_id] = request.spec_token_ids[: budget - 1]
                if request.spec_parents is not None:  # a prefix of a tree is a tree
                    parents[request.request_id] = request.spec_parents[: budget - 1]
                num_new += len(drafts[request.request_id])
            request.spec_token_ids, request.spec_parents = [], None
            while (blocks := self.kv.allocate_slots(request, num_new, lookahead)) is None:
                candidates = [r for r in self.running if r.request_id not in scheduled]
                if request is self.running[0]:
                    candidates.remove(request)  # the progress guarantee: keep the head
                if not candidates:
                    break
                victim = self.waiting.victim(candidates)
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if blocks is None:
                if request.status == RequestStatus.RUNNING:  # the head, alone, cannot grow
                    self.running.remove(request)
                    self._fail(request, self._too_large(request))
                continue
            scheduled[request.request_id] = num_new
            new_blocks[request.request_id] = blocks.get_block_ids() if blocks.num_blocks else ()
            budget -= num_new

        admitted: list[Request] = []
        loras = {r.lora_id for r in self.running if r.lora_id is not None}
        held_back: list[Request] = []  # waiting behind an adapter with no slot, in order
        while (
            not preempted
            and budget > 0
            and len(self.waiting)
            and len(self.running) < cfg.max_num_seqs
        ):
            request = self.waiting.peek()
            if request.lora_id is not None and (
                held_back or (cfg.max_loras and len(loras | {request.lora_id}) > cfg.max_loras)
            ):
                held_back.append(self.waiting.pop())  # waits, behind the first held back
                continue
            computed, num_computed = self.kv.get_computed_blocks(
                request, use_cache=not (cfg.bidirectional or _needs_every_token(request))
            )
            num_new = request.num_tokens - num_computed
            if num_new > budget and (cfg.bidirectional or not cfg.enable_chunked_prefill):
                if num_new > cfg.max_num_batched_tokens:  # no step could ever take it
                    self.waiting.pop()
                    self._fail(request, self._too_large(request, num_new))
                    continue
                break
            num_new = min(num_new, budget)
            blocks = self.kv.allocate_slots(
                request, num_new, lookahead, new_computed_blocks=computed
            )
            if blocks is None:
                if not self.running:  # an empty cache cannot hold it: it never will
                    self.waiting.pop()
                    self._fail(request, self._too_large(request))
                    continue
                break
            self.waiting.pop()
            request.num_computed_tokens = num_computed
            request.move_to(RequestStatus.RUNNING)
            if request.times.first_scheduled is None:
                request.times.first_scheduled = self.clock()
            self.running.append(request)
            admitted.append(request)
            if request.lora_id is not None:
                loras.add(request.lora_id)
            scheduled[request.request_id] = num_new
            budget -= num_new
        self.waiting.requeue(held_back)

        out = self._build_output(scheduled, new_blocks, admitted, preempted)
        out.scheduled_spec_decode_tokens = {r: d for r, d in drafts.items() if d and r in scheduled}
        out.scheduled_spec_decode_parents = {
            r: p for r, p in parents.items() if r in out.scheduled_spec_decode_tokens
        }
        for rid, n in scheduled.items():
            request = self.requests[rid]
            request.num_computed_tokens += n
            self.waiting.charge(request, n)
        return out

    def _build_output(self, scheduled, new_blocks, admitted, preempted) -> SchedulerOutput:
        new, cached = [], []
        for request in admitted:
            params = request.sampling_params
            stop_ids = tuple(params.stop_token_ids)
            if request.eos_token_id is not None and not params.ignore_eos:
                stop_ids += (request.eos_token_id,)
            new.append(
                NewRequestData(
                    req_id=request.request_id,
                    prompt_token_ids=tuple(request.prompt_token_ids),
                    output_token_ids=tuple(request.output_token_ids),
                    sampling_params=params,
                    seed=request.seed,
                    stop_ids=stop_ids,
                    block_ids=self.kv.get_block_ids(request),
                    num_computed_tokens=request.num_computed_tokens,
                    pooling_params=request.pooling_params,
                    mirostat_mu=request.mirostat_mu,
                    lora_request=request.lora_request,
                    token_type_ids=None
                    if request.token_type_ids is None
                    else tuple(request.token_type_ids),
                )
            )
            self._known_to_runner.add(request.request_id)
        for rid, ids in new_blocks.items():
            cached.append(
                CachedRequestData(
                    rid,
                    ids,
                    self.requests[rid].num_computed_tokens,
                    self._kept_blocks.pop(rid, None),
                )
            )
        finished, self._finished_ids = self._finished_ids, set()
        preempted_ids = {r.request_id for r in preempted}
        self._known_to_runner -= preempted_ids | finished
        return SchedulerOutput(
            new_requests=new,
            cached_requests=cached,
            num_scheduled_tokens=dict(scheduled),
            total_num_scheduled_tokens=sum(scheduled.values()),
            finished_req_ids=finished,
            preempted_req_ids=preempted_ids,
            num_lookahead_tokens=self.config.num_lookahead_tokens,
        )

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        self._kept_blocks.pop(request.request_id, None)
        request.spec_token_ids, request.spec_parents = [], None
        request.num_computed_tokens = 0
        request.move_to(RequestStatus.PREEMPTED)
        request.times.num_preemptions += 1
        self.waiting.push_preempted(request)

    # --- results -----------------------------------------------------------------------

    def update_from_output(
        self, sched: SchedulerOutput, result: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        """Append sampled tokens, apply stop conditions, free finished requests; a
        request whose sampling failed (`result.errors`) finishes with FINISHED_ERROR.
        Requests that schedule() found impossible are reported here too."""
        outputs = []
        now = self.clock()
        sampled = result.sampled_token_ids
        spec = SpecDecodeStats() if sched.scheduled_spec_decode_tokens else None
        for rid in sched.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or request.is_finished:
                continue
            if rid in result.errors:
                self.running.remove(request)
                self._fail(request, result.errors[rid])
                continue
            if rid in result.pooled:  # a pooling request is done with its prompt
                self.running.remove(request)
                self._finish(request, RequestStatus.FINISHED_STOPPED)
                outputs.append(
                    EngineCoreOutput(rid, (), finish_reason="stop", pooled=result.pooled[rid])
                )
                continue
            if rid in result.prompt_logprobs:  # by position: a recomputed chunk overwrites
                start, entries = result.prompt_logprobs[rid]
                request.prompt_logprobs[start : start + len(entries)] = entries
            tokens = sampled.get(rid)
            if not tokens:
                continue
            if rid in sched.scheduled_spec_decode_tokens:
                parents = sched.scheduled_spec_decode_parents.get(rid)
                spec.record(
                    len(sched.scheduled_spec_decode_tokens[rid]),
                    len(tokens) - 1,
                    None if parents is None else max(node_depths(parents)),
                )
                self._roll_back_rejected(
                    request, len(sched.scheduled_spec_decode_tokens[rid]), len(tokens)
                )
            if rid in result.mirostat_mu:
                request.mirostat_mu = result.mirostat_mu[rid]
            output = self._append_tokens(request, tokens, result.logprobs.get(rid), now)
            if output is not None:
                outputs.append(output)
        failed, self._failed = self._failed, []
        return EngineCoreOutputs(failed + outputs, self._stats(sched, spec))

    def _roll_back_rejected(self, request: Request, num_drafts: int, num_emitted: int) -> None:
        """Speculative decoding: of `num_drafts` drafts, num_emitted - 1 were accepted.
        The rejected ones' KV is stale: the computed count drops by their number, and
        blocks holding only their slots are freed (the runner hears of it next step)."""
        rejected = num_drafts + 1 - num_emitted
        if not rejected:
            return
        request.num_computed_tokens -= rejected
        kept = self.kv.free_tail(request, request.num_computed_tokens + 1)
        if kept is not None:
            self._kept_blocks[request.request_id] = kept

    def _append_tokens(
        self, request: Request, tokens: list[int], logprobs, now: float
    ) -> EngineCoreOutput | None:
        """Append a request's new tokens one by one, up to the first that stops it;
        None if its structured output failed (it is finished with the error)."""
        appended = []
        status = stop_reason = None
        first = request.num_output_tokens == 0
        for token in tokens:
            if request.grammar is not None and not request.grammar.accept_token(token):
                self.running.remove(request)  # a mask was not applied: never silently go on
                self._fail(request, f"token {token} breaks the request's structured output")
                return None
            request.output_token_ids.append(token)
            appended.append(token)
            times = request.times
            if times.first_token is None:
                times.first_token = now
            times.token_times.append(now)
            status, stop_reason = self._check_stop(request, token)
            if status is not None:
                self.running.remove(request)
                request.stop_reason = stop_reason
                self._finish(request, status)
                break
        asked = request.sampling_params.prompt_logprobs is not None
        return EngineCoreOutput(
            request.request_id,
            tuple(appended),
            None if logprobs is None else tuple(logprobs[: len(appended)]),
            status.value if status else None,
            stop_reason,
            prompt_logprobs=tuple(request.prompt_logprobs) if first and asked else None,
        )

    def _check_stop(self, request: Request, token: int) -> tuple[RequestStatus | None, int | None]:
        params = request.sampling_params
        n = request.num_output_tokens
        if request.grammar is not None and request.grammar.is_terminated():
            return RequestStatus.FINISHED_STOPPED, None  # the constraint allows no more
        if n >= params.min_tokens:
            if request.eos_token_id == token and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED, None
            if token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if n >= request.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH, None
        return None, None

    def _fail(self, request: Request, error: str) -> None:
        """Finish a request (already out of running/waiting) with an error of its own;
        update_from_output reports it."""
        request.error = error
        self._finish(request, RequestStatus.FINISHED_ERROR)
        self._failed.append(_final_output(request))

    def _too_large(self, request: Request, num_new: int | None = None) -> str:
        """Why `request` can never be scheduled: its KV, or (num_new) its prompt."""
        split = (
            "an encoder's prompt runs whole in one step"
            if self.config.bidirectional
            else "chunked prefill is off"
        )
        why = (
            f"its {num_new} uncached tokens exceed max_num_batched_tokens="
            f"{self.config.max_num_batched_tokens} and {split}"
            if num_new is not None
            else f"its KV does not fit even alone in the cache ({self.kv.pool.num_blocks - 1} "
            f"blocks of {self.kv.block_size} tokens)"
        )
        return f"request {request.request_id!r} ({request.num_tokens} tokens) can never run: {why}"

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.move_to(status)
        request.times.finished = self.clock()
        self.kv.free(request)
        self._kept_blocks.pop(request.request_id, None)
        if request.request_id in self._known_to_runner:
            self._finished_ids.add(request.request_id)
        del self.requests[request.request_id]

    def _stats(self, sched: SchedulerOutput, spec: SpecDecodeStats | None = None) -> StepStats:
        verifying = sched.scheduled_spec_decode_tokens
        prefill = sum(
            n for rid, n in sched.num_scheduled_tokens.items() if n > 1 and rid not in verifying
        )
        metrics = self.kv.metrics()
        return StepStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_scheduled_tokens=sched.total_num_scheduled_tokens,
            num_prefill_tokens=prefill,
            num_decode_tokens=sched.total_num_scheduled_tokens - prefill,
            num_preempted=len(sched.preempted_req_ids),
            kv_usage=metrics.usage,
            prefix_hit_rate=metrics.hit_rate,
            spec=spec,
        )


def _needs_every_token(request: Request) -> bool:
    """A request whose every prompt token must be computed, none taken from the prefix
    cache: it pools over all of them, or it wants their log-probabilities."""
    pooling = request.pooling_params
    return (pooling is not None and pooling.needs_every_token) or (
        request.sampling_params.prompt_logprobs is not None
    )


def _final_output(request: Request) -> EngineCoreOutput:
    """The output that tells the frontend a request ended with no new token."""
    return EngineCoreOutput(
        request.request_id, (), finish_reason=request.status.value, error=request.error
    )
