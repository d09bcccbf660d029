#!/usr/bin/env python
"""Train pyagent's embedded default model: a tiny Llama that writes Python.

The engine, the server, the docs and the tests need a real model that every machine
has, offline, without downloading anything. This script makes one from text that every
Python installation ships: the standard library's own ``*.py`` sources.

What it does, in order (everything is seeded and single-order, see "Reproducibility"):

1. **Corpus.** Walk ``sysconfig.get_paths()["stdlib"]``, keep ``*.py`` files, sort them
   by their relative POSIX path, skip the directories ``test``, ``tests``, ``idlelib``,
   ``site-packages``, ``__pycache__``, ``encodings`` (codec tables, mostly hex literals),
   ``pydoc_data`` (prose) and ``config-*``, and the files ``_sysconfigdata*`` (they describe
   the build machine, not Python). Whole files are taken in sorted order until the next one
   would pass ``CORPUS_CAP_BYTES`` (12,000,000 bytes; CPython 3.11 is about 9.1 MB after
   the skips, so the cap only bites on larger future stdlibs). Every 50th file (index 0,
   50, 100, ...) is held out for the validation loss.
2. **Tokenizer.** A byte-level BPE (HF ``tokenizers``, GPT-2 pre-tokenizer regex, no
   normalizer, no prefix space, so ``decode(encode(x)) == x`` for any string) with
   ``VOCAB_SIZE`` = 4096 entries, the first seven being the special tokens
   ``<|bos|>`` 0, ``<|eos|>`` 1, ``<|pad|>`` 2, ``<|system|>`` 3, ``<|user|>`` 4,
   ``<|assistant|>`` 5, ``<|end|>`` 6. The tokenizer adds no special token by itself
   (``add_bos_token`` is false): the chat template writes ``<|bos|>``.
3. **Chat data.** So that the chat template means something to the model, the script
   derives single-turn conversations from the training files with ``ast``: "What does
   `mod.func()` do?" answered by the first paragraph of its docstring, and "Write the
   function `func` from the `mod` module." answered by its source in a fenced block.
   They are rendered with the model's own chat template (``<|role|>\\n...<|end|>\\n``),
   so the model learns to close an assistant turn with ``<|end|>``. In the code stream,
   ``SPACE_SPLIT_PROB`` (10 %) of the tokens " word" are rewritten as " " + "word" (same
   text, another tokenization; see ``split_spaces``) so that prompts ending with a space,
   like ``"def "``, are not out of distribution.
4. **Model.** ``transformers.LlamaForCausalLM`` (hidden 256, 4 layers, 8 query heads,
   2 KV heads, head_dim 32, SwiGLU intermediate 688, RMSNorm eps 1e-5, RoPE theta 10000,
   1024 positions, tied input/output embeddings), about 3.8 M parameters.
5. **Training.** ``STEPS`` AdamW steps (betas 0.9/0.95, weight decay 0.1 on matrices,
   gradient clipping 1.0) with linear warmup then cosine decay to 10 % of the peak
   learning rate. Each step is a batch of 8 windows of 256+1 tokens; each window comes
   from the packed chat stream with probability 1/8, else from the packed code stream
   (files joined as ``<|bos|> code <|eos|>``); the choices and the window starts are drawn
   from ``numpy.random.default_rng(SEED)``. Weights and AdamW state are float32; the
   forward pass runs under ``torch.autocast("cpu", dtype=torch.bfloat16)``, which is about
   twice as fast on CPUs with AVX512-BF16/AMX (the loss is taken in float32). In short trials
   batch 8 reached a lower loss than batch 16 for the same tokens (and the same time).
6. **Export** to ``pyagent_ref/model/default/``: ``config.json``, ``model.safetensors``
   (bfloat16, HF parameter names, no ``lm_head.weight`` because it is tied),
   ``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and a
   ``README.md`` that records the run (sizes, loss, time, samples, checksums).
7. **Verification**, offline: reload with ``LlamaForCausalLM.from_pretrained`` (weights
   upcast to float32) and ``AutoTokenizer.from_pretrained``, generate greedily from three
   prompts, render the chat template for a small conversation and answer it.

Reproducibility: ``torch.manual_seed``, ``random.seed`` and ``numpy`` are seeded with
``SEED``; ``torch.use_deterministic_algorithms(True)``; ``torch.set_num_threads(2)``;
the data order depends only on the seed and the (sorted) corpus. The same command on the
same machine (same CPU kind, same Python stdlib, same torch) gives bit-identical weights;
the README records the SHA-256 of the corpus and of ``model.safetensors`` to check it.
A different Python version means a different corpus, hence a different model.

Usage (from the repository root; about 5-6 minutes on 2 idle CPU cores, more when the
machine is busy)::

    python tools/train_default_model.py   # needs pyagent[engine,hf] (torch, transformers)

``--steps N`` and ``--out DIR`` exist for quick experiments and for checking determinism
(run twice with a small ``--steps`` into two directories and compare the checksums).
The committed model is the one made by the command without options.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import inspect
import json
import math
import os
import pathlib
import platform
import random
import sys
import sysconfig
import textwrap
import time

# Nothing in this script may touch the network: make the HF libraries refuse to.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "pyagent_ref" / "model" / "default"

# ---------------------------------------------------------------- knobs (documented above)
SEED = 1234
CORPUS_CAP_BYTES = 12_000_000
SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "__pycache__", "encodings", "pydoc_data"}
)
VAL_EVERY = 50  # file index % VAL_EVERY == 0 -> validation
VOCAB_SIZE = 4096
SPECIAL_TOKENS = (
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, END = SPECIAL_TOKENS
MODEL_MAX_LENGTH = 1024

MODEL = dict(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=MODEL_MAX_LENGTH,
    initializer_range=0.02,
)

STEPS = 1200
SEQ_LEN = 256
BATCH = 8
CHAT_FRACTION = 0.125  # each row is a chat window with this probability, else code
SPACE_SPLIT_PROB = 0.1  # share of " word" tokens split into " " + "word" (see split_spaces)
AUTOCAST_BF16 = True  # bfloat16 autocast for the forward pass; weights and AdamW stay float32
PEAK_LR = 2e-3
MIN_LR_FRACTION = 0.1
WARMUP = 50
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
THREADS = 2
VAL_WINDOWS = 32

SAMPLE_PROMPTS = ("def ", "import os\n", "class ", "    def __init__(self")
SAMPLE_NEW_TOKENS = 48
SYSTEM_PROMPT = "You are a helpful Python assistant."

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Unsupported role: ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|assistant|>\\n' }}"
    "{%- endif %}"
)


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------- corpus
def collect_corpus(cap_bytes: int = CORPUS_CAP_BYTES) -> list[tuple[str, str]]:
    """Return [(relative posix path, text)] of the stdlib sources, sorted, capped."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        dirs = rel.parts[:-1]
        if set(dirs) & SKIP_DIRS or any(d.startswith("config-") for d in dirs):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue
        paths.append((rel.as_posix(), path))
    paths.sort(key=lambda item: item[0])
    files, total = [], 0
    for rel, path in paths:
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if any(tok in text for tok in SPECIAL_TOKENS):
            continue  # never let the corpus spell a special token
        if total + len(data) > cap_bytes:
            break
        files.append((rel, text))
        total += len(data)
    return files


