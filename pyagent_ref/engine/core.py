"""EngineCore: the loop that turns requests into tokens.

    step():  Scheduler.schedule() --SchedulerOutput--> ModelRunner.execute()
             --ModelRunnerOutput--> Scheduler.update_from_output() --> EngineCoreOutputs

It works in token ids only; text (tokenization, detokenization, stop strings) is the
output processor's job, one layer up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..kv_cache import FullAttentionSpec, KVCacheConfig, KVCacheGroup, KVCacheManager
from ..model import load_model
from ..ops import load as load_ops
from ..sched.outputs import EngineCoreOutput, EngineCoreOutputs, StepStats
from ..sched.request import Request, RequestStatus
from ..sched.scheduler import Scheduler, SchedulerConfig
from ..worker.cuda_graph import DEFAULT_CAPTURE_SIZES
from ..worker.model_runner import ModelRunner


@dataclass
class EngineConfig:
    """Everything that sizes and shapes an engine (vLLM's engine arguments, abridged).

    num_kv_blocks: KV cache blocks (block 0 is the null block); None sizes the cache
        from kv_cache_memory_bytes.
    ops: "ref", "accel" or "auto": the ops namespace for sampling and hashing.
    graph_mode: "auto", "eager" or "static" (see `ModelRunner`); enforce_eager=True
        means "eager". cudagraph_capture_sizes: the decode batch sizes graphs serve.
    compile: torch.compile the forward: True (inductor) or a backend name.
    """

    model: str | Path | None = None
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 256 * 2**20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    eviction: str = "lru"
    policy: str = "fcfs"
    ops: str = "auto"
    enforce_eager: bool = False
    graph_mode: str = "auto"
    cudagraph_capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    compile: bool | str = False
    extra: dict = field(default_factory=dict)


class EngineCore:
    """Scheduler + KV cache manager + model runner, stepping together."""

    def __init__(self, model: torch.nn.Module, config: EngineConfig, clock=time.monotonic) -> None:
        self.config = config
        self.ops = load_ops(config.ops)
        mcfg = model.config
        max_model_len = min(
            config.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings
        )
        dtype_bytes = next(model.parameters()).element_size()
        spec = FullAttentionSpec(
            config.block_size, mcfg.num_key_value_heads, mcfg.head_dim, dtype_bytes
        )
        group = KVCacheGroup(spec, tuple(f"layers.{i}" for i in range(mcfg.num_hidden_layers)))
        if config.num_kv_blocks is not None:
            kv_config = KVCacheConfig(config.num_kv_blocks, (group,))
        else:
            kv_config = KVCacheConfig.from_memory(config.kv_cache_memory_bytes, (group,))
        self.kv = KVCacheManager(
            kv_config,
            ops=self.ops,
            enable_caching=config.enable_prefix_caching,
            eviction=config.eviction,
        )
        self.scheduler_config = SchedulerConfig(
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            policy=config.policy,
        )
        self.scheduler = Scheduler(self.scheduler_config, self.kv, clock)
        self.runner = ModelRunner(
            model,
            kv_config.num_blocks,
            config.block_size,
            self.ops,
            max_num_reqs=config.max_num_seqs,
            max_model_len=max_model_len,
            max_num_tokens=config.max_num_batched_tokens,
            graph_mode="eager" if config.enforce_eager else config.graph_mode,
            capture_sizes=config.cudagraph_capture_sizes,
            compile=config.compile,
        )
        self.max_model_len = max_model_len
        self.asleep = False
        self.accepting = True
        self.last_stats: StepStats | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineCore:
        from ..model import default_model_path

        model = load_model(
            config.model or default_model_path(), config.dtype, config.device, progress=False
        )
        return cls(model, config)

    # --- requests ----------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if not self.accepting:
            raise RuntimeError("the engine is shutting down and accepts no new requests")
        if self.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() before adding requests")
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids) -> list[EngineCoreOutput]:
        """Abort requests wherever they are; their blocks are freed at once."""
        done = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        return [EngineCoreOutput(r.request_id, (), finish_reason="abort") for r in done]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # --- the loop ----------------------------------------------------------------------

    def step(self) -> EngineCoreOutputs:
        """Schedule, execute, update: one iteration of continuous batching."""
        if self.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        sched = self.scheduler.schedule()
        result = self.runner.execute(sched)
        outputs = self.scheduler.update_from_output(sched, result)
        self.last_stats = outputs.stats
        return outputs

    # --- lifecycle ---------------------------------------------------------------------

    def sleep(self) -> None:
        """Release the KV cache memory (and its prefix cache) while idle; wake_up()
        allocates it again. Raises RuntimeError if requests are in flight."""
        if self.has_unfinished_requests():
            raise RuntimeError("cannot sleep with unfinished requests; abort or drain them first")
        self.kv.reset_prefix_cache()
        self.runner.release_kv_cache()
        self.asleep = True

    def wake_up(self) -> None:
        if not self.asleep:
            return
        self.runner.allocate_kv_cache()
        self.asleep = False

    def shutdown(self, drain: bool = True) -> list[EngineCoreOutputs]:
        """Stop accepting requests; finish the in-flight ones (drain) or abort them."""
        self.accepting = False
        steps = []
        if drain:
            while self.has_unfinished_requests():
                steps.append(self.step())
        else:
            ids = [r.request_id for r in [*self.scheduler.running, *self.scheduler.waiting]]
            steps.append(EngineCoreOutputs(self.abort_requests(ids)))
        return steps
