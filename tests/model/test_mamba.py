"""Mamba-2 and Bamba (Mamba-2 layers among attention layers) against HF.

Each family is a tiny random HF model built from transformers' own config class (HF runs
its PyTorch fallbacks of the Mamba kernels) and saved with HF's tensor names; our loader
reads it on the reference ops and on "auto" (the accelerator's twins where it has them).
Logits must equal HF's within TOL (float32) for a whole-prompt prefill, a chunked prefill
(the state carried from one chunk to the next through the request's slot) and
step-by-step decoding, through `ssd_scan` ("general") or the static-shape
`selective_state_update` a CUDA graph captures ("static"). Greedy generation through
`LLM(model=dir)` must equal HF's generate with chunked prefill and with preemption, and
hypothesis workloads that preempt and chunk must give the tokens of a roomy engine.

The chunk size of the SSD scan is 4 (HF's chunk_size, ours the same), so the 11-token
prompt spans three chunks of the dual form and the cross-chunk recurrence is exercised.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.engine.core import EngineConfig, EngineCore, kv_cache_groups  # noqa: E402
from pyagent_ref.kv_cache import FullAttentionSpec, MambaSpec  # noqa: E402
from pyagent_ref.model import AttentionMetadata, load_model  # noqa: E402
from pyagent_ref.model.mamba import Mamba2Mixer  # noqa: E402
from pyagent_ref.ops import block_table as bt  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.model.test_hf_parity import BLOCK, PROMPTS, hf_logits  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)
MIXER = dict(n_groups=2, state_size=8, expand=2, conv_kernel=4, chunk_size=4)
FAMILIES = {
    "mamba2": (
        transformers.Mamba2Config,
        transformers.Mamba2ForCausalLM,
        dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16) | MIXER,
    ),
    "bamba": (
        transformers.BambaConfig,
        transformers.BambaForCausalLM,
        dict(
            vocab_size=97,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            attn_layer_indices=[1],
            max_position_embeddings=128,
        )
        | {f"mamba_{k}": v for k, v in MIXER.items() if k not in ("state_size", "conv_kernel")}
        | dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_d_conv=4),
    ),
}


def build_hf(family, **overrides):
    """A tiny random HF model of `family` (seeded, eval mode, eager attention)."""
    config_cls, model_cls, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**(kwargs | overrides))
    config._attn_implementation = "eager"
    return model_cls(config).eval()


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
    params=[(family, ops) for family in FAMILIES for ops in ("ref", "auto")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def pair(request, saved):
    family, ops_name = request.param
    hf, path = saved[family]
    return hf, load_model(path, dtype="float32", progress=False, ops=load_ops(ops_name))


class StateRunner:
    """Feeds chunks of several sequences through a model with state layers: attention
    layers through a paged cache, each Mamba layer through its state slots, request r
    holding slot r + 1 (slot 0 is the null slot), as the engine's state group does."""

    def __init__(self, model, num_blocks=64, decode_path="general"):
        self.model, self.static_decode = model, decode_path == "static"
        self.state_layers = set(model.state_layers())
        self.caches = [
            model.new_state_cache(8) if i in self.state_layers else model.new_kv_cache(64, BLOCK)
            for i in range(len(model.layers))
        ]
        self.next_block, self.tables, self.lengths = 1, {}, {}

    def step(self, chunks: dict[int, list[int]]) -> torch.Tensor:
        """Run one step: request id -> new tokens. Returns logits of every new token."""
        ids, positions, qsl, seq_lens = [], [], [0], []
        for rid, tokens in chunks.items():
            start = self.lengths.get(rid, 0)
            end = self.lengths[rid] = start + len(tokens)
            table = self.tables.setdefault(rid, [])
            while len(table) * BLOCK < end:
                table.append(self.next_block)
                self.next_block += 1
            ids += tokens
            positions += range(start, end)
            qsl.append(qsl[-1] + len(tokens))
            seq_lens.append(end)
        width = max(len(self.tables[r]) for r in chunks)
        table = torch.tensor([self.tables[r] + [0] * (width - len(self.tables[r])) for r in chunks])
        qsl_t, pos_t = torch.tensor(qsl), torch.tensor(positions)
        decode_only = self.static_decode and len(ids) == len(chunks)
        common = dict(query_start_loc=qsl_t, seq_lens=torch.tensor(seq_lens))
        paged = AttentionMetadata(
            slot_mapping=bt.compute_slot_mapping(table, qsl_t, pos_t, BLOCK),
            block_table=table,
            decode_only=decode_only,
            **common,
        )
        slots = torch.tensor([[r + 1] for r in chunks])
        state = AttentionMetadata(
            slot_mapping=torch.zeros(len(ids), dtype=torch.int64),
            block_table=slots,
            decode_only=decode_only,
            **common,
        )
        metas = [state if i in self.state_layers else paged for i in range(len(self.caches))]
        with torch.no_grad():
            return self.model.compute_logits(
                self.model(torch.tensor(ids), pos_t, metas, self.caches)
            )


