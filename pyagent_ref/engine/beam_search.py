"""Beam search (`LLM.beam_search`): HF transformers' `num_beams` search, greedy.

The search itself (`beam_search`) only needs a function that gives, for token
sequences, the top log-probabilities of each one's next token; `LLM.beam_search` passes
one that runs the live beams through the engine as one-token requests, so the prefix
cache shares the prompt and the beams' common prefixes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BeamSearchParams:
    """The parameters of a beam search (vLLM's names).

    beam_width: the beams kept per step and the sequences returned (int >= 1).
    max_tokens: the most tokens a sequence generates (int >= 1).
    ignore_eos: EOS ends no sequence: every one runs to max_tokens.
    temperature: 0 only (sampled beam search is not implemented).
    length_penalty: a finished sequence's score is cum_logprob / length ** length_penalty.
    include_stop_str_in_output: a sequence ended by EOS keeps its text in `text`.

    Raises ValueError for a value out of range and TypeError for one of the wrong type,
    naming the field and the value.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"{name} must be a real number, got {value!r}")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be finite, got {self.length_penalty!r}")
        if self.temperature != 0:
            raise ValueError(
                f"temperature must be 0 (sampled beam search is not implemented), "
                f"got {self.temperature!r}"
            )


@dataclass
class BeamSearchSequence:
    """One returned sequence: `tokens` is the prompt's ids then the generated ones (the
    EOS that ended it included); `text` the generated text; `cum_logprob` the sum of the
    generated tokens' log-probabilities; `score` cum_logprob / len(generated) **
    length_penalty, what the sequences are ranked by; finish_reason "stop" (ended by
    EOS) or "length" (max_tokens)."""

    tokens: list[int]
    cum_logprob: float
    score: float
    finish_reason: str
    text: str = ""


@dataclass
class BeamSearchOutput:
    """The beam_width sequences of one prompt, best score first."""

    sequences: list[BeamSearchSequence]


@dataclass
class _Search:
    """The state of one prompt's search: live beams (generated ids, cum_logprob), best
    first, and the best finished sequences so far, best score first."""

    prompt: list[int]
    running: list[tuple[tuple[int, ...], float]] = field(default_factory=lambda: [((), 0.0)])
    finished: list[BeamSearchSequence] = field(default_factory=list)


def candidates_per_step(beam_width: int, num_eos: int) -> int:
    """How many continuations a step keeps (HF's): enough that beam_width of them live
    on even when every EOS id is among them."""
    return max(2, 1 + num_eos) * beam_width


def beam_search(
    prompts: Sequence[Sequence[int]],
    params: BeamSearchParams,
    eos_ids: frozenset[int],
    top_logprobs: Callable[[list[list[int]]], list[dict[int, float]]],
) -> list[BeamSearchOutput]:
    """Beam search from each prompt; one output per prompt, in order.

    `top_logprobs(seqs)` gives, for each token sequence, token id -> log-probability of
    its next token (the model's log-softmax) for at least its k most likely tokens, where
    k = candidates_per_step(beam_width, number of EOS ids in effect); the live beams of
    all prompts go to it together, once per step. eos_ids: the ids that end a sequence
    (ignored with ignore_eos). Let W = beam_width and n = the tokens generated so far,
    the step's token included. Each step, for each prompt, exactly as HF's
    `num_beams=W` search with `do_sample=False` and its default `early_stopping=False`:

    1. Candidates: every live beam extended by every token, valued by cum_logprob (the
       sum of its generated tokens' log-probabilities). The k best are kept, ties by
       lower beam rank, then lower token id. (The first step has one beam, the prompt.)
    2. A candidate ending in an EOS id, or any candidate at step n = max_tokens, is
       finished — but is recorded only if it ranks among the W best of the k, with score
       cum_logprob / n ** length_penalty; the W best finished sequences are kept (ties:
       the earlier finished first). The W best candidates that are not finished are the
       next step's beams (k >= W + the number of EOS ids guarantees W of them).
    3. The prompt is done when W sequences have finished and the best live beam cannot
       beat the worst of them, by HF's estimate: its cum_logprob / n ** length_penalty
       <= the worst finished score; or at max_tokens.

    Returns the W finished sequences of each prompt, best score first (text left empty).
    """
    width, eos = params.beam_width, frozenset() if params.ignore_eos else eos_ids
    keep = candidates_per_step(width, len(eos))
    searches = [_Search(list(p)) for p in prompts]
    for n in range(1, params.max_tokens + 1):
        live = [s for s in searches if s.running]
        if not live:
            break
        dists = iter(top_logprobs([s.prompt + list(t) for s in live for t, _ in s.running]))
        for s in live:
            beams, s.running = s.running, []
            next_logprobs = [next(dists) for _ in beams]
            candidates = sorted(
                (
                    (cum + lp, rank, token)
                    for rank, (_, cum) in enumerate(beams)
                    for token, lp in next_logprobs[rank].items()
                ),
                key=lambda c: (-c[0], c[1], c[2]),
            )[:keep]
            for i, (cum, rank, token) in enumerate(candidates):
                tokens = (*beams[rank][0], token)
                if token in eos or n == params.max_tokens:
                    if i < width:
                        reason = "stop" if token in eos else "length"
                        score = cum / n**params.length_penalty
                        s.finished.append(
                            BeamSearchSequence(s.prompt + list(tokens), cum, score, reason)
                        )
                elif len(s.running) < width:
                    s.running.append((tokens, cum))
            s.finished = sorted(s.finished, key=lambda seq: -seq.score)[:width]
            if (
                s.running
                and len(s.finished) == width
                and (s.running[0][1] / n**params.length_penalty <= s.finished[-1].score)
            ):
                s.running = []
    return [BeamSearchOutput(s.finished) for s in searches]
