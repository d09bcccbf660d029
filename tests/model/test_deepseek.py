"""DeepSeek-V2 and V3 (multi-head latent attention on the MoE decoder) against HF.

Each family is a tiny random HF model built from transformers' own config class and saved
with HF's tensor names; our loader reads it on the reference ops and on pyagent_accel's.
Logits must equal HF's within TOL (float32) for a whole-prompt prefill, a chunked prefill
and step-by-step decoding through the paged latent cache (decodes through the general
attention and through the static-shape one a CUDA graph captures), on both attention
paths (naive: latents expanded to per-head keys and values; absorbed: attention over the
latents); greedy generation through `LLM(model=dir)` must equal HF's generate with
chunked prefill, prefix-cache hits and preemption.

The cases cover what differs between checkpoints: q straight from the hidden state or
through q_lora_rank, V2's "greedy" and "group_limited_greedy" routers and V3's
"noaux_tc" (sigmoid scores steered by a random correction bias, renormalised), a
routed_scaling_factor, shared experts, dense first layers, YaRN with DeepSeek's mscale
and mscale_all_dim (the softmax scale), RoPE pairs interleaved (V2, V3's default) or not.

Weights are drawn with initializer_range 0.1 (HF's default 0.02 leaves attention nearly
uniform: a softmax scale 10% off then moves logits by only 2e-4) and the routers'
weights are scaled up by 4 (a clear expert choice, so the comparison tests the
arithmetic, not the tie-breaking of near-ties).
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.engine.core import EngineConfig, EngineCore, kv_cache_groups  # noqa: E402
from pyagent_ref.kv_cache import MLASpec  # noqa: E402
from pyagent_ref.model import ModelConfig, load_model  # noqa: E402
from pyagent_ref.model.deepseek import MLAAttention  # noqa: E402
from pyagent_ref.model.moe import SparseMoeBlock  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.model.test_hf_parity import BLOCK, PROMPTS, PagedRunner, hf_logits  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)
ROUTER_SCALE = 4.0

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    max_position_embeddings=128,
    initializer_range=0.1,
)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32)
V2, V3 = transformers.DeepseekV2Config, transformers.DeepseekV3Config
MODELS = {V2: transformers.DeepseekV2ForCausalLM, V3: transformers.DeepseekV3ForCausalLM}
FAMILIES = {
    # V2-Lite's shape: q straight from the hidden state, greedy top-k, YaRN with mscale
    "v2-lite": (
        V2,
        dict(
            q_lora_rank=None,
            topk_method="greedy",
            n_shared_experts=2,
            rope_parameters=YARN | dict(mscale=0.707, mscale_all_dim=0.707),
        ),
    ),
    # q through q_lora_rank, the best group of two by its best expert, scaled weights
    "v2": (
        V2,
        dict(q_lora_rank=24, topk_method="group_limited_greedy", n_group=2, topk_group=1)
        | dict(routed_scaling_factor=1.5),
    ),
    # noaux_tc: sigmoid scores with a correction bias, renormalised, times 2.5; YaRN
    "v3": (
        V3,
        dict(q_lora_rank=24, n_group=2, topk_group=1, norm_topk_prob=True)
        | dict(rope_parameters=YARN | dict(mscale=1.0, mscale_all_dim=1.0)),
    ),
    # V3 with NeoX RoPE pairs and every layer sparse
    "v3-neox": (
        V3,
        dict(q_lora_rank=24, n_group=2, topk_group=2, rope_interleave=False)
        | dict(first_k_dense_replace=0, num_experts_per_tok=3),
    ),
}


def build_hf(family, **overrides):
    """A tiny random HF DeepSeek of `family` (seeded, eval mode, eager attention) with
    decisive routers and, for V3, a random correction bias that changes choices."""
    config_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**(COMMON | extra | overrides))
    config._attn_implementation = "eager"
    model_cls = MODELS[config_cls]
    hf = model_cls(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(ROUTER_SCALE)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.linspace(-0.3, 0.3, b.shape[0]).flip(0))
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
    return hf, load_model(path, dtype="float32", progress=False, ops=load_ops(ops_name))


def test_the_layers_are_latent_attention_and_the_configured_moe(saved):
    model = load_model(saved["v3"][1], progress=False)
    assert all(isinstance(layer.self_attn, MLAAttention) for layer in model.layers)
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in model.layers] == [False, True]
    moe = model.layers[1].mlp
    assert moe.shared_expert is not None and moe.shared_expert_gate is None
    assert moe.gate.e_score_correction_bias is not None
    assert (
        load_model(saved["v2"][1], progress=False).layers[1].mlp.gate.e_score_correction_bias
        is None
    )


@pytest.mark.parametrize("path", ["naive", "absorbed"])
def test_prefill_matches(pair, path):
    hf, ours = pair
    ours.set_prefill_path(path)
    logits = PagedRunner(ours).step({0: PROMPTS[0], 1: PROMPTS[1]})
    n0 = len(PROMPTS[0])
    torch.testing.assert_close(logits[:n0], hf_logits(hf, PROMPTS[0]), **TOL)
    torch.testing.assert_close(logits[n0:], hf_logits(hf, PROMPTS[1]), **TOL)


@pytest.mark.parametrize(
    ("path", "decode_path"),
    [("naive", "general"), ("absorbed", "general"), ("naive", "static")],
)
def test_chunked_prefill_and_decode_match(pair, path, decode_path):
    """Request 0 in chunks of 5 and 6 (the second attends to the cached latents of the
    first), request 1 whole, then greedy decode steps: through paged_attention
    ("general": naive or absorbed as the prefill) or the static-shape absorbed path."""
    hf, ours = pair
    ours.set_prefill_path(path)
    runner = PagedRunner(ours, decode_path=decode_path)
    seqs = [list(PROMPTS[0]), list(PROMPTS[1])]
    runner.step({0: seqs[0][:5]})
    out = runner.step({0: seqs[0][5:], 1: seqs[1]})
    torch.testing.assert_close(out[:6], hf_logits(hf, seqs[0])[5:], **TOL)
    for _ in range(4):
        last = [int(hf_logits(hf, s)[-1].argmax()) for s in seqs]
        for s, t in zip(seqs, last, strict=True):
            s.append(t)
        out = runner.step({0: [last[0]], 1: [last[1]]})
        torch.testing.assert_close(out[0], hf_logits(hf, seqs[0])[-1], **TOL)
        torch.testing.assert_close(out[1], hf_logits(hf, seqs[1])[-1], **TOL)


@pytest.mark.parametrize("family", ["v2-lite", "v3"])
def test_naive_and_absorbed_paths_agree(saved, family):
    """The two attention paths give the same logits up to float32 rounding, step by step
    (prefill, a chunk over cached latents, decodes), each through its own cache."""
    runners = {}
    for path in ("naive", "absorbed"):
        model = load_model(saved[family][1], dtype="float32", progress=False)
        model.set_prefill_path(path)
        runners[path] = PagedRunner(model)
    steps = [{0: PROMPTS[0][:6]}, {0: PROMPTS[0][6:], 1: PROMPTS[1]}, {0: [7], 1: [9]}, {1: [3]}]
    for chunks in steps:
        naive, absorbed = (runners[p].step(chunks) for p in ("naive", "absorbed"))
        torch.testing.assert_close(naive, absorbed, rtol=1e-5, atol=1e-5)


def test_the_correction_bias_and_the_scale_change_the_logits(saved):
    """Guards against a test blind to them: zeroing V3's correction bias, or a softmax
    scale 5% off, moves the logits far past TOL."""
    hf, path = saved["v3"]
    want = hf_logits(hf, PROMPTS[0])
    model = load_model(path, dtype="float32", progress=False)
    with torch.no_grad():
        model.layers[1].mlp.gate.e_score_correction_bias.zero_()
    assert (PagedRunner(model).step({0: PROMPTS[0]}) - want).abs().max() > 1e-2
    model = load_model(path, dtype="float32", progress=False)
    for layer in model.layers:
        layer.self_attn.scale *= 1.05
    assert (PagedRunner(model).step({0: PROMPTS[0]}) - want).abs().max() > 1e-2


def test_routers_stay_float32_in_a_bfloat16_model(saved):
    """As HF keeps DeepSeek's router weights and correction bias in float32, so does the
    loader: the bias reaches the router exactly as stored, the rest is bfloat16."""
    hf, path = saved["v3"]
    model = load_model(path, dtype="bfloat16", progress=False)
    gate = model.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    want = dict(hf.named_buffers())["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert torch.equal(gate.e_score_correction_bias, want)
    assert model.layers[1].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    logits = PagedRunner(model).step({0: PROMPTS[0]})
    torch.testing.assert_close(logits, hf_logits(hf, PROMPTS[0]), rtol=0.1, atol=0.15)


def test_the_cache_holds_one_latent_per_token(saved):
    """kv_lora_rank + qk_rope_head_dim numbers per token and layer, in one tensor, and
    the engine's KV cache groups keep an MLASpec of that size."""
    model = load_model(saved["v3"][1], progress=False)
    assert model.kv_cache_shape(5, BLOCK) == (5, BLOCK, 16 + 8)
    assert [t.shape for t in model.new_kv_cache(5, BLOCK)] == [(5, BLOCK, 24)]
    (group,) = kv_cache_groups(model.config, BLOCK, dtype_bytes=2)
    assert group.spec == MLASpec(BLOCK, 1, 24, 2)
    assert group.spec.page_size_bytes == BLOCK * 24 * 2
    assert group.layer_names == ("layers.0", "layers.1")


