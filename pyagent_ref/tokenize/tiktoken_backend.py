"""tiktoken tokenizers: a BPE rank file, a pre-tokenization regex and special tokens.

`tiktoken` is an optional dependency (``pip install 'pyagent[tiktoken]'``), imported only
when a `TiktokenTokenizer` is built.

A rank file (``*.tiktoken``) has one token per line: the token's bytes in base64, a space,
and its rank, which is also its id. Lower ranks merge first. A checkpoint directory holds
one rank file and a ``tiktoken_config.json`` that this package defines::

    {
      "pattern": "<the pre-tokenization regex>",          (required)
      "special_tokens": {"<|endoftext|>": 100257, ...},   (optional, text -> id)
      "rank_file": "cl100k_base.tiktoken",                (optional: the only *.tiktoken)
      "bos_token": null, "eos_token": "<|endoftext|>", "pad_token": null,
      "add_bos_token": false, "add_eos_token": false,
      "model_max_length": 8192,
      "chat_template": "..."                              (optional, or a *.jinja file)
    }

Token strings (`convert_ids_to_tokens`) spell a token's bytes one Latin-1 character per
byte, so ``b"\\xc3\\xa9"`` is ``"Ã©"``; `convert_tokens_to_string` joins them, turns them
back into bytes and decodes UTF-8, replacing invalid or incomplete sequences by U+FFFD
(tiktoken's own ``decode`` does the same).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import read_json_object
from ._base import (
    TokenizerBase,
    check_flag,
    check_max_length,
    check_text,
    check_token_ids,
    normalize_chat_templates,
    tokens_of_ids,
)
from .chat import load_chat_templates

if TYPE_CHECKING:
    import tiktoken

__all__ = ["TIKTOKEN_CONFIG", "TiktokenTokenizer", "read_tiktoken_ranks"]

TIKTOKEN_CONFIG = "tiktoken_config.json"
_CONFIG_KEYS = frozenset(
    {
        "pattern",
        "special_tokens",
        "rank_file",
        "bos_token",
        "eos_token",
        "pad_token",
        "add_bos_token",
        "add_eos_token",
        "model_max_length",
        "chat_template",
    }
)


def import_tiktoken() -> Any:
    """The `tiktoken` module, or an ImportError that says how to install it."""
    try:
        import tiktoken
    except ImportError as exc:
        raise ImportError(
            "the tiktoken tokenizer backend needs the optional `tiktoken` package: "
            "pip install 'pyagent[tiktoken]'"
        ) from exc
    return tiktoken


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` rank file into ``{token bytes: rank}``.

    Each non-empty line is ``<base64 token> <rank>``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed line, a negative rank, or a token or rank seen twice (the
            message gives the file and line number).
    """
    path = Path(path)
    ranks: dict[bytes, int] = {}
    seen_ranks: set[int] = set()
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError("expected '<base64 token> <rank>'")
                token = base64.b64decode(parts[0], validate=True)
                rank = int(parts[1])
            except (ValueError, binascii.Error) as exc:
                raise ValueError(f"{path}:{lineno}: bad rank line {line!r}: {exc}") from exc
            if rank < 0:
                raise ValueError(f"{path}:{lineno}: rank must be >= 0, got {rank}")
            if token in ranks:
                raise ValueError(f"{path}:{lineno}: token {token!r} listed twice")
            if rank in seen_ranks:
                raise ValueError(f"{path}:{lineno}: rank {rank} listed twice")
            ranks[token] = rank
            seen_ranks.add(rank)
    return ranks


