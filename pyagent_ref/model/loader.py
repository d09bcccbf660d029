"""Loading a model directory: config, architecture, and safetensors weights.

A Hugging Face model directory holds `config.json` and either one `model.safetensors`
or shards listed in `model.safetensors.index.json`. Tensors are read one at a time
(safetensors maps the file, so memory stays at one tensor beyond the model), renamed
from HF's layout to ours (q/k/v and gate/up fused, the `model.` prefix dropped), checked
for shape and cast to the requested dtype. Every parameter must be filled exactly once:
a missing or mis-shaped tensor is an error that names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from .config import DTYPES, ModelConfig
from .registry import resolve_architecture

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a model directory: the shards of the index, or the one file."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({model_dir / name for name in weight_map.values()})
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
    """(name, tensor) for every tensor of every file, with a progress bar over files."""
    from safetensors import safe_open
    from tqdm import tqdm

    for path in tqdm(
        files, desc="loading weights", unit="file", disable=not progress or len(files) < 2
    ):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _target(hf_name: str, model: nn.Module) -> tuple[str, object | None]:
    """Our parameter name for an HF tensor name, and the fused shard it fills (or None)."""
    from .llama import param_mapping

    name = hf_name.removeprefix("model.")
    for fused, separate, shard in param_mapping():
        if f".{separate}." in name:
            return name.replace(f".{separate}.", f".{fused}."), shard
    return name, None


def _shard_slice(param_name: str, shard: object, model: nn.Module) -> slice:
    cfg = model.config
    if shard in ("q", "k", "v"):
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        start = {"q": 0, "k": q, "v": q + kv}[shard]
        return slice(start, start + (q if shard == "q" else kv))
    size = cfg.intermediate_size
    return slice(shard * size, (shard + 1) * size)


def load_weights(
    model: nn.Module, files: list[Path], dtype: torch.dtype, progress: bool = True
) -> None:
    """Fill every parameter of `model` from the files; errors name the tensor at fault."""
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    # a fused parameter is complete once all of its shards were copied in
    needed = {n: 3 if "qkv_proj" in n else 2 if "gate_up_proj" in n else 1 for n in params}
    for hf_name, tensor in iter_tensors(files, progress):
        if "rotary_emb.inv_freq" in hf_name:
            continue  # a buffer some checkpoints carry; we compute it
        name, shard = _target(hf_name, model)
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied embeddings: the head is the embedding matrix
        if name not in params:
            raise ValueError(
                f"checkpoint tensor {hf_name!r} has no place in {type(model).__name__}"
            )
        param = params[name]
        target = param.data if shard is None else param.data[_shard_slice(name, shard, model)]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(target.shape)}"
            )
        target.copy_(tensor.to(dtype))
        filled[name] = filled.get(name, 0) + 1
    missing = sorted(n for n, count in needed.items() if filled.get(n, 0) < count)
    if missing:
        raise ValueError(
            f"checkpoint lacks tensors for {len(missing)} parameters, e.g. {missing[:5]}"
        )


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
    model_dir: str | Path, dtype: str | None = None, device: str = "cpu", progress: bool = True
) -> nn.Module:
    """Build the model a directory describes and load its weights.

    Args:
        model_dir: an HF-layout directory with config.json and safetensors weights.
        dtype: "float32", "bfloat16" or "float16"; default: the config's dtype.
        device: where the parameters live ("cpu", "cuda", ...).
    Raises:
        FileNotFoundError: no config.json or no weights.
        ValueError: an unsupported architecture or dtype, a device torch does not know or
            does not have, or a missing / mis-shaped tensor.
    """
    device = check_device(device)
    model_dir = Path(model_dir)
    config = ModelConfig.from_pretrained(model_dir)
    dtype = dtype or config.dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    model_cls = resolve_architecture(config.architecture)
    with torch.device("meta"):
        model = model_cls(config)
    model = model.to_empty(device=device).to(TORCH_DTYPES[dtype])
    # RoPE tables are computed, not loaded: build them for real (and in float32) now
    model.rotary = type(model.rotary)(config).to(device)
    load_weights(model, safetensors_files(model_dir), TORCH_DTYPES[dtype], progress)
    return model.eval()
