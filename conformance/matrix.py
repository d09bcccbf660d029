"""The conformance matrix: every op against every implementation, as a markdown table.

    python -m conformance.matrix                        # print the matrix
    python -m conformance.matrix --write docs/conformance.md
    python -m conformance.matrix --vllm --write docs/conformance.md   # needs vLLM (nox -s vllm)

Columns: pyagent_ref on numpy and on torch, pyagent_accel on numpy and torch (when it
imports), and the Hugging Face transformers adapter (when transformers imports). Each
runs the ops specs with the given profile (default ci, deterministic). A second table
runs the `tokenize` spec on pyagent_ref, pyagent_accel and the tokenizers and tiktoken
adapters, followed by the adapters' registered divergences grouped by reason; a third runs
the `structured` op and the `matcher` spec (token matchers of structured output) on
pyagent_ref, pyagent_accel and the llguidance and xgrammar adapters, followed by theirs.
`--write`
replaces the text between the `<!-- conformance-matrix:start -->` and
`<!-- conformance-matrix:end -->` markers of the file. The exit status is 1 if any cell
has an unexplained failure.

`--vllm` builds the vLLM adapter's columns (numpy and torch) instead, followed by its
registered divergences grouped by reason, and writes them between the
`conformance-matrix-vllm` markers. They have their own block because vLLM is installed only
by the optional `nox -s vllm` session: regenerating the main matrix without it keeps them.
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
from .specs import OTHER_CONTRACTS

STATUSES = (core.PASS, core.FAIL, core.KNOWN, core.MISSING, core.SKIP)

START, END = "<!-- conformance-matrix:start -->", "<!-- conformance-matrix:end -->"
HF = "conformance.adapters.hf_transformers"
VLLM = "conformance.adapters.vllm"
HF_TOKENIZERS = "conformance.adapters.hf_tokenizers"
TIKTOKEN = "conformance.adapters.tiktoken"
LLGUIDANCE = "conformance.adapters.llguidance"
XGRAMMAR = "conformance.adapters.xgrammar"
GGUF_PY = "conformance.adapters.gguf_py"
COMPRESSED_TENSORS = "conformance.adapters.compressed_tensors"
SDPA = "pyagent_ref.attention_backends.sdpa"
FLEX = "pyagent_ref.attention_backends.flex"

COLUMNS = (
    ("pyagent_ref", "numpy"),
    ("pyagent_ref", "torch"),
    ("pyagent_accel", "numpy"),
    ("pyagent_accel", "torch"),
    (HF, "torch"),
)
VLLM_COLUMNS = ((VLLM, "numpy"), (VLLM, "torch"))
TOKENIZE_COLUMNS = (
    ("pyagent_ref", "numpy"),
    ("pyagent_accel", "numpy"),
    (HF_TOKENIZERS, "numpy"),
    (TIKTOKEN, "numpy"),
)
STRUCTURED_COLUMNS = (
    ("pyagent_ref", "numpy"),
    ("pyagent_accel", "numpy"),
    (LLGUIDANCE, "numpy"),
    (XGRAMMAR, "numpy"),
)
QUANT_COLUMNS = (
    ("pyagent_ref", "numpy"),
    ("pyagent_accel", "numpy"),
    (GGUF_PY, "numpy"),
    (COMPRESSED_TENSORS, "numpy"),
)
ATTENTION_COLUMNS = (
    ("pyagent_ref", "torch"),
    ("pyagent_accel", "torch"),
    (SDPA, "torch"),
    (FLEX, "torch"),
)
QUANT_MODULES = ["quant", "gguf"]  # the formats third-party libraries read and write
SHORT = {
    HF: "hf_transformers",
    VLLM: "vllm",
    HF_TOKENIZERS: "hf_tokenizers",
    TIKTOKEN: "tiktoken",
    LLGUIDANCE: "llguidance",
    XGRAMMAR: "xgrammar",
    GGUF_PY: "gguf_py",
    COMPRESSED_TENSORS: "compressed_tensors",
    SDPA: "sdpa backend",
    FLEX: "flex backend",
}
VLLM_MARKERS = ("<!-- conformance-matrix-vllm:start -->", "<!-- conformance-matrix-vllm:end -->")


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
    """(markdown, ok): the ops matrix, then the tokenization, structured-output and
    quantized-format ones, each with its libraries' divergences, and the attention
    backends'; and whether no cell has an unexplained failure."""
    ops_table, ops_ok = render(run_columns(COLUMNS, profile, echo, ops_modules()), profile)
    columns = run_columns(TOKENIZE_COLUMNS, profile, echo, ["tokenize"], native=False)
    tokenize_table, tokenize_ok = render(columns, profile)
    reasons = "\n".join(
        known_divergences(c.target, [c.report])
        for c in columns
        if c.report is not None and c.target in (HF_TOKENIZERS, TIKTOKEN)
    )
    columns = run_columns(
        STRUCTURED_COLUMNS, profile, echo, ["structured", "matcher"], native=False
    )
    structured_table, structured_ok = render(columns, profile)
    structured_reasons = "\n".join(
        known_divergences(c.target, [c.report])
        for c in columns
        if c.report is not None and c.target in (LLGUIDANCE, XGRAMMAR)
    )
    columns = run_columns(QUANT_COLUMNS, profile, echo, QUANT_MODULES, native=False)
    quant_table, quant_ok = render(columns, profile)
    quant_reasons = "\n".join(
        known_divergences(c.target, [c.report])
        for c in columns
        if c.report is not None and c.target in (GGUF_PY, COMPRESSED_TENSORS)
    )
    columns = run_columns(ATTENTION_COLUMNS, profile, echo, ["attention"], native=False)
    attention_table, attention_ok = render(columns, profile)
    markdown = (
        f"{ops_table}\n\nTokenization (`conformance/specs/tokenize.py`):\n\n{tokenize_table}"
        f"\n\nRegistered divergences of the tokenizer libraries, by reason:\n\n{reasons}"
        "\n\nStructured output (the op of `conformance/specs/structured.py` and the token "
        f"matchers of `conformance/specs/matcher.py`):\n\n{structured_table}"
        "\n\nRegistered divergences of the structured-output libraries, by reason:"
        f"\n\n{structured_reasons}"
        "\n\nQuantized formats, against the libraries that read and write them (the ops of "
        f"`conformance/specs/quant.py` and `conformance/specs/gguf.py`):\n\n{quant_table}"
        f"\n\nRegistered divergences of the format libraries, by reason:\n\n{quant_reasons}"
    )
    markdown += (
        "\n\nThe engine's attention backends (`pyagent_ref.attention_backends`: torch's "
        "scaled_dot_product_attention and flex_attention, run eagerly) on the attention "
        f"spec; they leave the cache writes to the ops (missing here):\n\n{attention_table}"
    )
    return markdown, all((ops_ok, tokenize_ok, structured_ok, quant_ok, attention_ok))


