"""Draft-model proposals: a small language model guesses the target's next tokens.

vLLM's method "draft_model". A model much cheaper than the target, over the same
vocabulary, runs greedily for k steps from the request's tokens; its k tokens are the
drafts. For the embedded default model, `default_draft_model_path()` is such a draft
(one layer, hidden 128, distilled from it by ``tools/train_draft_model.py``).

**Drafts are deterministic.** The draft decodes greedily: its drafts are a function of
the request's tokens, so the draft distribution q is one-hot at each draft, and the
engine's verification with a one-hot q (`ops.spec_decode.rejection_sample`) stays exact:
greedy requests get exactly the tokens of greedy decoding, sampled ones exactly the
target's distribution. Ties of the draft's logits go to the lowest token id.

**Per-request state: an incremental KV cache.** Each request keeps a dense KV cache of
the draft (per layer, one block of max_position_embeddings slots, through the model's
own paged-attention path with a one-block table) and the list of tokens whose KV it
holds, position by position. A call then runs the draft only on what is new:

1. tokens = prompt + output. The cached tokens that still agree with them (their common
   prefix, at most len(tokens) - 1 so that the last token is always run and gives the
   logits of the first draft) keep their KV; the rest is dropped. This is the
   **rollback**: the previous call cached its drafts 1..k-1, and the ones the target
   rejected differ from the tokens the request now has. Dropping them is lowering a
   count: their slots are overwritten later.
2. One forward pass over the new tokens (the accepted drafts and the token the target
   added, or the whole prompt the first time) gives draft 1 (the argmax of the last
   position's logits); then k - 1 one-token passes, each fed the previous draft, give
   drafts 2..k. The last draft is not fed.

Recomputing the whole sequence at every call needs no state, but costs a pass over all
the tokens per draft: for the default draft at 200 tokens of context, 4.3 ms a pass
against 0.7 ms for an incremental one-token pass (`docs/spec_decode.md`), so the cache it
is. It holds 2 * num_layers * max_position_embeddings * num_kv_heads * head_dim numbers
per running request (512 KiB for the default draft in float32), allocated at the
request's first proposal and freed by `finish`.

**Context.** Draft j is read at position len(tokens) + j - 2, so a call proposes at most
max_position_embeddings - len(tokens) + 1 drafts (the draft's context; none past it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from ..model.config import ModelConfig
from ..model.llama import AttentionMetadata
from .config import SpeculativeConfig


def load_draft_model(
    config: SpeculativeConfig, target: nn.Module, ops: ModuleType | None = None
) -> nn.Module:
    """The draft checkpoint of `config.model`, loaded with pyagent's own model code on
    the target's device and in its dtype, its layers running on `ops`.

    Raises:
        ValueError: `config.model` is not a directory with a config.json, the draft's
            vocab_size differs from the target's, or the checkpoint cannot be loaded (the
            loader's message: unsupported architecture, corrupt file, missing tensor).
    """
    from ..model.loader import load_model

    path = Path(config.model)
    if not path.is_dir():
        raise ValueError(f"speculative_config model {str(path)!r} is not a directory")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"speculative_config model {str(path)!r} is not a model directory: no config.json"
        )
    draft_vocab = ModelConfig.from_pretrained(path).vocab_size
    target_vocab = target.config.vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"speculative_config model {str(path)!r}: draft model vocab_size {draft_vocab} "
            f"!= target model vocab_size {target_vocab}; the draft must share the "
            "target's vocabulary"
        )
    weight = next(target.parameters())
    dtype = str(weight.dtype).removeprefix("torch.")
    return load_model(path, dtype=dtype, device=str(weight.device), progress=False, ops=ops)


@dataclass
class DraftState:
    """A request's draft KV cache: `tokens[i]`'s K/V at slot i of every layer's cache."""

    kv_caches: list[tuple[torch.Tensor, ...]]
    tokens: list[int] = field(default_factory=list)


class DraftModelProposer:
    """Proposes the draft model's k greedy tokens (the module docstring says how).

    `model` is the loaded draft (`load_draft_model`), a `LlamaForCausalLM`.
    """

    def __init__(self, config: SpeculativeConfig, model: nn.Module):
        if config.method != "draft_model":
            raise ValueError(
                f"DraftModelProposer needs method 'draft_model', got {config.method!r}"
            )
        self.config = config
        self.model = model
        self.max_len = model.config.max_position_embeddings
        self.states: dict[str, DraftState] = {}
        self._device = next(model.parameters()).device
        self._block_table = torch.zeros((1, 1), dtype=torch.int64, device=self._device)

    def propose(
        self, request_id: str, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> list[int]:
        """The draft's next min(num_speculative_tokens, max_position_embeddings -
        len(tokens) + 1) greedy tokens after prompt + output (none for an empty sequence
        or one past the draft's context), updating the request's cache."""
        tokens = [*prompt_token_ids, *output_token_ids]
        k = min(self.config.num_speculative_tokens, self.max_len - len(tokens) + 1)
        if k <= 0 or not tokens:
            return []
        state = self.states.get(request_id)
        if state is None:
            state = self.states[request_id] = DraftState(self._new_cache())
        keep = min(common_prefix_length(state.tokens, tokens), len(tokens) - 1)
        del state.tokens[keep:]  # rollback: the KV of the dropped slots is overwritten
        drafts = [self._next_token(state, tokens[keep:])]
        while len(drafts) < k:
            drafts.append(self._next_token(state, drafts[-1:]))
        return drafts

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Free the request's cache."""
        self.states.pop(request_id, None)

    def _new_cache(self) -> list[tuple[torch.Tensor, ...]]:
        # one block: the whole context
        return [self.model.new_kv_cache(1, self.max_len) for _ in self.model.layers]

    @torch.inference_mode()
    def _next_token(self, state: DraftState, new: list[int]) -> int:
        """Run the draft on `new`, placed after state.tokens (their K/V written to the
        cache, and they are appended to state.tokens); the argmax of the last position."""
        device, start, n = self._device, len(state.tokens), len(new)
        positions = torch.arange(start, start + n, device=device)
        meta = AttentionMetadata(
            slot_mapping=positions,  # block 0, slot = position
            block_table=self._block_table,
            query_start_loc=torch.tensor([0, n], device=device),
            seq_lens=torch.tensor([start + n], device=device),
            decode_only=n == 1,
        )
        hidden = self.model(torch.tensor(new, device=device), positions, meta, state.kv_caches)
        state.tokens.extend(new)
        return int(self.model.compute_logits(hidden[-1:]).argmax())


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The largest n with a[:n] == b[:n]. Bisects over slice comparisons (each runs at C
    speed), O(n log n) element comparisons against the O(n) of a Python loop's slow ones."""
    lo, hi = 0, min(len(a), len(b))
    if list(a[:hi]) == list(b[:hi]):
        return hi
    while hi - lo > 1:  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo
