"""EngineCore end to end on a real (tiny) model: HF parity, seeds, aborts, preemption."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request, RequestStatus  # noqa: E402
from tests.worker.helpers import PROMPTS  # noqa: E402


def engine(path, ops="ref", **overrides):
    config = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8, max_num_seqs=8, ops=ops)
    model = load_model(path, progress=False)
    return EngineCore(model, EngineConfig(**(config | overrides)))


def run(core, requests, abort_at=None):
    for r in requests:
        core.add_request(r)
    step = 0
    while core.has_unfinished_requests():
        core.step()
        step += 1
        if abort_at and step == abort_at[0]:
            core.abort_requests([abort_at[1]])
    return requests


def greedy(i, prompt, n=8):
    return Request(
        str(i), prompt, sampling_params=SamplingParams(temperature=0, max_tokens=n), max_tokens=n
    )


def test_greedy_batch_with_chunked_prefill_equals_hf_generate(tiny_hf):
    hf, path = tiny_hf
    core = engine(path)  # budget 8 tokens per step: the long prompts are chunked
    reqs = run(core, [greedy(i, p) for i, p in enumerate(PROMPTS)])
    for r, p in zip(reqs, PROMPTS, strict=True):
        expected = hf.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p) :]
        assert r.output_token_ids == expected.tolist()
        assert r.status == RequestStatus.FINISHED_LENGTH
    assert core.kv.metrics().hits > 0  # prompts 0 and 2 share a prefix


def sampled(i, prompt, seed):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=seed, max_tokens=10)
    return Request(str(i), prompt, sampling_params=params, seed=seed, max_tokens=10)


@pytest.mark.parametrize("ops", ["ref", "accel"])
def test_same_seed_same_tokens_whatever_the_batch(tiny_hf, ops):
    if ops == "accel":
        pytest.importorskip("pyagent_accel.ops")
    _, path = tiny_hf
    alone = run(engine(path, ops), [sampled(0, PROMPTS[0], 1234)])[0].output_token_ids
    crowd = [sampled(i, p, 1000 + i) for i, p in enumerate(PROMPTS)]
    crowd[2] = sampled(2, PROMPTS[0], 1234)
    run(engine(path, ops, max_num_batched_tokens=32), crowd)
    assert crowd[2].output_token_ids == alone


def test_ref_and_accel_ops_draw_the_same_tokens(tiny_hf):
    pytest.importorskip("pyagent_accel.ops")
    _, path = tiny_hf
    a = run(engine(path, "ref"), [sampled(i, p, 7 + i) for i, p in enumerate(PROMPTS)])
    b = run(engine(path, "accel"), [sampled(i, p, 7 + i) for i, p in enumerate(PROMPTS)])
    assert [r.output_token_ids for r in a] == [r.output_token_ids for r in b]


def test_abort_mid_stream_frees_every_block(tiny_hf):
    _, path = tiny_hf
    core = engine(path)
    reqs = [greedy(i, p, 20) for i, p in enumerate(PROMPTS)]
    run(core, reqs, abort_at=(4, "1"))
    assert reqs[1].status == RequestStatus.FINISHED_ABORTED
    assert 0 < len(reqs[1].output_token_ids) < 20
    assert core.kv.pool.num_free_blocks == 63
    assert not core.runner.batch.states  # the finished ones' states went with the last step


def test_an_idle_engine_holds_no_state_of_aborted_requests(tiny_hf):
    """The runner forgets a request when a step's schedule names it as ended; aborting
    every request leaves no step to come, so the abort itself tells the runner."""
    _, path = tiny_hf
    core = engine(path)
    for i, p in enumerate(PROMPTS):
        core.add_request(greedy(i, p, 20))
    core.step()
    core.step()
    assert core.runner.batch.states
    core.abort_requests([str(i) for i in range(len(PROMPTS))])
    assert not core.has_unfinished_requests() and not core.runner.batch.states


def test_small_kv_cache_forces_preemption_and_outputs_stay_right(tiny_hf):
    hf, path = tiny_hf
    core = engine(path, num_kv_blocks=12, max_num_batched_tokens=64, enable_prefix_caching=False)
    reqs = run(core, [greedy(i, p, 12) for i, p in enumerate(PROMPTS[:4])])
    assert sum(r.times.num_preemptions for r in reqs) > 0
    for r, p in zip(reqs, PROMPTS, strict=False):
        expected = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p) :]
        assert r.output_token_ids == expected.tolist()
    assert core.kv.pool.num_free_blocks == 11


def test_sleep_wake_and_shutdown(tiny_hf):
    _, path = tiny_hf
    core = engine(path)
    run(core, [greedy(0, PROMPTS[1], 4)])
    core.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        core.add_request(greedy(1, PROMPTS[1], 4))
    core.wake_up()
    core.add_request(greedy(2, PROMPTS[0], 4))
    steps = core.shutdown(drain=True)
    assert steps and not core.has_unfinished_requests()
    with pytest.raises(RuntimeError, match="shutting down"):
        core.add_request(greedy(3, PROMPTS[0], 4))
