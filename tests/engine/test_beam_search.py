"""LLM.beam_search: the same beams and scores as HF transformers' `num_beams` search."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import shutil

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.beam_search import BeamSearchParams, beam_search  # noqa: E402
from pyagent_ref.engine.llm import LLM, AsyncLLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

PROMPTS = ["Hello world, this is", "def main():\n    print(", "Café, naïve 日本"]
ENGINE = dict(block_size=4, num_kv_blocks=256, max_num_batched_tokens=64, max_num_seqs=16)
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def eos_model(tiny_llm_dir, tmp_path_factory):
    """(HF model, EOS ids, LLM) of the tiny Llama with a second EOS in its
    generation_config.json: the token its greedy runs emit most, so that beams finish."""
    hf, src = tiny_llm_dir
    path = tmp_path_factory.mktemp("beam") / "model"
    shutil.copytree(src, path)
    llm = LLM(path, ops="ref", **ENGINE)
    counts = collections.Counter()
    for prompt in PROMPTS:
        ids = llm.tokenizer.encode(prompt)
        greedy = hf.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
        counts.update(greedy[0, len(ids) :].tolist())
    eos = [hf.config.eos_token_id, counts.most_common(1)[0][0]]
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(config | {"eos_token_id": eos}))
    return hf, eos, LLM(path, ops="ref", **ENGINE)


def hf_beams(hf, ids, width, length_penalty, eos):
    """HF's returned sequences (prompt + generated ids) and scores, best first."""
    out = hf.generate(
        torch.tensor([ids]),
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        max_new_tokens=MAX_TOKENS,
        length_penalty=length_penalty,
        early_stopping=False,  # HF's default
        eos_token_id=eos,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    if width == 1:  # HF runs greedy search: sum the chosen tokens' log-probabilities
        tokens = out.sequences[0].tolist()
        generated = tokens[len(ids) :]
        cum = sum(
            float(torch.log_softmax(logits[0], -1)[t])
            for logits, t in zip(out.logits, generated, strict=True)
        )
        return [tokens], [cum / len(generated) ** length_penalty]
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
    tokens = [out.sequences[i, : len(ids) + n].tolist() for i, n in enumerate(lengths)]
    return tokens, out.sequences_scores.tolist()


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_beams_equal_hf_num_beams(eos_model, width, length_penalty, ignore_eos):
    hf, eos, llm = eos_model
    params = BeamSearchParams(
        beam_width=width,
        max_tokens=MAX_TOKENS,
        length_penalty=length_penalty,
        ignore_eos=ignore_eos,
    )
    outputs = llm.beam_search(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        tokens, scores = hf_beams(hf, ids, width, length_penalty, None if ignore_eos else eos)
        assert [s.tokens for s in out.sequences] == tokens
        assert [s.score for s in out.sequences] == pytest.approx(scores, abs=1e-4)
        for seq in out.sequences:
            generated = seq.tokens[len(ids) :]
            stopped = not ignore_eos and generated[-1] in eos
            assert seq.finish_reason == ("stop" if stopped else "length")
            assert stopped or len(generated) == MAX_TOKENS
            assert seq.score == pytest.approx(seq.cum_logprob / len(generated) ** length_penalty)
    assert llm.core.kv.pool.num_free_blocks == llm.core.kv.pool.num_blocks - 1


def test_eos_ends_beams_and_its_text_is_kept_only_when_asked(eos_model):
    _, eos, llm = eos_model
    params = BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS)
    kept = BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS, include_stop_str_in_output=True)
    outputs, with_eos = llm.beam_search(PROMPTS, params), llm.beam_search(PROMPTS, kept)
    stopped = 0
    for prompt, out, out_kept in zip(PROMPTS, outputs, with_eos, strict=True):
        n = len(llm.tokenizer.encode(prompt))
        for seq, seq_kept in zip(out.sequences, out_kept.sequences, strict=True):
            generated = seq.tokens[n:]
            assert seq_kept.tokens == seq.tokens
            end = -1 if seq.finish_reason == "stop" else None
            assert seq.text == llm.tokenizer.decode(generated[:end], skip_special_tokens=True)
            assert seq_kept.text == llm.tokenizer.decode(generated, skip_special_tokens=True)
            stopped += seq.finish_reason == "stop"
    assert stopped  # the test above compares finished beams too


def test_beam_width_beyond_max_logprobs(tiny_llm_dir):
    """A step needs 2 * beam_width top log-probabilities; max_logprobs bounds only what
    users ask for, and still does after the call."""
    llm = LLM(tiny_llm_dir[1], ops="ref", max_logprobs=2, **ENGINE)
    out = llm.beam_search(PROMPTS[0], BeamSearchParams(beam_width=3, max_tokens=2))
    assert len(out) == 1 and len(out[0].sequences) == 3
    with pytest.raises(ValueError, match="max_logprobs=2"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=1, logprobs=3))


