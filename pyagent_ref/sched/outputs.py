"""The explicit types passed between the engine's stages (vLLM v1's shape).

Scheduler.schedule() -> SchedulerOutput -> ModelRunner.execute() -> ModelRunnerOutput
-> Scheduler.update_from_output() -> EngineCoreOutputs -> OutputProcessor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..lora.request import LoRARequest
from ..model.pooling import PoolingParams
from ..sample.logprobs import Logprobs
from ..sample.params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner has not seen (or that lost its state to preemption): all
    its tokens so far, its blocks, how many of its tokens are already computed, its
    mirostat mu (None before its first token) and its LoRA adapter."""

    req_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    seed: int
    stop_ids: tuple[int, ...]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    pooling_params: PoolingParams | None = None
    mirostat_mu: float | None = None
    lora_request: LoRARequest | None = None
    token_type_ids: tuple[int, ...] | None = None  # an encoder's segments (`Request`)


@dataclass(slots=True)
class CachedRequestData:
    """A request the runner holds: the blocks it gained and its computed-token count.

    kept_blocks: None, or per KV cache group how many of its blocks the request still
    holds before new_block_ids: blocks past them were freed (the slots of rejected
    speculative drafts, `KVCacheManager.free_tail`)."""

    req_id: str
    new_block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    kept_blocks: tuple[int, ...] | None = None


@dataclass
class SchedulerOutput:
    """One step's plan: which requests run, with how many new tokens each."""

    new_requests: list[NewRequestData]
    cached_requests: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    num_lookahead_tokens: int = 0
    # request id -> the int32 bitmask row of the tokens its grammar allows next, for the
    # requests with structured outputs that draw a token this step
    grammar_bitmask: dict[str, np.ndarray] = field(default_factory=dict)
    # request id -> its speculative drafts, scheduled after its last known token (they
    # are counted in num_scheduled_tokens)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # request id -> the parents of its drafts when they form a tree (`Request.spec_parents`)
    scheduled_spec_decode_parents: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """Per scheduled request: the tokens it emits — the one sampled after its last
    scheduled token, preceded by its accepted speculative drafts; none for a prefill
    chunk that does not reach the end of its known tokens — with their logprobs if
    asked for, or the error that sampling raised (the request fails; the others are
    unaffected)."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[Logprobs] | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    pooled: dict[str, list] = field(default_factory=dict)  # pooling requests done: outputs
    # request -> (first prompt position, the Logprobs of the prompt tokens its chunk
    # predicts, from that position + 1 on), for requests with prompt_logprobs
    prompt_logprobs: dict[str, tuple[int, list[Logprobs]]] = field(default_factory=dict)
    # request -> its mirostat mu after the tokens it emits (requests with mirostat v2)
    mirostat_mu: dict[str, float] = field(default_factory=dict)
    # request -> the final hidden state (after the final norm, float32 on the host) of the
    # row whose logits drew its last emitted token, when the runner keeps them (a
    # proposer that drafts from hidden states, Medusa)
    hidden_states: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens of one request this step, and whether and why it finished."""

    req_id: str
    new_token_ids: tuple[int, ...]
    logprobs: tuple[Logprobs, ...] | None = None  # one per new token, if asked for
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | str | None = None  # the stop token id, when a stop token ended it
    error: str | None = None  # what went wrong, when finish_reason is "error"
    pooled: list | None = None  # a pooling request's output (`model.pooling.Pooler`)
    # with its first token, if asked for: the Logprobs of prompt tokens 1 .. P-1
    prompt_logprobs: tuple[Logprobs, ...] | None = None


@dataclass
class StepStats:
    """Per-step metrics: batch shape, budget use, KV usage and prefix hits."""

    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    kv_usage: float
    prefix_hit_rate: float
    spec: SpecDecodeStats | None = None  # speculative decoding, when drafts ran


@dataclass
class SpecDecodeStats:
    """Speculative decoding counts: of drafts proposed (scheduled for verification), how
    many were accepted, in total and by position in the draft (accepted_per_position[i]:
    verified requests whose draft i was accepted). For a draft tree, num_draft_tokens
    counts its nodes and the positions are its depths (drafts_per_position[i]: verified
    trees with a node at depth i + 1)."""

    num_verified: int = 0  # request-steps that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafts_per_position: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, num_accepted: int, depth: int | None = None) -> None:
        """One request's verification: num_accepted of its num_drafts drafts were kept;
        `depth`: a tree's depth (None: a linear draft, as deep as it is long)."""
        self.num_verified += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for counts, n in (
            (self.drafts_per_position, num_drafts if depth is None else depth),
            (self.accepted_per_position, num_accepted),
        ):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    def add(self, other: SpecDecodeStats) -> None:
        self.num_verified += other.num_verified
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for mine, theirs in (
            (self.drafts_per_position, other.drafts_per_position),
            (self.accepted_per_position, other.accepted_per_position),
        ):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, n in enumerate(theirs):
                mine[i] += n

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed drafts (0 before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Per draft position i: how often draft i was accepted when proposed."""
        accepted = self.accepted_per_position
        return [
            (accepted[i] if i < len(accepted) else 0) / d
            for i, d in enumerate(self.drafts_per_position)
        ]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verifying request-step: 1 + the drafts it accepted."""
        return 1 + self.num_accepted_tokens / self.num_verified if self.num_verified else 0.0


@dataclass
class EngineStats:
    """Totals over an engine's steps since it started (or since `reset`): what the
    demo's summary prints and a metrics endpoint exports."""

    steps: int = 0
    scheduled_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    max_running: int = 0
    max_waiting: int = 0
    max_kv_usage: float = 0.0
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    last: StepStats | None = None

    def add(self, step: StepStats) -> None:
        self.steps += 1
        self.scheduled_tokens += step.num_scheduled_tokens
        self.prefill_tokens += step.num_prefill_tokens
        self.decode_tokens += step.num_decode_tokens
        self.preemptions += step.num_preempted
        self.max_running = max(self.max_running, step.num_running)
        self.max_waiting = max(self.max_waiting, step.num_waiting)
        self.max_kv_usage = max(self.max_kv_usage, step.kv_usage)
        if step.spec is not None:
            self.spec.add(step.spec)
        self.last = step

    def reset(self) -> None:
        self.__init__()


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput]
    stats: StepStats | None = None
