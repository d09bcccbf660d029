"""LoRA through the engine: greedy generation equals PEFT's, admission errors, the
prefix cache keyed by adapter, the scheduler's max_loras, CUDA graphs' static path."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.engine.llm import LLM, AsyncLLM  # noqa: E402
from pyagent_ref.lora import LoRARequest  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.lora.helpers import make_adapter  # noqa: E402

# no pad id (2): HF's generate would mask it
PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 12], [8, 1, 96, 45, 45, 12, 7], [300, 31, 502, 33, 34]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
ENGINE = dict(dtype="float32", block_size=4, num_kv_blocks=128, enable_lora=True)


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def adapters(hf, tmp_path_factory):
    """(PEFT models, LoRARequests) of three adapters of the embedded model: plain r=4,
    rsLoRA r=8 on attention, DoRA r=2."""
    root = tmp_path_factory.mktemp("adapters")
    specs = [
        dict(r=4, alpha=16),
        dict(r=8, alpha=8, use_rslora=True, targets=["q_proj", "k_proj", "v_proj", "o_proj"]),
        dict(r=2, alpha=4, use_dora=True),
    ]
    models = [make_adapter(hf, root / f"a{i}", seed=i, **spec) for i, spec in enumerate(specs)]
    return models, [LoRARequest(f"a{i}", i + 1, str(root / f"a{i}")) for i in range(3)]


def hf_greedy(model, prompt, n=8):
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_greedy_with_adapters_equals_peft_generate(hf, adapters):
    """One batch: each prompt with an adapter and without; chunked prefill (6 tokens a
    step), so chunks of different adapters share steps. The engine's default ops (the
    Rust twins where they are installed; the reference's logits are checked in
    `test_peft_parity`)."""
    models, requests = adapters
    llm = LLM(**ENGINE, max_loras=4, max_num_batched_tokens=6)
    prompts = PROMPTS + PROMPTS[:2] + [PROMPTS[2]]
    loras = [requests[0], requests[1], requests[2], None, None, requests[0]]
    outs = llm.generate(prompts, GREEDY, loras)
    for out, prompt, lora in zip(outs, prompts, loras, strict=True):
        peft_model = models[lora.lora_int_id - 1] if lora else models[0]
        if lora is None:
            with peft_model.disable_adapter():
                want = hf_greedy(peft_model, prompt)
        else:
            want = hf_greedy(peft_model, prompt)
        assert out.outputs[0].token_ids == want, lora


def test_lora_requests_need_enable_lora(adapters):
    _, requests = adapters
    llm = LLM(dtype="float32", num_kv_blocks=32)
    with pytest.raises(ValueError, match="names LoRA adapter 'a0', but LoRA is not enabled"):
        llm.generate(PROMPTS[0], GREEDY, requests[0])
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        llm.add_lora(requests[0])
    with pytest.raises(TypeError, match="lora_request must be a LoRARequest"):
        llm.generate(PROMPTS[0], GREEDY, "a0")


def test_bad_adapters_are_refused_at_admission_and_running_requests_go_on(adapters, tmp_path):
    """A bad adapter raises at admission and queues nothing; a request already running
    draws the tokens it draws alone."""
    _, requests = adapters
    core = EngineCore(
        load_model(default_model_path(), dtype="float32", progress=False),
        EngineConfig(**ENGINE, max_lora_rank=4),
    )
    alone = Request(
        "alone", PROMPTS[0], sampling_params=GREEDY, max_tokens=8, lora_request=requests[0]
    )
    core.add_request(alone)
    core.step()
    bad = [
        (LoRARequest("r8", 9, requests[1].lora_path), "rank r=8 exceeds max_lora_rank=4"),
        (LoRARequest("nowhere", 10, str(tmp_path / "x")), "no directory"),
        (LoRARequest("a0", 1, requests[2].lora_path), "lora_int_id 1 is adapter 'a0'"),
    ]
    for i, (lora, match) in enumerate(bad):
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            core.add_request(Request(f"bad{i}", PROMPTS[1], lora_request=lora))
    assert len(core.scheduler.waiting) == 0
    while core.has_unfinished_requests():
        core.step()
    llm = LLM(**ENGINE)
    assert (
        alone.output_token_ids
        == llm.generate(PROMPTS[0], GREEDY, requests[0])[0].outputs[0].token_ids
    )


def test_requests_of_different_adapters_share_no_kv_blocks(adapters):
    _, requests = adapters
    core = EngineCore(
        load_model(default_model_path(), dtype="float32", progress=False),
        EngineConfig(**ENGINE, max_loras=2),
    )
    prompt = list(range(10, 30))
    hits = {}
    for rid, lora in [("a", requests[0]), ("b", requests[1]), ("c", requests[0]), ("d", None)]:
        request = Request(rid, prompt, sampling_params=GREEDY, max_tokens=2, lora_request=lora)
        before = core.kv.metrics().hits
        core.add_request(request)
        core.step()
        hits[rid] = core.kv.metrics().hits - before  # tokens taken from the prefix cache
        while core.has_unfinished_requests():
            core.step()
    assert hits == {"a": 0, "b": 0, "c": 16, "d": 0}


def test_the_scheduler_never_runs_more_adapters_than_slots(adapters):
    """max_loras=1 with requests of three adapters and none: each step's running
    requests use at most one adapter; every request finishes with its own tokens."""
    _, requests = adapters
    core = EngineCore(
        load_model(default_model_path(), dtype="float32", progress=False),
        EngineConfig(**ENGINE, max_loras=1, max_cpu_loras=3, max_num_seqs=8),
    )
    loras = [requests[0], requests[1], None, requests[0], requests[2], None]
    reqs = [
        Request(str(i), PROMPTS[i % 3], sampling_params=GREEDY, max_tokens=4, lora_request=lr)
        for i, lr in enumerate(loras)
    ]
    for r in reqs:
        core.add_request(r)
    seen = []
    while core.has_unfinished_requests():
        core.step()
        ids = {r.lora_id for r in core.scheduler.running} - {None}
        assert len(ids) <= 1, ids
        seen.append(ids)
    assert {1} in seen and {2} in seen and {3} in seen
    llm = LLM(**ENGINE, max_loras=3)
    want = llm.generate(
        [PROMPTS[i % 3] for i in range(6)],
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        loras,
    )
    assert [r.output_token_ids for r in reqs] == [o.outputs[0].token_ids for o in want]


def test_lora_steps_leave_the_static_graph_path_alone(adapters):
    """graph_mode="static" (the computation a CUDA graph replays): decode steps with an
    adapter run eagerly, those without replay the graph; tokens equal graph-less ones."""
    _, requests = adapters
    loras = [requests[0], None, requests[2]]
    eager = LLM(**ENGINE, max_loras=2, graph_mode="eager").generate(PROMPTS, GREEDY, loras)
    static = LLM(**ENGINE, max_loras=2, graph_mode="static")
    replays = []
    run = static.core.runner.graphs.run
    static.core.runner.graphs.run = lambda *a: replays.append(1) or run(*a)
    got = static.generate(PROMPTS, GREEDY, loras)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in eager]
    base_only = static.generate(PROMPTS[1], GREEDY)
    assert replays and base_only[0].outputs[0].token_ids == eager[1].outputs[0].token_ids


def test_async_llm_streams_with_an_adapter(adapters):
    """An adapter's error at admission raises; the stream draws PEFT's tokens; list and
    remove."""
    models, requests = adapters
    llm = AsyncLLM(**ENGINE, max_loras=2, max_lora_rank=4)

    async def main():
        try:
            with pytest.raises(ValueError, match="exceeds max_lora_rank=4"):
                await llm.add_lora(LoRARequest("big", 9, requests[1].lora_path))
            with pytest.raises(ValueError, match="exceeds max_lora_rank=4"):
                async for _ in llm.generate(PROMPTS[0], GREEDY, lora_request=requests[1]):
                    pass
            tokens = []
            async for out in llm.generate(PROMPTS[0], GREEDY, "r0", lora_request=requests[2]):
                tokens += out.outputs[0].token_ids  # deltas
            assert await llm.list_loras() == [3]
            assert await llm.remove_lora(3) and await llm.list_loras() == []
            return tokens
        finally:
            await llm.shutdown()

    assert asyncio.run(main()) == hf_greedy(models[2], PROMPTS[0])


def test_lora_calls_cross_to_the_engine_core_process(adapters):
    """What `EngineCoreClient.add_lora` sends decodes, in the core process, into the
    LoRARequest `EngineCore.add_lora` takes (its exceptions cross by class name)."""
    from pyagent_ref.engine import core_proc

    _, requests = adapters
    encoder, _ = core_proc._codec(core_proc._FROM_CORE)
    _, decoder = core_proc._codec(core_proc._TO_CORE)
    message = decoder.decode(encoder.encode(core_proc.Call(1, "add_lora", (requests[0],))))
    core = EngineCore(
        load_model(default_model_path(), dtype="float32", progress=False), EngineConfig(**ENGINE)
    )
    server = core_proc.CoreServer.__new__(core_proc.CoreServer)
    server.core, replies = core, []
    server.send = replies.append
    server.state = lambda: None
    server.handle(message)
    assert replies[-1].result is True and core.list_loras() == [1]
    bad = LoRARequest("other", 1, requests[1].lora_path)
    server.handle(decoder.decode(encoder.encode(core_proc.Call(2, "add_lora", (bad,)))))
    assert replies[-1].error_type == "ValueError" and "lora_int_id 1 is" in replies[-1].error
    server.handle(decoder.decode(encoder.encode(core_proc.Call(3, "remove_lora", (1,)))))
    assert replies[-1].result is True and core.list_loras() == []


def test_a_request_held_back_by_max_loras_keeps_its_place(adapters):
    """max_loras=1, adapter 1 running: a request of adapter 2 waits; a later one of
    adapter 1 waits behind it (it cannot be starved by them), one without an adapter
    runs at once; when adapter 1's request ends, adapter 2's goes first."""
    _, requests = adapters
    core = EngineCore(
        load_model(default_model_path(), dtype="float32", progress=False),
        EngineConfig(**ENGINE, max_loras=1, max_cpu_loras=2),
    )

    def request(rid, lora, n):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return Request(rid, PROMPTS[0], sampling_params=params, max_tokens=n, lora_request=lora)

    core.add_request(request("a", requests[0], 3))
    core.step()
    for r in (request("x", requests[1], 2), request("y", requests[0], 2), request("z", None, 2)):
        core.add_request(r)
    core.step()
    running = lambda: [r.request_id for r in core.scheduler.running]  # noqa: E731
    assert running() == ["a", "z"]
    assert [r.request_id for r in core.scheduler.waiting] == ["x", "y"]
    core.step()  # a's last token
    core.step()
    assert running()[0] == "x" and "y" not in running()
