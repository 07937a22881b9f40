"""The router's exact index at fleet rate, on a production trace: KV block events
decoded and applied, and lookups, in one process.

Each request of a Mooncake-format trace (``bench.mooncake``; generated when no
``--trace`` is given) goes to one of ``--workers`` simulated workers (at random, or
round robin). A worker caches blocks of ``BLOCK_SIZE`` tokens in an LRU of
``--capacity-blocks``, touched tail first as engines free them, so its leaves go
first. Per request the router looks the prompt up, then the worker stores the
blocks of prompt and output it lacked (one ``stored`` run, a partial last block
included, as our workers send) and evicts past its capacity (one ``removed`` event).
The events are encoded as our workers send them to routers (``radix.events``' binary
frames) before timing; the timed replay decodes every frame and applies its events,
and runs every lookup, in order, with the garbage collector tuned as in a router
process.

Reported: ops/s (block events + lookups, Dynamo's unit), microseconds per block event
and per lookup, lookups of prompts cut to 2,112, 8,192 and 32,768 tokens on the
final state, and the index's bytes per indexed block (traced allocations of a second
build, per worker's block and per distinct block).

Run: ``python -m bench index [--trace FILE] [--workers 32] [--requests N]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import mooncake
from radix.events import FRAME_HEADER, EventBlock, KVEvent, decode_frame, encode_msgpack, frame
from radix.hashing import BlockHasher
from radix.keys import TOKEN_BYTES
from router.routing.index import RouterIndex, WorkerId
from router.server.serve import tune_gc

BLOCK_SIZE = 16
BLOCK_BYTES = BLOCK_SIZE * TOKEN_BYTES
NAMESPACE = "5a" * 32
SCOPE = "tenant-0"
HASHER = BlockHasher(bytes.fromhex(NAMESPACE), "xxh3_128")
LOOKUP_TOKENS = (2_112, 8_192, 32_768)
NUM_TIMED_LOOKUPS = 100


@dataclass(frozen=True)
class Step:
    """One request of the replay: its prompt, its worker and that worker's events,
    encoded as one binary frame (empty when the worker had everything)."""

    prompt: bytes
    worker_id: WorkerId
    frame: bytes
    num_blocks: int


class SimWorker:
    """A worker's block cache: an LRU of chained blocks of ``BLOCK_SIZE`` tokens."""

    def __init__(self, worker_id: WorkerId, capacity_blocks: int) -> None:
        self.worker_id = worker_id
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._seq = 0

    def cache(self, key: bytes) -> list[KVEvent]:
        """Cache the path ``key``: a ``stored`` run of the blocks it lacked (the last one
        partial when the path ends inside a block), then a ``removed`` event of what
        fell out of the LRU. Every block of the path becomes recently used, tail first.
        Blocks are named as our workers name them (``radix.hashing``, 128-bit)."""
        chain = [block_hash.hex() for block_hash in HASHER.chain(key, BLOCK_SIZE, SCOPE)]
        stored = [EventBlock(block_hash, chain[i - 1] if i else None,
                             key[i * BLOCK_BYTES: (i + 1) * BLOCK_BYTES])
                  for i, block_hash in enumerate(chain) if block_hash not in self._lru]
        for block_hash in reversed(chain):
            self._lru[block_hash] = None
            self._lru.move_to_end(block_hash)
        gone = [EventBlock(self._lru.popitem(last=False)[0])
                for _ in range(len(self._lru) - self.capacity_blocks)]
        events = []
        for kind, blocks in (("stored", stored), ("removed", gone)):
            if blocks:
                self._seq += 1
                events.append(KVEvent(self.worker_id, "e", self._seq, kind, NAMESPACE, SCOPE,
                                      tuple(blocks)))
        return events


def replay_steps(rows: list[mooncake.TraceRow], num_workers: int, capacity_blocks: int,
                 placement: str, seed: int = 0) -> list[Step]:
    """The replay (module docstring), built before anything is timed."""
    rng = random.Random(seed)
    tokens = mooncake.TokenSource(seed)
    workers = [SimWorker(WorkerId(f"w{i}"), capacity_blocks) for i in range(num_workers)]
    steps = []
    for i, row in enumerate(rows):
        worker = workers[i % num_workers if placement == "round_robin"
                         else rng.randrange(num_workers)]
        prompt = tokens.prompt(row)
        output = np.random.default_rng((seed, i)).integers(
            0, mooncake.VOCAB_SIZE, row.output_length, dtype=np.uint32).tobytes()
        events = worker.cache(prompt + output)
        steps.append(Step(prompt, worker.worker_id,
                          frame([encode_msgpack(e) for e in events]) if events else b"",
                          sum(len(e.blocks) for e in events)))
    return steps


