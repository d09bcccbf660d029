"""The runner's persistent view of its requests, and the flattened batch built from it.

`InputBatch` keeps, per request the runner holds, its tokens, its computed-token count
and its block ids (one list per KV cache group), in preallocated numpy buffers (one row
per request, reused as requests come and go). `prepare` turns a `SchedulerOutput` into
the arrays a forward pass reads: input ids, positions, one block table per group,
query_start_loc, seq_lens and the logits indices — written into the same buffers every
step, never reallocated.

A sliding-window group's table keeps the ids of blocks that left the window (the KV
cache manager has put the null block in their place and may have handed them out
again): attention masks those positions, so their contents never count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sample.sampler import SamplingRow
from ..sched.outputs import NewRequestData, SchedulerOutput
from ..spec_decode.tree import node_depths


@dataclass
class CachedState:
    """What the runner knows of one request between steps."""

    data: NewRequestData
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[list[int]]  # per KV cache group
    num_prompt_tokens: int
    hidden_states: list[Any] = field(default_factory=list)  # a pooling request's, by chunk
    mirostat_mu: float | None = None  # mirostat v2: the mu of its next token


@dataclass
class PreparedBatch:
    """Views into the persistent buffers for one step (valid until the next prepare)."""

    req_ids: list[str]
    input_ids: np.ndarray
    positions: np.ndarray  # the model's (RoPE) positions
    # each token's index in its sequence, which addresses its KV slot: the positions,
    # except in a draft tree, where node i sits at index c + i but position c + depth(i)
    slot_positions: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray  # (num_groups, num_reqs, max_blocks)
    logits_indices: np.ndarray  # per sampling row: 1 per request, 1 + k with k drafts
    samples: list[bool]  # request i samples a token this step (its known tokens are done)
    num_tokens: int
    num_drafts: list[int]  # per request: the speculative drafts scheduled after its tokens
    draft_parents: list[list[int] | None]  # per request: its drafts' parents if a tree
    token_type_ids: np.ndarray  # an encoder's segment of each token (0 without any)


class InputBatch:
    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_tokens: int,
        block_size: int,
        num_groups: int = 1,
    ) -> None:
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.states: dict[str, CachedState] = {}
        self.input_ids = np.zeros(max_num_tokens, dtype=np.int64)
        self.positions = np.zeros(max_num_tokens, dtype=np.int64)
        self.slot_positions = np.zeros(max_num_tokens, dtype=np.int64)
        self.token_type_ids = np.zeros(max_num_tokens, dtype=np.int64)
        self.query_start_loc = np.zeros(max_num_reqs + 1, dtype=np.int64)
        self.seq_lens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_tables = np.zeros((num_groups, max_num_reqs, self.max_blocks), dtype=np.int64)

    def forget(self, req_ids) -> None:
        """Drop requests whatever state they are in (after a failed step)."""
        for rid in req_ids:
            self.states.pop(rid, None)

    def update_states(self, sched: SchedulerOutput) -> None:
        """Drop finished and preempted requests, add new ones, extend block lists."""
        for rid in sched.finished_req_ids | sched.preempted_req_ids:
            self.states.pop(rid, None)
        for data in sched.new_requests:
            tokens = list(data.prompt_token_ids) + list(data.output_token_ids)
            self.states[data.req_id] = CachedState(
                data,
                tokens,
                data.num_computed_tokens,
                [list(ids) for ids in data.block_ids],
                len(data.prompt_token_ids),
                mirostat_mu=data.mirostat_mu,
            )
        for cached in sched.cached_requests:
            state = self.states[cached.req_id]
            if cached.kept_blocks is not None:  # rejected drafts' blocks were freed
                for ids, kept in zip(state.block_ids, cached.kept_blocks, strict=True):
                    del ids[kept:]
            if cached.new_block_ids:
                for ids, new in zip(state.block_ids, cached.new_block_ids, strict=True):
                    ids.extend(new)
            state.num_computed_tokens = cached.num_computed_tokens

    def prepare(self, sched: SchedulerOutput) -> PreparedBatch:
        """Fill the buffers with this step's flattened batch (in scheduling order): each
        request's next scheduled tokens, then its speculative drafts if it has any (a
        tree's nodes at the position of their depth)."""
        req_ids = list(sched.num_scheduled_tokens)
        spec = sched.scheduled_spec_decode_tokens
        offset, samples, num_drafts, draft_parents = 0, [], [], []
        self.query_start_loc[0] = 0
        for i, rid in enumerate(req_ids):
            state, n = self.states[rid], sched.num_scheduled_tokens[rid]
            start, drafts = state.num_computed_tokens, spec.get(rid, ())
            known = n - len(drafts)
            self.input_ids[offset : offset + known] = state.token_ids[start : start + known]
            self.input_ids[offset + known : offset + n] = drafts
            self.slot_positions[offset : offset + n] = np.arange(start, start + n)
            self.positions[offset : offset + n] = self.slot_positions[offset : offset + n]
            types = state.data.token_type_ids
            self.token_type_ids[offset : offset + n] = (
                0 if types is None else types[start : start + n]
            )
            parents = sched.scheduled_spec_decode_parents.get(rid)
            if parents is not None:  # node i + 1 of the tree at its depth after the root
                depths = node_depths(parents)[1:]
                self.positions[offset + known : offset + n] = start + known - 1 + np.array(depths)
            draft_parents.append(parents)
            offset += n
            self.query_start_loc[i + 1] = offset
            self.seq_lens[i] = start + n
            for table, blocks in zip(self.block_tables, state.block_ids, strict=True):
                table[i, : len(blocks)] = blocks
            samples.append(start + known >= len(state.token_ids))
            num_drafts.append(len(drafts))
        num_reqs = len(req_ids)
        ends = self.query_start_loc[1 : num_reqs + 1]
        logits_indices = ends - 1
        if spec:  # a request with k drafts needs the logits of its last k + 1 tokens
            logits_indices = np.concatenate(
                [np.arange(end - 1 - k, end) for end, k in zip(ends, num_drafts, strict=True)]
            )
        return PreparedBatch(
            req_ids=req_ids,
            input_ids=self.input_ids[:offset],
            positions=self.positions[:offset],
            slot_positions=self.slot_positions[:offset],
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            block_tables=self.block_tables[:, :num_reqs],
            logits_indices=logits_indices,
            samples=samples,
            num_tokens=offset,
            num_drafts=num_drafts,
            draft_parents=draft_parents,
            token_type_ids=self.token_type_ids[:offset],
        )

    def after_step(
        self,
        sched: SchedulerOutput,
        sampled: dict[str, list[int]],
        mirostat_mu: dict[str, float] | None = None,
    ) -> None:
        """Advance computed counts (the scheduler corrects them for rejected drafts next
        step); append each request's emitted tokens to its tokens; keep its new mirostat
        mu."""
        for rid, n in sched.num_scheduled_tokens.items():
            state = self.states[rid]
            state.num_computed_tokens += n
            state.token_ids.extend(sampled.get(rid, ()))
        for rid, mu in (mirostat_mu or {}).items():
            self.states[rid].mirostat_mu = mu

    def sampling_row(self, rid: str) -> SamplingRow:
        state = self.states[rid]
        return SamplingRow(
            request_id=rid,
            params=state.data.sampling_params,
            seed=state.data.seed,
            prompt_token_ids=state.token_ids[: state.num_prompt_tokens],
            output_token_ids=state.token_ids[state.num_prompt_tokens :],
            stop_ids=state.data.stop_ids,
            mirostat_mu=state.mirostat_mu,
        )
