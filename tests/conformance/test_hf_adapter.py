"""The HF transformers adapter stays honest: on numpy and torch input its report has no
unexplained failure, and the divergences registered for its model-layer ops still show.

(Some sampling divergences sit on float32 rounding boundaries that 50 derandomized
examples may not reach; only the layer, RoPE and MoE ones are checked for staleness here.)
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conformance import core, divergences  # noqa: E402

HF = "conformance.adapters.hf_transformers"


def test_hf_transformers_conforms_but_for_its_registered_divergences():
    observed = set()
    for array in ("numpy", "torch"):
        report = core.run(HF, array=array, profile="ci")
        failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
        assert not failed, f"{array}: {failed}"
        observed |= {
            (f"{o.prop.module}.{o.prop.op}", o.prop.name)
            for o in report.outcomes
            if o.status == core.KNOWN
        }
    registered = {
        (d.op, d.property)
        for d in divergences.for_implementation(HF)
        if d.op.startswith(("layers.", "rope.", "moe."))
    }
    assert registered, "no layer or RoPE divergence registered for transformers"
    assert registered - observed == set(), "registered divergences that no longer show"
