"""``use_beam_search`` on /v1/completions and /v1/chat/completions: the n best beams of
`LLM.beam_search`, and a 400 naming each field a beam search cannot honour."""

from __future__ import annotations

import openai
import pytest

from pyagent_ref.engine.beam_search import BeamSearchParams
from pyagent_ref.engine.llm import LLM

from .conftest import MODEL, kv_all_free, wait_until

PROMPTS = ["def add(a, b):\n", "import numpy as np\n"]


@pytest.fixture(scope="module")
def llm():
    return LLM(None, num_kv_blocks=256)


def test_completion_choices_are_the_beams_best_first(server, client, llm):
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPTS,
        n=3,
        max_tokens=6,
        temperature=0,
        echo=True,
        extra_body={"use_beam_search": True, "length_penalty": 0.5},
    )
    expected = llm.beam_search(PROMPTS, BeamSearchParams(3, 6, length_penalty=0.5))
    texts = [p + seq.text for p, o in zip(PROMPTS, expected, strict=True) for seq in o.sequences]
    assert [c.index for c in out.choices] == list(range(6))
    assert [c.text for c in out.choices] == texts
    reasons = [seq.finish_reason for o in expected for seq in o.sequences]
    assert [c.finish_reason for c in out.choices] == reasons
    generated = sum(len(s.tokens) for o in expected for s in o.sequences) - 3 * sum(
        len(llm.tokenizer.encode(p)) for p in PROMPTS
    )
    assert out.usage.completion_tokens == generated
    wait_until(lambda: kv_all_free(server.engine), what="every block free")


def test_chat_choices_are_the_beams_of_the_rendered_prompt(server, client, llm):
    messages = [{"role": "user", "content": "Write a haiku"}]
    out = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        n=2,
        max_completion_tokens=5,
        extra_body={"use_beam_search": True},
    )
    prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    [expected] = llm.beam_search({"prompt_token_ids": prompt}, BeamSearchParams(2, 5))
    assert [c.message.content for c in out.choices] == [s.text for s in expected.sequences]
    assert out.usage.prompt_tokens == len(prompt)
    wait_until(lambda: kv_all_free(server.engine), what="every block free")


@pytest.mark.parametrize(
    ("api", "fields", "param"),
    [
        ("completions", {"stream": True}, "stream"),
        ("completions", {"logprobs": 2}, "logprobs"),
        ("completions", {"temperature": 0.7}, "temperature"),
        ("completions", {"length_penalty": "long"}, "length_penalty"),
        ("chat", {"logprobs": True}, "logprobs"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ],
)
def test_what_a_beam_search_cannot_honour_is_a_400(server, client, api, fields, param):
    body = {"model": MODEL, "n": 2, "extra_body": {"use_beam_search": True}}
    if "length_penalty" in fields:
        body["extra_body"] |= fields
    else:
        body |= fields
    with pytest.raises(openai.BadRequestError) as err:
        if api == "completions":
            client.completions.create(prompt=PROMPTS[0], max_tokens=4, **body)
        else:
            messages = [{"role": "user", "content": "hi"}]
            client.chat.completions.create(messages=messages, **body)
    assert err.value.body["param"] == param, err.value.body
    wait_until(lambda: kv_all_free(server.engine), what="every block free")
