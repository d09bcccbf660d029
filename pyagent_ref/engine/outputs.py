"""What the engine hands back to users: request outputs and request metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sample.logprobs import Logprob, LogprobsColumns
from ..sched.request import Request

__all__ = ["CompletionOutput", "Logprob", "LogprobsColumns", "RequestMetrics", "RequestOutput"]


@dataclass
class RequestMetrics:
    """Latencies of one request, in seconds (None until the event happened).

    ttft: first token time - arrival. itl: gaps between consecutive tokens.
    e2e: finish - arrival. queued_s: first scheduled - queued.
    scheduled_s: first scheduled - arrival. detokenize_s: the time the frontend spent
    detokenizing the completion and matching its stop strings (summed over its steps).
    `arrival` is on time.monotonic's clock (the others are durations).
    """

    arrival: float
    queued_s: float | None
    ttft: float | None
    itl: list[float]
    e2e: float | None
    num_prompt_tokens: int
    num_generated_tokens: int
    num_preemptions: int
    scheduled_s: float | None = None
    detokenize_s: float = 0.0

    @classmethod
    def of(cls, request: Request, detokenize_s: float = 0.0) -> RequestMetrics:
        t = request.times
        gaps = [b - a for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
        return cls(
            arrival=t.arrival,
            queued_s=None
            if t.first_scheduled is None or t.queued is None
            else t.first_scheduled - t.queued,
            ttft=None if t.first_token is None else t.first_token - t.arrival,
            itl=gaps,
            e2e=None if t.finished is None else t.finished - t.arrival,
            num_prompt_tokens=request.num_prompt_tokens,
            num_generated_tokens=request.num_output_tokens,
            num_preemptions=t.num_preemptions,
            scheduled_s=None if t.first_scheduled is None else t.first_scheduled - t.arrival,
            detokenize_s=detokenize_s,
        )


@dataclass
class CompletionOutput:
    """One completion of a prompt (a request with n > 1 has n of them).

    finish_reason: None while it runs, then "stop", "length", "abort" or "error";
    error says what went wrong with this completion when it is "error".
    logprobs: when the request asked for k, one dict per generated token: the sampled
    token first, then the k most likely ones, each token id -> `Logprob` (stored as
    `LogprobsColumns`, a sequence of those dicts).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: LogprobsColumns | None = None
    error: str | None = None
    embedding: list[float] | None = None  # a pooling request's (`LLM.embed`)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of a request: cumulative completions, or the newest delta when streamed."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: list[RequestMetrics] = field(default_factory=list)
    # with SamplingParams.prompt_logprobs: per prompt token, its entry (the prompt token
    # first, then the top ones, as `CompletionOutput.logprobs`); None for the first token,
    # which nothing predicts. Streamed: in the first delta that has it, else None.
    prompt_logprobs: LogprobsColumns | None = None

    def add(self, later: RequestOutput) -> None:
        """Merge ``later``, the delta of the same request that follows this one, into
        this one: what a consumer that lags behind the engine reads as one delta. Per
        completion (by index) the texts are concatenated and the token ids and logprobs
        appended; finish_reason, stop_reason, error and embedding are the later ones,
        like `finished` and the metrics; the prompt's logprobs are whichever has them."""
        mine = {c.index: c for c in self.outputs}
        for comp in later.outputs:
            c = mine.get(comp.index)
            if c is None:
                self.outputs.append(comp)
                continue
            c.text += comp.text
            c.token_ids = [*c.token_ids, *comp.token_ids]
            if comp.logprobs is not None:
                if c.logprobs is None:
                    c.logprobs = comp.logprobs
                else:
                    c.logprobs.join(comp.logprobs)
            c.finish_reason, c.stop_reason = comp.finish_reason, comp.stop_reason
            c.error, c.embedding = comp.error, comp.embedding
        self.finished, self.metrics = later.finished, later.metrics
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