def test_the_mixers_replace_attention_in_the_mamba_layers(saved):
    mamba2 = load_model(saved["mamba2"][1], progress=False)
    assert mamba2.config.layer_types == ("mamba", "mamba")
    assert all(isinstance(layer.self_attn, Mamba2Mixer) for layer in mamba2.layers)
    assert all(layer.mlp is None for layer in mamba2.layers)
    bamba = load_model(saved["bamba"][1], progress=False)
    assert bamba.config.layer_types == ("mamba", "full_attention", "mamba")
    assert [isinstance(layer.self_attn, Mamba2Mixer) for layer in bamba.layers] == [1, 0, 1]
    assert all(layer.mlp is not None for layer in bamba.layers)


def test_prefill_matches(pair):
    hf, ours = pair
    logits = StateRunner(ours).step({0: PROMPTS[0], 1: PROMPTS[1]})
    n0 = len(PROMPTS[0])
    torch.testing.assert_close(logits[:n0], hf_logits(hf, PROMPTS[0]), **TOL)
    torch.testing.assert_close(logits[n0:], hf_logits(hf, PROMPTS[1]), **TOL)


@pytest.mark.parametrize("decode_path", ["general", "static"])
def test_chunked_prefill_and_decode_match(pair, decode_path):
    """Request 0 in chunks of 5 and 6 (the second continues from the state the first
    left in its slot), request 1 whole, then greedy decode steps."""
    hf, ours = pair
    runner = StateRunner(ours, decode_path=decode_path)
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


def test_a_dropped_state_changes_the_logits(saved):
    """Guards against a test blind to the carried state: continuing the second chunk
    from a zeroed slot moves the logits far past TOL."""
    hf, path = saved["mamba2"]
    runner = StateRunner(load_model(path, dtype="float32", progress=False))
    runner.step({0: PROMPTS[0][:5]})
    for conv, ssm in runner.caches:
        conv.zero_()
        ssm.zero_()
    out = runner.step({0: PROMPTS[0][5:]})
    assert (out - hf_logits(hf, PROMPTS[0])[5:]).abs().max() > 1e-2


def test_the_state_group_holds_every_mamba_layer(saved):
    """kv_cache_groups: one MambaSpec group of every Mamba layer (a slot's bytes: the
    convolution's conv_kernel - 1 inputs in the model's dtype, the float32 SSM state);
    Bamba's attention layer in a full-attention group of its own."""
    model = load_model(saved["bamba"][1], progress=False)
    groups = kv_cache_groups(model.config, BLOCK, dtype_bytes=2)
    conv_dim = 2 * 64 + 2 * 2 * 8  # expand x hidden + 2 x groups x state
    state = MambaSpec(BLOCK, conv_dim * 3 * 2 + 8 * 16 * 8 * 4)
    assert [(g.spec, g.layer_names) for g in groups] == [
        (state, ("layers.0", "layers.2")),
        (FullAttentionSpec(BLOCK, 2, 16, 2), ("layers.1",)),
    ]
    conv, ssm = model.new_state_cache(5)
    assert conv.shape == (5, conv_dim, 3) and conv.dtype == model.embed_tokens.weight.dtype
    assert ssm.shape == (5, 8, 16, 8) and ssm.dtype == torch.float32