# ------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "additional_special_tokens": [SYSTEM, USER, ASSISTANT, END],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }


# ------------------------------------------------------------------------- chat data
def _first_paragraph(doc: str) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0]
    return " ".join(line.strip() for line in para.splitlines()).strip()


def chat_conversations(files: list[tuple[str, str]]) -> list[list[dict]]:
    """Deterministic single-turn conversations derived from the training files."""
    convs: list[list[dict]] = []
    for rel, text in files:
        module = rel[:-3].replace("/", ".")
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node, clean=False)
            pairs = []
            if doc and _first_paragraph(doc):
                answer = _first_paragraph(doc)
                if isinstance(node, ast.ClassDef):
                    question = f"What is `{module}.{node.name}`?"
                else:
                    question = f"What does `{module}.{node.name}()` do?"
                pairs.append((question, answer))
            if not isinstance(node, ast.ClassDef):
                source = ast.get_source_segment(text, node)
                if source and len(source) <= 1200:
                    source = textwrap.dedent(source)
                    question = f"Write the function `{node.name}` from the `{module}` module."
                    pairs.append((question, f"```python\n{source}\n```"))
            for question, answer in pairs:
                conv = []
                if len(convs) % 3 == 0:
                    conv.append({"role": "system", "content": SYSTEM_PROMPT})
                conv.append({"role": "user", "content": question})
                conv.append({"role": "assistant", "content": answer})
                convs.append(conv)
    return convs


