"""load_tokenizer picks the backend from what the directory holds."""

from __future__ import annotations

import pytest

from pyagent_ref.tokenize import HFTokenizer, TiktokenTokenizer, load_tokenizer

from .helpers import TIKTOKEN_PATTERN, byte_level_ranks, write_hf_dir, write_tiktoken_dir


def test_picks_hf_for_tokenizer_json(bpe, tmp_path):
    tok = load_tokenizer(write_hf_dir(tmp_path / "hf", bpe, {"eos_token": "</s>"}))
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_token_id == 2


def test_picks_tiktoken_for_rank_file_and_config(bpe, tmp_path):
    pytest.importorskip("tiktoken")
    ranks = byte_level_ranks(bpe)
    model_dir = write_tiktoken_dir(tmp_path / "tt", ranks, {"pattern": TIKTOKEN_PATTERN})
    tok = load_tokenizer(str(model_dir))
    assert isinstance(tok, TiktokenTokenizer)
    assert tok.decode(tok.encode("naïve 😀")) == "naïve 😀"


def test_tokenizer_json_wins_over_a_rank_file(bpe, tmp_path):
    model_dir = write_hf_dir(tmp_path / "both", bpe)
    write_tiktoken_dir(model_dir, {b"a": 0}, {"pattern": "."})
    assert isinstance(load_tokenizer(model_dir), HFTokenizer)


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="expected tokenizer.json .* it has neither"):
        load_tokenizer(tmp_path)
    (tmp_path / "x.tiktoken").write_text("YQ== 0\n")
    with pytest.raises(FileNotFoundError, match="rank file x.tiktoken but no tiktoken_config"):
        load_tokenizer(tmp_path)
    (tmp_path / "x.tiktoken").unlink()
    (tmp_path / "tokenizer.model").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="only a sentencepiece tokenizer.model"):
        load_tokenizer(tmp_path)
