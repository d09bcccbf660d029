"""The chat playground at ``/``: a static page, then the page itself in headless chromium.

The browser tests need Debian's ``chromium`` and ``chromium-driver`` and the selenium
package (`.ci/run` installs the first two, the ``tests`` extra the third); without them
they skip and say what is missing. They drive conftest's ``server`` (an API key, the
deepseek_v3 reasoning parser) and compare what the page shows with what the API answers.
"""

from __future__ import annotations

import json
import re
import shutil

import httpx
import pytest

from .conftest import API_KEY, MODEL, kv_all_free, wait_until

WAIT_S = 30


# --- without a browser --------------------------------------------------------------


def test_the_page_is_served_without_a_key_and_loads_nothing_else(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert re.findall(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page.text, re.IGNORECASE) == []
    assert "@import" not in page.text
    links = re.findall(r"""\b(?:src|href|action)\s*=\s*["']?([^"'\s>]*)""", page.text)
    assert links and all(url.startswith("data:") for url in links), links
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    # The page is open; what it calls is not.
    assert httpx.get(server.url + "/v1/models").status_code == 401


# --- in a browser -------------------------------------------------------------------


def _chromium_or_skip():
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    how = ["`apt-get install chromium chromium-driver` (Debian)"] if missing else []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
        how.append("`pip install -e '.[tests]'`")
    if missing:
        pytest.skip(
            f"the playground's browser tests need {' and '.join(missing)}: {' and '.join(how)}"
        )
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = _chromium_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    yield driver
    driver.quit()


class Playground:
    """The page in the browser, through its element ids."""

    def __init__(self, driver, url: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.By, self.Keys = driver, By, Keys
        self.wait = WebDriverWait(driver, WAIT_S)
        driver.get(url)
        driver.execute_script("localStorage.clear()")
        driver.get_log("browser")  # the log starts with the page's own load
        driver.get(url)

    def el(self, css: str):
        return self.driver.find_element(self.By.CSS_SELECTOR, css)

    def all(self, css: str):
        return self.driver.find_elements(self.By.CSS_SELECTOR, css)

    def text(self, element) -> str:
        """The exact text (selenium's .text trims and folds whitespace)."""
        return element.get_property("textContent")

    def fill(self, element_id: str, value: str) -> None:
        field = self.el("#" + element_id)
        field.clear()
        field.send_keys(value)

    def set_key(self, key: str) -> None:
        self.fill("api-key", key)
        self.el("#api-key").send_keys(self.Keys.TAB)  # a change event: the models reload

    def models(self) -> list[str]:
        return [o.get_attribute("value") for o in self.all("#model option")]

    def send(self, text: str, *, enter: bool = True) -> None:
        self.fill("prompt", text)
        if enter:
            self.el("#prompt").send_keys(self.Keys.ENTER)
        else:
            self.el("#send").click()

    def replies(self):
        return self.all(".message.assistant")

    def wait_reply(self, n: int):
        """The n-th reply (1-based), once it is no longer streaming."""

        def finished(_):
            replies = self.replies()
            return len(replies) >= n and replies[n - 1].get_attribute("data-state") != "streaming"

        self.wait.until(finished, f"reply {n} to finish")
        return self.replies()[n - 1]

    def stats(self, reply) -> dict[str, str]:
        return {
            span.get_attribute("class"): self.text(span)
            for span in reply.find_elements(self.By.CSS_SELECTOR, ".stats span")
        }

    def page_errors(self) -> list[str]:
        """Console errors other than failed requests (the 401/400s the tests provoke)."""
        return [
            entry["message"]
            for entry in self.driver.get_log("browser")
            if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
        ]


@pytest.fixture
def page(browser, server):
    """The playground with the server's API key typed in and the model list loaded."""
    pg = Playground(browser, server.url + "/")
    pg.wait.until(lambda _: "401" in pg.text(pg.el("#notice")), "the 401 without a key")
    pg.set_key(API_KEY)
    pg.wait.until(lambda _: pg.models(), "the model list")
    return pg


def _user(text):
    return {"role": "user", "content": text}


def test_a_conversation_streams_what_the_api_answers_with_stats(page, client):
    assert page.models() == [MODEL] and page.text(page.el("#notice")) == ""
    page.fill("temperature", "0")
    page.fill("max-tokens", "12")
    kwargs = dict(model=MODEL, temperature=0, max_completion_tokens=12)

    page.send("Write a function.")
    first = page.wait_reply(1)
    expected = client.chat.completions.create(messages=[_user("Write a function.")], **kwargs)
    answer = expected.choices[0].message.content
    assert first.get_attribute("data-state") == "done"
    assert page.text(first.find_element(page.By.CSS_SELECTOR, ".reply")) == answer
    stats = page.stats(first)
    assert int(re.fullmatch(r"TTFT (\d+) ms", stats["ttft"]).group(1)) >= 0
    assert float(re.fullmatch(r"(\d+\.\d) tokens/s", stats["tps"]).group(1)) > 0
    assert stats["tokens"] == f"{expected.usage.completion_tokens} tokens"
    assert stats["finish"] == f"finish: {expected.choices[0].finish_reason}"
    assert page.all(".message.user")[0].get_property("textContent").endswith("Write a function.")

    # The second turn sends the first one back: the API answers the same history alike.
    page.send("Now a class.", enter=False)
    second = page.wait_reply(2)
    history = [_user("Write a function."), {"role": "assistant", "content": answer}]
    again = client.chat.completions.create(messages=[*history, _user("Now a class.")], **kwargs)
    assert page.text(second.find_element(page.By.CSS_SELECTOR, ".reply")) == (
        again.choices[0].message.content
    )
    assert len(page.replies()) == 2 and page.el("#prompt").get_property("value") == ""
    assert page.page_errors() == []


def test_reasoning_is_folded_apart_from_the_answer(page, client):
    extra = {"chat_template_kwargs": {"thinking": True}}
    page.fill("temperature", "0")
    page.fill("max-tokens", "8")
    page.fill("extra", json.dumps(extra))
    page.send("Write a function.")
    reply = page.wait_reply(1)
    expected = client.chat.completions.create(
        model=MODEL,
        messages=[_user("Write a function.")],
        temperature=0,
        max_completion_tokens=8,
        extra_body=extra,
    ).choices[0]
    reasoning = reply.find_element(page.By.CSS_SELECTOR, "details.reasoning")
    assert reasoning.is_displayed() and reasoning.get_attribute("open") is None
    assert page.text(reasoning.find_element(page.By.CSS_SELECTOR, "summary")) == "Reasoning"
    assert page.text(reasoning.find_element(page.By.CSS_SELECTOR, "pre")) == (
        expected.message.reasoning_content
    )
    assert page.text(reply.find_element(page.By.CSS_SELECTOR, ".reply")) == (
        expected.message.content or ""
    )
    assert re.fullmatch(r"TTFT \d+ ms", page.stats(reply)["ttft"])


def test_stop_ends_the_reply_and_the_server_frees_its_blocks(page, server):
    page.fill("max-tokens", "800")
    page.fill("extra", '{"ignore_eos": true}')
    page.send("Write a long module.")
    page.wait.until(
        lambda _: page.text(page.el(".message.assistant .reply")), "the first streamed text"
    )
    assert page.el("#send").get_property("disabled")
    page.el("#stop").click()
    reply = page.wait_reply(1)
    assert reply.get_attribute("data-state") == "stopped"
    assert page.stats(reply)["finish"] == "finish: stopped"
    assert not page.el("#send").get_property("disabled")
    assert page.el("#stop").get_property("disabled")
    wait_until(lambda: kv_all_free(server.engine), what="the aborted request's KV blocks")
    assert page.driver.execute_script("return conversation.length") == 2  # the partial turn

    # New chat in the middle of a reply stops it too, and forgets the conversation.
    page.send("Write another one.")
    page.wait.until(
        lambda _: len(page.replies()) == 2 and page.text(page.all(".reply")[1]),
        "the second reply's first text",
    )
    page.el("#clear").click()
    page.wait.until(lambda _: not page.el("#send").get_property("disabled"), "the abort")
    assert page.all(".message") == []
    assert page.driver.execute_script("return conversation.length") == 0
    wait_until(lambda: kv_all_free(server.engine), what="the second request's KV blocks")


def _server_message(server, body: dict, key: str = API_KEY) -> str:
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code >= 400
    return f"HTTP {response.status_code}: {response.json()['error']['message']}"


def test_errors_show_the_servers_message(page, server):
    body = {
        "model": MODEL,
        "messages": [_user("Hi")],
        "temperature": -1,
        "max_completion_tokens": 4,
        "stream": True,
    }
    page.fill("temperature", "-1")
    page.fill("max-tokens", "4")
    page.send("Hi")
    reply = page.wait_reply(1)
    assert reply.get_attribute("data-state") == "error"
    shown = page.text(reply.find_element(page.By.CSS_SELECTOR, ".error"))
    assert shown == _server_message(server, body) and shown.startswith("HTTP 400: ")
    assert "failed" in page.el(".message.user").get_attribute("class")

    # A wrong key is the server's 401.
    page.fill("temperature", "0")
    page.fill("api-key", "not-the-key")
    page.send("Hi")
    shown = page.text(page.wait_reply(2).find_element(page.By.CSS_SELECTOR, ".error"))
    assert shown == _server_message(server, {**body, "temperature": 0}, key="not-the-key")
    assert shown.startswith("HTTP 401: ")

    # Malformed JSON in a field never reaches the server.
    page.fill("api-key", API_KEY)
    page.fill("tools", "[{")
    page.send("Hi")
    shown = page.text(page.wait_reply(3).find_element(page.By.CSS_SELECTOR, ".error"))
    assert shown.startswith("Tools is not valid JSON")

    # The failed turns are not part of the conversation: the next one is answered alone.
    page.fill("tools", "")
    page.send("Hi")
    assert page.wait_reply(4).get_attribute("data-state") == "done"
    assert page.driver.execute_script("return conversation.length") == 2


def test_the_api_key_is_kept_in_local_storage(page, server):
    page.driver.get(server.url + "/")
    page.wait.until(lambda _: page.models(), "the model list with the stored key")
    assert page.el("#api-key").get_property("value") == API_KEY


def _sse(events: list[dict | str]) -> str:
    """An event stream: a dict is one ``data:`` line of JSON, a str the event's own lines."""
    return "".join(
        (e if isinstance(e, str) else f"data: {json.dumps(e, ensure_ascii=False)}") + "\n\n"
        for e in events
    )


def _fake_stream(page, body: bytes, piece: int) -> None:
    """Make the page's fetch answer with ``body`` cut into ``piece``-byte reads (so lines,
    and UTF-8 characters, are split between reads)."""
    pieces = [list(body[i : i + piece]) for i in range(0, len(body), piece)]
    page.driver.execute_script(
        """
        const pieces = arguments[0];
        window.fetch = async () => new Response(new ReadableStream({
          start(controller) {
            for (const p of pieces) controller.enqueue(new Uint8Array(p));
            controller.close();
          },
        }), { status: 200, headers: { "Content-Type": "text/event-stream" } });
        """,
        pieces,
    )


def _chunk(delta: dict | None = None, finish: str | None = None, **extra) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


def test_tool_calls_are_assembled_by_index_across_split_reads(page):
    """The embedded model writes no tool calls, so the stream is a recorded one, read in
    7-byte pieces: fragments of two interleaved calls, reasoning with a non-ASCII
    character, then usage and [DONE]."""
    call = lambda index, **fields: {"tool_calls": [{"index": index, **fields}]}  # noqa: E731
    events = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "Wetter für "}),
        _chunk({"reasoning_content": "zwei Städte"}),
        _chunk(call(0, id="call_a", type="function", function={"name": "get_weather"})),
        _chunk(call(1, id="call_b", type="function", function={"name": "get_time"})),
        _chunk(call(0, function={"arguments": '{"city": '})),
        _chunk(call(1, function={"arguments": "{}"})),
        _chunk(call(0, function={"arguments": '"Paris"}'})),
        _chunk({}, finish="tool_calls"),
        _chunk(usage={"prompt_tokens": 9, "completion_tokens": 21, "total_tokens": 30}),
        "data: [DONE]",
    ]
    _fake_stream(page, _sse(events).encode(), piece=7)
    page.send("Weather and time?")
    reply = page.wait_reply(1)
    assert reply.get_attribute("data-state") == "done"
    calls = reply.find_elements(page.By.CSS_SELECTOR, ".tool-call")
    summaries = [page.text(c.find_element(page.By.CSS_SELECTOR, "summary")) for c in calls]
    assert summaries == ['Tool call: get_weather({"city": "Paris"})', "Tool call: get_time({})"]
    assert all(c.get_attribute("open") is None for c in calls)
    assert "id: call_a" in page.text(calls[0].find_element(page.By.CSS_SELECTOR, "pre"))
    assert page.text(reply.find_element(page.By.CSS_SELECTOR, ".reasoning pre")) == (
        "Wetter für zwei Städte"
    )
    stats = page.stats(reply)
    assert stats["tokens"] == "21 tokens" and stats["finish"] == "finish: tool_calls"
    # The calls go back into the conversation as the assistant's message.
    message = page.driver.execute_script("return conversation[1]")
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_time", "arguments": "{}"},
    ]


def test_an_error_in_the_middle_of_a_stream_is_shown(page):
    """Read a byte at a time, with CRLF line ends and the error's JSON on two data lines
    (joined by a newline, as the SSE format says)."""
    message = "the request failed in the engine: boom"
    error = f'data: {{"error": {{"message": "{message}",\ndata: "type": "server_error"}}}}'
    events = [_chunk({"content": "<b>partiel: été</b>"}), error, "data: [DONE]"]
    _fake_stream(page, _sse(events).replace("\n", "\r\n").encode(), piece=1)
    page.send("Hi")
    reply = page.wait_reply(1)
    assert reply.get_attribute("data-state") == "error"
    assert page.text(reply.find_element(page.By.CSS_SELECTOR, ".error")) == message
    # Model text is text, never markup.
    content = reply.find_element(page.By.CSS_SELECTOR, ".reply")
    assert page.text(content) == "<b>partiel: été</b>"
    assert not content.find_elements(page.By.CSS_SELECTOR, "b")
