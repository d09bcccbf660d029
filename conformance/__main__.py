"""python -m conformance <target> [module ...] [--profile dev|ci] [--array numpy|torch]
[--device cpu|cuda|...] ...

Exit status: 0 when every property passed (known divergences and missing ops allowed),
1 when a property failed (or, with --strict, an op is missing or a registered divergence
did not show), 2 for a usage error or a target that does not import.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import core, profiles
from .report import MARK, render


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m conformance",
        description="Check an implementation of the pyagent ops (and of byte-level BPE) against "
        "the specification.",
    )
    p.add_argument(
        "target",
        nargs="?",
        help="module to test: pyagent_ref, pyagent_accel, "
        "conformance.adapters.hf_transformers, ... "
        "(<target>.ops is used if it exists)",
    )
    p.add_argument(
        "modules",
        nargs="*",
        help="modules to check (default: all): the ops modules (sampling, hashing, ...), "
        "tokenize, native",
    )
    p.add_argument(
        "--profile", choices=profiles.PROFILES, default=os.environ.get("CONFORMANCE_PROFILE", "dev")
    )
    p.add_argument(
        "--array", choices=core.ARRAYS, default=os.environ.get("CONFORMANCE_ARRAY", "numpy")
    )
    p.add_argument(
        "--device",
        default=os.environ.get("CONFORMANCE_DEVICE", core.DEFAULT_DEVICE),
        help="device of the torch inputs (cpu, cuda, cuda:1, ...; numpy: cpu only); "
        "results are compared on the host",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help="property ids (fnmatch or prefix), repeatable",
    )
    p.add_argument(
        "--blob", help="replay one failure: the @reproduce_failure blob printed by a repro line"
    )
    p.add_argument(
        "--strict", action="store_true", help="missing ops and stale divergences fail the run"
    )
    p.add_argument(
        "--native",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the PEP 399 native checks (default: only for pyagent_accel)",
    )
    p.add_argument("--list", action="store_true", help="list the properties and exit")
    p.add_argument(
        "-v", "--verbose", action="store_true", help="tracebacks of failures, one line per property"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        for prop in core.iter_properties():
            print(f"{prop.id:75s} {prop.doc}")
        return 0
    if not args.target:
        parser().error("a target module is required")
    try:
        impl = core.resolve(args.target)
        for module in args.modules or core.all_specs():
            if module in core.all_specs():
                impl.ops_module(module)  # adapters import their library here (clear ImportError)
    except ImportError as exc:
        print(f"conformance: cannot import {args.target!r}: {exc}", file=sys.stderr)
        return 2
    try:
        args.device = core.check_device(args.array, args.device)
    except ValueError as exc:
        parser().error(f"--device {args.device}: {exc}")
    if args.blob and not args.only:
        parser().error("--blob replays one property: give it with --only <property id>")

    def progress(outcome: core.Outcome) -> None:
        if args.verbose:
            print(
                f"{outcome.status:8s} {outcome.prop.id} ({outcome.seconds:.2f}s)", file=sys.stderr
            )
        else:
            print(MARK[outcome.status], end="", file=sys.stderr, flush=True)

    try:
        report = core.run(
            impl,
            args.modules or None,
            args.array,
            args.profile,
            args.only,
            args.blob,
            args.native,
            progress,
            args.device,
        )
    except ValueError as exc:
        parser().error(str(exc))
    if not args.verbose:
        print(file=sys.stderr)
    if not report.outcomes:
        print("conformance: no property selected", file=sys.stderr)
        return 2
    print(render(report, verbose=args.verbose, strict=args.strict))
    ok = report.ok_strict() if args.strict else report.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
