"""TiktokenTokenizer: rank files, tiktoken_config.json, the protocol, errors."""

from __future__ import annotations

import base64
import builtins
import json

import pytest

from pyagent_ref.tokenize import (
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
    read_tiktoken_ranks,
)

from .helpers import (
    CORPUS,
    TIKTOKEN_PATTERN,
    TIKTOKEN_SPECIALS,
    byte_level_ranks,
    write_tiktoken_dir,
)

tiktoken = pytest.importorskip("tiktoken")


@pytest.fixture(scope="module")
def ranks(bpe):
    return byte_level_ranks(bpe)


def _config(ranks, **extra):
    specials = {s: len(ranks) + i for i, s in enumerate(TIKTOKEN_SPECIALS)}
    return {"pattern": TIKTOKEN_PATTERN, "special_tokens": specials, **extra}


def test_rank_file_round_trip(ranks, tmp_path):
    model_dir = write_tiktoken_dir(tmp_path / "m", ranks, _config(ranks))
    assert read_tiktoken_ranks(model_dir / "tokenizer.tiktoken") == ranks


def test_from_pretrained_and_protocol(ranks, bpe, tmp_path):
    config = _config(
        ranks,
        eos_token="<|endoftext|>",
        bos_token="<|im_start|>",
        add_bos_token=True,
        model_max_length=4096,
        chat_template="{{ bos_token }}{{ messages[0].content }}",
    )
    tok = load_tokenizer(write_tiktoken_dir(tmp_path / "m", ranks, config))
    assert isinstance(tok, TiktokenTokenizer) and isinstance(tok, Tokenizer)
    n = len(ranks)
    assert tok.vocab_size == n + 3
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (n, n + 1, None)
    assert tok.all_special_ids == frozenset({n, n + 1, n + 2})
    assert tok.model_max_length == 4096
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        # Same merges as the byte-level BPE, so the same pieces (ids differ: other order).
        assert [tok.convert_tokens_to_string([t]) for t in tok.convert_ids_to_tokens(ids)] == [
            bpe.decode([i]) for i in bpe.encode(text).ids
        ]
    ids = tok.encode("<|im_start|>hé<|im_end|>")
    assert ids[:2] == [n + 1, n + 1]  # the added BOS, then the special text
    assert ids[-1] == n + 2
    assert tok.decode(ids, skip_special_tokens=True) == "hé"
    assert tok.decode(ids) == "<|im_start|><|im_start|>hé<|im_end|>"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True) == [
        n + 1,
        *tok.encode("x", add_special_tokens=False),
    ]


def test_token_strings_are_latin1_bytes(tiktoken_tok):
    ids = tiktoken_tok.encode("é😀", add_special_tokens=False)
    tokens = tiktoken_tok.convert_ids_to_tokens(ids)
    assert "".join(tokens).encode("latin-1") == "é😀".encode()
    # Bytes 0xC3 0xA9 are "é"; the first byte alone is an incomplete character: U+FFFD.
    assert tiktoken_tok.convert_tokens_to_string(["\xc3", "\xa9"]) == "é"
    assert tiktoken_tok.convert_tokens_to_string(["a\xc3"]) == "a\ufffd"
    assert tiktoken_tok.decode(ids) == tiktoken_tok.encoding.decode(ids)
    with pytest.raises(ValueError, match=r"tokens\[0\] = '€' is not a tiktoken token string"):
        tiktoken_tok.convert_tokens_to_string(["€"])


def test_from_existing_encoding_and_gaps():
    ranks = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding(
        "gappy", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={"<eos>": 300}
    )
    tok = TiktokenTokenizer(enc, eos_token="<eos>")
    assert tok.vocab_size == 301 and tok.eos_token_id == 300
    assert tok.encode("a<eos>") == [97, 300]
    with pytest.raises(ValueError, match=r"ids\[1\] = 280 is not the id of any token"):
        tok.decode([97, 280])
    with pytest.raises(ValueError, match=r"ids\[0\] = 301 is outside the vocabulary"):
        tok.convert_ids_to_tokens([301])
    with pytest.raises(ValueError, match="bos_token '<bos>' is not a single token"):
        TiktokenTokenizer(enc, bos_token="<bos>")
    with pytest.raises(ValueError, match="add_bos_token is True but bos_token is None"):
        TiktokenTokenizer(enc, add_bos_token=True)
    with pytest.raises(TypeError, match="encoding must be a tiktoken.Encoding"):
        TiktokenTokenizer("cl100k_base")


def test_bad_rank_files_and_configs(ranks, tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("YQ== 0\nYg== x\n")
    with pytest.raises(ValueError, match=r"bad.tiktoken:2: bad rank line"):
        read_tiktoken_ranks(bad)
    bad.write_text("YQ== 0\nYQ== 1\n")
    with pytest.raises(ValueError, match=r":2: token b'a' listed twice"):
        read_tiktoken_ranks(bad)
    bad.write_text("YQ== 0\nYg== 0\n")
    with pytest.raises(ValueError, match=r":2: rank 0 listed twice"):
        read_tiktoken_ranks(bad)

    model_dir = write_tiktoken_dir(tmp_path / "m", ranks, _config(ranks, patern="typo"))
    with pytest.raises(ValueError, match=r"unknown keys \['patern'\]"):
        TiktokenTokenizer.from_pretrained(model_dir)
    config = _config(ranks)
    config["special_tokens"] = {"<x>": 5}
    write_tiktoken_dir(model_dir, ranks, config)
    with pytest.raises(ValueError, match=r"special_tokens\['<x>'\] = 5 is also the rank"):
        TiktokenTokenizer.from_pretrained(model_dir)
    config["special_tokens"] = {}
    config["pattern"] = "(unclosed"
    write_tiktoken_dir(model_dir, ranks, config)
    with pytest.raises(ValueError, match=r"pattern '\(unclosed' is not a valid regex"):
        TiktokenTokenizer.from_pretrained(model_dir)
    write_tiktoken_dir(model_dir, ranks, _config(ranks, eos_token=7))
    with pytest.raises(ValueError, match="eos_token must be a str or None, got 7"):
        TiktokenTokenizer.from_pretrained(model_dir)
    (model_dir / "second.tiktoken").write_text(f"{base64.b64encode(b'a').decode()} 0\n")
    write_tiktoken_dir(model_dir, ranks, _config(ranks))
    with pytest.raises(ValueError, match="several rank files"):
        TiktokenTokenizer.from_pretrained(model_dir)
    write_tiktoken_dir(model_dir, ranks, _config(ranks, rank_file="tokenizer.tiktoken"))
    assert TiktokenTokenizer.from_pretrained(model_dir).vocab_size == len(ranks) + 3


def test_missing_tiktoken_names_the_extra(monkeypatch, tiktoken_tok):
    real_import = builtins.__import__

    def no_tiktoken(name, *args, **kwargs):
        if name == "tiktoken":
            raise ImportError("No module named 'tiktoken'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tiktoken)
    with pytest.raises(ImportError, match=r"pip install 'pyagent\[tiktoken\]'"):
        TiktokenTokenizer(tiktoken_tok.encoding)


def test_config_is_json(tmp_path, ranks):
    model_dir = write_tiktoken_dir(tmp_path / "m", ranks, _config(ranks))
    (model_dir / "tiktoken_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="tiktoken_config.json is not valid JSON"):
        TiktokenTokenizer.from_pretrained(model_dir)
    (model_dir / "tiktoken_config.json").write_text(json.dumps({"special_tokens": {}}))
    with pytest.raises(ValueError, match="'pattern' must be a regex string"):
        TiktokenTokenizer.from_pretrained(model_dir)
