"""The kv_offload engine option: prefix blocks the device cache evicts are kept in host
memory (and on disk) and brought back on a later hit, without changing a token."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pyagent_ref.engine.core import EngineConfig, EngineCore, KVOffloadConfig  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.worker.helpers import tiny_model  # noqa: E402

# 4 prefixes of 5 blocks of 4 tokens: 20 blocks, more than the 15 the device cache has
PREFIXES = [[(7 * p + i) % 50 for i in range(20)] for p in range(4)]


def workload(rounds=3):
    """Requests cycling through the prefixes, each with its own suffix (greedy)."""
    out = []
    for i in range(rounds * len(PREFIXES)):
        prompt = PREFIXES[i % len(PREFIXES)] + [i % 50, (3 * i) % 50, 11]
        params = SamplingParams(temperature=0, max_tokens=4)
        out.append(Request(str(i), prompt, sampling_params=params, max_tokens=4))
    return out


def engine(model, **overrides):
    config = dict(
        block_size=4, num_kv_blocks=16, max_num_batched_tokens=32, max_num_seqs=2, ops="ref"
    )
    return EngineCore(model, EngineConfig(**(config | overrides)))


def run(core):
    requests = workload()
    for r in requests:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in requests]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def without_offload(model):
    core = engine(model)
    return run(core), core.kv.metrics()


def test_offload_raises_the_hit_rate_and_changes_no_token(model, without_offload):
    tokens, before = without_offload
    core = engine(model, kv_offload=KVOffloadConfig(cpu_blocks=64))
    assert run(core) == tokens
    after = core.kv.metrics()
    assert before.hit_rate < 0.1  # the cycle evicts every prefix before its next use
    assert after.hit_rate > 0.5 and after.onboarded_blocks > 0
    assert core.kv.offloader.tiers.misses == 0


def test_disk_tier_and_corrupted_files(model, without_offload, tmp_path):
    tokens, _ = without_offload
    offload = {"cpu_blocks": 2, "disk_dir": str(tmp_path), "disk_blocks": 64}
    core = engine(model, kv_offload=offload)
    assert isinstance(core.config.kv_offload, KVOffloadConfig)
    assert run(core) == tokens
    assert core.kv.metrics().onboarded_blocks > 0
    files = list(tmp_path.glob("*.safetensors"))
    assert files
    for f in files:  # a corrupted copy is a miss: the block is recomputed
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    assert run(core) == tokens
    assert core.kv.offloader.tiers.misses > 0


def test_hybrid_model_offloads_each_group(without_offload):
    model = tiny_model(
        num_hidden_layers=4,
        sliding_window=6,
        layer_types=("sliding_attention", "full_attention") * 2,
    )
    memory = dict(num_kv_blocks=None, kv_cache_memory_bytes=24 * 1024)  # 24 blocks
    want = run(engine(model, **memory))
    core = engine(model, **memory, kv_offload={"cpu_blocks": 64})
    assert len(core.kv.config.groups) == 2 and core.kv.config.num_blocks == 24
    assert run(core) == want
    assert core.kv.metrics().onboarded_blocks > 0


def test_reset_prefix_cache_forgets_offloaded_blocks(model):
    core = engine(model, kv_offload=KVOffloadConfig(cpu_blocks=64))
    first = workload()[0]
    for r in [first, *workload()[1:]]:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    # the cycle evicted the first prefix's head from the device: the tiers hold it
    content = core.kv.hasher.content(first, 0)
    assert core.kv.pool.get_cached_block(first.block_hashes[0], content) is None
    assert core.kv.offloader.lookup(0, content) is not None
    assert core.kv.reset_prefix_cache()
    assert core.kv.offloader.lookup(0, content) is None


@pytest.mark.parametrize(
    ("kv_offload", "error", "message"),
    [
        ({"cpu_blocks": 0}, ValueError, "kv_offload.cpu_blocks must be >= 1, got 0"),
        ({"cpu_blocks": True}, TypeError, "kv_offload.cpu_blocks must be an int, got True"),
        ({"cpu_blocks": 8, "disk_dir": "/tmp/kv"}, ValueError, "disk_blocks must be >= 1 with"),
        ({"cpu_blocks": 8, "disk_blocks": 4}, ValueError, "and 0 without one, got disk_blocks=4"),
        ({"cpu_blocks": 8, "disk_dir": 3, "disk_blocks": 4}, TypeError, "disk_dir must be None"),
        ({"cpu_blocks": 8, "gpu_blocks": 4}, ValueError, r"unknown keys \['gpu_blocks'\]"),
        ({"disk_blocks": 4}, ValueError, "kv_offload needs cpu_blocks"),
        ("cpu:8", TypeError, "kv_offload must be None, a KVOffloadConfig or a dict"),
    ],
)
def test_bad_kv_offload_is_named(kv_offload, error, message):
    with pytest.raises(error, match=message):
        EngineConfig(kv_offload=kv_offload)


def test_offload_needs_prefix_caching():
    with pytest.raises(ValueError, match="kv_offload needs enable_prefix_caching=True"):
        EngineConfig(kv_offload={"cpu_blocks": 8}, enable_prefix_caching=False)
