"""CUDA graphs for decode steps: which batches a graph serves, and recording/replaying it.

A decode step of a small model is many tiny kernels, and launching them from Python
costs more than running them. A CUDA graph records the kernels of one forward pass
once and replays them with a single launch. A graph replays fixed kernels on fixed
memory, so:

- it serves only batches of a shape recorded in advance: batches of decode rows of a
  few capture sizes, where each row is one query token with its own block table and
  sequence length (plain decodes, and the verification steps of linear speculative
  drafts, whose k + 1 tokens become k + 1 rows of one request's table with growing
  lengths: the causal mask); a batch of n rows is padded to the smallest capture size
  >= n (`CudaGraphDispatcher`), larger batches, prefill chunks and draft trees run
  eagerly;
- the decode attention gathers every column of the block table it is given, so each
  size is recorded for a few block-table widths too (powers of two up to the longest
  sequence allowed) and a batch replays the narrowest graph that holds its longest
  sequence: short sequences do not pay for max_model_len;
- its inputs live in static device buffers that every step overwrites in place
  (`CudaGraphRunner`): input ids, positions, a slot mapping and a block table per KV
  cache group, and sequence lengths. A padding row has slot -1 (its KV is not
  written) and sequence length 0 (it attends to nothing), so it cannot disturb the
  real requests;
- everything it runs must be free of host synchronisation: the model attends with
  `ops.attention.paged_decode_attention`, whose shapes depend only on the buffers'.

Recording needs a CUDA device. With `record=False` the runner executes the very same
padded forward on the same static buffers, unrecorded: what a graph would replay,
checkable on a machine without CUDA.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..model.llama import AttentionMetadata

DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BatchDescriptor:
    """What a captured graph was recorded for: a token count, whether every request
    row is one query token (a batch of decode rows), and how many block-table
    columns its attention reads."""

    num_tokens: int
    uniform_decode: bool
    num_blocks: int


def width_buckets(max_blocks: int) -> list[int]:
    """Block-table widths graphs are recorded for: 1, 2, 4, ... and max_blocks."""
    widths = [1 << i for i in range(max_blocks.bit_length()) if 1 << i < max_blocks]
    return [*widths, max_blocks]


def check_capture_sizes(capture_sizes: Sequence[int]) -> list[int]:
    """The sorted distinct capture sizes, or ValueError naming the bad ones."""
    sizes = sorted(set(capture_sizes))
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"capture_sizes must be integers >= 1, got {tuple(capture_sizes)}")
    return sizes


class CudaGraphDispatcher:
    """Decides, per step, whether a captured graph serves the batch and which one.

    Only batches of decode rows (one query token per row: `num_tokens == num_rows`) are
    graph-eligible, padded to
    the smallest capture size >= their token count and the narrowest width bucket >=
    the block-table columns their longest sequence uses; larger or mixed batches run
    eagerly. Disabled (always eager) unless `enabled`.
    """

    def __init__(
        self, capture_sizes=DEFAULT_CAPTURE_SIZES, max_blocks: int = 1, enabled: bool = False
    ) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.capture_sizes = check_capture_sizes(capture_sizes)
        self.widths = width_buckets(max_blocks)
        self.enabled = enabled

    def descriptors(self) -> list[BatchDescriptor]:
        """Every graph to record, largest first."""
        return [
            BatchDescriptor(size, True, width)
            for size in reversed(self.capture_sizes)
            for width in reversed(self.widths)
        ]

    def dispatch(self, num_tokens: int, num_rows: int, num_blocks: int) -> BatchDescriptor | None:
        """The descriptor of the graph to replay (num_tokens: the padded batch size;
        num_blocks: the table width it reads), or None: run eagerly. `num_rows` is the
        batch's attention rows (requests, or tokens when each token is a decode row);
        `num_blocks` the block-table columns the batch's longest sequence uses."""
        uniform = num_tokens == num_rows
        if not self.enabled or not uniform or num_tokens > self.capture_sizes[-1]:
            return None
        if num_blocks > self.widths[-1]:
            raise ValueError(f"num_blocks must be <= {self.widths[-1]}, got {num_blocks}")
        size = self.capture_sizes[bisect.bisect_left(self.capture_sizes, num_tokens)]
        width = self.widths[bisect.bisect_left(self.widths, num_blocks)]
        return BatchDescriptor(size, True, width)


Forward = Callable[[torch.Tensor, torch.Tensor, list[AttentionMetadata], list], torch.Tensor]


