"""Suffix decoding: propose what most often followed the current context.

SuffixDecoding (Oliaro et al., 2024; vLLM's method "suffix") counts which tokens
followed each recent context, in two trees:
- a request tree over the request's own prompt + output (what prompt lookup searches),
- a global tree over the outputs of the last `max_cached_requests` finished requests,
  for workloads (agents, tool loops, rewrites) that produce the same text again and again,
and at each step proposes, from one of them, the most frequent continuation while it
stays likely enough.

**The trees.** A tree over a multiset S of token sequences holds, for every non-empty
token string c of at most D = max_tree_depth tokens, count(c): the number of its
occurrences in the sequences of S (an occurrence lies within one sequence). It is a trie:
one node per string c with count(c) > 0, whose child by token t is the node of c + t.
Appending a token to a sequence ends one new occurrence of each suffix of at most D
tokens that ends there; the nodes of the sequence's current suffixes (its "active
nodes") each move one token down, so an append costs O(D). Taking a sequence out walks
its substrings again and subtracts their counts, deleting the nodes that reach zero.

This is a depth-bounded suffix trie rather than a suffix tree. A path-compressed suffix
tree (Ukkonen's construction) has O(n) nodes for n tokens where the trie has up to
O(n * D); the trie is what fits in a page (an append, a removal, a lookup each a few
lines), and D is small (24 by default). Memory is the price: a 2k-token request with
little repetition makes tens of thousands of nodes, and a full global tree of 10k
requests' outputs would be large in Python objects.

**The proposal.** Let x be the request's tokens (prompt + output), k =
num_speculative_tokens, f = max_spec_factor and p_min = min_token_prob. For each tree T
and each match length m, 1 <= m <= min(len(x), D - 1), such that c = x[-m:] occurs in T:

1. The path: from c, go to the child c + t with the largest count (ties: the smallest
   t), again and again. The probability of t after the current string s is

       p(t | s) = count(s + t) / (sum over t' of count(s + t')),

   the share of the occurrences of s followed by a token that are followed by t (an
   occurrence at the very end of a sequence, like x's own suffix in its request tree,
   is not counted). The j-th token of the path has the cumulative probability
   P_j = p_1 * ... * p_j: the chance that drafts 1 to j are all right if the counts
   tell the truth. The path ends before a token with P_j < p_min, at a string with no
   child, or after L(m) = min(k, floor(f * m), D - m) tokens: a match of m tokens earns
   at most f * m drafts (floor of the float product), and the match and its drafts fit
   in the D tokens a tree holds.
2. Its score is P_1 + ... + P_L, the expected number of accepted drafts.

The proposal is the path with the highest score (ties: the longer match, then the request
tree); every path with a token scores above 0, so it is empty only if no path has one.
Every match length is tried, not just the longest: a long match leaves little room
under D, and a short one earns few drafts under f.

**What the global tree learns.** `finish` adds the request's output as the proposer last
saw it (in its last `propose` call; the tokens of the request's final step are not passed
to `finish`), if it is not empty; prompts stay out. Aborted and failed requests count
like finished ones. When more than max_cached_requests outputs are cached, the oldest is
taken out again (0 turns the global tree off).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .config import SpeculativeConfig


class Node:
    """The node of a string c in a `SuffixTrie`: count(c), and the nodes of c + t by t."""

    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] = {}


class SuffixTrie:
    """count(c) of every string c of 1 to `depth` tokens in a multiset of sequences,
    as a trie (the module docstring says how it is updated)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root = Node()

    def extend(self, active: list[Node], token: int) -> list[Node]:
        """Append `token` to a sequence whose active nodes are `active` (active[i] is the
        node of its suffix of i + 1 tokens; [] for an empty sequence): count the new
        occurrences and return the new active nodes. O(depth)."""
        new_active = []
        for node in [self.root, *active[: self.depth - 1]]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            child.count += 1
            new_active.append(child)
        return new_active

    def add(self, sequence: Sequence[int]) -> None:
        """Count a whole sequence. O(len(sequence) * depth)."""
        active: list[Node] = []
        for token in sequence:
            active = self.extend(active, token)

    def remove(self, sequence: Sequence[int]) -> None:
        """Take back the counts of a sequence that was counted before, deleting the nodes
        that reach zero. O(len(sequence) * depth)."""
        for start in range(len(sequence)):
            node = self.root
            for token in sequence[start : start + self.depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                node = child

    def find(self, tokens: Sequence[int]) -> Node | None:
        """The node of the string `tokens`, or None if it does not occur."""
        node: Node | None = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node


def draft_path(node: Node, limit: int, min_token_prob: float) -> tuple[float, list[int]]:
    """(score, tokens) of the path from `node`: step 1 of the module docstring's rules."""
    tokens: list[int] = []
    prob, score = 1.0, 0.0
    while len(tokens) < limit and node.children:
        token, child = min(node.children.items(), key=lambda item: (-item[1].count, item[0]))
        prob *= child.count / sum(c.count for c in node.children.values())
        if prob < min_token_prob:
            break
        tokens.append(token)
        score += prob
        node = child
    return score, tokens


@dataclass
class _RequestState:
    tree: SuffixTrie
    num_prompt_tokens: int
    tokens: list[int] = field(default_factory=list)  # prompt + output, as far as seen
    active: list[Node] = field(default_factory=list)  # the tree's nodes of its suffixes


class SuffixProposer:
    """Proposes drafts by suffix decoding (the module docstring's rules) with a
    `SpeculativeConfig`'s suffix_decoding_* settings and num_speculative_tokens.

    Per request it keeps a tree of its tokens, extended by the tokens that are new since
    the last `propose` call: the request's prompt must stay the same and its output only
    grow between calls. A call costs O(D) per new token plus O(D * D) for the matches
    in the global tree and the paths' walks (D = max_tree_depth).
    """

    def __init__(self, config: SpeculativeConfig):
        if config.method != "suffix":
            raise ValueError(f"SuffixProposer needs method 'suffix', got {config.method!r}")
        self.config = config
        self.depth = config.suffix_decoding_max_tree_depth
        self.global_tree = SuffixTrie(self.depth)
        self.cached_outputs: deque[list[int]] = deque()  # oldest first
        self._requests: dict[str, _RequestState] = {}

    def propose(
        self, request_id: str, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
    ) -> list[int]:
        """At most num_speculative_tokens drafts, maybe none."""
        state = self._requests.get(request_id)
        if state is None:
            state = _RequestState(SuffixTrie(self.depth), len(prompt_token_ids))
            self._requests[request_id] = state
        seen = len(state.tokens)
        new = [
            *prompt_token_ids[seen:],
            *output_token_ids[max(0, seen - len(prompt_token_ids)) :],
        ]
        for token in new:
            state.active = state.tree.extend(state.active, token)
        state.tokens += new

        c, x = self.config, state.tokens
        best = (0.0, 0, 0, [])  # (score, match length, 1 for the request tree, drafts)
        for m in range(1, min(len(x), self.depth - 1) + 1):
            limit = min(
                c.num_speculative_tokens,
                int(c.suffix_decoding_max_spec_factor * m),
                self.depth - m,
            )
            matches = [(1, state.active[m - 1]), (0, self.global_tree.find(x[-m:]))]
            for is_request_tree, node in matches:
                if node is not None:
                    score, drafts = draft_path(node, limit, c.suffix_decoding_min_token_prob)
                    best = max(best, (score, m, is_request_tree, drafts))
        return best[3]

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Drop the request's tree; its whole output goes to the global tree (even a
        request that was never proposed for)."""
        self._requests.pop(request_id, None)
        limit = self.config.suffix_decoding_max_cached_requests
        output = list(output_token_ids)
        if limit == 0 or not output:
            return
        self.global_tree.add(output)
        self.cached_outputs.append(output)
        if len(self.cached_outputs) > limit:
            self.global_tree.remove(self.cached_outputs.popleft())
