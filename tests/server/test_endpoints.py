"""Every endpoint through the official openai client (or httpx where it has no method)."""

from __future__ import annotations

import math

import httpx
import pytest

from .conftest import API_KEY, MODEL, kv_all_free, wait_until

MESSAGES = [{"role": "user", "content": "Write a function."}]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_health_version_models(server, client):
    assert httpx.get(server.url + "/health").status_code == 200
    assert "version" in httpx.get(server.url + "/version").json()
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]


def test_completion_text_ids_and_batch(client):
    one = client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=6, temperature=0)
    again = client.completions.create(
        model=MODEL, prompt="def fib(n):", max_tokens=6, temperature=0
    )
    assert one.choices[0].text == again.choices[0].text and one.choices[0].finish_reason == "length"
    assert (
        one.usage.completion_tokens == 6 and one.usage.total_tokens == one.usage.prompt_tokens + 6
    )
    ids = httpx.post(
        client.base_url.join("/tokenize").__str__(), json={"prompt": "def fib(n):"}, headers=AUTH
    ).json()["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == one.choices[0].text
    batch = client.completions.create(
        model=MODEL, prompt=["a", "b"], n=2, max_tokens=3, seed=1, stop=["\n\n"]
    )
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]


def test_completion_logprobs_echo_and_sampling_fields(client):
    out = client.completions.create(
        model=MODEL,
        prompt="import",
        max_tokens=4,
        logprobs=3,
        temperature=0.8,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=7,
        logit_bias={"5": -100},
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(3 <= len(top) <= 4 for top in lp.top_logprobs)
    echo = client.completions.create(model=MODEL, prompt="import", max_tokens=2, echo=True)
    assert echo.choices[0].text.startswith("import")


def test_completion_takes_the_token_filters(client):
    allowed = httpx.post(
        client.base_url.join("/tokenize").__str__(), json={"prompt": "abc xyz"}, headers=AUTH
    ).json()["tokens"]
    out = client.completions.create(
        model=MODEL,
        prompt="import",
        max_tokens=6,
        seed=3,
        extra_body={
            "allowed_token_ids": allowed,
            "bad_words": ["zzz"],
            "no_repeat_ngram_size": 3,
            "typical_p": 0.9,
            "epsilon_cutoff": 0.001,
            "eta_cutoff": 0.001,
        },
    )
    assert set(out.choices[0].text) <= set("abc xyz")


def test_completion_takes_llama_cpp_samplers(client):
    kwargs = dict(model=MODEL, prompt="import", max_tokens=8, seed=3)
    extra = {
        "dry_multiplier": 0.8,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 64,
        "dry_sequence_breakers": ["\n", ":"],
        "xtc_threshold": 0.1,
        "xtc_probability": 0.5,
        "mirostat_mode": 2,
        "mirostat_tau": 4.0,
        "mirostat_eta": 0.2,
    }
    first = client.completions.create(**kwargs, extra_body=extra).choices[0].text
    assert client.completions.create(**kwargs, extra_body=extra).choices[0].text == first


def test_completion_streaming_matches_and_reports_usage(client):
    kwargs = dict(model=MODEL, prompt="class A:", max_tokens=8, temperature=0)
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_completion_streaming_n_logprobs(client):
    kwargs = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    assert whole.choices[0].message.role == "assistant"
    text = ""
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
    assert text == whole.choices[0].message.content
    many = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=3, max_tokens=4, logprobs=True, top_logprobs=2, seed=3
    )
    assert len(many.choices) == 3
    for choice in many.choices:
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        max_tokens=4,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens = {0: 0, 1: 0}
    for chunk in streamed:
        for choice in chunk.choices:
            tokens[choice.index] += len(choice.logprobs.content) if choice.logprobs else 0
    assert chunk.usage.completion_tokens == sum(tokens.values())


