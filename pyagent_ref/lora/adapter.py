"""Reading a LoRA adapter in PEFT's format and fitting it to the model it adapts.

A PEFT adapter directory holds `adapter_config.json` (rank `r`, `lora_alpha`,
`use_rslora`, `use_dora`, `target_modules`, ...) and `adapter_model.safetensors`, whose
tensors are named after the HF module they adapt:

    base_model.model.<module>.lora_A.weight          A, (r, in_features)
    base_model.model.<module>.lora_B.weight          B, (out_features, r)
    base_model.model.<module>.lora_magnitude_vector  DoRA's magnitude m, (out_features,)

Each module's output becomes W x + s B (A x) with s = lora_alpha / r, or lora_alpha /
sqrt(r) with rsLoRA (Kalajdzievski 2023). With DoRA (Liu et al. 2024) the weight is
decomposed into a direction and a magnitude:

    out = bias + g * (W x + s B A x),    g = m / ||W + s B A||_row

the norm taken per output row (over the input axis) of the merged weight. g depends on
the adapter and the base weight only, so it is computed once here, at load.

The modules map onto the decoder's fused layers the way the model's checkpoint does
(`model.loader.checkpoint_target`): q_proj, k_proj and v_proj become the q, k and v
slices of qkv_proj; gate_proj and up_proj the gate and up slices of gate_up_proj; a
module the checkpoint already stores fused (Phi-3's qkv_proj and gate_up_proj, GPT-NeoX's
query_key_value, GPT-2's c_attn) covers every slice of its layer: its A serves each
slice and its B's rows split among them (GPT-NeoX's rows reordered as its checkpoint's).
What cannot be served is refused, naming the key: another PEFT method, a bias, extra
trained modules (`modules_to_save`), per-module ranks or alphas, an embedding or LM head
or MoE expert adapted, a rank above max_lora_rank, shapes that do not match the model.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .._files import read_json_object
from ..model.families import neox_reshape
from ..model.loader import checkpoint_target
from .request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
SHARD_SLICE = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1}
# config keys that change the forward pass: refused unless they hold one of these values
FIXED_KEYS = {
    "bias": ("none",),
    "lora_bias": (False, None),
    "modules_to_save": (None, []),
    "rank_pattern": (None, {}),
    "alpha_pattern": (None, {}),
    "layer_replication": (None, []),
    "target_parameters": (None, []),
    "trainable_token_indices": (None, [], {}),
    "use_qalora": (False, None),
    "use_bdlora": (None, False),
    "arrow_config": (None,),
}
# families whose checkpoint orders the output rows of a fused tensor otherwise than the
# decoder: (name of our layer, tensor) -> the tensor's rows in the decoder's order
ROW_ORDER = {"GPTNeoXForCausalLM": neox_reshape}


@dataclass
class AdapterLayer:
    """One adapted layer: its slices' A's (S, r, in), B (out, r) over all slices, and
    DoRA's g (out,) or None. Slices the adapter does not touch hold zeros (g = 1)."""

    a: torch.Tensor
    b: torch.Tensor
    dora_scale: torch.Tensor | None


@dataclass
class LoRAAdapter:
    """An adapter fitted to a model: per adapted layer (the decoder's module path, e.g.
    "layers.0.self_attn.qkv_proj"), its factors in float32 on the host."""

    request: LoRARequest
    rank: int
    scaling: float
    use_dora: bool
    layers: dict[str, AdapterLayer]
    digest: str  # sha256 of adapter_model.safetensors


