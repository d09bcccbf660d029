"""`pyagent_ref.ops.load` picks the implementation subsystems run on."""

import sys
from types import ModuleType

import numpy as np
import pytest

import pyagent_ref.ops
from pyagent_ref.ops._auto import by_device


def test_ref_is_this_package():
    assert pyagent_ref.ops.load("ref") is pyagent_ref.ops


def test_auto_is_ref_without_the_accelerator(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyagent_accel.ops", None)  # import raises ImportError
    assert pyagent_ref.ops.load("auto") is pyagent_ref.ops


def _fake(name: str, calls: list) -> ModuleType:
    """An ops namespace whose one module `m` has a function recording `name` and a constant."""
    root, mod = ModuleType(name), ModuleType(f"{name}.m")
    root.MODULES, mod.__all__ = ("m",), ["f", "CONST"]
    mod.f = lambda *args, **kwargs: calls.append(name) or name
    mod.CONST = name
    root.m = mod
    return root


def test_auto_dispatches_each_call_by_the_device_of_its_arrays():
    torch = pytest.importorskip("torch")
    calls: list[str] = []
    auto = by_device(_fake("ref", calls), _fake("accel", calls))
    assert auto.m.f(np.zeros(2), [1, 2], 3.0) == "accel"
    assert auto.m.f(torch.zeros(2), x=torch.zeros(1)) == "accel"
    assert auto.m.f(torch.zeros(2), x=torch.zeros(1, device="meta")) == "ref"
    assert auto.m.f(torch.zeros(2, device="meta")) == "ref"
    assert auto.m.CONST == "ref" and auto.m.__all__ == ["f", "CONST"]
    assert calls == ["accel", "accel", "ref", "ref"]


def test_auto_has_the_reference_shape():
    auto = pyagent_ref.ops.load("auto")
    assert auto.MODULES == pyagent_ref.ops.MODULES
    for module in pyagent_ref.ops.MODULES:
        assert getattr(auto, module).__all__ == getattr(pyagent_ref.ops, module).__all__


def test_auto_runs_the_reference_on_device_tensors():
    """A tensor off the host (here torch's meta device) reaches the reference, which the
    accelerator would refuse."""
    torch = pytest.importorskip("torch")
    x, w = torch.empty(3, 8, device="meta"), torch.empty(8, device="meta")
    out = pyagent_ref.ops.load("auto").layers.rms_norm(x, w, 1e-5)
    assert out.device.type == "meta" and tuple(out.shape) == (3, 8)


def test_unknown_name_is_rejected():
    with pytest.raises(ValueError, match="'cuda'"):
        pyagent_ref.ops.load("cuda")
