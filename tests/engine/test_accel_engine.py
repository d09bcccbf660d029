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

from tests.worker.helpers import ENGINE_SETTINGS, WORKLOADS, run_workload, tiny_model  # noqa: E402


@settings(deadline=None, max_examples=40)
@given(
    workload=WORKLOADS,
    graph_mode=st.sampled_from(["eager", "static"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    **ENGINE_SETTINGS,
)
def test_accel_and_ref_ops_draw_the_same_tokens(workload, graph_mode, dtype, **settings_):
    """Chunked prefill, preemption (small caches), prefix hits, mixed and decode-only
    batches (graph_mode "static": the padded decode path), float32 and bfloat16 weights."""
    model = tiny_model().to(dtype)
    ref = run_workload(model, workload, ops="ref", graph_mode=graph_mode, **settings_)
    assert run_workload(model, workload, ops="accel", graph_mode=graph_mode, **settings_) == ref
