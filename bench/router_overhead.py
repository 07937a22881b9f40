"""Router overhead: what the router adds on top of an upstream that answers instantly.

Starts four ``bench.instant_upstream`` processes (a stand-in that answers ``/generate``
at once: it measures the router, not a model) and one router process in front of them
(cache-aware policy, demo tokenizer), then drives 2 KB prompts with 1 and 64
concurrent clients, streaming and not, through the router and directly to an
upstream's ``/generate`` with the same token ids. Reports requests/s, the router's
CPU time per request (utime + stime from ``/proc/<pid>/stat``, so it includes
tokenization, the tree walk, proxying and JSON on both sides), p50/p99 latency added
by the router, and for streams the longest gap between chunks (a stall shows there).

``python -m bench.router_overhead [--requests N] [--processes N]``; ``main`` returns
the numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import start_process, start_router
from radix.tokenizer import PromptTokenizer
from router.front.auth import hash_key

KEY = "bench-key"
UPSTREAM_ARGS = [sys.executable, "-m", "bench.instant_upstream"]
NUM_UPSTREAMS = 4
PROMPT_BYTES = 2048
MAX_TOKENS = 16
# name, concurrent clients, streaming, prompt sent as token ids (no router tokenization)
SCENARIOS = (
    ("1c_text", 1, False, False),
    ("1c_text_stream", 1, True, False),
    ("64c_text", 64, False, False),
    ("64c_text_stream", 64, True, False),
    ("64c_ids", 64, False, True),
)


@dataclass
class Run:
    """Latencies (s) of one scenario, wall time, and the longest gap inside a stream."""

    latencies_s: list[float]
    wall_s: float
    max_gap_s: float

    def percentile_ms(self, q: float) -> float:
        """The ``q`` quantile of the latencies, in milliseconds."""
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _config(urls: list[str]) -> str:
    lines = ["[models.demo]", 'tokenizer = "demo"', "[auth.tenants.bench]",
             f'key_digests = ["{hash_key(KEY)}"]', "[registry]", "poll_interval_s = 1.0"]
    for i, url in enumerate(urls):
        lines += ["[[workers]]", f'id = "u{i}"', 'model = "demo"', f'url = "{url}"']
    return "\n".join(lines) + "\n"


def _prompts(n: int) -> list[str]:
    rng = random.Random(0)
    words = [f"w{rng.randrange(10**6)}" for _ in range(4096)]
    return [" ".join(rng.choices(words, k=PROMPT_BYTES // 7))[:PROMPT_BYTES] for _ in range(n)]


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str], stream: bool) -> tuple[float, float]:
    """Latency to the end of the response, and the longest gap between stream lines."""
    started = time.perf_counter()
    max_gap = 0.0
    async with session.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        if stream:
            last = time.perf_counter()
            async for _ in resp.content:
                now = time.perf_counter()
                max_gap, last = max(max_gap, now - last), now
        else:
            await resp.read()
    return time.perf_counter() - started, max_gap


async def _drive(url: str, bodies: list[dict[str, Any]], headers: dict[str, str],
                 num_clients: int, stream: bool) -> Run:
    latencies: list[float] = []
    gaps: list[float] = [0.0]
    queue = list(reversed(bodies))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client() -> None:
            while queue:
                latency, gap = await _one(session, url, queue.pop(), headers, stream)
                latencies.append(latency)
                gaps.append(gap)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(num_clients)))
        wall = time.perf_counter() - started
    return Run(latencies, wall, max(gaps))


async def _bench(num_requests: int, processes: int) -> dict[str, Any]:
    upstreams = [await asyncio.to_thread(start_process, UPSTREAM_ARGS)
                 for _ in range(NUM_UPSTREAMS)]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "router.toml"
        config.write_text(_config([u.url for u in upstreams]))
        flags = ["--processes", str(processes)] if processes > 1 else []
        router = await asyncio.to_thread(start_router, config, *flags)
    tokenizer = PromptTokenizer.demo()
    prompts = _prompts(512)
    results: dict[str, Any] = {}
    try:
        await asyncio.sleep(1.5)  # the first probes pass
        auth = {"Authorization": f"Bearer {KEY}"}
        for name, num_clients, stream, as_ids in SCENARIOS:
            n = num_requests if num_clients > 1 else max(num_requests // 4, 50)
            picked = [prompts[i % len(prompts)] for i in range(n)]
            ids = [tokenizer.encode(p) for p in picked]
            via_router = [{"model": "demo", "prompt": i if as_ids else p,
                           "max_tokens": MAX_TOKENS, "stream": stream}
                          for p, i in zip(picked, ids, strict=True)]
            direct = [{"token_ids": i, "scope": "bench", "stream": stream,
                       "sampling": {"max_tokens": MAX_TOKENS}} for i in ids]
            await _drive(f"{router.url}/v1/completions", via_router[:20], auth, 4, stream)
            cpu_before = router.cpu_s()
            routed = await _drive(f"{router.url}/v1/completions", via_router, auth,
                                  num_clients, stream)
            cpu_after = router.cpu_s()
            baseline = await _drive(f"{upstreams[0].url}/generate", direct, {},
                                    num_clients, stream)
            results[name] = {
                "requests": n,
                "router_rps": n / routed.wall_s,
                "direct_rps": n / baseline.wall_s,
                "router_cpu_us_per_request": 1e6 * (cpu_after - cpu_before) / n,
                "added_p50_ms": routed.percentile_ms(0.5) - baseline.percentile_ms(0.5),
                "added_p99_ms": routed.percentile_ms(0.99) - baseline.percentile_ms(0.99),
                "router_p50_ms": routed.percentile_ms(0.5),
                "direct_p50_ms": baseline.percentile_ms(0.5),
                "max_stream_gap_ms": 1000 * routed.max_gap_s if stream else None,
                "direct_max_stream_gap_ms": 1000 * baseline.max_gap_s if stream else None,
            }
    finally:
        for process in (router, *upstreams):
            process.stop()
    return results


def _table(results: dict[str, Any]) -> str:
    header = (f"{'scenario':<16} {'req':>5} {'router r/s':>10} {'direct r/s':>10} "
              f"{'CPU us/req':>10} {'+p50 ms':>8} {'+p99 ms':>8} "
              f"{'max gap ms':>10} {'(direct)':>8}")
    rows = [header, "-" * len(header)]
    for name, r in results.items():
        gap, direct_gap = (("-", "-") if r["max_stream_gap_ms"] is None else
                           (f"{r['max_stream_gap_ms']:.1f}", f"{r['direct_max_stream_gap_ms']:.1f}"))
        rows.append(f"{name:<16} {r['requests']:>5} {r['router_rps']:>10.0f} "
                    f"{r['direct_rps']:>10.0f} {r['router_cpu_us_per_request']:>10.0f} "
                    f"{r['added_p50_ms']:>8.2f} {r['added_p99_ms']:>8.2f} {gap:>10} "
                    f"{direct_gap:>8}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the scenarios, print the table, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests per 64-client scenario (a quarter for 1 client)")
    parser.add_argument("--processes", type=int, default=1, help="router processes")
    args = parser.parse_args(argv)
    results = asyncio.run(_bench(args.requests, args.processes))
    print(f"router overhead: {NUM_UPSTREAMS} instant stand-in upstreams, {PROMPT_BYTES} B "
          f"prompts, {MAX_TOKENS} output tokens, {args.processes} router process(es)")
    print(_table(results))
    print("CPU us/req: router processes' CPU (user+sys; sys = kernel, mostly loopback TCP) "
          "per request; +p50/+p99: router minus direct latency (direct = the upstream's "
          "/generate with the same token ids); _ids: prompts sent as token ids, so no "
          "tokenization on the router.")
    return {"processes": args.processes, **results}


if __name__ == "__main__":
    main()
