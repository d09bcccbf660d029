"""EngineCore: the loop that turns requests into tokens.

    step():  Scheduler.schedule() --SchedulerOutput--> ModelRunner.execute()
             --ModelRunnerOutput--> Scheduler.update_from_output() --> EngineCoreOutputs

It works in token ids only; text (tokenization, detokenization, stop strings) is the
output processor's job, one layer up.

Failures stay with the requests they belong to: a request whose sampling raises
finishes with finish_reason "error" and the others draw the tokens they would have
drawn anyway (`ModelRunner`); an exception in the forward pass itself, or a
KeyboardInterrupt, fails the requests of that step and leaves the engine ready for the
next one. The public methods take one lock, so another thread may abort while a step
runs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ..attention_backends import BACKENDS as ATTENTION_BACKENDS
from ..attention_backends import with_attention_backend
from ..distributed.engine import check_distributed, lora_config, model_skeleton, start_executor
from ..distributed.executor import UniProcExecutor
from ..distributed.parallel import BACKENDS
from ..kv_cache import (
    BlockOffloader,
    CPUTier,
    DiskTier,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    MambaSpec,
    MLASpec,
    OffloadManager,
    SlidingWindowSpec,
    group_layers,
)
from ..kv_cache.eviction import EVICTION_POLICIES
from ..kv_cache.request_hashing import HASH_ALGORITHMS
from ..lora import LoRARequest
from ..model import load_model
from ..model.config import DTYPES, ModelConfig
from ..model.eplb import EPLBConfig, ExpertBalancer
from ..model.kv_scales import read_kv_scales
from ..model.loader import safetensors_files
from ..model.pooling import RUNNERS, TASKS, Pooler, PoolerConfig, supported_tasks
from ..ops import load as load_ops
from ..ops._fp8 import KV_CACHE_DTYPES
from ..sample.logits_processor import load_logits_processors
from ..sample.sampler import LOGPROBS_MODES
from ..sched.outputs import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineStats,
    ModelRunnerOutput,
    SchedulerOutput,
)
from ..sched.policy import POLICIES
from ..sched.request import Request, RequestStatus
from ..sched.scheduler import Scheduler, SchedulerConfig
from ..spec_decode import SpeculativeConfig, make_proposer
from ..spec_decode.tree import cut_tree
from ..tokenize.loader import TOKENIZER_BACKENDS
from ..worker.cuda_graph import DEFAULT_CAPTURE_SIZES
from ..worker.model_runner import GRAPH_MODES, ModelRunner
from .admission import Limits, check_request

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVOffloadConfig:
    """Where KV blocks evicted from the prefix cache go, to be found again later (vLLM's
    KV offloading): host memory, then optionally files on a local disk.

    cpu_blocks: blocks kept in host memory, >= 1.
    disk_dir: a directory for a second tier of block files, or None. Its files are keyed
        by the model's architecture, KV layout and tokens, not by its weights: give
        each model its own directory.
    disk_blocks: blocks kept under disk_dir: >= 1 with a disk_dir, 0 without one.
    A block here is one block id's KV in every layer of its KV cache group.
    """

    cpu_blocks: int
    disk_dir: str | Path | None = None
    disk_blocks: int = 0

    def __post_init__(self) -> None:
        for name in ("cpu_blocks", "disk_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"kv_offload.{name} must be an int, got {value!r}")
        if self.cpu_blocks < 1:
            raise ValueError(f"kv_offload.cpu_blocks must be >= 1, got {self.cpu_blocks}")
        if not isinstance(self.disk_dir, (str, Path, type(None))):
            raise TypeError(
                f"kv_offload.disk_dir must be None, a str or a Path, got {self.disk_dir!r}"
            )
        if (self.disk_dir is None) != (self.disk_blocks == 0) or self.disk_blocks < 0:
            raise ValueError(
                "kv_offload.disk_blocks must be >= 1 with a disk_dir and 0 without one, "
                f"got disk_blocks={self.disk_blocks} with disk_dir={self.disk_dir!r}"
            )

    @classmethod
    def from_dict(cls, value: dict) -> KVOffloadConfig:
        """From a dict of the fields (a JSON object on the command line)."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"kv_offload has unknown keys {unknown}; its keys are {known}")
        if "cpu_blocks" not in value:
            raise ValueError(f"kv_offload needs cpu_blocks, got {value!r}")
        return cls(**value)

    def make_tiers(self) -> OffloadManager:
        """The offload tiers: host memory, then the disk if set."""
        tiers = [CPUTier(self.cpu_blocks)]
        if self.disk_dir is not None:
            tiers.append(DiskTier(self.disk_dir, self.disk_blocks))
        return OffloadManager(tiers, enable_events=False)


