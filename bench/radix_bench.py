"""RadixTree micro-benchmark on a RAG + multi-turn workload with forced eviction.

Workload (issue #2): 200 shared documents of 2,000-8,000 tokens with Zipf(1.1)
popularity, each request a document plus 50-300 unique tokens, mixed with
multi-turn conversations where each turn extends the previous one by 100-500
tokens; 20,000 requests; a cap of 5 million cached tokens. Per request: match,
lock, evict if the insert would pass the cap, insert, unlock. Payloads are the
worker's: one int32 slot id per token.

Run: ``python -m bench.radix_bench [--requests N]``.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import time
import tracemalloc
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radix.keys import to_key
from radix.tree import RadixTree

# Recorded, not measured here: SGLang RadixCache on this workload (issue #2).
REFERENCE_US = {"match": (25, 160), "insert": (27, 220), "lock+unlock": (6, None), "evict": (2400, None)}
REFERENCE_BYTES_PER_TOKEN = 10.0
PEERS_PYTHON = Path(__file__).resolve().parent / ".peers" / "bin" / "python"


def sglang_radix_note() -> str:
    """Whether SGLang's RadixCache can be timed beside ours in this run, and why not."""
    if not PEERS_PYTHON.exists():
        return "not measured: bench/.peers is missing (make bench-peers)"
    probe = subprocess.run([str(PEERS_PYTHON), "-c", "import sglang.srt.mem_cache.radix_cache"],
                           capture_output=True)
    if probe.returncode == 0:
        return "importable in bench/.peers, but not timed: this benchmark has no driver for it yet"
    return ("not measured: sglang is not importable in bench/.peers (its wheel pulls torch with a "
            "CUDA stack, gigabytes; make bench-peers installs only the routers); the reference "
            "columns are the recorded figures, not measured in this run")


@dataclass(frozen=True)
class Workload:
    """Request keys in order, plus the token lists of a sample for timing to_key."""

    keys: list[bytes]
    sample_token_lists: list[list[int]]


def make_workload(num_requests: int, seed: int = 0) -> Workload:
    """Deterministic workload of ``num_requests`` keys (about 4,000 tokens each)."""
    rng = np.random.default_rng(seed)
    vocab = 128_000
    docs = [rng.integers(0, vocab, rng.integers(2000, 8001), dtype=np.uint32).tobytes() for _ in range(200)]
    ranks = np.arange(1, len(docs) + 1, dtype=np.float64)
    popularity = ranks**-1.1
    popularity /= popularity.sum()
    conversations: list[bytes] = []
    keys: list[bytes] = []
    for _ in range(num_requests):
        if rng.random() < 0.7 or not conversations:
            doc = docs[rng.choice(len(docs), p=popularity)]
            suffix = rng.integers(0, vocab, rng.integers(50, 301), dtype=np.uint32).tobytes()
            keys.append(doc + suffix)
            if rng.random() < 0.1:
                conversations.append(keys[-1])
            continue
        i = int(rng.integers(len(conversations)))
        turn = rng.integers(0, vocab, rng.integers(100, 501), dtype=np.uint32).tobytes()
        conversations[i] = conversations[i] + turn
        keys.append(conversations[i])
        if len(conversations[i]) > 9000 * 4:
            conversations.pop(i)
    sample = [np.frombuffer(k, dtype=np.uint32).tolist() for k in keys[:200]]
    return Workload(keys, sample)


def slot_payload(num_tokens: int) -> array:
    """A worker-shaped payload: one int32 slot id per token."""
    return array("i", bytes(4 * num_tokens))


def run(workload: Workload, cap_tokens: int, freeze_gc: bool) -> dict:
    """Replay the workload; returns per-call timings in µs (after a 10% warm-up) and
    the eviction total."""
    warmup = len(workload.keys) // 10
    tree: RadixTree = RadixTree(split_payload=lambda slots, n: (slots[:n], slots[n:]))
    timings: dict[str, list[float]] = {"match": [], "insert": [], "lock+unlock": [], "evict": []}
    evict_total = 0.0
    clock = time.perf_counter
    gc.collect()
    for i, key in enumerate(workload.keys):
        if i == warmup and freeze_gc:
            gc.collect()
            gc.freeze()
        record = i >= warmup
        t0 = clock()
        match = tree.match(key, "tenant")
        t1 = clock()
        node = match.last_node
        if node is not None:
            tree.lock(node)
        t2 = clock()
        overflow = tree.num_tokens() + len(key) // 4 - match.num_matched_tokens - cap_tokens
        if overflow > 0:
            t3 = clock()
            tree.evict(overflow)
            t4 = clock()
            evict_total += t4 - t3
            if record:
                timings["evict"].append(t4 - t3)
        t5 = clock()
        result = tree.insert(key, "tenant")
        t6 = clock()
        for new in result.new_nodes:
            new.payload = slot_payload(new.num_tokens)
        t7 = clock()
        if node is not None:
            tree.unlock(node)
        t8 = clock()
        if record:
            timings["match"].append(t1 - t0)
            timings["insert"].append(t6 - t5)
            timings["lock+unlock"].append((t2 - t1) + (t8 - t7))
    if freeze_gc:
        gc.unfreeze()
    stats = {name: _percentiles(values) for name, values in timings.items()}
    stats["evict_total_s"] = evict_total
    stats["num_evict_calls"] = len(timings["evict"])
    stats["num_nodes"] = tree.num_nodes
    stats["cached_tokens"] = tree.num_tokens()
    return stats


