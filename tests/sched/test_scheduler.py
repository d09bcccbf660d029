"""The scheduler over random workloads, with a stand-in runner whose tokens are a pure
function of (request, position) — so the right output is known whatever the batching,
chunking and preemption did."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

import pyagent_ref.ops
from pyagent_ref.kv_cache import FullAttentionSpec, KVCacheConfig, KVCacheGroup, KVCacheManager
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.sched import Request, RequestStatus
from pyagent_ref.sched.outputs import ModelRunnerOutput
from pyagent_ref.sched.scheduler import Scheduler, SchedulerConfig

BLOCK = 4
VOCAB = 50


def token_for(rid: str, position: int) -> int:
    return zlib.crc32(f"{rid}:{position}".encode()) % VOCAB


class StandInRunner:
    """Samples token_for(request, output position) once a request's tokens are computed."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def execute(self, sched) -> ModelRunnerOutput:
        sampled = {}
        for rid in sched.num_scheduled_tokens:
            r = self.scheduler.requests[rid]
            done = r.num_computed_tokens >= r.num_tokens
            sampled[rid] = [token_for(rid, r.num_output_tokens)] if done else []
        return ModelRunnerOutput(sampled)


def make(num_blocks, budget, max_seqs, chunked=True, policy="fcfs", max_model_len=200):
    kv = KVCacheManager(
        KVCacheConfig(num_blocks, (KVCacheGroup(FullAttentionSpec(BLOCK, 1, 8)),)),
        ops=pyagent_ref.ops,
    )
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        policy=policy,
    )
    scheduler = Scheduler(config, kv)
    return scheduler, kv, StandInRunner(scheduler)


def new_request(i, prompt_len, max_tokens, shared):
    prompt = ([7] * shared + [i % VOCAB] * prompt_len)[: max(prompt_len, 1)]
    return Request(
        f"r{i}",
        prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens),
        max_tokens=max_tokens,
        priority=i % 3,
        client_id=f"c{i % 2}",
    )


workloads = st.lists(
    st.tuples(
        st.integers(1, 30), st.integers(1, 8), st.integers(0, 6), st.booleans(), st.integers(0, 12)
    ),
    min_size=1,
    max_size=12,
)


@settings(deadline=None)
@given(
    workload=workloads,
    num_blocks=st.integers(12, 40),
    budget=st.integers(8, 48),
    max_seqs=st.integers(1, 6),
    chunked=st.booleans(),
    policy=st.sampled_from(["fcfs", "priority", "deadline", "fair", "mlfq"]),
)
def test_random_workloads(workload, num_blocks, budget, max_seqs, chunked, policy):
    if not chunked:
        budget = max(budget, 40)  # whole prompts must fit one step
    scheduler, kv, runner = make(num_blocks, budget, max_seqs, chunked, policy)
    requests, pending = {}, list(enumerate(workload))
    expected = {}
    for step in range(400):
        for i, (plen, max_tokens, arrive, abort, shared) in list(pending):
            if arrive <= step:
                r = new_request(i, plen, max_tokens, shared)
                requests[r.request_id] = r
                expected[r.request_id] = [token_for(r.request_id, k) for k in range(max_tokens)]
                scheduler.add_request(r)
                pending.remove((i, (plen, max_tokens, arrive, abort, shared)))
                if abort and i % 4 == 0:
                    scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_ABORTED)
        if not scheduler.has_unfinished_requests() and not pending:
            break
        sched = scheduler.schedule()
        # invariants of the plan
        assert sched.total_num_scheduled_tokens <= budget
        assert len(scheduler.running) <= max_seqs
        waiting_ids = {r.request_id for r in scheduler.waiting}
        running_ids = {r.request_id for r in scheduler.running}
        assert not waiting_ids & running_ids
        for rid in sched.preempted_req_ids:
            assert kv.get_block_ids(requests[rid]) == ([],)
        for r in scheduler.running:  # every running request holds blocks for its tokens
            assert len(kv.get_block_ids(r)[0]) * BLOCK >= r.num_computed_tokens
        scheduler.update_from_output(sched, runner.execute(sched))
        # a request aborted mid-stream frees everything at once
        if step == 3 and scheduler.running:
            victim = scheduler.running[0]
            scheduler.finish_requests([victim.request_id], RequestStatus.FINISHED_ABORTED)
            assert kv.get_block_ids(victim) == ([],)
    assert not scheduler.has_unfinished_requests(), "a request never finished"
    for rid, r in requests.items():
        assert r.is_finished
        if r.status == RequestStatus.FINISHED_LENGTH:
            assert r.output_token_ids == expected[rid]  # preemption and chunking are invisible
        else:
            assert r.status == RequestStatus.FINISHED_ABORTED
            assert r.output_token_ids == expected[rid][: len(r.output_token_ids)]
    assert kv.pool.num_free_blocks == num_blocks - 1


