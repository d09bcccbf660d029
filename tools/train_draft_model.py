#!/usr/bin/env python
"""Train the draft model of the embedded default model, for speculative decoding.

Speculative decoding's "draft_model" method (`pyagent_ref.spec_decode.draft_model`)
needs a model much cheaper than the target that predicts the target's next tokens well,
over the same vocabulary. This script makes one for the embedded default model
(``pyagent_ref/model/default/``) by **distillation**: a one-layer Llama with the same
tokenizer learns to match the default model's next-token distributions.

What it does, in order (deterministic, like ``tools/train_default_model.py``):

1. **Data.** The default model's own corpus and token streams, made by the functions of
   ``train_default_model.py`` (imported, not copied): the standard library's sources
   (``collect_corpus``), the same held-out files, the same packing, space splitting and
   chat conversations (``token_streams``), tokenized with the *shipped* tokenizer of the
   default model (so the ids are the target's, whatever the tokenizer trainer does).
2. **Teacher.** The default model, read with ``transformers`` (bfloat16 weights upcast
   to float32, forward under bfloat16 autocast), frozen.
3. **Student.** ``transformers.LlamaForCausalLM`` with ``DRAFT``'s dims (hidden 128, one
   layer, 4 query heads and 2 KV heads of dim 32, intermediate 344, tied embeddings,
   1024 positions, the default model's special token ids), seeded initialisation.
4. **Training.** ``STEPS`` (600) AdamW steps on the default model's batches
   (``training_batch``: 8 windows of 256 tokens, chat windows with probability 1/8) and
   learning-rate schedule (``lr_at``); the loss is KL(teacher || student) of the
   next-token distributions at every position, averaged over positions, taken in
   float32. Matching the whole distribution rather than the teacher's argmax alone
   teaches the student more per token, and what speculative decoding accepts is the
   argmax.
5. **Export** to ``pyagent_ref/model/default_draft/``: ``config.json``,
   ``generation_config.json``, ``model.safetensors`` (bfloat16, HF names, no
   ``lm_head.weight``) and a ``README.md`` with the run's figures. No tokenizer files:
   the draft shares the default model's tokenizer (pyagent's loader reads only the
   config and the weights).
6. **Measurement.** Greedy agreement of the exported student with the teacher: the share
   of positions where the student's argmax is the teacher's, on held-out windows, and on
   the teacher's own greedy continuations of a few prompts (the contexts a draft sees in
   speculative decoding, where the greedy acceptance of the first draft is exactly this
   share).

Reproducibility: seeds (``SEED``), ``torch.use_deterministic_algorithms(True)``,
``torch.set_num_threads(1)``; the same command on the same machine gives the same bytes
(the README records the SHA-256). One thread, not two: on a shared machine torch's
two-thread matrix products wait for busy cores, and a trial step took 5 times longer with
two threads than with one there (2.8 s against 0.53 s, load average 4.5 on 2 cores).
The run takes about 5 minutes on an idle core, and about 25 on a busy 2-core machine.

Usage (from the repository root)::

    python tools/train_draft_model.py   # needs pyagent[engine,hf] (torch, transformers)

``--steps N``, ``--layers N`` and ``--out DIR`` exist for experiments; the committed
draft is the one made by the command without options.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_default_model as base  # noqa: E402  (also sets the offline HF variables)

from pyagent_ref.model import default_model_path  # noqa: E402

DEFAULT_OUT = base.REPO_ROOT / "pyagent_ref" / "model" / "default_draft"

SEED = base.SEED
DRAFT = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=base.MODEL_MAX_LENGTH,
    initializer_range=0.02,
)
STEPS = 600
THREADS = 1
AGREEMENT_NEW_TOKENS = 128
AGREEMENT_PROMPTS = (*base.SAMPLE_PROMPTS, "import sys\n", "# Copyright", "for i in range(")


def distill_loss(student, teacher, batch: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, mean over positions."""
    inputs = batch[:, :-1]
    with torch.no_grad():
        target = F.log_softmax(teacher(input_ids=inputs).logits.float(), dim=-1)
    logp = F.log_softmax(student(input_ids=inputs).logits.float(), dim=-1)
    vocab = logp.shape[-1]
    return F.kl_div(
        logp.reshape(-1, vocab), target.reshape(-1, vocab), log_target=True, reduction="batchmean"
    )