@dataclass
class EngineConfig:
    """Everything that sizes and shapes an engine (vLLM's engine arguments, abridged).

    Each field below is also a `pyagent` command-line flag (`max_num_seqs` is
    --max-num-seqs), whose help is the field's entry here.

    model: HF model directory or llama.cpp .gguf file; None is the embedded default model.
    tokenizer: the directory of the tokenizer; None: the model's (a .gguf file's own
        vocabulary when it is byte-level BPE).
    dtype: the weights' and activations' dtype.
    device: the torch device the model runs on.
    block_size: tokens per KV cache block.
    num_kv_blocks: KV cache blocks (block 0 is the null block); None sizes the cache
        from kv_cache_memory_bytes.
    kv_cache_memory_bytes: the KV cache's memory when num_kv_blocks is None.
    kv_cache_dtype: the KV cache's element type: "auto" (the model's dtype) or FP8
        ("fp8" = "fp8_e4m3", "fp8_e5m2"): one byte per value, so the same memory holds
        2x the blocks of a float16 model, 4x those of a float32 one. Each layer's keys
        and values are divided by its k_scale / v_scale (the checkpoint's
        `self_attn.k_scale` / `v_scale` tensors, else 1.0) and saturated to the format
        (`ops.attention.reshape_and_cache`). Not for MLA or encoder models.
    calculate_kv_scales: with an fp8 kv_cache_dtype, compute each layer's scales from
        the first batch it runs (its largest |k|, |v| at a quarter of the format's
        range) instead of the checkpoint's; not with CUDA graphs or kv_offload (blocks
        written under other scales could be read back).
    max_num_seqs: the most requests running in one step.
    max_num_batched_tokens: the most tokens (prefill and decode) in one step.
    max_model_len: prompt + output tokens of one request; None takes the model's
        context, lowered (with a logged warning) to what the KV cache holds for one
        request and, without chunked prefill, to max_num_batched_tokens. A value set
        here that exceeds either is a ValueError instead.
    enable_chunked_prefill: split long prompts across steps to fit the token budget.
    enable_prefix_caching: reuse the KV blocks of prompts' shared prefixes.
    eviction: which cached block to evict first: "lru" or "arc".
    prefix_caching_hash_algo: the prefix cache's block hashes: "sha256" or "xxh3_128"
        (pyagent's, `ops.hashing`) or "sha256_cbor" (vLLM's, byte for byte, rooted in
        $PYTHONHASHSEED or "vllm-none-hash": `kv_cache.vllm_hashing`), so that routers
        built for vLLM's KV events key this engine's blocks alike.
    kv_events_endpoint: None, or where the engine publishes its prefix cache's changes
        after every step, in vLLM's KV event format over ZeroMQ (`dp.kv_events`), e.g.
        "tcp://127.0.0.1:5557" or "ipc:///tmp/kv-events".
    policy: the order the waiting requests are admitted in (see `sched.policy`).
    ops: "ref", "accel" or "auto": the ops namespace of everything the engine computes
        (sampling, hashing, block tables and the model's layers, RoPE and attention);
        "auto" runs each op on the accelerator for host arrays and on the reference for
        device tensors (see `pyagent_ref.ops.load`).
    attention_backend: the attention ops' implementation: "auto" (the ops' own), "ref",
        "accel", "sdpa" or "flex" (see `pyagent_ref.attention_backends`).
    enforce_eager: never replay CUDA graphs (graph_mode "eager").
    graph_mode: "auto", "eager" or "static" (see `ModelRunner`).
    cudagraph_capture_sizes: the decode batch sizes CUDA graphs are captured for.
    compile: torch.compile the forward: True (inductor) or a backend name.
    max_logprobs: the most log-probabilities a request may ask for per token.
    logprobs_mode: what the returned log-probabilities are taken from (vLLM's names):
        "raw_logprobs" (the model's distribution, before any sampling parameter),
        "raw_logits", "processed_logprobs" (the distribution tokens are drawn from:
        after penalties, bias, masks, temperature and truncation) or "processed_logits".
        Prompt logprobs are always raw log-probabilities.
    tokenizer_backend: "library" (HF tokenizers / tiktoken), "pyagent" (our byte-level
        BPE, `tokenize.bpe`, in Rust when the ops are the accelerator's) or "auto" (ours
        where it supports the vocabulary, else the library).
    kv_offload: None, or where blocks evicted from the prefix cache go to be found
        again (`KVOffloadConfig`, or a dict of its fields); needs prefix caching.
    disable_hybrid_kv_cache_manager: give sliding-window layers full-attention KV (every
        block kept) instead of their own KV cache groups (see `kv_cache_groups`).
    logits_processors: custom logits processors (`sample.logits_processor`): their
        classes, or import paths "module:Class"; one instance each per engine, applied
        to every step's batch in this order.
    speculative_config: None, or speculative decoding: how drafts of each request's
        next tokens are proposed and verified in one forward pass (`SpeculativeConfig`,
        or a dict of its fields under vLLM's names: method "ngram", "suffix",
        "draft_model" or "medusa", num_speculative_tokens, prompt_lookup_min/max,
        suffix_decoding_*, model (the draft checkpoint or the Medusa heads)). Greedy
        outputs stay the same token for token,
        sampled ones the same in distribution.
    eplb: None, or expert-parallel load balancing of a mixture of experts (`EPLBConfig`,
        or a dict of its fields: num_ranks, num_redundant_experts, num_nodes,
        window_size, step_interval): the experts' loads are counted over a window of
        steps and their replicas re-placed on the ranks every step_interval steps
        (`model.eplb`). Outputs do not change; CUDA graphs are not recorded (the load
        is read on the host every step).
    enable_lora: serve LoRA adapters (PEFT's format) per request (`LoRARequest`); off,
        the model has no adapter slots and a request naming one is refused.
    max_loras: adapters one step may use (the slots of every adapted layer); requests
        of more adapters wait.
    max_lora_rank: the largest adapter rank served (the slots' rank).
    max_cpu_loras: adapters kept loaded on the host, least recently used evicted first;
        None: max_loras.
    runner: what the engine serves (vLLM's names): "generate" (text generation),
        "pooling" (embed, classify, score: `model.pooling`) or "auto" (what the model
        can: a decoder both, an encoder (BERT) pooling only). Requests of the other kind
        are refused at admission, naming the runner.
    task: "auto", or the one task the engine is for ("generate", "embed", "classify",
        "score"; its runner follows): refused at start if the model cannot do it.
    otlp_traces_endpoint: None, or where the frontend sends OpenTelemetry spans of each
        request (`observe.tracing`): an OTLP/HTTP traces URL, or "console" (stdout).
    profiler_dir: None, or the directory torch.profiler traces are written to between
        start_profile and stop_profile (`observe.profiler`); None disables profiling.
    limit_mm_per_prompt: the most images one prompt of a vision-language model may carry.
    encoder_cache_size: image positions (decoder rows) the encoder cache keeps for the
        requests using them and later ones with the same image; None: the most image
        positions one step may encode, max(max_num_batched_tokens, one image's).
    tensor_parallel_size: ranks each layer is split across (heads, MLP features,
        vocabulary: `distributed.tensor_parallel`).
    pipeline_parallel_size: stages the decoder layers are split into, micro-batches of
        a step flowing through them (`distributed.model`).
    distributed_executor_backend: how the ranks run: "uni" (in this process; one rank
        only), "mp" (a process per rank, torch.distributed: gloo on CPU, NCCL on CUDA)
        or "ray" (Ray actors in a placement group); None: "uni" for one rank, else "mp".
        With "mp" or "ray" every rank loads the model directory itself.
    ray_address: with the "ray" backend, the cluster to join ("host:port",
        "ray://host:port", "auto"); None: the Ray instance this process already joined,
        else a local one.
    """

    model: str | Path | None = None
    tokenizer: str | Path | None = None
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 256 * 2**20
    kv_cache_dtype: str = "auto"
    calculate_kv_scales: bool = False
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    eviction: str = "lru"
    prefix_caching_hash_algo: str = "sha256"
    kv_events_endpoint: str | None = None
    policy: str = "fcfs"
    ops: str = "auto"
    attention_backend: str = "auto"
    enforce_eager: bool = False
    graph_mode: str = "auto"
    cudagraph_capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    compile: bool | str = False
    max_logprobs: int = 20
    logprobs_mode: str = "raw_logprobs"
    tokenizer_backend: str = "auto"
    kv_offload: KVOffloadConfig | dict | None = None
    disable_hybrid_kv_cache_manager: bool = False
    logits_processors: tuple[type | str, ...] = ()
    speculative_config: SpeculativeConfig | dict | None = None
    eplb: EPLBConfig | dict | None = None
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    runner: str = "auto"
    task: str = "auto"
    otlp_traces_endpoint: str | None = None
    profiler_dir: str | None = None
    limit_mm_per_prompt: int = 4
    encoder_cache_size: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    ray_address: str | None = None

    def __post_init__(self) -> None:
        """Type and range checks of every field, before any model is loaded: TypeError
        for a value of the wrong type, ValueError for one out of range or at odds with
        another field. A kv_offload dict becomes a `KVOffloadConfig`."""
        for name, (types, ok, what) in _CONFIG_RULES.items():
            value, types = getattr(self, name), types if isinstance(types, tuple) else (types,)
            wrong_type = not isinstance(value, types) or (
                isinstance(value, bool) and bool not in types
            )
            if wrong_type or not ok(value):
                raise (TypeError if wrong_type else ValueError)(
                    f"{name} must be {what}, got {value!r}"
                )
        if isinstance(self.kv_offload, dict):
            self.kv_offload = KVOffloadConfig.from_dict(self.kv_offload)
        if isinstance(self.speculative_config, dict):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        if isinstance(self.eplb, dict):
            self.eplb = EPLBConfig.from_dict(self.eplb)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras must be >= max_loras={self.max_loras}, got {self.max_cpu_loras}"
            )
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        if self.distributed_executor_backend == "uni" and world > 1:
            raise ValueError(
                "distributed_executor_backend='uni' runs one rank, but tensor_parallel_size "
                f"x pipeline_parallel_size = {world}; use 'mp' or 'ray'"
            )
        if self.ray_address is not None and self.distributed_executor_backend != "ray":
            raise ValueError(
                f"ray_address={self.ray_address!r} needs distributed_executor_backend='ray', "
                f"got {self.distributed_executor_backend!r}"
            )
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError(
                "calculate_kv_scales computes the scales of an fp8 KV cache, but "
                "kv_cache_dtype='auto'; set kv_cache_dtype='fp8'"
            )
        if self.calculate_kv_scales and self.kv_offload is not None:
            raise ValueError(
                "calculate_kv_scales with kv_offload: offloaded blocks written under another "
                "run's scales would be read with this run's; load the scales from the checkpoint"
            )
        if self.kv_cache_dtype != "auto" and world > 1:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} runs in one process here; it is not "
                f"available with tensor_parallel_size x pipeline_parallel_size = {world}"
            )
        if self.kv_offload is not None and not self.enable_prefix_caching:
            raise ValueError(
                "kv_offload needs enable_prefix_caching=True: offloaded blocks are found "
                "by their prefix-cache keys"
            )


