#!/usr/bin/env python
"""Write a quantized checkpoint of a model: GPTQ, AWQ, compressed-tensors int8 / int4, FP8.

    python -m tools.quantize --format gptq|awq|int8|int4|fp8 [--group-size N] [--model DIR]
        [--method rtn|gptq] [--bits 4|8] [--act-order] [--asym] OUT_DIR

reads a float model directory (default: the embedded default model), quantizes every
decoder projection (q/k/v/o, gate/up/down; embeddings, norms and lm_head stay as they
are) and writes OUT_DIR: config.json with the format's `quantization_config`,
model.safetensors in the format's layout (`pyagent_ref.quant.<format>.store`), and the
source's tokenizer and generation files, so `pyagent_ref.model.load_model(OUT_DIR)`,
`LLM(OUT_DIR)` and `pyagent serve --model OUT_DIR` run it.

| --format | quant_method | codes | default method |
|---|---|---|---|
| gptq | "gptq" (checkpoint_format "gptq") | int4 (--bits 8: int8), symmetric unless --asym | gptq |
| awq | "awq" (GEMM) | int4 with zero points | rtn |
| int8, int4 | "compressed-tensors" (pack-quantized) | symmetric unless --asym | rtn |
| fp8 | "fp8" (vLLM's, activation_scheme "dynamic") | e4m3, one scale per tensor | rtn |

`--method rtn` is round-to-nearest (`ops.quant.quantize`). `--method gptq` is GPTQ's
error-compensating algorithm (`gptq_quantize`), with Hessians from calibration text (the
Python standard library's sources the default model was trained on) run through the
float model. AWQ's activation-aware channel scaling is not implemented: `--format awq`
writes RTN codes in AWQ's layout.

`--format fp8` is `ops.quant.quantize_fp8` (scale amax / 448, round to nearest even) of
each projection; it takes no group size, bits, --asym or --act-order.

`--group-size -1` (the default) is one group per row; a group size must divide every
projection's in_features (the default model's down_proj has 688).
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pyagent_ref import quant as quantfmt
from pyagent_ref.model import AttentionMetadata, load_model
from pyagent_ref.model.default_model import default_model_path
from pyagent_ref.model.loader import checkpoint_target
from pyagent_ref.ops import quant as quant_ops

FORMATS = {
    "gptq": "gptq",
    "awq": "awq",
    "int8": "compressed-tensors",
    "int4": "compressed-tensors",
    "fp8": "fp8",
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    bits: int,
    group_size: int | None,
    symmetric: bool = True,
    damp: float = 0.01,
    act_order: bool = False,
):
    """GPTQ: quantize W column by column, pushing each column's error onto the columns
    not yet quantized, weighted by the inverse Hessian of the layer's inputs.

    The layer's loss is ||X W^T - X Q^T||^2 with H = 2 X^T X / n (in, in). With
    U = chol(H^-1) upper-triangular (so H^-1 = U^T U, and row j of U, divided by U[j, j],
    is what the remaining columns' optimal update needs once columns < j are fixed),
    for each column j in order:

        q_j = quant(w_j)                       (RTN with the group's scale and zero)
        e_j = (w_j - deq(q_j)) / U[j, j]
        w_k -= e_j * U[j, k]       for k > j

    H is damped first: H + damp * mean(diag H) * I (columns never seen get H[j, j] = 1
    and weight 0). With act_order the columns go in order of decreasing H[j, j] (the most
    sensitive first); groups are then consecutive in that order, and g_idx[i] is the
    group of column i. A group's scale and zero point come from RTN's rules
    (`ops.quant.quantize`) on the group's columns as they stand when the group starts;
    per channel (group_size None), from the whole W before any update.

    Args:
        weight: float (out, in). hessian: float (in, in), symmetric positive semi-definite.
        bits: 4 or 8. group_size: None or an int dividing in. symmetric: zeros or not.
        damp: the damping fraction. act_order: quantize in decreasing-H[j, j] order.
    Returns:
        (codes int8 (out, in), scales float32 (out, groups), zeros int8 or None, g_idx
        int64 (in,) or None without act_order), in the input's column order.
    """
    W, H = weight.double().clone(), hessian.double().clone()
    out_features, n = W.shape
    dead = torch.diag(H) == 0
    H[dead, dead], W[:, dead] = 1.0, 0.0
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else torch.arange(n)
    W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.mean(torch.diag(H)) * torch.eye(n, dtype=H.dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    size = group_size or n
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    codes = torch.zeros(out_features, n, dtype=torch.int8)
    scales, zeros = [], []
    for j in range(n):
        if j % size == 0:  # the group's scale and zero, from the updated columns
            _, s, z = quant_ops.quantize(W[:, j : j + size], bits, None, symmetric)
            s, z = s[:, 0], torch.zeros_like(s[:, 0]) if z is None else z[:, 0].double()
            scales.append(s), zeros.append(z)
        q = torch.clamp(torch.round(W[:, j] / s) + z, qmin, qmax)
        codes[:, j] = q.to(torch.int8)
        err = (W[:, j] - (q - z) * s) / U[j, j]
        W[:, j + 1 :] -= err[:, None] * U[j, j + 1 :][None, :]
    inverse = torch.argsort(perm)
    g_idx = (inverse // size) if act_order else None
    zeros_out = None if symmetric else torch.stack(zeros, 1).to(torch.int8)
    return codes[:, inverse], torch.stack(scales, 1).float(), zeros_out, g_idx


# --- running the float model for calibration ---------------------------------------------


def forward(model, ids: list[int]) -> torch.Tensor:
    """Final hidden states (len(ids), hidden) of one sequence, prefilled in one step on a
    fresh paged cache (blocks of 16) on the model's device."""
    device = model.embed_tokens.weight.device
    n, block = len(ids), 16
    blocks = -(-n // block)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=device),
        block_table=torch.arange(blocks, dtype=torch.int32, device=device)[None],
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
    )
    caches = [model.new_kv_cache(blocks, block) for _ in model.layers]
    with torch.no_grad():
        return model(torch.tensor(ids, device=device), torch.arange(n, device=device), meta, caches)


def calibration_ids(model_dir: Path, tokens: int = 2048, window: int = 512) -> list[list[int]]:
    """Windows of `tokens` calibration tokens: standard-library sources (the default
    model's training text), tokenized with the model's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "".join(inspect.getsource(m) for m in (textwrap, argparse, shutil))
    ids = tok.encode(text).ids[:tokens]
    return [ids[i : i + window] for i in range(0, len(ids), window)]


def heldout_ids(model_dir: Path, tokens: int = 2048, window: int = 512) -> list[list[int]]:
    """Windows of `tokens` held-out tokens for perplexity: this project's own sources
    (`pyagent_ref.ops.quant`, `pyagent_ref.quant.gptq`), which the default model, trained
    on the standard library's, never saw."""
    from tokenizers import Tokenizer

    from pyagent_ref.ops import quant as ops_quant
    from pyagent_ref.quant import gptq

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tok.encode("".join(inspect.getsource(m) for m in (ops_quant, gptq))).ids[:tokens]
    return [ids[i : i + window] for i in range(0, len(ids), window)]


def perplexity(model, windows: list[list[int]]) -> float:
    """exp of the mean negative log-likelihood of each window's next tokens."""
    total, count = 0.0, 0
    for ids in windows:
        with torch.no_grad():
            logits = model.compute_logits(forward(model, ids))[:-1]
        targets = torch.tensor(ids[1:], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits.double(), targets, reduction="sum")
        total, count = total + float(nll), count + len(ids) - 1
    return float(torch.exp(torch.tensor(total / count)))


def hessians(model_dir: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """H = 2 X^T X / n of each HF projection's inputs X over the calibration windows
    (q, k, v share their fused qkv_proj's inputs; gate, up their gate_up_proj's)."""
    model = load_model(model_dir, dtype="float32", progress=False)
    paths = {name: checkpoint_target(model, name)[0].removesuffix(".weight") for name in names}
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(path):
        def record(module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            sums[path] = sums.get(path, 0) + 2 * x.T @ x
            counts[path] = counts.get(path, 0) + x.shape[0]

        return record

    handles = [
        model.get_submodule(p).register_forward_pre_hook(hook(p)) for p in set(paths.values())
    ]
    for ids in calibration_ids(model_dir):
        forward(model, ids)
    for h in handles:
        h.remove()
    return {name: sums[p] / counts[p] for name, p in paths.items()}


# --- writing --------------------------------------------------------------------------------


def quantize_dir(
    out_dir: str | Path,
    fmt: str,
    group_size: int | None = None,
    model_dir: str | Path | None = None,
    method: str | None = None,
    bits: int | None = None,
    symmetric: bool | None = None,
    act_order: bool = False,
    damp: float = 0.01,
) -> Path:
    """Write the quantized checkpoint of `model_dir` (default: the embedded model) to
    `out_dir` (see the module docstring); returns out_dir.

    Raises:
        ValueError: an unknown format or method, bits the format lacks, act_order
            without GPTQ, or a group size that does not divide a projection (the
            message names the value).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    method = method or ("gptq" if fmt == "gptq" else "rtn")
    if method not in ("rtn", "gptq"):
        raise ValueError(f"method must be 'rtn' or 'gptq', got {method!r}")
    if fmt == "fp8" and (method != "rtn" or group_size is not None or symmetric is False):
        raise ValueError(
            f"format 'fp8' takes no method {method!r}, group_size {group_size!r} or "
            f"asymmetric codes (one e4m3 scale per tensor)"
        )
    bits = bits or (8 if fmt in ("int8", "fp8") else 4)
    if bits not in ((4, 8) if fmt == "gptq" else (8,) if fmt in ("int8", "fp8") else (4,)):
        raise ValueError(f"bits {bits} is not available for format {fmt!r}")
    if act_order and method != "gptq":
        raise ValueError("act_order needs method 'gptq'")
    symmetric = (fmt != "awq") if symmetric is None else symmetric
    scheme = quantfmt.QuantScheme(
        FORMATS[fmt], bits, group_size, symmetric, act_order, v1_zeros=fmt == "gptq"
    )
    writer = quantfmt._formats()[scheme.method]
    model_dir = Path(model_dir) if model_dir is not None else default_model_path()
    out_dir = Path(out_dir)
    tensors = load_file(model_dir / "model.safetensors")
    names = [
        n
        for n, t in tensors.items()
        if t.ndim == 2 and n.endswith(tuple(f"{p}.weight" for p in PROJECTIONS))
    ]
    H = hessians(model_dir, names) if method == "gptq" else {}
    out = {n: t for n, t in tensors.items() if n not in names}
    for name in names:
        w = tensors[name].float()
        if fmt == "fp8":
            codes, scales = quant_ops.quantize_fp8(w, "e4m3", "tensor")
            out.update(writer.store(name.removesuffix(".weight"), codes, scales))
            continue
        if method == "gptq":
            codes, scales, zeros, g_idx = gptq_quantize(
                w, H[name], bits, group_size, symmetric, damp, act_order
            )
        else:
            (codes, scales, zeros), g_idx = quant_ops.quantize(w, bits, group_size, symmetric), None
        out.update(writer.store(name.removesuffix(".weight"), codes, scales, zeros, scheme, g_idx))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in out.items()}, out_dir / "model.safetensors")
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = writer.config(scheme)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in COPIED:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out_dir / name)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--format", required=True, choices=sorted(FORMATS))
    parser.add_argument("--group-size", type=int, default=-1, help="-1: per channel")
    parser.add_argument("--model", default=None, help="float model dir (default: embedded)")
    parser.add_argument("--method", choices=("rtn", "gptq"), default=None)
    parser.add_argument("--bits", type=int, default=None)
    parser.add_argument("--asym", action="store_true", help="zero points (AWQ always has them)")
    parser.add_argument("--act-order", action="store_true")
    parser.add_argument("--damp", type=float, default=0.01)
    args = parser.parse_args(argv)
    out = quantize_dir(
        args.out_dir,
        args.format,
        None if args.group_size == -1 else args.group_size,
        args.model,
        args.method,
        args.bits,
        False if args.asym else None,
        args.act_order,
        args.damp,
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
