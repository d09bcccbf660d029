"""A request: its tokens, what changes their KV, its state and its timestamps.

State machine (every other move is an error):
    WAITING --schedule--> RUNNING --preempt--> PREEMPTED --schedule--> RUNNING
    WAITING | RUNNING | PREEMPTED --finish--> FINISHED_STOPPED | FINISHED_LENGTH
                                              | FINISHED_ABORTED | FINISHED_ERROR
A preempted request lost its KV blocks (recompute preemption): it waits again, at the
front of the queue, and recomputes its prompt and the tokens it had generated.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from ..lora.request import LoRARequest
from ..model.pooling import PoolingParams
from ..sample.params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset(s for s in RequestStatus if s.value in ("stop", "length", "abort", "error"))
_MOVES = {
    RequestStatus.WAITING: {RequestStatus.RUNNING},
    RequestStatus.RUNNING: {RequestStatus.PREEMPTED},
    RequestStatus.PREEMPTED: {RequestStatus.RUNNING},
}


@dataclass
class RequestTimes:
    """Wall-clock timestamps (time.monotonic seconds) and counters of one request."""

    arrival: float = 0.0
    queued: float | None = None
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0


@dataclass(frozen=True)
class MultiModalFeature:
    """A multimodal item in the prompt: its content hash and the prompt span it fills.

    Its placeholder tokens [offset, offset + length) look alike for any image, so the
    content hash must enter the prefix-cache key of every block the span overlaps.
    """

    content_hash: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1:
            raise ValueError(
                f"a multimodal feature needs offset >= 0 and length >= 1, "
                f"got offset={self.offset}, length={self.length}"
            )


@dataclass(eq=False)
class Request:
    """One generation request.

    Attributes:
        request_id: unique among live requests.
        prompt_token_ids: the prompt, at least one token.
        output_token_ids: tokens generated so far.
        num_computed_tokens: tokens whose KV is in the cache (or being computed in the
            scheduled step).
        lora_request: the LoRA adapter it is served with, if any; its id (`lora_id`) is
            part of the prefix-cache key of every block.
        mm_features: multimodal items in the prompt (part of the key of the blocks
            they overlap).
        cache_salt: isolates this request's prefix cache from requests with another
            salt (part of the key of the first block).
        num_encoder_tokens: encoder input length, for encoder-decoder models (the
            cross-attention KV it needs).
        block_hashes: hashes of the full blocks of all_token_ids, filled by
            `kv_cache.RequestBlockHasher`.
        sampling_params: how its tokens are drawn and when it stops.
        seed: the Philox key of its sampling stream.
        eos_token_id: the tokenizer's EOS, ending the output unless ignored.
        max_tokens: the generated-token budget (resolved against the context length).
        priority, client_id, deadline: inputs of the queue policies (lower priority
            value runs first; deadline is a time.monotonic() instant).
        status, times, stop_reason: the state machine above and its timestamps.
        error: why it finished with FINISHED_ERROR (its own failure, not another's).
        grammar: the `structured.matcher.GrammarMatcher` of a request with structured
            outputs: it masks each next token and follows the tokens drawn.
        pooling_params: set for a pooling request (embed, classify, score): its prompt
            is computed, pooled (`model.pooling`), and it finishes without sampling.
        token_type_ids: an encoder's segment of each prompt token (0 for the first text
            of a pair, 1 for the second, as a cross-encoder reads them), or None (all 0).
        spec_token_ids: speculative decoding: the drafts proposed for its next tokens,
            verified in its next step (then cleared).
        spec_parents: None for linear drafts; for a draft tree (Medusa), draft i's
            parent node (0 = its last known token, j + 1 = draft j), as in
            `ops.spec_decode` (cleared with spec_token_ids).
        prompt_logprobs: with sampling_params.prompt_logprobs, the `Logprobs` of prompt
            tokens 1 .. P-1 as the chunks of its prompt are computed (by position, so a
            recomputation after preemption overwrites them); sent with its first token.
        mirostat_mu: mirostat v2's state (`SamplingParams.mirostat_mode` 2): the mu its
            next token is truncated with, as the runner last reported it (None before
            its first token: the sampler starts from 2 * tau). Kept here, with the
            output tokens, so that a preempted request resumes with the same mu.
    """

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    lora_request: LoRARequest | None = None
    mm_features: tuple[MultiModalFeature, ...] = ()
    cache_salt: str | None = None
    num_encoder_tokens: int = 0
    block_hashes: list[bytes] = field(default_factory=list)
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    eos_token_id: int | None = None
    max_tokens: int = 16
    priority: int = 0
    client_id: str = ""
    deadline: float = float("inf")
    status: RequestStatus = RequestStatus.WAITING
    times: RequestTimes = field(default_factory=RequestTimes)
    stop_reason: int | str | None = None
    error: str | None = None
    grammar: Any = None
    pooling_params: PoolingParams | None = None
    token_type_ids: list[int] | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    spec_parents: list[int] | None = None
    prompt_logprobs: list[Any] = field(default_factory=list)
    mirostat_mu: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_token_ids must not be empty")
        self.prompt_token_ids = list(self.prompt_token_ids)
        types = self.token_type_ids
        if types is not None and len(types) != len(self.prompt_token_ids):
            raise ValueError(
                f"request {self.request_id!r}: token_type_ids must have one entry per prompt "
                f"token ({len(self.prompt_token_ids)}), got {len(types)}"
            )
        if not self.times.arrival:
            self.times.arrival = time.monotonic()

    def move_to(self, status: RequestStatus) -> None:
        """Change state along the state machine; ValueError for a move it does not have."""
        if self.status.finished or not (status.finished or status in _MOVES[self.status]):
            raise ValueError(
                f"request {self.request_id!r} cannot go from {self.status.name} to {status.name}"
            )
        self.status = status

    @property
    def lora_id(self) -> int | None:
        """The id of its LoRA adapter (the prefix cache's key), or None."""
        return None if self.lora_request is None else self.lora_request.lora_int_id

    @property
    def is_finished(self) -> bool:
        return self.status in _FINISHED

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        self.output_token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