_ANY = lambda v: True  # noqa: E731
_OPTIONAL_INT = (int, type(None))
# field -> (accepted types, range check, what it must be)
_CONFIG_RULES = {
    "model": ((str, Path, type(None)), _ANY, "None, a str or a Path"),
    "dtype": (str, lambda v: v in DTYPES, f"one of {DTYPES}"),
    "device": (str, lambda v: bool(v), "a torch device name like 'cpu' or 'cuda:0'"),
    "block_size": (int, lambda v: v >= 1, "an int >= 1"),
    "num_kv_blocks": (_OPTIONAL_INT, lambda v: v is None or v >= 2, "None or an int >= 2"),
    "kv_cache_memory_bytes": (int, lambda v: v >= 1, "an int >= 1"),
    "kv_cache_dtype": (str, lambda v: v in KV_CACHE_DTYPES, f"one of {KV_CACHE_DTYPES}"),
    "calculate_kv_scales": (bool, _ANY, "a bool"),
    "max_num_seqs": (int, lambda v: v >= 1, "an int >= 1"),
    "max_num_batched_tokens": (int, lambda v: v >= 1, "an int >= 1"),
    "max_model_len": (_OPTIONAL_INT, lambda v: v is None or v >= 2, "None or an int >= 2"),
    "enable_chunked_prefill": (bool, _ANY, "a bool"),
    "enable_prefix_caching": (bool, _ANY, "a bool"),
    "eviction": (str, lambda v: v in EVICTION_POLICIES, f"one of {EVICTION_POLICIES}"),
    "prefix_caching_hash_algo": (
        str,
        lambda v: v in HASH_ALGORITHMS,
        f"one of {HASH_ALGORITHMS}",
    ),
    "kv_events_endpoint": (
        (str, type(None)),
        lambda v: v is None or "://" in v,
        "None or a ZeroMQ endpoint like 'tcp://127.0.0.1:5557'",
    ),
    "policy": (str, lambda v: v in POLICIES, f"one of {tuple(POLICIES)}"),
    "ops": (str, lambda v: v in ("ref", "accel", "auto"), "'ref', 'accel' or 'auto'"),
    "attention_backend": (str, lambda v: v in ATTENTION_BACKENDS, f"one of {ATTENTION_BACKENDS}"),
    "enforce_eager": (bool, _ANY, "a bool"),
    "graph_mode": (str, lambda v: v in GRAPH_MODES, f"one of {GRAPH_MODES}"),
    "cudagraph_capture_sizes": (
        (tuple, list),
        lambda v: all(type(n) is int and n >= 1 for n in v),
        "a tuple of ints >= 1",
    ),
    "compile": ((bool, str), _ANY, "a bool or a torch.compile backend name"),
    "max_logprobs": (int, lambda v: v >= 0, "an int >= 0"),
    "logprobs_mode": (str, lambda v: v in LOGPROBS_MODES, f"one of {LOGPROBS_MODES}"),
    "tokenizer_backend": (str, lambda v: v in TOKENIZER_BACKENDS, f"one of {TOKENIZER_BACKENDS}"),
    "kv_offload": (
        (KVOffloadConfig, dict, type(None)),
        _ANY,
        "None, a KVOffloadConfig or a dict of its fields",
    ),
    "disable_hybrid_kv_cache_manager": (bool, _ANY, "a bool"),
    "logits_processors": (
        (tuple, list),
        lambda v: all(isinstance(e, (type, str)) for e in v),
        "a tuple of LogitsProcessor classes or import paths",
    ),
    "speculative_config": (
        (SpeculativeConfig, dict, type(None)),
        _ANY,
        "None, a SpeculativeConfig or a dict of its fields",
    ),
    "eplb": ((EPLBConfig, dict, type(None)), _ANY, "None, an EPLBConfig or a dict of its fields"),
    "enable_lora": (bool, _ANY, "a bool"),
    "max_loras": (int, lambda v: v >= 1, "an int >= 1"),
    "max_lora_rank": (int, lambda v: v >= 1, "an int >= 1"),
    "max_cpu_loras": (_OPTIONAL_INT, lambda v: v is None or v >= 1, "None or an int >= 1"),
    "runner": (str, lambda v: v in RUNNERS, f"one of {RUNNERS}"),
    "task": (str, lambda v: v in TASKS, f"one of {TASKS}"),
    "otlp_traces_endpoint": ((str, type(None)), lambda v: v != "", "None or a URL or 'console'"),
    "profiler_dir": ((str, type(None)), lambda v: v != "", "None or a directory"),
    "limit_mm_per_prompt": (int, lambda v: v >= 1, "an int >= 1"),
    "encoder_cache_size": (_OPTIONAL_INT, lambda v: v is None or v >= 1, "None or an int >= 1"),
    "tensor_parallel_size": (int, lambda v: v >= 1, "an int >= 1"),
    "pipeline_parallel_size": (int, lambda v: v >= 1, "an int >= 1"),
    "distributed_executor_backend": (
        (str, type(None)),
        lambda v: v is None or v in BACKENDS,
        f"None or one of {BACKENDS}",
    ),
    "ray_address": ((str, type(None)), _ANY, "None or a str"),
}


