"""Chat completions with image parts (data URLs only) on a tiny random LLaVA, and the
400s of bad images, remote URLs and images sent to a text-only model."""

from __future__ import annotations

import base64
import io

import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

import openai  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.server import ServerConfig, ServingEngine, build_app  # noqa: E402
from pyagent_ref.tokenize import load_tokenizer  # noqa: E402
from tests.multimodal.conftest import random_image  # noqa: E402
from tests.server.conftest import API_KEY, MODEL, ServerThread, kv_all_free, wait_until  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=256, max_num_batched_tokens=16, ops="ref")


def data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def messages(*urls: str) -> list[dict]:
    parts = [{"type": "text", "text": "look:"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def llava_server(tiny_llava_dir):
    engine = ServingEngine(str(tiny_llava_dir[1]), **ENGINE)
    srv = ServerThread(build_app(engine, ServerConfig(served_model_name=MODEL, api_key=API_KEY)))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def llava_client(llava_server):
    with openai.OpenAI(
        base_url=llava_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60
    ) as c:
        yield c


def test_a_chat_with_an_image_answers_as_the_offline_engine(tiny_llava_dir, llava_client):
    image = random_image(11)
    reply = llava_client.chat.completions.create(
        model=MODEL, messages=messages(data_url(image)), max_tokens=5, temperature=0
    )
    # offline: the same template rendering, the same image
    path = tiny_llava_dir[1]
    tokenizer = load_tokenizer(path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "look:"}, {"type": "image"}]}],
        add_generation_prompt=True,
        tokenize=True,
    )
    llm = LLM(str(path), **ENGINE)
    out = llm.generate(
        {"prompt_token_ids": ids, "multi_modal_data": {"image": image}},
        SamplingParams(temperature=0, max_tokens=5),
    )[0]
    llm.shutdown()
    assert reply.usage.prompt_tokens == len(out.prompt_token_ids) == len(ids) + 15
    assert reply.choices[0].message.content == out.outputs[0].text


@pytest.mark.parametrize(
    "urls, error",
    [
        (["data:image/png;base64,aGVsbG8="], "could not be decoded"),
        (["https://example.com/cat.png"], "base64 data URL"),
        ([data_url(random_image(0))] * 5, "more than the 4 allowed"),
    ],
)
def test_bad_images_are_400s_and_the_server_keeps_serving(llava_server, llava_client, urls, error):
    with pytest.raises(openai.BadRequestError, match=error):
        llava_client.chat.completions.create(model=MODEL, messages=messages(*urls), max_tokens=2)
    ok = llava_client.chat.completions.create(
        model=MODEL, messages=messages(data_url(random_image(1))), max_tokens=2
    )
    assert ok.usage.completion_tokens == 2
    wait_until(lambda: kv_all_free(llava_server.engine), what="the KV cache to be freed")


def test_a_text_only_model_refuses_image_parts(client):
    with pytest.raises(openai.BadRequestError, match="text-only model"):
        client.chat.completions.create(
            model=MODEL, messages=messages(data_url(random_image(0))), max_tokens=2
        )


def test_a_streamed_chat_with_an_image_says_the_same(llava_client):
    url = data_url(random_image(13))
    kwargs = dict(model=MODEL, messages=messages(url, url), max_tokens=4, temperature=0)
    whole = llava_client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = llava_client.chat.completions.create(stream=True, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_a_beam_search_chat_with_an_image_gives_the_offline_beams(tiny_llava_dir, llava_client):
    """use_beam_search with an image part: the n choices are `LLM.beam_search`'s beams
    over the same rendering and image; without max_tokens the limit is the context left
    after the image's placeholders."""
    from pyagent_ref.engine.beam_search import BeamSearchParams

    image = random_image(17)
    reply = llava_client.chat.completions.create(
        model=MODEL,
        messages=messages(data_url(image)),
        max_tokens=4,
        n=2,
        temperature=0,
        extra_body={"use_beam_search": True, "ignore_eos": True},
    )
    path = tiny_llava_dir[1]
    ids = load_tokenizer(path).apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "look:"}, {"type": "image"}]}],
        add_generation_prompt=True,
        tokenize=True,
    )
    llm = LLM(str(path), **ENGINE)
    [out] = llm.beam_search(
        {"prompt_token_ids": ids, "multi_modal_data": {"image": image}},
        BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True),
    )
    llm.shutdown()
    assert [c.message.content for c in reply.choices] == [s.text for s in out.sequences]
    unbounded = llava_client.chat.completions.create(
        model=MODEL,
        messages=messages(data_url(image)),
        n=2,
        temperature=0,
        extra_body={"use_beam_search": True},
    )
    assert len(unbounded.choices) == 2
