"""Loading a model directory: config, architecture, and safetensors weights.

A Hugging Face model directory holds `config.json` and either one `model.safetensors`
or shards listed in `model.safetensors.index.json`. Tensors are read one at a time
(safetensors maps the file, so memory stays at one tensor beyond the model), renamed
from HF's layout to ours (q/k/v and gate/up fused, the `model.` prefix dropped), checked
for shape and cast to the requested dtype. Every parameter must be filled exactly once:
a missing or mis-shaped tensor is an error that names it, and a file that cannot be read
(corrupt JSON, a truncated safetensors file) is an error that names the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from .. import ops as reference_ops
from .._files import read_json_object
from ..quant import load_quantized, quant_scheme
from .config import DTYPES, ModelConfig
from .families import FAMILIES, rename
from .registry import resolve_architecture

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a model directory: the shards of the index, or the one file.

    Raises:
        FileNotFoundError: no weights, or a shard the index lists is missing.
        ValueError: the index is not a JSON object whose ``weight_map`` maps tensor names
            to file names (the message names the index file).
    """
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        shards = weight_map.values() if isinstance(weight_map, dict) else ()
        if not shards or not all(isinstance(name, str) for name in shards):
            raise ValueError(
                f"{index}: 'weight_map' must map tensor names to file names, "
                f"got {weight_map!r:.100}"
            )
        files = sorted({model_dir / name for name in shards})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {index.name} are missing: {missing}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(
        f"no model.safetensors or model.safetensors.index.json in {str(model_dir)!r}"
    )


def iter_tensors(files: list[Path], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every file, with a progress bar over files.

    Raises:
        ValueError: a file is not a readable safetensors file (truncated, a corrupt header,
            not safetensors at all); the message names the file and gives the library's
            reason.
    """
    from safetensors import SafetensorError, safe_open
    from tqdm import tqdm

    for path in tqdm(
        files, desc="loading weights", unit="file", disable=not progress or len(files) < 2
    ):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except SafetensorError as exc:
            raise ValueError(f"{path} is not a readable safetensors file: {exc}") from exc


def _target(hf_name: str, model: nn.Module, params: dict) -> tuple[str, object | None]:
    """Our parameter name for an HF tensor name, and the shard of it the tensor fills
    (None: the whole parameter, a tensor the checkpoint already stores as we do). Shards:
    "q", "k", "v" of a fused qkv_proj; 0 (gate), 1 (up) of a fused gate_up_proj; (expert,
    0 | 1 | None) of an MoE layer's stacked experts (the model's `checkpoint_target`)."""
    from .llama import param_mapping

    family = FAMILIES.get(model.config.architecture)
    name = hf_name if family is None else rename(family, hf_name)
    name = name.removeprefix("model.")
    if name in params:
        return name, None
    moe_target = getattr(model, "checkpoint_target", None)
    found = moe_target(name) if moe_target is not None else None
    if found is not None:
        return found
    for fused, separate, shard in param_mapping():
        if f".{separate}." in name:
            return name.replace(f".{separate}.", f".{fused}."), shard
    return name, None


def checkpoint_target(model: nn.Module, hf_name: str) -> tuple[str, object | None]:
    """(our parameter name, shard) that checkpoint tensor `hf_name` fills in `model`:
    the loader's own mapping, for whatever else is named after the checkpoint's tensors
    (a LoRA adapter's modules). The name may lack a place in the model."""
    return _target(hf_name, model, dict(model.named_parameters()))


def _shards(name: str, param: torch.Tensor) -> set:
    """The shards that fill parameter `name` (see `_target`): every one must be loaded."""
    if name.endswith("experts.gate_up_proj"):
        return {(e, half) for e in range(param.shape[0]) for half in (0, 1)}
    if name.endswith("experts.down_proj"):
        return {(e, None) for e in range(param.shape[0])}
    if "qkv_proj" in name:
        return {"q", "k", "v"}
    if "gate_up_proj" in name:
        return {0, 1}
    return {None}


def _shard_view(param: torch.Tensor, shard: object, model: nn.Module) -> torch.Tensor:
    """The part of `param` that shard `shard` fills."""
    if shard is None:
        return param
    if isinstance(shard, tuple):  # (expert, half) of stacked experts
        expert, half = shard
        rows = param[expert]
        if half is None:
            return rows
        size = rows.shape[0] // 2
        return rows[half * size : (half + 1) * size]
    if shard in ("q", "k", "v"):
        cfg = model.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        start = {"q": 0, "k": q, "v": q + kv}[shard]
        return param[start : start + (q if shard == "q" else kv)]
    size = param.shape[0] // 2  # gate_up_proj: the gate rows, then the up rows
    return param[shard * size : (shard + 1) * size]


def _checkpoint_name(name: str, shard: object, model: nn.Module) -> str:
    """The HF tensor name that fills `shard` of our parameter `name` (for errors)."""
    from .llama import param_mapping

    moe_name = getattr(model, "checkpoint_name", None)
    found = moe_name(name, shard) if moe_name is not None else None
    if found is not None:
        return found
    for fused, separate, fused_shard in param_mapping():
        if shard == fused_shard and f".{fused}." in name:
            return "model." + name.replace(f".{fused}.", f".{separate}.")
    return name if name == "lm_head.weight" else f"model.{name}"


def load_weights(
    model: nn.Module,
    files: list[Path],
    dtype: torch.dtype,
    progress: bool = True,
    tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> None:
    """Fill every parameter of `model` from the files (or from `tensors`, (name, tensor)
    pairs already read: a quantized checkpoint's float ones); errors name the tensor at
    fault (one without a place in the model, of the wrong shape or of a non-floating-point
    dtype, or a checkpoint tensor that is missing) or the file that cannot be read."""
    params = dict(model.named_parameters())
    family = FAMILIES.get(model.config.architecture)
    # RoPE tables, and an fp8 KV cache's scales (read by `model.kv_scales`)
    ignored = ("rotary_emb.inv_freq", "self_attn.k_scale", "self_attn.v_scale")
    ignored = (*ignored, *(family.ignored if family else ()))
    filled: dict[str, set] = {name: set() for name in params}
    for hf_name, tensor in iter_tensors(files, progress) if tensors is None else tensors:
        if hf_name.endswith(ignored):
            continue  # buffers some checkpoints carry (RoPE tables, causal masks)
        if family is not None and family.skipped(hf_name, model.config):
            continue  # parts the model does not run (DeepSeek-V3's multi-token prediction)
        name, shard = _target(hf_name, model, params)
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied embeddings: the head is the embedding matrix
        if name not in params:
            raise ValueError(
                f"checkpoint tensor {hf_name!r} has no place in {type(model).__name__}"
            )
        if family is not None and family.reshape is not None:
            tensor = family.reshape(name, tensor, model.config)
        target = _shard_view(params[name].data, shard, model)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        if not tensor.is_floating_point():
            raise ValueError(
                f"checkpoint tensor {hf_name!r} has dtype {tensor.dtype}, "
                f"expected a floating-point dtype"
            )
        target.copy_(tensor.to(target.dtype))
        filled[name].add(shard)
    # a parameter is complete once it was copied whole or all of its shards were
    missing = [
        f"{_checkpoint_name(name, shard, model)} (for {name})"
        for name, param in params.items()
        if None not in filled[name]
        for shard in sorted(_shards(name, param) - filled[name], key=repr)
    ]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:5])}")


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, or ValueError naming it if torch cannot parse it or
    this machine lacks it (a CUDA device without a GPU, an index past the count)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}"
        ) from exc
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise ValueError(
                f"device {device!r} is not available: torch sees {count} CUDA device(s)"
            )
    return dev


