"""Speculative decoding: proposers that guess a request's next tokens, and their settings.

The guesses (drafts) are verified by the target model with `ops.spec_decode`, which keeps
the output distribution exactly that of the target; a proposer only decides how many of
them get accepted, that is, how fast decoding goes.

Every proposer has the `Proposer` interface, which the engine calls after each step:

    proposer = make_proposer(SpeculativeConfig("ngram", num_speculative_tokens=4), ops)
    drafts = proposer.propose("req-1", prompt_ids, output_ids)   # 0 to 4 token ids
    proposer.finish("req-1", output_ids)                          # the request ended

A draft model needs the target model, whose vocabulary, device and dtype it must share:
`make_proposer(SpeculativeConfig(model=default_draft_model_path()), ops, target=model)`.

`MedusaProposer` (`medusa`, method "medusa") drafts a token tree instead, from the
target's last hidden state (`propose_trees(hidden)`; the engine's runner keeps the hidden
states when the proposer says `needs_hidden_states`), verified by the tree ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from .config import METHODS, SpeculativeConfig
from .medusa import MEDUSA_TREE, DraftTree, MedusaHeads, MedusaProposer
from .ngram import NgramProposer
from .suffix import SuffixProposer

if TYPE_CHECKING:
    from torch import nn


class Proposer(Protocol):
    """What the engine asks of a proposer.

    propose: drafts for the next tokens of a decoding request, given all its tokens so
        far (at most num_speculative_tokens; the engine may cut them shorter). It is
        called once per step of each decoding request, in step order, so a proposer
        may keep per-request state and update it incrementally.
    finish: the request ended (finished, aborted or failed) with these output tokens:
        drop its state (a proposer that learns across requests may keep the output).
    """

    def propose(
        self, request_id: str, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> list[int]: ...

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None: ...


def make_proposer(
    config: SpeculativeConfig,
    ops: ModuleType | None = None,
    target: nn.Module | None = None,
    device: str | None = None,
) -> Proposer:
    """The proposer of `config.method` (one of `METHODS`), running on `ops`.

    "draft_model" needs `target`, the target model: the draft is loaded on its device
    (or on `device`: where the target's ranks hold it and `target` is its shapes on the
    meta device), in its dtype, and must have its vocab_size (`load_draft_model` raises
    ValueError otherwise, or for a missing checkpoint). "medusa" needs it too: its heads read the
    target's hidden states and share its LM head (`MedusaProposer.for_target`).
    """
    if config.method == "ngram":
        return NgramProposer(config, ops)
    if config.method == "suffix":
        return SuffixProposer(config)  # plain Python: no op to take from `ops`
    if config.method == "draft_model":
        if target is None:
            raise ValueError("method 'draft_model' needs the target model: pass target=")
        from .draft_model import DraftModelProposer, load_draft_model  # needs torch

        return DraftModelProposer(config, load_draft_model(config, target, ops, device))
    if config.method == "medusa":
        if target is None:
            raise ValueError("method 'medusa' needs the target model: pass target=")
        return MedusaProposer.for_target(config, target)
    raise ValueError(f"method must be one of {METHODS}, got {config.method!r}")


__all__ = [
    "MEDUSA_TREE",
    "METHODS",
    "DraftTree",
    "MedusaHeads",
    "MedusaProposer",
    "NgramProposer",
    "Proposer",
    "SpeculativeConfig",
    "SuffixProposer",
    "make_proposer",
]
