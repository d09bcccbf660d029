"""The engine on several ranks: the "mp" executor with tensor_parallel_size=2 and with
pipeline_parallel_size=2 draws the same tokens as one process (greedy and seeded
sampling); a worker killed mid-request ends every request (finished or "error" naming
the dead rank), with no hang and no process left; bad sizes and devices are refused at
start, naming the value."""

from __future__ import annotations

import os
import signal

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request, RequestStatus  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402
from tests.worker.helpers import PROMPTS  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=8, ops="ref")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Llama whose one KV head is shared by 4 query heads: with TP=2 both ranks
    keep a copy of it."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **(TINY_LLAMA | {"num_key_value_heads": 1}),
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    path = tmp_path_factory.mktemp("tiny-llama-kv1")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    return path


def workload(n=8):
    """Greedy and seeded sampled requests side by side."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        temperature = 0.8 if i % 2 else 0.0
        params = SamplingParams(temperature=temperature, seed=100 + i, max_tokens=n)
        out.append(Request(str(i), prompt, sampling_params=params, seed=100 + i, max_tokens=n))
    return out


def run(core, requests, max_steps=200):
    for r in requests:
        core.add_request(r)
    for _ in range(max_steps):
        if not core.has_unfinished_requests():
            break
        core.step()
    assert not core.has_unfinished_requests()
    return [r.output_token_ids for r in requests]


@pytest.fixture(scope="module")
def one_process(model_dir):
    return run(EngineCore.from_config(EngineConfig(model=str(model_dir), **ENGINE)), workload())


@pytest.fixture(scope="module")
def tp_engine(model_dir):
    """An engine on two tensor-parallel ranks, shared by the tests below (the last one
    kills a worker)."""
    core = EngineCore.from_config(
        EngineConfig(model=str(model_dir), **ENGINE, tensor_parallel_size=2)
    )
    yield core
    core.shutdown()
    assert not any(p.is_alive() for p in core.executor.procs)


def test_tensor_parallel_ranks_draw_the_tokens_of_one_process(tp_engine, one_process):
    assert tp_engine.executor.backend == "mp" and tp_engine.runner is None
    assert run(tp_engine, workload()) == one_process


def test_pipeline_stages_draw_the_tokens_of_one_process(model_dir, one_process):
    core = EngineCore.from_config(
        EngineConfig(model=str(model_dir), **ENGINE, pipeline_parallel_size=2)
    )
    try:
        assert run(core, workload()) == one_process
    finally:
        core.shutdown()
    assert not any(p.is_alive() for p in core.executor.procs)


def test_a_killed_worker_ends_every_request(tp_engine):
    core = tp_engine
    requests = workload(n=40)
    for r in requests:
        core.add_request(r)
    core.step()
    os.kill(core.executor.pids[1], signal.SIGKILL)
    for _ in range(50):  # bounded: every step after the death fails its requests at once
        if not core.has_unfinished_requests():
            break
        core.step()
    assert not core.has_unfinished_requests()
    assert all(r.status == RequestStatus.FINISHED_ERROR for r in requests)
    assert all("worker rank 1" in r.error and "died" in r.error for r in requests)
    assert not any(p.is_alive() for p in core.executor.procs)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(tensor_parallel_size=3),
            "tensor_parallel_size=3 does not divide num_attention_heads=4",
        ),
        (dict(pipeline_parallel_size=3), "pipeline_parallel_size=3 exceeds the 2 decoder layers"),
        (dict(tensor_parallel_size=2, device="cuda"), "2 ranks, but this machine has 0 CUDA"),
        (dict(tensor_parallel_size=2, compile=True), "compile=True"),
    ],
)
def test_refused_at_start_naming_the_value(model_dir, overrides, message):
    if overrides.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices")
    with pytest.raises(ValueError, match=message):
        EngineCore.from_config(EngineConfig(model=str(model_dir), **ENGINE, **overrides))


def test_mp_from_a_daemon_process_is_refused(model_dir, monkeypatch):
    import multiprocessing
    from types import SimpleNamespace

    monkeypatch.setattr(multiprocessing, "current_process", lambda: SimpleNamespace(daemon=True))
    with pytest.raises(ValueError, match="a daemon process"):
        EngineCore.from_config(EngineConfig(model=str(model_dir), **ENGINE, tensor_parallel_size=2))


def test_more_ranks_than_cpu_cores_is_refused(model_dir, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    with pytest.raises(ValueError, match="2 ranks, but this machine has 1 CPU cores"):
        EngineCore.from_config(EngineConfig(model=str(model_dir), **ENGINE, tensor_parallel_size=2))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "runs one rank"),
        (dict(distributed_executor_backend="spark"), "distributed_executor_backend must be"),
        (dict(ray_address="127.0.0.1:1"), "needs distributed_executor_backend='ray'"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be an int >= 1, got 0"),
    ],
)
def test_config_refuses_inconsistent_fields(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
def test_nccl_tensor_parallel_ranks_draw_the_tokens_of_one_process(model_dir):
    cuda = dict(ENGINE, device="cuda", ops="auto")
    want = run(EngineCore.from_config(EngineConfig(model=str(model_dir), **cuda)), workload())
    core = EngineCore.from_config(
        EngineConfig(model=str(model_dir), **cuda, tensor_parallel_size=2)
    )
    try:
        assert run(core, workload()) == want
    finally:
        core.shutdown()


def test_a_rank_that_fails_to_start_is_named_with_its_error(model_dir, tmp_path):
    """The engine reads config.json alone; the ranks find the weights truncated."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(RuntimeError, match="worker rank . raised ValueError: .*not a readable"):
        EngineCore.from_config(EngineConfig(model=str(broken), **ENGINE, tensor_parallel_size=2))
