"""Run a function on two gloo ranks in spawned processes, and the rank functions the
tests run: a model of each family, whole on every rank and cut by `DistributedModel`
(TP=2, then PP=2), fed the same steps on a paged cache."""

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


def _step(model, caches, tables, lengths, chunks: dict[int, list[int]]) -> torch.Tensor:
    """Logits of one step (request -> new tokens) on a paged cache of 4-token blocks,
    each request owning blocks 1 + 16 * request onward."""
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
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_table=torch.tensor([tables[rid] for rid in chunks]),
        query_start_loc=torch.tensor(qsl),
        seq_lens=torch.tensor(seq_lens),
    )
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), torch.tensor(positions), meta, caches))


def _steps(model, prompts):
    """Logits of a prefill of every prompt in one batch, then a decode step of all
    (the greedy token fed back), on a fresh paged cache."""
    caches = [model.new_kv_cache(64, 4) for _ in model.layers]
    tables = {rid: list(range(1 + 16 * rid, 17 + 16 * rid)) for rid in range(len(prompts))}
    lengths: dict[int, int] = {}
    first = _step(model, caches, tables, lengths, dict(enumerate(prompts)))
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    nxt = first[ends].argmax(-1)
    second = _step(model, caches, tables, lengths, {i: [int(t)] for i, t in enumerate(nxt)})
    return torch.cat([first, second])


def compare_families(rank: int, families: dict[str, str], prompts) -> dict:
    """{(family, "tp" | "pp"): (max |logits - whole model's|, greedy tokens equal) or the
    ValueError message when the family cannot be split that way}."""
    from pyagent_ref.distributed.model import DistributedModel
    from pyagent_ref.distributed.parallel import ParallelContext, check_parallel_sizes
    from pyagent_ref.model import load_model
    from pyagent_ref.ops import load as load_ops

    ops = load_ops("auto")  # the accelerator's ops where it is installed: faster
    contexts = {"tp": ParallelContext.create(rank, 2, 1), "pp": ParallelContext.create(rank, 1, 2)}
    out = {}
    for family, path in families.items():
        loaded = load_model(path, progress=False, ops=ops)
        whole = _steps(loaded, prompts)
        for mode, ctx in contexts.items():
            model = load_model(path, progress=False, ops=ops)
            try:
                check_parallel_sizes(model.config, ctx.tp_size, ctx.pp_size)
            except ValueError as exc:
                out[family, mode] = str(exc)
                continue
            got = _steps(DistributedModel(model, ctx), prompts)
            same = bool((got.argmax(-1) == whole.argmax(-1)).all())
            out[family, mode] = (float((got - whole).abs().max()), same)
    return out
