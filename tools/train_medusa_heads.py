#!/usr/bin/env python
"""Train Medusa heads for pyagent's embedded default model.

A Medusa head guesses a token further ahead than the model's own next token, from the
same final hidden state: with h_t the hidden state (after the final RMSNorm) of the last
token the model has read, the LM head gives token t + 1 and head j (j = 1 .. K) guesses
token t + 1 + j. The guesses of the K heads, a few candidates each, form a draft tree
that the target verifies in one forward pass (`pyagent_ref.spec_decode.medusa`,
`ops.spec_decode.verify_tree_greedy` / `rejection_sample_tree`).

What it does, in order (seeded; the base model is frozen):

1. **Data.** The default model's corpus, split and code streams, imported from
   ``tools/train_default_model.py`` (``collect_corpus``, every ``VAL_EVERY``-th file held
   out, ``token_streams`` with the shipped tokenizer: ``<|bos|> code <|eos|>`` packed).
   ``TRAIN_WINDOWS`` windows of ``SEQ_LEN`` tokens are drawn from the training stream
   and ``VAL_WINDOWS`` from the held-out one (``numpy.random.default_rng(SEED)``).
2. **Teacher.** The base model (``pyagent_ref/model/default``, float32) reads each window
   once; for position t it gives the hidden state h_t and its own argmax a_t (its
   guess for token t + 1). Head j's label at t is a_{t+j}: the token the base model
   itself predicts j positions later (self-distillation: the heads learn the model's
   continuation, which is what greedy verification accepts, not the corpus's).
3. **Heads** (Medusa-1): head_j(h) = E (h + SiLU(W_j h + b_j)), E the model's tied
   embedding matrix (frozen), W_j (hidden x hidden) initialised to zero so that each head
   starts as the base LM head. ``K`` = 3 heads, 65,792 parameters each.
4. **Training.** ``STEPS`` AdamW steps (lr ``LR``, cosine to 10 %) on batches of
   ``BATCH`` positions drawn from the cached (hidden state, labels) pairs, the loss the
   sum of the heads' cross-entropies.
5. **Measurement** on the held-out windows: each head's top-1 and top-k accuracy against
   its labels, and the greedy tree acceptance on ``ACCEPT_SAMPLES`` held-out prefixes:
   the base model continues each prefix greedily (HF ``generate``), the heads' tree
   (``MEDUSA_TREE``) is verified against that continuation with
   ``ops.spec_decode.verify_tree_greedy``, and the mean number of tokens per step
   (accepted drafts + 1) is reported, next to the chain of each head's top-1 guess.
6. **Export** to ``pyagent_ref/model/default_medusa/``: ``config.json``,
   ``medusa_heads.safetensors`` (float32, ``heads.{j}.weight`` / ``heads.{j}.bias`` for
   j = 0 .. K - 1) and a ``README.md`` with the figures and the checksum.

Usage (from the repository root; a few minutes on 2 CPU cores)::

    python tools/train_medusa_heads.py   # needs pyagent[engine,hf] (torch, transformers)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from train_default_model import (  # noqa: E402 - the tools directory is not a package
    REPO_ROOT,
    VAL_EVERY,
    collect_corpus,
    log,
    sha256_file,
    token_streams,
)

BASE = REPO_ROOT / "pyagent_ref" / "model" / "default"
DEFAULT_OUT = REPO_ROOT / "pyagent_ref" / "model" / "default_medusa"

SEED = 1234
K = 3  # heads: tokens t + 2 .. t + 1 + K
SEQ_LEN = 256
TRAIN_WINDOWS = 384
VAL_WINDOWS = 48
STEPS = 300
BATCH = 1024
LR = 3e-3
TOP_K = 5
ACCEPT_SAMPLES = 200
THREADS = 2


@torch.no_grad()
def teacher(model, stream: np.ndarray, n: int, rng: np.random.Generator):
    """(hidden states (n * (SEQ_LEN - K), H), labels (n * (SEQ_LEN - K), K)) from n random
    windows: labels[:, j - 1] is the base model's argmax j positions later."""
    starts = rng.integers(0, len(stream) - SEQ_LEN, size=n)
    hidden, labels = [], []
    for chunk in np.array_split(starts, max(1, n // 16)):
        ids = torch.from_numpy(stream[chunk[:, None] + np.arange(SEQ_LEN)])
        h = model.model(input_ids=ids).last_hidden_state  # after the final norm
        argmax = model.lm_head(h).argmax(dim=-1)
        keep = SEQ_LEN - K
        hidden.append(h[:, :keep].reshape(-1, h.shape[-1]))
        labels.append(torch.stack([argmax[:, j : j + keep] for j in range(1, K + 1)], dim=-1))
    return torch.cat(hidden), torch.cat(labels).reshape(-1, K)


class Heads(torch.nn.Module):
    """K residual blocks h + SiLU(W h + b) before the shared, frozen LM head."""

    def __init__(self, hidden: int, embedding: torch.Tensor):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(K))
        for head in self.heads:
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
        self.register_buffer("embedding", embedding)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (batch, K, vocab)."""
        return torch.stack([(h + F.silu(head(h))) @ self.embedding.T for head in self.heads], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"default {STEPS}")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    out: pathlib.Path = args.out.resolve()

    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from pyagent_ref.ops import spec_decode
    from pyagent_ref.spec_decode.medusa import MEDUSA_TREE, MedusaHeads

    t_start = time.perf_counter()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(THREADS)
    rng = np.random.default_rng(SEED)

    files = collect_corpus()
    tok = Tokenizer.from_file(str(BASE / "tokenizer.json"))
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(BASE))
    train_files = [f for i, f in enumerate(files) if i % VAL_EVERY != 0]
    val_files = [f for i, f in enumerate(files) if i % VAL_EVERY == 0]
    streams = token_streams(tok, hf_tok, train_files, val_files)
    train, val = streams.code.astype(np.int64), streams.val.astype(np.int64)
    model = LlamaForCausalLM.from_pretrained(str(BASE), torch_dtype=torch.float32).eval()
    model.requires_grad_(False)
    log(f"data: train {len(train):,} tokens, val {len(val):,} tokens")

    t0 = time.perf_counter()
    h_train, y_train = teacher(model, train, TRAIN_WINDOWS, rng)
    h_val, y_val = teacher(model, val, VAL_WINDOWS, rng)
    teacher_s = time.perf_counter() - t0
    log(f"teacher: {len(h_train):,} train, {len(h_val):,} val positions in {teacher_s:.0f}s")

    heads = Heads(h_train.shape[1], model.get_input_embeddings().weight.detach().clone())
    opt = torch.optim.AdamW(heads.heads.parameters(), lr=LR, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(args.steps):
        lr = LR * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / max(1, args.steps))))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.from_numpy(rng.integers(0, len(h_train), BATCH))
        logits = heads(h_train[idx])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y_train[idx].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - t0
            log(f"step {step:4d}  loss {loss.item() / K:.3f} per head  lr {lr:.2e}  {elapsed:.0f}s")
    train_s = time.perf_counter() - t0

    # per-head accuracy on the held-out positions
    with torch.no_grad():
        ranked = torch.cat([heads(h).topk(TOP_K, dim=-1).indices for h in h_val.split(4096)])
    hits = ranked == y_val[..., None]
    top1 = hits[..., 0].float().mean(0).tolist()
    topk = hits.any(-1).float().mean(0).tolist()
    for j in range(K):
        log(f"head {j + 1} (token t+{j + 2}): top-1 {top1[j]:.3f}, top-{TOP_K} {topk[j]:.3f}")

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for j, head in enumerate(heads.heads):
        tensors[f"heads.{j}.weight"] = head.weight.detach().contiguous()
        tensors[f"heads.{j}.bias"] = head.bias.detach().contiguous()
    save_file(tensors, str(out / "medusa_heads.safetensors"))
    config = {
        "base_model": "pyagent_ref/model/default",
        "num_heads": K,
        "hidden_size": int(h_train.shape[1]),
        "vocab_size": int(heads.embedding.shape[0]),
        "head": "h + SiLU(W h + b), then the base model's tied LM head",
        "hidden_state": "the base model's last hidden state, after the final RMSNorm",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    # greedy acceptance of the tree on held-out prefixes, with the shipped heads
    medusa = MedusaHeads.load(out)
    embedding = heads.embedding.numpy()
    tree_tokens, chain_tokens = [], []
    starts = rng.integers(64, len(val) - 8, size=ACCEPT_SAMPLES)
    with torch.no_grad():
        for start in starts.tolist():
            prefix = torch.from_numpy(val[max(0, start - SEQ_LEN) : start])[None]
            run = model.generate(prefix, max_new_tokens=K + 2, do_sample=False, pad_token_id=2)
            greedy = run[0, prefix.shape[1] :].tolist()  # y, then g_1 .. g_{K+1}
            if len(greedy) < K + 2:
                continue  # the model ended the text (<|eos|>) before K + 2 tokens
            h = model.model(input_ids=prefix).last_hidden_state[0, -1].numpy()
            for tree, emitted in ((MEDUSA_TREE, tree_tokens), (CHAIN, chain_tokens)):
                tokens, parents = medusa.draft_tree(h, embedding, tree)
                # target rows that make the greedy continuation the argmax on its path
                rows = np.full((len(tokens) + 1, embedding.shape[0]), -1.0)
                depth = [0]
                for parent in parents:
                    depth.append(depth[parent] + 1)
                rows[np.arange(len(depth)), [greedy[1 + d] for d in depth]] = 1.0
                got = spec_decode.verify_tree_greedy(rows, tokens, [len(tokens)], parents)
                emitted.append(int((got[0] >= 0).sum()))
    tree_mean, chain_mean = float(np.mean(tree_tokens)), float(np.mean(chain_tokens))
    log(
        f"greedy tokens per step: tree of {len(MEDUSA_TREE)} drafts {tree_mean:.3f}, "
        f"chain of the top-1 guesses {chain_mean:.3f} (no speculation: 1)"
    )
    write_readme(
        out,
        top1=top1,
        topk=topk,
        tree_mean=tree_mean,
        chain_mean=chain_mean,
        loss=loss.item() / K,
        steps=args.steps,
        positions=len(h_train),
        val_positions=len(h_val),
        teacher_s=teacher_s,
        train_s=train_s,
        total_s=time.perf_counter() - t_start,
        load=os.getloadavg()[0],
        sha=sha256_file(out / "medusa_heads.safetensors"),
        tree=len(MEDUSA_TREE),
    )
    return 0


CHAIN = [(0,) * d for d in range(1, K + 1)]  # each head's top-1 guess, one after the other


def write_readme(out: pathlib.Path, **r) -> None:
    heads = "\n".join(
        f"| {j + 1} | t + {j + 2} | {r['top1'][j]:.3f} | {r['topk'][j]:.3f} |" for j in range(K)
    )
    text = f"""# Medusa heads for the default model

Made by `python tools/train_medusa_heads.py` (seeded; read its docstring for the
recipe). {K} heads, each `h + SiLU(W h + b)` followed by the base model's tied LM head,
trained for {r["steps"]} AdamW steps of {BATCH} positions on {r["positions"]:,} cached
hidden states of the frozen base model (`../default`). Head j's label at position t is
the base model's own argmax at t + j (self-distillation). Final training loss
{r["loss"]:.3f} per head. Teacher pass {r["teacher_s"]:.0f}s, training {r["train_s"]:.0f}s,
{r["total_s"]:.0f}s in all on {THREADS} CPU threads (load average {r["load"]:.1f} at the end).

Accuracy on {r["val_positions"]:,} held-out positions (files the base model never saw),
against the base model's argmax:

| head | guesses token | top-1 | top-{TOP_K} |
|---|---|---|---|
{heads}

Greedy speculative decoding on {ACCEPT_SAMPLES} held-out prefixes (the base model's
greedy continuation verified with `ops.spec_decode.verify_tree_greedy`): mean tokens per
target forward pass {r["tree_mean"]:.3f} with the {r["tree"]}-draft tree
`pyagent_ref.spec_decode.medusa.MEDUSA_TREE`, {r["chain_mean"]:.3f} with the chain of
each head's top-1 guess, 1 without speculation.

`medusa_heads.safetensors` (float32, `heads.{{j}}.weight` (hidden, hidden) and
`heads.{{j}}.bias` (hidden,)), SHA-256 `{r["sha"]}`.
"""
    (out / "README.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
