"""Speculative decoding: proposers that guess a request's next tokens, and their settings.

The guesses (drafts) are verified by the target model with `ops.spec_decode`, which keeps
the output distribution exactly that of the target; a proposer only decides how many of
them get accepted, that is, how fast decoding goes.

    config = SpeculativeConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_max=3)
    drafts = NgramProposer(config).propose(prompt_ids + output_ids)
"""

from __future__ import annotations

from .config import SpeculativeConfig
from .ngram import NgramProposer

__all__ = ["NgramProposer", "SpeculativeConfig"]
