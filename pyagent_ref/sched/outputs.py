"""The explicit types passed between the engine's stages (vLLM v1's shape).

Scheduler.schedule() -> SchedulerOutput -> ModelRunner.execute() -> ModelRunnerOutput
-> Scheduler.update_from_output() -> EngineCoreOutputs -> OutputProcessor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..model.pooling import PoolingParams
from ..sample.logprobs import Logprobs
from ..sample.params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner has not seen (or that lost its state to preemption): all
    its tokens so far, its blocks, and how many of its tokens are already computed."""

    req_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    seed: int
    stop_ids: tuple[int, ...]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    pooling_params: PoolingParams | None = None


@dataclass(slots=True)
class CachedRequestData:
    """A request the runner holds: the blocks it gained and its computed-token count."""

    req_id: str
    new_block_ids: tuple[list[int], ...]
    num_computed_tokens: int


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

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    """Per scheduled request: the token sampled after its last scheduled token (None
    for a prefill chunk that does not reach the end of its known tokens), or the error
    that sampling it raised (the request fails; the others are unaffected)."""

    sampled_token_ids: dict[str, int | None]
    logprobs: dict[str, Logprobs | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    pooled: dict[str, list[float]] = field(default_factory=dict)  # pooling requests done


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens of one request this step, and whether and why it finished."""

    req_id: str
    new_token_ids: tuple[int, ...]
    logprobs: Logprobs | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | str | None = None  # the stop token id, when a stop token ended it
    error: str | None = None  # what went wrong, when finish_reason is "error"
    pooled: list[float] | None = None  # a pooling request's embedding


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
        self.last = step

    def reset(self) -> None:
        self.__init__()


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput]
    stats: StepStats | None = None
