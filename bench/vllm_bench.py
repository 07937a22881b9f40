"""Routers in front of two real vLLM CPU servers: ours exact, ours approximate, the peers.

Two vLLM servers (``harness.vllm_servers``: SmolLM2-135M-Instruct, 128-token blocks, KV
events on, each bound to its own core, ``--num-gpu-blocks-override`` small enough that
the documents do not all fit: eviction pressure) serve every router setup in turn;
between setups their prefix caches are reset (``POST /reset_prefix_cache``, which also
publishes ``AllBlocksCleared``). Setups: ours exact (``kind = "vllm"`` with the KV
event endpoints), ours approximate (``kind = "openai"``), and, from ``bench/.peers``,
sglang-router cache_aware and vllm-router cache_aware (and vllm-router's kv_aware
policy where the installed version has one).

The trace: documents of real words picked by Zipf popularity, each request a document
plus a question, streamed by ``--clients`` closed-loop clients, greedy, a few output
tokens, sent twice per setup through one router process: a cold phase on the reset
caches and a warm phase right after (``--phases``, as ``bench.e2e``). Figures per
setup and phase: vLLM's own prefix-cache hit fraction (its
``prefix_cache_hits/queries`` counters), TTFT p50/p99, requests per server; for ours,
the router's predicted cached tokens against vLLM's ``cached_tokens`` per request (from
the router's access log), the router's own check of the same (``bench.exactness``:
exact, over, under and in_flight counts and the exact fraction, in whole blocks, from its
``/metrics``) and the index lag from vLLM's batch timestamp
(``router_kv_event_lag_seconds``, over the router's run so far).

Run: ``python -m bench vllm [--requests N] [--clients C] [--docs D]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np

from bench import peers
from bench.e2e import PHASES, results_key
from bench.exactness import describe, exactness, prediction_counts
from harness.procs import ManagedProcess, http_json, router_args, start_process, wait_routable
from harness.sse import data_payloads
from harness.vllm_servers import SERVED_MODEL, SMOLLM2_DIR, VllmServer, available
from router.front.auth import hash_key

TENANT_KEY = "vllm-bench-key"
WORDS = ("lease", "tenant", "premises", "repair", "rent", "clause", "notice", "term",
         "landlord", "deposit", "insurance", "utility", "access", "damage", "renewal",
         "assignment", "default", "remedy", "period", "payment", "water", "heat", "garden",
         "parking", "storage", "pets", "noise", "guest", "key", "lock", "window", "door")
KV_AWARE = "vllm kv_aware"
PEER_SETUPS = {**peers.PEER_SETUPS, KV_AWARE: peers.PeerSetup("vllm_router", "kv_aware")}
ACCESS = re.compile(r"request \S+ worker=(\S+) status=200 prompt_tokens=(\d+) "
                    r"predicted_cached=(\d+) cached=(\d+)")


def make_trace(num_docs: int, num_requests: int, seed: int) -> list[str]:
    """Prompts: a Zipf-popular document (300-500 words) and a question."""
    rng = random.Random(seed)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 500)))
            for _ in range(num_docs)]
    weights = [1 / (i + 1) for i in range(num_docs)]
    return [f"{rng.choices(docs, weights)[0]}\nQuestion {i}: what does clause "
            f"{rng.randint(1, 99)} say about {rng.choice(WORDS)}?" for i in range(num_requests)]


def our_config(servers: list[VllmServer], exact: bool) -> str:
    """Our router in front of ``servers``: ``vllm`` kind with events, or ``openai``."""
    lines = [f"[models.{SERVED_MODEL}]", f'tokenizer = "{SMOLLM2_DIR}"',
             "[registry]", "poll_interval_s = 0.5",
             "[auth.tenants.bench]", f'key_digests = ["{hash_key(TENANT_KEY)}"]']
    for i, server in enumerate(servers):
        lines += ["[[workers]]", f'id = "v{i}"', f'model = "{SERVED_MODEL}"',
                  f'kind = "{"vllm" if exact else "openai"}"', f'url = "{server.url}"']
        if exact:
            lines += [f'kv_events = "{server.events}"', f'kv_events_replay = "{server.replay}"']
    return "\n".join(lines) + "\n"


def kv_event_args(servers: list[VllmServer]) -> list[str]:
    """vllm-router's kv_aware policy: the same ZMQ endpoints our router follows."""
    args = ["--kv-event-block-size", "128", "--kv-event-model", SERVED_MODEL]
    for server in servers:
        args += ["--kv-event-source", f"{server.url}={server.events}",
                 "--kv-event-replay-source", f"{server.url}={server.replay}"]
    return args


