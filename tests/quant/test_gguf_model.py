"""The embedded model written as .gguf (F32 and every block format, with our quantizers) and
read back through `load_model` / `LLM(model="x.gguf")`.

The F32 file's logits equal the safetensors model's (this proves the tensor names, the
config read from metadata and the inverse of llama.cpp's Q/K row permutation); the
quantized files keep their linear layers in GGUFLinear, run in the engine with the
tokenizer read from the file, and Q8_0's greedy tokens equal F32's on most prompts.
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.model.config import ModelConfig  # noqa: E402
from pyagent_ref.ops import gguf as gguf_ops  # noqa: E402
from pyagent_ref.quant import gguf as qgguf  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from tests.model.test_hf_parity import PagedRunner  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "The cat sat on",
    "In the beginning",
    "Hello, my name is",
    "The weather today",
    "She opened the door and",
]
TOKENS = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14], [8, 1, 96, 45, 45, 12, 7]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        fmt: qgguf.write_gguf(default_model_path(), root / f"m-{fmt}.gguf", fmt)
        for fmt in qgguf.WRITE_TYPES
    }


@pytest.fixture(scope="module")
def reference():
    return load_model(default_model_path(), "float32", progress=False)


def _logits(model):
    runner = PagedRunner(model)
    return runner.step({0: TOKENS[0], 1: TOKENS[1]})


def test_config_from_metadata_equals_config_json(files):
    ours = ModelConfig.from_pretrained(files["Q4_K"])
    want = ModelConfig.from_pretrained(default_model_path())
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
        "max_position_embeddings",
    ):
        assert getattr(ours, key) == getattr(want, key), key


def test_f32_logits_equal_the_safetensors_model(files, reference):
    model = load_model(files["F32"], progress=False)
    assert isinstance(model.layers[0].self_attn.qkv_proj, qgguf.GGUFLinear)
    torch.testing.assert_close(_logits(model), _logits(reference), rtol=1e-5, atol=1e-5)


def test_without_the_rope_permutation_the_logits_differ(files, reference, monkeypatch):
    """The Q/K permutation matters: reading the rows as stored changes the logits."""
    monkeypatch.setattr(qgguf, "unpermute_rope_rows", lambda rows, heads: rows)
    model = load_model(files["F32"], progress=False)
    assert (_logits(model) - _logits(reference)).abs().max() > 1e-2


@pytest.mark.parametrize("fmt", gguf_ops.FORMATS)
def test_quantized_layers_stay_quantized_and_are_close(files, reference, fmt):
    model = load_model(files[fmt], progress=False)
    layer = model.layers[0].self_attn.qkv_proj
    assert layer.formats == [fmt] * 3 and layer.part0.dtype == torch.uint8
    assert model.layers[0].mlp.down_proj.formats == ["F16"]  # 688 columns: no whole block
    got, want = _logits(model), _logits(reference)
    rel = float((got - want).norm() / want.norm())
    assert rel < {"Q8_0": 0.01, "Q6_K": 0.03, "Q4_K": 0.1, "Q4_0": 0.15}[fmt], rel


def test_q8_0_greedy_tokens_equal_f32_on_most_prompts(files):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    f32 = [o.outputs[0].token_ids for o in LLM(str(files["F32"])).generate(PROMPTS, params)]
    q8 = [o.outputs[0].token_ids for o in LLM(str(files["Q8_0"])).generate(PROMPTS, params)]
    reference = LLM(str(default_model_path()), dtype="float32").generate(PROMPTS, params)
    assert f32 == [o.outputs[0].token_ids for o in reference]
    assert sum(a == b for a, b in zip(f32, q8, strict=True)) >= len(PROMPTS) - 2


def test_the_tokenizer_read_from_the_file_equals_the_checkpoints(files):
    from pyagent_ref.tokenize import load_tokenizer

    ours = load_tokenizer(files["Q8_0"])
    want = load_tokenizer(default_model_path())
    text = "Hello, world! <|user|>\nsay hi<|end|>"
    assert ours.encode(text) == want.encode(text)
    assert ours.eos_token_id == want.eos_token_id


def test_bad_input_is_a_clear_error(files, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + bytes(60))
    with pytest.raises(ValueError, match="bad.gguf"):
        load_model(bad, progress=False)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_model(tmp_path / "missing.gguf", progress=False)
    # an unknown tensor type: a Q5_K attn_q in an otherwise valid file
    writer = gguf.GGUFWriter(tmp_path / "q5k.gguf", "llama")
    reader = gguf.GGUFReader(files["F32"])
    for field in reader.fields.values():
        if field.name.startswith(("llama.", "tokenizer.")) and "token" not in field.name:
            value = field.contents()
            writer.add_key_value(
                field.name,
                value,
                field.types[0],
                field.types[-1] if field.types[0].name == "ARRAY" else None,
            )
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name == "blk.0.attn_q.weight":
            raw = gguf.quants.quantize(
                np.zeros((256, 256), np.float32), gguf.GGMLQuantizationType.Q5_0
            )
            writer.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType.Q5_0)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight' has type Q5_0"):
        load_model(tmp_path / "q5k.gguf", progress=False)