def kv_cache_groups(
    config: ModelConfig,
    block_size: int,
    dtype_bytes: int,
    hybrid: bool = True,
    kv_dtype_bytes: int | None = None,
) -> tuple[KVCacheGroup, ...]:
    """The KV cache groups of a model, from its `layer_types`.

    A "sliding_attention" layer keeps a `SlidingWindowSpec` of the model's window (its
    blocks that leave the window go back to the pool), a "full_attention" layer a
    `FullAttentionSpec`; layers are cut into groups of equal size (`group_layers`) that
    share the KV tensors. With hybrid=False every layer keeps full-attention KV: one
    group, the layout of an engine that ignores the window (the model still masks by it).
    A model with multi-head latent attention (`config.mla`) keeps an `MLASpec` per layer:
    one latent of kv_lora_rank + qk_rope_head_dim per token. "mamba" layers keep a state
    per request (`MambaSpec`: the convolution's conv_kernel - 1 inputs in the model's
    dtype and the float32 SSM state), all in one group. Layer names are the decoder
    layers' paths, "layers.<i>". kv_dtype_bytes: the bytes of one cached key or value
    element (1 for an fp8 cache), dtype_bytes by default.
    """
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    shape = (block_size, config.num_key_value_heads, config.head_dim, kv_bytes)

    def spec(kind: str) -> FullAttentionSpec | MambaSpec:
        if kind == "mamba":
            m = config.mamba
            conv = m.conv_dim * (m.conv_kernel - 1) * dtype_bytes
            return MambaSpec(block_size, conv + m.num_heads * m.head_dim * m.state_size * 4)
        if config.mla is not None:
            return MLASpec(block_size, 1, config.mla.latent_size, dtype_bytes)
        if hybrid and kind == "sliding_attention":
            return SlidingWindowSpec(*shape, sliding_window=config.sliding_window)
        return FullAttentionSpec(*shape)

    return group_layers({f"layers.{i}": spec(k) for i, k in enumerate(config.layer_types)})


