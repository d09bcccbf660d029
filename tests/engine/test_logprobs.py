"""Log-probabilities: the prompt's (HF's log-softmax at every position, chunked and
recomputed after preemption alike) and the four logprobs modes of generated tokens."""

from __future__ import annotations

import asyncio
import math

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM, AsyncLLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize(
    "engine",
    [
        {"max_num_batched_tokens": 8},  # the prompt in chunks of 8
        {"num_kv_blocks": 20, "block_size": 4, "max_num_batched_tokens": 16},  # preemption
    ],
)
def test_prompt_logprobs_are_hf_log_softmax(tiny_llm_dir, engine):
    hf, path = tiny_llm_dir
    llm = LLM(path, **engine)
    params = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=3, ignore_eos=True)
    prompts = [PROMPT, PROMPT + "x", PROMPT[:9], PROMPT * 2]
    outs = llm.generate(prompts, params)
    assert llm.core.stats.preemptions > 0 or "num_kv_blocks" not in engine
    for out in outs:
        ids = out.prompt_token_ids
        logprobs = torch.log_softmax(hf_logits(hf, ids), dim=-1)
        entries = out.prompt_logprobs
        assert len(entries) == len(ids) and entries[0] is None
        for j in range(1, len(ids)):
            row, entry = logprobs[j - 1], entries[j]
            first = next(iter(entry))
            assert first == ids[j]  # the prompt's own token comes first
            assert math.isclose(entry[first].logprob, row[ids[j]].item(), abs_tol=1e-4)
            assert entry[first].rank == 1 + int((row > row[ids[j]]).sum())
            best = torch.topk(row, 3).indices.tolist()
            assert set(best) <= set(entry) and len(entry) <= 4


def test_prompt_logprobs_skip_the_prefix_cache_and_reach_every_child(tiny_llm_dir):
    _, path = tiny_llm_dir
    llm = LLM(path)
    plain = SamplingParams(temperature=0, max_tokens=2)
    llm.generate(PROMPT * 3, plain)  # the prompt's blocks are cached now
    asked = SamplingParams(temperature=0.8, seed=1, max_tokens=2, n=2, prompt_logprobs=1)
    out = llm.generate(PROMPT * 3, asked)[0]
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    assert all(entry is not None for entry in out.prompt_logprobs[1:])
    assert llm.generate(PROMPT * 3, plain)[0].prompt_logprobs is None


def test_streamed_prompt_logprobs_come_once(tiny_llm_dir):
    params = SamplingParams(temperature=0, max_tokens=5, prompt_logprobs=0, ignore_eos=True)
    engine = AsyncLLM(tiny_llm_dir[1])

    async def collect():
        return [delta async for delta in engine.generate(PROMPT, params)]

    deltas = asyncio.run(collect())
    carrying = [d for d in deltas if d.prompt_logprobs is not None]
    assert len(deltas) > 1 and len(carrying) == 1
    assert len(carrying[0].prompt_logprobs) == len(deltas[0].prompt_token_ids)


@pytest.mark.parametrize(
    "mode", ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
)
def test_logprobs_modes(tiny_llm_dir, mode):
    """raw: the model's own logits (HF's), whatever the sampling parameters; processed:
    after the penalties, temperature and top-k, as the token was drawn."""
    hf, path = tiny_llm_dir
    llm = LLM(path, logprobs_mode=mode)
    params = SamplingParams(
        temperature=0.5, top_k=3, repetition_penalty=1.3, seed=5, max_tokens=1, logprobs=5
    )
    out = llm.generate(PROMPT, params)[0]
    ids = out.prompt_token_ids
    logits = hf_logits(hf, ids)[-1]
    if mode.startswith("processed"):
        seen = torch.tensor(sorted(set(ids)))
        penalized = logits.clone()
        values = penalized[seen]
        penalized[seen] = torch.where(values > 0, values / 1.3, values * 1.3)
        logits = penalized / 0.5
        logits[logits < torch.topk(logits, 3).values[-1]] = float("-inf")
    expected = torch.log_softmax(logits, -1) if mode.endswith("logprobs") else logits
    entry = out.outputs[0].logprobs[0]
    token = out.outputs[0].token_ids[0]
    assert math.isclose(entry[token].logprob, expected[token].item(), rel_tol=1e-4, abs_tol=1e-4)
    for t, lp in entry.items():
        assert math.isclose(lp.logprob, expected[t].item(), rel_tol=1e-4, abs_tol=1e-4) or (
            lp.logprob == expected[t].item() == float("-inf")
        )


def test_bad_logprobs_settings_name_the_field(tiny_llm_dir):
    _, path = tiny_llm_dir
    with pytest.raises(ValueError, match="logprobs_mode must be one of"):
        LLM(path, logprobs_mode="sampled")
    with pytest.raises(ValueError, match="prompt_logprobs must be None or an int >= 0, got -1"):
        SamplingParams(prompt_logprobs=-1)
    llm = LLM(path, max_logprobs=2)
    with pytest.raises(ValueError, match="prompt_logprobs must be <= max_logprobs=2"):
        llm.generate("x", SamplingParams(prompt_logprobs=3))
