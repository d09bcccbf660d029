"""The embedded default model through the whole engine, against HF transformers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import default_model_path  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

PROMPTS = [
    "import os\n",
    "def main(argv):\n",
    "class Config:\n    def __init__(self",
    "for i in range(",
]


@pytest.fixture(scope="module")
def llm():
    return LLM(ops="auto", max_num_batched_tokens=16)  # small budget: prompts are chunked


def test_greedy_continuation_equals_hf_generate(llm):
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=torch.float32
    )
    hf.generation_config.eos_token_id = None  # ignore_eos on both sides: no EOS masking
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = llm.tokenizer.encode(prompt)
        with torch.inference_mode():
            expected = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=24,
                do_sample=False,
                pad_token_id=0,
            )[0, len(ids) :].tolist()
        assert out.outputs[0].token_ids == expected, prompt


def test_greedy_text_looks_like_python(llm):
    out = llm.generate("def ", SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].text
    assert any(word in out for word in ("(", "self", "return", ":", "=")), out


def test_chat_template_renders_and_generates(llm):
    out = llm.chat(
        [{"role": "user", "content": "Write the function `add`."}],
        SamplingParams(max_tokens=16, seed=0),
    )[0]
    assert llm.tokenizer.decode(out.prompt_token_ids).endswith("<|assistant|>\n")
    assert out.outputs[0].token_ids
