"""The engine's guarantees (docs: "Guarantees"): it never hangs, and one bad request never
fails another. Each test names the guarantee it checks; the first group replays what a
user hit before these guarantees existed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import warnings

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pyagent_ref.engine import output_processor  # noqa: E402
from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.engine.llm import LLM, AsyncLLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request, RequestStatus  # noqa: E402
from tests.worker.helpers import tiny_model  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=128, max_num_batched_tokens=32, max_num_seqs=8)
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = ["def main():\n    print(", "Hello world, this is", "import os\nimport sys\n", "x = 1"]


@pytest.fixture(scope="module")
def llm(tiny_llm_dir):
    return LLM(tiny_llm_dir[1], **ENGINE)


def assert_idle(engine) -> None:
    """Nothing queued, nothing tracked, every KV block free."""
    core = engine.core
    assert not core.has_unfinished_requests()
    assert not engine.processor.requests
    assert core.kv.pool.num_free_blocks == core.kv.pool.num_blocks - 1
    assert not getattr(engine, "_done", {})


def texts(outputs) -> list[tuple[list[int], str]]:
    return [(o.outputs[0].token_ids, o.outputs[0].text) for o in outputs]


# --- admission: rejected before anything is queued ---------------------------------------


def test_a_request_that_cannot_fit_the_cache_is_rejected_not_hung(tiny_llm_dir, caplog):
    with caplog.at_level(logging.WARNING, "pyagent_ref.engine.core"):
        small = LLM(tiny_llm_dir[1], num_kv_blocks=12, block_size=4)
    assert small.core.max_model_len == 44  # 11 usable blocks of 4 tokens
    assert "max_model_len lowered from 256 to 44" in caplog.text
    with pytest.raises(ValueError, match=r"max_tokens=60 is too large: the prompt has \d+ tokens"):
        small.generate(
            ["def f(x):\n    return x\n" * 3],
            SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
        )
    out = small.generate("def f(x):", SamplingParams(max_tokens=None, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length"  # max_tokens=None takes the rest
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 44
    assert_idle(small)


def test_engine_limits_set_by_the_user_are_checked_against_cache_and_budget(tiny_llm_dir):
    path = tiny_llm_dir[1]
    with pytest.raises(ValueError, match="max_model_len=100 exceeds the 44 tokens the KV cache"):
        LLM(path, num_kv_blocks=12, block_size=4, max_model_len=100)
    with pytest.raises(ValueError, match="max_model_len=100000 exceeds the model's context"):
        LLM(path, max_model_len=100000)
    with pytest.raises(ValueError, match="max_num_batched_tokens allows without chunked"):
        LLM(path, max_model_len=64, max_num_batched_tokens=16, enable_chunked_prefill=False)
    lowered = LLM(path, max_num_batched_tokens=4, enable_chunked_prefill=False)
    assert lowered.core.max_model_len == 4
    with pytest.raises(ValueError, match="leaves no room to generate in max_model_len=4"):
        lowered.generate("def foo(bar):")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(max_num_seqs="8"), TypeError, "max_num_seqs must be an int >= 1, got '8'"),
        (dict(max_num_seqs=0), ValueError, "max_num_seqs must be an int >= 1, got 0"),
        (dict(block_size=True), TypeError, "block_size must be an int"),
        (dict(dtype="fp8"), ValueError, "dtype must be one of"),
        (dict(enable_chunked_prefill="yes"), TypeError, "enable_chunked_prefill must be a bool"),
        (dict(ops="fast"), ValueError, "ops must be 'ref', 'accel' or 'auto'"),
    ],
)
def test_bad_engine_arguments_name_the_field(tiny_llm_dir, kwargs, error, match):
    with pytest.raises(error, match=match):
        LLM(tiny_llm_dir[1], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(stop=5), TypeError, "stop must be None, a str or a list of str, got 5"),
        (dict(stop_token_ids=5), TypeError, "stop_token_ids must be None or a list"),
        (dict(logit_bias=[1, 2]), TypeError, "logit_bias must be None or a dict"),
        (dict(temperature=float("nan")), ValueError, "temperature must be a number"),
        (dict(temperature=1e300), ValueError, "temperature must be a number"),
        (dict(top_p=1e-300), ValueError, "top_p must be in"),
        (dict(repetition_penalty=1e300), ValueError, "repetition_penalty"),
        (dict(ignore_eos="no"), TypeError, "ignore_eos must be a bool"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_take_the_forms_vllm_takes():
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        (None, TypeError, "prompts must be a prompt or a list of prompts, got NoneType"),
        (5, TypeError, "got int: 5"),
        ({"text": "x"}, ValueError, "a dict prompt must have exactly one of"),
        ([5.7, 3.2], TypeError, "prompt must be a str, a sequence of int token ids"),
        ("\ud800", ValueError, "prompt is not valid Unicode: surrogates not allowed at index 0"),
        (b"def f(", TypeError, "got bytes"),
        ([True, False], TypeError, "got bool: True"),
        ([[]], ValueError, "prompt must not be empty"),
        ("", ValueError, "encodes to no tokens"),
        ([3, -1], ValueError, "prompt holds token id -1, outside the model's vocabulary"),
        ([10**6], ValueError, "prompt holds token id 1000000"),
        ([5] * 2000, ValueError, "the prompt has 2000 tokens, which leaves no room"),
    ],
)
def test_bad_prompts_are_rejected_with_their_reason(llm, prompt, error, match):
    with pytest.raises(error, match=match):
        llm.generate(prompt, SamplingParams(max_tokens=2))
    assert_idle(llm)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (SamplingParams(logit_bias={10**6: 1.0}), "logit_bias holds token id 1000000"),
        (SamplingParams(stop_token_ids=[10**6]), "stop_token_ids holds token id 1000000"),
        (SamplingParams(logprobs=10**6), "logprobs must be <= max_logprobs=20"),
        (SamplingParams(max_tokens=10**9), "max_tokens=1000000000 is too large"),
        (SamplingParams(n=10**6), "n must be <= 128"),
    ],
)
def test_params_the_model_cannot_serve_are_rejected_at_admission(llm, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate("def f(", params)
    assert_idle(llm)


def test_no_prompts_no_outputs(llm):
    assert llm.generate([]) == []


def test_the_prompt_forms(llm):
    import numpy as np

    by_text = llm.generate({"prompt": PROMPTS[0]}, GREEDY)[0]
    ids = by_text.prompt_token_ids
    for prompt in (
        {"prompt_token_ids": ids},
        ids,
        tuple(ids),
        np.array(ids),
        torch.tensor(ids),
        [np.int32(t) for t in ids],
    ):
        out = llm.generate(prompt, GREEDY)[0]
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == by_text.outputs[0].token_ids


def test_admission_of_a_batch_is_all_or_nothing(llm):
    for _ in range(5):
        with pytest.raises(ValueError, match="prompt has 2000 tokens"):
            llm.generate(["def a(", [5] * 2000])
    assert_idle(llm)  # the good first prompt was not queued either
    out = llm.generate("def a(", GREEDY)[0]
    assert len(out.outputs[0].token_ids) == 10


def test_asleep_or_shut_down_engines_reject_without_leaking(tiny_llm_dir):
    engine = LLM(tiny_llm_dir[1], **ENGINE)
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(PROMPTS)
    assert_idle(engine)
    engine.wake_up()
    assert engine.generate(PROMPTS[0], GREEDY)[0].finished
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.generate(PROMPTS)
    assert_idle(engine)


# --- isolation: a failing request fails alone -------------------------------------------


def test_a_sampler_failure_fails_only_its_request(llm, monkeypatch):
    """Fault injection: sampling raises for one request from its 4th token on."""
    expected = texts(llm.generate(PROMPTS, GREEDY))
    bad_prompt = llm.tokenizer.encode("a bad one")
    real = llm.core.runner.sampler

    def faulty(logits, rows):
        if any(list(r.prompt_token_ids) == bad_prompt and r.position >= 3 for r in rows):
            raise RuntimeError("injected sampler fault")
        return real(logits, rows)

    monkeypatch.setattr(llm.core.runner, "sampler", faulty)
    outs = llm.generate(PROMPTS[:2] + [bad_prompt] + PROMPTS[2:], GREEDY)
    bad = outs.pop(2).outputs[0]
    assert bad.finish_reason == "error" and "injected sampler fault" in bad.error
    assert len(bad.token_ids) == 3
    assert texts(outs) == expected  # the others as if the bad one had never been there
    assert_idle(llm)


def test_a_lone_failing_request_reports_its_error(llm, monkeypatch, caplog):
    def failing(logits, rows):
        raise RuntimeError("injected sampler fault")

    monkeypatch.setattr(llm.core.runner, "sampler", failing)
    with caplog.at_level(logging.WARNING):
        out = llm.generate("def f(", GREEDY)[0].outputs[0]
    assert out.finish_reason == "error" and "injected sampler fault" in out.error
    assert not caplog.records  # reported by the core, not found orphaned
    assert_idle(llm)


def test_a_detokenizer_failure_fails_only_its_request(llm, monkeypatch):
    expected = texts(llm.generate(PROMPTS, GREEDY))
    bad_prompt = llm.tokenizer.encode("a bad one")

    class Faulty(output_processor.IncrementalDetokenizer):
        def __init__(self, *args, prompt_ids=(), **kwargs):
            super().__init__(*args, prompt_ids=prompt_ids, **kwargs)
            self.bad, self.calls = list(prompt_ids) == bad_prompt, 0

        def add_tokens(self, ids):
            self.calls += 1
            if self.bad and self.calls > 2:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
            return super().add_tokens(ids)

    monkeypatch.setattr(output_processor, "IncrementalDetokenizer", Faulty)
    outs = llm.generate(PROMPTS[:1] + [bad_prompt] + PROMPTS[1:], GREEDY)
    bad = outs.pop(1).outputs[0]
    assert bad.finish_reason == "error" and "UnicodeDecodeError" in bad.error
    assert texts(outs) == expected
    assert_idle(llm)


def test_a_failing_forward_fails_its_step_and_the_engine_goes_on(llm, monkeypatch, caplog):
    expected = texts(llm.generate(PROMPTS, GREEDY))
    real, calls = llm.core.runner.forward, []

    def once(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected forward fault")
        return real(*args)

    monkeypatch.setattr(llm.core.runner, "forward", once)
    with caplog.at_level(logging.ERROR, "pyagent_ref.engine.core"):
        outs = llm.generate(PROMPTS, GREEDY)
    reasons = [o.outputs[0].finish_reason for o in outs]
    assert "error" in reasons and "forward pass of a step failed" in caplog.text
    for out, want in zip(outs, expected, strict=True):
        comp = out.outputs[0]
        if comp.finish_reason == "error":
            assert "injected forward fault" in comp.error
        else:
            assert (comp.token_ids, comp.text) == want
    assert_idle(llm)
    assert texts(llm.generate(PROMPTS, GREEDY)) == expected  # usable afterwards


@pytest.mark.parametrize("where", ["forward", "processor"])
def test_keyboard_interrupt_leaves_the_engine_usable(llm, monkeypatch, where):
    expected = texts(llm.generate(PROMPTS, GREEDY))
    target, name = (
        (llm.core.runner, "forward") if where == "forward" else (llm.processor, "process")
    )
    real, calls = getattr(target, name), []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(target, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY)
    assert_idle(llm)
    assert texts(llm.generate(PROMPTS, GREEDY)) == expected


# --- a failed step leaves no unwritten KV in the prefix cache ----------------------------

# 5 full blocks of 4 tokens and one more; FILLER alone takes every block of a 12-block cache
FAILING_PROMPT = [(7 * i + 3) % 50 for i in range(21)]
FILLER = [(11 * i + 5) % 50 for i in range(40)]
HYBRID = dict(
    num_hidden_layers=4, sliding_window=5, layer_types=("sliding_attention", "full_attention") * 2
)
KV_KINDS = {  # (tiny model fields, engine options)
    "full": ({}, dict(num_kv_blocks=32)),
    "hybrid": (HYBRID, dict(num_kv_blocks=32)),  # sliding-window and full-attention groups
    # FILLER evicts the failed blocks: the CPU tier must get only KV that was written
    "offload": ({}, dict(num_kv_blocks=12, kv_offload={"cpu_blocks": 64})),
}
REQUEST_IDS = itertools.count()


def kv_engine(kind: str, budget: int):
    """(EngineCore on a tiny model with blocks of 4 tokens, a function running prompts
    to their end and returning their requests)."""
    fields, options = KV_KINDS[kind]
    config = EngineConfig(
        block_size=4, max_num_batched_tokens=budget, ops="ref", graph_mode="eager", **options
    )
    core = EngineCore(tiny_model(**fields), config)
    for keys, values in core.runner.kv_caches:  # memory not written yet holds anything
        keys.normal_(std=10)
        values.normal_(std=10)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def run(*prompts: list[int]) -> list[Request]:
        requests = [
            Request(str(next(REQUEST_IDS)), p, sampling_params=params, max_tokens=4)
            for p in prompts
        ]
        for r in requests:
            core.add_request(r)
        while core.has_unfinished_requests():
            core.step()
        return requests

    return core, run


def fail_forward_call(core, monkeypatch, n: int) -> None:
    """Make the n-th forward pass of `core` from now on raise."""
    real, calls = core.runner.forward, []

    def faulty(*args):
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError("injected forward fault")
        return real(*args)

    monkeypatch.setattr(core.runner, "forward", faulty)


@pytest.mark.parametrize("kind", sorted(KV_KINDS))
def test_a_failed_step_uncaches_the_blocks_it_did_not_write(kind, monkeypatch):
    """Blocks enter the prefix cache when allocated, before the forward writes them: when
    the forward fails, the blocks of that step's tokens leave the cache (never a hit,
    never offloaded), while the blocks of earlier, successful steps stay hits."""
    _, run_fresh = kv_engine(kind, budget=8)
    (want,) = run_fresh(FAILING_PROMPT)
    core, run = kv_engine(kind, budget=8)
    fail_forward_call(core, monkeypatch, 2)  # the second prefill chunk: tokens 8 to 15
    (failed,) = run(FAILING_PROMPT)
    assert failed.status == RequestStatus.FINISHED_ERROR
    if kind == "offload":
        run(FILLER)
    hits = core.kv.metrics().hits
    (again,) = run(FAILING_PROMPT)
    metrics = core.kv.metrics()
    assert metrics.hits - hits == 8  # blocks 0 and 1, written by the first chunk
    assert metrics.onboarded_blocks == (2 if kind == "offload" else 0)  # from the CPU tier
    assert again.output_token_ids == want.output_token_ids


@pytest.mark.parametrize("kind", sorted(KV_KINDS))
def test_requests_sharing_blocks_cached_in_their_failed_step_leave_none_cached(kind, monkeypatch):
    """The second request hits the blocks the first one cached in the same step; both
    fail with the step, and a later request with their prompt hits nothing."""
    _, run_fresh = kv_engine(kind, budget=32)
    (want,) = run_fresh(FAILING_PROMPT)
    core, run = kv_engine(kind, budget=32)
    fail_forward_call(core, monkeypatch, 1)
    first, second = run(FAILING_PROMPT, FAILING_PROMPT)
    assert first.status == second.status == RequestStatus.FINISHED_ERROR
    assert core.kv.metrics().hits == 20  # the second one hit the first one's 5 blocks
    if kind == "offload":
        run(FILLER)
    (again,) = run(FAILING_PROMPT)
    assert core.kv.metrics().hits == 20
    assert again.output_token_ids == want.output_token_ids


def test_abort_from_another_thread_ends_that_request_only(llm, monkeypatch):
    import threading

    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = texts(llm.generate(PROMPTS, long))
    real_step, steps = llm.core.step, []

    def step():
        steps.append(1)
        if len(steps) == 3:  # abort the first prompt's request from another thread
            victim = next(
                rid for rid, p in llm.processor.requests.items() if p.prompt == PROMPTS[0]
            )
            thread = threading.Thread(target=llm.abort, args=(victim,))
            thread.start()
        return real_step()

    monkeypatch.setattr(llm.core, "step", step)
    outs = llm.generate(PROMPTS, long)
    assert outs[0].outputs[0].finish_reason == "abort"
    assert 0 < len(outs[0].outputs[0].token_ids) < 40
    assert texts(outs[1:]) == expected[1:]
    assert_idle(llm)


# --- AsyncLLM: every stream ends with a final output ------------------------------------


async def collect(agen):
    return [out async for out in agen]


def test_async_bad_request_fails_alone_and_abort_and_shutdown_end_streams(tiny_llm_dir):
    engine = AsyncLLM(tiny_llm_dir[1], **ENGINE)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        good = [asyncio.create_task(collect(engine.generate(p, GREEDY))) for p in PROMPTS]
        bad = asyncio.create_task(
            collect(engine.generate("def g(", SamplingParams(logit_bias={10**6: 1.0})))
        )
        with pytest.raises(ValueError, match="logit_bias holds token id 1000000"):
            await bad
        streams = await asyncio.gather(*good)
        assert all(s[-1].finished and s[-1].outputs[0].finish_reason == "length" for s in streams)
        # abort by id: the stream ends with a final output
        agen = engine.generate("def h(", long, request_id="h")
        await agen.__anext__()
        await engine.abort("h")
        rest = await asyncio.wait_for(collect(agen), 10)
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        # the core shut down behind the frontend's back: streams still end
        gens = [engine.generate(f"x{i}", long) for i in range(3)]
        for g in gens:
            await g.__anext__()
        engine.core.shutdown(drain=False)
        for g in gens:
            ends = await asyncio.wait_for(collect(g), 10)
            assert ends[-1].finished and ends[-1].outputs[0].finish_reason == "abort"

    asyncio.run(main())
    assert_idle(engine)


def test_async_sleep_and_wake_up(tiny_llm_dir):
    engine = AsyncLLM(tiny_llm_dir[1], **ENGINE)

    async def main():
        before = await collect(engine.generate(PROMPTS[0], GREEDY))
        agen = engine.generate(PROMPTS[1], SamplingParams(max_tokens=50, ignore_eos=True))
        await agen.__anext__()
        with pytest.raises(RuntimeError, match="unfinished requests"):
            await engine.sleep()  # refused while a request is in flight
        await agen.aclose()
        await engine.sleep()
        with pytest.raises(RuntimeError, match="asleep"):
            await collect(engine.generate(PROMPTS[0], GREEDY))
        await engine.wake_up()
        after = await collect(engine.generate(PROMPTS[0], GREEDY))
        assert [d.outputs[0].token_ids for d in after] == [d.outputs[0].token_ids for d in before]

    asyncio.run(main())
    assert_idle(engine)


def test_async_shutdown_without_drain_ends_every_stream(tiny_llm_dir):
    engine = AsyncLLM(tiny_llm_dir[1], **ENGINE)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        gens = [engine.generate(p, long) for p in PROMPTS]
        for g in gens:
            await g.__anext__()
        await asyncio.wait_for(engine.shutdown(drain=False), 10)
        for g in gens:
            ends = await asyncio.wait_for(collect(g), 10)
            assert ends[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(RuntimeError, match="shutting down"):
            await collect(engine.generate("x", long))

    asyncio.run(main())
    assert_idle(engine)


def test_async_soak_with_cancellations_and_bad_requests(tiny_llm_dir, caplog):
    """A few hundred concurrent streams, random cancellations and bad requests mixed
    in, bounded in time: every good stream complete and equal to its non-streaming
    result, none lost, every block free, no warning."""
    rng = random.Random(7)
    engine = AsyncLLM(tiny_llm_dir[1], **(ENGINE | {"max_num_seqs": 16}))
    words = ["def", "class", "return", "import", "for", "x", "(", ")", ":", "\n", "    "]
    jobs = []
    for i in range(300):
        prompt = "".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        params = SamplingParams(temperature=0.8, seed=i, max_tokens=rng.randint(1, 10))
        kind = rng.choices(["good", "cancel", "bad"], weights=[6, 2, 1])[0]
        if kind == "bad":
            params = rng.choice(
                [
                    SamplingParams(logit_bias={10**7: 1.0}),
                    SamplingParams(max_tokens=10**6),
                    SamplingParams(stop_token_ids=[10**7]),
                ]
            )
        jobs.append((kind, prompt, params))

    async def run(kind, prompt, params):
        agen = engine.generate(prompt, params)
        if kind == "bad":
            with pytest.raises(ValueError):
                await agen.__anext__()
            return None
        deltas = []
        async for out in agen:
            deltas.append(out)
            if kind == "cancel" and rng.random() < 0.5:
                await agen.aclose()
                return None
            await asyncio.sleep(0)
        return deltas

    async def main():
        tasks = [asyncio.create_task(run(*job)) for job in jobs]
        await asyncio.sleep(0.05)
        for task, (kind, _, _) in zip(tasks, jobs, strict=True):
            if kind == "cancel" and rng.random() < 0.3:
                task.cancel()
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        results = asyncio.run(main())
    assert not caught, [str(w.message) for w in caught]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    good = [(job, res) for job, res in zip(jobs, results, strict=True) if job[0] == "good"]
    reference = LLM(tiny_llm_dir[1], **(ENGINE | {"max_num_seqs": 16})).generate(
        [job[1] for job, _ in good], [job[2] for job, _ in good]
    )
    for (_, deltas), ref in zip(good, reference, strict=True):
        assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])
        ids = [t for d in deltas for t in d.outputs[0].token_ids]
        text = "".join(d.outputs[0].text for d in deltas)
        assert (ids, text) == (ref.outputs[0].token_ids, ref.outputs[0].text)
    for (kind, _, _), res in zip(jobs, results, strict=True):
        if kind == "cancel":
            assert res is None or isinstance(res, (list, asyncio.CancelledError))
    assert_idle(engine)


# --- the public API under fuzzing ---------------------------------------------------------

JUNK = st.sampled_from([None, "x", b"1", [1], {"a": 1}, 1.5, True, object()])
# valid values: what SamplingParams accepts (token ids may still be outside the vocabulary)
VALID = {
    "n": st.integers(1, 3),
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 1e-30, 1e30]),
    "top_p": st.sampled_from([0.05, 0.9, 1.0, 1e-30]),
    "top_k": st.sampled_from([-1, 0, 1, 5, 10**9]),
    "min_p": st.sampled_from([0.0, 0.1, 1.0]),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.sampled_from([0.5, 1.0, 2.0, 1e-30, 1e30]),
    "logit_bias": st.dictionaries(st.integers(0, 520), st.floats(-100, 100), max_size=3),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "max_tokens": st.one_of(st.integers(1, 12), st.sampled_from([None, 300])),
    "min_tokens": st.integers(0, 4),
    "stop": st.one_of(st.lists(st.text(min_size=1, max_size=3), max_size=2), st.none()),
    "stop_token_ids": st.lists(st.integers(0, 520), max_size=3),
    "ignore_eos": st.booleans(),
    "logprobs": st.one_of(st.none(), st.integers(0, 25)),
    "include_stop_str_in_output": st.booleans(),
    "typical_p": st.sampled_from([0.2, 0.9, 1.0]),
    "epsilon_cutoff": st.sampled_from([0.0, 0.01, 0.5]),
    "eta_cutoff": st.sampled_from([0.0, 0.01, 0.5]),
    "no_repeat_ngram_size": st.sampled_from([0, 2, 3]),
    "bad_words": st.one_of(st.none(), st.lists(st.sampled_from(["a", " the", "x y"]), max_size=2)),
}
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1, 10**400, 1e-300])
)
# invalid values: extreme, NaN, wrong-typed, negative
INVALID = {
    name: st.one_of(JUNK, _NUMBERS, st.integers(-(2**70), -1), st.just(2**70)) for name in VALID
}


@st.composite
def param_fields(draw) -> dict:
    """Valid fields, and in one case in four one field set to an invalid value."""
    fields = draw(st.fixed_dictionaries({}, optional=VALID))
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(INVALID)))
        fields[name] = draw(INVALID[name])
    return fields


_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
_IDS = st.lists(st.integers(0, 515), min_size=1, max_size=12)  # the tiny vocabulary: 516
PROMPT = st.one_of(  # valid four times in five
    _TEXT.filter(lambda t: not any(0xD800 <= ord(c) < 0xE000 for c in t)),
    _IDS,
    _IDS,
    st.text(max_size=40),
    st.one_of(
        _TEXT,
        st.lists(st.integers(-2, 600), max_size=12),
        st.sampled_from([[5] * 300, "", [], None, 5, 2.5, b"ab", [True], {"x": 1}, [[1]]]),
    ),
)
ENGINE_SHAPES = st.tuples(
    st.sampled_from([3, 6, 12, 40]),  # num_kv_blocks
    st.sampled_from([2, 4]),  # block_size
    st.booleans(),  # chunked prefill
    st.sampled_from([6, 32]),  # max_num_batched_tokens
)
NAMES = {"prompt", "prompts", "params", *VALID}
_engines: dict = {}


def fuzz_engine(path, shape) -> LLM:
    if shape not in _engines:
        blocks, block_size, chunked, budget = shape
        _engines[shape] = LLM(
            path,
            num_kv_blocks=blocks,
            block_size=block_size,
            enable_chunked_prefill=chunked,
            max_num_batched_tokens=budget,
            max_num_seqs=4,
        )
    return _engines[shape]


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=ENGINE_SHAPES,
    requests=st.lists(st.tuples(PROMPT, param_fields()), min_size=1, max_size=3),
)
def test_fuzz_every_request_is_rejected_by_name_or_finishes(tiny_llm_dir, shape, requests):
    engine = fuzz_engine(tiny_llm_dir[1], shape)
    prompts, params = [], []
    for prompt, fields in requests:
        try:
            params.append(SamplingParams(**fields))
        except (ValueError, TypeError) as exc:
            assert any(name in str(exc) for name in fields), exc
            event("rejected by SamplingParams")
            continue
        prompts.append(prompt)
    if not prompts:
        return
    steps, real_step = [0], engine.core.step

    def counted():
        steps[0] += 1
        return real_step()

    engine.core.step = counted
    try:
        outs = engine.generate(prompts, params)
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in NAMES), exc
        assert_idle(engine)
        event("rejected at admission")
        return
    finally:
        del engine.core.step
    event("generated")
    num_children = sum(p.n for p in params)
    # the progress guarantee: a finish at least every max_model_len steps
    assert steps[0] <= num_children * engine.core.max_model_len
    for out, p in zip(outs, params, strict=True):
        assert out.finished and len(out.outputs) == p.n
        for comp in out.outputs:
            assert comp.finish_reason in ("stop", "length"), comp.error
            assert not any(
                math.isnan(v.logprob) for top in comp.logprobs or [] for v in top.values()
            )
    assert_idle(engine)
