"""Run a function on two gloo ranks in spawned processes, and the rank functions the
tests run: a model of each family, whole on every rank and each rank's share as a
worker loads it (`loading.load_share`, TP=2, then PP=2), fed the same steps on a paged
cache."""

from __future__ import annotations

import multiprocessing
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch


def _rank_main(fn, rank, world_size, port, args, conn):
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
        )
        conn.send(("ok", fn(rank, *args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send(("error", f"{exc!r}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, args=(), world_size: int = 2, timeout_s: float = 120.0) -> list:
    """fn(rank, *args) on each of world_size gloo ranks; their results in rank order.
    Raises AssertionError with a rank's traceback, or on timeout (every process is
    killed, none leaks)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for rank in range(world_size):
        mine, theirs = context.Pipe()
        proc = context.Process(
            target=_rank_main, args=(fn, rank, world_size, store.port, args, theirs), daemon=True
        )
        proc.start()
        procs.append(proc)
        conns.append(mine)
    try:
        results = {}
        pending = dict(enumerate(conns))
        while pending:
            ready = wait(list(pending.values()), timeout=timeout_s)
            assert ready, f"ranks {sorted(pending)} did not finish within {timeout_s} s"
            for conn in ready:
                rank = conns.index(conn)
                status, value = conn.recv()
                assert status == "ok", f"rank {rank} failed: {value}"
                results[rank] = value
                del pending[rank]
        return [results[r] for r in range(world_size)]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _step(model, caches, tables, lengths, chunks, state_layers=(), mm=None) -> torch.Tensor:
    """Logits of one step (request -> new tokens) on a paged cache of 4-token blocks,
    each request owning blocks 1 + 16 * request onward, and (the layers in
    `state_layers`) state slot 1 + request; `mm`: the step's image rows (LLaVA). An
    encoder (no LM head) gives its final hidden states."""
    from pyagent_ref.model.llama import AttentionMetadata

    ids, positions, qsl, seq_lens, slots = [], [], [0], [], []
    for rid, tokens in chunks.items():
        start = lengths.get(rid, 0)
        lengths[rid] = start + len(tokens)
        ids += tokens
        positions += range(start, start + len(tokens))
        slots += [(1 + 16 * rid) * 4 + p for p in range(start, start + len(tokens))]
        qsl.append(qsl[-1] + len(tokens))
        seq_lens.append(lengths[rid])
    common = dict(query_start_loc=torch.tensor(qsl), seq_lens=torch.tensor(seq_lens))
    paged = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_table=torch.tensor([tables[rid] for rid in chunks]),
        **common,
    )
    state = AttentionMetadata(
        slot_mapping=torch.zeros(len(ids), dtype=torch.int64),
        block_table=torch.tensor([[1 + rid] for rid in chunks]),
        **common,
    )
    metas = [state if i in state_layers else paged for i in range(len(caches))]
    extra = {} if mm is None else {"mm_embeds": mm}
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.tensor(positions), metas, caches, **extra)
        return model.compute_logits(hidden) if model.config.is_causal else hidden


def _image_rows(model, prompts):
    """LLaVA: one seeded image's rows at the image tokens of the batch's prompts (each
    prompt holding 0 or num_image_tokens of them), as `mm_embeds`; None for the others."""
    from pyagent_ref.distributed.model import DistributedModel

    vision = getattr(model.model if isinstance(model, DistributedModel) else model, "vision", None)
    if vision is None:
        return None
    pixels = torch.randn(
        1,
        vision.num_channels,
        vision.image_size,
        vision.image_size,
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        image = model.encode_images(pixels)[0]
    flat = torch.tensor([t for p in prompts for t in p])
    rows = torch.nonzero(flat == vision.image_token_id)[:, 0]
    if not len(rows):
        return None
    reps = len(rows) // len(image)
    return rows, image.repeat(reps, 1)


def _steps(model, prompts, state_layers=()):
    """Logits of a prefill of every prompt in one batch, then a decode step of all
    (the greedy token fed back), on a fresh paged cache (and fresh state slots); an
    encoder's final hidden states of the prompts, in one step."""
    caches = [
        model.new_state_cache(8) if i in state_layers else model.new_kv_cache(64, 4)
        for i in range(len(model.layers))
    ]
    tables = {rid: list(range(1 + 16 * rid, 17 + 16 * rid)) for rid in range(len(prompts))}
    lengths: dict[int, int] = {}
    mm = _image_rows(model, prompts)
    first = _step(model, caches, tables, lengths, dict(enumerate(prompts)), state_layers, mm)
    if not model.config.is_causal:
        return first
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    nxt = first[ends].argmax(-1)
    chunks = {i: [int(t)] for i, t in enumerate(nxt)}
    second = _step(model, caches, tables, lengths, chunks, state_layers)
    return torch.cat([first, second])


def compare_families(rank: int, families: dict[str, str], prompts, special=None) -> dict:
    """{(family, "tp" | "pp"): (max |logits - whole model's|, greedy tokens equal) or the
    ValueError message when the family cannot be split that way}. `special`: family ->
    its own prompts (LLaVA's hold image tokens). An encoder's "logits" are its final
    hidden states, its "greedy tokens" their argmax."""
    from pyagent_ref.distributed.loading import load_share
    from pyagent_ref.distributed.model import DistributedModel
    from pyagent_ref.distributed.parallel import ParallelContext, check_parallel_sizes
    from pyagent_ref.model import load_model
    from pyagent_ref.ops import load as load_ops

    ops = load_ops("auto")  # the accelerator's ops where it is installed: faster
    contexts = {"tp": ParallelContext.create(rank, 2, 1), "pp": ParallelContext.create(rank, 1, 2)}
    out = {}
    for family, path in families.items():
        loaded = load_model(path, progress=False, ops=ops)
        state_layers = set(getattr(loaded, "state_layers", list)())
        family_prompts = (special or {}).get(family, prompts)
        whole = _steps(loaded, family_prompts, state_layers)
        for mode, ctx in contexts.items():
            try:
                check_parallel_sizes(loaded.config, ctx.tp_size, ctx.pp_size)
            except ValueError as exc:
                out[family, mode] = str(exc)
                continue
            model = load_share(path, ctx, progress=False, ops=ops)  # as a worker loads
            got = _steps(DistributedModel(model, ctx, whole=False), family_prompts, state_layers)
            same = bool((got.argmax(-1) == whole.argmax(-1)).all())
            out[family, mode] = (float((got - whole).abs().max()), same)
    return out


def _lora_steps(model, manager, prompts, requests) -> torch.Tensor:
    """`_steps` (a prefill of every prompt, then a decode step) with request r's adapter
    `requests[r]` (None: none) in the manager's slots for its tokens."""
    caches = [model.new_kv_cache(64, 4) for _ in range(len(model.layers))]
    tables = {rid: list(range(1 + 16 * rid, 17 + 16 * rid)) for rid in range(len(prompts))}
    lengths: dict[int, int] = {}
    manager.prepare_step(requests, [len(p) for p in prompts])
    first = _step(model, caches, tables, lengths, dict(enumerate(prompts)))
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    manager.prepare_step(requests, [1] * len(prompts))
    chunks = {i: [int(t)] for i, t in enumerate(first[ends].argmax(-1))}
    second = _step(model, caches, tables, lengths, chunks)
    manager.state.clear()
    return torch.cat([first, second])


def compare_lora(rank: int, families: dict[str, str], adapters: list[str], prompts) -> dict:
    """{(family, "tp" | "pp"): (max |logits - whole model's|, greedy tokens equal)} of a
    batch mixing `adapters` (directories, one per prompt, None: no adapter), each rank's
    share holding its `LoRAManager` as a worker does (`distributed.lora.AdapterShare`)."""
    from pyagent_ref.distributed.loading import load_share
    from pyagent_ref.distributed.lora import AdapterShare
    from pyagent_ref.distributed.model import DistributedModel
    from pyagent_ref.distributed.parallel import ParallelContext
    from pyagent_ref.lora import LoRAConfig, LoRARequest
    from pyagent_ref.lora.manager import LoRAManager
    from pyagent_ref.model import load_model
    from pyagent_ref.ops import load as load_ops

    ops = load_ops("auto")
    config = LoRAConfig(max_loras=2, max_lora_rank=8)
    contexts = {"tp": ParallelContext.create(rank, 2, 1), "pp": ParallelContext.create(rank, 1, 2)}
    out = {}
    for family, path in families.items():
        requests = [
            None if d is None else LoRARequest(f"a{i}", i + 1, f"{path}/{d}")
            for i, d in enumerate(adapters)
        ]
        loaded = load_model(path, progress=False, ops=ops)
        whole = _lora_steps(loaded, LoRAManager(loaded, config, ops), prompts, requests)
        for mode, ctx in contexts.items():
            model = load_share(path, ctx, progress=False, ops=ops)
            share = AdapterShare.of_rank(path, "float32", ctx)
            manager = LoRAManager(model, config, ops, share=share)
            distributed = DistributedModel(model, ctx, whole=False)
            distributed.lora_state = manager.state
            got = _lora_steps(distributed, manager, prompts, requests)
            same = bool((got.argmax(-1) == whole.argmax(-1)).all())
            out[family, mode] = (float((got - whole).abs().max()), same)
    return out


def compare_quantized(rank: int, paths: dict[str, str], prompts) -> dict:
    """{(name, "tp" | "pp"): (max |logits - whole model's|, greedy tokens equal)} of
    each quantized checkpoint under TP=2 and PP=2, loaded as a worker loads one (whole,
    then cut in place: its packed layers by `tensor_parallel.cut_quantized`)."""
    from pyagent_ref.distributed.model import DistributedModel
    from pyagent_ref.distributed.parallel import ParallelContext
    from pyagent_ref.model import load_model
    from pyagent_ref.ops import load as load_ops

    ops = load_ops("auto")
    contexts = {"tp": ParallelContext.create(rank, 2, 1), "pp": ParallelContext.create(rank, 1, 2)}
    out = {}
    for name, path in paths.items():
        whole = _steps(load_model(path, "float32", progress=False, ops=ops), prompts)
        for mode, ctx in contexts.items():
            model = DistributedModel(load_model(path, "float32", progress=False, ops=ops), ctx)
            got = _steps(model, prompts)
            same = bool((got.argmax(-1) == whole.argmax(-1)).all())
            out[name, mode] = (float((got - whole).abs().max()), same)
    return out
