"""The dense families through the engine: greedy generation with `LLM(model=dir)` equals
HF transformers' `generate`, and preemption and prefix caching change no token.

The tiny random models are those of `test_hf_parity` (sliding windows of 5, small soft
caps), with the vocabulary of a byte-level BPE tokenizer saved beside them.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.model.test_hf_parity import DENSE, OWN_KEYS, build_hf  # noqa: E402

FAMILIES = sorted(DENSE | OWN_KEYS)
PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 19, 23, 57, 8, 40, 12],
    [8, 1, 96, 45, 45, 12, 7],
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 19, 23, 57, 8, 40, 90],
    [300, 31, 502, 33, 34, 135, 36, 37, 438, 39],
]
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8, max_num_seqs=4)


@pytest.fixture(scope="module")
def tokenizer():
    from tests.tokenize.helpers import train_byte_level_bpe

    return train_byte_level_bpe()


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tokenizer, tmp_path_factory):
    """(family, HF model, directory with its weights and a tokenizer)."""
    from tests.tokenize.helpers import write_hf_dir

    vocab = tokenizer.get_vocab_size()
    hf = build_hf(request.param, vocab_size=vocab, eos_token_id=None)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    write_hf_dir(path, tokenizer, {"eos_token": "</s>", "bos_token": "<s>"})
    return request.param, hf, path


def test_greedy_through_llm_equals_hf_generate(family_dir):
    """Chunked prefill (8 tokens a step), prompts longer than the window, 4 requests in a
    batch; the engine's default ops ("auto")."""
    _, hf, path = family_dir
    llm = LLM(str(path), **ENGINE)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for out, prompt in zip(outs, PROMPTS, strict=True):
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
        assert out.outputs[0].token_ids == want[0, len(prompt) :].tolist()


def greedy(i, prompt, n):
    params = SamplingParams(temperature=0, max_tokens=n)
    return Request(str(i), prompt, sampling_params=params, max_tokens=n)


def run(core, requests):
    for r in requests:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in requests]


@pytest.mark.parametrize("family", FAMILIES)
def test_preemption_and_prefix_caching_change_no_token(family, tmp_path_factory):
    """Hypothesis workloads (shared prefixes, prompts past the window, small caches that
    preempt) give the tokens of a roomy engine without prefix caching."""
    path = tmp_path_factory.mktemp(family)
    build_hf(family).save_pretrained(path)
    model = load_model(path, progress=False)
    preemptions, hits = [], []

    @settings(deadline=None, max_examples=2, derandomize=True)
    @given(
        workload=st.lists(
            st.tuples(st.lists(st.integers(3, 96), min_size=1, max_size=20), st.integers(1, 8)),
            min_size=2,
            max_size=4,
        ),
        shared=st.lists(st.integers(3, 96), min_size=4, max_size=12),
        num_blocks=st.integers(16, 24),
        budget=st.integers(4, 12),
    )
    @example(  # four requests of 40 tokens cannot all fit 16 blocks of 4: preemption
        workload=[(list(range(10 + i, 30 + i)), 8) for i in range(4)],
        shared=list(range(40, 52)),
        num_blocks=16,
        budget=8,
    )
    def check(workload, shared, num_blocks, budget):
        def tokens(**engine):
            core = EngineCore(model, EngineConfig(ops="auto", **(ENGINE | engine)))
            requests = [greedy(i, shared + p, n) for i, (p, n) in enumerate(workload)]
            return run(core, requests), core

        roomy, _ = tokens(enable_prefix_caching=False)
        tight, core = tokens(
            num_kv_blocks=num_blocks, max_num_batched_tokens=budget, enable_prefix_caching=True
        )
        assert tight == roomy
        preemptions.append(core.stats.preemptions)
        hits.append(core.kv.metrics().hits)

    check()
    assert sum(preemptions) > 0 and sum(hits) > 0  # the workloads did preempt and hit


SIZES = dict(
    vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2
)


@pytest.mark.parametrize(
    ("arch", "extra", "message"),
    [
        (
            "Phi3ForCausalLM",
            {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
            "config.json rope_scaling of type 'longrope' is not supported",
        ),
        (
            "LlamaForCausalLM",
            {"hidden_act": "relu"},
            "config.json hidden_act='relu' is not supported",
        ),
        (
            "Gemma2ForCausalLM",
            {"hidden_activation": "gelu_fast"},
            "config.json hidden_activation='gelu_fast' is not supported",
        ),
        (
            "Gemma3ForCausalLM",
            {"use_bidirectional_attention": True},
            "config.json use_bidirectional_attention=True is not supported",
        ),
        (
            "GPT2LMHeadModel",
            {"scale_attn_by_inverse_layer_idx": True},
            "config.json scale_attn_by_inverse_layer_idx=True is not supported",
        ),
    ],
)
def test_unsupported_options_name_the_key(arch, extra, message):
    from pyagent_ref.model import ModelConfig

    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf({"architectures": [arch], **SIZES, **extra})
