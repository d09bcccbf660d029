"""`pyagent_ref.ops.load` picks the implementation subsystems run on."""

import pytest

import pyagent_ref.ops


def test_ref_is_this_package():
    assert pyagent_ref.ops.load("ref") is pyagent_ref.ops


def test_auto_prefers_accel_when_installed():
    ops = pyagent_ref.ops.load("auto")
    try:
        import pyagent_accel.ops as accel
    except ImportError:
        assert ops is pyagent_ref.ops
    else:
        assert ops is accel


def test_unknown_name_is_rejected():
    with pytest.raises(ValueError, match="'cuda'"):
        pyagent_ref.ops.load("cuda")