# ---------------------------------------------------------------------------- model
def make_config(model: dict = MODEL):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        tie_word_embeddings=True,
        bos_token_id=SPECIAL_TOKENS.index(BOS),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        **model,
    )


def config_json(model: dict = MODEL) -> dict:
    """config.json of a model of these dims (`MODEL` by default), written by hand so
    transformers 4.x and 5.x read it the same way."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": model["hidden_size"],
        "intermediate_size": model["intermediate_size"],
        "num_hidden_layers": model["num_hidden_layers"],
        "num_attention_heads": model["num_attention_heads"],
        "num_key_value_heads": model["num_key_value_heads"],
        "head_dim": model["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": model["max_position_embeddings"],
        "initializer_range": model["initializer_range"],
        "rms_norm_eps": model["rms_norm_eps"],
        "rope_theta": model["rope_theta"],
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": model["rope_theta"]},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": True,
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "pad_token_id": SPECIAL_TOKENS.index(PAD),
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def generation_config_json() -> dict:
    return {
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": [SPECIAL_TOKENS.index(EOS), SPECIAL_TOKENS.index(END)],
        "pad_token_id": SPECIAL_TOKENS.index(PAD),
        "do_sample": False,
    }


def lr_at(step: int, steps: int) -> float:
    """Linear warmup over WARMUP steps, then cosine from PEAK_LR to MIN_LR_FRACTION*PEAK."""
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return PEAK_LR * (MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * cosine)


def split_spaces(tok, stream: np.ndarray, prob: float, seed: int) -> np.ndarray:
    """Rewrite a share of the tokens " xyz" as the two-piece spelling " " + "xyz".

    Byte-level BPE glues a space to the word after it, so a prompt that ends with a space
    ("def ", "x = ") ends with a lone " " token that the canonical tokenization almost never
    produces before a word; a small model then continues badly (often with a second
    space). Showing it the split spelling now and then (a narrow form of BPE-dropout) makes
    such prompts work. Only tokens made of a space and printable ASCII are split; the
    decoded text is unchanged. Each candidate is split with probability `prob`, drawn from
    `numpy.random.default_rng(seed)`.
    """
    space_id = tok.token_to_id("\u0120")  # byte-level spelling of " "
    table: dict[int, list[int]] = {}
    for token, idx in tok.get_vocab().items():
        rest = token[1:]
        if token.startswith("\u0120") and rest and all(33 <= ord(c) <= 126 for c in rest):
            table[idx] = [space_id, *tok.encode(rest, add_special_tokens=False).ids]
    candidates = np.isin(stream, np.fromiter(table, dtype=stream.dtype))
    chosen = candidates & (np.random.default_rng(seed).random(len(stream)) < prob)
    out: list[int] = []
    last = 0
    for pos in np.flatnonzero(chosen).tolist():
        out.extend(stream[last:pos].tolist())
        out.extend(table[int(stream[pos])])
        last = pos + 1
    out.extend(stream[last:].tolist())
    return np.asarray(out, dtype=stream.dtype)


def windows(stream: np.ndarray, starts: np.ndarray) -> torch.Tensor:
    idx = starts[:, None] + np.arange(SEQ_LEN + 1)[None, :]
    return torch.from_numpy(stream[idx].astype(np.int64))


def lm_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))


# ---------------------------------------------------------------------- token streams
@dataclasses.dataclass
class Streams:
    """The packed token streams training draws its windows from (see `token_streams`)."""

    code: np.ndarray  # training files, after split_spaces
    val: np.ndarray  # held-out files
    chat: np.ndarray  # rendered conversations
    n_canonical: int  # code tokens before split_spaces
    conversations: list[list[dict]]


def token_streams(tok, hf_tok, train_files, val_files) -> Streams:
    """Pack the files as ``<|bos|> code <|eos|>`` (the training ones through
    `split_spaces`) and the conversations derived from the training files as rendered by
    the chat template, into flat int32 streams. Deterministic (seeded by ``SEED``)."""
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)

    def pack(texts: list[str]) -> np.ndarray:
        ids: list[int] = []
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids.append(bos_id)
            ids.extend(enc.ids)
            ids.append(eos_id)
        return np.asarray(ids, dtype=np.int32)

    code_stream = pack([t for _, t in train_files])
    n_canonical = len(code_stream)
    code_stream = split_spaces(tok, code_stream, SPACE_SPLIT_PROB, SEED + 2)
    val_stream = pack([t for _, t in val_files])
    convs = chat_conversations(train_files)
    chat_texts = [hf_tok.apply_chat_template(c, tokenize=False) for c in convs]
    chat_ids: list[int] = []
    for enc in tok.encode_batch(chat_texts, add_special_tokens=False):
        chat_ids.extend(enc.ids)  # the template already starts with <|bos|>
    chat_stream = np.asarray(chat_ids, dtype=np.int32)
    return Streams(code_stream, val_stream, chat_stream, n_canonical, convs)


def training_batch(rng: np.random.Generator, streams: Streams) -> torch.Tensor:
    """One batch of BATCH windows of SEQ_LEN + 1 tokens: each row from the chat stream
    with probability CHAT_FRACTION, else from the code stream; starts drawn from `rng`."""
    is_chat = torch.from_numpy(rng.random(BATCH) < CHAT_FRACTION)[:, None]
    code_starts = rng.integers(0, len(streams.code) - SEQ_LEN - 1, size=BATCH)
    chat_starts = rng.integers(0, len(streams.chat) - SEQ_LEN - 1, size=BATCH)
    return torch.where(
        is_chat, windows(streams.chat, chat_starts), windows(streams.code, code_starts)
    )


def save_weights(model, path: pathlib.Path) -> None:
    """The model's weights as bfloat16 safetensors with HF names, sorted, without the
    tied ``lm_head.weight``."""
    from safetensors.torch import save_file

    state = {
        name: tensor.detach().to(torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to model.embed_tokens.weight
    }
    save_file(dict(sorted(state.items())), str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # save_file creates it owner-only


def sha256_file(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dir_size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"default {STEPS}")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    steps: int = args.steps
    out: pathlib.Path = args.out.resolve()

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

    t_start = time.perf_counter()
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(THREADS)

    # 1. corpus ---------------------------------------------------------------------
    files = collect_corpus()
    corpus_bytes = sum(len(t.encode("utf-8")) for _, t in files)
    corpus_sha = hashlib.sha256()
    for rel, text in files:
        corpus_sha.update(rel.encode() + b"\0" + text.encode("utf-8") + b"\0")
    train_files = [f for i, f in enumerate(files) if i % VAL_EVERY != 0]
    val_files = [f for i, f in enumerate(files) if i % VAL_EVERY == 0]
    log(
        f"corpus: {len(files)} files, {corpus_bytes:,} bytes from "
        f"{sysconfig.get_paths()['stdlib']} (Python {platform.python_version()}); "
        f"{len(val_files)} held out"
    )

    # 2. tokenizer -------------------------------------------------------------------
    t0 = time.perf_counter()
    tok = train_tokenizer([t for _, t in files])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    log(f"tokenizer: {tok.get_vocab_size()} tokens, trained in {time.perf_counter() - t0:.1f}s")

    # 3. token streams ---------------------------------------------------------------
    t0 = time.perf_counter()
    streams = token_streams(tok, hf_tok, train_files, val_files)
    code_stream, val_stream, chat_stream = streams.code, streams.val, streams.chat
    n_canonical, convs = streams.n_canonical, streams.conversations
    log(
        f"streams: code {n_canonical:,} tokens "
        f"({corpus_bytes / (n_canonical + len(val_stream)):.2f} bytes/token; "
        f"{len(code_stream):,} after split_spaces), "
        f"val {len(val_stream):,}, chat {len(chat_stream):,} ({len(convs)} conversations); "
        f"{time.perf_counter() - t0:.1f}s"
    )

    # 4. model -----------------------------------------------------------------------
    config = make_config()
    torch.manual_seed(SEED)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters (embeddings tied)")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=PEAK_LR,
        betas=BETAS,
        eps=1e-8,
        foreach=False,
    )

    # 5. train -----------------------------------------------------------------------
    rng = np.random.default_rng(SEED)
    losses: list[float] = []
    t_train = time.perf_counter()
    for step in range(steps):
        lr = lr_at(step, steps)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = training_batch(rng, streams)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST_BF16):
            loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - t_train
            tps = (step + 1) * BATCH * SEQ_LEN / elapsed
            log(
                f"step {step + 1:4d}/{steps}  loss {losses[-1]:.4f}  lr {lr:.2e}  "
                f"{elapsed:6.1f}s  {tps:,.0f} tok/s"
            )
    train_seconds = time.perf_counter() - t_train
    log(f"trained in {train_seconds:.0f}s")
    final_train_loss = float(np.mean(losses[-10:]))

    # 6. export ----------------------------------------------------------------------
    model.eval()
    save_weights(model, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config_json(), indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(generation_config_json(), indent=2) + "\n"
    )

    # 7. verify, from the files just written -----------------------------------------
    loaded = LlamaForCausalLM.from_pretrained(str(out)).float()  # exact upcast of bf16
    loaded.eval()
    hf_tok = AutoTokenizer.from_pretrained(str(out))
    assert loaded.config.architectures == ["LlamaForCausalLM"]
    assert torch.equal(loaded.lm_head.weight, loaded.model.embed_tokens.weight)

    with torch.no_grad():
        vrng = np.random.default_rng(SEED + 1)
        vstarts = vrng.integers(0, len(val_stream) - SEQ_LEN - 1, size=VAL_WINDOWS)
        vbatch = windows(val_stream, vstarts)
        val_loss = float(lm_loss(loaded, vbatch))
        val_loss_fp32_train = float(lm_loss(model, vbatch))
    log(
        f"final train loss (mean of last 10 steps) {final_train_loss:.4f}; "
        f"val loss {val_loss:.4f} (bf16 weights) / {val_loss_fp32_train:.4f} (fp32 weights)"
    )

    samples: list[tuple[str, str]] = []
    reference: dict = {}
    for prompt in SAMPLE_PROMPTS:
        ids = hf_tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = loaded.generate(
                ids, max_new_tokens=SAMPLE_NEW_TOKENS, do_sample=False, pad_token_id=PAD_ID
            )
        text = hf_tok.decode(gen[0], skip_special_tokens=False)
        samples.append((prompt, text))
        if not reference:  # numbers to check a forward pass against, without transformers
            with torch.no_grad():
                last = loaded(input_ids=ids).logits[0, -1].float()
            reference = {
                "prompt": prompt,
                "prompt_ids": ids[0].tolist(),
                "greedy_ids": gen[0, ids.shape[1] : ids.shape[1] + 16].tolist(),
                "last_logits_0_4": [round(float(x), 4) for x in last[:4]],
                "last_logits_max": round(float(last.max()), 4),
                "last_logits_argmax": int(last.argmax()),
            }
        log(f"--- sample for {prompt!r}:\n{text}")

    conversation = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What does `os.path.join()` do?"},
    ]
    chat_prompt = hf_tok.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    chat_ids_t = hf_tok(chat_prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        gen = loaded.generate(chat_ids_t, max_new_tokens=64, do_sample=False, pad_token_id=PAD_ID)
    chat_reply = hf_tok.decode(gen[0, chat_ids_t.shape[1] :], skip_special_tokens=False)
    log(f"--- chat prompt:\n{chat_prompt}--- reply:\n{chat_reply}")

    total_seconds = time.perf_counter() - t_start
    weights_sha = sha256_file(out / "model.safetensors")
    log(f"model.safetensors sha256 {weights_sha}")

    write_readme(
        out,
        n_files=len(files),
        corpus_bytes=corpus_bytes,
        corpus_sha=corpus_sha.hexdigest(),
        n_val_files=len(val_files),
        code_tokens=n_canonical,
        split_tokens=len(code_stream),
        val_tokens=len(val_stream),
        chat_tokens=len(chat_stream),
        n_convs=len(convs),
        n_params=n_params,
        steps=steps,
        final_train_loss=final_train_loss,
        val_loss=val_loss,
        train_seconds=train_seconds,
        total_seconds=total_seconds,
        samples=samples,
        reference=reference,
        chat_prompt=chat_prompt,
        chat_reply=chat_reply,
        weights_sha=weights_sha,
    )
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    for name, size in sizes.items():
        log(f"{size:>12,}  {name}")
    log(f"{dir_size(out):>12,}  total in {out}")
    log(f"done in {total_seconds:.0f}s (training {train_seconds:.0f}s)")
    return 0


PAD_ID = SPECIAL_TOKENS.index(PAD)


def write_readme(out: pathlib.Path, **r) -> None:
    samples = "\n\n".join(f"Prompt `{p!r}`:\n\n```text\n{t}\n```" for p, t in r["samples"])
    special = ", ".join(f"`{t}` = {i}" for i, t in enumerate(SPECIAL_TOKENS))
    ref = r["reference"]
    m = MODEL
    text = f"""\
