"""The model runner: executes a `SchedulerOutput` on the model and samples.

Per step: update the persistent `InputBatch`, build the flattened batch, run the forward
pass over the paged KV cache, compute logits only at each request's last scheduled
token, and sample a token for every request whose known tokens are now all computed
(a prefill chunk that stops short samples nothing).

Layers in different KV cache groups (a hybrid model's full-attention and
sliding-window layers) hold different blocks: each group has its own block table and
slot mapping, and each layer reads its group's. Layer i of every group shares the i-th
KV tensor (`KVCacheConfig`): a block id belongs to one group at a time. State-space
layers (a `MambaSpec` group) keep tensors of their own, one row per state slot
(`model.new_state_cache`); their group's block table holds each request's slot.

Images: the runner holds the encoder outputs the scheduler's encoder cache accounts for
(content hash -> the image's decoder rows): it drops those evicted, encodes the step's
new images (`model.encode_images`) before the forward pass, and passes the rows of the
placeholder tokens each request computes this step (`mm_embeds`), so a prefill chunk
that cuts through an image reads its share of rows encoded once. A model with M-RoPE
(Qwen2-VL) gets positions of three rows per token, computed from each request's images.

A batch of decodes only (one token per request) takes the static-shape attention path
(`AttentionMetadata.decode_only`); on CUDA such batches replay recorded CUDA graphs
(`cuda_graph`). `compile` wraps the forward in torch.compile; a decode step compiles
into one graph, a step with prefill chunks breaks where `paged_attention` groups
requests on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np
import torch

from ..kv_cache import KVCacheGroup, MambaSpec
from ..model.llama import AttentionMetadata
from ..model.pooling import Pooler, PoolerConfig
from ..sample.logits_processor import BatchUpdate, LogitsProcessor
from ..sample.logprobs import logprobs_rows
from ..sample.sampler import Sampler, SamplingRow
from ..sched.outputs import ModelRunnerOutput, SchedulerOutput
from ..spec_decode.tree import accepted_path
from .cuda_graph import (
    DEFAULT_CAPTURE_SIZES,
    CudaGraphDispatcher,
    CudaGraphRunner,
    check_capture_sizes,
)
from .input_batch import InputBatch

GRAPH_MODES = ("auto", "eager", "static")


class ModelRunner:
    """Owns the model, its KV cache tensors and the sampler.

    Args:
        model: a model with forward(input_ids, positions, meta, kv_caches),
            compute_logits(hidden), new_kv_cache(num_blocks, block_size) (one layer's
            cache tensors: key and value, or MLA's latent) and supports_cuda_graphs;
            with state layers, new_state_cache(num_slots) (one such layer's tensors).
        num_blocks, block_size: the KV cache geometry (from the KV cache manager).
        ops: the ops namespace of the sampler (ref or accel).
        max_num_reqs, max_model_len, max_num_tokens: buffer sizes.
        graph_mode: "auto" records CUDA graphs of batches of decode rows when the
            device is CUDA and the model supports it, else runs eagerly; "eager" never
            uses graphs; "static" pads batches of decode rows into the graphs' static
            buffers and runs them unrecorded on any device (the computation a graph
            replays, to check that path without CUDA).
        capture_sizes: the decode batch sizes graphs are recorded for (those above
            max_num_reqs are capped to it).
        compile: False, True (torch.compile with its default backend, inductor) or the
            name of a torch.compile backend ("aot_eager", "cudagraphs", ...).
        kv_groups: the KV cache groups, in the KV cache config's order; a group's
            layer_names are decoder layer paths "layers.<i>". None: one group of every
            layer.
        logprobs_mode: what the sampler's logprobs are taken from (`LOGPROBS_MODES`).
        logits_processors: custom logits processors the sampler applies
            (`sample.logits_processor`), told of batch changes every step.
        keep_hidden_states: return each sampling request's last final hidden state
            (`ModelRunnerOutput.hidden_states`), for a proposer that drafts from them.
        rows_per_request: the decode rows one request may have in a step: 1, or 1 + k
            with linear speculative drafts of k tokens (graphs are recorded for up to
            max_num_reqs * rows_per_request rows).
        num_state_slots: the slots of a state group's layers (`KVCacheConfig`), 0
            without one.
        lora: the `lora.manager.LoRAManager` of a model with adapter slots, or None.
            Each step puts its requests' adapters into slots and gives every token its
            slot; a step with adapters runs eagerly (no CUDA graph: a graph records
            the layers without their adapters, see `_forward`).
        pooler: what turns a finished pooling request's hidden states into its output
            (`model.pooling.Pooler`); None builds one from the model's config.
    Raises:
        ValueError: an unknown graph_mode or compile backend; kv_groups that name an
            unknown layer or do not hold every layer exactly once; a state group
            without num_state_slots.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        ops: ModuleType,
        max_num_reqs: int = 256,
        max_model_len: int = 4096,
        max_num_tokens: int = 2048,
        graph_mode: str = "auto",
        capture_sizes=DEFAULT_CAPTURE_SIZES,
        compile: bool | str = False,
        kv_groups: Sequence[KVCacheGroup] | None = None,
        logprobs_mode: str = "raw_logprobs",
        logits_processors: Sequence[LogitsProcessor] = (),
        keep_hidden_states: bool = False,
        rows_per_request: int = 1,
        num_state_slots: int = 0,
        lora=None,
        pooler: Pooler | None = None,
    ) -> None:
        if graph_mode not in GRAPH_MODES:
            raise ValueError(f"graph_mode must be one of {GRAPH_MODES}, got {graph_mode!r}")
        if isinstance(compile, str):
            if compile not in torch._dynamo.list_backends(exclude_tags=()):
                raise ValueError(
                    "compile must be a bool or a torch.compile backend name "
                    f"(torch._dynamo.list_backends()), got {compile!r}"
                )
        self.model = model
        self.device = next(model.parameters()).device
        self.num_blocks, self.block_size = num_blocks, block_size
        self.layer_groups = _layer_groups(kv_groups, len(model.layers))
        self.state_groups = {
            g for g, group in enumerate(kv_groups or ()) if isinstance(group.spec, MambaSpec)
        }
        if self.state_groups and num_state_slots < 2:
            raise ValueError(
                f"num_state_slots must be >= 2 with a state group, got {num_state_slots}"
            )
        self.num_state_slots = num_state_slots
        # per layer: its KV cache group, and its place in the group (the KV tensor it uses)
        self.group_of_layer, self.tensor_of_layer = [0] * len(model.layers), [0] * len(model.layers)
        for g, layers in enumerate(self.layer_groups):
            for i, layer in enumerate(layers):
                self.group_of_layer[layer], self.tensor_of_layer[layer] = g, i
        self.batch = InputBatch(
            max_num_reqs, max_model_len, max_num_tokens, block_size, len(self.layer_groups)
        )
        self.ops = ops
        self.logits_processors = list(logits_processors)
        self.keep_hidden_states = keep_hidden_states
        self.lora = lora
        self.pooler = pooler or Pooler(ops, model, PoolerConfig.from_model(model.config))
        self.uses_token_types = getattr(model, "uses_token_types", False)
        self.sampler = Sampler(ops, logprobs_mode, self.logits_processors)
        self.forward = model.forward
        if compile:
            backend = compile if isinstance(compile, str) else "inductor"
            self.forward = torch.compile(model.forward, backend=backend)
        self.record_graphs = (
            graph_mode == "auto"
            and self.device.type == "cuda"
            and getattr(model, "supports_cuda_graphs", False)
        )
        use_graphs = self.record_graphs or graph_mode == "static"
        # no batch has more decode rows than max_num_reqs * rows_per_request: sizes past
        # it are capped to it
        most = max_num_reqs * rows_per_request
        sizes = sorted({min(s, most) for s in check_capture_sizes(capture_sizes)})
        self.dispatcher = CudaGraphDispatcher(sizes, self.batch.max_blocks, enabled=use_graphs)
        self.kv_caches: list[tuple[torch.Tensor, ...]] = []
        self.graphs: CudaGraphRunner | None = None
        self.encoder_outputs: dict[str, torch.Tensor] = {}  # content hash -> decoder rows
        self.allocate_kv_cache()

    def allocate_kv_cache(self) -> None:
        """Allocate zeroed KV cache tensors — one layer's tensors (`model.new_kv_cache`:
        K and V, or MLA's latent) per layer of the largest block group, layer i of every
        group sharing set i; each state layer's own slots (`model.new_state_cache`) — and,
        when graphs are on, capture them: a graph is tied to the addresses of the
        tensors it was recorded on. A model that runs only some layers here (a pipeline
        stage: `owns_layer`) gets no tensors for a set none of its layers uses."""
        owns = getattr(self.model, "owns_layer", lambda layer: True)
        used = {
            self.tensor_of_layer[layer] for layer in range(len(self.model.layers)) if owns(layer)
        }
        blocks = [ls for g, ls in enumerate(self.layer_groups) if g not in self.state_groups]
        shared = [
            self.model.new_kv_cache(self.num_blocks, self.block_size) if i in used else ()
            for i in range(max((len(layers) for layers in blocks), default=0))
        ]
        self.kv_caches = [
            self.model.new_state_cache(self.num_state_slots)
            if self.group_of_layer[layer] in self.state_groups
            else shared[i]
            for layer, i in enumerate(self.tensor_of_layer)
        ]
        if self.dispatcher.enabled:
            self.graphs = CudaGraphRunner(
                self.forward,
                self.kv_caches,
                self.dispatcher,
                self.device,
                self.record_graphs,
                self.group_of_layer,
            )
            with torch.inference_mode():
                self.graphs.capture()

    def release_kv_cache(self) -> None:
        """Drop the KV cache tensors and the graphs recorded on them (engine sleep)."""
        self.kv_caches, self.graphs = [], None

    def read_block(self, group_id: int, block_id: int) -> torch.Tensor:
        """A host copy of block `block_id`'s KV in every layer of group `group_id`:
        shape (layers, tensors per layer, block_size, ...): K then V, (layers, 2,
        block_size, kv_heads, head_dim), or MLA's latent, (layers, 1, block_size,
        latent_size) (for the KV offload; on the host, so the copy is complete when this
        returns)."""
        layers = [self.kv_caches[layer] for layer in self.layer_groups[group_id]]
        return torch.stack(
            [torch.stack([t[block_id] for t in tensors]) for tensors in layers]
        ).cpu()

    def write_block(self, group_id: int, block_id: int, data: torch.Tensor) -> None:
        """Overwrite block `block_id` of group `group_id` with `data`, as `read_block`
        returns it (for the KV offload)."""
        for layer, parts in zip(self.layer_groups[group_id], data, strict=True):
            for tensor, part in zip(self.kv_caches[layer], parts, strict=True):
                tensor[block_id].copy_(part)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.batch.update_states(sched)
        self._update_logits_processors(sched)
        for content_hash in sched.free_encoder_hashes:
            self.encoder_outputs.pop(content_hash, None)
        if sched.is_empty:
            return ModelRunnerOutput({})
        self._encode_images(sched)
        prep = self.batch.prepare(sched)
        # addresses are computed on the host arrays by the chosen ops, per KV cache group
        slots = np.stack(
            [
                self.ops.block_table.compute_slot_mapping(
                    table, prep.query_start_loc, prep.slot_positions, self.block_size
                )
                for table in prep.block_tables
            ]
        )
        # the block-table columns the longest sequence uses (all attention reads)
        width = -(-int(prep.seq_lens.max()) // self.block_size)
        tables = prep.block_tables[:, :, :width]
        lora_errors = self._prepare_lora(prep)
        try:
            hidden = self._forward(prep, slots, tables, width, self._mm_embeds(prep))
        finally:
            if self.lora is not None:
                self.lora.state.clear()
        pooled = self._pool(prep, hidden)
        prompt_logprobs = self._prompt_logprobs(prep, hidden)
        rows = [i for i, s in enumerate(prep.samples) if s and prep.req_ids[i] not in pooled]
        sampled: dict[str, list[int]] = {rid: [] for rid in prep.req_ids}
        logprobs, errors, mirostat_mu = {}, dict(lora_errors), {}
        if rows:
            picks = rows
            if sched.scheduled_spec_decode_tokens:  # request i's 1 + k logits rows
                first = np.cumsum([0] + [k + 1 for k in prep.num_drafts])
                picks = np.concatenate([np.arange(first[i], first[i + 1]) for i in rows])
            index = torch.from_numpy(prep.logits_indices[picks]).to(self.device)
            logits = self.model.compute_logits(hidden[index]).cpu()
            sampling_rows = [self.batch.sampling_row(prep.req_ids[i]) for i in rows]
            for row in sampling_rows:  # one bitmask row per verified node: (1 + k, words)
                row.bitmask = sched.grammar_bitmask.get(row.request_id)
                row.draft_token_ids = sched.scheduled_spec_decode_tokens.get(row.request_id, ())
                row.draft_parents = sched.scheduled_spec_decode_parents.get(row.request_id)
            verify = bool(sched.scheduled_spec_decode_tokens)
            for row, tokens, top, mu, error in self._sample(logits, sampling_rows, verify):
                if error is not None:
                    errors[row.request_id] = error
                    continue
                sampled[row.request_id], logprobs[row.request_id] = tokens, top
                if mu is not None:
                    mirostat_mu[row.request_id] = mu
        paths = self._accepted_paths(sched, sampled)
        self._compact_tree_kv(prep, paths)
        hidden_states = self._last_hidden_states(prep, hidden, sampled, paths)
        self.batch.after_step(sched, sampled, mirostat_mu)
        return ModelRunnerOutput(
            sampled, logprobs, errors, pooled, prompt_logprobs, mirostat_mu, hidden_states
        )

    def _prepare_lora(self, prep) -> dict[str, str]:
        """Put the step's adapters into slots and set each token's slot (`LoRAManager.
        prepare_step`); request -> error for those whose adapter failed to load (they
        run without it and fail)."""
        if self.lora is None:
            return {}
        requests = [self.batch.states[rid].data.lora_request for rid in prep.req_ids]
        counts = np.diff(prep.query_start_loc)
        failed = self.lora.prepare_step(requests, counts)
        return {prep.req_ids[i]: error for i, error in failed.items()}

    def _encode_images(self, sched: SchedulerOutput) -> None:
        """Encode the images the scheduler allocated this step, a batch per shape of
        pixel_values, into `encoder_outputs` (a model of dynamic resolution, Qwen2-VL,
        encodes its images' patches together: `encode_image_data`)."""
        by_shape: dict[tuple, list] = {}
        scheduled = [
            self.batch.states[rid].data.mm_features[i]
            for rid, indices in sched.scheduled_encoder_inputs.items()
            for i in indices
        ]
        encode_data = getattr(self.model, "encode_image_data", None)
        if encode_data is not None:
            rows = encode_data([f.data for f in scheduled])
            for feature, image_rows in zip(scheduled, rows, strict=True):
                self.encoder_outputs[feature.content_hash] = image_rows
            return
        for feature in scheduled:
            by_shape.setdefault(tuple(feature.data.shape), []).append(feature)
        for features in by_shape.values():
            pixels = torch.stack([f.data for f in features]).to(self.device)
            rows = self.model.encode_images(pixels)
            for feature, image_rows in zip(features, rows, strict=True):
                self.encoder_outputs[feature.content_hash] = image_rows

    def _mm_embeds(self, prep) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows of the flattened batch, their image rows) for the placeholder tokens
        the step computes, or None when it computes none."""
        rows, embeds = [], []
        for i, rid in enumerate(prep.req_ids):
            state = self.batch.states[rid]
            if not state.data.mm_features:
                continue
            start, first = state.num_computed_tokens, int(prep.query_start_loc[i])
            end = start + int(prep.query_start_loc[i + 1]) - first
            for feature in state.data.mm_features:
                lo, hi = max(start, feature.offset), min(end, feature.offset + feature.length)
                if lo >= hi:
                    continue
                image = self.encoder_outputs[feature.content_hash]
                rows.append(torch.arange(first + lo - start, first + hi - start))
                embeds.append(image[lo - feature.offset : hi - feature.offset])
        if not rows:
            return None
        return torch.cat(rows).to(self.device), torch.cat(embeds)

    def _forward(
        self, prep, slots: np.ndarray, tables: np.ndarray, width: int, mm_embeds=None
    ) -> torch.Tensor:
        """The final hidden states of the step's tokens: a recorded CUDA graph's replay
        for a batch of decode rows it serves, else the eager forward.

        A step where each request computes one known token and maybe linear drafts
        (decodes, verifications) attends as one decode row per token: the block table
        of the token's request and a sequence length of its own (its index + 1), which
        is the causal mask; the decode kernel and a captured graph then serve it. A step
        whose tokens use LoRA adapters always runs eagerly: the graphs were recorded
        with no adapter active (the layers' per-step indices are host state, set anew
        each step)."""
        num_reqs, seq_lens = len(prep.req_ids), prep.seq_lens
        decode_rows = all(p is None for p in prep.draft_parents) and all(
            prep.query_start_loc[1:] - prep.query_start_loc[:-1] - prep.num_drafts == 1
        )
        if decode_rows and prep.num_tokens > num_reqs:
            owner = np.repeat(np.arange(num_reqs), 1 + np.asarray(prep.num_drafts))
            tables, seq_lens = tables[:, owner], prep.slot_positions + 1
        lora_active = self.lora is not None and self.lora.state.indices is not None
        graph = None
        if not lora_active and mm_embeds is None:  # graphs read token embeddings only
            rows = prep.num_tokens if decode_rows else num_reqs
            graph = self.dispatcher.dispatch(prep.num_tokens, rows, width)
        if graph is not None:
            return self.graphs.run(graph, prep.input_ids, prep.positions, slots, tables, seq_lens)
        dev = self.device
        query_start_loc = torch.from_numpy(prep.query_start_loc).to(dev)
        seq_lens = torch.from_numpy(seq_lens).to(dev)
        masks = self._tree_masks(prep)
        metas = [
            AttentionMetadata(
                slot_mapping=torch.from_numpy(group_slots).to(dev),
                block_table=torch.from_numpy(np.ascontiguousarray(table)).to(dev),
                query_start_loc=query_start_loc,
                seq_lens=seq_lens,
                decode_only=decode_rows,
                custom_masks=masks,
            )
            for group_slots, table in zip(slots, tables, strict=True)
        ]
        extra = {}
        if self.uses_token_types:  # an encoder's segments
            extra["token_type_ids"] = torch.from_numpy(prep.token_type_ids).to(dev)
        if mm_embeds is not None:  # image rows at placeholder tokens
            extra["mm_embeds"] = mm_embeds
        return self.forward(
            torch.from_numpy(prep.input_ids).to(dev),
            torch.from_numpy(self._model_positions(prep)).to(dev),
            [metas[g] for g in self.group_of_layer],
            self.kv_caches,
            **extra,
        )

    def _model_positions(self, prep) -> np.ndarray:
        """The positions the model rotates by: the tokens' positions, or for a model with
        M-RoPE (Qwen2-VL) their three rows (3, num_tokens), each request's from its own
        images (`model.mrope_positions`): a pure function of the token's index, so
        chunks, decodes, recomputes and prefix-cache hits all get them right."""
        if not getattr(self.model, "uses_mrope", False):
            return prep.positions
        qsl = prep.query_start_loc
        return np.concatenate(
            [
                self.model.mrope_positions(
                    prep.positions[qsl[i] : qsl[i + 1]], self.batch.states[rid].data.mm_features
                )
                for i, rid in enumerate(prep.req_ids)
            ],
            axis=1,
        )

    def _tree_masks(self, prep) -> list[torch.Tensor | None] | None:
        """Per request, the attention mask of a draft tree (`ops.spec_decode.
        tree_attention_mask` over its root and drafts, every earlier token visible), or
        None for every request without one; None when no request has a tree."""
        if all(parents is None for parents in prep.draft_parents):
            return None
        masks: list[torch.Tensor | None] = []
        for i, parents in enumerate(prep.draft_parents):
            if parents is None:
                masks.append(None)
                continue
            q_len = int(prep.query_start_loc[i + 1] - prep.query_start_loc[i])
            seq_len = int(prep.seq_lens[i])
            mask = torch.ones((q_len, seq_len), dtype=torch.bool)
            tree = torch.as_tensor(np.asarray(self.ops.spec_decode.tree_attention_mask(parents)))
            mask[q_len - len(tree) :, seq_len - len(tree) :] = tree
            masks.append(mask.to(self.device))
        return masks

    def _accepted_paths(self, sched: SchedulerOutput, sampled: dict[str, list[int]]):
        """request -> the accepted path of its draft tree, root first
        (`spec_decode.tree.accepted_path`), for the requests that verified a tree."""
        return {
            rid: accepted_path(sched.scheduled_spec_decode_tokens[rid], parents, sampled[rid])
            for rid, parents in sched.scheduled_spec_decode_parents.items()
            if sampled.get(rid)
        }

    def _compact_tree_kv(self, prep, paths: dict[str, list[int]]) -> None:
        """Move the KV of each accepted tree path next to the known tokens: node v of
        the path at depth d was written at sequence index c + v (c: the root's) and is read
        from c + d from now on, in every layer. In increasing depth, no move overwrites a
        node still to move (a node's index is at least its depth). The scheduler then rolls
        back the slots past the path, as for a linear draft."""
        moves: list[list[tuple[int, int]]] = [[] for _ in self.layer_groups]
        size = self.block_size
        for rid, path in paths.items():
            i = prep.req_ids.index(rid)
            root = int(prep.seq_lens[i]) - 1 - prep.num_drafts[i]
            for group, blocks in enumerate(self.batch.states[rid].block_ids):
                moves[group] += [
                    (_slot(blocks, root + node, size), _slot(blocks, root + depth, size))
                    for depth, node in enumerate(path)
                    if node != depth
                ]
        for layer, tensors in enumerate(self.kv_caches):
            pairs = moves[self.group_of_layer[layer]]
            if not pairs:
                continue
            src = torch.tensor([a for a, _ in pairs], device=self.device)
            dst = torch.tensor([b for _, b in pairs], device=self.device)
            for cache in tensors:
                flat = cache.view(-1, *cache.shape[2:])
                flat[dst] = flat[src]

    def _last_hidden_states(self, prep, hidden, sampled, paths) -> dict[str, np.ndarray]:
        """With keep_hidden_states: request -> the final hidden state of the row whose
        logits drew its last emitted token (the last accepted node's, after a tree)."""
        if not self.keep_hidden_states:
            return {}
        ends = prep.query_start_loc[1:]
        rows = {
            rid: int(ends[i])
            - 1
            - prep.num_drafts[i]
            + (paths[rid][-1] if rid in paths else len(sampled[rid]) - 1)
            for i, rid in enumerate(prep.req_ids)
            if sampled.get(rid)
        }
        if not rows:
            return {}
        states = hidden[torch.tensor(list(rows.values()), device=hidden.device)]
        return dict(zip(rows, states.float().cpu().numpy(), strict=True))

    def _update_logits_processors(self, sched: SchedulerOutput) -> None:
        """Tell the custom logits processors who joined and who left the batch."""
        if not self.logits_processors:
            return
        update = BatchUpdate(
            [(d.req_id, d.sampling_params, d.prompt_token_ids) for d in sched.new_requests],
            sorted(sched.finished_req_ids | sched.preempted_req_ids),
        )
        if update.added or update.removed:
            for processor in self.logits_processors:
                processor.update_state(update)

    def _prompt_logprobs(self, prep, hidden: torch.Tensor) -> dict[str, tuple[int, list]]:
        """Requests that asked for prompt logprobs: request -> (first position, the
        `Logprobs` of the prompt tokens this step's chunk predicts). The logits at
        position j give prompt token j + 1's entry, from the model's own distribution
        (raw log-probabilities, whatever the logprobs_mode); the last prompt position
        predicts the first output token, which is sampling's business."""
        out = {}
        for i, rid in enumerate(prep.req_ids):
            state = self.batch.states[rid]
            num = state.data.sampling_params.prompt_logprobs
            start = state.num_computed_tokens
            scheduled = int(prep.query_start_loc[i + 1] - prep.query_start_loc[i])
            end = min(start + scheduled, state.num_prompt_tokens - 1)
            if num is None or end <= start:
                continue
            index = torch.arange(end - start) + int(prep.query_start_loc[i])
            logits = self.model.compute_logits(hidden[index.to(self.device)]).float().cpu()
            targets = state.token_ids[start + 1 : end + 1]
            topk = self.ops.sampling.topk_logprobs(
                self.ops.sampling.log_softmax(logits), num, np.array(targets, dtype=np.int64)
            )
            out[rid] = (start, logprobs_rows(topk, targets, [num] * len(targets)))
        return out

    def _pool(self, prep, hidden: torch.Tensor) -> dict[str, list]:
        """Pooling requests: keep this step's hidden states of their prompt tokens (only
        the last one for "last" pooling); those whose prompt is now done go through the
        pooler together."""
        done, items = [], []
        for i, rid in enumerate(prep.req_ids):
            state = self.batch.states[rid]
            params = state.data.pooling_params
            if params is None:
                continue
            start, end = int(prep.query_start_loc[i]), int(prep.query_start_loc[i + 1])
            if not params.needs_every_token:
                start = end - 1
            state.hidden_states.append(hidden[start:end].clone())  # not a view of the step's
            if prep.samples[i]:
                done.append(rid)
                items.append((torch.cat(state.hidden_states), params))
        return dict(zip(done, self.pooler(items), strict=True)) if done else {}

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow], verify: bool):
        """(row, tokens, their logprobs or None, its next mirostat mu or None, error) per
        row: one token drawn, or with
        `verify` (a step with speculative drafts) the tokens `Sampler.verify` emits, the
        rows' logits laid out as it takes them. If the batch raises, one request's row
        may be at fault: each row is then sampled alone. Sampling is batch-invariant
        (the contract), so the other rows draw exactly the tokens they would have drawn."""
        try:
            return self._sample_batch(logits, rows, verify)
        except Exception:
            results, start = [], 0
            for row in rows:
                end = start + (len(row.draft_token_ids) + 1 if verify else 1)
                try:
                    results += self._sample_batch(logits[start:end], [row], verify)
                except Exception as exc:
                    results.append((row, None, None, None, f"sampling failed: {_describe(exc)}"))
                start = end
            return results

    def _sample_batch(self, logits: torch.Tensor, rows: list[SamplingRow], verify: bool):
        if verify:
            return [
                (row, t, lp, mu, None)
                for row, (t, lp, mu) in zip(rows, self.sampler.verify(logits, rows), strict=True)
            ]
        out = self.sampler(logits, rows)
        return [
            (row, [token], None if lp is None else [lp], mu, None)
            for row, token, lp, mu in zip(
                rows, out.token_ids, out.logprobs, out.mirostat_mu, strict=True
            )
        ]


def _layer_groups(kv_groups: Sequence[KVCacheGroup] | None, num_layers: int) -> list[list[int]]:
    """The layer indices of each KV cache group (see `ModelRunner`'s kv_groups)."""
    if kv_groups is None:
        return [list(range(num_layers))]
    index = {f"layers.{i}": i for i in range(num_layers)}
    groups = []
    for group in kv_groups:
        unknown = [name for name in group.layer_names if name not in index]
        if unknown:
            raise ValueError(
                f"kv_groups name layers the model lacks: {unknown} (it has layers.0 .. "
                f"layers.{num_layers - 1})"
            )
        groups.append([index[name] for name in group.layer_names])
    held = sorted(layer for layers in groups for layer in layers)
    if held != list(range(num_layers)):
        raise ValueError(
            f"kv_groups must hold each of the {num_layers} layers exactly once, got {held}"
        )
    return groups


def _slot(blocks: list[int], index: int, block_size: int) -> int:
    """The KV slot of sequence index `index` of a request holding `blocks`."""
    return blocks[index // block_size] * block_size + index % block_size


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
