"""DPAsyncLLM: two replicas behind the router. Requests sharing a prefix meet on the
replica that caches it (found from its KV events), outputs equal one engine's, and
shutting down leaves no process or socket behind."""

from __future__ import annotations

import asyncio
import multiprocessing

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from pyagent_ref.dp.engine import DPAsyncLLM  # noqa: E402
from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=96, max_num_batched_tokens=64, max_num_seqs=8)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
SHARED = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]  # three full blocks


async def tokens(dp: DPAsyncLLM, prompt) -> list[int]:
    out = []
    async for delta in dp.generate(prompt, GREEDY):
        out += delta.outputs[0].token_ids
    return out


def test_shared_prefixes_meet_on_one_replica_with_a_colocated_engines_outputs(tiny_llm_dir):
    prompts = [SHARED + [20 + i] for i in range(4)] + [[40 + i] * 9 for i in range(2)]
    want = [
        o.outputs[0].token_ids for o in LLM(tiny_llm_dir[1], **ENGINE).generate(prompts, GREEDY)
    ]

    async def main():
        dp = DPAsyncLLM(tiny_llm_dir[1], 2, policy="prefix", engine_process=False, **ENGINE)
        try:
            got = [await tokens(dp, prompts[0])]
            await asyncio.sleep(0.1)
            dp.refresh()  # the first request's blocks are now known from its events
            first = dp.routed.index(1)
            assert dp.router.index.matched_blocks(first, dp.block_hashes(SHARED)) == 3
            got += await asyncio.gather(*(tokens(dp, p) for p in prompts[1:4]))
            assert dp.routed[first] == 4  # every request of the shared prefix went there
            got += [await tokens(dp, p) for p in prompts[4:]]
            return got
        finally:
            await dp.shutdown()

    assert asyncio.run(main()) == want


def test_round_robin_alternates_and_two_processes_end_cleanly(tiny_llm_dir):
    async def main():
        dp = DPAsyncLLM(tiny_llm_dir[1], 2, policy="round_robin", **ENGINE)
        try:
            outs = await asyncio.gather(*(tokens(dp, SHARED + [i]) for i in range(4)))
            assert dp.routed == [2, 2]
            assert all(len(o) == 4 for o in outs)
            return [r.core.process for r in dp.replicas]
        finally:
            await dp.shutdown()

    processes = asyncio.run(main())
    assert all(not p.is_alive() for p in processes)
    assert not [p for p in multiprocessing.active_children() if p.name == "pyagent-engine-core"]


def test_bad_arguments_fail_before_any_replica_starts(tiny_llm_dir):
    with pytest.raises(ValueError, match="num_replicas"):
        DPAsyncLLM(tiny_llm_dir[1], 0)
    with pytest.raises(ValueError, match="kv_events_endpoint"):
        DPAsyncLLM(tiny_llm_dir[1], 2, kv_events_endpoint="ipc:///tmp/x")
    with pytest.raises(ValueError, match="block_size"):
        DPAsyncLLM(tiny_llm_dir[1], 2, block_size=0)
