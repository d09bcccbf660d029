"""LoRA adapters at the server: adapters as models, --lora-modules, the load and unload
endpoints, 404 for an unknown name, and generations equal to the engine's own."""

from __future__ import annotations

import contextlib

import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import httpx  # noqa: E402
import openai  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.lora import LoRARequest  # noqa: E402
from pyagent_ref.model import default_model_path  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.server import ServerConfig, ServingEngine, build_app  # noqa: E402
from tests.lora.helpers import make_adapter  # noqa: E402
from tests.server.conftest import ServerThread  # noqa: E402

ENGINE = dict(dtype="float32", num_kv_blocks=256, enable_lora=True, max_loras=2, max_lora_rank=8)
PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=torch.float32
    )
    root = tmp_path_factory.mktemp("server-adapters")
    make_adapter(hf, root / "sql", r=4, alpha=16, seed=1)
    make_adapter(hf, root / "doc", r=8, alpha=8, use_dora=True, seed=2)
    make_adapter(hf, root / "big", r=16, alpha=16, seed=3)
    return root


@pytest.fixture(scope="module")
def lora_server(adapter_dirs):
    engine = ServingEngine(**ENGINE)
    config = ServerConfig(served_model_name="base", lora_modules={"sql": str(adapter_dirs / "sql")})
    srv = ServerThread(build_app(engine, config)).start()
    yield srv
    with contextlib.suppress(AssertionError):
        srv.stop()


def complete(client, model):
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    return out.model, out.choices[0].text


def test_adapters_are_models_with_their_own_generations(lora_server, adapter_dirs):
    client = openai.OpenAI(base_url=lora_server.url + "/v1", api_key="x", max_retries=0)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"base", "sql"}
    assert cards["sql"].parent == "base" and cards["sql"].root == str(adapter_dirs / "sql")
    llm = LLM(**ENGINE)
    params = SamplingParams(temperature=0, max_tokens=8)
    want_sql = llm.generate(PROMPT, params, LoRARequest("sql", 1, str(adapter_dirs / "sql")))
    want_base = llm.generate(PROMPT, params)
    assert complete(client, "sql") == ("sql", want_sql[0].outputs[0].text)
    assert complete(client, "base") == ("base", want_base[0].outputs[0].text)
    assert want_sql[0].outputs[0].text != want_base[0].outputs[0].text
    chat = client.chat.completions.create(
        model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.model == "sql"
    with pytest.raises(openai.NotFoundError, match="the model 'nope' does not exist"):
        complete(client, "nope")


def test_load_and_unload_while_serving(lora_server, adapter_dirs):
    url = lora_server.url
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        complete(client, "doc")
    load = {"lora_name": "doc", "lora_path": str(adapter_dirs / "doc")}
    r = httpx.post(f"{url}/v1/load_lora_adapter", json=load)
    assert r.status_code == 200 and "added successfully" in r.text
    assert complete(client, "doc")[0] == "doc"
    r = httpx.post(f"{url}/v1/load_lora_adapter", json=load)
    assert r.status_code == 400 and "has already been loaded" in r.json()["error"]["message"]
    big = {"lora_name": "big", "lora_path": str(adapter_dirs / "big")}
    r = httpx.post(f"{url}/v1/load_lora_adapter", json=big)
    assert r.status_code == 400 and "r=16 exceeds max_lora_rank=8" in r.json()["error"]["message"]
    missing = {"lora_name": "gone", "lora_path": str(adapter_dirs / "nowhere")}
    r = httpx.post(f"{url}/v1/load_lora_adapter", json=missing)
    assert r.status_code == 400 and "no directory" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "doc"})
    assert r.status_code == 200 and "removed successfully" in r.text
    with pytest.raises(openai.NotFoundError):
        complete(client, "doc")
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "doc"})
    assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
    assert {m.id for m in client.models.list().data} == {"base", "sql"}


def test_lora_modules_need_enable_lora(adapter_dirs):
    engine = ServingEngine(dtype="float32", num_kv_blocks=32)
    with pytest.raises(ValueError, match="needs the engine's --enable-lora"):
        build_app(engine, ServerConfig(lora_modules={"sql": str(adapter_dirs / "sql")}))
    srv = ServerThread(build_app(engine, ServerConfig())).start()
    try:
        r = httpx.post(f"{srv.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "b"})
        assert r.status_code == 400 and "LoRA is not enabled" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_lora_modules_flag_takes_name_path_pairs():
    from pyagent_ref.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--lora-modules", "no-equals-sign"])
    assert exit_info.value.code == 2
