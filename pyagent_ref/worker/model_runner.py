"""The model runner: executes a `SchedulerOutput` on the model and samples.

Per step: update the persistent `InputBatch`, build the flattened batch, run the forward
pass over the paged KV cache, compute logits only at each request's last scheduled
token, and sample a token for every request whose known tokens are now all computed
(a prefill chunk that stops short samples nothing).

CUDA graphs: `CudaGraphDispatcher` decides which batches a captured graph could serve
(pure-decode batches, padded up to the nearest capture size, keyed by a
`BatchDescriptor`) and is unit-tested on any machine. Capture itself needs an attention
backend without host synchronisation; the reference `paged_attention` loops over
requests on the host, so models declare `supports_cuda_graphs` and the reference model
says False: every step runs eagerly, on CPU and CUDA alike. `compile=True` wraps the
forward in torch.compile.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from types import ModuleType

import torch

from ..model.llama import AttentionMetadata
from ..sample.sampler import Sampler
from ..sched.outputs import ModelRunnerOutput, SchedulerOutput
from .input_batch import InputBatch

DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BatchDescriptor:
    """What a captured graph was recorded for: a token count and whether every request
    contributes exactly one token (a uniform decode batch)."""

    num_tokens: int
    uniform_decode: bool


class CudaGraphDispatcher:
    """Decides, per step, whether a captured graph serves the batch and at what size.

    Only uniform decode batches (one token per request) are graph-eligible, padded to
    the smallest capture size >= their token count; larger or mixed batches run
    eagerly. Disabled (always eager) unless `enabled`.
    """

    def __init__(self, capture_sizes=DEFAULT_CAPTURE_SIZES, enabled: bool = False) -> None:
        if any(s < 1 for s in capture_sizes):
            raise ValueError(f"capture sizes must be >= 1, got {capture_sizes}")
        self.capture_sizes = sorted(set(capture_sizes))
        self.enabled = enabled

    def dispatch(self, num_tokens: int, num_reqs: int) -> tuple[BatchDescriptor | None, int]:
        """(descriptor of the graph to replay or None for eager, padded token count)."""
        uniform = num_tokens == num_reqs
        if not self.enabled or not uniform or num_tokens > self.capture_sizes[-1]:
            return None, num_tokens
        size = self.capture_sizes[bisect.bisect_left(self.capture_sizes, num_tokens)]
        return BatchDescriptor(size, True), size


class ModelRunner:
    """Owns the model, its KV cache tensors and the sampler.

    Args:
        model: a model with forward(input_ids, positions, meta, kv_caches),
            compute_logits(hidden) and kv_cache_shape(num_blocks, block_size).
        num_blocks, block_size: the KV cache geometry (from the KV cache manager).
        ops: the ops namespace of the sampler (ref or accel).
        max_num_reqs, max_model_len, max_num_tokens: buffer sizes.
        enforce_eager: never use CUDA graphs. compile: torch.compile the forward.
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
        enforce_eager: bool = False,
        compile: bool = False,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.block_size = block_size
        shape = model.kv_cache_shape(num_blocks, block_size)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=self.device),
                torch.zeros(shape, dtype=dtype, device=self.device),
            )
            for _ in range(len(model.layers))
        ]
        self.batch = InputBatch(max_num_reqs, max_model_len, max_num_tokens, block_size)
        self.ops = ops
        self.sampler = Sampler(ops)
        use_graphs = (
            self.device.type == "cuda"
            and not enforce_eager
            and getattr(model, "supports_cuda_graphs", False)
        )
        self.dispatcher = CudaGraphDispatcher(enabled=use_graphs)
        self.forward = torch.compile(model.forward) if compile else model.forward

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.batch.update_states(sched)
        if sched.is_empty:
            return ModelRunnerOutput({})
        num_reqs = len(sched.num_scheduled_tokens)
        _, padded = self.dispatcher.dispatch(sched.total_num_scheduled_tokens, num_reqs)
        prep = self.batch.prepare(sched, pad_to=padded)
        dev = self.device
        # addresses are computed on the host arrays by the chosen ops, then moved
        slots = self.ops.block_table.compute_slot_mapping(
            prep.block_table, prep.query_start_loc, prep.positions, self.block_size
        )
        meta = AttentionMetadata(
            slot_mapping=torch.as_tensor(slots).to(dev),
            block_table=torch.from_numpy(prep.block_table).to(dev),
            query_start_loc=torch.from_numpy(prep.query_start_loc).to(dev),
            seq_lens=torch.from_numpy(prep.seq_lens).to(dev),
        )
        positions = torch.from_numpy(prep.positions).to(dev)
        hidden = self.forward(
            torch.from_numpy(prep.input_ids).to(dev), positions, meta, self.kv_caches
        )
        rows = [i for i, s in enumerate(prep.samples) if s]
        sampled: dict[str, int | None] = {rid: None for rid in prep.req_ids}
        logprobs = {}
        if rows:
            index = torch.from_numpy(prep.logits_indices[rows]).to(dev)
            logits = self.model.compute_logits(hidden[index]).cpu()
            out = self.sampler(logits, [self.batch.sampling_row(prep.req_ids[i]) for i in rows])
            for j, i in enumerate(rows):
                sampled[prep.req_ids[i]] = out.token_ids[j]
                logprobs[prep.req_ids[i]] = out.logprobs[j]
        self.batch.after_step(sched, sampled)
        return ModelRunnerOutput(sampled, logprobs)
