"""Adapters on the host and in the model's slots, and each step's token-to-slot map.

`LoRAManager` wraps the decoder's projections in `LoRALinear` and keeps two levels:

- the host cache: up to max_cpu_loras adapters, read and fitted once
  (`adapter.load_adapter`) and shared by every request that names them; the least
  recently used is evicted first, never a pinned one;
- the slots: max_loras per adapted layer. A step's adapters are put into slots before
  its forward pass (`prepare_step`): one already in a slot stays there, the others take
  the least recently used slots no adapter of the step needs.

The scheduler puts at most max_loras distinct adapters in a step, so a step always fits.
An adapter evicted from the host cache while requests still use it is read again from
its path when a step needs it.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from types import ModuleType

import numpy as np
import torch
from torch import nn

from ..model.llama import MLP
from .adapter import LoRAAdapter, load_adapter
from .layers import LoRALinear, LoRAState
from .request import LoRAConfig, LoRARequest


def adaptable_layers(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The decoder's projections an adapter may target: module path -> output slices
    (qkv_proj: q, k, v; gate_up_proj: gate, up; the others one slice). The MLPs are the
    dense ones and an MoE layer's shared expert; routed experts are not adaptable."""
    found: dict[str, tuple[int, ...]] = {}
    for i, layer in enumerate(model.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None:  # a layer without attention: another pipeline stage's
            continue
        found[f"layers.{i}.self_attn.qkv_proj"] = (attn.q_size, attn.kv_size, attn.kv_size)
        found[f"layers.{i}.self_attn.o_proj"] = (attn.o_proj.out_features,)
        mlps = {f"layers.{i}.mlp": layer.mlp}
        shared = getattr(layer.mlp, "shared_expert", None)
        if shared is not None:
            mlps[f"layers.{i}.mlp.shared_expert"] = shared
        for path, mlp in mlps.items():
            if not isinstance(mlp, MLP):
                continue
            if mlp.gated:
                half = mlp.gate_up_proj.out_features // 2
                found[f"{path}.gate_up_proj"] = (half, half)
            else:
                found[f"{path}.up_proj"] = (mlp.up_proj.out_features,)
            found[f"{path}.down_proj"] = (mlp.down_proj.out_features,)
    return found


class LoRAManager:
    """The adapters of one model (see the module docstring).

    Args:
        model: the decoder; its adaptable projections are replaced by `LoRALinear`.
        config: the slots and the host cache's size.
        ops: the ops namespace the layers call (it must have `lora`).
        share: how a rank of a distributed model fits adapters (`distributed.lora.
            AdapterShare`: read against the whole model's shapes, then cut to the rank's
            share, DoRA refused); None: against `model` itself.
    Raises:
        ValueError: an ops namespace without `lora.lora_shrink` and `lora.lora_expand`.
    """

    def __init__(self, model: nn.Module, config: LoRAConfig, ops: ModuleType, share=None) -> None:
        lora_ops = getattr(ops, "lora", None)
        if not all(hasattr(lora_ops, op) for op in ("lora_shrink", "lora_expand")):
            raise ValueError(
                f"the ops namespace {getattr(ops, '__name__', ops)!r} lacks ops.lora, which "
                "LoRA needs; use ops='auto' or 'ref'"
            )
        self.model, self.config, self.share = model, config, share
        self.state = LoRAState()
        self.layers = adaptable_layers(model)
        self.modules: dict[str, LoRALinear] = {}
        for path, slices in self.layers.items():
            parent, _, name = path.rpartition(".")
            base = model.get_submodule(path)
            wrapped = LoRALinear(
                base, slices, config.max_loras, config.max_lora_rank, self.state, ops
            )
            setattr(model.get_submodule(parent), name, wrapped)
            self.modules[path] = wrapped
        self.cache: collections.OrderedDict[int, LoRAAdapter] = collections.OrderedDict()
        self.pinned: set[int] = set()
        self.slots: list[int | None] = [None] * config.max_loras  # adapter id per slot
        self.slot_used: list[int] = [0] * config.max_loras  # last step that used each slot
        self.digests: dict[int, tuple[str, str]] = {}  # id -> (name, weights digest)
        self.steps = 0

    # --- the host cache ----------------------------------------------------------------

    def add_adapter(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter `request` names, read and fitted if it is not cached, and now the
        most recently used.

        Raises:
            ValueError: the adapter cannot be served (see `load_adapter`); its id names
                another adapter already (a name, or other weights: the id keys the
                prefix cache); or the cache is full of pinned adapters.
            FileNotFoundError: its directory or files are missing.
        """
        cached = self.cache.get(request.lora_int_id)
        if cached is not None:
            self._check_same(cached.request, request)
            self.cache.move_to_end(request.lora_int_id)
            return cached
        if self.share is None:
            adapter = load_adapter(request, self.model, self.layers, self.config.max_lora_rank)
        else:
            adapter = self.share.fit(request, self.config.max_lora_rank)
        known = self.digests.get(request.lora_int_id)
        if known is not None and known != (request.lora_name, adapter.digest):
            raise ValueError(
                f"lora_int_id {request.lora_int_id} was adapter {known[0]!r} with other "
                "weights: the id keys the prefix cache, so new weights need a new id"
            )
        self._make_room(keep=())
        self.digests[request.lora_int_id] = (request.lora_name, adapter.digest)
        self.cache[request.lora_int_id] = adapter
        return adapter

    def _check_same(self, have: LoRARequest, request: LoRARequest) -> None:
        if (have.lora_name, have.lora_path) != (request.lora_name, request.lora_path):
            raise ValueError(
                f"lora_int_id {request.lora_int_id} is adapter {have.lora_name!r} at "
                f"{have.lora_path!r}, not {request.lora_name!r} at {request.lora_path!r}"
            )

    def _make_room(self, keep: Sequence[int]) -> None:
        """Evict least recently used unpinned adapters (not in `keep`) until one more fits."""
        while len(self.cache) >= self.config.cpu_capacity:
            victim = next((i for i in self.cache if i not in self.pinned and i not in keep), None)
            if victim is None:
                raise ValueError(
                    f"the LoRA cache holds max_cpu_loras={self.config.cpu_capacity} adapters, "
                    "all pinned or in use: raise max_cpu_loras or unpin one"
                )
            self.remove_adapter(victim)

    def remove_adapter(self, lora_id: int) -> bool:
        """Drop an adapter from the cache and its slot (requests still using it read it
        again when a step needs it); False if it is not loaded."""
        self.pinned.discard(lora_id)
        if lora_id in self.slots:
            self.slots[self.slots.index(lora_id)] = None
        return self.cache.pop(lora_id, None) is not None

    def pin_adapter(self, lora_id: int) -> None:
        """Never evict this loaded adapter from the cache. Raises ValueError if it is not
        loaded, or if the pinned ones would leave no room for a step's max_loras."""
        if lora_id not in self.cache:
            raise ValueError(f"no LoRA adapter with id {lora_id} is loaded")
        room = self.config.cpu_capacity - self.config.max_loras
        if lora_id not in self.pinned and len(self.pinned) >= room:
            raise ValueError(
                f"cannot pin more than max_cpu_loras - max_loras = {room} adapters (a step's "
                f"{self.config.max_loras} must fit beside them): raise max_cpu_loras"
            )
        self.pinned.add(lora_id)

    def list_adapters(self) -> list[LoRARequest]:
        """The cached adapters, least recently used first."""
        return [adapter.request for adapter in self.cache.values()]

    # --- the slots and the step --------------------------------------------------------

    def prepare_step(
        self, requests: Sequence[LoRARequest | None], num_tokens: Sequence[int]
    ) -> dict[int, str]:
        """Put the step's adapters into slots and set each token's slot for the forward.

        `requests[r]` is request r's adapter (None: none), `num_tokens[r]` its tokens in
        the flattened batch. Returns {r: error} for requests whose adapter could not be
        read again (its tokens run without it; the caller fails them); the others run
        with theirs. The state stays cleared when no token has an adapter.
        """
        self.state.clear()
        wanted = {r.lora_int_id: r for r in requests if r is not None}
        if not wanted:
            return {}
        if len(wanted) > self.config.max_loras:
            raise RuntimeError(
                f"a step uses {len(wanted)} adapters, more than max_loras="
                f"{self.config.max_loras} (the scheduler's bound)"
            )
        self.steps += 1
        errors: dict[int, str] = {}
        slot_of: dict[int, int] = {}
        for lora_id, request in wanted.items():
            try:
                adapter = self._for_step(request, keep=tuple(wanted))
            except (ValueError, FileNotFoundError, OSError) as exc:
                errors[lora_id] = f"its LoRA adapter {request.lora_name!r} failed to load: {exc}"
                continue
            slot_of[lora_id] = self._slot(adapter, keep=tuple(wanted))
        slots = np.array(
            [
                -1 if r is None or r.lora_int_id not in slot_of else slot_of[r.lora_int_id]
                for r in requests
            ],
            dtype=np.int64,
        )
        if (slots >= 0).any():
            device = self.model.embed_tokens.weight.device
            per_token = np.repeat(slots, np.asarray(num_tokens, dtype=np.int64))
            self.state.indices = torch.from_numpy(per_token).to(device)
            self.state.dora = any(self.cache[i].use_dora for i in slot_of)
        return {
            r: errors[req.lora_int_id]
            for r, req in enumerate(requests)
            if req is not None and req.lora_int_id in errors
        }

    def _for_step(self, request: LoRARequest, keep: tuple[int, ...]) -> LoRAAdapter:
        """The cached adapter, or read again (evicting one the step does not need)."""
        if request.lora_int_id in self.cache:
            self.cache.move_to_end(request.lora_int_id)
            return self.cache[request.lora_int_id]
        self._make_room(keep)
        return self.add_adapter(request)

    def _slot(self, adapter: LoRAAdapter, keep: tuple[int, ...]) -> int:
        """The slot holding `adapter`, filling the least recently used free one."""
        lora_id = adapter.request.lora_int_id
        if lora_id in self.slots:
            slot = self.slots.index(lora_id)
        else:
            free = [s for s, held in enumerate(self.slots) if held is None or held not in keep]
            slot = min(free, key=lambda s: (self.slots[s] is not None, self.slot_used[s]))
            for path, module in self.modules.items():
                part = adapter.layers.get(path)
                if part is None:
                    module.set_slot(slot, None, None, 0.0, None)
                else:
                    module.set_slot(slot, part.a, part.b, adapter.scaling, part.dora_scale)
            self.slots[slot] = lora_id
        self.slot_used[slot] = self.steps
        return slot
