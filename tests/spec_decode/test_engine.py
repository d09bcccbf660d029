"""Speculative decoding in the engine: the proofs (greedy outputs equal token for token,
sampled ones equal in distribution) and the bookkeeping (KV rollback, stops, logprobs,
metrics) on a tiny random model."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pyagent_ref import ops  # noqa: E402
from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request, RequestStatus  # noqa: E402
from pyagent_ref.spec_decode import METHODS, SpeculativeConfig, make_proposer  # noqa: E402
from tests.worker.helpers import ENGINE_SETTINGS, tiny_model  # noqa: E402

from .drafts import noisy_copy, save_checkpoint, save_medusa_heads  # noqa: E402

MODEL = tiny_model()

# prompts over 4 token ids, and outputs long enough for the tiny model to fall into a
# loop: repeats are everywhere, so prompt lookup proposes drafts, right and wrong ones
REPETITIVE_WORKLOADS = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=24), st.integers(1, 30)),
    min_size=1,
    max_size=5,
)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """For "draft_model": a draft that agrees with MODEL on some tokens, not all."""
    return save_checkpoint(noisy_copy(MODEL, 0.5), tmp_path_factory.mktemp("draft"))


def make_core(spec=None, block_size=4, num_blocks=64, budget=32, caching=True, max_num_seqs=4):
    return EngineCore(
        MODEL,
        EngineConfig(
            block_size=block_size,
            num_kv_blocks=num_blocks,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=caching,
            speculative_config=spec,
            ops="ref",
        ),
    )


def run(core, requests):
    for r in requests:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    return requests


def request(i, prompt, n, **params):
    params = SamplingParams(**({"temperature": 0.0, "max_tokens": n} | params))
    return Request(str(i), list(prompt), sampling_params=params, seed=i, max_tokens=n)


def greedy_outputs(core, workload, **params):
    reqs = run(core, [request(i, p, n, **params) for i, (p, n) in enumerate(workload)])
    return [r.output_token_ids for r in reqs]


def check_greedy_equality(spec, workload, block_size, num_blocks, budget, caching):
    """Greedy decoding of `workload` with `spec` gives the tokens of greedy decoding,
    and every block comes back at the end."""
    setup = dict(block_size=block_size, num_blocks=num_blocks, budget=budget, caching=caching)
    plain_core = make_core(**setup)
    # few blocks lower max_model_len: a request that does not fit is refused, not run
    assume(all(len(p) + n <= plain_core.max_model_len for p, n in workload))
    plain = greedy_outputs(plain_core, workload)
    core = make_core(spec, **setup)
    assert greedy_outputs(core, workload) == plain
    assert core.kv.pool.num_free_blocks == num_blocks - 1


@pytest.fixture(scope="module")
def medusa_dir(tmp_path_factory):
    """For "medusa": random heads on MODEL's hidden states."""
    return save_medusa_heads(MODEL, tmp_path_factory.mktemp("medusa"))


@pytest.mark.parametrize("method", [m for m in METHODS if m not in ("draft_model", "medusa")])
@settings(deadline=None)
@given(
    workload=REPETITIVE_WORKLOADS,
    k=st.integers(1, 5),
    lookup_max=st.integers(1, 3),
    **ENGINE_SETTINGS,
)
def test_greedy_speculation_equals_greedy_decoding(method, workload, k, lookup_max, **setup):
    """Chunked prefill, prefix caching and preemption (few blocks) included. For
    "suffix", later requests also get drafts from the outputs of earlier ones (the
    global tree)."""
    spec = SpeculativeConfig(method, k, 1, lookup_max)  # each ignores the others' fields
    check_greedy_equality(spec, workload, **setup)


@settings(deadline=None, max_examples=8)  # the draft runs k passes per request and step
@given(workload=REPETITIVE_WORKLOADS, k=st.integers(1, 5), **ENGINE_SETTINGS)
def test_greedy_draft_model_speculation_equals_greedy_decoding(draft_dir, workload, k, **setup):
    """The same with a draft model (a noisy copy of the model: drafts right and wrong)."""
    check_greedy_equality(SpeculativeConfig("draft_model", k, model=draft_dir), workload, **setup)


@settings(deadline=None, max_examples=6)  # a tree step verifies up to 14 nodes
@given(
    workload=REPETITIVE_WORKLOADS,
    k=st.integers(1, 3),
    min_path_prob=st.sampled_from([0.0, 0.002, 0.05]),  # the heads' guesses: 0.04-0.08
    **ENGINE_SETTINGS,
)
def test_greedy_medusa_tree_speculation_equals_greedy_decoding(
    medusa_dir, workload, k, min_path_prob, **setup
):
    """The same with draft trees (Medusa heads, up to 14 nodes on k levels, or the
    likely ones, a tree that changes shape from step to step): the tree masks, the depth
    positions, the accepted path's KV moved next to the known tokens (a wrong move
    changes the later tokens), the rollback of the other nodes."""
    spec = SpeculativeConfig("medusa", k, model=medusa_dir, medusa_min_path_prob=min_path_prob)
    check_greedy_equality(spec, workload, **setup)


