"""Loading one rank's share of a checkpoint, reading only that share.

A rank of a model too large for one device must never hold the whole model. So the
model is built on the meta device (no memory), the layers of other pipeline stages are
dropped, and every parameter the rank keeps in part is cut to its local shape on meta
by the same `tensor_parallel.Cut`s that `shard_model` applies to a loaded model
(`split_plan`: one description of every split). Memory is then allocated for the share
alone, and each checkpoint tensor is read through safetensors' slices: the runs of
consecutive rows (or columns) the rank keeps, never the whole tensor, except for the
families whose checkpoint layout is permuted on load (GPT-2's transposed Conv1D
weights, GPT-NeoX's per-head qkv order): those read one whole tensor at a time, then
keep their part. Tensors of the layers of other stages are not read at all. Last, the
modules become the rank's parallel layers (`tensor_parallel.localize`).

Memory allocated: the share, plus one tensor's part while it is copied in (one whole
tensor for the permuted families), where loading the whole model then cutting it
allocates the whole model; the pages of the mapped files a rank touches are the page
cache's (benchmarks/bench_distributed.py --part load measures both ways).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from ..model.families import FAMILIES
from .model import drop_other_stages
from .parallel import ParallelContext
from .tensor_parallel import Cut, cut_parameters, localize, split_plan


class RankShare:
    """The `share` hook of `model.load_model` for rank `ctx`: `cut` shapes the meta
    skeleton to the share, `load` reads the share's parts and localizes the modules."""

    def __init__(self, ctx: ParallelContext) -> None:
        self.ctx = ctx
        self.plan: dict[str, Cut] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.vocab_size = 0

    def cut(self, model: nn.Module) -> None:
        """On the meta skeleton: remember the whole shapes, drop the other stages'
        layers, cut every split parameter to its local shape."""
        self.shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        self.vocab_size = model.embed_tokens.weight.shape[0]
        drop_other_stages(model, self.ctx)
        if self.ctx.tp_size > 1:
            self.plan = split_plan(model, self.ctx)
            cut_parameters(model, self.plan)

    def load(
        self, model: nn.Module, files: list[Path], dtype: torch.dtype, progress: bool = True
    ) -> None:
        """Fill the share from the files (`load_share_weights`), then localize."""
        load_share_weights(model, files, self.plan, self.shapes, progress)
        if self.ctx.tp_size > 1:
            localize(model, self.ctx, self.vocab_size)


def load_share(
    model_dir: str | Path,
    ctx: ParallelContext,
    dtype: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    ops: ModuleType | None = None,
) -> nn.Module:
    """Rank `ctx`'s share of the model in `model_dir`, as `DistributedModel(...,
    whole=False)` takes it: equal to `load_model` then cutting (`shard_model`), but only
    the share is ever in memory. Arguments and errors as `model.load_model`'s."""
    from ..model import load_model

    return load_model(model_dir, dtype, device, progress, ops, share=RankShare(ctx))


def _runs(index: list[int]) -> list[tuple[int, int]]:
    """[a, b) ranges of consecutive values covering `index` (increasing), in order."""
    runs, start = [], 0
    for i in range(1, len(index) + 1):
        if i == len(index) or index[i] != index[i - 1] + 1:
            runs.append((index[start], index[i - 1] + 1))
            start = i
    return runs