@torch.no_grad()
def agreement(student, teacher, ids: torch.Tensor, start: int = 0) -> tuple[int, int]:
    """(positions where the argmaxes agree, positions) over ids[:, start:-1]'s next tokens."""
    a = student(input_ids=ids).logits[:, start:-1].argmax(-1)
    b = teacher(input_ids=ids).logits[:, start:-1].argmax(-1)
    return int((a == b).sum()), a.numel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"default {STEPS}")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--layers", type=int, default=DRAFT["num_hidden_layers"], help="default 1")
    args = parser.parse_args(argv)
    steps, out = args.steps, args.out.resolve()
    dims = DRAFT | {"num_hidden_layers": args.layers}

    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    t_start = time.perf_counter()
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(THREADS)

    # 1. data: the default model's corpus and streams, with its shipped tokenizer
    teacher_dir = default_model_path()
    files = base.collect_corpus()
    train_files = [f for i, f in enumerate(files) if i % base.VAL_EVERY != 0]
    val_files = [f for i, f in enumerate(files) if i % base.VAL_EVERY == 0]
    tok = Tokenizer.from_file(str(teacher_dir / "tokenizer.json"))
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(teacher_dir))
    streams = base.token_streams(tok, hf_tok, train_files, val_files)
    base.log(
        f"data: {len(files)} files; code {len(streams.code):,}, val {len(streams.val):,}, "
        f"chat {len(streams.chat):,} tokens"
    )

    # 2. teacher, 3. student
    teacher = LlamaForCausalLM.from_pretrained(str(teacher_dir)).float().eval()
    teacher.requires_grad_(False)
    torch.manual_seed(SEED)
    student = LlamaForCausalLM._from_config(base.make_config(dims), attn_implementation="sdpa")
    student.train()
    n_params = sum(p.numel() for p in student.parameters())
    base.log(f"student: {n_params:,} parameters (embeddings tied)")

    decay = [p for p in student.parameters() if p.dim() >= 2]
    no_decay = [p for p in student.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": base.WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=base.PEAK_LR,
        betas=base.BETAS,
        eps=1e-8,
        foreach=False,
    )

    # 4. train
    rng = np.random.default_rng(SEED)
    losses: list[float] = []
    t_train = time.perf_counter()
    for step in range(steps):
        lr = base.lr_at(step, steps)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = base.training_batch(rng, streams)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=base.AUTOCAST_BF16):
            loss = distill_loss(student, teacher, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), base.GRAD_CLIP)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - t_train
            base.log(
                f"step {step + 1:4d}/{steps}  KL {losses[-1]:.4f}  lr {lr:.2e}  {elapsed:6.1f}s"
            )
    train_seconds = time.perf_counter() - t_train

    # 5. export
    out.mkdir(parents=True, exist_ok=True)
    base.save_weights(student, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(base.config_json(dims), indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(base.generation_config_json(), indent=2) + "\n"
    )

    # 6. measure, from the files just written
    draft = LlamaForCausalLM.from_pretrained(str(out)).float().eval()
    vrng = np.random.default_rng(SEED + 1)
    vstarts = vrng.integers(0, len(streams.val) - base.SEQ_LEN - 1, size=base.VAL_WINDOWS)
    vbatch = base.windows(streams.val, vstarts)
    with torch.no_grad():
        val_kl = float(distill_loss(draft, teacher, vbatch))
    val_agree, val_total = agreement(draft, teacher, vbatch)
    gen_agree = gen_total = 0
    for prompt in AGREEMENT_PROMPTS:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids])
        with torch.no_grad():
            gen = teacher.generate(
                ids,
                max_new_tokens=AGREEMENT_NEW_TOKENS,
                do_sample=False,
                pad_token_id=base.PAD_ID,
            )
        agree, total = agreement(draft, teacher, gen, start=ids.shape[1] - 1)
        gen_agree, gen_total = gen_agree + agree, gen_total + total
    total_seconds = time.perf_counter() - t_start
    figures = dict(
        n_params=n_params,
        steps=steps,
        final_kl=float(np.mean(losses[-10:])),
        val_kl=val_kl,
        val_agreement=val_agree / val_total,
        gen_agreement=gen_agree / gen_total,
        gen_positions=gen_total,
        train_seconds=train_seconds,
        total_seconds=total_seconds,
        weights_sha=base.sha256_file(out / "model.safetensors"),
        size=base.dir_size(out),
    )
    base.log(json.dumps(figures, indent=2))
    base.log(f"done in {total_seconds:.0f}s (training {train_seconds:.0f}s); wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
