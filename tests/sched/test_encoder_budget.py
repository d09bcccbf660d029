"""The scheduler with images: over random workloads (images shared between requests or
not, chunk budgets that cut through them, encoder budgets and caches of a few images,
prefix caching, preemption), every placeholder token a step computes has its image's
encoder output in the runner's hands (encoded this step or kept from an earlier one),
no step encodes more than its budget, the cache never holds more than its size, and
every request finishes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pyagent_ref.ops
from pyagent_ref.kv_cache import FullAttentionSpec, KVCacheConfig, KVCacheGroup, KVCacheManager
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.sched import Request
from pyagent_ref.sched.outputs import ModelRunnerOutput
from pyagent_ref.sched.request import MultiModalFeature
from pyagent_ref.sched.scheduler import Scheduler, SchedulerConfig

IMAGE = 99


@st.composite
def workloads(draw):
    length = draw(st.integers(2, 8))  # positions per image
    requests = []
    for i in range(draw(st.integers(1, 6))):
        ids, features = [1, 2, 3][: draw(st.integers(1, 3))], []
        for _ in range(draw(st.integers(0, 2))):
            image = draw(st.sampled_from("abcd"))
            features.append(MultiModalFeature(image, len(ids), length))
            ids += [IMAGE] * length + [4] * draw(st.integers(0, 3))
        requests.append(
            Request(
                f"r{i}",
                ids,
                mm_features=tuple(features),
                sampling_params=SamplingParams(max_tokens=2, ignore_eos=True),
                max_tokens=2,
            )
        )
    budget = draw(st.integers(1, 12))
    images_per_step = draw(st.integers(1, 3))
    config = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, 4)),
        max_model_len=64,
        max_num_encoder_tokens=images_per_step * length,
        encoder_cache_size=draw(st.integers(images_per_step, 4)) * length,
    )
    blocks = draw(st.integers(12, 40))  # few enough to preempt now and then
    return requests, config, blocks, draw(st.booleans())


@settings(max_examples=100, deadline=None)
@given(workloads())
def test_every_computed_placeholder_has_its_encoder_output(case):
    requests, config, blocks, prefix_caching = case
    kv = KVCacheManager(
        KVCacheConfig(blocks, (KVCacheGroup(FullAttentionSpec(4, 1, 8)),)),
        ops=pyagent_ref.ops,
        enable_caching=prefix_caching,
    )
    scheduler = Scheduler(config, kv)
    for request in requests:
        scheduler.add_request(request)
    held: set[str] = set()  # what the runner holds
    for _ in range(500):
        if not scheduler.has_unfinished_requests():
            break
        step = scheduler.schedule()
        held -= set(step.free_encoder_hashes)
        encoded = 0
        for rid, indices in step.scheduled_encoder_inputs.items():
            for i in indices:
                feature = scheduler.requests[rid].mm_features[i]
                held.add(feature.content_hash)
                encoded += feature.length
        assert encoded <= config.max_num_encoder_tokens
        assert scheduler.encoder_cache.used <= config.encoder_cache_size
        assert held == set(scheduler.encoder_cache.sizes)
        sampled = {}
        for rid, n in step.num_scheduled_tokens.items():
            request = scheduler.requests[rid]
            start = request.num_computed_tokens - n  # counted at scheduling time
            for feature in request.mm_features:
                if feature.offset < start + n and feature.offset + feature.length > start:
                    assert feature.content_hash in held, (rid, feature, start, n)
            done = request.num_computed_tokens >= request.num_tokens
            sampled[rid] = [5] if done else []
        scheduler.update_from_output(step, ModelRunnerOutput(sampled))
    assert not scheduler.has_unfinished_requests()
    assert not scheduler.encoder_cache.held
