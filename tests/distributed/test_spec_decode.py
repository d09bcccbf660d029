"""Speculative decoding on several ranks: the engine's process proposes (n-gram, or a
draft model it loads itself), every rank verifies the drafts in the same step, and the
engine with tensor_parallel_size=2 (n-gram) or pipeline_parallel_size=2 (draft model;
a step's decode rows, one per draft, cut into micro-batches) draws the tokens of one
process with the same proposer (greedy and seeded sampled requests), its acceptance
counters equal to one process's and above zero. Medusa, whose heads read the ranks'
hidden states, is refused by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from pyagent_ref.spec_decode import SpeculativeConfig  # noqa: E402
from tests.spec_decode.drafts import noisy_copy, save_checkpoint  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=96, max_num_batched_tokens=32, max_num_seqs=4, ops="ref")
# repetitive prompts: the random model falls into loops that prompt lookup finds
PROMPTS = [[0, 1, 2, 3] * 5, [3, 2, 1] * 6, [7, 8, 9, 7, 8]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **TINY_LLAMA, eos_token_id=None, bos_token_id=None, pad_token_id=None
    )
    path = tmp_path_factory.mktemp("tiny-llama-spec")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory):
    """A draft that agrees with the target on some tokens, not all."""
    target = load_model(model_dir, dtype="float32", progress=False)
    return save_checkpoint(noisy_copy(target, 0.5), tmp_path_factory.mktemp("draft"))


def _run(core, n=24):
    """Greedy requests and a seeded sampled one; (their tokens, the spec counters)."""
    requests = []
    for i, prompt in enumerate(PROMPTS):
        params = SamplingParams(temperature=0.8 if i == 2 else 0.0, seed=7 + i, max_tokens=n)
        requests.append(Request(str(i), prompt, sampling_params=params, seed=7 + i, max_tokens=n))
    try:
        for r in requests:
            core.add_request(r)
        for _ in range(200):
            if not core.has_unfinished_requests():
                break
            core.step()
        assert not core.has_unfinished_requests()
        spec = core.stats.spec
        counts = (spec.num_draft_tokens, spec.num_accepted_tokens, spec.accepted_per_position)
        return [r.output_token_ids for r in requests], counts
    finally:
        core.shutdown()


def _core(model_dir, spec, **parallel):
    return EngineCore.from_config(
        EngineConfig(model=str(model_dir), **ENGINE, speculative_config=spec, **parallel)
    )


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_verification_on_two_ranks_draws_the_tokens_of_one_process(model_dir, draft_dir, method):
    spec = SpeculativeConfig(
        method, 3, 1, 3, model=str(draft_dir) if method == "draft_model" else None
    )
    plain, _ = _run(_core(model_dir, None))
    want, counts = _run(_core(model_dir, spec))
    # n-gram on two tensor-parallel ranks; the draft model on two pipeline stages
    parallel = dict(tensor_parallel_size=2) if method == "ngram" else dict(pipeline_parallel_size=2)
    core = _core(model_dir, spec, **parallel)
    assert core.executor.backend == "mp"
    got, tp_counts = _run(core)
    assert got == want
    assert [t for i, t in enumerate(got) if i != 2] == [t for i, t in enumerate(plain) if i != 2]
    assert tp_counts == counts and counts[1] > 0  # drafts accepted, counted alike
    assert not any(p.is_alive() for p in core.executor.procs)


def test_medusa_is_refused_by_name(model_dir, tmp_path):
    spec = SpeculativeConfig("medusa", 3, model=str(tmp_path))
    with pytest.raises(ValueError, match="speculative_config method 'medusa'"):
        _core(model_dir, spec, tensor_parallel_size=2)
