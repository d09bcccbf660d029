"""Mixture-of-experts families against HF transformers: Mixtral, Qwen2-MoE, Qwen3-MoE.

Each family is a tiny random HF model (built from transformers' own config class, saved
as safetensors with HF's per-expert tensor names) loaded by our loader on the reference
ops and on pyagent_accel's. Logits must equal HF's within TOL for a whole-prompt prefill,
a chunked prefill and step-by-step decoding through the paged cache; greedy generation
through the engine (`LLM(model=dir)`) must equal HF's generate, also when a small cache
forces preemptions and when prompts share cached prefixes. The config and loader errors
name the key or the tensor at fault.

The routers' weights are scaled up after HF's initialisation (x 20): with HF's tiny
initial weights the router logits of a token are nearly tied, and a last-bit difference
between two correct implementations could pick another expert; scaled, the choice is
clear and the comparison tests the arithmetic, not the tie-breaking of near-ties.
"""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.model.moe import SparseMoeBlock  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from tests.model.test_hf_parity import PROMPTS, PagedRunner, hf_logits  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)
ROUTER_SCALE = 20.0

COMMON = TINY_LLAMA | {"max_position_embeddings": 128}
FAMILIES = {
    # every layer sparse, top-2 renormalised
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        dict(num_local_experts=4, num_experts_per_tok=2),
    ),
    # layer 0 sparse with a gated shared expert, layer 1 dense (mlp_only_layers); no renorm
    "qwen2-moe": (
        transformers.Qwen2MoeConfig,
        transformers.Qwen2MoeForCausalLM,
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            mlp_only_layers=[1],
            norm_topk_prob=False,
        ),
    ),
    # layer 1 sparse (decoder_sparse_step 2), layer 0 dense; renormalised; q/k norms
    "qwen3-moe": (
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        dict(
            num_experts=4,
            num_experts_per_tok=3,
            moe_intermediate_size=32,
            decoder_sparse_step=2,
            norm_topk_prob=True,
            head_dim=32,
        ),
    ),
}


