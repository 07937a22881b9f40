"""KV cache manager micro-benchmark: block-manager operations per second and bytes of
metadata per block.

Workload: a 4,096-token shared prefix (a system prompt or RAG document) is cached
once; then each request admits that prefix plus 72 unique tokens (a 4K-token prefix
hit: lock, share 256 blocks, reserve 5), prefills the 72 tokens, commits whole
blocks, decodes 32 tokens one ``append_slots`` at a time, forks one child (n=2) that
decodes 8 tokens (its first write copies the shared last block), and finishes both
(commit everything, free). A pool of 16-token blocks with tiny tensors on the CPU,
so the numbers are the bookkeeping, not the copies. The pool is sized so that the
allocator has to evict cached leaves during the run.

Metadata: tracemalloc of the block pool per block, of the prefix cache (tree nodes,
keys, slot payloads, hash-chain memo) per cached block, and of the event log per
stored block (tokens, hex hashes).

Run: ``python -m bench.kv_bench [--requests N]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from workers.kv.block_pool import BlockPool
from workers.kv.build import build_kv_cache_manager
from workers.kv.manager import KVCacheManager
from workers.kv.spec import KVCacheSpec

BLOCK_SIZE = 16
PREFIX_TOKENS = 4096
UNIQUE_TOKENS = 72
DECODE_TOKENS = 32
CHILD_DECODE_TOKENS = 8
SPEC = KVCacheSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16", block_size=BLOCK_SIZE)


def _manager(num_blocks: int, max_events: int = 65536) -> KVCacheManager:
    return build_kv_cache_manager(
        SPEC, num_blocks, namespace_digest=b"bench", worker_id="bench", max_events=max_events
    )


def run_workload(num_requests: int, num_blocks: int) -> dict:
    """Replay the workload; per-operation timings (µs) and totals."""
    rng = random.Random(0)
    manager = _manager(num_blocks)
    prefix = [rng.randrange(128_000) for _ in range(PREFIX_TOKENS)]
    timings: dict[str, list[float]] = {name: [] for name in ("admit", "append", "fork", "finish")}
    clock = time.perf_counter

    def timed(name: str, call: Callable[[], object]) -> object:
        t0 = clock()
        result = call()
        timings[name].append(clock() - t0)
        return result

    def decode(seq_id: int, tokens: list[int], num_tokens: int) -> None:
        for _ in range(num_tokens):
            tokens.append(rng.randrange(128_000))  # the sampled token, computed next step
            assert timed("append", lambda: manager.append_slots(seq_id, 1))

    manager.admit(0, prefix, "tenant")
    manager.append_slots(0, PREFIX_TOKENS)
    manager.commit(0, prefix)
    manager.free(0)
    gc.collect()
    for i in range(num_requests):
        parent, child = 2 * i + 1, 2 * i + 2
        tokens = prefix + [rng.randrange(128_000) for _ in range(UNIQUE_TOKENS)]
        num_cached = timed("admit", lambda t=tokens, p=parent: manager.admit(p, t, "tenant"))
        assert num_cached >= PREFIX_TOKENS  # more when random suffixes collide
        manager.append_slots(parent, len(tokens) - num_cached)
        manager.commit(parent, tokens, len(tokens) - len(tokens) % BLOCK_SIZE)
        timed("fork", lambda p=parent, c=child: manager.fork(p, c))
        child_tokens = list(tokens)
        decode(parent, tokens, DECODE_TOKENS)
        decode(child, child_tokens, CHILD_DECODE_TOKENS)
        for seq_id, seq_tokens in ((parent, tokens), (child, child_tokens)):
            computed = manager.num_computed_tokens(seq_id)
            timed("finish", lambda s=seq_id, t=seq_tokens, c=computed: _finish(manager, s, t, c))
    manager.check_invariants()
    stats = manager.stats()
    out: dict = {name: _summary(values) for name, values in timings.items()}
    out.update(
        num_evicted_blocks=stats.num_evicted_blocks_total,
        num_cow_copies=stats.num_cow_copies_total,
        num_cached_blocks=stats.num_cached_blocks,
        num_events=manager.event_log.head_seq,
    )
    return out


def _finish(manager: KVCacheManager, seq_id: int, tokens: list[int], num_computed: int) -> None:
    manager.commit(seq_id, tokens, num_computed)
    manager.free(seq_id)


def metadata_bytes(num_blocks: int, num_requests: int) -> dict:
    """tracemalloc bytes: the pool per block; the prefix cache (tree nodes, keys, slot
    payloads, hash-chain memo) per cached block, measured with a one-event log; the
    event log per stored block, as the difference with a log that keeps everything.
    Requests are distinct 256-token prompts, fully cached."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pool = BlockPool(num_blocks, BLOCK_SIZE)
    pool_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del pool
    held = {}
    for max_events in (1, 1 << 20):
        rng = random.Random(1)
        manager = _manager(num_blocks, max_events=max_events)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for seq_id in range(num_requests):
            tokens = [rng.randrange(128_000) for _ in range(256)]
            manager.admit(seq_id, tokens, "tenant")
            manager.append_slots(seq_id, len(tokens))
            manager.commit(seq_id, tokens)
            manager.free(seq_id)
            del tokens
        gc.collect()
        held[max_events] = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        num_cached = manager.stats().num_cached_blocks
    return {
        "pool_bytes_per_block": pool_bytes / num_blocks,
        "prefix_cache_bytes_per_cached_block": held[1] / num_cached,
        "event_log_bytes_per_stored_block": (held[1 << 20] - held[1]) / num_cached,
        "num_cached_blocks": num_cached,
    }


