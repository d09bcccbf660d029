"""The log-probabilities of a sampled position, as they travel from the sampler to
the user (`ModelRunnerOutput` -> `EngineCoreOutput` -> `CompletionOutput.logprobs`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Logprobs:
    """Log-probabilities at one sampled position, from the sampler to the user.

    Which distribution they are taken from is the engine's `logprobs_mode` (see
    `sample.sampler.LOGPROBS_MODES`; by default the model's own, "raw_logprobs").
    top_ids / top_logprobs: the k most likely tokens, best first, ties by lower id.
    sampled_id / sampled_logprob / sampled_rank: the drawn token; rank 1 is the most
    likely, and tied tokens share a rank (1 + the number of strictly likelier tokens).
    """

    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]
    sampled_id: int
    sampled_logprob: float
    sampled_rank: int

    def ranked(self) -> dict[int, tuple[float, int]]:
        """token id -> (logprob, rank): the sampled token first, then the top ones."""
        out = {self.sampled_id: (self.sampled_logprob, self.sampled_rank)}
        for j, (token, value) in enumerate(zip(self.top_ids, self.top_logprobs, strict=True)):
            rank = 1 + sum(v > value for v in self.top_logprobs[:j])
            out.setdefault(token, (value, rank))
        return out


def logprobs_rows(
    topk: tuple[Any, Any, Any, Any], tokens: Sequence[int], counts: Sequence[int | None]
) -> list[Logprobs | None]:
    """One `Logprobs` per row from `ops.sampling.topk_logprobs`'s (values, ids, sampled
    logprob, sampled rank) for the rows' tokens: row i keeps its counts[i] best entries,
    or is None where counts[i] is None."""
    values, ids, chosen, rank = topk
    out: list[Logprobs | None] = []
    for i, k in enumerate(counts):
        if k is None:
            out.append(None)
            continue
        out.append(
            Logprobs(
                top_ids=tuple(int(t) for t in ids[i, :k]),
                top_logprobs=tuple(float(v) for v in values[i, :k]),
                sampled_id=int(tokens[i]),
                sampled_logprob=float(chosen[i]),
                sampled_rank=int(rank[i]),
            )
        )
    return out