def test_a_small_cache_forces_preemption_and_everyone_finishes():
    scheduler, kv, runner = make(num_blocks=9, budget=64, max_seqs=4)
    reqs = [new_request(i, 10, 12, 0) for i in range(4)]
    for r in reqs:
        scheduler.add_request(r)
    preemptions = 0
    while scheduler.has_unfinished_requests():
        sched = scheduler.schedule()
        preemptions += len(sched.preempted_req_ids)
        scheduler.update_from_output(sched, runner.execute(sched))
    assert preemptions > 0
    assert all(r.output_token_ids == [token_for(r.request_id, k) for k in range(12)] for r in reqs)
    assert sum(r.times.num_preemptions for r in reqs) == preemptions
    assert kv.pool.num_free_blocks == 8


def test_prefix_cache_skips_shared_tokens():
    scheduler, kv, runner = make(num_blocks=40, budget=64, max_seqs=4)
    a = new_request(0, 1, 2, 16)
    scheduler.add_request(a)
    while scheduler.has_unfinished_requests():
        s = scheduler.schedule()
        scheduler.update_from_output(s, runner.execute(s))
    b = new_request(4, 1, 2, 16)  # same 16 shared tokens, another last token
    scheduler.add_request(b)
    sched = scheduler.schedule()
    assert sched.num_scheduled_tokens["r4"] == 17 - 16


def test_stop_conditions():
    scheduler, kv, runner = make(num_blocks=40, budget=64, max_seqs=4)
    first = token_for("r0", 0)
    r = new_request(0, 3, 10, 0)
    r.eos_token_id = token_for("r0", 2)
    r.sampling_params = SamplingParams(max_tokens=10, min_tokens=2, stop_token_ids=[first])
    scheduler.add_request(r)
    while scheduler.has_unfinished_requests():
        s = scheduler.schedule()
        scheduler.update_from_output(s, runner.execute(s))
    # the stop token comes first, but before min_tokens=2 it does not count; EOS ends it
    assert token_for("r0", 1) not in (first, r.eos_token_id)
    assert r.status == RequestStatus.FINISHED_STOPPED
    assert len(r.output_token_ids) == 3 and r.stop_reason is None


def test_duplicate_and_oversized_requests_are_rejected():
    scheduler, _, _ = make(num_blocks=10, budget=16, max_seqs=2, max_model_len=8)
    scheduler.add_request(Request("a", [1, 2]))
    import pytest

    with pytest.raises(ValueError, match="'a'"):
        scheduler.add_request(Request("a", [1]))
    with pytest.raises(ValueError, match="max_model_len=8"):
        scheduler.add_request(Request("b", list(range(8))))


