"""The log-probabilities of a sampled position, as they travel from the sampler to
the user (`ModelRunnerOutput` -> `EngineCoreOutput` -> `CompletionOutput.logprobs`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Logprobs:
    """Log-probabilities at one sampled position, from the sampler to the user.

    They are those of the distribution after penalties, logit bias and the min_tokens
    mask, before temperature and truncation (vLLM's default, "raw" logprobs).
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