class EngineCore:
    """Scheduler + KV cache manager + model runner, stepping together."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: EngineConfig,
        clock=time.monotonic,
        kv_scales: dict[int, tuple[float, float]] | None = None,
    ) -> None:
        """kv_scales: each layer's (k_scale, v_scale) for an fp8 KV cache (the
        checkpoint's, `model.kv_scales`; `from_config` reads them); None: 1.0."""
        self.config = config
        self.ops = with_attention_backend(load_ops(config.ops), config.attention_backend)
        model.use_ops(self.ops)  # the model's layers run on the engine's ops
        mcfg = model.config
        self.tasks = supported_tasks(mcfg, config.runner, config.task)
        self.encoder = not mcfg.is_causal
        if set(self.tasks) - {"generate"} and not hasattr(self.ops, "pooling"):
            raise ValueError(
                f"the ops namespace {getattr(self.ops, '__name__', self.ops)!r} lacks the "
                "pooling module this engine's pooling requests need; use ops='auto' or 'ref' "
                "(or runner='generate')"
            )
        if config.kv_offload is not None and self.encoder:
            raise ValueError(
                f"kv_offload keeps KV blocks for later requests, but {mcfg.architecture} is an "
                "encoder: its KV serves one prompt's step and is never reused"
            )
        if config.speculative_config is not None and "generate" not in self.tasks:
            raise ValueError(
                f"speculative_config drafts tokens, but this engine does not generate "
                f"(runner={config.runner!r}, task={config.task!r}, {mcfg.architecture})"
            )
        if config.max_model_len is not None and config.max_model_len > mcfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's context "
                f"(max_position_embeddings={mcfg.max_position_embeddings}); lower it"
            )
        self.logits_processor_classes = load_logits_processors(config.logits_processors)
        self.profiler = None  # built at the first start_profile
        self.backend = check_distributed(config, mcfg)
        self.lora = None
        if config.enable_lora:  # before the runner: CUDA graphs record the adapted layers
            from ..lora.manager import LoRAManager

            share = None
            if self.backend != "uni":  # the ranks hold the weights; here: the checks
                from ..distributed.lora import AdapterShare

                share = AdapterShare(model, {})
            self.lora = LoRAManager(model, lora_config(config), self.ops, share=share)
        dtype = next(model.parameters()).dtype
        self.kv_scales = kv_scales
        self._use_kv_cache_dtype(model, kv_scales)
        groups = kv_cache_groups(
            mcfg,
            config.block_size,
            dtype.itemsize,
            hybrid=not config.disable_hybrid_kv_cache_manager,
            kv_dtype_bytes=None if config.kv_cache_dtype == "auto" else 1,
        )
        # state-space layers: one state slot per running request (slot 0 is the null slot)
        num_state_slots = config.max_num_seqs + 1 if mcfg.mamba is not None else 0
        enable_caching = self._prefix_caching(mcfg)
        if config.num_kv_blocks is not None:
            kv_config = KVCacheConfig(config.num_kv_blocks, groups, num_state_slots)
        else:
            kv_config = KVCacheConfig.from_memory(
                config.kv_cache_memory_bytes, groups, num_state_slots
            )
        self.kv = KVCacheManager(
            kv_config,
            ops=self.ops,
            # an encoder's KV of a block depends on its whole prompt: never shared
            enable_caching=enable_caching and not self.encoder,
            eviction=config.eviction,
            hash_algorithm=config.prefix_caching_hash_algo,
            enable_events=config.kv_events_endpoint is not None,
        )
        self.kv_events = None
        if config.kv_events_endpoint is not None:
            from ..dp.kv_events import KVEventPublisher

            self.kv_events = KVEventPublisher(config.kv_events_endpoint, root=self.kv.hasher.root)
        max_model_len = self._fit_max_model_len(mcfg.max_position_embeddings)
        encoder_tokens, cache_size = self._encoder_sizes(model)
        self.scheduler_config = SchedulerConfig(
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            policy=config.policy,
            max_loras=config.max_loras if config.enable_lora else 0,
            bidirectional=self.encoder,
            max_num_encoder_tokens=encoder_tokens,
            encoder_cache_size=cache_size,
        )
        self.scheduler = Scheduler(self.scheduler_config, self.kv, clock)
        runner_args = dict(
            num_blocks=kv_config.num_blocks,
            block_size=config.block_size,
            max_num_reqs=config.max_num_seqs,
            max_model_len=max_model_len,
            max_num_tokens=config.max_num_batched_tokens,
            kv_groups=groups,
            logprobs_mode=config.logprobs_mode,
            num_state_slots=kv_config.num_state_slots,
            rows_per_request=_rows_per_request(config.speculative_config),
        )
        if self.backend == "uni":
            self.runner = ModelRunner(
                model,
                ops=self.ops,
                graph_mode="eager" if config.enforce_eager or config.eplb else config.graph_mode,
                capture_sizes=config.cudagraph_capture_sizes,
                compile=config.compile,
                logits_processors=[cls(mcfg.vocab_size) for cls in self.logits_processor_classes],
                lora=self.lora,
                pooler=Pooler(self.ops, model, PoolerConfig.from_model(mcfg, config.model)),
                **runner_args,
            )
            self.executor = UniProcExecutor(self.runner)
        else:  # the ranks hold the model and its runners; the engine talks to them
            self.runner = None
            self.executor = start_executor(config, mcfg, runner_args, self.logits_processor_classes)
        if config.kv_offload is not None:
            namespace = f"{mcfg.architecture}|{dtype}|{groups!r}"
            if config.kv_cache_dtype != "auto":  # fp8 codes mean nothing under other scales
                namespace += f"|{config.kv_cache_dtype}|{kv_scales}"
            self.kv.enable_offload(
                BlockOffloader(config.kv_offload.make_tiers(), self.runner, namespace)
            )
        self.max_model_len = max_model_len
        self.limits = Limits(
            mcfg.vocab_size,
            max_model_len,
            config.max_logprobs,
            tasks=self.tasks,
            runner=config.runner,
            architecture=mcfg.architecture,
            whole_prompt_tokens=config.max_num_batched_tokens if self.encoder else None,
        )
        self.asleep = False
        self.accepting = True
        self.stats = EngineStats()
        spec = config.speculative_config
        self.proposer = None
        if spec is not None:  # here, in the engine's process; the ranks verify the drafts
            device = None if self.backend == "uni" else config.device  # `model`: shapes only
            self.proposer = make_proposer(spec, self.ops, model, device)
        # a proposer drafting from the target's hidden states (Medusa) gets the last ones
        if self.runner is not None:
            self.runner.keep_hidden_states = getattr(self.proposer, "needs_hidden_states", False)
        self._hidden_states: dict = {}
        self._lock = threading.RLock()
        self.eplb = ExpertBalancer(model, config.eplb) if config.eplb is not None else None

    def _encoder_sizes(self, model: torch.nn.Module) -> tuple[int, int]:
        """(image positions one step may encode, the encoder cache's size): both at least
        the largest image's (`multimodal.processor.max_image_positions`; 0, 0 for a model
        without images: the scheduler's defaults)."""
        from ..model import default_model_path
        from ..multimodal.processor import max_image_positions

        vision = getattr(model, "vision", None)
        if vision is None:
            return 0, 0
        arch = model.config.architecture
        image = max_image_positions(self.config.model or default_model_path(), arch, vision)
        per_step = max(self.config.max_num_batched_tokens, image)
        size = self.config.encoder_cache_size or per_step
        if size < image:
            raise ValueError(
                f"encoder_cache_size={size} cannot hold one image of {arch} ({image} positions)"
            )
        return per_step, size

    def _prefix_caching(self, mcfg: ModelConfig) -> bool:
        """Whether the KV cache caches prefixes: as configured, but never for a model with
        state-space layers (logged), and options that need it or a state rollback are
        refused for such a model.

        Raises:
            ValueError: kv_offload or speculative_config for a model with state layers.
        """
        config = self.config
        if mcfg.mamba is None:
            return config.enable_prefix_caching
        arch = mcfg.architecture
        if config.speculative_config is not None:
            raise ValueError(
                f"speculative_config is not supported for {arch}: its state-space layers "
                "would need their state rolled back past rejected drafts, which is not "
                "implemented"
            )
        if config.kv_offload is not None:
            raise ValueError(
                f"kv_offload is not supported for {arch}: it moves prefix-cache blocks, and "
                "a model with state-space layers runs without prefix caching"
            )
        if config.enable_prefix_caching:
            logger.warning(
                "prefix caching is disabled for %s: its state-space layers keep each "
                "request's state after its last token only, none at block boundaries, so a "
                "cached prefix could not be resumed",
                arch,
            )
        return False

    def _fit_max_model_len(self, model_len: int) -> int:
        """max_model_len within what one request can ever use: the tokens the whole KV
        cache holds and, without chunked prefill, one step's token budget. A value the
        user chose that exceeds them is an error; the model's own is lowered, logged."""
        config = self.config
        wanted = config.max_model_len or model_len
        bounds = [
            (
                self.kv.max_tokens_per_request(config.max_num_batched_tokens, wanted),
                "the KV cache holds for one request",
                "give it more blocks (num_kv_blocks, kv_cache_memory_bytes)",
            )
        ]
        if not config.enable_chunked_prefill or self.encoder:
            bounds.append(
                (
                    config.max_num_batched_tokens,
                    "max_num_batched_tokens allows in one step (an encoder's prompt runs whole)"
                    if self.encoder
                    else "max_num_batched_tokens allows without chunked prefill",
                    "raise max_num_batched_tokens"
                    if self.encoder
                    else "raise max_num_batched_tokens or enable chunked prefill",
                )
            )
        for bound, what, fix in bounds:
            if wanted <= bound:
                continue
            if config.max_model_len is not None:
                raise ValueError(
                    f"max_model_len={wanted} exceeds the {bound} tokens {what}: {fix}, "
                    "or lower max_model_len"
                )
            if bound < 2:
                raise ValueError(f"only {bound} token(s) {what}: {fix}")
            logger.warning(
                "max_model_len lowered from %d to %d, the tokens %s", wanted, bound, what
            )
            wanted = bound
        return wanted

    def _use_kv_cache_dtype(self, model: torch.nn.Module, kv_scales) -> None:
        """Give the model the configured KV cache dtype and scales (before its cache is
        allocated); ValueError for a model that cannot keep an fp8 cache."""
        config, mcfg = self.config, model.config
        if config.kv_cache_dtype == "auto":
            if hasattr(model, "set_kv_cache_dtype"):  # a model an earlier engine set to fp8
                model.set_kv_cache_dtype("auto")
            return
        if self.encoder or not hasattr(model, "set_kv_cache_dtype"):
            raise ValueError(
                f"kv_cache_dtype={config.kv_cache_dtype!r}: {mcfg.architecture} keeps no "
                "fp8 KV cache here (encoders and MLA models); use 'auto'"
            )
        graphs = not config.enforce_eager and config.graph_mode == "auto"
        if config.calculate_kv_scales and graphs and torch.device(config.device).type == "cuda":
            raise ValueError(
                "calculate_kv_scales sets the scales at the first batch, after CUDA graphs "
                "recorded the old ones: set enforce_eager=True (or load the scales)"
            )
        model.set_kv_cache_dtype(config.kv_cache_dtype, kv_scales, config.calculate_kv_scales)

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineCore:
        from ..model import default_model_path

        path = config.model or default_model_path()
        if config.tensor_parallel_size * config.pipeline_parallel_size > 1:
            # the ranks load the weights; the engine needs the architecture alone
            return cls(model_skeleton(path, config.dtype), config)
        model = load_model(path, config.dtype, config.device, progress=False)
        kv_scales = None
        if config.kv_cache_dtype != "auto" and not config.calculate_kv_scales:
            kv_scales = read_kv_scales(safetensors_files(Path(path)))
        return cls(model, config, kv_scales=kv_scales)

    # --- requests ----------------------------------------------------------------------

    def check_request(self, request: Request) -> None:
        """Raise if the engine cannot take `request` now (see `admission`); no effect."""
        if not self.accepting:
            raise RuntimeError("the engine is shutting down and accepts no new requests")
        if self.asleep:
            raise RuntimeError("the engine is asleep: call wake_up() before adding requests")
        check_request(request, self.limits)
        cfg = self.scheduler_config
        for feature in request.mm_features:  # dynamic resolution: images differ in size
            if feature.length > min(cfg.max_num_encoder_tokens, cfg.encoder_cache_size):
                raise ValueError(
                    f"an image of request {request.request_id!r} fills {feature.length} "
                    f"positions, more than one step may encode ({cfg.max_num_encoder_tokens}: "
                    f"max_num_batched_tokens) or the encoder cache holds "
                    f"({cfg.encoder_cache_size}: encoder_cache_size); send a smaller image "
                    "or lower the image processor's max_pixels"
                )
        if request.lora_request is not None and not self.config.enable_lora:
            raise ValueError(
                f"request {request.request_id!r} names LoRA adapter "
                f"{request.lora_request.lora_name!r}, but LoRA is not enabled: start the "
                "engine with enable_lora=True (--enable-lora)"
            )
        for processor in self.logits_processor_classes:
            processor.validate_params(request.sampling_params)

    def add_request(self, request: Request) -> None:
        """Queue `request` after `check_request`; its LoRA adapter is loaded now, so that
        one that cannot be served raises here (see `add_lora`)."""
        with self._lock:
            self.check_request(request)
            if request.lora_request is not None:
                self.add_lora(request.lora_request)
            self.scheduler.add_request(request)

    # --- LoRA adapters (enable_lora) -----------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter into the host cache (read, validated against the model and
        fitted once; a no-op if it is loaded). Returns True.

        Raises:
            ValueError: LoRA is not enabled; the adapter cannot be served (its
                configuration, rank, modules or shapes: the message names what); its id
                names another adapter.
            FileNotFoundError: its directory or files are missing.
        """
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {lora_request!r}")
        with self._lock:
            self._lora_manager().add_adapter(lora_request)
            return True

    def remove_lora(self, lora_id: int) -> bool:
        """Unload an adapter; False if it is not loaded. Requests using it go on (it is
        read again when they need it)."""
        with self._lock:
            return self._lora_manager().remove_adapter(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        """Keep a loaded adapter in the host cache for good (see `LoRAManager.pin_adapter`)."""
        with self._lock:
            self._lora_manager().pin_adapter(lora_id)
            return True

    def list_loras(self) -> list[int]:
        """The ids of the loaded adapters."""
        with self._lock:
            return [r.lora_int_id for r in self._lora_manager().list_adapters()]

    def _lora_manager(self):
        if self.lora is None:
            raise ValueError("LoRA is not enabled: start the engine with enable_lora=True")
        return self.lora

    def abort_requests(
        self, request_ids, status: RequestStatus = RequestStatus.FINISHED_ABORTED, error=None
    ) -> list[EngineCoreOutput]:
        """End requests wherever they are (abort, or an error found outside the core);
        their blocks are freed at once. Returns their final outputs."""
        with self._lock:
            known = dict(self.scheduler.requests) if self.proposer is not None else {}
            outputs = self.scheduler.finish_requests(request_ids, status, error)
            if self.proposer is not None:
                self._finish_proposals(outputs, known)
            self._forget_when_idle()
            return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def unfinished_request_ids(self) -> list[str]:
        return [r.request_id for r in [*self.scheduler.running, *self.scheduler.waiting]]

    # --- the loop ----------------------------------------------------------------------

    def step(self) -> EngineCoreOutputs:
        """Schedule, execute, update: one iteration of continuous batching.

        If the model forward raises (or a KeyboardInterrupt arrives), the requests of
        this step finish with finish_reason "error" and the engine stays usable; the
        outputs say so (a KeyboardInterrupt is raised again once they are failed).
        """
        with self._lock:
            if self.asleep:
                raise RuntimeError("the engine is asleep: call wake_up() first")
            known = dict(self.scheduler.requests) if self.proposer is not None else {}
            sched = self.scheduler.schedule()
            grammar_errors = self._fill_grammar_bitmasks(sched)
            try:
                result = self.executor.execute_model(sched)
            except BaseException as exc:
                self._fail_step(sched, exc)
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt: the next step reports the failed requests
                result = ModelRunnerOutput({})
            result.errors.update(grammar_errors)
            if self.eplb is not None and not sched.is_empty:
                self.eplb.step()
            self._hidden_states = result.hidden_states
            outputs = self.scheduler.update_from_output(sched, result)
            self.stats.add(outputs.stats)
            if self.proposer is not None:
                self._finish_proposals(outputs.outputs, known)
                self._propose_drafts()
            self._forget_when_idle()
            if self.kv_events is not None:
                self.kv_events.publish(self.kv.take_events())
            return outputs

    def _forget_when_idle(self) -> None:
        """The runner learns which requests ended from the next step's schedule; when no
        step will come (nothing left to run), an empty one tells it now, so that an idle
        engine holds no state of ended requests."""
        if not self.has_unfinished_requests() and self.scheduler.has_finished_requests():
            self.executor.execute_model(self.scheduler.schedule())

    def _finish_proposals(self, outputs: list[EngineCoreOutput], known: dict) -> None:
        """Tell the proposer which requests ended, and their outputs (`known`: the
        requests before they ended)."""
        for out in outputs:
            if out.finish_reason is not None and out.req_id in known:
                self.proposer.finish(out.req_id, known[out.req_id].output_token_ids)

    def _propose_drafts(self) -> None:
        """Speculative decoding: drafts for the next step of each running request that
        decodes (its tokens all computed but the last), at most as many as its
        max_tokens and the context leave room for. A request with structured outputs
        keeps the drafts its grammar allows, up to the first it refuses (linear drafts
        only: it gets no tree). Pooling requests get none, nor do those with mirostat
        (each token's truncation depends on the mu the previous token left, which a
        draft's verification row cannot know)."""
        trees = getattr(self.proposer, "needs_hidden_states", False)  # Medusa: draft trees
        tree_requests, linear_requests = [], []
        for request in self.scheduler.running:
            if (
                request.num_computed_tokens != request.num_tokens - 1
                or request.pooling_params is not None
                or request.sampling_params.mirostat
                or (trees and request.grammar is not None)
            ):
                continue
            if min(self._draft_room(request)) <= 0:
                continue
            if not trees:
                linear_requests.append(request)
            elif request.request_id in self._hidden_states:
                tree_requests.append(request)
        asked = [(r.request_id, r.prompt_token_ids, r.output_token_ids) for r in linear_requests]
        if hasattr(self.proposer, "propose_batch"):  # the draft model: one pass for all
            proposed = self.proposer.propose_batch(asked)
        else:
            proposed = [self.proposer.propose(*request) for request in asked]
        for request, drafts in zip(linear_requests, proposed, strict=True):
            drafts = drafts[: min(self._draft_room(request))]
            if request.grammar is not None:
                drafts = _allowed_prefix(request.grammar, drafts)
            request.spec_token_ids = drafts
        if tree_requests:  # one batch through the heads
            hidden = np.stack([self._hidden_states[r.request_id] for r in tree_requests])
            for request, tree in zip(
                tree_requests, self.proposer.propose_trees(hidden), strict=True
            ):
                tokens, parents = cut_tree(*tree, *self._draft_room(request))
                request.spec_token_ids, request.spec_parents = tokens, parents

    def _draft_room(self, request: Request) -> tuple[int, int]:
        """(KV slots, output tokens) a request's drafts may fill: the context left, and
        its max_tokens less the one token a step emits beyond its accepted drafts."""
        return (
            self.max_model_len - request.num_tokens,
            request.max_tokens - request.num_output_tokens - 1,
        )

    def _fill_grammar_bitmasks(self, sched: SchedulerOutput) -> dict[str, str]:
        """Structured outputs: the bitmasks of the tokens each grammar allows next, for
        the scheduled requests with a grammar that draw a token this step (their last
        known token is computed in it): one row (1, words), or with k drafts k + 1 rows,
        row i for the state after drafts 0 .. i-1 (the matcher follows the drafts, then
        rolls back). Rows past a draft the grammar refuses repeat that draft's row, which
        masks it out, so they are never read. A grammar that raises fails its request
        alone: the error is returned, and its rows allow nothing."""
        errors = {}
        words = -(-self.limits.vocab_size // 32)
        for rid in sched.num_scheduled_tokens:
            request = self.scheduler.requests[rid]
            if request.grammar is None or request.num_computed_tokens < request.num_tokens:
                continue
            drafts = sched.scheduled_spec_decode_tokens.get(rid, ())
            bitmask = np.zeros((1 + len(drafts), words), dtype=np.int32)
            try:
                grammar, followed = request.grammar, 0
                grammar.fill_next_token_bitmask(bitmask, 0)
                for i, token in enumerate(drafts):
                    if not grammar.accept_token(token):
                        bitmask[i + 1 :] = bitmask[i]
                        break
                    followed += 1
                    grammar.fill_next_token_bitmask(bitmask, i + 1)
                grammar.rollback(followed)
            except Exception as exc:
                logger.exception("the grammar of request %r failed", rid)
                errors[rid] = f"its structured output failed: {type(exc).__name__}: {exc}"
                bitmask[:] = 0
            sched.grammar_bitmask[rid] = bitmask
        return errors

    def _fail_step(self, sched: SchedulerOutput, exc: BaseException) -> None:
        """Fail the requests of a step whose forward pass raised, taking the blocks the
        step was to write out of the prefix cache (`Scheduler.fail_step`); the runner
        forgets them, so that its state matches the scheduler's again."""
        logger.error("the forward pass of a step failed", exc_info=exc)
        self.executor.forget(
            [*sched.num_scheduled_tokens, *sched.finished_req_ids, *sched.preempted_req_ids]
        )
        self.scheduler.fail_step(
            sched, f"the forward pass of its step failed: {type(exc).__name__}: {exc}"
        )

    # --- lifecycle ---------------------------------------------------------------------

    def sleep(self) -> None:
        """Release the KV cache memory (and its prefix cache) while idle; wake_up()
        allocates it again. Raises RuntimeError if requests are in flight."""
        with self._lock:
            if self.has_unfinished_requests():
                raise RuntimeError(
                    "cannot sleep with unfinished requests; abort or drain them first"
                )
            self.kv.reset_prefix_cache()
            self.executor.release_kv_cache()
            self.asleep = True

    def wake_up(self) -> None:
        with self._lock:
            if not self.asleep:
                return
            self.executor.allocate_kv_cache()
            self.asleep = False

    def stop_accepting(self) -> None:
        """From now on add_request raises RuntimeError."""
        self.accepting = False

    def start_profile(self) -> None:
        """Start torch.profiler (`observe.profiler`); RuntimeError without a
        profiler_dir or while it runs."""
        if self.config.profiler_dir is None:
            raise RuntimeError("profiling is not enabled: set profiler_dir (--profiler-dir)")
        if self.profiler is None:
            from ..observe.profiler import Profiler

            cuda = torch.device(self.config.device).type == "cuda"
            self.profiler = Profiler(self.config.profiler_dir, cuda=cuda)
        with self._lock:  # between two steps
            self.profiler.start()

    def stop_profile(self) -> str:
        """Stop torch.profiler and write its trace; returns the trace's path."""
        if self.profiler is None:
            raise RuntimeError("the profiler is not running; start_profile first")
        with self._lock:
            return self.profiler.stop()

    def shutdown(self, drain: bool = True) -> list[EngineCoreOutputs]:
        """Stop accepting requests; finish the in-flight ones (drain) or abort them."""
        with self._lock:
            self.stop_accepting()
            if not drain:
                steps = [EngineCoreOutputs(self.abort_requests(self.unfinished_request_ids()))]
            else:
                steps = []
                while self.has_unfinished_requests():
                    steps.append(self.step())
            self.executor.shutdown()  # the worker processes of "mp" and "ray" end
            return steps


def _allowed_prefix(grammar, drafts: list[int]) -> list[int]:
    """The longest prefix of `drafts` that a grammar matcher accepts from its state; the
    matcher is left as it was. A matcher that raises allows none (the bitmask of the
    step reports its error)."""
    followed, failed = 0, False
    try:
        for token in drafts:
            if not grammar.accept_token(token):
                break
            followed += 1
    except Exception:
        failed = True
    grammar.rollback(followed)
    return [] if failed else drafts[:followed]


def _rows_per_request(spec: SpeculativeConfig | None) -> int:
    """The decode rows a request may have in one step: its token and its linear drafts
    (a draft tree runs eagerly, so it needs none)."""
    if spec is None or spec.method == "medusa":
        return 1
    return 1 + spec.num_speculative_tokens
