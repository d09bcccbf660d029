"""The CUDA-graph path of decode steps: static buffers, padding, no host reads, replay.

Recording needs CUDA (the last test); everything a recorded graph computes is checked
on CPU through graph_mode="static", which runs the same padded forward on the same
static buffers without recording it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import event, given, settings

torch = pytest.importorskip("torch")

from pyagent_ref.model import AttentionMetadata  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.worker.cuda_graph import BatchDescriptor, CudaGraphRunner  # noqa: E402
from pyagent_ref.worker.model_runner import ModelRunner  # noqa: E402
from tests.worker.helpers import (  # noqa: E402
    ENGINE_SETTINGS,
    PROMPTS,
    WORKLOADS,
    generate,
    make_engine,
    run_workload,
    tiny_model,
)


def test_static_decode_path_draws_the_tokens_of_the_eager_path(tiny_hf):
    hf, path = tiny_hf
    static = make_engine(path, graph_mode="static", cudagraph_capture_sizes=(1, 2, 4, 8))
    seen = []  # (descriptor, real tokens, block-table columns used)
    run = static.runner.graphs.run
    static.runner.graphs.run = lambda d, *a: (
        seen.append((d, len(a[0]), a[3].shape[-1])) or run(d, *a)
    )
    got = generate(static)
    want = generate(make_engine(path, graph_mode="eager"))
    assert got == want
    assert any(d.num_tokens > n for d, n, _ in seen), seen  # some batches were padded
    assert {d.num_tokens for d, _, _ in seen} <= {1, 2, 4, 8}
    widths = static.runner.dispatcher.widths
    assert all(d.num_blocks == min(x for x in widths if x >= w) for d, _, w in seen)
    greedy = hf.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=12, do_sample=False)
    assert got[0] == greedy[0, len(PROMPTS[0]) :].tolist()


def test_padding_rows_leave_the_kv_cache_alone():
    """A batch of 3 decodes, then one of 1 at the same capture size 4: rows 1-3 of the
    second batch are padding over the first batch's stale rows, and only the one real
    token's slot changes."""
    model = tiny_model()
    runner = ModelRunner(model, 6, 4, load_ops("ref"), max_num_reqs=4, graph_mode="static")
    for k, v in runner.kv_caches:
        k.normal_(), v.normal_()
    graph = BatchDescriptor(4, uniform_decode=True, num_blocks=2)

    def run(ids, positions, slots, table, seq_lens):
        arrays = (ids, positions, [slots], [table], seq_lens)  # one KV cache group
        with torch.inference_mode():
            runner.graphs.run(graph, *(torch.tensor(a).numpy() for a in arrays))

    run([7, 8, 9], [5, 2, 0], [9, 14, 16], [[1, 2], [3, 0], [4, 0]], [6, 3, 1])
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    run([7], [6], [10], [[1, 2]], [7])  # block 2, row 2
    for (k0, v0), (k1, v1) in zip(before, runner.kv_caches, strict=True):
        changed = (k0 != k1).any(-1).any(-1) | (v0 != v1).any(-1).any(-1)
        assert changed.nonzero().tolist() == [[2, 2]]


def test_the_decode_forward_reads_no_device_value():
    """On torch's meta device every host read of a value (bool(), .item(), boolean-mask
    indexing) raises: the decode forward passes, the general forward does not."""
    model = tiny_model().to("meta")
    n, cache = 3, model.kv_cache_shape(8, 4)
    kv = [(torch.empty(cache, device="meta"), torch.empty(cache, device="meta"))] * 2

    def meta(decode_only):
        return AttentionMetadata(
            slot_mapping=torch.empty(n, dtype=torch.int64, device="meta"),
            block_table=torch.empty(n, 5, dtype=torch.int64, device="meta"),
            query_start_loc=torch.empty(n + 1, dtype=torch.int64, device="meta"),
            seq_lens=torch.empty(n, dtype=torch.int64, device="meta"),
            decode_only=decode_only,
        )

    ids = torch.empty(n, dtype=torch.int64, device="meta")
    out = model(ids, ids, meta(True), kv)
    assert out.shape == (n, 32) and out.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):
        model(ids, ids, meta(False), kv)