@contextlib.contextmanager
def router_for(setup: str, servers: list[VllmServer], log_dir: Path
               ) -> Iterator[tuple[str, str, ManagedProcess | None]]:
    """(URL, client key, our router process or None) for one setup."""
    urls = [s.url for s in servers]
    if setup.startswith("ours"):
        path = log_dir / "router.toml"
        path.write_text(our_config(servers, exact=setup == "ours exact"))
        args = [*router_args(path)]
        args[args.index("--log-level") + 1] = "INFO"
        router = start_process(args)
        try:
            wait_routable(router, len(urls), 60)
            yield router.url, TENANT_KEY, router
        finally:
            router.stop()
        return
    peer = peers.start_peer(PEER_SETUPS[setup], urls, "unused", SERVED_MODEL,
                            log_dir / f"{setup.replace(' ', '_')}.log", 120,
                            kv_event_args(servers) if setup == KV_AWARE else ())
    try:
        yield peer.url, "unused", None
    finally:
        peer.stop()


async def drive(url: str, key: str, prompts: list[str], num_clients: int
                ) -> list[tuple[float | None, str | None]]:
    """(TTFT, error) per request, ``num_clients`` closed-loop streams."""
    pending = iter(prompts)
    outcomes: list[tuple[float | None, str | None]] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def one(prompt: str) -> tuple[float | None, str | None]:
            body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                    "stream": True}
            start = time.perf_counter()
            ttft = None
            try:
                async with session.post(f"{url}/v1/completions", json=body,
                                        headers=headers) as resp:
                    if resp.status != 200:
                        return None, f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    async for payload in data_payloads(resp.content):
                        if ttft is None and payload.startswith("{"):
                            ttft = time.perf_counter() - start
            except (aiohttp.ClientError, TimeoutError) as exc:
                return ttft, f"{type(exc).__name__}: {exc}"
            return ttft, None

        async def loop() -> None:
            for prompt in pending:
                outcomes.append(await one(prompt))

        await asyncio.gather(*(loop() for _ in range(num_clients)))
    return outcomes


def prefix_counters(server: VllmServer) -> tuple[float, float, float]:
    """vLLM's (prefix cache hit tokens, queried tokens, requests finished) so far."""
    text = str(http_json("GET", f"{server.url}/metrics")[1])

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    return (total("vllm:prefix_cache_hits_total"), total("vllm:prefix_cache_queries_total"),
            total("vllm:request_success_total"))


def lag_under(metrics_url: str, bound_s: float) -> tuple[float, int]:
    """(fraction of index updates within ``bound_s`` of vLLM's batch time, count)."""
    text = str(http_json("GET", f"{metrics_url}/metrics")[1])
    buckets = dict(re.findall(r'^router_kv_event_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$',
                              text, re.M))
    count = float(buckets.get("+Inf", 0))
    return (float(buckets.get(str(bound_s), 0)) / count if count else float("nan")), int(count)