# pyagent default model

A tiny Llama ({r["n_params"] / 1e6:.2f} M parameters) with its own byte-level BPE tokenizer,
trained for a few minutes on CPU on the Python standard library's sources. It exists so that
pyagent's engine, server, docs and tests have a real model offline. It writes Python-looking
text (often repetitive under greedy decoding) and knows nothing else. Made by
`tools/train_default_model.py`:

```bash
python tools/train_default_model.py   # from the repository root, with pyagent[engine,hf]
```

Find it with `pyagent_ref.model.default_model_path()`; transformers loads it with
`LlamaForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)`.

## Data

- `*.py` files under `sysconfig.get_paths()["stdlib"]` of Python
  {platform.python_version()}, sorted by relative path; directories `test`, `tests`,
  `idlelib`, `site-packages`, `__pycache__`, `encodings`, `pydoc_data`, `config-*` and files
  `_sysconfigdata*` skipped; whole files kept in order up to a cap of
  {CORPUS_CAP_BYTES:,} bytes.
- {r["n_files"]} files, {r["corpus_bytes"]:,} bytes (corpus SHA-256
  `{r["corpus_sha"][:16]}...`); every {VAL_EVERY}th file ({r["n_val_files"]} files) held out
  for validation.
- Token streams: code {r["code_tokens"]:,} tokens (files packed as
  `<|bos|> code <|eos|>`; {r["split_tokens"]:,} after rewriting
  {SPACE_SPLIT_PROB:.0%} of the `" word"` tokens as `" "` + `"word"`, so that prompts ending
  in a space work), validation {r["val_tokens"]:,}, chat {r["chat_tokens"]:,} tokens
  from {r["n_convs"]:,} conversations derived with `ast` (docstring questions and answers,
  "write the function" requests) rendered with the chat template below.