def test_medusa_trees_accept_off_the_first_branch(medusa_dir):
    """Trees pay off: some steps accept a node that is not the first child of the node
    before it (a chain of the heads' first guesses would have stopped there), and the
    emitted tokens are greedy decoding's."""
    workload = [([0, 1, 2, 3] * 5, 30), ([3, 2, 1] * 6, 30), ([1, 1, 2] * 4, 30)]
    plain = greedy_outputs(make_core(), workload)
    core = make_core(SpeculativeConfig("medusa", 3, model=medusa_dir), num_blocks=128, budget=64)
    accepted = core.runner._accepted_paths
    off_first_branch = []

    def spy(sched, sampled):
        paths = accepted(sched, sampled)
        for rid, path in paths.items():
            parents = sched.scheduled_spec_decode_parents[rid]
            first = {}
            for i, parent in enumerate(parents):
                first.setdefault(parent, i + 1)
            off_first_branch.extend(v != first[u] for u, v in zip(path, path[1:], strict=False))
        return paths

    core.runner._accepted_paths = spy
    assert greedy_outputs(core, workload) == plain
    assert core.stats.spec.num_accepted_tokens > 0
    assert any(off_first_branch)


def test_drafts_are_accepted_and_counted():
    workload = [([0, 1, 2, 3] * 5, 30), ([3, 2, 1] * 6, 30)]
    plain = greedy_outputs(make_core(), workload)
    core = make_core(SpeculativeConfig("ngram", 4, 1, 3))
    assert greedy_outputs(core, workload) == plain
    stats = core.stats.spec
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
    assert stats.num_draft_tokens == sum(stats.drafts_per_position)
    assert stats.num_accepted_tokens == sum(stats.accepted_per_position)
    assert 1 < stats.mean_accepted_length <= 5
    rates = stats.acceptance_rate_per_position
    assert len(rates) <= 4 and all(0 <= r <= 1 for r in rates)
    # fewer steps than tokens: some steps emitted more than one token
    assert core.stats.steps < sum(len(o) for o in plain) + 2


def test_stop_conditions_cut_the_accepted_drafts():
    """A stop token, max_tokens and min_tokens apply token by token inside a step."""
    prompt = [0, 1, 2, 3] * 5
    plain = greedy_outputs(make_core(), [(prompt, 30)])[0]
    stop = plain[-2]  # in the loop the model ends in: it recurs every few tokens
    spec = SpeculativeConfig("ngram", 4, 1, 3)
    for params in ({"stop_token_ids": [stop]}, {"stop_token_ids": [stop], "min_tokens": 22}):
        ref = run(make_core(), [request(0, prompt, 30, **params)])[0]
        got = run(make_core(spec), [request(0, prompt, 30, **params)])[0]
        assert got.output_token_ids == ref.output_token_ids
        assert got.status == ref.status and got.stop_reason == ref.stop_reason
    for n in (1, 2, 21, 27):
        got = run(make_core(spec), [request(0, prompt, n)])[0]
        assert got.output_token_ids == plain[:n] and got.status == RequestStatus.FINISHED_LENGTH


def test_logprobs_come_one_per_token():
    core = make_core(SpeculativeConfig("ngram", 4, 1, 3))
    req = request(0, [0, 1, 2, 3] * 5, 30, logprobs=2)
    core.add_request(req)
    seen = []
    while core.has_unfinished_requests():
        for out in core.step().outputs:
            assert out.logprobs is not None and len(out.logprobs) == len(out.new_token_ids)
            seen += [lp.sampled_id for lp in out.logprobs]
    assert seen == req.output_token_ids
    assert core.stats.spec.num_accepted_tokens > 0