def bytes_per_token(workload: Workload, cap_tokens: int, with_payload: bool) -> float:
    """Python heap held by the tree (tracemalloc) per cached token, after the workload."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    split = (lambda slots, n: (slots[:n], slots[n:])) if with_payload else None
    tree: RadixTree = RadixTree(split_payload=split)
    for key in workload.keys:
        match = tree.match(key, "tenant")
        overflow = tree.num_tokens() + len(key) // 4 - match.num_matched_tokens - cap_tokens
        if overflow > 0:
            tree.evict(overflow)
        for new in tree.insert(key, "tenant").new_nodes:
            new.payload = slot_payload(new.num_tokens) if with_payload else None
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / tree.num_tokens()


def key_conversion_us(workload: Workload) -> dict:
    """µs to turn a request's token-id list into the tree's key form."""
    values = []
    for tokens in workload.sample_token_lists:
        t0 = time.perf_counter()
        to_key(tokens)
        values.append(time.perf_counter() - t0)
    return _percentiles(values)


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50_us": None, "p99_us": None, "n": 0}
    arr = np.asarray(values) * 1e6
    return {"p50_us": float(np.percentile(arr, 50)), "p99_us": float(np.percentile(arr, 99)), "n": len(values)}


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the table, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--cap-tokens", type=int, default=5_000_000)
    args = parser.parse_args(argv)
    workload = make_workload(args.requests)
    mean_tokens = sum(len(k) for k in workload.keys) / 4 / len(workload.keys)
    results = {
        "gc_on": run(workload, args.cap_tokens, freeze_gc=False),
        "gc_frozen": run(workload, args.cap_tokens, freeze_gc=True),
    }
    results["key_conversion"] = key_conversion_us(workload)
    results["bytes_per_token_with_slots"] = bytes_per_token(workload, args.cap_tokens, True)
    results["bytes_per_token_tree_only"] = bytes_per_token(workload, args.cap_tokens, False)
    results["sglang_radix"] = sglang_radix_note()
    print(f"radix tree: {args.requests:,} requests, mean {mean_tokens:,.0f} tokens, cap {args.cap_tokens:,} tokens")
    print(f"SGLang RadixCache: {results['sglang_radix']}")
    print(f"{'call':<14}{'p50 µs':>10}{'p99 µs':>10}{'p50 gc.freeze':>15}{'p99 gc.freeze':>15}"
          f"{'recorded':>9}{'ratio':>11}")
    for name, (ref_p50, _) in REFERENCE_US.items():
        on, frozen = results["gc_on"][name], results["gc_frozen"][name]
        ratio = ref_p50 / on["p50_us"] if on["p50_us"] else None
        print(f"{name:<14}{_fmt(on['p50_us']):>10}{_fmt(on['p99_us']):>10}{_fmt(frozen['p50_us']):>15}"
              f"{_fmt(frozen['p99_us']):>15}{ref_p50:>9}{_fmt(ratio):>10}x")
    conv = results["key_conversion"]
    print(f"{'to_key':<14}{_fmt(conv['p50_us']):>10}{_fmt(conv['p99_us']):>10}")
    on = results["gc_on"]
    print(f"eviction total: {on['evict_total_s']:.3f} s over {on['num_evict_calls']:,} calls "
          f"(gc.freeze: {results['gc_frozen']['evict_total_s']:.3f} s); recorded reference 8 s")
    print(f"memory: {results['bytes_per_token_with_slots']:.2f} B/token with int32 slot payloads, "
          f"{results['bytes_per_token_tree_only']:.2f} B/token tree only "
          f"(recorded reference {REFERENCE_BYTES_PER_TOKEN} B/token); {on['num_nodes']:,} nodes, "
          f"{on['cached_tokens']:,} cached tokens")
    return results


if __name__ == "__main__":
    main()
