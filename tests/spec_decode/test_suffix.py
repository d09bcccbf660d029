"""Suffix decoding against a brute-force reading of its rules (`spec_decode.suffix`'s
module docstring), what the global tree learns and forgets, and the settings' errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.spec_decode import SpeculativeConfig, SuffixProposer, make_proposer
from pyagent_ref.spec_decode.suffix import SuffixTrie


def count(c: tuple[int, ...], sequences: list[list[int]]) -> int:
    """Occurrences of c in the sequences."""
    n = len(c)
    return sum(tuple(s[i : i + n]) == c for s in sequences for i in range(len(s) - n + 1))


def brute_path(c, sequences, depth, limit, min_prob):
    """Step 1 of the rules, counting occurrences from scratch at every step."""
    tokens, prob, score = [], 1.0, 0.0
    while len(tokens) < limit and len(c) < depth:
        followers = {t: count((*c, t), sequences) for s in sequences for t in s}
        followers = {t: n for t, n in followers.items() if n > 0}
        if not followers:
            break
        token = min(followers, key=lambda t: (-followers[t], t))
        prob *= followers[token] / sum(followers.values())
        if prob < min_prob:
            break
        tokens.append(token)
        score += prob
        c = (*c, token)
    return score, tokens


def brute_force(x, past_outputs, config):
    """The proposal for tokens x, the global tree holding `past_outputs`."""
    depth = config.suffix_decoding_max_tree_depth
    best = (0.0, 0, 0, [])
    for m in range(1, min(len(x), depth - 1) + 1):
        limit = min(
            config.num_speculative_tokens,
            int(config.suffix_decoding_max_spec_factor * m),
            depth - m,
        )
        c = tuple(x[-m:])
        for is_request_tree, sequences in ((1, [x]), (0, past_outputs)):
            if count(c, sequences) > 0:
                min_prob = config.suffix_decoding_min_token_prob
                score, drafts = brute_path(c, sequences, depth, limit, min_prob)
                best = max(best, (score, m, is_request_tree, drafts))
    return best[3]


def trie_counts(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    """Every string in the trie with its count."""
    counts, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            counts[(*path, token)] = child.count
            stack.append(((*path, token), child))
    return counts


def suffix_config(**kwargs) -> SpeculativeConfig:
    return SpeculativeConfig("suffix", **kwargs)


# A 3-token alphabet makes repeats (and ties between continuations) common.
tokens = st.lists(st.integers(0, 2), max_size=14)
configs = st.builds(
    suffix_config,
    num_speculative_tokens=st.integers(1, 5),
    suffix_decoding_max_tree_depth=st.integers(1, 7),
    suffix_decoding_max_cached_requests=st.integers(0, 3),
    suffix_decoding_max_spec_factor=st.sampled_from([0.3, 0.5, 1.0, 1.5, 4]),
    suffix_decoding_min_token_prob=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
)


@given(
    config=configs,
    past=st.lists(st.tuples(tokens, tokens), max_size=4),
    prompt=tokens,
    output=tokens,
    steps=st.lists(st.integers(1, 4), max_size=10),
)
def test_matches_the_brute_force_rules(config, past, prompt, output, steps):
    """Past requests fill the global tree; then the request's output grows by a few
    tokens between calls (the proposer extends its tree incrementally)."""
    proposer = make_proposer(config)
    for i, (past_prompt, past_output) in enumerate(past):
        proposer.propose(f"past-{i}", past_prompt, past_output)
        proposer.finish(f"past-{i}", past_output)
    kept = config.suffix_decoding_max_cached_requests
    cached = [list(o) for _, o in past if o]
    cached = cached[-kept:] if kept else []
    end = 0
    for step in [0, *steps]:
        end = min(end + step, len(output))
        got = proposer.propose("now", prompt, output[:end])
        assert got == brute_force(prompt + output[:end], cached, config)
        assert len(got) <= config.num_speculative_tokens


@given(outputs=st.lists(tokens, max_size=8), kept=st.integers(1, 4), depth=st.integers(1, 5))
def test_eviction_leaves_the_counts_of_a_rebuild(outputs, kept, depth):
    config = suffix_config(
        suffix_decoding_max_tree_depth=depth, suffix_decoding_max_cached_requests=kept
    )
    proposer = SuffixProposer(config)
    for i, output in enumerate(outputs):
        proposer.propose(str(i), [7], output)
        proposer.finish(str(i), output)
    rebuilt = SuffixTrie(depth)
    remaining = [o for o in outputs if o][-kept:]
    for output in remaining:
        rebuilt.add(output)
    assert list(proposer.cached_outputs) == remaining
    assert trie_counts(proposer.global_tree) == trie_counts(rebuilt)


def test_the_global_tree_learns_across_requests():
    proposer = SuffixProposer(suffix_config(num_speculative_tokens=3))
    first_output = [10, 11, 12, 13, 14, 15]
    proposer.propose("a", [1, 2, 3], first_output)
    assert proposer.propose("b", [4, 5], [10, 11]) == []  # "a" is not finished yet
    proposer.finish("a", first_output)
    proposer.finish("b", [10, 11])
    # the prompt of "a" did not go to the global tree; its output did
    assert proposer.propose("c", [4, 1, 2], []) == []
    assert proposer.propose("c", [4, 1, 2], [10, 11]) == [12, 13]  # 2 tokens matched: 2 drafts
    assert proposer.propose("c", [4, 1, 2], [10, 11, 12]) == [13, 14, 15]


def test_ties_go_to_the_longer_match_then_to_the_request_tree():
    proposer = SuffixProposer(suffix_config(num_speculative_tokens=1))
    proposer.propose("a", [], [1, 2, 3])
    proposer.finish("a", [1, 2, 3])
    # [1, 2] is followed by 4 in the request, by 3 in the global tree: both sure
    assert proposer.propose("b", [1, 2, 4], [1, 2]) == [4]
    # [2] is followed by 4 in the request; [1, 2] only by 3, in the global tree
    assert proposer.propose("c", [5, 2, 4, 1], [2]) == [3]


def test_the_request_tree_wins_when_it_is_surer():
    proposer = SuffixProposer(suffix_config(num_speculative_tokens=2))
    proposer.propose("a", [], [1, 2, 3, 1, 2, 4])  # after [1, 2]: 3 or 4
    proposer.finish("a", [1, 2, 3, 1, 2, 4])
    assert proposer.propose("b", [1, 2, 5, 6], [1, 2]) == [5, 6]  # its own: always 5


def test_min_token_prob_is_on_the_cumulative_probability():
    # after [1]: 2 twice, 3 once (P = 2/3); after [1, 2]: 5 once, 6 once (P = 1/3)
    # (a match of one token earns 4 drafts: max_spec_factor 4)
    sequence = [1, 2, 5, 1, 2, 6, 1, 3, 1]
    for min_prob, drafts in ((0, [2, 5, 1, 2]), (1 / 3, [2, 5, 1, 2]), (0.34, [2]), (0.7, [])):
        config = suffix_config(
            suffix_decoding_min_token_prob=min_prob, suffix_decoding_max_spec_factor=4
        )
        assert SuffixProposer(config).propose("a", sequence, []) == drafts


def test_the_tree_depth_bounds_match_and_drafts_together():
    sequence = [1, 2, 3, 4, 5, 6, 1, 2]
    config = suffix_config(num_speculative_tokens=8, suffix_decoding_max_spec_factor=8)
    assert SuffixProposer(config).propose("a", sequence, []) == [3, 4, 5, 6, 1, 2]
    shallow = suffix_config(
        num_speculative_tokens=8,
        suffix_decoding_max_spec_factor=8,
        suffix_decoding_max_tree_depth=4,
    )
    assert SuffixProposer(shallow).propose("a", sequence, []) == [3, 4, 5]  # m=1: 3 drafts


def test_finish_learns_the_whole_output_even_unproposed():
    proposer = SuffixProposer(suffix_config(num_speculative_tokens=2))
    proposer.propose("a", [1], [5])
    proposer.finish("a", [5, 6, 7, 8])  # its last tokens came after the last propose
    proposer.finish("b", [9, 6, 7])  # never proposed for
    assert proposer.propose("c", [2], [6]) == [7]  # 6 -> 7 twice, then 8 or end: sure of 7
    assert list(proposer.cached_outputs) == [[5, 6, 7, 8], [9, 6, 7]]


def test_finish_forgets_the_request_and_ignores_unknown_ids():
    proposer = SuffixProposer(suffix_config(suffix_decoding_max_cached_requests=0))
    proposer.propose("a", [1, 2, 1], [2])
    proposer.finish("a", [2])
    proposer.finish("never-seen", [3])
    assert proposer.propose("a", [1, 2], []) == []  # a new request "a", a new tree
    assert proposer.global_tree.root.children == {}


def test_proposer_needs_the_suffix_method():
    with pytest.raises(ValueError, match="needs method 'suffix', got 'ngram'"):
        SuffixProposer(SpeculativeConfig("ngram"))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"suffix_decoding_max_tree_depth": 0}, ValueError, "max_tree_depth must be >= 1, got 0"),
        (
            {"suffix_decoding_max_cached_requests": -1},
            ValueError,
            "suffix_decoding_max_cached_requests must be >= 0, got -1",
        ),
        (
            {"suffix_decoding_max_tree_depth": 2.0},
            TypeError,
            "suffix_decoding_max_tree_depth must be an int, got 2.0",
        ),
        (
            {"suffix_decoding_max_spec_factor": 0},
            ValueError,
            "suffix_decoding_max_spec_factor must be finite and > 0, got 0",
        ),
        (
            {"suffix_decoding_max_spec_factor": float("inf")},
            ValueError,
            "suffix_decoding_max_spec_factor must be finite and > 0, got inf",
        ),
        (
            {"suffix_decoding_min_token_prob": 1.5},
            ValueError,
            "suffix_decoding_min_token_prob must be in [0, 1], got 1.5",
        ),
        (
            {"suffix_decoding_min_token_prob": float("nan")},
            ValueError,
            "suffix_decoding_min_token_prob must be in [0, 1], got nan",
        ),
        (
            {"suffix_decoding_min_token_prob": "0.1"},
            TypeError,
            "suffix_decoding_min_token_prob must be a number, got '0.1'",
        ),
        (
            {"suffix_decoding_max_spec_factor": True},
            TypeError,
            "suffix_decoding_max_spec_factor must be a number, got True",
        ),
    ],
)
def test_bad_settings_name_the_field_and_value(kwargs, error, message):
    with pytest.raises(error) as info:
        suffix_config(**kwargs)
    assert message in str(info.value)


def test_from_dict_takes_vllm_names():
    config = SpeculativeConfig.from_dict(
        {"method": "suffix", "suffix_decoding_max_tree_depth": 16, "num_speculative_tokens": 8}
    )
    assert isinstance(make_proposer(config), SuffixProposer)
    assert config.suffix_decoding_max_tree_depth == 16
    assert config.suffix_decoding_min_token_prob == 0.1