class CudaGraphRunner:
    """Static input buffers, one graph per descriptor of the dispatcher, and replay.

    Args:
        forward: the model's forward(input_ids, positions, meta, kv_caches).
        kv_caches: the per-layer cache tensors the graphs write (`model.new_kv_cache`).
        dispatcher: what to record (its capture sizes and block-table widths).
        device: where the buffers live.
        record: record graphs (CUDA only); False runs the same padded forward unrecorded.
        group_of_layer: the KV cache group of each layer (None: every layer in group 0).
    Raises:
        ValueError: record=True on a non-CUDA device.
    """

    def __init__(
        self,
        forward: Forward,
        kv_caches: list[tuple[torch.Tensor, ...]],
        dispatcher: CudaGraphDispatcher,
        device: torch.device,
        record: bool,
        group_of_layer: Sequence[int] | None = None,
    ) -> None:
        if record and device.type != "cuda":
            raise ValueError(f"recording CUDA graphs needs a CUDA device, got device {device}")
        self.forward = forward
        self.kv_caches = kv_caches
        self.dispatcher = dispatcher
        self.record = record
        self.group_of_layer = list(group_of_layer or [0] * len(kv_caches))
        groups = max(self.group_of_layer, default=0) + 1
        n, width = dispatcher.capture_sizes[-1], dispatcher.widths[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((groups, n), -1, dtype=torch.int64, device=device)
        self.block_table = torch.zeros(groups, n, width, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int64, device=device)
        self.graphs: dict[BatchDescriptor, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _forward(self, d: BatchDescriptor) -> torch.Tensor:
        """The forward pass over the first d.num_tokens rows of the static buffers,
        attending through the first d.num_blocks columns of each group's block table."""
        size = d.num_tokens
        metas = [
            AttentionMetadata(
                slot_mapping=slots[:size],
                block_table=table[:size, : d.num_blocks],
                query_start_loc=self.query_start_loc[: size + 1],
                seq_lens=self.seq_lens[:size],
                decode_only=True,
            )
            for slots, table in zip(self.slot_mapping, self.block_table, strict=True)
        ]
        per_layer = [metas[g] for g in self.group_of_layer]
        return self.forward(self.input_ids[:size], self.positions[:size], per_layer, self.kv_caches)

    def capture(self) -> None:
        """Record one graph per descriptor, largest first, sharing one memory pool.

        The buffers hold padding only (nothing is written to the KV cache). Each graph's
        forward runs once eagerly first, so lazy initialisation (cuBLAS handles,
        workspaces) happens outside the recording.
        """
        if not self.record:
            return
        from tqdm.auto import tqdm

        pool = torch.cuda.graph_pool_handle()
        for d in tqdm(self.dispatcher.descriptors(), desc="capturing CUDA graphs", leave=False):
            self._forward(d)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(d)
            self.graphs[d] = (graph, out)
        torch.cuda.synchronize()

    def run(
        self,
        descriptor: BatchDescriptor,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        block_table: np.ndarray,
        seq_lens: np.ndarray,
    ) -> torch.Tensor:
        """Hidden states of the n = len(input_ids) real tokens of a batch of decode rows,
        computed by the graph of `descriptor` (from the dispatcher): its num_tokens is
        >= n (rows n.. are padding) and its num_blocks >= block_table's columns.
        slot_mapping (num_groups, n) and block_table (num_groups, n, width) hold each
        KV cache group's slots and table.

        The result is a view of the graph's output buffer: valid until the next run.
        """
        n, size, width = len(input_ids), descriptor.num_tokens, block_table.shape[-1]
        recorded = (
            descriptor.uniform_decode
            and size in self.dispatcher.capture_sizes
            and descriptor.num_blocks in self.dispatcher.widths
        )
        if not recorded or n > size or width > descriptor.num_blocks:
            raise ValueError(
                f"descriptor must be a recorded one for {n} tokens and {width} blocks, "
                f"got {descriptor}"
            )
        for buf, host in (
            (self.input_ids, input_ids),
            (self.positions, positions),
            (self.seq_lens, seq_lens),
        ):
            buf[:n].copy_(torch.as_tensor(host), non_blocking=True)
        self.slot_mapping[:, :n].copy_(torch.as_tensor(slot_mapping), non_blocking=True)
        self.block_table[:, :n, :width].copy_(torch.as_tensor(block_table), non_blocking=True)
        self.input_ids[n:size] = 0
        self.positions[n:size] = 0
        self.slot_mapping[:, n:size] = -1
        self.seq_lens[n:size] = 0
        if not self.record:
            return self._forward(descriptor)[:n]
        graph, out = self.graphs[descriptor]
        graph.replay()
        return out[:n]