def run_setup(setup: str, servers: list[VllmServer], prompts: list[str],
              args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """One router setup on freshly reset servers, once per phase of ``args.phases``
    through one router process (``bench.e2e.PHASES``)."""
    for server in servers:
        http_json("POST", f"{server.url}/reset_prefix_cache")
    by_phase: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp, \
            router_for(setup, servers, Path(tmp)) as (url, key, router):
        for phase in args.phases:
            num_logged = len(ACCESS.findall(router.log_text())) if router is not None else 0
            checked_before = prediction_counts(router.metrics_url) if router is not None else {}
            before = [prefix_counters(s) for s in servers]
            start = time.perf_counter()
            outcomes = asyncio.run(drive(url, key, prompts, args.clients))
            wall_s = time.perf_counter() - start
            after = [prefix_counters(s) for s in servers]
            lag = lag_under(router.metrics_url, 0.02) if router is not None and \
                setup == "ours exact" else (float("nan"), 0)
            access = ACCESS.findall(router.log_text())[num_logged:] if router is not None else []
            by_phase[phase] = summarize(outcomes, before, after, wall_s, lag, access)
            if router is not None:
                by_phase[phase].update(exactness(checked_before,
                                                 prediction_counts(router.metrics_url)))
    return by_phase


def summarize(outcomes: list, before: list, after: list, wall_s: float,
              lag: tuple[float, int], access: list) -> dict[str, object]:
    """One phase's figures from its outcomes, the servers' prefix counters before and
    after it, the index lag and the access log lines it added."""
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    per_server = [int(a[2] - b[2]) for a, b in zip(after, before, strict=True)]
    ttft = np.array([o[0] for o in outcomes if o[1] is None and o[0] is not None] or [np.nan])
    result: dict[str, object] = {
        "num_requests": len(outcomes), "num_errors": sum(o[1] is not None for o in outcomes),
        "first_error": next((o[1] for o in outcomes if o[1]), None),
        "vllm_hit_fraction": hits / max(queries, 1),
        "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
        "requests_per_server": per_server, "wall_s": wall_s,
        "lag_within_20ms": lag[0], "num_lag_samples": lag[1],
    }
    if access:
        exact = [int(predicted) == int(cached) for _, _, predicted, cached in access]
        result["predicted_equals_cached"] = sum(exact) / len(exact)
        result["num_predictions"] = len(exact)
    return result


def main(argv: list[str] | None = None) -> dict:
    """Every setup on the same trace and the same two servers; prints a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--docs", type=int, default=32)
    parser.add_argument("--num-blocks", type=int, default=32,
                        help="KV blocks per server (128 tokens each): the documents do not fit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES),
                        help="cold: the trace on reset caches; warm: the same trace again, "
                             "right after, through the same router process")
    args = parser.parse_args(argv)
    problem = available()
    if problem is not None:
        raise SystemExit(f"vLLM environment missing: {problem}")
    prompts = make_trace(args.docs, args.requests, args.seed)
    found = peers.available()
    setups = ["ours exact", "ours approximate"]
    setups += [name for name in ("sglang cache_aware default", "vllm cache_aware", KV_AWARE)
               if found[PEER_SETUPS[name].module]]
    results: dict[str, object] = {"num_requests": args.requests, "num_docs": args.docs,
                                  "num_blocks_per_server": args.num_blocks,
                                  "missing_peers": [m for m, ok in found.items() if not ok]}
    servers = [VllmServer(cpus=str(i), num_blocks=args.num_blocks, max_model_len=2048, dev_mode=True,
                          tcp=True).start()
               for i in range(2)]
    try:
        for server in servers:
            server.wait_ready(600)
        print(f"{'router, phase':<34}{'errs':>5}{'vLLM hit':>9}{'p50 ms':>8}{'p99 ms':>8}"
              f"{'pred=cached':>12}{'lag<20ms':>9}  requests per server  "
              "checked exact/over/under/in_flight")
        for setup in setups:
            for phase, r in run_setup(setup, servers, prompts, args).items():
                name = results_key(setup, phase)
                results[name] = r
                exact = r.get("predicted_equals_cached")
                print(f"{name:<34}{r['num_errors']:>5}{r['vllm_hit_fraction']:>9.1%}"
                      f"{1e3 * r['ttft_p50_s']:>8.0f}{1e3 * r['ttft_p99_s']:>8.0f}"
                      f"{'-' if exact is None else f'{exact:.1%}':>12}"
                      f"{r['lag_within_20ms']:>9.1%}  "
                      f"{'/'.join(map(str, r['requests_per_server']))}  {describe(r)}",
                      flush=True)
                if r["first_error"]:
                    print(f"  first error: {r['first_error']}")
    finally:
        for server in servers:
            server.stop()
    print(json.dumps({k: v for k, v in results.items() if not isinstance(v, dict)}))
    return results


if __name__ == "__main__":
    main()