## Tokenizer

HF `tokenizers` byte-level BPE, {VOCAB_SIZE} tokens, GPT-2 pre-tokenizer regex, no
normalizer, no prefix space, so `decode(encode(x)) == x`. Special tokens: {special}.
Encoding adds no special token (`add_bos_token: false`); the chat template writes
`<|bos|>` itself:

```jinja
{CHAT_TEMPLATE}
```

which renders `<|bos|><|system|>\\n...<|end|>\\n<|user|>\\n...<|end|>\\n<|assistant|>\\n`.
Generation stops at `<|eos|>` (1) or `<|end|>` (6) (`generation_config.json`).
As with every GPT-2-style BPE, a space is glued to the word after it (`" foo"`), so a
prompt ending in a space (`"def "`) ends with a lone `" "` token that canonical
tokenization rarely produces; the training stream therefore spells 10% of the `" word"`
tokens as `" "` + `"word"` (`split_spaces` in the script), and the model continues such
prompts normally.

## Model

`LlamaForCausalLM`: vocab {VOCAB_SIZE}, hidden {m["hidden_size"]},
{m["num_hidden_layers"]} layers, {m["num_attention_heads"]} query heads and
{m["num_key_value_heads"]} KV heads (GQA) of dim {m["head_dim"]}, SwiGLU MLP intermediate
{m["intermediate_size"]}, RMSNorm eps {m["rms_norm_eps"]:g}, RoPE theta
{m["rope_theta"]:g}, {m["max_position_embeddings"]} positions, no biases, tied input/output
embeddings. `model.safetensors` is bfloat16 with HF names and no `lm_head.weight`
(float32 would be {4 * r["n_params"] / 1e6:.1f} MB, over the ~8 MB budget).

