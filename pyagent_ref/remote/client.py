"""`RemoteLLM`: `LLM.generate` and `LLM.chat` answered by a remote OpenAI-compatible
server (another pyagent, vLLM, LM Studio, llama.cpp's server), resilient to its failures.

    llm = RemoteLLM("http://10.0.0.7:8000/v1", api_key="...",
                    retry=RetryPolicy(max_attempts=5), rate_limiter=RateLimiter(20, burst=5))
    outs = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32, temperature=0))
    print(outs[0].outputs[0].text)

Each prompt is one POST (/v1/completions, or /v1/chat/completions for `chat`); the
prompts of one call are sent concurrently, ``max_concurrency`` at a time. Every HTTP
attempt first waits for the rate limiter, then asks the circuit breaker, then goes out
with a timeout; a transport failure (refused, reset, dropped mid-answer, timed out) or a
408/429/5xx is retried with jittered exponential backoff (`resilience.RetryPolicy`,
honouring Retry-After). Generation has no side effects, so a retried POST is safe; a
retry after a timeout may leave the server finishing the abandoned attempt.

What a caller gets, as from `LLM`: one final `RequestOutput` per prompt, in order. A
prompt that still fails once retries are spent (or while the circuit is open) ends with
finish_reason "error" and the reason in ``error``, the other prompts' outputs untouched.
A request the server rejects as such (a 4xx other than 408/429: a bad field, an unknown
model) raises `RemoteRequestError`, a ValueError, as the local engine does.

Over the OpenAI API a completion is text: ``token_ids`` of each completion are empty,
``prompt_token_ids`` are the prompt's only when it was given as token ids. Standard
fields are always sent; vLLM's extra sampling fields (``top_k``, ``min_p``,
``repetition_penalty``, ``structured_outputs``, ...) only when they differ from their
defaults, so a plain OpenAI-compatible server sees a plain request.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from ..engine.llm import Prompt, _per_prompt, _prompt_list
from ..engine.outputs import CompletionOutput, RequestOutput
from ..sample.params import SamplingParams
from .resilience import (
    RETRY_STATUSES,
    CircuitBreaker,
    CircuitOpenError,
    RateLimiter,
    RemoteHTTPError,
    RemoteRequestError,
    RetryPolicy,
    is_server_failure,
    retry_after_s,
)

# SamplingParams fields that have no OpenAI-API form a response could carry back
_UNSENDABLE = ("logprobs", "prompt_logprobs", "bad_words_token_ids", "dry_sequence_breaker_ids")
_ALWAYS = ("n", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed")
_DEFAULTS = SamplingParams()


def request_body(params: SamplingParams) -> dict:
    """The sampling fields of a completion or chat completion request for ``params``:
    the standard ones always, vLLM's extras where they differ from the defaults.
    Raises ValueError naming a field that cannot be sent (log-probabilities, token ids
    that only the local tokenizer knows, logits processors' ``extra_args``)."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {params!r}")
    for name in (*_UNSENDABLE, "extra_args"):
        value = getattr(params, name)
        if value != getattr(_DEFAULTS, name):
            raise ValueError(f"{name} cannot be sent to a remote server (got {value!r})")
    body = {name: getattr(params, name) for name in _ALWAYS if getattr(params, name) is not None}
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.stop:
        body["stop"] = list(params.stop)
    if params.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in params.logit_bias.items()}
    if params.structured_outputs is not None:
        fields = dataclasses.asdict(params.structured_outputs)
        body["structured_outputs"] = {k: v for k, v in fields.items() if v is not None}
    handled = {*_ALWAYS, *_UNSENDABLE, "extra_args", "max_tokens", "stop", "logit_bias"}
    for f in dataclasses.fields(SamplingParams):
        name = f.name
        if name not in handled and name != "structured_outputs":
            value = getattr(params, name)
            if value != getattr(_DEFAULTS, name):
                body[name] = value
    return body


