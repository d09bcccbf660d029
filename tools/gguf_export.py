"""Write a Llama-family model directory (default: the embedded model) as a llama.cpp .gguf.

    python tools/gguf_export.py OUT.gguf [--type F32|Q8_0|Q4_0|Q4_K|Q6_K] [--model DIR]

The tensors are quantized with pyagent's own `ops.gguf.quantize` (llama.cpp's reference
quantizers); see `pyagent_ref.quant.gguf.write_gguf` and docs/gguf.md.
"""

from __future__ import annotations

import argparse

from pyagent_ref.model import default_model_path
from pyagent_ref.quant.gguf import WRITE_TYPES, write_gguf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .gguf file to write")
    parser.add_argument("--type", default="Q8_0", choices=WRITE_TYPES)
    parser.add_argument("--model", default=None, help="model directory (default: embedded)")
    args = parser.parse_args()
    path = write_gguf(args.model or default_model_path(), args.out, args.type)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {args.type})")


if __name__ == "__main__":
    main()
