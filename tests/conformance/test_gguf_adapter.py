"""llama.cpp's gguf-py in the conformance matrix: its dequantizers pass every property of
`ops.gguf.dequantize` (bit for bit), its Q8_0 / Q4_0 quantizers the formula properties,
and the divergences registered for it (no K-quant quantizer, no input validation) still
show.
"""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from conformance import core, divergences  # noqa: E402

GGUF_PY = "conformance.adapters.gguf_py"


def test_gguf_py_conforms_but_for_its_registered_divergences():
    report = core.run(GGUF_PY, ["gguf"], profile="ci")
    failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
    assert not failed, failed
    passed = {o.prop.id for o in report.outcomes if o.status == core.PASS}
    assert "gguf.dequantize.reads_each_weight_from_its_fields" in passed
    assert "gguf.dequantize.matches_reference" in passed
    assert "gguf.quantize.follows_the_q8_0_q4_0_formula" in passed
    observed = {
        (f"{o.prop.module}.{o.prop.op}", o.prop.name)
        for o in report.outcomes
        if o.status == core.KNOWN
    }
    registered = {(d.op, d.property) for d in divergences.for_implementation(GGUF_PY)}
    assert registered and registered - observed == set(), registered - observed
