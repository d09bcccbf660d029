"""Checks of the suite itself: can its properties fail?

    python -m conformance.selftest [--profile ci|dev] [--array numpy|torch] [--module NAME ...]
                                   [--until-caught]

1. The oracles reproduce the published known answers (Random123 Philox, RFC 8949 CBOR).
2. The goodness-of-fit test accepts the reference sampler and rejects wrong ones.
3. Every mutant in `conformance.mutants` (one plausible bug each) is caught by at least
   one property of its op; the report lists which, and the properties no mutant kills.
   With --until-caught (CI) each mutant runs its op's properties only until one fails,
   the differential `matches_reference` first: the same verdict in a fraction of the
   time, without the kill counts and the list of properties no mutant kills.
4. Every op of the reference has properties, and every property has a docstring.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from . import core, oracles
from .mutants import MUTANTS, Mutant, implementation


def check_oracles() -> None:
    """The independent Philox and CBOR reproduce the published known answers."""
    for counter, key, words in oracles.PHILOX_KAT:
        assert oracles.philox4x32_10(counter, key) == words, f"Philox KAT {counter} {key}"
    for value, hexed in oracles.RFC8949_EXAMPLES:
        assert oracles.cbor(value).hex() == hexed, f"CBOR {value!r}"
        assert oracles.cbor_decode(bytes.fromhex(hexed)) == value, f"CBOR decode {hexed}"
    try:
        oracles.cbor_decode(bytes.fromhex("1817"))  # 23 in a 1-byte extension: not shortest
    except ValueError:
        pass
    else:
        raise AssertionError("the strict decoder accepted a non-shortest head")


def check_goodness_of_fit_can_fail() -> None:
    """The chi-square test passes the reference sampler and fails wrong samplers."""
    from pyagent_ref.ops import sampling as S

    from .specs.sampling import GOF_P, GOF_ROWS, goodness_of_fit

    for row in GOF_ROWS:
        p = goodness_of_fit(S.sample, row, np.float64, "seeds")
        assert p > GOF_P, f"reference sampler rejected on {row}: p = {p:.3g}"

    def wrong(score: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
        def sampler(logits: Any, temperature: Any, seeds: Any, positions: Any) -> np.ndarray:
            u = S.philox_uniform(np.asarray(seeds), np.asarray(positions), logits.shape[1])
            return np.argmax(score(np.asarray(logits, np.float64), u), axis=1)

        return sampler

    for name, score in (
        ("uniform noise, argmax(x + u)", lambda x, u: x + u),
        ("softmax(2x)", lambda x, u: 2 * x - np.log(-np.log(u))),
        ("softmax(x / 1.25)", lambda x, u: x / 1.25 - np.log(-np.log(u))),
    ):
        worst = min(goodness_of_fit(wrong(score), row, np.float64, "seeds") for row in GOF_ROWS[1:])
        assert worst <= GOF_P, (
            f"the goodness-of-fit test accepted a wrong sampler ({name}): p = {worst:.3g}"
        )


def check_coverage() -> None:
    """Every op of the specs (each public name of an ops module) has documented properties."""
    import pyagent_ref.ops as ref

    specs = core.all_specs()
    for module, spec in specs.items():
        have = {p.op for p in spec.properties}
        names = getattr(ref, module).__all__ if hasattr(ref, module) else spec.ops
        missing = [name for name in names if name not in have]
        assert not missing, f"{module}: no property for {missing}"
    undocumented = [p.id for p in core.iter_properties() if not p.doc]
    assert not undocumented, f"properties without a docstring: {undocumented}"


def run_mutant(
    m: Mutant, array: str = "numpy", profile: str = "ci", until_caught: bool = False
) -> list[core.Outcome]:
    """The outcomes of the properties of m's op on the mutant (no shrinking); with
    `until_caught`, `matches_reference` first and none after the first that fails."""
    impl = implementation(m)
    props = [p for p in core.all_specs()[m.module].properties if p.op == m.op]
    if until_caught:
        props.sort(key=lambda p: p.name != "matches_reference")
    outcomes = []
    for prop in props:
        outcomes.append(core.run_property(prop, impl, array, profile, shrink=False))
        if until_caught and outcomes[-1].status == core.FAIL:
            break
    return outcomes


def check_mutants(
    array: str = "numpy",
    profile: str = "ci",
    echo: Callable[[str], None] | None = None,
    mutants: list[Mutant] = MUTANTS,
    until_caught: bool = False,
) -> dict[str, list[str]]:
    """Every mutant fails at least one property; returns {mutant: properties that failed}
    (with `until_caught`, the first one only: see `run_mutant`)."""
    kills: dict[str, list[str]] = {}
    for m in mutants:
        outcomes = run_mutant(m, array, profile, until_caught)
        kills[m.name] = [o.prop.name for o in outcomes if o.status == core.FAIL]
        if echo:
            echo(
                f"  {m.op:20s} {m.name:32s} killed by {len(kills[m.name]):2d}: "
                + (", ".join(kills[m.name]) or "-")
            )
    survivors = [name for name, killed in kills.items() if not killed]
    assert not survivors, f"mutants not caught by any property: {survivors}"
    return kills


def unkilled_properties(kills: dict[str, list[str]]) -> list[str]:
    """Properties of the mutated ops that no mutant made fail (there should be none)."""
    killed = {(m.module, m.op, name) for m in MUTANTS for name in kills.get(m.name, ())}
    ops = {(m.module, m.op) for m in MUTANTS if m.name in kills}
    return [
        p.id
        for p in core.iter_properties()
        if (p.module, p.op) in ops and (p.module, p.op, p.name) not in killed
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m conformance.selftest", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--profile", default="ci", choices=("dev", "ci"))
    ap.add_argument("--array", default="numpy", choices=core.ARRAYS)
    ap.add_argument(
        "--module",
        action="append",
        choices=sorted(core.all_specs()),
        help="only the mutants of this module (repeatable; default all)",
    )
    ap.add_argument(
        "--until-caught",
        action="store_true",
        help="stop each mutant at the first property that catches it (no kill counts)",
    )
    args = ap.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.module or m.module in args.module]
    failed = 0
    for check in (check_oracles, check_goodness_of_fit_can_fail, check_coverage):
        try:
            check()
            print(f"ok    {check.__name__}: {check.__doc__}")
        except AssertionError as exc:
            failed += 1
            print(f"FAIL  {check.__name__}: {exc}")
    print(f"mutants ({len(mutants)}):")
    try:
        kills = check_mutants(args.array, args.profile, print, mutants, args.until_caught)
        print("ok    every mutant is caught")
    except AssertionError as exc:
        failed += 1
        print(f"FAIL  {exc}")
        kills = {}
    if kills and not args.until_caught:
        lonely = unkilled_properties(kills)
        if lonely:
            print("properties no mutant kills:")
            for pid in lonely:
                print(f"  {pid}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
