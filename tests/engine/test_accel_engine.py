"""The engine on pyagent_accel's ops draws the tokens it draws on the reference ops.

Every op of a step runs in Rust with ops="accel" (the layers, RoPE and attention of the
forward pass, then sampling, hashing and block tables), so the two engines' logits differ
by float rounding only (within the conformance tolerances, ~1e-6 relative in float32).
Greedy tokens must be identical. Seeded sampling draws with the same Philox uniforms on
both, so its tokens are identical too unless two candidates' perturbed scores tie within
that rounding: on these workloads none does, and a flip would fail the test with the
workload that caused it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyagent_accel.ops")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.worker.helpers import tiny_model  # noqa: E402


def _tokens(model, ops: str, workload, **config) -> list[list[int]]:
    core = EngineCore(model, EngineConfig(ops=ops, max_num_seqs=4, **config))
    reqs = []
    for i, (prompt, n, sample) in enumerate(workload):
        params = SamplingParams(temperature=0.9 if sample else 0.0, top_p=0.95, max_tokens=n)
        reqs.append(Request(str(i), prompt, sampling_params=params, seed=i, max_tokens=n))
        core.add_request(reqs[-1])
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in reqs]


@settings(deadline=None, max_examples=40)
@given(
    workload=st.lists(
        st.tuples(
            st.lists(st.integers(0, 49), min_size=1, max_size=20),
            st.integers(1, 10),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
    block_size=st.sampled_from([2, 4, 8]),
    num_blocks=st.integers(12, 40),
    budget=st.integers(8, 32),
    caching=st.booleans(),
    graph_mode=st.sampled_from(["eager", "static"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_accel_and_ref_ops_draw_the_same_tokens(
    workload, block_size, num_blocks, budget, caching, graph_mode, dtype
):
    """Chunked prefill, preemption (small caches), prefix hits, mixed and decode-only
    batches (graph_mode "static": the padded decode path), float32 and bfloat16 weights."""
    model = tiny_model().to(dtype)
    config = dict(
        block_size=block_size,
        num_kv_blocks=num_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        graph_mode=graph_mode,
    )
    assert _tokens(model, "accel", workload, **config) == _tokens(model, "ref", workload, **config)
