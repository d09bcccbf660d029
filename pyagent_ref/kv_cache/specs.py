"""What each kind of attention layer keeps in the KV cache.

A model's layers are grouped by spec; each group gets its own block tables from the one
shared pool (all groups use the same block size). The spec decides how many bytes a
block takes, which blocks a request still needs, and which prefix-cache hits are valid.
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
class KVCacheGroup:
    """Layers that share a spec, and so share block tables."""

    spec: FullAttentionSpec
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
    """

    num_blocks: int
    groups: tuple[KVCacheGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a KV cache config needs at least one group")
        sizes = {g.spec.block_size for g in self.groups}
        if len(sizes) != 1:
            raise ValueError(f"all groups must share one block_size, got {sorted(sizes)}")

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size

    @property
    def num_kv_tensors(self) -> int:
        """KV tensors (per K and V) the groups share: the largest group's layer count."""
        return max(max(1, len(g.layer_names)) for g in self.groups)

    @property
    def bytes_per_block(self) -> int:
        """Memory of one block id across the shared KV tensors."""
        return self.num_kv_tensors * max(g.spec.page_size_bytes for g in self.groups)

    @classmethod
    def from_memory(cls, memory_bytes: int, groups: tuple[KVCacheGroup, ...]) -> KVCacheConfig:
        """As many blocks as fit in `memory_bytes` (see `bytes_per_block`)."""
        return cls(num_blocks=memory_bytes // cls(1, groups).bytes_per_block, groups=groups)


def group_layers(layer_specs: dict[str, FullAttentionSpec]) -> tuple[KVCacheGroup, ...]:
    """Cut a model's layers (name -> spec, in layer order) into KV cache groups.

    Layers of one spec form groups of equal size, that size being the layer count of the
    rarest spec, so that the groups share KV tensors with little waste (see
    `KVCacheConfig`): 16 full + 16 sliding layers give 2 groups of 16; 4 full + 20
    sliding give 1 + 5 groups of 4. The last group of a spec may be smaller. Groups come
    in the order their spec first appears.
    """
    by_spec: dict[FullAttentionSpec, list[str]] = {}
    for name, spec in layer_specs.items():
        by_spec.setdefault(spec, []).append(name)
    if not by_spec:
        raise ValueError("layer_specs must name at least one layer, got none")
    size = min(len(names) for names in by_spec.values())
    return tuple(
        KVCacheGroup(spec, tuple(names[i : i + size]))
        for spec, names in by_spec.items()
        for i in range(0, len(names), size)
    )