def apply(index: RouterIndex, step: Step) -> None:
    """Decode ``step``'s frame and apply its events, as a router's follower does."""
    if step.frame:
        for event in decode_frame(step.frame[FRAME_HEADER.size:]):
            index.apply_event(step.worker_id, event)


def replay(index: RouterIndex, steps: list[Step]) -> dict[str, float]:
    """Time ``steps`` through ``index``: decode and apply each frame, look each prompt
    up first."""
    lookup_s = event_s = 0.0
    clock = time.perf_counter
    for step in steps:
        started = clock()
        index.match(NAMESPACE, step.prompt, SCOPE)
        looked_up = clock()
        apply(index, step)
        event_s += clock() - looked_up
        lookup_s += looked_up - started
    num_blocks = sum(step.num_blocks for step in steps)
    return {"ops_per_s": (num_blocks + len(steps)) / (lookup_s + event_s),
            "event_us": 1e6 * event_s / max(num_blocks, 1),
            "lookup_us": 1e6 * lookup_s / len(steps),
            "num_block_events": num_blocks, "num_lookups": len(steps)}


def lookup_latency(index: RouterIndex, steps: list[Step]) -> dict[str, float]:
    """Median microseconds of a lookup of prompts cut to each of ``LOOKUP_TOKENS``."""
    found = {}
    for num_tokens in LOOKUP_TOKENS:
        prompts = [s.prompt[: num_tokens * TOKEN_BYTES] for s in steps
                   if len(s.prompt) >= num_tokens * TOKEN_BYTES][-NUM_TIMED_LOOKUPS:]
        times = []
        for prompt in prompts:
            started = time.perf_counter()
            index.match(NAMESPACE, prompt, SCOPE)
            times.append(time.perf_counter() - started)
        found[f"lookup_{num_tokens}_us"] = 1e6 * statistics.median(times) if times else None
    return found


def bytes_per_block(new_index: Callable[[], RouterIndex], steps: list[Step]) -> dict[str, float]:
    """Traced bytes an index holds after applying every event, per indexed block (a
    worker's block) and per distinct block."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = new_index()
    for step in steps:
        apply(index, step)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    stats = index.stats()
    num_indexed = sum(stats.num_blocks.values())
    return {"bytes_per_indexed_block": held / max(num_indexed, 1),
            "bytes_per_distinct_block": held / max(stats.num_nodes, 1),
            "num_indexed_blocks": num_indexed, "num_distinct_blocks": stats.num_nodes}


def run(steps: list[Step]) -> dict[str, float]:
    """Time the replay, then the fixed-length lookups and the memory."""
    index = RouterIndex()
    result = replay(index, steps)
    result.update(lookup_latency(index, steps))
    result.update(bytes_per_block(RouterIndex, steps))
    return result


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark (module docstring); prints one table row and returns it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, help="a Mooncake-format JSONL trace")
    parser.add_argument("--requests", type=int, default=None,
                        help="the first N requests (default: all of a trace, 2,000 generated)")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--capacity-blocks", type=int, default=40_000,
                        help="per worker (40,000 blocks of 16 tokens: an 8B model's KV on an "
                             "80 GB GPU)")
    parser.add_argument("--placement", choices=("random", "round_robin"), default="random")
    args = parser.parse_args(argv)
    rows = mooncake.read(args.trace) if args.trace else mooncake.generate(args.requests or 2000)
    rows = rows[: args.requests] if args.requests else rows
    steps = replay_steps(rows, args.workers, args.capacity_blocks, args.placement)
    source = args.trace.name if args.trace else "generated"
    tune_gc()  # as a router process runs (its start-up frozen, young collections rarer)
    result = run(steps)
    print(f"index on {source} ({len(rows)} requests, {args.workers} workers, "
          f"{args.capacity_blocks} blocks each, {args.placement}): "
          f"{result['ops_per_s'] / 1e6:.2f} M ops/s; {result['event_us']:.2f} us per block "
          f"event ({result['num_block_events']} decoded and applied); lookup "
          f"{result['lookup_us']:.0f} us on average, "
          + ", ".join(f"{n} tokens {result[f'lookup_{n}_us'] or 0:.0f} us"
                      for n in LOOKUP_TOKENS)
          + f"; {result['bytes_per_indexed_block']:.0f} bytes per indexed block "
          f"({result['bytes_per_distinct_block']:.0f} per distinct block)")
    return result


if __name__ == "__main__":
    main()