def load_adapter(
    request: LoRARequest,
    model: nn.Module,
    layers: dict[str, tuple[int, ...]],
    max_rank: int,
    dora: bool = True,
) -> LoRAAdapter:
    """Read `request.lora_path` and fit it to `model`.

    Args:
        request: the adapter's name, id and directory.
        model: the decoder it adapts (its configuration names the checkpoint's modules;
            its base weights enter DoRA's norm).
        layers: the layers that can be adapted: module path -> the sizes of its output
            slices (`LoRAManager.layers`).
        max_rank: the engine's max_lora_rank.
        dora: whether a DoRA adapter may be served (its g needs the whole base
            weight: not under tensor or pipeline parallelism, where `model` is the
            whole model's shapes only).
    Raises:
        FileNotFoundError: no such directory, or it lacks adapter_config.json or
            adapter_model.safetensors (an adapter saved as a .bin is named as such).
        ValueError: a corrupt file (named); a configuration the engine cannot serve (the
            message names the key and its value); a rank above max_rank; a tensor
            without a place in the model or of the wrong shape (named), a module with A
            but no B (or without DoRA's magnitude when use_dora).
    """
    path = Path(request.lora_path)
    if not path.is_dir():
        raise FileNotFoundError(f"LoRA adapter {request.lora_name!r}: no directory {str(path)!r}")
    config = read_json_object(path / CONFIG_FILE)
    rank, scaling, use_dora = _check_config(config, path / CONFIG_FILE, max_rank)
    if use_dora and not dora:
        raise ValueError(
            f"{path / CONFIG_FILE}: use_dora=True is not supported with tensor or pipeline "
            "parallelism (DoRA's magnitude scale needs the whole base weight on one rank)"
        )
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        found = sorted(p.name for p in path.iterdir() if p.name.startswith("adapter_model"))
        raise FileNotFoundError(
            f"LoRA adapter {request.lora_name!r}: no {WEIGHTS_FILE} in {str(path)!r}"
            + (f" (found {found}: only safetensors is read)" if found else "")
        )
    data = weights.read_bytes()
    tensors = _read_tensors(data, weights)
    modules, others = _group_by_module(tensors, weights)
    for module in modules:  # what it targets first: the clearest reason to refuse it
        _place(module, model, layers, weights)
    if others:
        what = "an adapted embedding" if "lora_embedding" in others[0] else "not a LoRA factor"
        raise ValueError(f"{weights}: tensor {others[0]!r} is not supported ({what})")
    fitted: dict[str, dict] = {}
    for module, parts in modules.items():
        _check_parts(module, parts, weights, use_dora)
        layer, slices = _place(module, model, layers, weights)
        _fit_module(module, parts, rank, layer, slices, layers[layer], model, fitted)
    return LoRAAdapter(
        request=request,
        rank=rank,
        scaling=scaling,
        use_dora=use_dora,
        layers={
            name: _adapter_layer(model, name, layers[name], parts, rank, scaling, use_dora)
            for name, parts in fitted.items()
        },
        digest=hashlib.sha256(data).hexdigest(),
    )


