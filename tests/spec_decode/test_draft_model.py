"""The draft-model proposer: incremental drafts equal recomputed ones whatever the target
accepted (the rollback), the draft's context bounds them, bad settings are refused when
the engine is built, and the embedded draft of the default model works in the engine."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.model import (  # noqa: E402
    ModelConfig,
    default_draft_model_path,
    default_model_path,
    load_model,
)
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.spec_decode import SpeculativeConfig, make_proposer  # noqa: E402
from pyagent_ref.spec_decode.draft_model import (  # noqa: E402
    DraftModelProposer,
    common_prefix_length,
)
from tests.worker.helpers import tiny_model  # noqa: E402

from .drafts import noisy_copy, save_checkpoint  # noqa: E402

MODEL = tiny_model()  # vocab 50, max_position_embeddings 64


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """A draft that agrees with MODEL on some tokens, not all."""
    return save_checkpoint(noisy_copy(MODEL, 0.5), tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="module")
def draft(draft_dir):
    return load_model(draft_dir, progress=False, ops=load_ops("auto"))


def config(path, k=4):
    return SpeculativeConfig("draft_model", k, model=path)


@settings(deadline=None, max_examples=25)  # ~100 proposals each
@given(
    prompt=st.lists(st.integers(0, 49), min_size=1, max_size=12),
    k=st.integers(1, 4),
    steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 49)), min_size=1, max_size=6),
)
def test_incremental_drafts_equal_recomputed_ones(draft_dir, draft, prompt, k, steps):
    """Each step the target accepts some drafts and adds a token of its own; the cached
    proposer rolls back to what still holds and proposes what a fresh one would."""
    proposer = DraftModelProposer(config(draft_dir, k), draft)
    output: list[int] = []
    for accepted, bonus in steps:
        drafts = proposer.propose("r", prompt, output)
        fresh = DraftModelProposer(config(draft_dir, k), draft).propose("r", prompt, output)
        assert drafts == fresh and len(drafts) == k
        # the cache holds the tokens, then every draft but the last (never fed)
        assert proposer.states["r"].tokens == [*prompt, *output, *drafts[:-1]]
        output += [*drafts[: min(accepted, k)], bonus]
    proposer.finish("r", output)
    assert proposer.states == {}


@settings(deadline=None, max_examples=15)
@given(
    prompts=st.lists(st.lists(st.integers(0, 49), min_size=1, max_size=10), min_size=1, max_size=5),
    k=st.integers(1, 3),
    data=st.data(),
)
def test_batched_drafts_equal_each_requests_own(draft_dir, draft, prompts, k, data):
    """Requests proposed for together (a ragged first pass, then decode passes for those
    that want more drafts), step after step, with requests finishing and new ones taking
    their blocks: each gets the drafts a proposer of its own would give."""
    batched = DraftModelProposer(config(draft_dir, k), draft)
    outputs = {str(i): [] for i in range(len(prompts))}
    for step in range(3):
        live = [rid for rid in outputs if data.draw(st.booleans(), label=f"{rid} at {step}")]
        asked = [(rid, prompts[int(rid)], outputs[rid]) for rid in live]
        got = batched.propose_batch(asked)
        for (rid, prompt, output), drafts in zip(asked, got, strict=True):
            alone = DraftModelProposer(config(draft_dir, k), draft).propose(rid, prompt, output)
            assert drafts == alone
            accepted = data.draw(st.integers(0, len(drafts)))
            outputs[rid] = [*output, *drafts[:accepted], data.draw(st.integers(0, 49))]
        if live and data.draw(st.booleans()):  # one finishes; a new request takes its place
            batched.finish(live[0], outputs.pop(live[0]))
            rid = str(len(prompts))
            prompts.append(data.draw(st.lists(st.integers(0, 49), min_size=1, max_size=10)))
            outputs[rid] = []
    blocks = [state.block for state in batched.states.values()]
    assert len(set(blocks)) == len(blocks)  # no two requests share a block
    capacity = batched.kv_caches[0][0].shape[0] if batched.kv_caches else 0
    assert sorted(blocks + batched._free_blocks) == list(range(capacity))


def test_drafts_of_the_target_itself_are_its_greedy_tokens(tmp_path):
    """With the target as its own draft, the drafts are greedy decoding's next tokens."""
    from pyagent_ref.sample.params import SamplingParams
    from pyagent_ref.sched import Request

    prompt = [3, 1, 4, 1, 5]
    core = EngineCore(MODEL, EngineConfig(num_kv_blocks=16, ops="ref"))
    req = Request("r", prompt, sampling_params=SamplingParams(temperature=0), max_tokens=5)
    core.add_request(req)
    while core.has_unfinished_requests():
        core.step()
    path = save_checkpoint(MODEL, tmp_path / "self")
    proposer = make_proposer(config(path, 5), target=MODEL)
    assert proposer.propose("r", prompt, []) == req.output_token_ids