class RemoteLLM:
    """Offline-style generation on a remote OpenAI-compatible server (module docstring).

    base_url: the server's API root, as the openai client takes it
        ("http://host:8000/v1").
    model: the model to ask for (None: the first one the server lists at /models,
        asked at the first call, which raises if that fails).
    api_key: sent as ``Authorization: Bearer <api_key>``.
    timeout_s: per attempt (connect, read, write), in seconds.
    retry: `RetryPolicy` (attempts, backoff, deadline).
    breaker: a `CircuitBreaker` (None: one with its defaults); share one between
        clients of the same server to share what they learn of it.
    rate_limiter: a `RateLimiter` every attempt waits for (None: no limit).
    max_concurrency: requests in flight at once within one call.
    transport: an httpx transport (a Unix socket, a custom proxy); None: httpx's own.
    sleep: how backoff waits (time.sleep; a test may pass a recorder).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        rate_limiter: RateLimiter | None = None,
        max_concurrency: int = 8,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}")
        self.base_url = base_url.rstrip("/")
        self._model = model
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or CircuitBreaker()
        self.rate_limiter = rate_limiter
        self.max_concurrency = max_concurrency
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url + "/",
            headers=headers,
            timeout=timeout_s,
            transport=transport,
        )

    # --- what users call ---------------------------------------------------------------

    @property
    def model(self) -> str:
        """The model asked for: the one given, else the first the server lists."""
        if self._model is None:
            listed = self._call("GET", "models", None)["data"]
            if not listed:
                raise RuntimeError(f"the server at {self.base_url} lists no models")
            self._model = listed[0]["id"]
        return self._model

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One final RequestOutput per prompt, in order (see the module docstring).
        A prompt is text, token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids":
        ...}``."""
        prompts = _prompt_list(prompts)
        params_list = _per_prompt(params, len(prompts))
        jobs = []
        for prompt, sp in zip(prompts, params_list, strict=True):
            text, ids = _prompt_fields(prompt)
            body = {"model": self.model, "prompt": text if ids is None else ids}
            jobs.append(("completions", body | request_body(sp), text, ids))
        return self._run(jobs)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        **template_kwargs,
    ) -> list[RequestOutput]:
        """A chat completion per conversation (one, or a list of them), in order; the
        server applies its chat template (``template_kwargs`` go to it as vLLM's
        ``chat_template_kwargs``). A completion's text is the message's content."""
        if not isinstance(messages, list) or not messages:
            raise TypeError(
                f"messages must be a non-empty list of messages or of conversations, "
                f"got {messages!r}"
            )
        conversations = messages if isinstance(messages[0], list) else [messages]
        params_list = _per_prompt(params, len(conversations))
        jobs = []
        for conv, sp in zip(conversations, params_list, strict=True):
            body = {"model": self.model, "messages": conv} | request_body(sp)
            if tools:
                body["tools"] = tools
            if template_kwargs:
                body["chat_template_kwargs"] = template_kwargs
            jobs.append(("chat/completions", body, None, None))
        return self._run(jobs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- plumbing ----------------------------------------------------------------------

    def _run(self, jobs: list[tuple]) -> list[RequestOutput]:
        """Send every job, ``max_concurrency`` at a time; raise the first rejected one's
        RemoteRequestError once all are done."""
        workers = min(self.max_concurrency, len(jobs)) or 1
        with ThreadPoolExecutor(workers, thread_name_prefix="pyagent-remote") as pool:
            results = list(pool.map(lambda job: self._one(*job), jobs))
        for r in results:
            if isinstance(r, RemoteRequestError):
                raise r
        return results

    def _one(self, path: str, body: dict, text: str | None, ids: list[int] | None):
        try:
            answer = self._call("POST", path, body)
        except RemoteRequestError as exc:
            return exc
        except (httpx.TransportError, RemoteHTTPError, CircuitOpenError) as exc:
            return _failed(body, text, ids, f"{type(exc).__name__}: {exc}")
        try:
            completions = _completions(answer)
        except (KeyError, TypeError, AttributeError) as exc:
            reason = f"the server's answer is not a completion ({exc!r}): {str(answer)[:200]}"
            return _failed(body, text, ids, reason)
        return RequestOutput(answer.get("id", ""), text, ids or [], completions, finished=True)

    def _call(self, method: str, path: str, body: dict | None) -> dict:
        """One call with retries (`RetryPolicy`); each attempt passes the rate limiter
        and the circuit breaker."""
        for attempt in self.retry.retrying(self._sleep):
            with attempt:
                return self._attempt(method, path, body)
        raise AssertionError("unreachable: tenacity reraises the last failure")

    def _attempt(self, method: str, path: str, body: dict | None) -> dict:
        if self.rate_limiter is not None:
            self.rate_limiter.acquire()
        self.breaker.before_call()
        try:
            response = self._http.request(method, path, json=body)
            if response.status_code >= 400:
                raise _http_error(response)
            try:
                answer = response.json()
            except ValueError:  # a proxy's page, say: a bad gateway, as 502 means
                raise RemoteHTTPError(
                    502, f"the answer is not JSON: {response.text[:200]!r}"
                ) from None
        except BaseException as exc:
            if is_server_failure(exc):
                self.breaker.record_failure()
            else:
                self.breaker.record_success()
            raise
        self.breaker.record_success()
        return answer


def _failed(body: dict, text: str | None, ids: list[int] | None, reason: str) -> RequestOutput:
    """The final output of a request that failed: each completion ends with "error"."""
    outputs = [
        CompletionOutput(i, "", [], finish_reason="error", error=reason) for i in range(body["n"])
    ]
    return RequestOutput(f"remote-{uuid.uuid4().hex}", text, ids or [], outputs, finished=True)


def _http_error(response: httpx.Response) -> RemoteHTTPError:
    """The error of an error answer: the OpenAI shape's message when it has one."""
    try:
        message = response.json()["error"]["message"]
    except Exception:
        message = response.text[:500] or response.reason_phrase
    status = response.status_code
    kind = RemoteHTTPError if status in RETRY_STATUSES or status >= 500 else RemoteRequestError
    return kind(status, message, retry_after_s(response.headers.get("retry-after")))


def _prompt_fields(prompt) -> tuple[str | None, list[int] | None]:
    """(text, None) or (None, token ids) of one prompt."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            raise ValueError(f"a dict prompt needs 'prompt' or 'prompt_token_ids', got {prompt!r}")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, Sequence) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        return None, list(prompt)
    raise TypeError(f"a prompt must be text, token ids or a dict, got {prompt!r}")


def _completions(answer: dict) -> list[CompletionOutput]:
    """A completions or chat completions answer's choices, by index."""
    outputs = []
    for choice in sorted(answer["choices"], key=lambda c: c["index"]):
        message = choice.get("message")
        text = choice.get("text", "") if message is None else (message.get("content") or "")
        outputs.append(
            CompletionOutput(
                choice["index"],
                text,
                [],
                finish_reason=choice.get("finish_reason"),
                stop_reason=choice.get("stop_reason"),
            )
        )
    return outputs
