"""The router's index at a size the simulator does not reach: apply_event, match and
note_routed timed on their own.

``num_workers`` simulated caches (``bench.sim_cache.SimCache``) of ``capacity_tokens``
each are filled with a ``rag_chat`` stream (each request, prompt and output, on a
random worker), every KV event applied to one ``RouterIndex`` and timed; then 2,000
prompts of a second stream are matched and noted as routed.

Run: ``python -m bench index [--workers 8] [--requests 6000]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.sim_cache import SimCache
from bench.workloads import generate
from router.routing.index import RouterIndex, WorkerId

NAMESPACE = "5a" * 32
NUM_QUERIES = 2000


def time_index(num_workers: int = 8, capacity_tokens: int = 1_000_000,
               num_requests: int = 6000) -> dict[str, float]:
    """Mean microseconds per ``apply_event``, per block applied, per ``match`` and per
    ``note_routed``, with the index's and the workers' sizes (module docstring)."""
    rng = np.random.default_rng(1)
    index = RouterIndex()
    caches = [SimCache(f"w{i}", NAMESPACE, capacity_tokens) for i in range(num_workers)]
    apply_s, num_events, num_blocks = 0.0, 0, 0
    for request in generate("rag_chat", num_requests, 10.0, seed=1):
        worker = int(rng.integers(num_workers))
        events = caches[worker].insert(request.prompt + request.output, request.tenant,
                                       request.num_public_tokens)
        start = time.perf_counter()
        for event in events:
            index.apply_event(WorkerId(f"w{worker}"), event)
        apply_s += time.perf_counter() - start
        num_events += len(events)
        num_blocks += sum(len(event.blocks) for event in events)
    queries = list(generate("rag_chat", NUM_QUERIES, 10.0, seed=2))
    start = time.perf_counter()
    for q in queries:
        index.match(NAMESPACE, q.prompt, q.tenant)
    match_s = time.perf_counter() - start
    start = time.perf_counter()
    for i, q in enumerate(queries):
        index.note_routed(NAMESPACE, WorkerId(f"w{i % num_workers}"), q.prompt, q.tenant)
    note_s = time.perf_counter() - start
    stats = index.stats()
    return {
        "num_workers": num_workers,
        "worker_tokens": sum(c.tree.num_tokens() for c in caches),
        "index_nodes": stats.num_nodes,
        "index_tokens": stats.num_tokens,
        "apply_event_us": 1e6 * apply_s / max(num_events, 1),
        "apply_block_us": 1e6 * apply_s / max(num_blocks, 1),
        "match_us": 1e6 * match_s / len(queries),
        "mean_query_tokens": float(np.mean([q.num_prompt_tokens for q in queries])),
        "note_routed_us": 1e6 * note_s / len(queries),
    }


def main(argv: list[str] | None = None) -> dict:
    """Time the index; prints one line and returns the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--capacity-tokens", type=int, default=1_000_000, help="per worker")
    args = parser.parse_args(argv)
    t = time_index(args.workers, args.capacity_tokens, args.requests)
    print(f"index, {t['num_workers']} workers holding {t['worker_tokens'] / 1e6:.1f}M tokens: "
          f"{t['index_nodes']} nodes, {t['index_tokens'] / 1e6:.1f}M tokens; apply_event "
          f"{t['apply_event_us']:.0f} us ({t['apply_block_us']:.1f} us/block); match "
          f"{t['match_us']:.0f} us ({t['mean_query_tokens']:.0f}-token prompts); "
          f"note_routed {t['note_routed_us']:.0f} us")
    return t


if __name__ == "__main__":
    main()
