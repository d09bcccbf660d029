"""Disaggregated prefill/decode with two engine processes on loopback: outputs equal a
colocated engine's, the decode side's prefix cache is filled by the transferred blocks,
and a decode instance killed while a request is in flight ends every request (completed
or error) in bounded time, leaving no blocks held and no process running."""

from __future__ import annotations

import glob
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from pyagent_ref.disagg.proxy import DisaggProxy, check_layouts  # noqa: E402
from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=64, max_num_seqs=4)
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
PROMPTS = [list(range(1, 23)), [9, 8, 7, 6, 5, 4, 3, 2, 1], list(range(30, 47))]


def test_pd_equals_colocated_then_survives_a_killed_decode(tiny_llm_dir):
    colocated = LLM(tiny_llm_dir[1], **ENGINE).generate(PROMPTS, GREEDY)
    proxy = DisaggProxy(tiny_llm_dir[1], "zmq", transfer_timeout_s=2.0, timeout_s=30, **ENGINE)
    processes = [h.process for h in proxy.instances]
    try:
        for prompt, want in zip(PROMPTS, colocated, strict=True):
            out = proxy.generate(prompt, GREEDY)
            assert out.finish_reason == "length", out.error
            assert out.token_ids == want.outputs[0].token_ids
            assert out.transferred_blocks == len(prompt) // ENGINE["block_size"]
        # concurrently, through the same instances (prefix hits on the decode side now)
        with ThreadPoolExecutor(3) as pool:
            outs = list(pool.map(lambda p: proxy.generate(p, GREEDY), PROMPTS))
        assert [o.token_ids for o in outs] == [w.outputs[0].token_ids for w in colocated]
        # one step per prompt alone; the prompts that arrived together shared steps
        assert proxy.stats("prefill").steps <= len(PROMPTS) + 2
        decode = proxy.stats("decode")
        # every transferred block came into the decode side's cache instead of computed
        assert decode.onboarded_blocks == sum(len(p) // 4 for p in PROMPTS)
        # it computed the prompts' partial blocks and the 4 tokens fed back of the 5 made
        assert decode.scheduled_tokens == 2 * sum(len(p) % 4 + 4 for p in PROMPTS)
        assert decode.num_free_blocks == decode.num_blocks - 1  # none held after the end

        # kill the decode instance during a transfer: frozen first, it cannot acknowledge
        # the blocks the prefill instance sends (which waits up to 2 s), then killed
        results = []
        decode_pid = proxy.decode.process.pid
        os.kill(decode_pid, signal.SIGSTOP)
        worker = threading.Thread(
            target=lambda: results.append(proxy.generate(list(range(50, 90)), GREEDY))
        )
        worker.start()
        time.sleep(1.0)
        os.kill(decode_pid, signal.SIGKILL)
        worker.join(60)
        assert not worker.is_alive(), "the request hung"
        assert results[0].finish_reason == "error" and results[0].error  # it cannot complete
        after = proxy.generate([1, 2, 3, 4, 5], GREEDY)  # no decode side: an error, promptly
        assert after.finish_reason == "error" and after.error
        prefill = proxy.stats("prefill")
        assert prefill.num_free_blocks == prefill.num_blocks - 1  # no leaked blocks
    finally:
        proxy.close()
    assert not any(p.is_alive() for p in processes)
    assert not glob.glob("/dev/shm/pyagent-kv-*")


def test_mismatched_instances_are_refused_at_start_naming_the_value(tiny_llm_dir):
    with pytest.raises(ValueError, match="block_size is 4 on the prefill side and 8"):
        DisaggProxy(tiny_llm_dir[1], prefill_args={"block_size": 4}, decode_args={"block_size": 8})
    with pytest.raises(ValueError, match="dtype"):
        check_layouts({"dtype": "float32"}, {"dtype": "bfloat16"})
    with pytest.raises(ValueError, match="connector"):
        DisaggProxy(tiny_llm_dir[1], "rdma")
