"""Bad requests get OpenAI's error shape, the right status and the field's name."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY, MODEL

MESSAGES = [{"role": "user", "content": "hi"}]


def _error(server, path: str, body: dict, key: str | None = API_KEY) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(server.url + path, json=body, headers=headers, timeout=30)
    return r.status_code, r.json()["error"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"logprobs": 50}, "logprobs"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
        ({"typical_p": 0}, "typical_p"),
        ({"epsilon_cutoff": 1}, "epsilon_cutoff"),
        ({"eta_cutoff": -0.5}, "eta_cutoff"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"),
        ({"dry_multiplier": -1}, "dry_multiplier"),
        ({"dry_base": 1}, "dry_base"),
        ({"dry_allowed_length": 0}, "dry_allowed_length"),
        ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
        ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers"),
        ({"xtc_threshold": 2}, "xtc_threshold"),
        ({"xtc_probability": -1}, "xtc_probability"),
        ({"mirostat_mode": 1}, "mirostat_mode"),
        ({"mirostat_tau": 0}, "mirostat_tau"),
        ({"mirostat_eta": 0}, "mirostat_eta"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"suffix": "x"}, "suffix"),
        ({"prompt_logprobs": 50}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt": "x " * 3000}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"max_tokens": 5000}, "max_tokens"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_completion_errors_name_the_field(server, body, param):
    status, error = _error(server, "/v1/completions", {"model": MODEL, "prompt": "x"} | body)
    assert status == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert error["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 99}, "top_logprobs"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "alien", "content": "x"}]}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content.0",
        ),
        ({"chat_template_kwargs": {"thinking": "yes"}}, "chat_template_kwargs"),
    ],
)
def test_chat_errors_name_the_field(server, body, param):
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = {"model": MODEL, "messages": MESSAGES, "tools": tools} | body
    status, error = _error(server, "/v1/chat/completions", request)
    assert status == 400 and error["param"] == param, error
    assert error["message"]


def test_the_client_raises_the_right_exceptions(server, client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5e39)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    bad_key = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    status, error = _error(server, "/v1/models", {}, key=None)
    assert status in (401, 405)
    r = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "no-key-1"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.headers["x-request-id"] == "no-key-1"  # a refusal carries the id too
    r = httpx.get(server.url + "/v1/nothing-here", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.post(
        server.url + "/v1/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # and the server still serves
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices
