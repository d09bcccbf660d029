"""AsyncLLM with the engine core in its own process (`engine.core_proc`): the same
outputs as with the core in this process, the same guarantees (every request ends with
a final output, aborts free blocks), and what a process adds: a core that fails to start
or dies says so clearly, and no process is left behind."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from pyagent_ref.engine.core_proc import EngineDeadError  # noqa: E402
from pyagent_ref.engine.llm import AsyncLLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams, StructuredOutputsParams  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=128, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = ["def main():\n    print(", "Hello world, this is", "import os\nimport sys\n", "x = 1"]
CASES = [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=5, max_tokens=12, logprobs=3, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=8, top_k=20),
    SamplingParams(temperature=0, max_tokens=20, stop=["("], ignore_eos=True),
    SamplingParams(
        temperature=0.7,
        seed=3,
        max_tokens=20,
        structured_outputs=StructuredOutputsParams(regex="[a-z]{2,6}"),
    ),
]


async def collect(agen):
    return [out async for out in agen]


def summary(deltas) -> list:
    """What a consumer sees of one stream: per completion, its token ids, text, finish
    reason and top logprobs (the per-delta split may differ between the modes)."""
    last = deltas[-1]
    out = []
    for comp in last.outputs:
        parts = [c for d in deltas for c in d.outputs if c.index == comp.index]
        ids = [t for c in parts for t in c.token_ids]
        logprobs = [dict(p) for c in parts if c.logprobs is not None for p in c.logprobs]
        out.append((ids, "".join(c.text for c in parts), comp.finish_reason, logprobs))
    return out


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module's engines (an AsyncLLM stays on its first loop)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engines(tiny_llm_dir, loop):
    """(in-process engine, engine with its core in a process), shut down at the end."""
    here = AsyncLLM(tiny_llm_dir[1], **ENGINE)
    there = AsyncLLM(tiny_llm_dir[1], engine_process=True, **ENGINE)
    yield here, there
    loop.run_until_complete(there.shutdown())
    assert not there.core.process.is_alive()


def assert_idle(engine) -> None:
    core = engine.core
    assert not core.has_unfinished_requests() and not engine.processor.requests
    assert core.kv.pool.num_free_blocks == core.kv.pool.num_blocks - 1


def test_the_same_outputs_with_the_core_in_a_process(engines, loop):
    here, there = engines

    async def run(engine):
        jobs = [engine.generate(p, params) for params in CASES for p in PROMPTS]
        return await asyncio.gather(*(collect(j) for j in jobs))

    expected, got = loop.run_until_complete(run(here)), loop.run_until_complete(run(there))
    for mine, theirs in zip(got, expected, strict=True):
        for (ids, text, finish, logprobs), (ids2, text2, finish2, logprobs2) in zip(
            summary(mine), summary(theirs), strict=True
        ):
            assert (ids, text, finish) == (ids2, text2, finish2)
            # the same entries; values as close as two batch shapes compute them
            assert [list(p) for p in logprobs] == [list(p) for p in logprobs2]
            for p, q in zip(logprobs, logprobs2, strict=True):
                for t in p:
                    assert p[t].logprob == pytest.approx(q[t].logprob, abs=1e-4)
    cases = [params for params in CASES for _ in PROMPTS]
    for params, mine, theirs in zip(cases, got, expected, strict=True):  # the core's times
        for m, m2 in zip(mine[-1].metrics, theirs[-1].metrics, strict=True):
            assert m.ttft > 0 and len(m.itl) == m.num_generated_tokens - 1
            assert len(m2.itl) == m2.num_generated_tokens - 1
            assert (m.e2e is None, m.queued_s is None) == (m2.e2e is None, m2.queued_s is None)
            if params.stop:  # the frontend ends it; a frontend some steps behind the core
                # process has received (and counts) the tokens the core made meanwhile
                assert m.num_generated_tokens >= m2.num_generated_tokens
            else:
                assert m.num_generated_tokens == m2.num_generated_tokens
    assert there.core.stats.steps > 0 and there.core.kv.metrics().queries > 0
    wait_idle(there)


def wait_idle(engine) -> None:
    """The mirror follows the core's messages: wait for the last one."""
    for _ in range(500):
        if engine.core.kv.pool.num_free_blocks == engine.core.kv.pool.num_blocks - 1:
            break
        time.sleep(0.01)
    assert_idle(engine)


