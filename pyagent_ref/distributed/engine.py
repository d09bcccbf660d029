"""The engine's side of distributed execution: which executor an `EngineConfig` asks
for, the checks made before any rank starts, and starting it."""

from __future__ import annotations

from pathlib import Path

import torch

from .executor import Executor, MultiprocExecutor, RayExecutor, check_devices
from .parallel import check_parallel_sizes
from .worker import WorkerSpec

# engine features that run inside the model runner's process and are not distributed
_NOT_DISTRIBUTED = (
    ("eplb", "expert load balancing"),
    ("kv_offload", "KV offloading"),
    ("compile", "torch.compile"),
)


def check_distributed(config, model_config) -> str:
    """The executor backend of `config` (an `EngineConfig`) for a model of
    `model_config`, after checking everything that would fail on the ranks.

    Raises:
        ValueError: sizes the model cannot be split by (`check_parallel_sizes`), more
            ranks than devices ("mp"), "mp" asked of a daemon process, a quantized
            checkpoint whose groups TP would cut (`check_quantized_split`), LoRA with OLMo 2's
            sharded q/k norms, Medusa speculation, or an engine feature this engine does
            not run on several ranks (EPLB, KV offloading, compile).
    """
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    check_parallel_sizes(model_config, tp, pp)
    if tp > 1:
        check_quantized_split(config)
    backend = config.distributed_executor_backend or ("uni" if tp * pp == 1 else "mp")
    if backend == "uni":
        return backend
    spec = config.speculative_config
    if spec is not None and spec.method == "medusa":
        raise ValueError(
            f"speculative_config method 'medusa' with distributed_executor_backend="
            f"{backend!r}: its heads read the target's hidden states and share its LM head, "
            "which the ranks hold; use 'ngram', 'suffix' or 'draft_model'"
        )
    if config.enable_lora and tp > 1 and model_config.qk_norm == "projection":
        raise ValueError(
            f"enable_lora=True with tensor_parallel_size={tp}: {model_config.architecture}'s "
            "q/k norms over the whole projection are sharded into its qkv_proj, which an "
            "adapter does not wrap"
        )
    for name, what in _NOT_DISTRIBUTED:
        if getattr(config, name):
            raise ValueError(
                f"{name}={getattr(config, name)!r}: {what} runs in one process; it is not "
                f"available with distributed_executor_backend={backend!r}"
            )
    if backend == "mp":
        check_devices(config.device, tp * pp)
        import multiprocessing

        if multiprocessing.current_process().daemon:
            raise ValueError(
                "distributed_executor_backend='mp' starts a process per rank, which a daemon "
                "process may not do: run the engine in a process that is not a daemon, or use "
                "distributed_executor_backend='ray'"
            )
    return backend


def quant_scheme_of(model_dir: str | Path | None):
    """The `quant.QuantScheme` of a model directory's config.json, None without one."""
    from .._files import read_json_object
    from ..model import default_model_path
    from ..quant import quant_scheme

    return quant_scheme(read_json_object(Path(model_dir or default_model_path()) / "config.json"))


def check_quantized_split(config) -> None:
    """For a quantized checkpoint under tensor_parallel_size > 1: every rank's input
    columns of every row-parallel layer (o_proj, down_proj, ...: a `Cut` along dim 1 of
    `split_plan`) must be whole packed int32 words and whole groups, as
    `QuantLinear.take_columns` takes them; act-order (desc_act) and LoRA are refused.
    Column-parallel layers split along the output, which any cut of rows allows.

    Raises:
        ValueError: naming desc_act, enable_lora, or group_size / bits and the layer.
    """
    from .parallel import ParallelContext
    from .tensor_parallel import split_plan

    scheme = quant_scheme_of(config.model)
    if scheme is None:
        return
    tp = config.tensor_parallel_size
    if scheme.desc_act:
        raise ValueError(
            f"tensor_parallel_size={tp}: the checkpoint's desc_act=True (act-order) "
            "permutes the input columns across groups, which row-parallel ranks cannot split"
        )
    if config.enable_lora:
        raise ValueError(
            f"enable_lora=True with tensor_parallel_size={tp}: adapters on a quantized "
            "checkpoint's split layers are not served"
        )
    from ..model import default_model_path

    skeleton = model_skeleton(config.model or default_model_path(), config.dtype)
    units = [(32 // scheme.bits, f"bits={scheme.bits} (a packed int32 word)")]
    if scheme.group_size is not None:
        units.append((scheme.group_size, f"group_size={scheme.group_size}"))
    for rank in range(tp):
        plan = split_plan(skeleton, ParallelContext(rank, tp))
        for name, cut in plan.items():
            if cut.dim != 1 or skeleton.get_parameter(name).dim() != 2:
                continue
            start, count = int(cut.index[0]), len(cut.index)
            for unit, what in units:
                if start % unit or count % unit:
                    raise ValueError(
                        f"tensor_parallel_size={tp}: {what} does not split {name}: rank "
                        f"{rank}'s input columns [{start}, {start + count}) cut its groups"
                    )


def start_executor(config, model_config, runner_args: dict, logits_processors) -> Executor:
    """The "mp" or "ray" executor of `config`, its ranks started and ready."""
    from ..model import default_model_path

    spec = WorkerSpec(
        model_dir=str(config.model or default_model_path()),
        dtype=config.dtype,
        device=torch.device(config.device).type,
        ops=config.ops,
        attention_backend=config.attention_backend,
        tp_size=config.tensor_parallel_size,
        pp_size=config.pipeline_parallel_size,
        store_host="",
        store_port=0,
        runner_args=runner_args,
        logits_processors=tuple(logits_processors),
        lora=lora_config(config),
    )
    if (config.distributed_executor_backend or "mp") == "mp":
        return MultiprocExecutor(spec)
    return RayExecutor(spec, config.ray_address)


def lora_config(config):
    """The `LoRAConfig` of an `EngineConfig`, None without enable_lora."""
    from ..lora import LoRAConfig

    if not config.enable_lora:
        return None
    return LoRAConfig(config.max_loras, config.max_lora_rank, config.max_cpu_loras)


def model_skeleton(model_dir: str | Path, dtype: str) -> torch.nn.Module:
    """The model of a directory on the meta device: its config, parameter shapes and
    dtype, no weights (what the engine needs when the ranks hold the model)."""
    from ..model.config import ModelConfig
    from ..model.loader import TORCH_DTYPES
    from ..model.registry import resolve_architecture

    config = ModelConfig.from_pretrained(Path(model_dir))
    with torch.device("meta"):
        model = resolve_architecture(config.architecture)(config)
    return model.to(TORCH_DTYPES[dtype or config.dtype])
