"""End to end: device only, the host-memory KV tier, and the disk tier below it, two
demo workers behind the router; then a restart on the disk tier.

The working set is ``--docs`` documents of ``--doc-tokens`` tokens; each request is
one document (drawn at random, each read ``--rounds`` times in all) plus a question
unique to it, ``--max-tokens`` output tokens. Each worker's device KV budget is
``--device-fraction`` of the working set's KV bytes (so a document falls out long
before it is read again). ``host``: a host tier of ``--host-fraction`` of it.
``disk``: a host tier of only ``--disk-host-fraction`` and a disk tier of
``--disk-fraction`` below it, so most hits are read back from disk. ``restart``: the
``disk`` cluster stopped (SIGTERM spills each worker's cache to its disk tier) and
started again on the same directories and secret, each document then read once: a
cold cluster would cache none of those prompts. All modes run in one invocation on
the same request sequence, through the cache-aware router (which weighs host hits
below device hits and disk hits below host hits): the cached fraction of prompt
tokens (from ``usage``) and TTFT p50/p99.

``python -m bench host_tier [--docs 16] [--doc-tokens 480] [--rounds 6] ...``;
``main`` prints the table and returns the numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from harness.procs import (
    ManagedProcess,
    router_args,
    start_process,
    start_worker,
    wait_routable,
)
from harness.sse import json_events
from router.up.launcher import stop_all

DEMO_KV_BYTES_PER_TOKEN = 2 * 4 * 4 * 32 * 4  # layers x kv heads x head dim x fp32, K and V
QUESTION_TOKENS = 24
READY_TIMEOUT_S = 120.0


def prompts(args: argparse.Namespace) -> list[list[int]]:
    """The request sequence: every document ``rounds`` times, shuffled, each with a
    unique question (byte-level token ids of the demo tokenizer)."""
    rng = random.Random(args.seed)
    docs = [[rng.randrange(97, 123) for _ in range(args.doc_tokens)] for _ in range(args.docs)]
    order = [d for d in range(args.docs) for _ in range(args.rounds)]
    rng.shuffle(order)
    return [docs[d] + [rng.randrange(65, 91) for _ in range(QUESTION_TOKENS)] for d in order]


@contextlib.contextmanager
def cluster(kv_bytes: int, host_bytes: int, disk_bytes: int = 0,
            disk_root: Path | None = None) -> Iterator[ManagedProcess]:
    """Two demo workers (``host_bytes`` 0: no tier; ``disk_bytes`` > 0: a disk tier
    each, in ``disk_root/w<i>``) and a cache-aware router."""
    started: list[ManagedProcess] = []
    flags = ["--host-cache-bytes", str(host_bytes)] if host_bytes else []
    if disk_bytes:
        flags += ["--disk-cache-bytes", str(disk_bytes)]
    try:
        for i in range(2):
            disk_dir = ["--disk-cache-dir", str(disk_root / f"w{i}")] if disk_root else []
            started.append(start_worker(*flags, *disk_dir, kv_cache_bytes=str(kv_bytes),
                                        wait=False))
        urls = [worker.wait_ready(READY_TIMEOUT_S) for worker in started]
        lines = ["[models.demo]", 'tokenizer = "demo"', "[auth]", "allow_anonymous = true"]
        for i, url in enumerate(urls):
            lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'url = "{url}"']
        with tempfile.TemporaryDirectory(prefix="host-tier-") as tmp:
            path = Path(tmp) / "router.toml"
            path.write_text("\n".join(lines) + "\n")
            started.append(router := start_process(router_args(path), wait=False))
            router.wait_ready(READY_TIMEOUT_S)
        wait_routable(router, 2, READY_TIMEOUT_S)
        yield router
    finally:
        stop_all(started)


async def one_request(
    session: aiohttp.ClientSession, url: str, token_ids: list[int], max_tokens: int
) -> tuple[float, int, int]:
    """(TTFT s, prompt tokens, cached tokens) of one streamed completion."""
    body = {"model": "demo", "prompt": token_ids, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft, usage = None, None
    async with session.post(f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for chunk in json_events(response.content):
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter() - started
            usage = chunk.get("usage") or usage
    assert ttft is not None and usage is not None, "no token or no usage came back"
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, usage["prompt_tokens"], cached


async def drive(url: str, sequence: list[list[int]], args: argparse.Namespace) -> dict:
    """Run ``sequence`` with ``args.clients`` clients pulling in order."""
    pending = list(reversed(sequence))
    ttfts: list[float] = []
    totals = [0, 0]

    async def client(session: aiohttp.ClientSession) -> None:
        while pending:
            ttft, num_prompt, num_cached = await one_request(session, url, pending.pop(),
                                                             args.max_tokens)
            ttfts.append(ttft)
            totals[0] += num_prompt
            totals[1] += num_cached

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(args.clients)))
    ordered = sorted(ttfts)
    return {
        "num_requests": len(ordered),
        "cached_fraction": totals[1] / totals[0],
        "ttft_p50_ms": 1000 * statistics.median(ordered),
        "ttft_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--docs", type=int, default=16)
    add("--doc-tokens", type=int, default=480)
    add("--rounds", type=int, default=6)
    add("--max-tokens", type=int, default=8)
    add("--clients", type=int, default=2)
    add("--device-fraction", type=float, default=0.1)
    add("--host-fraction", type=float, default=1.0)
    add("--disk-host-fraction", type=float, default=0.1)
    add("--disk-fraction", type=float, default=1.0)
    add("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run device only, host, disk and the restart on disk; print the table, return
    the numbers."""
    args = _parser().parse_args(argv)
    working_set = args.docs * (args.doc_tokens + QUESTION_TOKENS + args.max_tokens)
    sizes = {name: int(fraction * working_set * DEMO_KV_BYTES_PER_TOKEN) for name, fraction in (
        ("kv_cache_bytes", args.device_fraction), ("host_cache_bytes", args.host_fraction),
        ("disk_host_cache_bytes", args.disk_host_fraction),
        ("disk_cache_bytes", args.disk_fraction))}
    kv_bytes = sizes["kv_cache_bytes"]
    sequence = prompts(args)
    once = list({tuple(p[: args.doc_tokens]): p for p in sequence}.values())  # each doc once
    results = {}
    for mode, host_bytes in (("device", 0), ("host", sizes["host_cache_bytes"])):
        with cluster(kv_bytes, host_bytes) as router:
            results[mode] = asyncio.run(drive(router.url, sequence, args))
    disk = (kv_bytes, sizes["disk_host_cache_bytes"], sizes["disk_cache_bytes"])
    with tempfile.TemporaryDirectory(prefix="disk-tier-") as disk_root:
        with cluster(*disk, Path(disk_root)) as router:
            results["disk"] = asyncio.run(drive(router.url, sequence, args))
        with cluster(*disk, Path(disk_root)) as router:
            results["restart"] = asyncio.run(drive(router.url, once, args))
    print(f"working set {working_set} tokens ({args.docs} docs x {args.doc_tokens}); per worker "
          f"(bytes): {sizes}; {len(sequence)} requests ({len(once)} after the restart), "
          f"{args.clients} clients")
    print(f"{'mode':<10}{'cached':>9}{'TTFT p50':>11}{'TTFT p99':>11}")
    for mode, row in results.items():
        print(f"{mode:<10}{row['cached_fraction']:>9.1%}{row['ttft_p50_ms']:>9.1f}ms"
              f"{row['ttft_p99_ms']:>9.1f}ms")
    return {"config": vars(args), **sizes, **results}


if __name__ == "__main__":
    main()
