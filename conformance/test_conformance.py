"""The conformance suite as pytest tests (see `conformance.pytest_plugin` for the options).

    pytest --pyargs conformance -p conformance.pytest_plugin --conformance-impl=pyagent_accel

One test per property of the selected implementation, plus the checks of the suite itself
(oracles against published known answers, a goodness-of-fit test that rejects wrong
samplers, coverage) and, with --conformance-selftest, one test per mutant.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance import core, selftest
from conformance.pytest_plugin import check, implementation, options


def pytest_generate_tests(metafunc: Any) -> None:
    opts = options(metafunc.config)
    if "prop" in metafunc.fixturenames:
        try:
            impl = implementation(opts.impl)
        except ImportError as exc:
            raise pytest.UsageError(f"conformance: cannot import {opts.impl!r}: {exc}") from exc
        props = core.select(impl, list(opts.modules) or None)
        metafunc.parametrize("prop", props, ids=[p.id for p in props])
    if "mutant" in metafunc.fixturenames:
        from conformance.mutants import MUTANTS

        chosen = MUTANTS if opts.selftest else []
        metafunc.parametrize("mutant", chosen, ids=[m.name for m in chosen])


@pytest.fixture(scope="session")
def conformance_options(request: Any) -> Any:
    """The run's options (also defined here, so that this file works without the plugin)."""
    return options(request.config)


def test_property(prop: core.Property, conformance_options: Any) -> None:
    """One property of the implementation under test."""
    check(prop, conformance_options)


def test_oracles_reproduce_known_answers() -> None:
    selftest.check_oracles()


def test_goodness_of_fit_rejects_wrong_samplers() -> None:
    selftest.check_goodness_of_fit_can_fail()


def test_every_op_has_documented_properties() -> None:
    selftest.check_coverage()


def test_mutant_is_caught(mutant: Any, conformance_options: Any) -> None:
    """A deliberately wrong implementation of one op fails at least one of its properties."""
    outcomes = selftest.run_mutant(mutant, conformance_options.array, conformance_options.profile)
    failed = [o.prop.name for o in outcomes if o.status == core.FAIL]
    assert failed, f"mutant {mutant.name} ({mutant.bug}) passed every property of {mutant.op}"
