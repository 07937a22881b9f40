"""End to end: the host-memory KV tier off vs on, two demo workers behind the router.

The working set is ``--docs`` documents of ``--doc-tokens`` tokens; each request is
one document (drawn at random, each read ``--rounds`` times in all) plus a question
unique to it, ``--max-tokens`` output tokens. Each worker's device KV budget is
``--device-fraction`` of the working set's KV bytes (so a document falls out long
before it is read again) and, with the tier on, its host tier holds
``--host-fraction`` of it. Both modes run in one invocation on the same request
sequence, through the cache-aware router (which weighs host hits below device
hits): the cached fraction of prompt tokens (from ``usage``) and TTFT p50/p99.

``python -m bench.host_tier_bench [--docs 16] [--doc-tokens 480] [--rounds 6] ...``;
``main`` prints the table and returns the numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from bench.procs import (
    ManagedProcess,
    router_args,
    start_process,
    start_worker,
    wait_routable,
)
from router.launcher import stop_all

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
def cluster(kv_bytes: int, host_bytes: int) -> Iterator[ManagedProcess]:
    """Two demo workers (``host_bytes`` 0: no tier) and a cache-aware router."""
    started: list[ManagedProcess] = []
    flags = ["--host-cache-bytes", str(host_bytes)] if host_bytes else []
    try:
        for _ in range(2):
            started.append(start_worker(*flags, kv_cache_bytes=str(kv_bytes), wait=False))
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
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    ttft, usage = None, None
    async with session.post(f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: ") :])
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
                                                             args.max_tokens)  # fmt: skip
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
    add("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run tier off then on, print the table, return the numbers."""
    args = _parser().parse_args(argv)
    working_set = args.docs * (args.doc_tokens + QUESTION_TOKENS + args.max_tokens)
    kv_bytes = int(args.device_fraction * working_set * DEMO_KV_BYTES_PER_TOKEN)
    host_bytes = int(args.host_fraction * working_set * DEMO_KV_BYTES_PER_TOKEN)
    sequence = prompts(args)
    results = {}
    for mode, tier_bytes in (("tier off", 0), ("tier on", host_bytes)):
        with cluster(kv_bytes, tier_bytes) as router:
            results[mode] = asyncio.run(drive(router.url, sequence, args))
    print(f"working set {working_set} tokens ({args.docs} docs x {args.doc_tokens}); per worker: "
          f"device KV {kv_bytes} B ({args.device_fraction:.0%}), host tier {host_bytes} B "
          f"({args.host_fraction:.0%}); {len(sequence)} requests, {args.clients} clients")  # fmt: skip
    print(f"{'mode':<10}{'cached':>9}{'TTFT p50':>11}{'TTFT p99':>11}")
    for mode, row in results.items():
        print(f"{mode:<10}{row['cached_fraction']:>9.1%}{row['ttft_p50_ms']:>9.1f}ms"
              f"{row['ttft_p99_ms']:>9.1f}ms")  # fmt: skip
    return {"config": vars(args), "kv_cache_bytes": kv_bytes, "host_cache_bytes": host_bytes,
            **results}  # fmt: skip


if __name__ == "__main__":
    main()