def test_chat_with_tools_and_reasoning_on_the_embedded_model(client):
    """The embedded model writes no tool calls: the wiring must still give a well-formed
    message, and `thinking` makes the deepseek_v3 reasoning parser read it as reasoning."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=tools, max_tokens=6, temperature=0
    )
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    thinking = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": True}},
    )
    message = thinking.choices[0].message
    assert message.content is None and message.reasoning_content
    assert message.model_extra["reasoning"] == message.reasoning_content
    reasoning = ""
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        stream=True,
        tools=tools,
        extra_body={"chat_template_kwargs": {"thinking": True}},
    ):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
    assert reasoning == message.reasoning_content


def test_tokenize_detokenize(server):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "hello world"}, headers=AUTH)
    body = ids.json()
    assert body["count"] == len(body["tokens"]) > 0
    text = httpx.post(server.url + "/detokenize", json={"tokens": body["tokens"]}, headers=AUTH)
    assert text.json()["prompt"] == "hello world"
    chat = httpx.post(server.url + "/tokenize", json={"messages": MESSAGES}, headers=AUTH).json()
    assert chat["count"] > body["count"]


def test_metrics(server, client):
    client.completions.create(model=MODEL, prompt="x = 1", max_tokens=3)
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "pyagent:num_requests_running",
        "pyagent:num_requests_waiting",
        "pyagent:kv_cache_usage_perc",
        "pyagent:prefix_cache_queries_total",
        "pyagent:prefix_cache_hits_total",
        "pyagent:prompt_tokens_total",
        "pyagent:generation_tokens_total",
        "pyagent:num_preemptions_total",
        "pyagent:time_to_first_token_seconds_bucket",
        "pyagent:inter_token_latency_seconds_count",
        "pyagent:e2e_request_latency_seconds_sum",
    ):
        assert name in text, name
    generated = [ln for ln in text.splitlines() if ln.startswith("pyagent:generation_tokens_total")]
    assert float(generated[0].split()[-1]) >= 3


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_aborts_and_frees_blocks(server, stream):
    """A client that goes away mid-request: its request is aborted, its blocks freed."""
    body = {
        "model": MODEL,
        "prompt": "def",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": stream,
    }
    engine = server.engine
    with httpx.Client(timeout=30) as http:
        if stream:
            with http.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH) as r:
                for _ in zip(range(3), r.iter_lines(), strict=False):
                    pass
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=1.0)
    wait_until(lambda: kv_all_free(engine), timeout=20, what="the request to be aborted")


def test_echo_with_logprobs_and_prompt_logprobs(server, client):
    """echo + logprobs scores the prompt too (its first token has none, as OpenAI's
    API says); vLLM's prompt_logprobs field returns the entries by token id."""
    out = client.completions.create(
        model=MODEL, prompt="def fib(n):", max_tokens=3, temperature=0, echo=True, logprobs=2
    )
    choice = out.choices[0]
    lp = choice.logprobs
    num_prompt = out.usage.prompt_tokens
    assert len(lp.tokens) == num_prompt + 3 and "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[num_prompt] == len("def fib(n):")
    body = {"model": MODEL, "prompt": "def fib(n):", "max_tokens": 2, "prompt_logprobs": 1}
    raw = httpx.post(server.url + "/v1/completions", json=body, headers=AUTH).json()
    entries = raw["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == num_prompt
    first = entries[1]
    assert 1 <= len(first) <= 2 and all(
        set(v) == {"logprob", "rank", "decoded_token"} for v in first.values()
    )
    assert math.isclose(next(iter(first.values()))["logprob"], lp.token_logprobs[1], abs_tol=1e-5)
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "prompt_logprobs": 0}
    raw = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=AUTH).json()
    assert (
        raw["prompt_logprobs"][0] is None
        and len(raw["prompt_logprobs"]) == raw["usage"]["prompt_tokens"]
    )
    stream = client.completions.create(
        model=MODEL,
        prompt="def fib(n):",
        max_tokens=3,
        temperature=0,
        echo=True,
        logprobs=2,
        stream=True,
    )
    tokens = [t for chunk in stream for t in chunk.choices[0].logprobs.tokens]
    assert tokens == lp.tokens
