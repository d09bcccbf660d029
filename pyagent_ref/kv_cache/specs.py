"""What each kind of layer keeps in the KV cache.

A model's layers are grouped by spec; each group gets its own block tables from the one
shared pool (all groups use the same block size). The spec decides how many bytes a
block takes, which blocks a request still needs, and which prefix-cache hits are valid.
State-space layers (`MambaSpec`) are the exception: their state does not grow with the
sequence, so a request holds one slot of a pool of its own (`KVCacheConfig.num_state_slots`)
for its whole life instead of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FullAttentionSpec:
    """Causal self-attention over the whole sequence: K and V for every token."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_heads", "head_size", "dtype_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block in one layer: K and V."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Each token attends to the previous `sliding_window` tokens (itself included)."""

    sliding_window: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec(FullAttentionSpec):
    """Tokens attend within fixed chunks of `attention_chunk_size` tokens (Llama 4)."""

    attention_chunk_size: int = 8192

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention_chunk_size % self.block_size:
            raise ValueError(
                f"attention_chunk_size must be a multiple of block_size {self.block_size}, "
                f"got {self.attention_chunk_size}"
            )


@dataclass(frozen=True)
class MLASpec(FullAttentionSpec):
    """Multi-head latent attention: one compressed latent vector per token, no
    separate K and V (`head_size` is the latent size, kv_lora_rank + rope dims, and
    `num_kv_heads` is 1: the latent is shared by all heads)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_kv_heads != 1:
            raise ValueError(
                f"MLA keeps one latent per token: num_kv_heads must be 1, got {self.num_kv_heads}"
            )

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.head_size * self.dtype_bytes


@dataclass(frozen=True)
class CrossAttentionSpec(FullAttentionSpec):
    """Decoder attention over encoder outputs: KV for the encoder tokens, written once
    per request and never shared through the prefix cache."""


@dataclass(frozen=True)
class MambaSpec:
    """State-space (Mamba) layers: a state of fixed size per request, whatever its length
    (a convolution's last inputs and the SSM state).

    A request holds one slot of the state pool (`KVCacheConfig.num_state_slots`) from its
    first step to its end (finished, aborted or preempted, which frees it); the slot
    indexes the state tensors of every layer of the group, and carries the state from
    one chunk or decode step to the next. Only the state after the request's last
    computed token is kept, never one per block boundary, so a prefix-cache hit could
    not restore the state at the hit: the group does not take part in prefix caching,
    and a KV cache with such a group runs without it (`KVCacheManager`).

    `block_size` is the other groups' (unused here); `state_bytes` is the size of one
    slot in one layer.
    """

    block_size: int
    state_bytes: int

    def __post_init__(self) -> None:
        for name in ("block_size", "state_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one slot in one layer."""
        return self.state_bytes


KVCacheSpec = FullAttentionSpec | MambaSpec


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share a spec, and so share block tables."""

    spec: KVCacheSpec
    layer_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class KVCacheConfig:
    """How the KV memory is split: `num_blocks` blocks (block 0 is the null block),
    and the groups that take their blocks from them.

    The memory layout the groups share: layer i of every group uses KV tensor i, of
    `num_blocks` blocks. A block id belongs to one group at a time, so two groups never
    write the same block of a shared tensor, and a block costs `bytes_per_block`: the
    largest page times the largest group's layer count. A hybrid model cut into groups
    of equal size (say 16 full + 16 sliding-window layers) thus pays for 16 layers per
    block, not 32.

    A state group (`MambaSpec`) takes no blocks: its layers keep tensors of their own,
    of `num_state_slots` slots (slot 0, like block 0, stands for "none"), which cost
    `state_bytes` in all; `num_state_slots` is 0 without such a group.
    """

    num_blocks: int
    groups: tuple[KVCacheGroup, ...]
    num_state_slots: int = 0

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a KV cache config needs at least one group")
        sizes = {g.spec.block_size for g in self.groups}
        if len(sizes) != 1:
            raise ValueError(f"all groups must share one block_size, got {sorted(sizes)}")
        states = [g for g in self.groups if isinstance(g.spec, MambaSpec)]
        if len(states) > 1:
            raise ValueError(f"state layers must form one group, got {len(states)}")
        if (states and self.num_state_slots < 2) or (not states and self.num_state_slots):
            raise ValueError(
                "num_state_slots must be >= 2 (one is the null slot) with a MambaSpec group "
                f"and 0 without one, got {self.num_state_slots}"
            )

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size

    @property
    def block_groups(self) -> tuple[KVCacheGroup, ...]:
        """The groups whose layers keep blocks (all but a state group)."""
        return tuple(g for g in self.groups if not isinstance(g.spec, MambaSpec))

    @property
    def num_kv_tensors(self) -> int:
        """KV tensors (per K and V) the block groups share: the largest group's layer
        count (0 when every layer keeps a state)."""
        return max((max(1, len(g.layer_names)) for g in self.block_groups), default=0)

    @property
    def bytes_per_block(self) -> int:
        """Memory of one block id across the shared KV tensors."""
        pages = [g.spec.page_size_bytes for g in self.block_groups]
        return self.num_kv_tensors * max(pages, default=0)

    @property
    def state_bytes(self) -> int:
        """Memory of the state slots: every slot of every state layer."""
        return sum(
            self.num_state_slots * max(1, len(g.layer_names)) * g.spec.page_size_bytes
            for g in self.groups
            if isinstance(g.spec, MambaSpec)
        )

    @classmethod
    def from_memory(
        cls, memory_bytes: int, groups: tuple[KVCacheGroup, ...], num_state_slots: int = 0
    ) -> KVCacheConfig:
        """The state slots, then as many blocks as fit in the rest of `memory_bytes` (see
        `bytes_per_block`); the least a pool has (2 blocks) when no layer keeps blocks.

        Raises:
            ValueError: the state slots alone exceed memory_bytes.
        """
        probe = cls(2, groups, num_state_slots)
        left = memory_bytes - probe.state_bytes
        if left < 0:
            raise ValueError(
                f"the {num_state_slots} state slots take {probe.state_bytes} bytes, more than "
                f"the {memory_bytes} bytes given"
            )
        if not probe.bytes_per_block:
            return probe
        return cls(left // probe.bytes_per_block, groups, num_state_slots)


def group_layers(layer_specs: dict[str, KVCacheSpec]) -> tuple[KVCacheGroup, ...]:
    """Cut a model's layers (name -> spec, in layer order) into KV cache groups.

    Layers of one spec form groups of equal size, that size being the layer count of the
    rarest spec, so that the groups share KV tensors with little waste (see
    `KVCacheConfig`): 16 full + 16 sliding layers give 2 groups of 16; 4 full + 20
    sliding give 1 + 5 groups of 4. The last group of a spec may be smaller. State layers
    (`MambaSpec`) form one group whatever their number: one slot per request indexes
    all of them. Groups come in the order their spec first appears.
    """
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in layer_specs.items():
        by_spec.setdefault(spec, []).append(name)
    if not by_spec:
        raise ValueError("layer_specs must name at least one layer, got none")
    if len({spec for spec in by_spec if isinstance(spec, MambaSpec)}) > 1:
        raise ValueError("state layers must share one MambaSpec (one slot indexes them all)")
    counts = [len(names) for spec, names in by_spec.items() if not isinstance(spec, MambaSpec)]
    size = min(counts, default=1)
    return tuple(
        KVCacheGroup(spec, tuple(names[i : i + step]))
        for spec, names in by_spec.items()
        for step in [len(names) if isinstance(spec, MambaSpec) else size]
        for i in range(0, len(names), step)
    )
