"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def poisoned_to_empty(monkeypatch):
    """`Module.to_empty` filling every float parameter and buffer with NaN: the loader
    builds a model on the meta device and `to_empty`s it, so what the checkpoint does
    not fill must be computed after that; a model that reads such memory (whatever it
    held, often zeros in a fresh process) reads NaN here, deterministically. Yields
    the monkeypatch (`undo()` restores `to_empty`)."""
    torch = pytest.importorskip("torch")
    to_empty = torch.nn.Module.to_empty

    def poisoned(self, *, device, recurse=True):
        module = to_empty(self, device=device, recurse=recurse)
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                if tensor.is_floating_point():
                    tensor.fill_(float("nan"))
        return module

    monkeypatch.setattr(torch.nn.Module, "to_empty", poisoned)
    return monkeypatch
