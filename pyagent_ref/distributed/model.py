"""One rank's model: its tensor-parallel shard of its pipeline stage's layers.

`DistributedModel` wraps a loaded model of any family (the Llama-family decoders, MoE,
DeepSeek, Mamba-2 and Bamba, LLaVA, BERT) and presents what
`worker.model_runner.ModelRunner` uses (forward, compute_logits, new_kv_cache,
new_state_cache, encode_images, classification_head, layers, config), so the runner
runs unchanged on every rank. LLaVA's vision tower and projector are replicated: every
rank encodes the step's images and the first stage places their rows.

Pipeline parallelism: stage s owns decoder layers [s * L // pp, (s + 1) * L // pp); the
others are dropped (`MissingLayer`: no weights, no KV cache). A step's batch is cut into
micro-batches of whole requests (at most pp of them); the first stage embeds each
micro-batch, runs its layers and sends the residual stream (one tensor, hidden +
residual: the next layer's norm only reads the sum) to the next stage without waiting,
then starts the next micro-batch, so that stage s + 1 works on micro-batch m while stage
s works on m + 1 (GPipe's schedule inside one step). The last stage applies the final
norm; the final hidden states are then broadcast to every stage, so that all ranks
compute the same logits and draw the same tokens (sampling is a pure function of the
request's seed and position), and each runner's batch state stays in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
from torch import nn

from ..model.llama import AttentionMetadata
from .parallel import ParallelContext
from .tensor_parallel import _kv_heads, local_mamba, shard_model


class MissingLayer(nn.Module):
    """The place of a decoder layer another pipeline stage owns: no weights."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this decoder layer belongs to another pipeline stage")


def stage_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The decoder layers of pipeline stage pp_rank: an even split, earlier stages
    taking one fewer when it does not divide."""
    return range(pp_rank * num_layers // pp_size, (pp_rank + 1) * num_layers // pp_size)


def micro_batches(num_reqs: int, count: int) -> list[tuple[int, int]]:
    """Request ranges [a, b) cutting num_reqs requests into min(count, num_reqs) runs of
    near-equal size (none when num_reqs is 0)."""
    count = min(count, num_reqs)
    return [(m * num_reqs // count, (m + 1) * num_reqs // count) for m in range(count)]


def token_range(meta: AttentionMetadata, a: int, b: int) -> tuple[int, int]:
    """The tokens [t0, t1) of rows [a, b) of a step: a request's tokens, or with
    decode_only one token per row (speculative decoding's verification gives each of a
    request's drafts a decode row of its own, while query_start_loc stays per request)."""
    if meta.decode_only:
        return a, b
    return int(meta.query_start_loc[a]), int(meta.query_start_loc[b])


def split_metadata(meta: AttentionMetadata, a: int, b: int) -> AttentionMetadata:
    """The metadata of rows [a, b) of a step alone (requests; decode rows with
    decode_only): their tokens' slots, block-table rows, query offsets from 0, sequence
    lengths and masks."""
    t0, t1 = token_range(meta, a, b)
    qsl = meta.query_start_loc
    if meta.decode_only:  # one token per row
        offsets = torch.arange(b - a + 1, dtype=qsl.dtype, device=qsl.device)
    else:
        offsets = qsl[a : b + 1] - qsl[a]
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping[t0:t1],
        block_table=meta.block_table[a:b],
        query_start_loc=offsets,
        seq_lens=meta.seq_lens[a:b],
        decode_only=meta.decode_only,
        custom_masks=None if meta.custom_masks is None else meta.custom_masks[a:b],
    )


def drop_other_stages(model: nn.Module, ctx: ParallelContext) -> None:
    """Replace the decoder layers of the other pipeline stages by `MissingLayer`s."""
    own = stage_layers(len(model.layers), ctx.pp_rank, ctx.pp_size)
    for i in range(len(model.layers)):
        if i not in own:
            model.layers[i] = MissingLayer()