def fake_model(dists):
    """top_logprobs for `beam_search` from token sequence -> {token: probability}."""

    def top_logprobs(seqs):
        return [{t: math.log(p) for t, p in dists[tuple(s)].items()} for s in seqs]

    return top_logprobs


def test_an_eos_candidate_outside_the_best_beam_width_does_not_finish():
    dists = {(0,): {1: 0.6, 9: 0.3, 2: 0.1}, (0, 1): {3: 0.5, 4: 0.5}}
    params = BeamSearchParams(beam_width=1, max_tokens=2)
    [out] = beam_search([[0]], params, frozenset({9}), fake_model(dists))
    [seq] = out.sequences  # 9 was the second of two candidates; a tie goes to the lower id
    assert (seq.tokens, seq.finish_reason) == ([0, 1, 3], "length")
    assert seq.cum_logprob == pytest.approx(math.log(0.6 * 0.5))
    assert seq.score == pytest.approx(math.log(0.3) / 2)


def test_search_stops_when_no_live_beam_can_beat_the_finished_ones():
    dists = {(0,): {9: 0.6, 1: 0.4}}  # (0, 1) is never asked for
    params = BeamSearchParams(beam_width=1, max_tokens=5, length_penalty=2.0)
    [out] = beam_search([[0]], params, frozenset({9}), fake_model(dists))
    assert [(s.tokens, s.finish_reason) for s in out.sequences] == [([0, 9], "stop")]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(beam_width=0), ValueError, "beam_width must be >= 1, got 0"),
        (dict(max_tokens=0), ValueError, "max_tokens must be >= 1, got 0"),
        (dict(beam_width=True), TypeError, "beam_width must be an int, got True"),
        (dict(max_tokens=2.0), TypeError, "max_tokens must be an int, got 2.0"),
        (dict(length_penalty=math.inf), ValueError, "length_penalty must be finite, got inf"),
        (dict(length_penalty="1"), TypeError, "length_penalty must be a real number"),
        (dict(temperature=0.7), ValueError, "temperature must be 0 .*got 0.7"),
        (dict(ignore_eos=1), TypeError, "ignore_eos must be a bool, got 1"),
    ],
)
def test_bad_params(kwargs, error, match):
    with pytest.raises(error, match=match):
        BeamSearchParams(**(dict(beam_width=2, max_tokens=4) | kwargs))


def test_bad_calls(eos_model, tiny_llm_dir):
    _, _, llm = eos_model
    with pytest.raises(TypeError, match="params must be BeamSearchParams"):
        llm.beam_search(PROMPTS, SamplingParams())
    with pytest.raises(ValueError, match="max_tokens=100000 is too large"):
        llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=100_000))
    with pytest.raises(ValueError, match="prompt must not be empty"):
        llm.beam_search([PROMPTS[0], []], BeamSearchParams(beam_width=2, max_tokens=2))
    other = LLM(tiny_llm_dir[1], ops="ref", logprobs_mode="processed_logprobs", **ENGINE)
    with pytest.raises(ValueError, match="needs logprobs_mode='raw_logprobs'"):
        other.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=2))


def test_async_beam_search_equals_llm_while_other_requests_run(eos_model):
    """AsyncLLM.beam_search gives LLM.beam_search's sequences, with three searches and a
    sampled request in flight at once; a cancelled search aborts its step requests."""
    _, _, llm = eos_model
    params = BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, length_penalty=0.5)
    expected = llm.beam_search(PROMPTS, params)
    engine = AsyncLLM(llm.config.model, ops="ref", **ENGINE)

    async def run():
        other = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
        searches = [
            engine.beam_search(p, params, request_id=f"b{i}") for i, p in enumerate(PROMPTS)
        ]
        *outs, generated = await asyncio.gather(
            *searches, _tokens(engine.generate(PROMPTS[0], other))
        )
        assert len(generated) == 12
        long = BeamSearchParams(beam_width=3, max_tokens=64, ignore_eos=True)
        cancelled = asyncio.ensure_future(engine.beam_search(PROMPTS[1], long))
        for _ in range(10_000):  # until its first step is in the engine
            if engine.core.has_unfinished_requests():
                break
            await asyncio.sleep(0.001)
        assert not cancelled.done()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return outs

    outs = asyncio.run(run())
    assert [[vars(s) for s in o.sequences] for o in outs] == [
        [vars(s) for s in o.sequences] for o in expected
    ]
    assert not engine.core.has_unfinished_requests()
    assert engine.core.kv.pool.num_free_blocks == engine.core.kv.pool.num_blocks - 1
    with pytest.raises(TypeError, match="params must be BeamSearchParams"):
        asyncio.run(engine.beam_search(PROMPTS[0], SamplingParams()))


async def _tokens(stream) -> list[int]:
    """The token ids of a stream of deltas."""
    return [t async for out in stream for t in out.outputs[0].token_ids]
