"""Plain-text rendering of a `Report`: the per-op table, then failures, known
divergences, missing ops and notes."""

from __future__ import annotations

from collections import OrderedDict

import hypothesis

from .core import FAIL, KNOWN, MISSING, PASS, SKIP, Outcome, Report, unspecified_modules

MARK = {PASS: ".", FAIL: "F", KNOWN: "k", MISSING: "m", SKIP: "s"}


def by_op(report: Report) -> OrderedDict[str, list[Outcome]]:
    groups: OrderedDict[str, list[Outcome]] = OrderedDict()
    for o in report.outcomes:
        groups.setdefault(o.prop.qualified_op, []).append(o)
    return groups


def op_status(outcomes: list[Outcome]) -> str:
    """One word for an op: FAIL, MISSING, KNOWN DIVERGENCE or PASS."""
    statuses = {o.status for o in outcomes}
    if FAIL in statuses:
        return "FAIL"
    if statuses <= {MISSING}:
        return "MISSING"
    if KNOWN in statuses:
        return "KNOWN DIVERGENCE"
    return "PASS"


def table(report: Report) -> str:
    head = ("op", "passed", "failed", "known", "missing", "skipped", "status", "seconds")
    rows = []
    for op, outcomes in by_op(report).items():
        n = {
            s: str(sum(o.status == s for o in outcomes)) for s in (PASS, FAIL, KNOWN, MISSING, SKIP)
        }
        rows.append(
            (
                op,
                n[PASS],
                n[FAIL],
                n[KNOWN],
                n[MISSING],
                n[SKIP],
                op_status(outcomes),
                f"{sum(o.seconds for o in outcomes):.1f}",
            )
        )
    total = [sum(int(r[i]) for r in rows) for i in range(1, 6)]
    rows.append(("TOTAL", *map(str, total), "", f"{report.seconds:.1f}"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(  # noqa: E731
        c.ljust(w) if i in (0, 6) else c.rjust(w)
        for i, (c, w) in enumerate(zip(r, widths, strict=True))
    ).rstrip()
    rule = "-" * len(line(head))
    return "\n".join([line(head), rule, *map(line, rows[:-1]), rule, line(rows[-1])])


def render(report: Report, verbose: bool = False, strict: bool = False) -> str:
    out = [
        f"conformance of {report.label}{' (' + report.version + ')' if report.version else ''}, "
        f"array={report.array}"
        f"{'' if report.device == 'cpu' else ' on ' + report.device}, "
        f"profile={report.profile}, hypothesis {hypothesis.__version__}",
        "",
        table(report),
    ]
    failures = [o for o in report.outcomes if o.status == FAIL]
    known = [o for o in report.outcomes if o.status == KNOWN]
    missing = [o for o in report.outcomes if o.status == MISSING]
    notes = [o for o in report.outcomes if o.note and o.status == PASS]
    if failures:
        out += ["", f"FAILURES ({len(failures)})"]
        for o in failures:
            out += [f"  {o.prop.id}  -- {o.prop.doc}", f"    {o.message}"]
            if o.counterexample:
                out.append(f"    counterexample: {o.counterexample}")
            out.append(f"    repro: {o.repro}")
            if verbose and o.traceback:
                out += ["    " + line for line in o.traceback.rstrip().splitlines()]
    if known:
        out += ["", f"KNOWN DIVERGENCES ({len(known)}, see conformance/divergences.py)"]
        for o in known:
            out += [f"  {o.prop.id}: {o.message}", f"    reason: {o.note}"]
            if o.counterexample and verbose:
                out.append(f"    counterexample: {o.counterexample}")
    if missing:
        out += ["", "MISSING (not provided by the implementation; --strict makes this an error)"]
        for op, outcomes in by_op(report).items():
            gone = [o for o in outcomes if o.status == MISSING]
            if gone:
                out.append(f"  {op}: {len(gone)} properties not run ({gone[0].message})")
    if notes:
        out += ["", "NOTES"]
        out += [f"  {o.prop.id}: {o.note}" for o in notes]
    uncovered = unspecified_modules()
    if uncovered:
        out += [
            "",
            "NOT COVERED: reference ops modules without a spec in this suite: "
            + ", ".join(uncovered),
        ]
    ok = report.ok_strict() if strict else report.ok
    verdict = "PASS" if ok else "FAIL"
    out += [
        "",
        f"{verdict}: {sum(o.status == PASS for o in report.outcomes)} passed, "
        f"{len(failures)} failed, "
        f"{len(known)} known divergences, {len(missing)} missing, "
        f"{sum(o.status == SKIP for o in report.outcomes)} skipped in {report.seconds:.1f}s",
    ]
    return "\n".join(out)
