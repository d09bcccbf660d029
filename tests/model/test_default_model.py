"""The embedded default model: files, config, tokenizer, chat template, generation.

Made by tools/train_default_model.py; everything here runs offline in a few seconds.
"""

from __future__ import annotations

import json
import keyword
import struct

import pytest

from pyagent_ref.model import default_model_path

FILES = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
)
MAX_DIR_BYTES = 10 * 1024 * 1024
MAX_WEIGHTS_BYTES = 8 * 1024 * 1024
SPECIAL = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
SNIPPET = (
    'import os\n\n\nclass Foo(Base):\n    """Docs — with ünïcode."""\n\n'
    "    def bar(self, x: int = 0) -> list[str]:\n\tif x  >= 10:\n"
    "            return [f'{x!r}', \"<tag>\"]  # comment\r\n        return []\n"
)
CONVERSATION = [
    {"role": "system", "content": "You are a helpful Python assistant."},
    {"role": "user", "content": "What does `os.path.join()` do?"},
]
EXPECTED_PROMPT = (
    "<|bos|><|system|>\nYou are a helpful Python assistant.<|end|>\n"
    "<|user|>\nWhat does `os.path.join()` do?<|end|>\n<|assistant|>\n"
)


@pytest.fixture(scope="module")
def path():
    return default_model_path()


@pytest.fixture(scope="module")
def config(path):
    return json.loads((path / "config.json").read_text())


@pytest.fixture(scope="module")
def hf_tokenizer(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path))


def test_files_exist_and_fit_the_budget(path):
    for name in FILES:
        assert (path / name).is_file(), name
    total = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    assert total <= MAX_DIR_BYTES, total
    assert (path / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES


def test_config_json(config):
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0


def test_safetensors_header_has_hf_names_and_shapes(path, config):
    raw = (path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    h, d = config["hidden_size"], config["head_dim"]
    kv = config["num_key_value_heads"] * d
    expected = {"model.embed_tokens.weight": [config["vocab_size"], h], "model.norm.weight": [h]}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        expected |= {
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [config["num_attention_heads"] * d, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, config["num_attention_heads"] * d],
            p + "mlp.gate_proj.weight": [config["intermediate_size"], h],
            p + "mlp.up_proj.weight": [config["intermediate_size"], h],
            p + "mlp.down_proj.weight": [h, config["intermediate_size"]],
        }
    assert {k: v["shape"] for k, v in header.items()} == expected  # no lm_head: tied
    assert {v["dtype"] for v in header.values()} <= {"BF16", "F32"}


def test_config_loads_as_llama_config(path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(str(path))
    assert isinstance(cfg, transformers.LlamaConfig)
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA


def test_tokenizer_round_trips_and_special_tokens(path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    assert 2048 <= tok.get_vocab_size() <= 4096
    assert [tok.token_to_id(t) for t in SPECIAL] == list(range(len(SPECIAL)))
    ids = tok.encode(SNIPPET).ids
    assert tok.decode(ids, skip_special_tokens=False) == SNIPPET
    assert len(ids) < len(SNIPPET.encode())  # the merges compress Python
    assert tok.encode("<|user|>hi<|end|>").ids[0] == SPECIAL.index("<|user|>")


def test_hf_tokenizer_config(hf_tokenizer):
    tok = hf_tokenizer
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert tok.model_max_length == 1024
    ids = tok(SNIPPET)["input_ids"]  # adds no special token
    assert tok.decode(ids) == SNIPPET


def test_chat_template(hf_tokenizer):
    tok = hf_tokenizer
    prompt = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert prompt == EXPECTED_PROMPT
    bare = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=False)
    assert prompt == bare + "<|assistant|>\n"
    with pytest.raises(Exception, match="Unsupported role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_generation_config(path):
    gen = json.loads((path / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == {SPECIAL.index("<|eos|>"), SPECIAL.index("<|end|>")}


def test_hf_greedy_generation_looks_like_python(path, hf_tokenizer):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(str(path)).float()
    model.eval()
    ids = hf_tokenizer("def ", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=2)
    assert out.shape[1] == ids.shape[1] + 20 or int(out[0, -1]) in (1, 6)
    text = hf_tokenizer.decode(out[0, ids.shape[1] :])
    words = set(text.replace("(", " ( ").split())
    assert "(" in text or words & set(keyword.kwlist), text