def test_softmax_scale_and_rope_follow_deepseeks_yarn(saved):
    """The softmax scale is HF's yarn_apply_mscale of qk_head_dim ** -0.5 (mscale_all_dim
    squared), for V2-Lite's own rope_scaling; RoPE's inv_freq and cos/sin scale equal
    HF's for it too."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_v2

    from pyagent_ref.ops import rope

    lite = dict(
        type="yarn",
        factor=40,
        mscale=0.707,
        mscale_all_dim=0.707,
        original_max_position_embeddings=4096,
        beta_fast=32,
        beta_slow=1,
    )
    cfg = transformers.DeepseekV2Config(
        **(COMMON | dict(max_position_embeddings=163840, rope_scaling=lite, q_lora_rank=None))
    )
    ours = ModelConfig.from_hf(cfg.to_dict() | {"architectures": ["DeepseekV2ForCausalLM"]})
    want = hf_v2.yarn_apply_mscale(cfg.rope_parameters, 24**-0.5)
    assert ours.attention_scale == pytest.approx(want, rel=1e-12)
    assert ours.attention_scale != pytest.approx(24**-0.5)
    hf_rope = hf_v2.DeepseekV2RotaryEmbedding(cfg)
    inv_freq, scale = rope.rope_inv_freq(
        ours.rotary_dim,
        ours.rope_theta,
        ours.rope_scaling,
        ours.max_position_embeddings,
        like=torch.empty(0),
    )
    torch.testing.assert_close(inv_freq, hf_rope.inv_freq, rtol=1e-6, atol=0)
    assert scale == pytest.approx(hf_rope.attention_scaling, rel=1e-12)


# --- the engine -------------------------------------------------------------------------------

ENGINE_PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14],
    [5, 17, 3, 88, 41, 9, 60, 2, 7],  # shares two blocks of 4 with the first
    [8, 1, 96, 45, 45, 12, 7],
]


@pytest.fixture(scope="module")
def engine_dirs(tmp_path_factory):
    """{family: (HF model, directory with it and a BPE tokenizer of its vocabulary)}."""
    from tests.tokenize.helpers import train_byte_level_bpe, write_hf_dir

    tk = train_byte_level_bpe()
    out = {}
    for family in ("v2-lite", "v3"):
        path = tmp_path_factory.mktemp(f"{family}-llm")
        write_hf_dir(path, tk, {"eos_token": "</s>", "bos_token": "<s>"})
        hf = build_hf(family, vocab_size=tk.get_vocab_size(), bos_token_id=None)
        hf.save_pretrained(path)
        out[family] = hf, path
    return out


def hf_greedy(hf, prompt, n):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", ["v2-lite", "v3"])
@pytest.mark.parametrize(
    "engine",
    [
        dict(num_kv_blocks=128, max_num_batched_tokens=8),  # chunked prefill, prefix hits
        dict(num_kv_blocks=10, max_num_batched_tokens=64, enable_prefix_caching=False),
    ],
    ids=["chunked-prefix-cache", "preempting"],
)
def test_engine_greedy_equals_hf_generate(engine_dirs, family, engine):
    from pyagent_ref.engine.llm import LLM

    hf, path = engine_dirs[family]
    llm = LLM(path, block_size=4, max_num_seqs=8, ops="auto", **engine)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in ENGINE_PROMPTS], params)
    for prompt, out in zip(ENGINE_PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8)
    if engine.get("enable_prefix_caching", True):
        assert llm.core.kv.metrics().hits > 0  # the second prompt reused the first's blocks
    else:
        assert sum(out.metrics[0].num_preemptions for out in outs) > 0


def test_preemption_and_prefix_caching_change_no_token(saved):
    """Hypothesis workloads (shared prefixes, small caches that preempt, small token
    budgets that chunk prefills) give the tokens of a roomy engine without prefix caching."""
    model = load_model(saved["v3"][1], progress=False)
    engine = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8, max_num_seqs=4)
    preemptions, hits = [], []

    def run(**changes):
        core = EngineCore(model, EngineConfig(ops="auto", **(engine | changes)))
        requests = [
            Request(str(i), prompt, sampling_params=SamplingParams(temperature=0, max_tokens=n))
            for i, (prompt, n) in enumerate(run.workload)
        ]
        for r in requests:
            core.add_request(r)
        while core.has_unfinished_requests():
            core.step()
        return [r.output_token_ids for r in requests], core

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
        run.workload = [(shared + p, n) for p, n in workload]
        roomy, _ = run(enable_prefix_caching=False)
        tight, core = run(
            num_kv_blocks=num_blocks, max_num_batched_tokens=budget, enable_prefix_caching=True
        )
        assert tight == roomy
        preemptions.append(core.stats.preemptions)
        hits.append(core.kv.metrics().hits)

    check()
    assert sum(preemptions) > 0 and sum(hits) > 0  # the workloads did preempt and hit


def test_the_static_decode_path_a_cuda_graph_replays_draws_the_eager_tokens(saved):
    """graph_mode="static" pads decode batches into the graphs' static buffers (padding
    rows: slot -1, seq_len 0) and runs the absorbed static-shape attention: the tokens of
    the eager engine."""
    model = load_model(saved["v3"][1], progress=False)
    engine = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, ops="auto")
    prompts = [[5, 17, 3, 88, 41], [8, 1, 96], [3, 3, 4, 5, 6, 7, 8]]

    def tokens(**changes):
        core = EngineCore(model, EngineConfig(**(engine | changes)))
        requests = [
            Request(str(i), p, sampling_params=SamplingParams(temperature=0, max_tokens=6))
            for i, p in enumerate(prompts)
        ]
        for r in requests:
            core.add_request(r)
        while core.has_unfinished_requests():
            core.step()
        return [r.output_token_ids for r in requests], core

    static, core = tokens(graph_mode="static", cudagraph_capture_sizes=(1, 4))
    assert core.runner.graphs is not None
    assert static == tokens(graph_mode="eager")[0]


def test_the_decode_attention_reads_no_device_value(saved):
    """On torch's meta device any host read of a value raises: the absorbed decode path
    of the attention (latent write, static-shape attention) passes, so a CUDA graph could
    capture it; the naive path, which sizes its gather on the host, does not. (The MoE
    layers' reference fused_moe reads expert counts on the host: MoE models say
    supports_cuda_graphs False and decode eagerly.)"""
    from pyagent_ref.model import AttentionMetadata

    model = load_model(saved["v3"][1], progress=False)
    assert not model.supports_cuda_graphs
    model = model.to("meta")
    model.build_rotary()
    n, attention = 3, model.layers[0].self_attn
    cache = model.new_kv_cache(8, BLOCK)

    def meta(decode_only):
        return AttentionMetadata(
            slot_mapping=torch.empty(n, dtype=torch.int64, device="meta"),
            block_table=torch.empty(n, 5, dtype=torch.int64, device="meta"),
            query_start_loc=torch.empty(n + 1, dtype=torch.int64, device="meta"),
            seq_lens=torch.empty(n, dtype=torch.int64, device="meta"),
            decode_only=decode_only,
        )

    positions = torch.empty(n, dtype=torch.int64, device="meta")
    hidden = torch.empty(n, 64, device="meta")
    out = attention(positions, hidden, meta(True), cache, model.rotary)
    assert out.shape == (n, 64) and out.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):
        attention(positions, hidden, meta(False), cache, model.rotary)


def test_offloaded_latent_blocks_come_back_unchanged(saved):
    """KV offload moves one latent tensor per layer: prefix blocks evicted to host memory
    and brought back on a hit give the tokens of an engine that recomputes them."""
    from tests.engine.test_kv_offload import engine, run

    model = load_model(saved["v2-lite"][1], progress=False)
    tokens = run(engine(model, ops="auto"))
    core = engine(model, ops="auto", kv_offload={"cpu_blocks": 64})
    assert run(core) == tokens
    assert core.kv.metrics().onboarded_blocks > 0
    block = core.runner.read_block(0, 1)
    assert tuple(block.shape) == (2, 1, 4, 24)  # layers, one latent tensor, block_size, r + p


# --- loading: tensors and config keys ---------------------------------------------------------


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
    ("family", "name"),
    [
        ("v3", "model.layers.0.self_attn.kv_b_proj.weight"),
        ("v3", "model.layers.1.self_attn.q_a_layernorm.weight"),
        ("v2-lite", "model.layers.0.self_attn.q_proj.weight"),
        ("v3", "model.layers.1.mlp.experts.3.up_proj.weight"),
        ("v3", "model.layers.1.mlp.shared_experts.up_proj.weight"),
        ("v3", "model.layers.1.mlp.shared_experts.down_proj.weight"),
        ("v3", "model.layers.1.mlp.gate.e_score_correction_bias"),
    ],
)
def test_a_missing_tensor_is_named_by_its_checkpoint_name(saved, tmp_path, family, name):
    path = _edited_copy(saved[family][1], tmp_path / "m", tensors=lambda t: t.pop(name))
    with pytest.raises(ValueError, match=re.escape(name)):
        load_model(path, progress=False)


def test_multi_token_prediction_layers_are_skipped(saved, tmp_path):
    """V3 checkpoints hold num_nextn_predict_layers extra layers (model.layers.<L>.*) for
    speculative decoding: loaded past, not refused; a layer beyond them has no place."""
    src = saved["v3"][1]

    def mtp(t):
        t["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)
        t["model.layers.2.self_attn.kv_b_proj.weight"] = torch.zeros(112, 16)

    path = _edited_copy(src, tmp_path / "mtp", tensors=mtp)
    assert json.loads((path / "config.json").read_text())["num_nextn_predict_layers"] == 1
    load_model(path, progress=False)

    def beyond(t):
        t["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)

    path = _edited_copy(src, tmp_path / "beyond", tensors=beyond)
    with pytest.raises(ValueError, match=r"'model.layers.3.eh_proj.weight' has no place"):
        load_model(path, progress=False)


@pytest.mark.parametrize(
    ("family", "edit", "message"),
    [
        ("v2", {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc' is not supported"),
        ("v3", {"topk_method": "group_limited_greedy"}, "topk_method 'group_limited_greedy'"),
        ("v3", {"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported"),
        ("v2", {"norm_topk_prob": True}, "norm_topk_prob=True is not supported"),
        ("v3", {"moe_layer_freq": 2}, "moe_layer_freq=2 is not supported"),
        ("v2", {"mlp_bias": True}, "mlp_bias=True is not supported"),
        ("v2", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ("v3", {"n_group": 3}, "n_group must divide n_routed_experts"),
        ("v3", {"num_experts_per_tok": 3}, r"num_experts_per_tok must be in \[1, 2\]"),
        ("v3", {"qk_rope_head_dim": 7}, "qk_rope_head_dim must be even"),
        ("v2", {"kv_lora_rank": None}, "kv_lora_rank must be an int >= 1"),
        (
            "v3",
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
            "quantization_config \\('fp8'\\) is not supported",
        ),
        ("v3", {"n_routed_experts": None}, "n_routed_experts must be an int >= 1"),
    ],
)
def test_unsupported_config_values_name_the_key(saved, tmp_path, family, edit, message):
    def change(cfg):
        cfg.update(edit)
        return {k: v for k, v in cfg.items() if v is not None}

    path = _edited_copy(saved[family][1], tmp_path / "m", config=change)
    with pytest.raises(ValueError, match=message):
        load_model(path, progress=False)


def test_set_prefill_path_rejects_an_unknown_path(saved):
    model = load_model(saved["v3"][1], progress=False)
    with pytest.raises(ValueError, match="path must be one of"):
        model.set_prefill_path("fast")
