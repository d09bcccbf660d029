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
from tests.tiny import TINY_LLAMA

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