def load_model(
    model_dir: str | Path,
    dtype: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    ops: ModuleType | None = None,
    share=None,
) -> nn.Module:
    """Build the model a directory describes and load its weights.

    Args:
        model_dir: an HF-layout directory with config.json and safetensors weights, or a
            .gguf file (`pyagent_ref.quant.gguf.load_gguf`).
        dtype: "float32", "bfloat16" or "float16"; default: the config's dtype. Modules
            that set `keep_float32` (DeepSeek's routers) keep float32 parameters.
        device: where the parameters live ("cpu", "cuda", ...).
        progress: show a progress bar while the weights load.
        ops: the ops namespace the layers call (`pyagent_ref.ops.load(...)`); default
            the reference ops.
        share: a rank's share of the model (`distributed.loading.RankShare`): the model
            is cut to it before any memory is allocated (`share.cut`) and only its part
            of each tensor is read (`share.load`).
    Raises:
        FileNotFoundError: no config.json or no weights.
        ValueError: an unsupported architecture or dtype, a device torch does not know or
            does not have, a corrupt config.json, index or safetensors file (the message
            names the file), or a missing / mis-shaped / non-float tensor (it names the
            tensor); for a quantized checkpoint (config.json's `quantization_config`, see
            `pyagent_ref.quant`), an unknown quant_method, unsupported bits, a group_size
            that does not divide a layer, or a missing / mis-shaped quantized tensor.
    """
    from ..quant.gguf import is_gguf, load_gguf

    if is_gguf(model_dir):  # llama.cpp's single-file format (`pyagent_ref.quant.gguf`)
        return load_gguf(model_dir, dtype, device, ops)
    device = check_device(device)
    model_dir = Path(model_dir)
    config = ModelConfig.from_pretrained(model_dir)
    scheme = quant_scheme(read_json_object(model_dir / "config.json"))
    dtype = dtype or config.dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if scheme is not None and share is not None:
        raise ValueError(
            f"a quantized checkpoint ({scheme.method}) loads in one process only: it cannot be "
            "read as a share of a tensor- or pipeline-parallel rank"
        )
    model_cls = resolve_architecture(config.architecture)
    ops = reference_ops if ops is None else ops
    with torch.device("meta"):  # no memory yet; the reference ops run on meta tensors
        model = model_cls(config, reference_ops)
    if share is not None:
        share.cut(model)
    model = model.to_empty(device=device).to(TORCH_DTYPES[dtype])
    for module in model.modules():
        if getattr(module, "keep_float32", False):  # DeepSeek's routers, as HF keeps them
            module.float()
    model.use_ops(ops)
    model.build_rotary()  # RoPE tables are computed, not loaded: build them for real (float32)
    files = safetensors_files(model_dir)
    if share is not None:  # a parallel rank (quantized checkpoints are refused there)
        share.load(model, files, TORCH_DTYPES[dtype], progress)
        return model.eval()
    tensors = None
    if scheme is not None:  # quantized layers become QuantLinear; the rest loads as usual
        tensors = load_quantized(model, iter_tensors(files, progress), scheme, ops)
    load_weights(model, files, TORCH_DTYPES[dtype], progress, tensors)
    return model.eval()
