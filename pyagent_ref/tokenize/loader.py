"""Pick the tokenizer backend a checkpoint directory needs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from .protocol import Tokenizer
from .tiktoken_backend import TIKTOKEN_CONFIG

__all__ = ["TOKENIZER_BACKENDS", "load_tokenizer"]

TOKENIZER_BACKENDS = ("library", "pyagent", "auto")
"""The values of ``load_tokenizer(backend=...)``."""


def load_tokenizer(
    model_dir: str | Path,
    backend: Literal["library", "pyagent", "auto"] = "library",
    encoding_class: type | None = None,
) -> Tokenizer:
    """Load the tokenizer stored in ``model_dir`` (or in a .gguf file's metadata:
    `pyagent_ref.quant.gguf.load_gguf_tokenizer`).

    * ``tokenizer.json`` present: with ``backend="library"``,
      `HFTokenizer.from_pretrained` (the `tokenizers` library); with ``"pyagent"``,
      `BPETokenizer.from_pretrained` (this package's byte-level BPE, `tokenize.bpe`);
      with ``"auto"``, `BPETokenizer` where it supports the tokenizer (byte-level BPE:
      GPT-2, Llama 3, Qwen2 families), else `HFTokenizer`. Both give the same ids and text.
      ``encoding_class`` is the `BytePairEncoding` class `BPETokenizer` uses (default the
      reference's; the engine passes pyagent_accel's Rust twin when it runs on it);
    * else a ``*.tiktoken`` rank file and ``tiktoken_config.json``:
      `TiktokenTokenizer.from_pretrained` (needs the optional `tiktoken` package), whatever
      ``backend`` says.

    Raises:
        FileNotFoundError: ``model_dir`` is not a directory, or holds neither kind of
            tokenizer (the message says what was looked for and what is missing).
        UnsupportedTokenizerError: ``backend="pyagent"`` and a tokenizer.json that
            `BPETokenizer` does not implement (a ValueError; the message names the feature).
        ValueError: an unknown ``backend``, or the files are there but malformed.
        ImportError: a tiktoken checkpoint without the `tiktoken` package.
    """
    if backend not in TOKENIZER_BACKENDS:
        raise ValueError(f"backend must be one of {TOKENIZER_BACKENDS}, got {backend!r}")
    root = Path(model_dir)
    if root.suffix == ".gguf" and root.is_file():  # the vocabulary in a llama.cpp file
        from ..quant.gguf import load_gguf_tokenizer

        return load_gguf_tokenizer(root, backend, encoding_class)
    if not root.is_dir():
        raise FileNotFoundError(f"model_dir {str(model_dir)!r} is not a directory")
    if (root / "tokenizer.json").is_file():
        if backend != "library":
            from .bpe import BPETokenizer, UnsupportedTokenizerError

            try:
                return BPETokenizer.from_pretrained(root, encoding_class)
            except UnsupportedTokenizerError:
                if backend == "pyagent":
                    raise
        from .hf import HFTokenizer

        return HFTokenizer.from_pretrained(root)
    rank_files = sorted(root.glob("*.tiktoken"))
    has_config = (root / TIKTOKEN_CONFIG).is_file()
    if rank_files and has_config:
        from .tiktoken_backend import TiktokenTokenizer

        return TiktokenTokenizer.from_pretrained(root)
    if rank_files:
        missing = (
            f"it has the tiktoken rank file {rank_files[0].name} but no {TIKTOKEN_CONFIG} "
            f"(the regex pattern and special tokens)"
        )
    elif (root / "tokenizer.model").is_file():
        missing = (
            "it has only a sentencepiece tokenizer.model: write a tokenizer.json once with "
            "transformers (AutoTokenizer.from_pretrained(dir).save_pretrained(dir))"
        )
    else:
        missing = "it has neither"
    raise FileNotFoundError(
        f"model_dir {str(model_dir)!r} holds no tokenizer: expected tokenizer.json "
        f"(Hugging Face) or a *.tiktoken rank file with {TIKTOKEN_CONFIG}; {missing}"
    )