def build_hf(family, **overrides):
    """A tiny random HF model of `family` with decisive routers (see the module docstring)."""
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**(COMMON | extra | overrides))
    config._attn_implementation = "eager"
    hf = model_cls(config).eval()
    num_experts = extra.get("num_experts", extra.get("num_local_experts"))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if re.search(r"\.gate(\.weight)?$", name) and p.shape[0] == num_experts:
                p.mul_(ROUTER_SCALE)
    return hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{family: (HF model, its directory)}, built once."""
    out = {}
    for family in FAMILIES:
        hf = build_hf(family)
        path = tmp_path_factory.mktemp(family)
        hf.save_pretrained(path)
        out[family] = hf, path
    return out


@pytest.fixture(
    scope="module",
    params=[(family, ops) for family in FAMILIES for ops in ("ref", "accel")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def pair(request, saved):
    family, ops_name = request.param
    if ops_name == "accel":
        pytest.importorskip("pyagent_accel.ops")
    hf, path = saved[family]
    ours = load_model(path, dtype="float32", progress=False, ops=load_ops(ops_name))
    return hf, ours


def test_the_sparse_layers_are_the_configured_ones(saved):
    layers = {
        family: [isinstance(layer.mlp, SparseMoeBlock) for layer in load_model(path).layers]
        for family, (_, path) in saved.items()
    }
    assert layers == {
        "mixtral": [True, True],
        "qwen2-moe": [True, False],
        "qwen3-moe": [False, True],
    }
    qwen2 = load_model(saved["qwen2-moe"][1]).layers[0].mlp
    assert qwen2.shared_expert is not None and qwen2.shared_expert_gate is not None


def test_prefill_matches(pair):
    hf, ours = pair
    logits = PagedRunner(ours).step({0: PROMPTS[0], 1: PROMPTS[1]})
    n0 = len(PROMPTS[0])
    torch.testing.assert_close(logits[:n0], hf_logits(hf, PROMPTS[0]), **TOL)
    torch.testing.assert_close(logits[n0:], hf_logits(hf, PROMPTS[1]), **TOL)


def test_chunked_prefill_and_decode_match(pair):
    hf, ours = pair
    runner = PagedRunner(ours)
    seqs = [list(PROMPTS[0]), list(PROMPTS[1])]
    runner.step({0: seqs[0][:5]})
    out = runner.step({0: seqs[0][5:], 1: seqs[1]})
    torch.testing.assert_close(out[:6], hf_logits(hf, seqs[0])[5:], **TOL)
    for _ in range(4):  # greedy decode both, one token per request per step
        last = [int(hf_logits(hf, s)[-1].argmax()) for s in seqs]
        for s, t in zip(seqs, last, strict=True):
            s.append(t)
        out = runner.step({0: [last[0]], 1: [last[1]]})
        torch.testing.assert_close(out[0], hf_logits(hf, seqs[0])[-1], **TOL)
        torch.testing.assert_close(out[1], hf_logits(hf, seqs[1])[-1], **TOL)


# --- the engine -------------------------------------------------------------------------------

ENGINE_PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14],
    [5, 17, 3, 88, 41, 9, 60, 2, 7],  # shares two blocks of 4 with the first
    [8, 1, 96, 45, 45, 12, 7],
]


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    """(HF Qwen2-MoE, directory with it and a BPE tokenizer of its vocabulary): the family
    with every MoE feature (shared expert, a dense layer, no renormalisation)."""
    from tests.tokenize.helpers import train_byte_level_bpe, write_hf_dir

    tk = train_byte_level_bpe()
    path = tmp_path_factory.mktemp("moe-llm")
    write_hf_dir(path, tk, {"eos_token": "</s>", "bos_token": "<s>"})
    hf = build_hf("qwen2-moe", vocab_size=tk.get_vocab_size(), bos_token_id=None)
    hf.save_pretrained(path)
    return hf, path


def hf_greedy(hf, prompt, n):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize(
    "engine",
    [
        dict(num_kv_blocks=128, max_num_batched_tokens=8),  # chunked prefill, prefix hits
        dict(num_kv_blocks=10, max_num_batched_tokens=64, enable_prefix_caching=False),
    ],
    ids=["chunked-prefix-cache", "preempting"],
)
def test_engine_greedy_equals_hf_generate(engine_dir, engine):
    from pyagent_ref.engine.llm import LLM

    hf, path = engine_dir
    llm = LLM(path, block_size=4, max_num_seqs=8, ops="ref", **engine)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in ENGINE_PROMPTS]
    outs = llm.generate(prompts, params)
    for prompt, out in zip(ENGINE_PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8)
    if engine.get("enable_prefix_caching", True):
        assert llm.core.kv.metrics().hits > 0  # the second prompt reused the first's blocks
    else:
        assert sum(out.metrics[0].num_preemptions for out in outs) > 0


# --- errors -------------------------------------------------------------------------------------


def _edited_copy(src, dst, tensors=None, config=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config(cfg) if config else cfg))
    weights = load_file(src / "model.safetensors")
    if tensors:
        tensors(weights)
    save_file(weights, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.1.block_sparse_moe.experts.3.w3.weight",
        "model.layers.1.block_sparse_moe.experts.0.w2.weight",
        "model.layers.0.block_sparse_moe.gate.weight",
    ],
)
def test_missing_expert_tensor_is_named(saved, tmp_path, name):
    path = _edited_copy(saved["mixtral"][1], tmp_path / "m", tensors=lambda t: t.pop(name))
    with pytest.raises(ValueError, match=re.escape(name)):
        load_model(path, progress=False)


def test_an_expert_past_num_experts_is_named(saved, tmp_path):
    name = "model.layers.0.mlp.experts.4.up_proj.weight"

    def extra(t):
        t[name] = t["model.layers.0.mlp.experts.0.up_proj.weight"].clone()

    path = _edited_copy(saved["qwen2-moe"][1], tmp_path / "m", tensors=extra)
    with pytest.raises(ValueError, match=re.escape(repr(name)) + " has no place"):
        load_model(path, progress=False)


@pytest.mark.parametrize(
    ("family", "edit", "message"),
    [
        ("mixtral", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok must be in \\[1, 4\\]"),
        ("qwen3-moe", {"decoder_sparse_step": 0}, "decoder_sparse_step must be an int >= 1"),
        ("qwen2-moe", {"num_experts": None}, "lacks 'num_experts'"),
        ("qwen3-moe", {"moe_intermediate_size": None}, "lacks 'moe_intermediate_size'"),
    ],
)
def test_unsupported_config_values_name_the_key(saved, tmp_path, family, edit, message):
    def change(cfg):
        cfg.update(edit)
        return {k: v for k, v in cfg.items() if v is not None}

    path = _edited_copy(saved[family][1], tmp_path / "m", config=change)
    with pytest.raises(ValueError, match=message):
        load_model(path, progress=False)
