"""Prompt lookup (n-gram) proposals: continue the sequence the way it went before.

Code edits, summaries and multi-turn chats repeat long stretches of their prompt. If the
last few tokens already occurred earlier in prompt + output, the tokens that followed
them then are a good guess for what follows now, and cost nothing to propose. The
lookup itself is the op `ops.spec_decode.propose_ngram` (linear time; a Rust twin).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from ..ops import spec_decode as ref_spec_decode
from .config import SpeculativeConfig


class NgramProposer:
    """Proposes drafts by prompt lookup with a `SpeculativeConfig`'s settings, on the
    `propose_ngram` of an ops namespace (the reference's by default)."""

    def __init__(self, config: SpeculativeConfig, ops: ModuleType | None = None):
        if config.method != "ngram":
            raise ValueError(f"NgramProposer needs method 'ngram', got {config.method!r}")
        self.config = config
        self._propose = (ops.spec_decode if ops is not None else ref_spec_decode).propose_ngram

    def propose(
        self, request_id: str, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> list[int]:
        """`propose_ngram` over the request's prompt + output tokens: at most
        num_speculative_tokens drafts, maybe none. Stateless."""
        c = self.config
        return self._propose(
            [*prompt_token_ids, *output_token_ids],
            c.num_speculative_tokens,
            c.prompt_lookup_min,
            c.prompt_lookup_max,
        )

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Nothing is kept per request."""