Forward pass, for a matching implementation (this is HF `LlamaForCausalLM`):

- `x = embed_tokens[ids]`; per layer
  `x = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))` with
  `n1 = input_layernorm(x)`, then `x = x + down_proj(silu(gate_proj(n2)) * up_proj(n2))` with
  `n2 = post_attention_layernorm(x)`; finally `logits = norm(x) @ embed_tokens.T`.
- RMSNorm: `w * (x * rsqrt(mean(x**2, -1) + {m["rms_norm_eps"]:g}))`, computed in float32.
- Heads: `q_proj` output is `[{m["num_attention_heads"]}, {m["head_dim"]}]` per token,
  `k_proj`/`v_proj` `[{m["num_key_value_heads"]}, {m["head_dim"]}]`; query head `h` reads KV
  head `h // {m["num_attention_heads"] // m["num_key_value_heads"]}`. Causal softmax attention
  with scale `1/sqrt({m["head_dim"]})`.
- RoPE, NeoX/HF layout (`rotate_half`, not interleaved pairs):
  `inv_freq[i] = {m["rope_theta"]:g} ** (-2i/{m["head_dim"]})` for `i < {m["head_dim"] // 2}`,
  `angle = pos * inv_freq` repeated twice to length {m["head_dim"]},
  `x * cos + rotate_half(x) * sin` with `rotate_half([a, b]) = [-b, a]` over the two
  halves of the head dimension. Positions start at 0 for the first prompt token.