def test_dynamic_ntk_rope_is_not_graph_capturable():
    assert tiny_model().supports_cuda_graphs
    dynamic = tiny_model(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert not dynamic.supports_cuda_graphs


def test_bad_graph_settings_are_rejected():
    model, ops = tiny_model(), load_ops("ref")
    with pytest.raises(ValueError, match="graph_mode must be one of .*'always'"):
        ModelRunner(model, 6, 4, ops, graph_mode="always")
    with pytest.raises(ValueError, match=r"capture_sizes must be integers >= 1, got \(0, 2\)"):
        ModelRunner(model, 6, 4, ops, graph_mode="static", capture_sizes=(0, 2))
    runner = ModelRunner(model, 6, 4, ops, max_num_reqs=4, graph_mode="static")
    with pytest.raises(ValueError, match="needs a CUDA device, got device cpu"):
        CudaGraphRunner(model.forward, [], runner.dispatcher, torch.device("cpu"), record=True)
    ids = torch.zeros(3, dtype=torch.int64).numpy()
    table = torch.zeros(3, 2, dtype=torch.int64).numpy()
    bad = (
        BatchDescriptor(2, True, 2),  # fewer rows than tokens
        BatchDescriptor(4, False, 2),  # not a decode graph
        BatchDescriptor(3, True, 2),  # not a capture size
        BatchDescriptor(4, True, 1),  # narrower than the table
        BatchDescriptor(4, True, 3),  # not a width bucket
    )
    for d in bad:
        with pytest.raises(ValueError, match=re.escape(f"3 tokens and 2 blocks, got {d}")):
            runner.graphs.run(d, ids, ids, ids, table, ids)


def test_sleep_and_wake_rebuild_the_static_buffers(tiny_hf):
    _, path = tiny_hf
    core = make_engine(path, graph_mode="static")
    first = generate(core)
    core.sleep()
    assert core.runner.graphs is None and not core.runner.kv_caches
    core.wake_up()
    assert core.runner.graphs.kv_caches is core.runner.kv_caches
    assert generate(core) == first


@pytest.mark.cuda
def test_recorded_graphs_replay_the_eager_tokens_on_cuda(tiny_hf):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _, path = tiny_hf
    graphs = make_engine(path, device="cuda", cudagraph_capture_sizes=(1, 2, 4, 8))
    assert graphs.runner.graphs is not None and graphs.runner.graphs.record
    assert set(graphs.runner.graphs.graphs) == set(graphs.runner.dispatcher.descriptors())
    assert {d.num_tokens for d in graphs.runner.graphs.graphs} == {1, 2, 4, 8}
    eager = make_engine(path, device="cuda", enforce_eager=True)
    assert eager.runner.graphs is None
    assert generate(graphs) == generate(eager)


@settings(deadline=None, max_examples=25)
@given(workload=WORKLOADS, **ENGINE_SETTINGS)
def test_static_and_eager_agree_on_random_workloads(workload, **settings_):
    """Chunked prefill, preemption (small caches), prefix hits and padded decode batches
    of every size: the graph path draws every token the eager path draws."""
    model = tiny_model()
    eager = run_workload(model, workload, ops="ref", graph_mode="eager", **settings_)
    assert run_workload(model, workload, ops="ref", graph_mode="static", **settings_) == eager


def graph_verification_runs(model, workload, **settings_):
    """A workload under n-gram speculation, eagerly and through the static graph path:
    (eager tokens, graph tokens, per graph run whether it held a verification step,
    i.e. some request with several rows)."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    config = dict(ops="ref", speculative_config=spec, **settings_)
    eager = run_workload(model, workload, graph_mode="eager", **config)
    flattened = []
    original = CudaGraphRunner.run

    def spy(self, descriptor, input_ids, positions, slots, tables, seq_lens):
        flattened.append(len(np.unique(tables[0], axis=0)) < len(input_ids))
        return original(self, descriptor, input_ids, positions, slots, tables, seq_lens)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CudaGraphRunner, "run", spy)
        static = run_workload(model, workload, graph_mode="static", **config)
    return eager, static, flattened


@settings(deadline=None, max_examples=15)
@given(workload=WORKLOADS, **ENGINE_SETTINGS)
def test_verification_steps_run_as_decode_rows_through_the_graphs(workload, **settings_):
    """Speculative decoding (n-gram drafts): a verification step is flattened to one
    decode row per token (its request's block table, its own sequence length) and is
    served by the static graph path, which draws every token the eager path draws
    (sampled ones too). That the flattened rows attend as the general attention does
    is what the greedy-equality tests of tests/spec_decode prove."""
    eager, static, flattened = graph_verification_runs(tiny_model(), workload, **settings_)
    assert static == eager
    event("a verification step ran through a graph", sum(flattened) > 0)


def test_repetitive_requests_verify_through_the_graphs():
    workload = [([0, 1, 2, 3] * 4, 20, False), ([1, 2] * 6, 20, True), ([3] * 5, 12, False)]
    eager, static, flattened = graph_verification_runs(
        tiny_model(), workload, block_size=4, num_blocks=64, budget=32, caching=True
    )
    assert static == eager
    assert sum(flattened) >= 3