def _summary(values: list[float]) -> dict:
    arr = np.asarray(values) * 1e6
    return {
        "p50_us": float(np.percentile(arr, 50)),
        "p99_us": float(np.percentile(arr, 99)),
        "mean_us": float(arr.mean()),
        "ops_per_s": float(len(arr) / arr.sum() * 1e6),
        "n": len(values),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the table, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--num-blocks", type=int, default=4096)
    args = parser.parse_args(argv)
    results = {"workload": run_workload(args.requests, args.num_blocks)}
    results["metadata"] = metadata_bytes(
        args.num_blocks, num_requests=min(200, args.num_blocks // 17)
    )
    work = results["workload"]
    print(
        f"KV manager: {args.requests:,} requests of a {PREFIX_TOKENS:,}-token prefix hit + "
        f"{UNIQUE_TOKENS} new tokens, {DECODE_TOKENS} decodes, one fork; {args.num_blocks:,} blocks"
    )
    print(f"{'operation':<26}{'ops/s':>12}{'p50 µs':>10}{'p99 µs':>10}{'n':>9}")
    labels = {
        "admit": "admit (4K-token hit)",
        "append": "append_slots(1)",
        "fork": f"fork ({-(-(PREFIX_TOKENS + UNIQUE_TOKENS) // BLOCK_SIZE)} blocks)",
        "finish": "finish (commit + free)",
    }
    for name, label in labels.items():
        row = work[name]
        timing = f"{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}"
        print(f"{label:<26}{row['ops_per_s']:>12,.0f}{timing}{row['n']:>9,}")
    print(
        f"evicted blocks: {work['num_evicted_blocks']:,}, copy-on-write copies: "
        f"{work['num_cow_copies']:,}, events: {work['num_events']:,}"
    )
    meta = results["metadata"]
    print(
        f"metadata: block pool {meta['pool_bytes_per_block']:.1f} B/block; prefix cache "
        f"{meta['prefix_cache_bytes_per_cached_block']:.1f} B/cached block (tree, keys, slots); "
        f"event log {meta['event_log_bytes_per_stored_block']:.1f} B/stored block"
    )
    return results


if __name__ == "__main__":
    main()
