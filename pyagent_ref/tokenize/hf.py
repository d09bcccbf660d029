"""Hugging Face tokenizers: a checkpoint's ``tokenizer.json`` run by the `tokenizers` library.

The splitting itself is the `tokenizers` library's. What this module adds is what
transformers reads from ``tokenizer_config.json`` around it, with the same effect on
``encode`` as ``transformers.PreTrainedTokenizerFast.from_pretrained(dir).encode``
(transformers 5):

* named special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``,
  ``pad_token``, ``cls_token``, ``mask_token``, each a string or a serialized
  ``AddedToken``) and ``extra_special_tokens`` (formerly ``additional_special_tokens``)
  become special added tokens if ``tokenizer.json`` does not already list them as added
  tokens, so that their text in a prompt encodes to their id;
* what ``add_special_tokens=True`` adds (BOS, EOS, nothing) is decided by the
  post-processor stored in ``tokenizer.json``. The ``add_bos_token`` / ``add_eos_token``
  keys of ``tokenizer_config.json`` are ignored when loading, as transformers 5 ignores
  them whenever a ``tokenizer.json`` exists: transformers wrote that post-processor from
  those very flags when it saved the checkpoint. The `add_bos_token` / `add_eos_token`
  properties report what ``encode`` really does; the constructor's arguments of the same
  names override the post-processor on purpose;
* padding and truncation stored in ``tokenizer.json`` are switched off: ``encode`` returns
  every token of the text, and only those of ``add_special_tokens``; the padding settings'
  pad token is the ``pad_token`` when the config names none.

``decode`` is the `tokenizers` library's decode; transformers' optional
``clean_up_tokenization_spaces`` post-edit is not applied (vLLM does not apply it either).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, processors

from .._files import read_json_object
from ._base import (
    SPECIAL_TOKEN_NAMES,
    TokenizerBase,
    check_flag,
    check_max_length,
    check_text,
    check_token_ids,
    normalize_chat_templates,
    tokens_of_ids,
)
from .chat import load_chat_templates

__all__ = ["HFTokenizer"]

# transformers writes int(1e30) as model_max_length when a model has no limit.
_UNLIMITED = int(1e29)

SpecialToken = str | AddedToken


def _added_token(value: Any, where: str) -> AddedToken | None:
    """A special token as ``tokenizer_config.json`` stores it: None, a str, or a dict.

    The dict form is a serialized ``AddedToken``: ``{"content": ..., "lstrip": ..., ...}``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return AddedToken(value, special=True, normalized=False)
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return AddedToken(
            value["content"],
            single_word=bool(value.get("single_word", False)),
            lstrip=bool(value.get("lstrip", False)),
            rstrip=bool(value.get("rstrip", False)),
            normalized=bool(value.get("normalized", False)),
            special=True,
        )
    raise ValueError(f"{where} must be a token string or an AddedToken object, got {value!r}")


def _as_added_token(value: SpecialToken, where: str) -> AddedToken:
    if isinstance(value, AddedToken):
        return value
    if isinstance(value, str) and value:
        return AddedToken(value, special=True, normalized=False)
    raise TypeError(f"{where} must be a non-empty str or a tokenizers.AddedToken, got {value!r}")


