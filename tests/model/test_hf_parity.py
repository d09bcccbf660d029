"""Logits of our forward pass against HF transformers, for every family.

Each case builds a tiny random HF model, saves it (safetensors), loads it with our
loader, on the reference ops and on pyagent_accel's, and compares logits: for a
whole-prompt prefill, for a chunked prefill, and for step-by-step decoding through the
paged cache, with two requests in one batch. Every family runs on the accelerator's
twins alone (ops="accel"): its norms (RMS, Gemma's, LayerNorm), activations (SwiGLU,
GeGLU, GELU), RoPE and attention (with its soft cap).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.model import AttentionMetadata, load_model  # noqa: E402
from pyagent_ref.ops import block_table as bt  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402

BLOCK = 4
TOL = dict(rtol=1e-4, atol=1e-4)

COMMON = TINY_LLAMA | {"max_position_embeddings": 128}
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama3-rope": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            )
        ),
    ),
    "llama-yarn": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=32,
            )
        ),
    ),
    "llama-tied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(tie_word_embeddings=True),
    ),
    "mistral-window": (
        transformers.MistralConfig,
        transformers.MistralForCausalLM,
        dict(sliding_window=5),
    ),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32)),
}
# The dense families of `pyagent_ref.model.families`, with small soft caps and windows so
# that capping, windows and per-layer RoPE change the logits of these short prompts.
SPECIAL_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=5, **SPECIAL_IDS)
NEOX = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    **SPECIAL_IDS,
)
DENSE = {
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, GEMMA),
    "gemma2": (
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        GEMMA | dict(attn_logit_softcapping=0.5, final_logit_softcapping=0.3),
    ),
    "gemma3": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        GEMMA
        | dict(
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "sliding_attention": dict(rope_type="default", rope_theta=10.0),
                "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
            },
        ),
    ),
    "phi3": (
        transformers.Phi3Config,
        transformers.Phi3ForCausalLM,
        dict(
            rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5),
            **SPECIAL_IDS,
        ),
    ),
    "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM, SPECIAL_IDS),
}
# families whose config classes do not take Llama's keys
OWN_KEYS = {
    "gpt-neox": (transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM, NEOX),
    "gpt-neox-sequential": (
        transformers.GPTNeoXConfig,
        transformers.GPTNeoXForCausalLM,
        NEOX | dict(use_parallel_residual=False),
    ),
    "gpt2": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=128)
        | SPECIAL_IDS,
    ),
}


def build_hf(family, **overrides):
    """A tiny random HF model of `family` (seeded), in eval mode, eager attention;
    `overrides` replace config keyword arguments (vocab_size, token ids)."""
    if family in OWN_KEYS:
        config_cls, model_cls, kwargs = OWN_KEYS[family]
    else:
        config_cls, model_cls, extra = (FAMILIES | DENSE)[family]
        kwargs = COMMON | extra
    torch.manual_seed(0)
    config = config_cls(**(kwargs | overrides))
    config._attn_implementation = "eager"
    return model_cls(config).eval()


ALL_FAMILIES = sorted(FAMILIES | DENSE | OWN_KEYS)


@pytest.fixture(
    scope="module",
    params=[(family, ops) for family in ALL_FAMILIES for ops in ("ref", "accel")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def pair(request, tmp_path_factory):
    """(HF model, ours) of one family; ours runs on the reference ops or on the Rust twins
    (both must equal HF within TOL)."""
    family, ops_name = request.param
    if ops_name != "ref":
        pytest.importorskip("pyagent_accel.ops")
    hf = build_hf(family)
    path = tmp_path_factory.mktemp(family)
    hf.save_pretrained(path)
    ours = load_model(path, dtype="float32", progress=False, ops=load_ops(ops_name))
    return hf, ours


class PagedRunner:
    """Feeds chunks of several sequences through our model with a real paged cache."""

    def __init__(self, model, num_blocks=64, decode_path="general"):
        self.static_decode = decode_path == "static"
        self.model = model
        self.caches = [model.new_kv_cache(num_blocks, BLOCK) for _ in model.layers]
        self.next_block = 1
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def step(self, chunks: dict[int, list[int]]) -> torch.Tensor:
        """Run one step: request id -> new tokens. Returns logits of every new token."""
        ids, positions, qsl, seq_lens = [], [], [0], []
        for rid, tokens in chunks.items():
            start = self.lengths.get(rid, 0)
            end = start + len(tokens)
            table = self.tables.setdefault(rid, [])
            while len(table) * BLOCK < end:
                table.append(self.next_block)
                self.next_block += 1
            ids += tokens
            positions += list(range(start, end))
            qsl.append(qsl[-1] + len(tokens))
            seq_lens.append(end)
            self.lengths[rid] = end
        width = max(len(self.tables[r]) for r in chunks)
        table = torch.tensor([self.tables[r] + [0] * (width - len(self.tables[r])) for r in chunks])
        qsl_t, pos_t = torch.tensor(qsl), torch.tensor(positions)
        meta = AttentionMetadata(
            slot_mapping=bt.compute_slot_mapping(table, qsl_t, pos_t, BLOCK),
            block_table=table,
            query_start_loc=qsl_t,
            seq_lens=torch.tensor(seq_lens),
            decode_only=self.static_decode and len(ids) == len(chunks),
        )
        with torch.no_grad():
            hidden = self.model(torch.tensor(ids), pos_t, meta, self.caches)
            return self.model.compute_logits(hidden)


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14], [8, 1, 96, 45, 45, 12, 7]]


def test_prefill_matches(pair):
    hf, ours = pair
    runner = PagedRunner(ours)
    logits = runner.step({0: PROMPTS[0], 1: PROMPTS[1]})
    n0 = len(PROMPTS[0])
    torch.testing.assert_close(logits[:n0], hf_logits(hf, PROMPTS[0]), **TOL)
    torch.testing.assert_close(logits[n0:], hf_logits(hf, PROMPTS[1]), **TOL)


@pytest.mark.parametrize("decode_path", ["general", "static"])
def test_chunked_prefill_and_decode_match(pair, decode_path):
    """Decode steps attend through paged_attention ("general") or through the
    static-shape paged_decode_attention a CUDA graph captures ("static")."""
    hf, ours = pair
    runner = PagedRunner(ours, decode_path=decode_path)
    seqs = [list(PROMPTS[0]), list(PROMPTS[1])]
    # request 0 in chunks of 5, 6; request 1 whole in the second step
    runner.step({0: seqs[0][:5]})
    out = runner.step({0: seqs[0][5:], 1: seqs[1]})
    torch.testing.assert_close(out[:6], hf_logits(hf, seqs[0])[5:], **TOL)
    for _ in range(6):  # greedy decode both, one token per request per step
        last = [int(hf_logits(hf, s)[-1].argmax()) for s in seqs]
        for s, t in zip(seqs, last, strict=True):
            s.append(t)
        out = runner.step({0: [last[0]], 1: [last[1]]})
        torch.testing.assert_close(out[0], hf_logits(hf, seqs[0])[-1], **TOL)
        torch.testing.assert_close(out[1], hf_logits(hf, seqs[1])[-1], **TOL)


def test_an_ops_namespace_lacking_an_op_is_refused(tmp_path):
    """A namespace without an op the model needs (an accelerator without GELU, say)
    refuses to load, naming the op and the alternatives."""
    accel = load_ops("accel")
    layers = SimpleNamespace(**{n: getattr(accel.layers, n) for n in accel.layers.__all__})
    del layers.gelu
    partial = SimpleNamespace(layers=layers, attention=accel.attention, rope=accel.rope)
    build_hf("gpt2").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"lacks \['layers\.gelu'\].*use ops='auto'"):
        load_model(tmp_path, progress=False, ops=partial)