def ops_modules() -> list[str]:
    """The specified ops modules (the specs but those of `OTHER_CONTRACTS`)."""
    return [m for m in core.all_specs() if m not in OTHER_CONTRACTS]


def run_columns(
    columns_of: tuple[tuple[str, str], ...],
    profile: str,
    echo: Callable[[str], None] | None = None,
    modules: list[str] | None = None,
    native: bool | None = None,
) -> list[Column]:
    """Run the suite (the given modules, default all) for each (target, array) that
    imports."""
    columns = [Column(t, a) for t, a in columns_of]
    for col in columns:
        col.why_not = available(col.target) or ""
        if col.why_not:
            if echo:
                echo(f"{col.name}: not run ({col.why_not})")
            continue
        col.report = core.run(col.target, modules, array=col.array, profile=profile, native=native)
        if echo:
            failed = sum(o.failed for o in col.report.outcomes)
            echo(f"{col.name}: {col.report.seconds:.1f}s, {failed} failed")
    return columns


def render(columns: list[Column], profile: str) -> tuple[str, bool]:
    """(markdown, ok): the matrix of the columns' reports."""
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


def known_divergences(target: str, reports: list[core.Report]) -> str:
    """Markdown list of the registered divergences of `target` that the reports observed,
    one item per reason with the properties it explains (a registered reason that joins
    several with "; " counts for each), then those the conformance properties cannot
    observe (registered under names that are no op of a spec, checked by the target's tests)."""
    from . import divergences

    seen: dict[str, list[str]] = {}  # reason -> ids of the properties it explains
    for report in reports:
        for o in report.outcomes:
            for reason in o.note.split("; ") if o.status == core.KNOWN else ():
                ids = seen.setdefault(reason, [])
                ids.append(o.prop.id) if o.prop.id not in ids else None
    out = [f"- {reason}: {', '.join(f'`{i}`' for i in ids)}." for reason, ids in seen.items()]
    specified = {f"{m}.{op}" for m, spec in core.all_specs().items() for op in spec.ops}
    for d in divergences.for_implementation(target):
        if d.op not in specified:
            out.append(f"- {d.reason}: `{d.op}` ({d.property.replace('_', ' ')}).")
    return "\n".join(out)


def build_vllm(profile: str = "ci", echo: Callable[[str], None] | None = None) -> tuple[str, bool]:
    """(markdown, ok): the vLLM adapter's columns and its divergences (ImportError without
    vLLM)."""
    why_not = available(VLLM)
    if why_not:
        raise ImportError(why_not)
    columns = run_columns(VLLM_COLUMNS, profile, echo, ops_modules())
    table, ok = render(columns, profile)
    listed = known_divergences(VLLM, [c.report for c in columns if c.report is not None])
    return f"{table}\n\nRegistered divergences, by reason:\n\n{listed}", ok


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
        # ops with the same properties (the vocabularies of tokenize) are listed once
        alike: dict[tuple[tuple[str, str, bool], ...], list[str]] = {}
        for op, props in ops.items():
            alike.setdefault(tuple((p.name, p.doc, p.differential) for p in props), []).append(op)
        for names in alike.values():
            props = ops[names[0]]
            out.append(", ".join(f"**`{spec.module}.{op}`**" for op in names) + "\n")
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


def write(path: Path, table: str, markers: tuple[str, str] = (START, END)) -> None:
    """Replace the matrix between `markers` in `path` (and, for the main matrix, the property
    catalogue, if marked)."""
    text = replace_between(path.read_text(), markers, table, path)
    if markers == (START, END) and CATALOGUE[0] in text:
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
    ap.add_argument(
        "--vllm",
        action="store_true",
        help="the vLLM adapter's columns and divergences instead (needs vLLM: nox -s vllm)",
    )
    args = ap.parse_args(argv)
    start = time.perf_counter()
    echo = lambda s: print(s, file=sys.stderr)  # noqa: E731
    if args.vllm:
        try:
            table, ok = build_vllm(args.profile, echo)
        except ImportError as exc:
            print(f"conformance.matrix: vLLM does not import: {exc}", file=sys.stderr)
            return 2
    else:
        table, ok = build(args.profile, echo)
    print(f"total {time.perf_counter() - start:.1f}s", file=sys.stderr)
    if args.write:
        write(args.write, table, VLLM_MARKERS if args.vllm else (START, END))
    else:
        print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
