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

**Per-request state: an incremental KV cache.** Each request has a block of the draft's
KV cache (per layer, max_position_embeddings slots: its whole context, read through the
model's own paged-attention path with a one-block table) and the list of tokens whose KV
it holds, position by position. A call then runs the draft only on what is new:

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
per running request (512 KiB for the default draft in float32), taken at the
request's first proposal and given back by `finish`.

**Batched.** `propose_batch` serves all the decoding requests of a step together: one
forward pass over every request's new tokens (a ragged batch), then one decode pass per
further draft over the requests that want one, so a step costs k draft passes whatever
the number of requests, not k per request.

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
    config: SpeculativeConfig,
    target: nn.Module,
    ops: ModuleType | None = None,
    device: str | None = None,
) -> nn.Module:
    """The draft checkpoint of `config.model`, loaded with pyagent's own model code on
    the target's device (or `device`) and in its dtype, its layers running on `ops`.

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
    device = device or str(weight.device)
    return load_model(path, dtype=dtype, device=device, progress=False, ops=ops)


@dataclass
class DraftState:
    """A request's part of the draft's KV cache: block `block` of every layer's cache
    holds `tokens[i]`'s K/V at slot i."""

    block: int
    tokens: list[int] = field(default_factory=list)


class DraftModelProposer:
    """Proposes the draft model's k greedy tokens (the module docstring says how).

    `model` is the loaded draft (`load_draft_model`), a `LlamaForCausalLM`. Its KV cache
    has one block of max_position_embeddings slots per request, taken at the request's
    first proposal and given back by `finish`; the cache grows (doubling) when more
    requests are running than it has blocks.
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
        self.kv_caches: list[tuple[torch.Tensor, ...]] = []
        self._free_blocks: list[int] = []
        self._device = next(model.parameters()).device

    def propose(
        self, request_id: str, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> list[int]:
        """The draft's next min(num_speculative_tokens, max_position_embeddings -
        len(tokens) + 1) greedy tokens after prompt + output (none for an empty sequence
        or one past the draft's context), updating the request's cache."""
        return self.propose_batch([(request_id, prompt_token_ids, output_token_ids)])[0]

    def propose_batch(
        self, requests: Sequence[tuple[str, Sequence[int], Sequence[int]]]
    ) -> list[list[int]]:
        """`propose` for each (request_id, prompt_token_ids, output_token_ids) at once:
        one forward pass of the draft over every request's new tokens gives their first
        drafts, then one pass per further draft over the requests that want more."""
        drafts: list[list[int]] = [[] for _ in requests]
        wanted, new = {}, {}  # request index -> drafts it wants, tokens to run next
        for i, (request_id, prompt, output) in enumerate(requests):
            tokens = [*prompt, *output]
            k = min(self.config.num_speculative_tokens, self.max_len - len(tokens) + 1)
            if k <= 0 or not tokens:
                continue
            state = self.states.get(request_id)
            if state is None:
                state = self.states[request_id] = DraftState(self._take_block())
            keep = min(common_prefix_length(state.tokens, tokens), len(tokens) - 1)
            del state.tokens[keep:]  # rollback: the KV of the dropped slots is overwritten
            wanted[i], new[i] = k, tokens[keep:]
        while new:
            states = [self.states[requests[i][0]] for i in new]
            for i, token in zip(new, self._next_tokens(states, list(new.values())), strict=True):
                drafts[i].append(token)
            new = {i: drafts[i][-1:] for i in new if len(drafts[i]) < wanted[i]}
        return drafts

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Give the request's block back."""
        state = self.states.pop(request_id, None)
        if state is not None:
            self._free_blocks.append(state.block)

    def _take_block(self) -> int:
        """A free block of the cache, doubling the cache when none is left."""
        if not self._free_blocks:
            old = self.kv_caches[0][0].shape[0] if self.kv_caches else 0
            size = max(1, 2 * old)
            # a block holds a whole context; a layer's cache is the model's tensors
            grown = [self.model.new_kv_cache(size, self.max_len) for _ in self.model.layers]
            for fresh, kept in zip(grown, self.kv_caches, strict=False):
                for tensor, cached in zip(fresh, kept, strict=True):
                    tensor[:old] = cached
            self.kv_caches = grown
            self._free_blocks = list(range(size - 1, old - 1, -1))
        return self._free_blocks.pop()

    @torch.inference_mode()
    def _next_tokens(self, states: list[DraftState], new: list[list[int]]) -> list[int]:
        """Run the draft on each request's `new` tokens, placed after its state.tokens
        (their K/V written to its block; they are appended to state.tokens), in one
        forward pass; the argmax of each request's last position."""
        device = self._device
        starts = [len(state.tokens) for state in states]
        lengths = [len(tokens) for tokens in new]
        positions = torch.tensor(
            [p for start, n in zip(starts, lengths, strict=True) for p in range(start, start + n)],
            device=device,
        )
        blocks = torch.tensor([state.block for state in states], device=device)
        counts = torch.tensor(lengths, device=device)
        ends = counts.cumsum(0)
        meta = AttentionMetadata(
            slot_mapping=blocks.repeat_interleave(counts) * self.max_len + positions,
            block_table=blocks[:, None],
            query_start_loc=torch.cat([ends.new_zeros(1), ends]),
            seq_lens=torch.tensor(starts, device=device) + counts,
            decode_only=max(lengths) == 1,
        )
        ids = torch.tensor([t for tokens in new for t in tokens], device=device)
        hidden = self.model(ids, positions, meta, self.kv_caches)
        for state, tokens in zip(states, new, strict=True):
            state.tokens.extend(tokens)
        return self.model.compute_logits(hidden[ends - 1]).argmax(dim=-1).tolist()


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