class TiktokenTokenizer(TokenizerBase):
    """A `tiktoken.Encoding` behind the engine's `Tokenizer` protocol.

    ``encode`` turns special-token text inside the input into special ids (a chat template
    writes them as text), and with ``add_special_tokens=True`` puts BOS / EOS around the
    ids if ``add_bos_token`` / ``add_eos_token``.

    Args:
        encoding: the tiktoken encoding.
        bos_token, eos_token, pad_token: special-token texts of the encoding, or None.
        add_bos_token, add_eos_token: what ``add_special_tokens=True`` adds.
        chat_templates: one template source, or sources by name.
        model_max_length: the configured context length, or None.

    Raises:
        ImportError: tiktoken is not installed.
        TypeError: ``encoding`` is not a `tiktoken.Encoding`, or another wrong type.
        ValueError: a named token the encoding cannot encode as one token, or a flag that
            asks for a token that is not set.
    """

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_templates: str | Mapping[str, str] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        tiktoken = import_tiktoken()
        if not isinstance(encoding, tiktoken.Encoding):
            raise TypeError(f"encoding must be a tiktoken.Encoding, got {type(encoding).__name__}")
        self._enc = encoding
        self._vocab_size = encoding.n_vocab
        self._special_ids = frozenset(
            encoding.encode_single_token(text) for text in encoding.special_tokens_set
        )
        self.special_tokens_map: dict[str, str] = {}
        self._named_ids: dict[str, int] = {}
        for name, text in (
            ("bos_token", bos_token),
            ("eos_token", eos_token),
            ("pad_token", pad_token),
        ):
            if text is None:
                continue
            if not isinstance(text, str):
                raise TypeError(f"{name} must be a str or None, got {text!r}")
            try:
                self._named_ids[name] = encoding.encode_single_token(text)
            except KeyError as exc:
                raise ValueError(f"{name} {text!r} is not a single token of the encoding") from exc
            self.special_tokens_map[name] = text
        for name, flag in (("bos_token", add_bos_token), ("eos_token", add_eos_token)):
            check_flag(flag, f"add_{name}")
            if flag and name not in self._named_ids:
                raise ValueError(f"add_{name} is True but {name} is None")
        self._add_bos = add_bos_token
        self._add_eos = add_eos_token
        self.chat_templates = normalize_chat_templates(chat_templates)
        self.model_max_length = check_max_length(model_max_length)

    @classmethod
    def from_rank_file(
        cls,
        path: str | Path,
        *,
        pattern: str,
        special_tokens: Mapping[str, int] | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> TiktokenTokenizer:
        """Build the encoding from a rank file, a regex and ``{special text: id}``.

        ``kwargs`` are the constructor's (``eos_token=...``, ``chat_templates=...``).

        Raises:
            ValueError: a bad rank file, an empty pattern, or a special id that is also a rank.
        """
        tiktoken = import_tiktoken()
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"pattern must be a non-empty regex str, got {pattern!r}")
        ranks = read_tiktoken_ranks(path)
        specials = dict(special_tokens or {})
        rank_ids = set(ranks.values())
        for text, token_id in specials.items():
            if not isinstance(text, str) or not text:
                raise ValueError(f"special_tokens: keys must be non-empty str, got {text!r}")
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ValueError(f"special_tokens[{text!r}] must be an int >= 0, got {token_id!r}")
            if token_id in rank_ids:
                raise ValueError(
                    f"special_tokens[{text!r}] = {token_id} is also the rank of a BPE token"
                )
        if len(set(specials.values())) != len(specials):
            raise ValueError(f"special_tokens: two tokens share an id in {specials}")
        try:
            encoding = tiktoken.Encoding(
                name or Path(path).stem,
                pat_str=pattern,
                mergeable_ranks=ranks,
                special_tokens=specials,
            )
        except ValueError as exc:  # tiktoken's message does not say which argument
            raise ValueError(f"pattern {pattern!r} is not a valid regex: {exc}") from exc
        return cls(encoding, **kwargs)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> TiktokenTokenizer:
        """Load a directory with a ``*.tiktoken`` rank file and ``tiktoken_config.json``
        (format in the module docstring); chat templates as in `chat.load_chat_templates`.

        Raises:
            FileNotFoundError: no directory, no tiktoken_config.json, or no rank file.
            ValueError: an unknown or malformed config key, or several rank files and no
                ``rank_file`` key to choose one.
        """
        root = Path(model_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"model_dir {str(model_dir)!r} is not a directory")
        config_file = root / TIKTOKEN_CONFIG
        if not config_file.is_file():
            raise FileNotFoundError(f"model_dir {str(model_dir)!r} has no {TIKTOKEN_CONFIG}")
        config = read_json_object(config_file)
        unknown = sorted(set(config) - _CONFIG_KEYS)
        if unknown:
            raise ValueError(
                f"{config_file}: unknown keys {unknown}; allowed: {sorted(_CONFIG_KEYS)}"
            )
        if "rank_file" in config:
            rank_file = root / str(config["rank_file"])
            if not rank_file.is_file():
                raise FileNotFoundError(f"{config_file}: rank_file {rank_file} does not exist")
        else:
            candidates = sorted(root.glob("*.tiktoken"))
            if not candidates:
                raise FileNotFoundError(f"model_dir {str(model_dir)!r} has no *.tiktoken file")
            if len(candidates) > 1:
                raise ValueError(
                    f"model_dir {str(model_dir)!r} has several rank files "
                    f"{[p.name for p in candidates]}; name one with 'rank_file' in {config_file}"
                )
            rank_file = candidates[0]
        if not isinstance(config.get("pattern"), str):
            raise ValueError(f"{config_file}: 'pattern' must be a regex string")
        special_tokens = config.get("special_tokens", {})
        if not isinstance(special_tokens, dict):
            raise ValueError(f"{config_file}: 'special_tokens' must be an object text -> id")
        max_length = config.get("model_max_length")
        try:
            return cls.from_rank_file(
                rank_file,
                pattern=config["pattern"],
                special_tokens=special_tokens,
                name=rank_file.stem,
                bos_token=config.get("bos_token"),
                eos_token=config.get("eos_token"),
                pad_token=config.get("pad_token"),
                add_bos_token=config.get("add_bos_token", False),
                add_eos_token=config.get("add_eos_token", False),
                chat_templates=load_chat_templates(root, config),
                model_max_length=max_length,
            )
        except TypeError as exc:
            raise ValueError(f"{config_file}: {exc}") from exc

    # ---------------------------------------------------------------- the protocol

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The underlying `tiktoken.Encoding`."""
        return self._enc

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def _named_id(self, name: str) -> int | None:
        return self._named_ids.get(name)

    @property
    def add_bos_token(self) -> bool:
        """Whether ``encode(text, add_special_tokens=True)`` starts with BOS."""
        return self._add_bos

    @property
    def add_eos_token(self) -> bool:
        """Whether ``encode(text, add_special_tokens=True)`` ends with EOS."""
        return self._add_eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_text(text)
        check_flag(add_special_tokens, "add_special_tokens")
        ids = self._enc.encode(text, allowed_special="all")
        if add_special_tokens and self._add_bos:
            ids.insert(0, self._named_ids["bos_token"])
        if add_special_tokens and self._add_eos:
            ids.append(self._named_ids["eos_token"])
        return ids

    def _token_bytes(self, ids: Sequence[int]) -> list[bytes]:
        return tokens_of_ids(ids, self._vocab_size, self._bytes_of)

    def _bytes_of(self, token_id: int) -> bytes | None:
        try:
            return self._enc.decode_single_token_bytes(token_id)
        except KeyError:
            return None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        check_flag(skip_special_tokens, "skip_special_tokens")
        ids = check_token_ids(ids, self._vocab_size)
        chunks = self._token_bytes(ids)
        if skip_special_tokens:
            chunks = [c for i, c in zip(ids, chunks, strict=True) if i not in self._special_ids]
        return b"".join(chunks).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [token.decode("latin-1") for token in self._token_bytes(ids)]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        chunks = []
        for i, token in enumerate(self._check_tokens(tokens)):
            try:
                chunks.append(token.encode("latin-1"))
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"tokens[{i}] = {token!r} is not a tiktoken token string "
                    f"(one Latin-1 character per byte)"
                ) from exc
        return b"".join(chunks).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, encoding={self._enc.name!r})"