def test_rejected_drafts_free_their_blocks():
    """With 2-token blocks and 6 drafts, a rejection leaves whole blocks of dead slots;
    they go back to the pool at once, and the runner forgets them. Repetitive prompts
    get drafts; which ones the random model rejects depends on its weights, so several
    prompts run, and at least one must have had a rejection."""
    trimmed = False
    for prompt in ([0, 1, 2, 3] * 5, [5, 9, 5, 7] * 5, [3, 1] * 8 + [4, 4, 6], [8, 2, 8] * 6):
        core = make_core(SpeculativeConfig("ngram", 6, 1, 3), block_size=2)
        req = request(0, prompt, 30)
        core.add_request(req)
        while core.has_unfinished_requests():
            core.step()
            if req.is_finished:
                break
            held = core.kv.get_block_ids(req)[0]
            assert len(held) <= -(-req.num_tokens // 2)  # never a block of dead slots only
            spec = core.stats.last.spec
            if spec is not None and spec.num_accepted_tokens < spec.num_draft_tokens:
                trimmed = True
                assert len(held) == -(-req.num_tokens // 2)
            assert core.runner.batch.states["0"].block_ids[0][: len(held)] == held
        plain = greedy_outputs(make_core(block_size=2), [(req.prompt_token_ids, 30)])[0]
        assert req.output_token_ids == plain
    assert trimmed


@pytest.mark.parametrize("method", [*METHODS, "medusa_dynamic"])
def test_sampled_speculation_keeps_the_distribution(method, medusa_dir, draft_dir):
    """The joint distribution of the first 3 tokens over many seeds: with and without
    speculation (every proposer: linear drafts, draft trees, trees that change shape),
    the same (two-sample chi-square, p > 1e-3). Logit bias leaves 3 tokens, chosen so
    that the drafts are often right and often wrong."""
    stats = pytest.importorskip("scipy.stats")
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    config = {
        "ngram": SpeculativeConfig("ngram", 2, 1, 3),
        "suffix": SpeculativeConfig("suffix", 3),
        "draft_model": SpeculativeConfig("draft_model", 2, model=draft_dir),
        "medusa": SpeculativeConfig("medusa", 2, model=medusa_dir),
        # the random heads give their best guesses 0.04-0.08: some nodes are kept
        "medusa_dynamic": SpeculativeConfig(
            "medusa", 2, model=medusa_dir, medusa_min_path_prob=0.05
        ),
    }[method]
    allowed = (0, 1, 2)
    if method == "medusa_dynamic":  # it proposes what the unbiased model likes
        core = make_core(config)
        core.add_request(request(0, prompt, 3))
        core.step()
        allowed = tuple(dict.fromkeys([*core.scheduler.requests["0"].spec_token_ids, 0, 1, 2]))
        allowed = allowed[:3]
    if method == "draft_model":  # its one draft after first token a is f(a): allow three
        # tokens that f maps into themselves most often, so that drafts are often right
        proposer = make_proposer(config, ops.load("ref"), target=MODEL)
        f = [proposer.propose(str(a), prompt, [a])[0] for a in range(50)]
        allowed = max(itertools.combinations(range(50), 3), key=lambda s: sum(f[a] in s for a in s))
    bias = {t: -100.0 for t in range(50) if t not in allowed}

    def histogram(spec):
        core = make_core(spec, num_blocks=256, budget=256, max_num_seqs=64)
        reqs = []
        for seed in range(600):
            params = SamplingParams(temperature=1.3, max_tokens=3, seed=seed, logit_bias=bias)
            reqs.append(Request(str(seed), prompt, sampling_params=params, seed=seed, max_tokens=3))
        run(core, reqs)
        counts = {}
        for r in reqs:
            key = tuple(r.output_token_ids)
            counts[key] = counts.get(key, 0) + 1
        return counts, core.stats.spec

    plain, _ = histogram(None)
    spec, spec_stats = histogram(config)
    assert spec_stats.num_accepted_tokens > 0
    assert spec_stats.num_accepted_tokens < spec_stats.num_draft_tokens
    keys = sorted(set(plain) | set(spec))
    table = [[plain.get(k, 0) for k in keys], [spec.get(k, 0) for k in keys]]
    assert stats.chi2_contingency(table).pvalue > 1e-3
    assert sum(table[0]) == sum(table[1]) == 600


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ({"num_speculative_tokens": 0}, ValueError, "num_speculative_tokens must be >= 1, got 0"),
        ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, ValueError, "prompt_lookup_min=4"),
        ({"drafts": 2}, ValueError, "speculative_config has unknown keys ['drafts']"),
        ("ngram", TypeError, "speculative_config must be None, a SpeculativeConfig or a dict"),
    ],
)
def test_bad_speculative_config_names_the_field(value, error, message):
    with pytest.raises(error) as info:
        EngineConfig(speculative_config=value)
    assert message in str(info.value)


def test_medusa_heads_that_do_not_fit_the_model_are_refused_by_name(tmp_path):
    """The embedded model's heads (hidden 256) on the tiny model, and a directory
    without heads: clear errors when the engine is built."""
    with pytest.raises(ValueError, match=r"Medusa heads of hidden size 256 .* hidden size"):
        make_core(SpeculativeConfig("medusa"))
    with pytest.raises(ValueError, match=r"holds no Medusa heads config.json"):
        make_core(SpeculativeConfig("medusa", model=tmp_path))
