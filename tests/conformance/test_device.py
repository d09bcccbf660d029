"""`--device` / `--conformance-device`: the torch inputs are created on the named device,
results compared on the host; a device torch cannot use, a malformed name, or numpy with a
device other than cpu is one clear error at start."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conformance import core  # noqa: E402
from conformance.__main__ import main  # noqa: E402

# a few properties of three specs: a float32 power, a rotation, a fused residual
FEW = [
    "rope.rope_inv_freq.default_is_theta_power",
    "rope.apply_rope.matches_the_rotation",
    "layers.rms_norm.residual_is_fused",
    "block_table.compute_slot_mapping.int32_and_int64_alike",
]


def test_reference_passes_with_torch_inputs_on_the_cpu_device():
    report = core.run("pyagent_ref", ["rope", "layers", "block_table"], "torch", "ci", FEW)
    assert report.device == "cpu"
    assert {o.prop.id for o in report.outcomes if o.status == core.PASS} == set(FEW)


def test_inputs_are_created_on_the_device_with_their_strides():
    # "meta" is a device every torch has: it shows where the tensors go, not their values
    ctx = core.Ctx(core.resolve("pyagent_ref"), "torch", "rope", core.check_device("torch", "meta"))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert ctx.arr(x).device.type == "meta"
    for layout in core.Ctx.LAYOUTS:
        view = ctx.strided(x, layout)
        want = np.asfortranarray(x) if layout == "column-major" else x
        assert view.device.type == "meta" and tuple(view.shape) == x.shape
        assert not view.is_contiguous(), layout  # the copy to the device kept the view
        if layout == "column-major":
            assert view.stride() == tuple(s // x.itemsize for s in want.strides)
    cpu = core.Ctx(core.resolve("pyagent_ref"), "torch", "rope")
    assert np.array_equal(cpu.strided(x, "every other column").numpy(), x)


@pytest.mark.parametrize(
    ("array", "device", "says"),
    [
        ("numpy", "cuda", "needs array torch"),
        ("torch", "nonsense", "'nonsense' is not usable"),
        ("torch", "cuda:x", "'cuda:x' is not usable"),
    ],
)
def test_an_unusable_device_is_a_value_error_naming_it(array, device, says):
    with pytest.raises(ValueError, match=says):
        core.check_device(array, device)
    with pytest.raises(ValueError, match=says):
        core.run("pyagent_ref", ["rope"], array, "ci", FEW[:1], device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has a usable CUDA device")
def test_cuda_without_a_gpu_is_refused_by_the_cli_and_the_plugin(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["pyagent_ref", "rope", "--array", "torch", "--device", "cuda"])
    assert exit_.value.code == 2
    assert "--device cuda: device 'cuda' is not usable" in capsys.readouterr().err
    env = os.environ | {"CONFORMANCE_ARRAY": "torch", "CONFORMANCE_DEVICE": "cuda"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--co", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 4, run.stdout + run.stderr  # pytest's usage error
    assert "--conformance-device=cuda (or CONFORMANCE_DEVICE)" in run.stderr
    assert run.stdout.count("test_property") == 0