def _check_config(config: dict, path: Path, max_rank: int) -> tuple[int, float, bool]:
    """(rank, scaling, use_dora) of an adapter_config.json, or ValueError naming the key."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type={config['peft_type']!r} is not supported (only LORA)")
    for key, accepted in FIXED_KEYS.items():
        if key in config and config[key] not in accepted:
            raise ValueError(
                f"{path}: {key}={config[key]!r} is not supported (only {accepted[0]!r})"
            )
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{path}: r must be an int >= 1, got {rank!r}")
    if rank > max_rank:
        raise ValueError(
            f"{path}: the adapter's rank r={rank} exceeds max_lora_rank={max_rank} "
            "(an engine option: raise it to serve this adapter)"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"{path}: lora_alpha must be a finite number, got {alpha!r}")
    flags = {}
    for key in ("use_rslora", "use_dora"):
        flags[key] = config.get(key) or False
        if not isinstance(flags[key], bool):
            raise ValueError(f"{path}: {key} must be true or false, got {config[key]!r}")
    scaling = alpha / math.sqrt(rank) if flags["use_rslora"] else alpha / rank
    return rank, float(scaling), flags["use_dora"]


def _read_tensors(data: bytes, path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{path} is not a readable safetensors file: {exc}") from exc
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise ValueError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, not a float")
    return tensors


def _group_by_module(
    tensors: dict[str, torch.Tensor], path: Path
) -> tuple[dict[str, dict[str, torch.Tensor]], list[str]]:
    """(HF module path -> {"A": ..., "B": ..., "m": ...}, the names of the tensors that
    are not LoRA factors: saved base weights, adapted embeddings)."""
    parts = {".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_magnitude_vector": "m"}
    modules: dict[str, dict[str, torch.Tensor]] = {}
    others = []
    for name, tensor in tensors.items():
        suffix = next((s for s in parts if name.endswith(s)), None)
        if suffix is None or not name.startswith(PREFIX):
            others.append(name)
            continue
        modules.setdefault(name[len(PREFIX) : -len(suffix)], {})[parts[suffix]] = tensor
    if not modules and not others:
        raise ValueError(f"{path}: holds no LoRA tensors")
    return modules, others


def _check_parts(module: str, found: dict, path: Path, use_dora: bool) -> None:
    """ValueError unless the module has A and B (and DoRA's magnitude with use_dora)."""
    want = {"A", "B", "m"} if use_dora else {"A", "B"}
    if set(found) != want:
        raise ValueError(
            f"{path}: module {module!r} has {sorted(found)}, expected {sorted(want)} "
            f"(use_dora={use_dora})"
        )


def _place(
    module: str, model: nn.Module, layers: dict[str, tuple[int, ...]], path: Path
) -> tuple[str, list[int]]:
    """(our layer, the slices the module fills) for an HF module path; ValueError naming
    a module the engine cannot adapt."""
    name, shard = checkpoint_target(model, f"{module}.weight")
    layer = name.removesuffix(".weight")
    if not name.endswith(".weight") or layer not in layers:
        raise ValueError(
            f"{path}: target module {module!r} is not supported: adapters may target the "
            "attention's q/k/v/o and the MLP's gate/up/down projections"
            + (f" ({layer!r} is not one)" if layer != module else "")
        )
    num_slices = len(layers[layer])
    if shard is None:
        return layer, list(range(num_slices))
    return layer, [SHARD_SLICE[shard]]


def _fit_module(
    module: str,
    parts: dict[str, torch.Tensor],
    rank: int,
    layer: str,
    slices: list[int],
    sizes: tuple[int, ...],
    model: nn.Module,
    fitted: dict[str, dict],
) -> None:
    """Check one module's tensors against its layer and record them per slice."""
    base = model.get_submodule(layer)
    rows = sum(sizes[s] for s in slices)
    want = {"A": (rank, base.in_features), "B": (rows, rank), "m": (rows,)}
    for part in sorted(parts, key="ABm".index):  # A first, whatever the file's order
        tensor = parts[part]
        if tuple(tensor.shape) != want[part]:
            raise ValueError(
                f"LoRA tensor {PREFIX}{module}.{_SUFFIX[part]} has shape "
                f"{tuple(tensor.shape)}, expected {want[part]} (the base model's "
                f"{layer} and r={rank})"
            )
    b, m = parts["B"].float(), parts.get("m")
    m = None if m is None else m.float()
    reorder = ROW_ORDER.get(model.config.architecture)
    if reorder is not None and len(slices) > 1:
        b = reorder(f"{layer}.weight", b, model.config)
        m = None if m is None else reorder(f"{layer}.weight", m, model.config)
    layer_parts = fitted.setdefault(layer, {})
    start = 0
    for s in slices:
        if s in layer_parts:
            raise ValueError(f"LoRA tensors of {module!r} adapt {layer} slice {s} twice")
        size = sizes[s]
        layer_parts[s] = (
            parts["A"].float(),
            b[start : start + size],
            None if m is None else m[start : start + size],
        )
        start += size


_SUFFIX = {"A": "lora_A.weight", "B": "lora_B.weight", "m": "lora_magnitude_vector"}


def _adapter_layer(
    model: nn.Module,
    layer: str,
    sizes: tuple[int, ...],
    parts: dict[int, tuple],
    rank: int,
    scaling: float,
    use_dora: bool,
) -> AdapterLayer:
    """The layer's factors over all its slices (zeros where the adapter does not reach)
    and, with DoRA, g = m / ||W + s B A||_row (1 on the rows of slices not adapted)."""
    base = model.get_submodule(layer)
    out_features = sum(sizes)
    a = torch.zeros(len(sizes), rank, base.in_features)
    b = torch.zeros(out_features, rank)
    g = torch.ones(out_features) if use_dora else None
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    for s, (a_s, b_s, m_s) in parts.items():
        rows = slice(starts[s], starts[s] + sizes[s])
        a[s], b[rows] = a_s, b_s
        if use_dora:
            quant = getattr(base, "quant_base", None)
            weight = base.weight.detach() if quant is None else quant.dequantized()
            merged = weight[rows].float().cpu() + scaling * (b_s @ a_s)
            g[rows] = m_s / torch.linalg.vector_norm(merged, dim=1)
    return AdapterLayer(a, b, g)