def _read_part(f, hf_name: str, name: str, shard, local: torch.Tensor, cut: Cut, whole, model):
    """Copy into `local` (the cut parameter `name`, of shape `whole` in the whole model)
    the part of checkpoint tensor `hf_name` it keeps; `shard` as `loader._target`'s. The
    indices along cut.dim that the tensor fills are found by cutting an index tensor
    (expanded: no memory) as the loader cuts the parameter (`loader._shard_view`)."""
    from ..model.loader import _shard_view

    track = torch.arange(whole[cut.dim]).view(
        [-1 if a == cut.dim else 1 for a in range(len(whole))]
    )
    region = _shard_view(track.expand(whole), shard, model)
    axis = cut.dim - (len(whole) - region.dim())  # stacked experts: the expert is indexed
    covered = region
    for a in reversed(range(region.dim())):
        if a != axis:
            covered = covered.select(a, 0)
    first, count = int(covered[0]), covered.numel()
    pos = torch.nonzero((cut.index >= first) & (cut.index < first + count))[:, 0]
    src = (cut.index[pos] - first).tolist()
    family = FAMILIES.get(model.config.architecture)
    reshape = None if family is None else family.reshape
    if reshape is not None:  # a permuted layout: read whole, then keep the part
        tensor = reshape(name, f.get_tensor(hf_name), model.config)
        shape = tuple(tensor.shape)
    else:
        sliced = f.get_slice(hf_name)
        shape = tuple(sliced.get_shape())
    if shape != tuple(region.shape):
        raise ValueError(
            f"checkpoint tensor {hf_name!r} has shape {shape}, expected {tuple(region.shape)}"
        )
    if not src:
        return  # none of this tensor's rows is this rank's
    if reshape is not None:
        part = tensor.index_select(axis, torch.tensor(src))
    else:  # the runs of consecutive rows (columns) this rank keeps, nothing else
        lead = (slice(None),) * axis
        part = torch.cat([sliced[(*lead, slice(a, b))] for a, b in _runs(src)], axis)
    if not part.is_floating_point():
        raise ValueError(
            f"checkpoint tensor {hf_name!r} has dtype {part.dtype}, expected a floating-point dtype"
        )
    target = local[shard[0]] if isinstance(shard, tuple) else local
    target.index_copy_(axis, pos.to(target.device), part.to(target.device, target.dtype))


def load_share_weights(
    model: nn.Module,
    files: list[Path],
    plan: dict[str, Cut],
    shapes: dict[str, tuple[int, ...]],
    progress: bool = True,
) -> None:
    """Fill every parameter of `model` (a rank's share: the parameters in `plan` cut,
    the others whole, the layers of other stages absent) from the files, reading only
    its parts; `shapes`: the whole model's parameter shapes. Errors as
    `loader.load_weights`'s: a tensor without a place in the whole model, of the wrong
    shape or dtype, a missing tensor, an unreadable file."""
    from safetensors import SafetensorError, safe_open
    from tqdm import tqdm

    from ..model.loader import _checkpoint_name, _shard_view, _shards, _target

    params = dict(model.named_parameters())
    family = FAMILIES.get(model.config.architecture)
    ignored = ("rotary_emb.inv_freq", *(family.ignored if family else ()))
    filled: dict[str, set] = {name: set() for name in params}
    for name, cut in plan.items():  # padding rows (past the vocabulary) are zero
        if name in params and bool((cut.index < 0).any()):
            padding = torch.nonzero(cut.index < 0)[:, 0].to(params[name].device)
            params[name].data.index_fill_(cut.dim, padding, 0)
    bar = tqdm(files, desc="loading weights", unit="file", disable=not progress or len(files) < 2)
    for path in bar:
        try:
            with safe_open(path, framework="pt") as f:
                for hf_name in f.keys():
                    if hf_name.endswith(ignored):
                        continue
                    if family is not None and family.skipped(hf_name, model.config):
                        continue
                    name, shard = _target(hf_name, model, shapes)
                    if name == "lm_head.weight" and model.lm_head is None:
                        continue
                    if name not in shapes:
                        raise ValueError(
                            f"checkpoint tensor {hf_name!r} has no place in {type(model).__name__}"
                        )
                    if name not in params:
                        continue  # a layer of another pipeline stage: not read
                    local = params[name].data
                    if name in plan:
                        _read_part(f, hf_name, name, shard, local, plan[name], shapes[name], model)
                    else:
                        tensor = f.get_tensor(hf_name)
                        if family is not None and family.reshape is not None:
                            tensor = family.reshape(name, tensor, model.config)
                        target = _shard_view(local, shard, model)
                        if tuple(target.shape) != tuple(tensor.shape):
                            raise ValueError(
                                f"checkpoint tensor {hf_name!r} has shape "
                                f"{tuple(tensor.shape)}, expected {tuple(target.shape)}"
                            )
                        if not tensor.is_floating_point():
                            raise ValueError(
                                f"checkpoint tensor {hf_name!r} has dtype {tensor.dtype}, "
                                f"expected a floating-point dtype"
                            )
                        target.copy_(tensor.to(target.dtype))
                    filled[name].add(shard)
        except SafetensorError as exc:
            raise ValueError(f"{path} is not a readable safetensors file: {exc}") from exc
    missing = [
        f"{_checkpoint_name(name, shard, model)} (for {name})"
        for name, param in params.items()
        if None not in filled[name]
        for shard in sorted(_shards(name, param) - filled[name], key=repr)
    ]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:5])}")
