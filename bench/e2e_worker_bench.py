"""End to end through one worker process: the prefix cache on vs off (null cache).

Starts ``python -m workers --model demo`` twice (once with ``--no-prefix-cache``) and
drives a shared-prefix workload over ``POST /generate`` (streaming): every prompt is
the same ``--prefix-tokens`` document followed by a question unique to the request,
``--max-tokens`` output tokens each, EOS ignored. At 1, 8 and 32 concurrent clients
it measures output tokens/s (all output tokens over the wall time of the level) and
time to first token (request sent -> first event carrying a token) p50/p99, then
reports on/off ratios. CPU by default; every level is bounded by a request count.

``python -m bench.e2e_worker_bench [--prefix-tokens N] [--requests-per-client N] ...``;
``main`` prints the table and returns the numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import asdict, dataclass

import aiohttp

from harness.procs import start_worker
from harness.sse import json_events

CONCURRENCY = (1, 8, 32)
MODES = {"cache on": (), "cache off": ("--no-prefix-cache",)}


@dataclass(frozen=True)
class Level:
    """One mode at one concurrency: output tokens/s and TTFT percentiles (ms)."""

    num_clients: int
    num_requests: int
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float


def prompt(prefix_tokens: int, request_index: int) -> list[int]:
    """The shared document, then a 24-token question unique to ``request_index``."""
    document = [(37 * i + 11) % 251 for i in range(prefix_tokens)]
    question = [(request_index * 131 + 17 * j) % 251 for j in range(24)]
    return document + question


async def one_request(
    session: aiohttp.ClientSession, url: str, token_ids: list[int], max_tokens: int
) -> tuple[float, list[int]]:
    """(TTFT in s, output token ids) of one streamed ``/generate``."""
    body = {"token_ids": token_ids, "stream": True,
            "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    started = time.perf_counter()
    ttft, token_ids_out = None, []
    async with session.post(f"{url}/generate", json=body) as response:
        response.raise_for_status()
        async for event in json_events(response.content):
            if event.get("token_ids"):
                ttft = ttft if ttft is not None else time.perf_counter() - started
                token_ids_out += event["token_ids"]
    assert ttft is not None, "no token came back"
    return ttft, token_ids_out


async def run_level(url: str, num_clients: int, prompts: list[list[int]], max_tokens: int) -> Level:
    """Run ``prompts`` with ``num_clients`` clients pulling from one queue."""
    pending = list(reversed(prompts))
    ttfts: list[float] = []
    num_tokens = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal num_tokens
        while pending:
            ttft, tokens = await one_request(session, url, pending.pop(), max_tokens)
            ttfts.append(ttft)
            num_tokens += len(tokens)

    connector = aiohttp.TCPConnector(limit=num_clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(num_clients)))
        wall_s = time.perf_counter() - started
    ordered = sorted(ttfts)
    return Level(
        num_clients=num_clients,
        num_requests=len(prompts),
        output_tokens_per_s=num_tokens / wall_s,
        ttft_p50_ms=1000 * statistics.median(ordered),
        ttft_p99_ms=1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    )


async def run_mode(flags: list[str], args: argparse.Namespace) -> list[Level]:
    """Start a worker with ``flags`` and run every concurrency level on it."""
    levels = []
    worker = await asyncio.to_thread(start_worker, *flags, kv_cache_bytes=args.kv_cache_bytes)
    try:
        warmup = [prompt(args.prefix_tokens, -1 - i) for i in range(2)]
        await run_level(worker.url, 1, warmup, args.max_tokens)
        next_index = 0
        for num_clients in CONCURRENCY:
            count = max(4, num_clients * args.requests_per_client)
            prompts = [prompt(args.prefix_tokens, next_index + i) for i in range(count)]
            next_index += count
            levels.append(await run_level(worker.url, num_clients, prompts, args.max_tokens))
    finally:
        worker.stop()
    return levels


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--kv-cache-bytes", default="128MiB")
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads in the worker")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run both modes, print the table, return ``{mode: {clients: Level fields}, ratios}``."""
    args = _parser().parse_args(argv)
    common = ["--num-threads", str(args.num_threads)]
    results: dict[str, dict[int, Level]] = {}
    for mode, flags in MODES.items():
        levels = asyncio.run(run_mode([*common, *flags], args))
        results[mode] = {level.num_clients: level for level in levels}
    print(f"shared prefix {args.prefix_tokens} tokens + 24 unique, {args.max_tokens} output tokens")
    print(f"{'mode':<10}{'clients':>8}{'requests':>10}{'out tok/s':>11}{'TTFT p50':>11}{'TTFT p99':>11}")
    for mode, levels in results.items():
        for level in levels.values():
            print(f"{mode:<10}{level.num_clients:>8}{level.num_requests:>10}"
                  f"{level.output_tokens_per_s:>11.1f}{level.ttft_p50_ms:>9.1f}ms"
                  f"{level.ttft_p99_ms:>9.1f}ms")
    ratios = {}
    print(f"\n{'clients':>8}{'throughput on/off':>19}{'TTFT p50 off/on':>17}{'TTFT p99 off/on':>17}")
    for num_clients in CONCURRENCY:
        on, off = results["cache on"][num_clients], results["cache off"][num_clients]
        ratios[num_clients] = {
            "throughput_on_over_off": on.output_tokens_per_s / off.output_tokens_per_s,
            "ttft_p50_off_over_on": off.ttft_p50_ms / on.ttft_p50_ms,
            "ttft_p99_off_over_on": off.ttft_p99_ms / on.ttft_p99_ms,
        }
        r = ratios[num_clients]
        print(f"{num_clients:>8}{r['throughput_on_over_off']:>18.2f}x"
              f"{r['ttft_p50_off_over_on']:>16.2f}x{r['ttft_p99_off_over_on']:>16.2f}x")
    return {
        "config": vars(args),
        **{mode: {n: asdict(level) for n, level in levels.items()} for mode, levels in results.items()},
        "ratios": ratios,
    }


if __name__ == "__main__":
    main()