class DistributedModel(nn.Module):
    """A rank's share of `model` (see the module docstring).

    Args:
        model: a loaded `LlamaForCausalLM` (or subclass), every weight present, cut
            here in place (the other stages' layers dropped, then `shard_model`); or,
            with whole=False, this rank's share already (`loading.load_share`: the rank
            read only its part of the checkpoint).
        ctx: this rank's `ParallelContext`.
        num_micro_batches: how many micro-batches a step is cut into with pipeline
            parallelism; default pp_size.
        whole: whether `model` is the whole model.
    """

    supports_cuda_graphs = False  # a step runs collectives the graphs would not record
    lora_state = None  # the `lora.layers.LoRAState` of the rank's adapters, if any

    def __init__(
        self,
        model: nn.Module,
        ctx: ParallelContext,
        num_micro_batches: int | None = None,
        whole: bool = True,
    ) -> None:
        super().__init__()
        self.model, self.ctx = model, ctx
        self.num_micro_batches = num_micro_batches or ctx.pp_size
        self.own = stage_layers(len(model.layers), ctx.pp_rank, ctx.pp_size)
        if whole:
            drop_other_stages(model, ctx)
            if ctx.tp_size > 1:
                shard_model(model, ctx)

    @property
    def config(self):
        return self.model.config

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def owns_layer(self, index: int) -> bool:
        """Whether decoder layer `index` runs here (it needs a KV cache here)."""
        return index in self.own

    @property
    def uses_token_types(self) -> bool:
        return getattr(self.model, "uses_token_types", False)

    def use_ops(self, ops: ModuleType) -> None:
        self.model.use_ops(ops)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """LLaVA's image rows: the vision tower and projector, whole on every rank."""
        return self.model.encode_images(pixel_values)

    def classification_head(self, cls_states: torch.Tensor) -> torch.Tensor:
        """A classifier's logits: its head, whole on every rank."""
        return self.model.classification_head(cls_states)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata | Sequence[AttentionMetadata],
        kv_caches: Sequence[tuple[torch.Tensor, ...]],
        **extra,
    ) -> torch.Tensor:
        """The final hidden states (num_tokens, hidden) of the step, on every rank.
        `extra`: the model's own keyword arguments (LLaVA's mm_embeds, BERT's
        token_type_ids)."""
        if self.ctx.pp_size == 1:
            return self.model(input_ids, positions, meta, kv_caches, **extra)
        mm_embeds = extra.get("mm_embeds")
        model, ctx = self.model, self.ctx
        metas = [meta] * len(model.layers) if isinstance(meta, AttentionMetadata) else meta
        hidden_size = model.config.hidden_size
        dtype = model.embed_tokens.weight.dtype
        bounds = micro_batches(len(metas[0].seq_lens), self.num_micro_batches)
        step_slots = None if self.lora_state is None else self.lora_state.indices
        outs, sends = [], []
        for a, b in bounds:
            split: dict[int, AttentionMetadata] = {}  # one split per distinct metadata
            for m in metas:
                if id(m) not in split:
                    split[id(m)] = split_metadata(m, a, b)
            mb_metas = [split[id(m)] for m in metas]
            t0, t1 = token_range(metas[0], a, b)
            pos = positions[t0:t1]
            if step_slots is not None:  # the adapted layers see this micro-batch's tokens
                self.lora_state.indices = step_slots[t0:t1]
            if ctx.is_first_stage:
                hidden = model.embed(input_ids[t0:t1], pos)
                if mm_embeds is not None:  # the image rows of this micro-batch's tokens
                    rows, embeds = mm_embeds
                    mine = (rows >= t0) & (rows < t1)
                    hidden = hidden.index_copy(0, rows[mine] - t0, embeds[mine].to(hidden.dtype))
            else:
                hidden = ctx.recv((t1 - t0, hidden_size), dtype, input_ids.device)
            hidden, residual = model.run_layers(self.own, pos, hidden, None, mb_metas, kv_caches)
            if ctx.is_last_stage:
                outs.append(model.norm(hidden, residual)[0])
            else:
                sends.append(ctx.send(hidden if residual is None else hidden + residual))
        if step_slots is not None:
            self.lora_state.indices = step_slots
        for request in sends:
            request.wait()
        if ctx.is_last_stage and outs:
            final = torch.cat(outs)
        else:
            final = torch.empty((len(input_ids), hidden_size), dtype=dtype, device=input_ids.device)
        return ctx.broadcast_from_last_stage(final.contiguous())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits (float32): each rank's vocabulary slice, all-gathered."""
        model = self.model
        if self.ctx.tp_size == 1:
            return model.compute_logits(hidden)
        weight = None if model.lm_head is None else model.lm_head.weight
        logits = model.embed_tokens.logits(hidden, weight).float()
        cap = model.config.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def new_kv_cache(self, num_blocks: int, block_size: int) -> tuple[torch.Tensor, ...]:
        """One layer's cache: the model's, with this rank's KV heads under TP (MLA's
        latent cache whole: every rank caches the whole latent)."""
        if self.ctx.tp_size == 1 or self.model.config.mla is not None:
            return self.model.new_kv_cache(num_blocks, block_size)
        weight = self.model.embed_tokens.weight
        shape = list(self.model.kv_cache_shape(num_blocks, block_size))
        shape[2] = len(_kv_heads(shape[2], self.ctx))
        return tuple(torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in range(2))

    def new_state_cache(self, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One Mamba layer's state slots: the model's, of this rank's heads and groups
        under TP (`tensor_parallel.local_mamba`)."""
        from ..model.mamba import state_cache

        m = self.model.config.mamba
        if self.ctx.tp_size > 1:
            m = local_mamba(m, self.ctx)
        return state_cache(m, num_slots, self.model.embed_tokens.weight)