def test_decode_reads_no_device_value_and_graphs_are_supported(saved):
    """On torch's meta device any host read of a value raises: a Mamba layer's decode
    step (slots, convolution, state update) passes, so a CUDA graph can capture it; the
    prefill path (ssd_scan cuts sequences on the host) does not."""
    model = load_model(saved["bamba"][1], progress=False)
    assert model.supports_cuda_graphs
    model = model.to("meta")
    model.build_rotary()
    n, mixer = 3, model.layers[0].self_attn
    cache = tuple(t.to("meta") for t in model.new_state_cache(4))

    def meta(decode_only):
        return AttentionMetadata(
            slot_mapping=torch.empty(n, dtype=torch.int64, device="meta"),
            block_table=torch.empty(n, 1, dtype=torch.int64, device="meta"),
            query_start_loc=torch.empty(n + 1, dtype=torch.int64, device="meta"),
            seq_lens=torch.empty(n, dtype=torch.int64, device="meta"),
            decode_only=decode_only,
        )

    positions = torch.empty(n, dtype=torch.int64, device="meta")
    hidden = torch.empty(n, 64, device="meta")
    out = mixer(positions, hidden, meta(True), cache, model.rotary)
    assert out.shape == (n, 64) and out.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):
        mixer(positions, hidden, meta(False), cache, model.rotary)


# --- the engine -------------------------------------------------------------------------------

ENGINE_PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14],
    [5, 17, 3, 88, 41, 9, 60, 2, 7],
    [8, 1, 96, 45, 45, 12, 7],
]


@pytest.fixture(scope="module")
def engine_dirs(tmp_path_factory):
    """{family: (HF model, directory with it and a BPE tokenizer of its vocabulary)}."""
    from tests.tokenize.helpers import train_byte_level_bpe, write_hf_dir

    tk = train_byte_level_bpe()
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(f"{family}-llm")
        write_hf_dir(path, tk, {"eos_token": "</s>", "bos_token": "<s>"})
        hf = build_hf(family, vocab_size=tk.get_vocab_size())
        hf.save_pretrained(path)
        out[family] = hf, path
    return out


def hf_greedy(hf, prompt, n):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(
    "engine",
    [
        dict(num_kv_blocks=128, max_num_batched_tokens=8),  # chunked prefill
        dict(num_kv_blocks=8, max_num_batched_tokens=64),  # Bamba's attention preempts
    ],
    ids=["chunked", "tight"],
)
def test_engine_greedy_equals_hf_generate(engine_dirs, family, engine, caplog):
    from pyagent_ref.engine.llm import LLM

    hf, path = engine_dirs[family]
    with caplog.at_level(logging.WARNING):
        llm = LLM(path, block_size=4, max_num_seqs=8, ops="auto", **engine)
    assert "prefix caching is disabled for" in caplog.text
    assert not llm.core.kv.enable_caching
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in ENGINE_PROMPTS], params)
    for prompt, out in zip(ENGINE_PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 8)
    if family == "bamba" and engine["num_kv_blocks"] == 8:
        assert sum(out.metrics[0].num_preemptions for out in outs) > 0


def test_preemption_and_chunking_change_no_token(saved):
    """Hypothesis workloads (small caches that preempt, small token budgets that chunk
    prefills, few state slots) give the tokens of a roomy engine; every state slot is
    back in its pool at the end."""
    model = load_model(saved["bamba"][1], progress=False)
    engine = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=64, max_num_seqs=4)
    preemptions = []

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
        pool = core.kv.coordinator.state_pool
        assert pool.num_free_blocks == pool.num_blocks - 1  # every slot but the null one
        return [r.output_token_ids for r in requests], core

    @settings(deadline=None, max_examples=2, derandomize=True)
    @given(
        workload=st.lists(
            st.tuples(st.lists(st.integers(3, 96), min_size=1, max_size=20), st.integers(1, 8)),
            min_size=2,
            max_size=4,
        ),
        num_blocks=st.integers(12, 24),
        budget=st.integers(4, 12),
        seqs=st.integers(1, 3),
    )
    @example(  # four requests of 28 tokens cannot all fit 12 blocks of 4: preemption
        workload=[(list(range(10 + i, 30 + i)), 8) for i in range(4)],
        num_blocks=12,
        budget=8,
        seqs=3,
    )
    def check(workload, num_blocks, budget, seqs):
        run.workload = workload
        roomy, _ = run()
        tight, core = run(
            num_kv_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=seqs
        )
        assert tight == roomy
        preemptions.append(core.stats.preemptions)

    check()
    assert sum(preemptions) > 0  # the workloads did preempt


