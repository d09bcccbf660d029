"""compressed-tensors in the conformance matrix: its pack_to_int32 / unpack_from_int32 (the
pack-quantized layout) pass every property of `ops.quant.pack_int32` / `unpack_int32` but
input validation, its float-quantized observer and quantize give our e4m3 codes and
scales bit for bit (but for the scale of an all-zero tensor), its dequantize is our
`dequantize_fp8` bit for bit, and the divergences registered for it still show.
"""

from __future__ import annotations

import pytest

pytest.importorskip("compressed_tensors")

from conformance import core, divergences  # noqa: E402

CT = "conformance.adapters.compressed_tensors"


def test_compressed_tensors_conforms_but_for_its_registered_divergences():
    report = core.run(CT, ["quant"], profile="ci")
    failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
    assert not failed, failed
    passed = {o.prop.id for o in report.outcomes if o.status == core.PASS}
    assert "quant.pack_int32.lays_codes_out_as_documented" in passed
    assert "quant.unpack_int32.matches_reference" in passed
    assert "quant.dequantize_fp8.is_the_codes_value_times_the_scale" in passed
    observed = {
        (f"{o.prop.module}.{o.prop.op}", o.prop.name)
        for o in report.outcomes
        if o.status == core.KNOWN
    }
    registered = {(d.op, d.property) for d in divergences.for_implementation(CT)}
    assert registered and registered - observed == set(), registered - observed


def test_its_e4m3_quantization_is_ours_on_nonzero_weights():
    """The divergences above are the e5m2 format and zero scales only: on e4m3 weights
    without a zero row its codes and scales are ours exactly, per tensor and channel."""
    import numpy as np

    from conformance.adapters import compressed_tensors as ct
    from pyagent_ref.ops import quant

    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 300.0):
        w = (rng.standard_normal((6, 40)) * scale).astype(np.float32)
        for per in ("tensor", "channel"):
            theirs = ct.quantize_fp8(w, "e4m3", per)
            ours = quant.quantize_fp8(w, "e4m3", per)
            for got, want in zip(theirs, ours, strict=True):
                assert got.dtype == want.dtype and np.array_equal(got, want), (scale, per)