@settings(deadline=None)
@given(
    workload=workloads,
    num_blocks=st.integers(3, 16),
    budget=st.integers(4, 24),
    max_seqs=st.integers(1, 6),
    chunked=st.booleans(),
    policy=st.sampled_from(["fcfs", "priority", "deadline", "fair", "mlfq"]),
)
def test_progress_guarantee(workload, num_blocks, budget, max_seqs, chunked, policy):
    """With max_model_len within the cache (and, unchunked, the budget), as the engine
    sets it, some request finishes at least every max_model_len steps."""
    max_model_len = (num_blocks - 1) * BLOCK
    if not chunked:
        max_model_len = min(max_model_len, budget)
    scheduler, kv, runner = make(num_blocks, budget, max_seqs, chunked, policy, max_model_len)
    requests = []
    for i, (plen, max_tokens, _, _, shared) in enumerate(workload):
        r = new_request(i, plen, max_tokens, shared)
        if r.num_prompt_tokens < max_model_len:
            requests.append(r)
            scheduler.add_request(r)
    since_finish, step = 0, 0
    while scheduler.has_unfinished_requests():
        sched = scheduler.schedule()
        out = scheduler.update_from_output(sched, runner.execute(sched))
        finished = [o for o in out.outputs if o.finish_reason is not None]
        since_finish = 0 if finished else since_finish + 1
        assert since_finish <= max_model_len, "no request finished for max_model_len steps"
        step += 1
        assert step < 10_000
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    assert kv.pool.num_free_blocks == num_blocks - 1


def test_a_prompt_larger_than_the_budget_fails_without_chunked_prefill():
    scheduler, kv, runner = make(40, 8, 4, chunked=False, max_model_len=100)
    small, big = new_request(0, 4, 3, 0), new_request(1, 12, 3, 0)
    for r in (big, small):
        scheduler.add_request(r)
    for _ in range(20):
        if scheduler.has_unfinished_requests():
            sched = scheduler.schedule()
            scheduler.update_from_output(sched, runner.execute(sched))
    assert big.status == RequestStatus.FINISHED_ERROR
    assert "its 12 uncached tokens exceed max_num_batched_tokens=8" in big.error
    assert small.status == RequestStatus.FINISHED_LENGTH


def test_a_request_larger_than_the_whole_cache_fails_instead_of_looping():
    scheduler, kv, runner = make(4, 64, 4, max_model_len=200)  # 3 blocks: 12 tokens
    r = new_request(0, 8, 20, 0)
    scheduler.add_request(r)
    outputs = []
    for _ in range(50):
        if not scheduler.has_unfinished_requests():
            break
        sched = scheduler.schedule()
        outputs += scheduler.update_from_output(sched, runner.execute(sched)).outputs
    assert r.status == RequestStatus.FINISHED_ERROR
    assert "does not fit even alone in the cache (3 blocks of 4 tokens)" in r.error
    assert outputs[-1].finish_reason == "error" and outputs[-1].error == r.error
    assert len(r.output_token_ids) == 5  # it ran until the KV of its 13th token needed a 4th block
    assert kv.pool.num_free_blocks == 3


def test_the_head_of_running_is_never_preempted_for_another_request():
    """The rule behind the progress guarantee, under a policy that would preempt the
    earliest request first: the head still runs to its end."""
    from pyagent_ref.sched.policy import WaitingQueue

    class OldestFirst(WaitingQueue):
        def victim_key(self, request):
            return (-request.times.arrival,)

    scheduler, kv, runner = make(7, 64, 4, max_model_len=24)  # 6 blocks: 24 tokens
    scheduler.waiting = OldestFirst()
    head, other = new_request(0, 8, 12, 0), new_request(1, 8, 12, 0)
    for r in (head, other):
        scheduler.add_request(r)
    order = []
    while scheduler.has_unfinished_requests():
        sched = scheduler.schedule()
        out = scheduler.update_from_output(sched, runner.execute(sched))
        order += [o.req_id for o in out.outputs if o.finish_reason]
    assert head.times.num_preemptions == 0 and other.times.num_preemptions > 0
    assert order == ["r0", "r1"]
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in (head, other))
