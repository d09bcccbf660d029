"""A worker: one rank's process state — its process group, its share of the model and
its `ModelRunner` — and the loop that serves the executor's calls in an "mp" process.

Every rank receives the same `SchedulerOutput`, keeps the same `InputBatch` state and
runs the same step: the tensor-parallel ranks compute their shards and meet in the
collectives, the pipeline stages hand activations on, and all ranks end with the same
logits and draw the same tokens. Only the output rank (tp_rank 0 of the last stage)
returns its `ModelRunnerOutput`; the others return None.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from ..sched.outputs import ModelRunnerOutput, SchedulerOutput


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank needs to build itself (picklable: it travels to each process).

    model_dir: the model directory each rank loads its share of (`loading.load_share`).
    dtype, ops: as `EngineConfig`'s. device: "cpu", or "cuda" (rank r takes local GPU
    r % count). tp_size, pp_size: the parallel sizes. runner_args: `ModelRunner` keyword
    arguments (sizes, KV groups, logprobs mode). logits_processors: classes, instantiated
    on each rank. store_host, store_port: the TCP store the ranks meet at. timeout_s: the
    bound on the process group's collectives. lora: the adapter slots (a
    `lora.LoRAConfig`) when LoRA is enabled: every rank keeps them over its share
    (`distributed.lora`).
    """

    model_dir: str
    dtype: str
    device: str
    ops: str
    tp_size: int
    pp_size: int
    store_host: str
    store_port: int
    runner_args: dict = field(default_factory=dict)
    logits_processors: tuple = ()
    timeout_s: float = 120.0
    attention_backend: str = "auto"
    lora: object | None = None

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def output_rank(self) -> int:
        """tp_rank 0 of the last pipeline stage."""
        return (self.pp_size - 1) * self.tp_size


class Worker:
    """Rank `rank` of `spec`: joins the process group (gloo on CPU, NCCL on CUDA), loads
    its share of the model (`loading.load_share`: only that share is read; a quantized
    checkpoint is read whole, then its packed layers cut), builds its adapter slots
    (`spec.lora`) and its runner."""

    def __init__(self, spec: WorkerSpec, rank: int) -> None:
        import torch.distributed as dist

        from ..attention_backends import with_attention_backend
        from ..model import load_model
        from ..model.pooling import Pooler, PoolerConfig
        from ..ops import load as load_ops
        from ..worker.model_runner import ModelRunner
        from .engine import quant_scheme_of
        from .loading import load_share
        from .model import DistributedModel
        from .parallel import ParallelContext

        self.spec, self.rank = spec, rank
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:  # the ranks of a machine share its cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
        if spec.device == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=spec.timeout_s)
        store = dist.TCPStore(spec.store_host, spec.store_port, is_master=False, timeout=timeout)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=store,
            rank=rank,
            world_size=spec.world_size,
            timeout=timeout,
        )
        ctx = ParallelContext.create(rank, spec.tp_size, spec.pp_size)
        ops = with_attention_backend(load_ops(spec.ops), spec.attention_backend)
        if quant_scheme_of(spec.model_dir) is None:
            # this rank's share only: never the whole model in memory
            model = load_share(spec.model_dir, ctx, spec.dtype, str(device), False, ops)
            self.model = DistributedModel(model, ctx, whole=False)
        else:  # quantized: loaded whole, its packed layers then cut (`cut_quantized`)
            model = load_model(spec.model_dir, spec.dtype, str(device), False, ops)
            self.model = DistributedModel(model, ctx)
        config = model.config
        lora = None
        if spec.lora is not None:  # the same slots on every rank, over its share
            from ..lora.manager import LoRAManager
            from .lora import AdapterShare

            share = AdapterShare.of_rank(spec.model_dir, spec.dtype, ctx)
            lora = LoRAManager(model, spec.lora, ops, share=share)
            self.model.lora_state = lora.state
        self.runner = ModelRunner(
            self.model,
            ops=ops,
            graph_mode="eager",
            lora=lora,
            logits_processors=[cls(config.vocab_size) for cls in spec.logits_processors],
            pooler=Pooler(ops, self.model, PoolerConfig.from_model(config, spec.model_dir)),
            **spec.runner_args,
        )

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput | None:
        out = self.runner.execute(sched)
        return out if self.rank == self.spec.output_rank else None

    def forget(self, req_ids: list[str]) -> None:
        self.runner.batch.forget(req_ids)

    def allocate_kv_cache(self) -> None:
        self.runner.allocate_kv_cache()

    def release_kv_cache(self) -> None:
        self.runner.release_kv_cache()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def describe(exc: BaseException) -> str:
    """An exception as one line plus its traceback, for the driver's error message."""
    return f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_tb(exc.__traceback__))}"


def serve(spec: WorkerSpec, rank: int, conn) -> None:
    """The loop of an "mp" worker process: build the worker, reply ("ok", pid) or
    ("error", text), then answer each (method, args) with ("ok", result) or ("error",
    text) until None arrives or the driver's end of the pipe closes (the driver died)."""
    try:
        worker = Worker(spec, rank)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, then exit
        conn.send(("error", describe(exc)))
        return
    conn.send(("ok", os.getpid()))
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message is None:
                break
            method, args = message
            try:
                reply = ("ok", getattr(worker, method)(*args))
            except Exception as exc:  # noqa: BLE001 - the driver fails the step
                reply = ("error", describe(exc))
            conn.send(reply)
    finally:
        worker.close()
