"""pytest plugin: the conformance properties as pytest tests.

    pytest --pyargs conformance -p conformance.pytest_plugin --conformance-impl=pyagent_accel

(`-p conformance.pytest_plugin` is only needed when the package is not installed: the
`pytest11` entry point loads the plugin otherwise.) It adds the options below; the tests
themselves are in `conformance/test_conformance.py`, one per property, and run the same
property functions as `python -m conformance`.

    --conformance-impl=MODULE      or CONFORMANCE_IMPL     (default pyagent_ref)
    --conformance-array=LIB        or CONFORMANCE_ARRAY    numpy | torch (default numpy)
    --conformance-device=DEVICE    or CONFORMANCE_DEVICE   where the torch inputs live: cpu,
                                   cuda, cuda:1, ... (default cpu; numpy: cpu only);
                                   results are compared on the host. A device torch cannot
                                   use is a usage error at start.
    --conformance-profile=NAME     or CONFORMANCE_PROFILE  dev | ci (default: the
                                   --hypothesis-profile if it is one of them, else dev)
    --conformance-module=NAME      ops module(s) to check (repeatable; default all)
    --conformance-strict           a missing op fails instead of skipping
    --conformance-selftest         also run the mutation self-test (slow)

Outcomes map onto pytest's: FAIL fails with the counterexample and a repro line,
KNOWN DIVERGENCE is an xfail with the registered reason, MISSING and the differential
checks of the reference against itself are skips.

Loading the plugin also registers the project's hypothesis profiles `dev` and `ci`
(`conformance.profiles`), before hypothesis' own plugin reads `--hypothesis-profile`, so
`pytest tests --hypothesis-profile=ci` uses them (hypothesis' built-in `ci` is replaced).
Otherwise the plugin is inert unless its tests are collected: it adds options and a fixture.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from conformance import core, profiles

profiles.register()  # at import: before hypothesis' pytest_configure loads a profile

ENV = {
    "impl": "CONFORMANCE_IMPL",
    "array": "CONFORMANCE_ARRAY",
    "device": "CONFORMANCE_DEVICE",
    "profile": "CONFORMANCE_PROFILE",
}


@dataclass(frozen=True)
class Options:
    impl: str
    array: str
    device: str
    profile: str
    modules: tuple[str, ...]
    strict: bool
    selftest: bool


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("conformance", "pyagent ops conformance suite")
    group.addoption(
        "--conformance-impl",
        default=None,
        metavar="MODULE",
        help="implementation to check (<MODULE>.ops if it exists); env CONFORMANCE_IMPL",
    )
    group.addoption(
        "--conformance-array",
        default=None,
        choices=("numpy", "torch"),
        help="array library of the inputs; env CONFORMANCE_ARRAY",
    )
    group.addoption(
        "--conformance-device",
        default=None,
        metavar="DEVICE",
        help="device of the torch inputs (cpu, cuda, ...); env CONFORMANCE_DEVICE",
    )
    group.addoption(
        "--conformance-profile",
        default=None,
        choices=("dev", "ci"),
        help="hypothesis profile; env CONFORMANCE_PROFILE",
    )
    group.addoption(
        "--conformance-module",
        action="append",
        default=None,
        metavar="NAME",
        help="ops module to check (repeatable; default all)",
    )
    group.addoption(
        "--conformance-strict",
        action="store_true",
        default=False,
        help="a missing op fails instead of skipping",
    )
    group.addoption(
        "--conformance-selftest",
        action="store_true",
        default=False,
        help="also run the mutation self-test of the suite (slow)",
    )


def pytest_configure(config: Any) -> None:
    """A device given explicitly is checked once, at start: one usage error naming the
    option and the value rather than a failure per property."""
    explicit = _option(config, "conformance_device") or os.environ.get(ENV["device"])
    if not explicit:
        return
    opts = options(config)
    try:
        core.check_device(opts.array, opts.device)
    except ValueError as exc:
        raise pytest.UsageError(
            f"--conformance-device={opts.device} (or {ENV['device']}): {exc}"
        ) from None


def _option(config: Any, name: str) -> Any:
    try:
        return config.getoption(name)
    except ValueError:  # the plugin is not loaded: options fall back to the environment
        return None


def options(config: Any) -> Options:
    """The conformance options of this run (command line, then environment, then defaults)."""
    profile = _option(config, "conformance_profile") or os.environ.get(ENV["profile"])
    if profile is None:
        hypothesis_profile = _option(config, "hypothesis_profile")
        profile = hypothesis_profile if hypothesis_profile in ("dev", "ci") else "dev"
    return Options(
        impl=_option(config, "conformance_impl") or os.environ.get(ENV["impl"], "pyagent_ref"),
        array=_option(config, "conformance_array") or os.environ.get(ENV["array"], "numpy"),
        device=_option(config, "conformance_device")
        or os.environ.get(ENV["device"], core.DEFAULT_DEVICE),
        profile=profile,
        modules=tuple(_option(config, "conformance_module") or ()),
        strict=bool(_option(config, "conformance_strict")),
        selftest=bool(_option(config, "conformance_selftest"))
        or os.environ.get("CONFORMANCE_SELFTEST") == "1",
    )


_IMPLS: dict[str, Any] = {}


def implementation(name: str) -> Any:
    """The resolved implementation (cached per session)."""
    if name not in _IMPLS:
        _IMPLS[name] = core.resolve(name)
    return _IMPLS[name]


@pytest.fixture(scope="session")
def conformance_options(request: Any) -> Options:
    """The conformance options of this run."""
    return options(request.config)


def check(prop: Any, opts: Options) -> None:
    """Run one property and turn its outcome into pytest's (fail / xfail / skip / pass)."""
    import warnings

    outcome = core.run_property(
        prop, implementation(opts.impl), opts.array, opts.profile, device=opts.device
    )
    if outcome.status == core.MISSING:
        if opts.strict:
            pytest.fail(f"MISSING: {outcome.message}", pytrace=False)
        pytest.skip(f"MISSING: {outcome.message}")
    if outcome.status == core.SKIP:
        pytest.skip(outcome.message)
    if outcome.status == core.KNOWN:
        pytest.xfail(f"KNOWN DIVERGENCE: {outcome.note} ({outcome.message})")
    if outcome.status == core.FAIL:
        lines = [f"{prop.id}: {prop.doc}", outcome.message]
        if outcome.counterexample:
            lines.append(f"counterexample: {outcome.counterexample}")
        lines.append(f"repro: {outcome.repro}")
        pytest.fail("\n".join(lines), pytrace=False)
    if outcome.note:
        warnings.warn(f"{prop.id}: {outcome.note}", stacklevel=1)


def pytest_report_header(config: Any) -> str | None:
    opts = options(config)
    explicit = _option(config, "conformance_impl") or os.environ.get(ENV["impl"])
    if not explicit:
        return None
    return (
        f"conformance: impl={opts.impl} array={opts.array} device={opts.device} "
        f"profile={opts.profile}"
    )
