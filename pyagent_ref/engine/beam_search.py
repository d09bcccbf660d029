"""Beam search (`LLM.beam_search`): HF transformers' `num_beams` search, greedy.

The search itself (`BeamSearch`) only needs, for token sequences, the top
log-probabilities of each one's next token; `LLM.beam_search` and `AsyncLLM.beam_search`
get them by running the live beams through the engine as one-token requests, so the
prefix cache shares the prompt and the beams' common prefixes.
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


class BeamSearch:
    """Beam search from each prompt, one step at a time, driven by its caller:

        search = BeamSearch(prompts, params, eos_ids)
        while seqs := search.pending():
            search.advance(top_logprobs(seqs))
        search.outputs()

    `pending()` gives the live beams of every prompt (prompt + generated ids), which the
    caller scores all together: `advance` takes, for each, token id -> log-probability of
    its next token (the model's log-softmax) for at least its k most likely tokens, where
    k = candidates_per_step(beam_width, number of EOS ids in effect). eos_ids: the ids
    that end a sequence (ignored with ignore_eos). Let W = beam_width and n = the tokens
    generated so far, the step's token included. Each step, for each prompt, exactly as
    HF's `num_beams=W` search with `do_sample=False` and its default
    `early_stopping=False`:

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

    `outputs()` gives the W finished sequences of each prompt, best score first (text
    left empty). The search holds no model: the sync `LLM` and the async `AsyncLLM` drive
    the same steps.
    """

    def __init__(
        self, prompts: Sequence[Sequence[int]], params: BeamSearchParams, eos_ids: frozenset[int]
    ) -> None:
        self.params = params
        self.eos = frozenset() if params.ignore_eos else eos_ids
        self.keep = candidates_per_step(params.beam_width, len(self.eos))
        self.searches = [_Search(list(p)) for p in prompts]
        self.n = 0  # tokens generated so far

    def pending(self) -> list[list[int]]:
        """The live beams to score next, prompt by prompt, best first; [] when done."""
        return [s.prompt + list(t) for s in self.searches for t, _ in s.running]

    def pending_prompts(self) -> list[int]:
        """For each of `pending()`'s beams, the index of the prompt it extends."""
        return [i for i, s in enumerate(self.searches) for _ in s.running]

    def advance(self, next_logprobs: Sequence[dict[int, float]]) -> None:
        """One step: `next_logprobs[i]` scores the continuations of `pending()[i]`."""
        self.n += 1
        n, width, lp_of = self.n, self.params.beam_width, iter(next_logprobs)
        for s in self.searches:
            beams, s.running = s.running, []
            dists = [next(lp_of) for _ in beams]
            candidates = sorted(
                (
                    (cum + lp, rank, token)
                    for rank, (_, cum) in enumerate(beams)
                    for token, lp in dists[rank].items()
                ),
                key=lambda c: (-c[0], c[1], c[2]),
            )[: self.keep]
            for i, (cum, rank, token) in enumerate(candidates):
                tokens = (*beams[rank][0], token)
                if token in self.eos or n == self.params.max_tokens:
                    if i < width:
                        reason = "stop" if token in self.eos else "length"
                        score = cum / n**self.params.length_penalty
                        s.finished.append(
                            BeamSearchSequence(s.prompt + list(tokens), cum, score, reason)
                        )
                elif len(s.running) < width:
                    s.running.append((tokens, cum))
            s.finished = sorted(s.finished, key=lambda seq: -seq.score)[:width]
            if (
                s.running
                and len(s.finished) == width
                and (s.running[0][1] / n**self.params.length_penalty <= s.finished[-1].score)
            ):
                s.running = []

    def outputs(self) -> list[BeamSearchOutput]:
        """Each prompt's finished sequences, best score first."""
        return [BeamSearchOutput(s.finished) for s in self.searches]


def beam_search(
    prompts: Sequence[Sequence[int]],
    params: BeamSearchParams,
    eos_ids: frozenset[int],
    top_logprobs: Callable[[list[list[int]]], list[dict[int, float]]],
) -> list[BeamSearchOutput]:
    """`BeamSearch` run to the end with `top_logprobs(seqs)` scoring each step's live
    beams (see there); one output per prompt, in order."""
    search = BeamSearch(prompts, params, eos_ids)
    while seqs := search.pending():
        search.advance(top_logprobs(seqs))
    return search.outputs()
