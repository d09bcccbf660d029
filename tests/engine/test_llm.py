"""LLM and AsyncLLM: text in, text out, on a tiny model with a real BPE tokenizer."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM, AsyncLLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=128, max_num_batched_tokens=16, max_num_seqs=8, ops="ref")
PROMPTS = ["Hello world, this is", "def main():\n    print(", "Café, naïve 日本"]


@pytest.fixture(scope="module")
def llm(tiny_llm_dir):
    return LLM(tiny_llm_dir[1], **ENGINE)


def test_greedy_text_matches_hf_generate(llm, tiny_llm_dir):
    hf, _ = tiny_llm_dir
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        assert out.prompt_token_ids == ids
        expected = hf.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )[0, len(ids) :].tolist()
        completion = out.outputs[0]
        assert completion.token_ids == expected
        assert completion.text == llm.tokenizer.decode(expected, skip_special_tokens=True)
        assert completion.finish_reason == "length" and out.finished
        assert out.metrics[0].ttft is not None and out.metrics[0].num_generated_tokens == 12


def test_stop_string_truncates_and_frees_the_request(llm):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = llm.generate(PROMPTS[0], params)[0].outputs[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop and stop in full
    cut = full[: full.index(stop)]
    out = llm.generate(
        PROMPTS[0], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop])
    )[0].outputs[0]
    assert out.text == cut and out.finish_reason == "stop" and out.stop_reason == stop
    kept = llm.generate(
        PROMPTS[0],
        SamplingParams(
            temperature=0,
            max_tokens=20,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=True,
        ),
    )[0].outputs[0]
    assert kept.text == cut + stop
    assert llm.core.kv.pool.num_free_blocks == llm.core.kv.pool.num_blocks - 1


def test_n_completions_with_a_seed_are_reproducible(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=8, ignore_eos=True)
    a = llm.generate(PROMPTS[1], params)[0]
    b = llm.generate(PROMPTS[1], params)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1


def test_chat_renders_the_template(llm):
    out = llm.chat(
        [{"role": "user", "content": "Hello"}], SamplingParams(temperature=0, max_tokens=4)
    )[0]
    rendered = llm.tokenizer.decode(out.prompt_token_ids)
    assert rendered.endswith("<|im_start|>assistant\n") and "Hello" in rendered


def test_bad_params_are_named(llm):
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="params must be one SamplingParams or one per prompt"):
        llm.generate(PROMPTS, [SamplingParams()])


def test_async_stream_and_cancel(tiny_llm_dir):
    engine = AsyncLLM(tiny_llm_dir[1], **ENGINE)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    async def stream():
        text, ids = "", []
        async for delta in engine.generate(PROMPTS[0], params):
            text += delta.outputs[0].text
            ids += delta.outputs[0].token_ids
        return text, ids

    async def cancel_early():
        agen = engine.generate(
            PROMPTS[1], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        )
        async for _ in agen:
            break
        await agen.aclose()  # the consumer goes away: the request is aborted

    async def main():
        text, ids = await stream()
        await cancel_early()
        return text, ids

    text, ids = asyncio.run(main())
    assert len(ids) == 10 and text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert not engine.core.has_unfinished_requests()
    assert engine.core.kv.pool.num_free_blocks == engine.core.kv.pool.num_blocks - 1


def test_logprobs_of_greedy_tokens(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=5, logprobs=3))[0]
    completion = out.outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids)
    for token, top in zip(completion.token_ids, completion.logprobs, strict=True):
        assert len(top) == 3 and max(top, key=lambda t: top[t].logprob) == token
        assert all(v.logprob <= 0 for v in top.values())
        assert next(iter(top)) == token and top[token].rank == 1  # the sampled one first
        assert [v.rank for v in top.values()] == sorted(v.rank for v in top.values())
        assert top[token].decoded_token == llm.tokenizer.decode([token])


def test_logprobs_keep_the_sampled_token_and_its_rank(llm):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12, logprobs=1, ignore_eos=True)
    completion = llm.generate(PROMPTS[1], params)[0].outputs[0]
    ranks = []
    for token, entry in zip(completion.token_ids, completion.logprobs, strict=True):
        assert token in entry and len(entry) in (1, 2)  # the sampled token, then the best
        best = max(entry.values(), key=lambda v: v.logprob)
        assert best.rank == 1 and entry[token].logprob <= best.logprob
        ranks.append(entry[token].rank)
    assert any(rank > 1 for rank in ranks)  # sampling at T=1 drew a token that is not the best


def test_our_bpe_tokenizer_gives_the_engine_the_same_text(tiny_llm_dir):
    from pyagent_ref.tokenize.bpe import BPETokenizer

    prompts = ["def main():\n", "héllo wörld 🙂 <s> x"]
    params = SamplingParams(temperature=0, max_tokens=12)
    runs = {}
    for backend, ops in (("library", "ref"), ("pyagent", "ref"), ("auto", "auto")):
        llm = LLM(str(tiny_llm_dir[1]), ops=ops, tokenizer_backend=backend)
        runs[backend] = [
            (o.prompt_token_ids, o.outputs[0].text) for o in llm.generate(prompts, params)
        ]
        if backend != "library":
            assert isinstance(llm.tokenizer, BPETokenizer)
    assert runs["pyagent"] == runs["library"] == runs["auto"]
    with pytest.raises(ValueError, match="tokenizer_backend must be one of"):
        LLM(str(tiny_llm_dir[1]), tokenizer_backend="sentencepiece")


def test_the_engine_tokenizes_with_the_implementation_of_its_ops(tiny_llm_dir):
    """ops="ref" runs the reference BPE, the accelerator's ops its Rust twin."""
    from pyagent_ref.tokenize.bpe import BytePairEncoding

    ref = LLM(str(tiny_llm_dir[1]), ops="ref").tokenizer.encoding
    assert type(ref) is BytePairEncoding
    accel = pytest.importorskip("pyagent_accel.tokenize.bpe")
    assert type(LLM(str(tiny_llm_dir[1]), ops="accel").tokenizer.encoding) is accel.BytePairEncoding


