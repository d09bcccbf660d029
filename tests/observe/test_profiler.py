"""The profiler switch on an offline engine: a Chrome trace of the model's ops between
start_profile and stop_profile, and its errors. (The server's endpoints, with the core
in its own process: tests/server/test_operating.py.)"""

from __future__ import annotations

import json
import os

import pytest

from pyagent_ref.engine.llm import LLM
from pyagent_ref.observe.profiler import Profiler
from pyagent_ref.sample.params import SamplingParams


def aten_ops(path: str) -> set[str]:
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return {e["name"] for e in events if e.get("name", "").startswith("aten::")}


def test_a_trace_of_what_the_engine_ran_between_start_and_stop(tmp_path):
    llm = LLM(num_kv_blocks=64, max_num_seqs=4, profiler_dir=str(tmp_path / "traces"))
    with pytest.raises(RuntimeError, match="the profiler is not running"):
        llm.stop_profile()
    llm.start_profile()
    with pytest.raises(RuntimeError, match="the profiler is already running"):
        llm.start_profile()
    llm.generate("def main():", SamplingParams(max_tokens=4, ignore_eos=True))
    path = llm.stop_profile()
    assert os.path.dirname(path) == str(tmp_path / "traces") and path.endswith(".json")
    ops = aten_ops(path)
    assert "aten::mm" in ops or "aten::matmul" in ops or "aten::linear" in ops, sorted(ops)[:20]
    llm.start_profile()  # a second run, idle: a second file with none of the model's ops
    second = llm.stop_profile()
    assert second != path and not aten_ops(second) & {"aten::mm", "aten::linear"}


def test_profiling_needs_a_directory():
    llm = LLM(num_kv_blocks=64, max_num_seqs=4)
    with pytest.raises(RuntimeError, match=r"profiling is not enabled: set profiler_dir"):
        llm.start_profile()
    with pytest.raises(RuntimeError, match="the profiler is not running"):
        Profiler("/nonexistent").stop()


def test_async_llm_steps_in_worker_threads_and_they_are_recorded(tmp_path):
    """AsyncLLM (in this process) steps in asyncio.to_thread's workers, not the thread
    that started the profiler: every thread is recorded."""
    import asyncio

    from pyagent_ref.engine.llm import AsyncLLM

    async def main() -> str:
        llm = AsyncLLM(num_kv_blocks=64, max_num_seqs=4, profiler_dir=str(tmp_path))
        await llm.start_profile()
        async for _ in llm.generate("x", SamplingParams(max_tokens=3, ignore_eos=True)):
            pass
        path = await llm.stop_profile()
        await llm.shutdown()
        return path

    assert "aten::embedding" in aten_ops(asyncio.run(main()))


@pytest.mark.cuda
def test_on_cuda_the_trace_has_the_kernels(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    llm = LLM(num_kv_blocks=64, max_num_seqs=4, device="cuda", profiler_dir=str(tmp_path))
    llm.start_profile()
    llm.generate("def main():", SamplingParams(max_tokens=4, ignore_eos=True))
    with open(llm.stop_profile()) as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)  # CUDA activity, not only CPU