def test_drafts_stay_within_the_draft_context(tmp_path, draft):
    """Draft j is read at position len(tokens) + j - 2: a 16-position draft proposes
    at most 16 - len(tokens) + 1 drafts, and none past its context."""
    path = save_checkpoint(draft, tmp_path / "short", max_position_embeddings=16)
    proposer = make_proposer(config(path, 5), target=MODEL)
    assert len(proposer.propose("a", list(range(10)), [])) == 5
    assert len(proposer.propose("a", list(range(10)), [1, 2, 3, 4])) == 3
    assert len(proposer.propose("b", list(range(16)), [])) == 1
    assert proposer.propose("c", list(range(16)), [7]) == []
    assert proposer.propose("d", [], []) == []


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 5]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([9], [1]) == 0
    for n in range(40):
        a = list(range(40))
        b = [*a[:n], -1, *a[n + 1 :]]
        assert common_prefix_length(a, b) == n


def test_method_is_inferred_from_the_model_as_in_vllm(draft_dir):
    assert SpeculativeConfig(model=draft_dir).method == "draft_model"
    assert SpeculativeConfig().method == "ngram"
    assert SpeculativeConfig("suffix", model=draft_dir).method == "suffix"


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ({"method": "draft_model"}, ValueError, "method 'draft_model' needs model"),
        ({"model": 3}, TypeError, "model must be None, a str or a Path, got 3"),
        (
            {"model": "x", "num_speculative_tokens": 0},
            ValueError,
            "num_speculative_tokens must be >= 1, got 0",
        ),
    ],
)
def test_bad_settings_are_refused_by_the_config(spec, error, message):
    with pytest.raises(error) as info:
        EngineConfig(speculative_config=spec)
    assert message in str(info.value)


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(config | changes))
    return dst


def test_bad_drafts_are_refused_when_the_engine_is_built(tmp_path, draft_dir):
    def build(path):
        EngineCore(MODEL, EngineConfig(num_kv_blocks=16, speculative_config={"model": path}))

    with pytest.raises(ValueError, match="speculative_config model '.*nowhere' is not a dir"):
        build(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a model directory: no config.json"):
        build(tmp_path / "empty")
    small = save_checkpoint(tiny_model(vocab_size=40), tmp_path / "small")
    with pytest.raises(ValueError, match="draft model vocab_size 40 != target model vocab_size 50"):
        build(small)
    with pytest.raises(ValueError, match="architecture 'NoSuchForCausalLM' is not supported"):
        build(_copy_with_config(draft_dir, tmp_path / "gpt2", architectures=["NoSuchForCausalLM"]))
    with pytest.raises(ValueError, match="needs the target model"):
        make_proposer(config(draft_dir))


def test_the_draft_runs_in_the_target_dtype(draft_dir):
    target = tiny_model().to(torch.bfloat16)
    proposer = make_proposer(config(draft_dir), target=target)
    assert {p.dtype for p in proposer.model.parameters()} == {torch.bfloat16}
    assert len(proposer.propose("r", [1, 2, 3], [])) == 4


def test_the_default_draft_matches_the_default_model():
    path = default_draft_model_path()
    assert {p.name for p in path.iterdir()} >= {"config.json", "model.safetensors", "README.md"}
    draft, target = (
        ModelConfig.from_pretrained(path),
        ModelConfig.from_pretrained(default_model_path()),
    )
    assert draft.vocab_size == target.vocab_size
    assert draft.max_position_embeddings == target.max_position_embeddings
    assert draft.num_hidden_layers < target.num_hidden_layers
    assert sum(f.stat().st_size for f in path.iterdir()) < 4 * 2**20


def test_the_default_draft_keeps_greedy_outputs():
    """Greedy speculative decoding of the default model with its draft: the same tokens
    as plain greedy decoding, and some drafts accepted."""
    from pyagent_ref.engine.llm import LLM
    from pyagent_ref.sample.params import SamplingParams

    spec = {"model": str(default_draft_model_path()), "num_speculative_tokens": 3}
    fast, plain = LLM(None, speculative_config=spec), LLM(None)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["def ", "class Parser:\n"]
    got = [o.outputs[0].token_ids for o in fast.generate(prompts, params)]
    assert got == [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    stats = fast.core.stats.spec
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
