"""Model runner pieces: CUDA-graph dispatch, capture sizes and the input batch."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched.outputs import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from pyagent_ref.worker.cuda_graph import BatchDescriptor, CudaGraphDispatcher  # noqa: E402
from pyagent_ref.worker.input_batch import InputBatch  # noqa: E402
from pyagent_ref.worker.model_runner import ModelRunner  # noqa: E402
from tests.worker.helpers import tiny_model  # noqa: E402


def test_uniform_decode_batches_pad_to_the_next_capture_size_and_width():
    d = CudaGraphDispatcher(capture_sizes=(1, 2, 4, 8), max_blocks=6, enabled=True)
    assert d.widths == [1, 2, 4, 6]
    assert d.dispatch(3, 3, 1) == BatchDescriptor(4, True, 1)
    assert d.dispatch(8, 8, 3) == BatchDescriptor(8, True, 4)
    assert d.dispatch(1, 1, 5) == BatchDescriptor(1, True, 6)
    assert len(d.descriptors()) == 4 * 4
    assert d.descriptors()[0] == BatchDescriptor(8, True, 6)  # recorded largest first


def test_mixed_large_or_disabled_batches_run_eagerly():
    d = CudaGraphDispatcher(capture_sizes=(1, 2, 4, 8), max_blocks=4, enabled=True)
    assert d.dispatch(5, 3, 1) is None  # a prefill chunk is in the batch
    assert d.dispatch(9, 9, 1) is None  # larger than any captured graph
    assert CudaGraphDispatcher(enabled=False).dispatch(2, 2, 1) is None
    with pytest.raises(ValueError, match="num_blocks must be <= 4, got 5"):
        d.dispatch(2, 2, 5)
    with pytest.raises(ValueError, match="capture_sizes must be integers >= 1"):
        CudaGraphDispatcher(capture_sizes=(0, 2))
    with pytest.raises(ValueError, match="max_blocks must be >= 1, got 0"):
        CudaGraphDispatcher(max_blocks=0)


def new(rid, prompt, blocks, computed=0):
    return NewRequestData(rid, tuple(prompt), (), SamplingParams(), 0, (), (blocks,), computed)


def test_input_batch_flattens_prefill_and_decode():
    batch = InputBatch(max_num_reqs=4, max_model_len=64, max_num_tokens=32, block_size=4)
    step1 = SchedulerOutput(
        [new("a", range(10, 16), [3, 5]), new("b", [7, 8, 9], [2])], [], {"a": 4, "b": 3}, 7
    )
    batch.update_states(step1)
    prep = batch.prepare(step1)
    assert prep.input_ids.tolist() == [10, 11, 12, 13, 7, 8, 9]
    assert prep.positions.tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert prep.query_start_loc.tolist() == [0, 4, 7] and prep.seq_lens.tolist() == [4, 3]
    assert prep.samples == [False, True]  # a is mid-prompt; b finished its prompt
    assert prep.logits_indices.tolist() == [3, 6]
    batch.after_step(step1, {"a": [], "b": [42]})
    step2 = SchedulerOutput(
        [], [CachedRequestData("a", (), 4), CachedRequestData("b", ([6],), 3)], {"a": 2, "b": 1}, 3
    )
    batch.update_states(step2)
    prep = batch.prepare(step2)
    assert prep.input_ids.tolist() == [14, 15, 42]
    assert prep.positions.tolist() == [4, 5, 3]
    assert prep.block_tables[0, 1, :2].tolist() == [2, 6]
    np.testing.assert_array_equal(prep.samples, [True, True])


def test_capture_sizes_past_the_seat_limit_are_capped_to_it():

    runner = ModelRunner(tiny_model(), 6, 4, load_ops("ref"), max_num_reqs=6, graph_mode="static")
    assert runner.dispatcher.capture_sizes == [1, 2, 4, 6]
    assert runner.dispatcher.dispatch(5, 5, 1) == BatchDescriptor(6, True, 1)
