"""The llguidance and xgrammar adapters stay honest: their reports on the bitmask op and on
the matchers have no unexplained failure, and every divergence registered for their
matchers still shows."""

from __future__ import annotations

import pytest

from conformance import core, divergences

ADAPTERS = {
    "llguidance": "conformance.adapters.llguidance",
    "xgrammar": "conformance.adapters.xgrammar",
}


@pytest.mark.parametrize("library", sorted(ADAPTERS))
def test_adapter_conforms_but_for_its_registered_divergences(library):
    pytest.importorskip(library)
    pytest.importorskip("torch")
    target = ADAPTERS[library]
    report = core.run(target, ["structured", "matcher"], profile="ci")
    failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
    assert not failed, failed
    observed = {
        (f"{o.prop.module}.{o.prop.op}", o.prop.name)
        for o in report.outcomes
        if o.status == core.KNOWN
    }
    registered = {
        (d.op, d.property)
        for d in divergences.for_implementation(target)
        if d.op.startswith("matcher.")
    }
    assert registered, f"no matcher divergence registered for {library}"
    assert registered - observed == set(), "registered divergences that no longer show"