def test_the_static_decode_path_a_cuda_graph_replays_draws_the_eager_tokens(saved):
    """graph_mode="static" pads decode batches into the graphs' static buffers (padding
    rows: seq_len 0, the null slot) and steps the state with selective_state_update:
    the tokens of the eager engine."""
    model = load_model(saved["bamba"][1], progress=False)
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


def test_an_aborted_request_gives_its_slot_back(saved):
    model = load_model(saved["mamba2"][1], progress=False)
    core = EngineCore(model, EngineConfig(block_size=4, num_kv_blocks=16, max_num_seqs=2))
    pool = core.kv.coordinator.state_pool
    params = SamplingParams(temperature=0, max_tokens=50)
    for i in range(2):
        core.add_request(Request(str(i), [5, 6, 7], sampling_params=params))
    core.step()
    assert pool.num_free_blocks == pool.num_blocks - 3  # null slot + one per request
    core.abort_requests(["0"])
    assert pool.num_free_blocks == pool.num_blocks - 2


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
            "speculative_config is not supported for Mamba2ForCausalLM",
        ),
        (dict(kv_offload={"cpu_blocks": 8}), "kv_offload is not supported for Mamba2ForCausalLM"),
    ],
)
def test_options_a_state_cannot_serve_are_refused_by_name(saved, option, message):
    model = load_model(saved["mamba2"][1], progress=False)
    with pytest.raises(ValueError, match=message):
        EngineCore(model, EngineConfig(block_size=4, num_kv_blocks=16, **option))


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
        ("mamba2", "backbone.layers.1.mixer.A_log"),
        ("mamba2", "backbone.layers.0.mixer.norm.weight"),
        ("mamba2", "backbone.norm_f.weight"),
        ("bamba", "model.layers.2.mamba.conv1d.weight"),
        ("bamba", "model.layers.0.feed_forward.up_proj.weight"),
        ("bamba", "model.layers.1.pre_ff_layernorm.weight"),
        ("bamba", "model.final_layernorm.weight"),
    ],
)
def test_a_missing_tensor_is_named_by_its_checkpoint_name(saved, tmp_path, family, name):
    path = _edited_copy(saved[family][1], tmp_path / "m", tensors=lambda t: t.pop(name))
    with pytest.raises(ValueError, match=re.escape(name)):
        load_model(path, progress=False)


@pytest.mark.parametrize(
    ("family", "edit", "message"),
    [
        ("mamba2", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ("mamba2", {"time_step_limit": [0.0, 0.1]}, "time_step_limit .* is not supported"),
        ("mamba2", {"n_groups": 3}, r"n_groups \(3\) must divide num_heads \(8\)"),
        ("mamba2", {"head_dim": 8}, "num_heads x head_dim .* must equal expand x hidden_size"),
        ("bamba", {"mamba_n_groups": 3}, r"mamba_n_groups \(3\) must divide mamba_n_heads"),
        ("bamba", {"mamba_d_conv": 0}, "mamba_d_conv"),
    ],
)
def test_unsupported_config_values_name_the_key(saved, tmp_path, family, edit, message):
    def change(cfg):
        cfg.update(edit)
        return cfg

    path = _edited_copy(saved[family][1], tmp_path / "m", config=change)
    with pytest.raises(ValueError, match=message):
        load_model(path, progress=False)
