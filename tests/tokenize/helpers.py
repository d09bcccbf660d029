"""Tokenizers made on the spot: no network, no downloaded files."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Multi-byte text on purpose: 2-byte (accents), 3-byte (CJK, kana) and 4-byte (emoji) UTF-8.
CORPUS = [
    "Hello world, this is a small corpus for a byte-level BPE tokenizer.",
    "Café, naïve, résumé, déjà vu, Ångström, señor, Zürich, façade.",
    "日本語のテキストです。東京は大きい都市です。中文也可以。",
    "こんにちは世界！おはようございます。",
    "Emoji: 😀 🎉 🚀 👍🏽 ❤️ 🇫🇷 and 🤖 robots.",
    "Mixed: naïve 日本 🎉 café 😀 done.",
    "def main():\n    print('hello')\n    return 42\n",
]

SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<pad>"]


def train_byte_level_bpe(vocab_size: int = 520, special_tokens: list[str] = SPECIALS) -> Tokenizer:
    """A GPT-2-style byte-level BPE trained on CORPUS (a second or so)."""
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS * 4, trainer)
    return tk


def with_bos_post_processor(tk: Tokenizer, bos: str = "<s>") -> Tokenizer:
    """A copy of ``tk`` whose post-processor adds ``bos`` (like Llama's tokenizer.json)."""
    out = Tokenizer.from_str(tk.to_str())
    out.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tk.token_to_id(bos))]
    )
    return out


def write_hf_dir(
    path: Path,
    tk: Tokenizer,
    config: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """A checkpoint directory: tokenizer.json, tokenizer_config.json and extra text files."""
    path.mkdir(parents=True, exist_ok=True)
    tk.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- tiktoken

TIKTOKEN_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIKTOKEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_ranks(tk: Tokenizer) -> dict[bytes, int]:
    """tiktoken mergeable ranks with the same merges as the byte-level BPE ``tk``.

    Ranks 0..255 are the single bytes; each merge of ``tk`` (in order) adds the bytes of
    the merged token, so every token is reachable by merging, as tiktoken requires.
    """
    byte_of = {c: b for b, c in _byte_alphabet().items()}
    ranks = {bytes([b]): b for b in range(256)}
    merges = json.loads(tk.to_str())["model"]["merges"]
    for merge in merges:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        token = bytes(byte_of[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    return ranks


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE token strings use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tiktoken_dir(path: Path, ranks: dict[bytes, int], config: dict[str, Any]) -> Path:
    """A directory with ``tokenizer.tiktoken`` (base64 token, rank) and tiktoken_config.json."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token, rank in ranks.items()]
    (path / "tokenizer.tiktoken").write_text("\n".join(lines) + "\n", encoding="ascii")
    (path / "tiktoken_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- references

# Text that exercises 1-, 2-, 3- and 4-byte UTF-8.
ALPHABET = "ab é日本😀🎉👍🏽\n"


@st.composite
def id_batches(draw: Any, tok: Any) -> list[list[int]]:
    """Generated ids in batches: random ids (broken UTF-8 included) mixed with real text."""
    specials = sorted(tok.all_special_ids)
    piece = st.one_of(
        st.lists(st.integers(0, tok.vocab_size - 1), max_size=6),
        st.text(ALPHABET, max_size=8).map(lambda t: tok.encode(t, add_special_tokens=False)),
        st.lists(st.sampled_from(specials), min_size=1, max_size=2),
    )
    ids = [i for p in draw(st.lists(piece, max_size=6)) for i in p]
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), max_size=len(ids))))
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def single_shot(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """The expected output, by brute force: scan end positions left to right; at the first
    one where some stop string ends, cut there (the longest such string wins)."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stop if text[:end].endswith(s)]
        if hits:
            s = max(hits, key=len)
            return (text[:end] if include else text[: end - len(s)]), s
    return text, None
