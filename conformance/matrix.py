"""The conformance matrix: every op against every implementation, as a markdown table.

    python -m conformance.matrix                        # print the matrix
    python -m conformance.matrix --write docs/conformance.md

Columns: pyagent_ref on numpy and on torch, pyagent_accel on numpy and torch (when it
imports), and the Hugging Face transformers adapter (when transformers imports). Each
runs the whole suite with the given profile (default ci, deterministic). `--write`
replaces the text between the `<!-- conformance-matrix:start -->` and
`<!-- conformance-matrix:end -->` markers of the file. The exit status is 1 if any cell
has an unexplained failure.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hypothesis

from . import core
from .report import by_op

STATUSES = (core.PASS, core.FAIL, core.KNOWN, core.MISSING, core.SKIP)

START, END = "<!-- conformance-matrix:start -->", "<!-- conformance-matrix:end -->"
HF = "conformance.adapters.hf_transformers"

COLUMNS = (
    ("pyagent_ref", "numpy"),
    ("pyagent_ref", "torch"),
    ("pyagent_accel", "numpy"),
    ("pyagent_accel", "torch"),
    (HF, "torch"),
)
SHORT = {HF: "hf_transformers"}


def available(target: str) -> str | None:
    """None if the target imports (with its ops), else why not."""
    try:
        impl = core.resolve(target)
        for module in core.all_specs():
            impl.ops_module(module)
    except ImportError as exc:
        return str(exc).splitlines()[0]
    if target == "pyagent_accel":
        try:
            importlib.import_module("pyagent_accel._native")
        except ImportError as exc:
            return f"pyagent_accel._native does not import: {exc}"
    return None


@dataclass
class Column:
    target: str
    array: str
    report: core.Report | None = None
    why_not: str = ""

    @property
    def name(self) -> str:
        return f"{SHORT.get(self.target, self.target)} ({self.array})"


def build(profile: str = "ci", echo: Callable[[str], None] | None = None) -> tuple[str, bool]:
    """(markdown, ok): the matrix and whether no cell has an unexplained failure."""
    columns = [Column(t, a) for t, a in COLUMNS]
    for col in columns:
        col.why_not = available(col.target) or ""
        if col.why_not:
            if echo:
                echo(f"{col.name}: not run ({col.why_not})")
            continue
        col.report = core.run(col.target, array=col.array, profile=profile)
        if echo:
            failed = sum(o.failed for o in col.report.outcomes)
            echo(f"{col.name}: {col.report.seconds:.1f}s, {failed} failed")
    ran = [c for c in columns if c.report is not None]
    groups = {c.name: by_op(c.report) for c in ran}
    ops = list(dict.fromkeys(op for c in ran for op in groups[c.name]))
    out = [
        "| op | " + " | ".join(c.name for c in ran) + " |",
        "|---|" + "---|" * len(ran),
    ]
    for op in ops:
        cells = [cell(groups[c.name][op]) if op in groups[c.name] else "" for c in ran]
        out.append(f"| `{op}` | " + " | ".join(cells) + " |")
    totals = []
    for c in ran:
        n = {s: sum(o.status == s for o in c.report.outcomes) for s in STATUSES}
        totals.append(
            f"{n[core.PASS]} pass, {n[core.FAIL]} fail, {n[core.KNOWN]} known, "
            f"{n[core.MISSING]} missing, {c.report.seconds:.0f}s"
        )
    out += ["| **total** | " + " | ".join(totals) + " |", ""]
    out += [f"*{c.name}: not run here ({c.why_not}).*" for c in columns if c.why_not]
    versions = "".join(f"; {c.name}: {c.report.version}" for c in ran if c.report.version)
    out.append(
        f"*Profile `{profile}`, hypothesis {hypothesis.__version__}{versions}. "
        "✅ all properties pass · ⚠️ the failures are registered divergences · "
        "❌ unexplained failures · — op not provided.*"
    )
    # One line per (implementation, property, message): the same bug in many ops once.
    failures: dict[tuple[str, str, str], tuple[list[str], list[str]]] = {}
    for c in ran:
        for o in c.report.outcomes:
            if o.failed:
                message = o.message.replace("logprobs must", "logits must")
                key = (SHORT.get(c.target, c.target), o.prop.name, message)
                arrays, where = failures.setdefault(key, ([], []))
                arrays.append(c.array) if c.array not in arrays else None
                where.append(o.prop.qualified_op) if o.prop.qualified_op not in where else None
    if failures:
        out += ["", "Unexplained failures:", ""]
        for (target, name, message), (arrays, where) in failures.items():
            listed = ", ".join(f"`{op}`" for op in where)
            out.append(
                f"- {target} ({', '.join(arrays)}), `{name}` of {len(where)} ops "
                f"({listed}): {message}"
            )
    return "\n".join(out), not failures


def cell(outcomes: list[core.Outcome]) -> str:
    """One op's result: passed/applicable, then failures, known divergences, missing."""
    n = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    ran = n[core.PASS] + n[core.FAIL] + n[core.KNOWN]
    if ran == 0 and n[core.MISSING]:
        return "— missing"
    text = f"{n[core.PASS]}/{ran}"
    if n[core.FAIL]:
        return f"❌ {text}, {n[core.FAIL]} failed"
    if n[core.KNOWN]:
        return f"⚠️ {text}, {n[core.KNOWN]} known"
    return f"✅ {text}"


CATALOGUE = ("<!-- conformance-properties:start -->", "<!-- conformance-properties:end -->")


def catalogue() -> str:
    """Markdown list of every property, by op, with the first sentence of its docstring."""
    from .native import SPEC as NATIVE

    out = []
    for spec in [*core.all_specs().values(), NATIVE]:
        ops: dict[str, list[core.Property]] = {}
        for prop in spec.properties:
            ops.setdefault(prop.op, []).append(prop)
        for op, props in ops.items():
            out.append(f"**`{spec.module}.{op}`**\n")
            for prop in props:
                tag = " *(differential)*" if prop.differential else ""
                doc = prop.doc.replace("*", "\\*")
                out.append(f"- `{prop.name}`{tag}: {doc}")
            out.append("")
    return "\n".join(out).rstrip()


def replace_between(text: str, markers: tuple[str, str], body: str, path: Path) -> str:
    start, end = markers
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} markers")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{body}\n{end}{after}"


def write(path: Path, table: str) -> None:
    """Replace the matrix (and the property catalogue, if marked) in `path`."""
    text = replace_between(path.read_text(), (START, END), table, path)
    if CATALOGUE[0] in text:
        text = replace_between(text, CATALOGUE, catalogue(), path)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m conformance.matrix", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--profile", default="ci", choices=("dev", "ci"))
    ap.add_argument(
        "--write", type=Path, metavar="FILE", help="replace the matrix between the markers of FILE"
    )
    args = ap.parse_args(argv)
    start = time.perf_counter()
    table, ok = build(args.profile, echo=lambda s: print(s, file=sys.stderr))
    print(f"total {time.perf_counter() - start:.1f}s", file=sys.stderr)
    if args.write:
        write(args.write, table)
    else:
        print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