- Reading bfloat16 without torch: the raw little-endian `uint16` values shifted left by 16
  bits are the float32 bit patterns (`(u16.astype(np.uint32) << 16).view(np.float32)`).

Reference numbers (weights upcast to float32, transformers' forward): prompt
`{ref["prompt"]!r}` = ids `{ref["prompt_ids"]}`; logits at the last position start
`{ref["last_logits_0_4"]}`, max `{ref["last_logits_max"]}` at id
`{ref["last_logits_argmax"]}`; greedy continuation ids `{ref["greedy_ids"]}`.

## Training

{r["steps"]} steps of AdamW (peak lr {PEAK_LR:g}, betas {BETAS}, weight decay
{WEIGHT_DECAY:g} on matrices, grad clip {GRAD_CLIP:g}), {WARMUP} warmup steps then cosine to
{MIN_LR_FRACTION:g} x peak; batches of {BATCH} x {SEQ_LEN} tokens (each row a chat window
with probability {CHAT_FRACTION:g}, else code); row kinds and window starts drawn from
`numpy.random.default_rng({SEED})`. Seed {SEED} for torch, numpy and random;
`torch.use_deterministic_algorithms(True)`; `torch.set_num_threads({THREADS})`; float32
weights and AdamW, bfloat16 autocast forward, bfloat16 export. The same command on the
same machine gives the same bytes (check the SHA-256 below).

- Final training loss (mean of the last 10 steps): **{r["final_train_loss"]:.3f}** nats/token.
- Validation loss (held-out files, {VAL_WINDOWS} windows, exported weights):
  **{r["val_loss"]:.3f}** nats/token.
- Training time: {r["train_seconds"]:.0f} s; whole script: {r["total_seconds"]:.0f} s
  ({THREADS} threads, {platform.machine()}, torch {torch.__version__}).
- `model.safetensors` SHA-256: `{r["weights_sha"]}`.

## Samples

Greedy, {SAMPLE_NEW_TOKENS} new tokens, exported weights upcast to float32:

{samples}

Chat (`apply_chat_template(..., add_generation_prompt=True)`, greedy):

```text
{r["chat_prompt"]}{r["chat_reply"]}
```
"""
    (out / "README.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
