"""The self-test's --until-caught mode (what CI runs): each mutant stops at the first
property that catches it, `matches_reference` first, and the verdict is the full run's."""

from __future__ import annotations

from conformance import core, selftest
from conformance.mutants import MUTANTS


def test_until_caught_stops_at_the_first_failure_and_keeps_the_verdict():
    mutants = [m for m in MUTANTS if m.module == "hashing"][:4]
    for m in mutants:
        full = selftest.run_mutant(m)
        short = selftest.run_mutant(m, until_caught=True)
        statuses = [o.status for o in short]
        assert statuses[-1] == core.FAIL and core.FAIL not in statuses[:-1], m.name
        assert short[-1].prop.name in {o.prop.name for o in full if o.status == core.FAIL}
        assert len(short) <= len(full)
        if any(o.prop.name == "matches_reference" for o in full):
            assert short[0].prop.name == "matches_reference", m.name
