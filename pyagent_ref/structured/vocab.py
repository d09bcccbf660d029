"""The vocabulary side of structured output: the bytes of every token, and a trie over them.

A grammar speaks bytes; a model speaks token ids. `token_bytes(tokenizer)` bridges the
two: the exact bytes each token adds to the output. A token is a byte string, not text:
byte-level BPE tokens may end inside a UTF-8 character, so decoding a token on its own
would lose bytes (the decoder writes U+FFFD), which is why the bytes are read from the
vocabulary's own spelling instead:

* byte-level BPE (GPT-2, Llama 3, Qwen; `tokenizer.json` with a ``ByteLevel`` decoder,
  our `BPETokenizer`, tiktoken): each character of the token string stands for one byte
  (``"Ġ"`` for a space, see `tokenize.bpe.byte_level_alphabet`); tiktoken stores the
  bytes themselves;
* SentencePiece-style BPE (Llama 2, Mistral; a decoder that replaces ``"▁"`` by a space,
  with ``ByteFallback``): ``"▁"`` is a space, ``"<0xNN>"`` is the single byte 0xNN, and
  any other token is its UTF-8. The decoder's ``Strip`` of the first space of a text is
  not applied: a token's bytes are what it adds in the middle of an output.

Special tokens (BOS, EOS, chat markers, reserved ids) and ids of no token have no bytes
(None): a grammar never allows them, except EOS, which the matcher allows where the
grammar may end. An added token that is not special is its text in UTF-8.

`TokenTrie` is built once per vocabulary and walked at every decoding step: the tokens
sharing a prefix share the work of checking that prefix against the grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the grammar stages need no tokenizer library
    from ..tokenize.bpe import BPETokenizer
    from ..tokenize.hf import HFTokenizer
    from ..tokenize.protocol import Tokenizer
    from ..tokenize.tiktoken_backend import TiktokenTokenizer

__all__ = ["TokenTrie", "token_bytes"]


def token_bytes(tokenizer: Tokenizer) -> list[bytes | None]:
    """The bytes of every token id: ``result[i]`` for i in ``range(tokenizer.vocab_size)``.

    None for a special token (the tokenizer's ``all_special_ids`` and every added token
    marked special) and for an id that names no token. See the module docstring for how
    each kind of vocabulary spells its tokens.

    Args:
        tokenizer: an `HFTokenizer`, `BPETokenizer` or `TiktokenTokenizer`.
    Raises:
        TypeError: another kind of tokenizer.
        ValueError: an HF tokenizer whose decoder is neither byte-level nor
            SentencePiece-style (WordPiece, ...): its tokens' bytes depend on their context.
    """
    from ..tokenize.bpe import BPETokenizer
    from ..tokenize.hf import HFTokenizer
    from ..tokenize.tiktoken_backend import TiktokenTokenizer

    if isinstance(tokenizer, BPETokenizer):
        table = _bpe_bytes(tokenizer)
    elif isinstance(tokenizer, HFTokenizer):
        table = _hf_bytes(tokenizer)
    elif isinstance(tokenizer, TiktokenTokenizer):
        table = _tiktoken_bytes(tokenizer)
    else:
        raise TypeError(
            f"tokenizer must be an HFTokenizer, BPETokenizer or TiktokenTokenizer, "
            f"got {type(tokenizer).__name__}"
        )
    out: list[bytes | None] = [None] * tokenizer.vocab_size
    special = tokenizer.all_special_ids
    for token_id, spelled in table.items():
        if token_id not in special and 0 <= token_id < len(out):
            out[token_id] = spelled
    return out


def _bpe_bytes(tokenizer: BPETokenizer) -> dict[int, bytes | None]:
    encoding = tokenizer.encoding
    table: dict[int, bytes | None] = {i: spelled for spelled, i in encoding.vocab.items()}
    for added in encoding.added_tokens.values():
        table[added.id] = None if added.special else added.decoded_bytes
    return table


def _tiktoken_bytes(tokenizer: TiktokenTokenizer) -> dict[int, bytes | None]:
    encoding = tokenizer.encoding
    special = {encoding.encode_single_token(text) for text in encoding.special_tokens_set}
    table: dict[int, bytes | None] = {}
    for i in range(encoding.n_vocab):
        if i in special:
            table[i] = None
            continue
        try:
            table[i] = encoding.decode_single_token_bytes(i)
        except KeyError:  # an id of no token
            continue
    return table


def _hf_bytes(tokenizer: HFTokenizer) -> dict[int, bytes | None]:
    data = json.loads(tokenizer.backend.to_str())
    spell = _hf_speller(data.get("decoder"))
    vocab = data["model"].get("vocab", {})
    if isinstance(vocab, list):  # a Unigram model: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    table: dict[int, bytes | None] = {i: spell(token) for token, i in vocab.items()}
    for added in data.get("added_tokens", []):
        table[added["id"]] = None if added["special"] else added["content"].encode("utf-8")
    return table


def _decoder_steps(decoder: dict[str, Any] | None) -> list[dict[str, Any]]:
    if decoder is None:
        return []
    if decoder["type"] == "Sequence":
        return [s for d in decoder["decoders"] for s in _decoder_steps(d)]
    return [decoder]


def _hf_speller(decoder: dict[str, Any] | None) -> Any:
    """token string -> bytes, from a tokenizer.json decoder."""
    steps = _decoder_steps(decoder)
    kinds = {step["type"] for step in steps}
    if "ByteLevel" in kinds:
        from ..tokenize.bpe import byte_level_decoding

        return byte_level_decoding
    spaces = [
        step["pattern"].get("String")
        for step in steps
        if step["type"] == "Replace" and step["content"] == " "
    ] + [step.get("replacement", "▁") for step in steps if step["type"] == "Metaspace"]
    if spaces and spaces[0]:
        space, byte_fallback = spaces[0], "ByteFallback" in kinds

        def spell(token: str) -> bytes:
            if byte_fallback and len(token) == 6 and token.startswith("<0x") and token[5] == ">":
                try:
                    return bytes([int(token[3:5], 16)])
                except ValueError:
                    pass
            return token.replace(space, " ").encode("utf-8")

        return spell
    raise ValueError(
        f"tokenizer: a decoder of {sorted(kinds) or 'no'} steps is neither byte-level nor "
        "SentencePiece-style; its tokens have no fixed bytes"
    )


class TokenTrie:
    """The tokens of a vocabulary in a trie over their bytes, laid out for a linear walk.

    Nodes are numbered in depth-first preorder with children in increasing byte order:
    node 0 is the root (the empty prefix), and each other node i adds the byte
    ``byte[i]`` to its parent's prefix, at depth ``depth[i]`` (the prefix's length). So
    the subtree of node i, the nodes whose prefix extends node i's, is exactly the range
    ``range(i, subtree_end[i])``, and node i + 1 is i's first child if it has one. A walk
    that checks the prefixes against a grammar visits the nodes in order and, when a
    prefix is rejected, jumps to ``subtree_end[i]``, skipping every token that starts
    with it; between two nodes it undoes ``depth[i] - depth[i + 1] + 1`` bytes.

    ``tokens[i]`` are the ids whose bytes are exactly node i's prefix (several ids may
    share bytes). Ids whose bytes are None or empty are in no node.

    Attributes:
        byte, depth, subtree_end, tokens: per node, as above (``byte[0]`` is -1).
        token_bytes: the list the trie was built from (`token_bytes`): id -> bytes or None.
        vocab_size: its length.
    """

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.token_bytes = list(token_bytes)
        self.vocab_size = len(token_bytes)
        ids_of: dict[bytes, list[int]] = {}
        for token_id, spelled in enumerate(token_bytes):
            if spelled:
                ids_of.setdefault(spelled, []).append(token_id)
        self.byte: list[int] = [-1]
        self.depth: list[int] = [0]
        self.tokens: list[tuple[int, ...]] = [()]
        path: list[int] = [0]  # path[d]: the node of depth d on the current branch
        previous = b""
        for spelled in sorted(ids_of):
            shared = _common_prefix(previous, spelled)
            del path[shared + 1 :]
            for d in range(shared, len(spelled)):
                path.append(len(self.byte))
                self.byte.append(spelled[d])
                self.depth.append(d + 1)
                self.tokens.append(())
            self.tokens[path[-1]] = tuple(ids_of[spelled])
            previous = spelled
        self.subtree_end = self._subtree_ends()

    def _subtree_ends(self) -> list[int]:
        """For each node, the first node after its subtree: the next node no deeper."""
        n = len(self.depth)
        end = [n] * n
        open_nodes: list[int] = []  # nodes whose subtree has not ended, deepest last
        for i, d in enumerate(self.depth):
            while open_nodes and self.depth[open_nodes[-1]] >= d:
                end[open_nodes.pop()] = i
            open_nodes.append(i)
        return end

    def __len__(self) -> int:
        """The number of nodes, the root included."""
        return len(self.depth)

    def prefix(self, node: int) -> bytes:
        """The bytes from the root to `node` (for tests and debugging: O(depth))."""
        out = []
        d = self.depth[node]
        for i in range(node, -1, -1):
            if self.depth[i] == d and d > 0:
                out.append(self.byte[i])
                d -= 1
        return bytes(reversed(out))

    def children(self, node: int) -> Iterator[int]:
        """The children of `node`, in increasing byte order."""
        child = node + 1
        while child < self.subtree_end[node]:
            yield child
            child = self.subtree_end[child]


def _common_prefix(a: bytes, b: bytes) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