def test_streamed_deltas_carry_their_logprobs_and_the_last_one_the_metrics(tiny_llm_dir, llm):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2, n=2)
    engine = AsyncLLM(tiny_llm_dir[1], **ENGINE)

    async def collect():
        return [delta async for delta in engine.generate(PROMPTS[0], params)]

    deltas = asyncio.run(collect())
    final = llm.generate(PROMPTS[0], params)[0]
    for index in range(2):
        streamed = [lp for d in deltas for c in d.outputs if c.index == index for lp in c.logprobs]
        ids = [t for d in deltas for c in d.outputs if c.index == index for t in c.token_ids]
        assert len(streamed) == len(ids) == 6
        want = final.outputs[index].logprobs  # another engine: equal up to float rounding
        assert [list(p) for p in streamed] == [list(p) for p in want]
        for got, exp in zip(streamed, want, strict=True):
            for token, lp in got.items():
                assert lp.rank == exp[token].rank
                assert lp.logprob == pytest.approx(exp[token].logprob, abs=1e-5)
    assert all(not d.metrics for d in deltas[:-1])
    assert [m.num_generated_tokens for m in deltas[-1].metrics] == [6, 6]


def test_a_consumer_that_lags_reads_the_queued_deltas_as_one(tiny_llm_dir):
    """Deltas queued while the consumer was away merge into one: the same text, token ids,
    logprobs and finish reasons as reading every delta, in fewer deltas."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2, n=2)
    engine = AsyncLLM(tiny_llm_dir[1], **ENGINE)

    async def read(lag: bool):
        deltas = []
        async for delta in engine.generate(PROMPTS[0], params, request_id=f"lag-{lag}"):
            deltas.append(delta)
            deadline = asyncio.get_running_loop().time() + 60
            while lag and f"lag-{lag}" in engine.processor.requests:  # the engine runs on
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
        return deltas

    def whole(deltas, index):
        comps = [c for d in deltas for c in d.outputs if c.index == index]
        positions = [p for c in comps for p in c.logprobs]
        text, ids = "".join(c.text for c in comps), [t for c in comps for t in c.token_ids]
        ranks = [[(t, lp.rank) for t, lp in p.items()] for p in positions]
        return (text, ids, ranks), [lp.logprob for p in positions for lp in p.values()]

    fast, slow = asyncio.run(read(False)), asyncio.run(read(True))
    assert len(fast) == 6 and len(slow) == 2
    for index in range(2):
        (got, got_lps), (want, want_lps) = whole(slow, index), whole(fast, index)
        assert got == want and len(got[1]) == len(got[2]) == 6
        assert got_lps == pytest.approx(want_lps, abs=1e-5)  # another batch: float rounding
    assert [c.finish_reason for c in slow[-1].outputs] == ["length", "length"]
    assert slow[-1].finished and not slow[0].finished
    assert [m.num_generated_tokens for m in slow[-1].metrics] == [6, 6]