class HFTokenizer(TokenizerBase):
    """A `tokenizers.Tokenizer` with the special tokens and chat templates of a checkpoint.

    Implements `pyagent_ref.tokenize.Tokenizer`. Build it with `from_pretrained` from a
    checkpoint directory, or directly from a `tokenizers.Tokenizer` (which is copied, never
    modified).

    Args:
        tokenizer: the backend tokenizer.
        special_tokens: named special tokens, keys among ``bos_token``, ``eos_token``,
            ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``;
            values are token strings or ``tokenizers.AddedToken`` (None: absent).
        extra_special_tokens: more special tokens (chat markers, ...).
        add_bos_token, add_eos_token: None keeps the backend's post-processor; a bool
            (either one) replaces it by one that adds BOS and/or EOS as requested.
        chat_templates: one template source, or sources by name (``"default"``, ...).
        model_max_length: the context length the tokenizer was configured for, or None.

    Raises:
        TypeError: a wrong argument type.
        ValueError: an unknown special-token name, or ``add_bos_token``/``add_eos_token``
            without the token it asks for.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        special_tokens: Mapping[str, SpecialToken | None] | None = None,
        extra_special_tokens: Iterable[SpecialToken] = (),
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_templates: str | Mapping[str, str] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(
                f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
            )
        for flag_name, flag in (("add_bos_token", add_bos_token), ("add_eos_token", add_eos_token)):
            if flag is not None:
                check_flag(flag, flag_name)
        self.model_max_length = check_max_length(model_max_length)
        self.chat_templates = normalize_chat_templates(chat_templates)
        tk = tokenizers.Tokenizer.from_str(tokenizer.to_str())
        tk.no_padding()
        tk.no_truncation()

        named: dict[str, AddedToken] = {}
        for name, value in (special_tokens or {}).items():
            if name not in SPECIAL_TOKEN_NAMES:
                raise ValueError(
                    f"special_tokens: unknown name {name!r}, expected one of {SPECIAL_TOKEN_NAMES}"
                )
            if value is not None:
                named[name] = _as_added_token(value, f"special_tokens[{name!r}]")
        extra = [
            _as_added_token(v, f"extra_special_tokens[{i}]")
            for i, v in enumerate(extra_special_tokens)
        ]
        already_added = {t.content for t in tk.get_added_tokens_decoder().values()}
        missing = []
        for token in [*named.values(), *extra]:
            if token.content not in already_added:
                missing.append(token)
                already_added.add(token.content)
        if missing:
            tk.add_special_tokens(missing)

        self.special_tokens_map = {name: token.content for name, token in named.items()}
        if add_bos_token is not None or add_eos_token is not None:
            tk.post_processor = self._bos_eos_processor(
                tk, bool(add_bos_token), bool(add_eos_token)
            )
        self._tk = tk
        vocab = tk.get_vocab(with_added_tokens=True)
        self._vocab_size = max(vocab.values()) + 1 if vocab else 0
        self._special_ids = frozenset(
            i for i, token in tk.get_added_tokens_decoder().items() if token.special
        )
        probe = tk.encode("", add_special_tokens=True).ids
        self._adds_bos = self.bos_token_id is not None and probe[:1] == [self.bos_token_id]
        self._adds_eos = self.eos_token_id is not None and probe[-1:] == [self.eos_token_id]

    def _bos_eos_processor(
        self, tk: tokenizers.Tokenizer, add_bos: bool, add_eos: bool
    ) -> processors.TemplateProcessing:
        """A post-processor that puts BOS before and/or EOS after each sequence (and pair)."""

        def token(name: str) -> str:
            text = self.special_tokens_map.get(name)
            if text is None:
                raise ValueError(f"add_{name} is True but the tokenizer has no {name}")
            return text

        bos = [token("bos_token")] if add_bos else []
        eos = [token("eos_token")] if add_eos else []
        single = [f"{t}:0" for t in bos] + ["$A:0"] + [f"{t}:0" for t in eos]
        pair = single + [f"{t}:1" for t in bos] + ["$B:1"] + [f"{t}:1" for t in eos]
        specials = [(t, tk.token_to_id(t)) for t in dict.fromkeys(bos + eos)]
        return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> HFTokenizer:
        """Load ``tokenizer.json`` and, if present, ``tokenizer_config.json`` and the chat
        template files (see `chat.load_chat_templates`) of a checkpoint directory.

        Raises:
            FileNotFoundError: ``model_dir`` is not a directory or has no tokenizer.json.
            ValueError: a file is not valid (the message names it and the bad key).
        """
        root = Path(model_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"model_dir {str(model_dir)!r} is not a directory")
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            hint = ""
            if (root / "tokenizer.model").is_file():
                hint = (
                    " It has a sentencepiece tokenizer.model: convert it once with "
                    "transformers (AutoTokenizer.from_pretrained(dir).save_pretrained(dir))."
                )
            raise FileNotFoundError(
                f"model_dir {str(model_dir)!r} has no tokenizer.json (the serialization of "
                f"the `tokenizers` library) and no *.tiktoken rank file.{hint}"
            )
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise ValueError(f"{tokenizer_file} is not a valid tokenizer.json: {exc}") from exc
        config_file = root / "tokenizer_config.json"
        config = read_json_object(config_file) if config_file.is_file() else {}

        named = {
            name: _added_token(config.get(name), f"{config_file}: {name}")
            for name in SPECIAL_TOKEN_NAMES
        }
        if named["pad_token"] is None and backend.padding is not None:
            # transformers takes the pad token from tokenizer.json's padding settings.
            named["pad_token"] = _added_token(backend.padding["pad_token"], "padding.pad_token")
        extra_value = config.get("extra_special_tokens", config.get("additional_special_tokens"))
        if isinstance(extra_value, Mapping):  # transformers 5 also allows {name: token}
            extra_value = list(extra_value.values())
        if extra_value is not None and not isinstance(extra_value, list):
            raise ValueError(
                f"{config_file}: extra_special_tokens must be a list, got {extra_value!r}"
            )
        extra = [
            _added_token(v, f"{config_file}: extra_special_tokens[{i}]")
            for i, v in enumerate(extra_value or [])
        ]
        max_length = config.get("model_max_length")
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, (int, float)):
                raise ValueError(
                    f"{config_file}: model_max_length must be a number, got {max_length!r}"
                )
            max_length = None if max_length >= _UNLIMITED else int(max_length)
        return cls(
            backend,
            special_tokens=named,
            extra_special_tokens=[t for t in extra if t is not None],
            chat_templates=load_chat_templates(root, config),
            model_max_length=max_length,
        )

    # ---------------------------------------------------------------- the protocol

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (this object's own copy; do not modify it)."""
        return self._tk

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def add_bos_token(self) -> bool:
        """Whether ``encode(text, add_special_tokens=True)`` starts with BOS."""
        return self._adds_bos

    @property
    def add_eos_token(self) -> bool:
        """Whether ``encode(text, add_special_tokens=True)`` ends with EOS."""
        return self._adds_eos

    def _named_id(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self._tk.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_text(text)
        check_flag(add_special_tokens, "add_special_tokens")
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, text: str, text_pair: str) -> tuple[list[int], list[int]]:
        """The ids of two texts read together, as the tokenizer's pair template joins them
        (BERT: [CLS] text [SEP] text_pair [SEP]: a cross-encoder's query and document),
        and each id's segment: 0 for the first text, 1 for the second."""
        check_text(text)
        check_text(text_pair, "text_pair")
        encoding = self._tk.encode(text, text_pair, add_special_tokens=True)
        return encoding.ids, encoding.type_ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = check_token_ids(ids, self._vocab_size)
        check_flag(skip_special_tokens, "skip_special_tokens")
        return self._tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return tokens_of_ids(ids, self._vocab_size, self._tk.id_to_token)

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        tokens = self._check_tokens(tokens)
        decoder = self._tk.decoder
        # Without a decoder the `tokenizers` library joins tokens with spaces; so do we.
        return " ".join(tokens) if decoder is None else decoder.decode(tokens)