def test_abort_cancel_and_an_id_used_again_at_once(engines, loop):
    here, there = engines
    long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    async def main(engine):
        agen = engine.generate(PROMPTS[0], long, request_id="r")
        await agen.__anext__()
        await engine.abort("r")
        aborted = await asyncio.wait_for(collect(agen), 10)
        # the same id at once: none of the aborted request's tokens reach it
        again = await asyncio.wait_for(collect(engine.generate(PROMPTS[1], short, "r")), 10)
        cancelled = engine.generate(PROMPTS[2], long)
        await cancelled.__anext__()
        await cancelled.aclose()  # the consumer leaves: the request is aborted
        return aborted[-1].outputs[0].finish_reason, summary(again)

    expected = loop.run_until_complete(main(here))
    assert loop.run_until_complete(main(there)) == expected
    assert expected[0] == "abort"
    wait_idle(there)


def test_sleep_wake_up_and_errors_cross_the_process(engines, loop):
    _, there = engines

    async def main():
        with pytest.raises(ValueError, match="logit_bias holds token id 1000000"):
            await collect(there.generate("x", SamplingParams(logit_bias={10**6: 1.0})))
        await there.sleep()
        assert there.core.asleep
        with pytest.raises(RuntimeError, match="asleep"):
            await collect(there.generate("x", SamplingParams(max_tokens=2)))
        await there.wake_up()
        out = await collect(there.generate("x", SamplingParams(max_tokens=2, ignore_eos=True)))
        assert out[-1].outputs[0].finish_reason == "length"
        with pytest.raises(ValueError, match="no call 'step'"):
            there.core.call("step")

    loop.run_until_complete(main())


def test_a_core_that_cannot_start_says_why(tiny_llm_dir):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="max_model_len=100000 exceeds the model's context"):
        AsyncLLM(tiny_llm_dir[1], engine_process=True, max_model_len=100000)
    assert set(multiprocessing.active_children()) <= before  # its process is gone


def test_a_dead_core_process_fails_the_requests_in_flight_and_refuses_new_ones(tiny_llm_dir):
    engine = AsyncLLM(tiny_llm_dir[1], engine_process=True, **ENGINE)
    long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)

    async def main():
        gens = [engine.generate(p, long) for p in PROMPTS]
        for g in gens:
            await g.__anext__()
        os.kill(engine.core.process.pid, signal.SIGKILL)
        for g in gens:
            last = (await asyncio.wait_for(collect(g), 10))[-1].outputs[0]
            assert last.finish_reason == "error"
            assert "the engine core process died (exit code -9)" in last.error
        with pytest.raises(EngineDeadError, match="the engine core process died"):
            await collect(engine.generate("x", long))
        await engine.shutdown()

    asyncio.run(main())
    assert not engine.processor.requests
    assert engine.core.process.exitcode == -signal.SIGKILL  # reaped: no zombie
    assert engine.core.process not in multiprocessing.active_children()


def test_shutdown_without_drain_ends_every_stream_and_the_process(tiny_llm_dir):
    engine = AsyncLLM(tiny_llm_dir[1], engine_process=True, **ENGINE)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        gens = [engine.generate(p, long) for p in PROMPTS]
        for g in gens:
            await g.__anext__()
        await asyncio.wait_for(engine.shutdown(drain=False), 30)
        for g in gens:
            ends = await asyncio.wait_for(collect(g), 10)
            assert ends[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(RuntimeError, match="shutting down"):
            await collect(engine.generate("x", long))

    asyncio.run(main())
    assert engine.core.process.exitcode == 0
    assert not os.path.exists(engine.core._dir)  # its sockets' directory is gone


def test_the_core_process_drives_tensor_parallel_ranks(tiny_llm_dir, engines, loop):
    """frontend → core process → two "mp" ranks (the core is not a daemon, so it may
    start them): greedy tokens equal the in-process engine's; shutdown leaves no process."""
    psutil = pytest.importorskip("psutil")
    here, _ = engines
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    async def run(engine):
        jobs = [engine.generate(p, params) for p in PROMPTS]
        return [summary(d)[0][0] for d in await asyncio.gather(*(collect(j) for j in jobs))]

    tp = AsyncLLM(
        tiny_llm_dir[1],
        engine_process=True,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        ops="ref",
        **ENGINE,
    )
    try:
        assert loop.run_until_complete(run(tp)) == loop.run_until_complete(run(here))
        ranks = psutil.Process(tp.core.process.pid).children()
        assert len(ranks) == 2  # the "mp" ranks, children of the core process
    finally:
        loop.run_until_complete(tp.shutdown())
    assert not tp.core.process.is_alive()
    psutil.wait_procs(ranks, timeout=30)
    assert not any(r.is_running() for r in ranks)
