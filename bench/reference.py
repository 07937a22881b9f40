"""The reference harness: our router and the peer routers side by side on stand-in workers.

Four stand-in OpenAI workers (``harness.instant_upstream --delay-ms 20 --lru-tokens N``:
a completion answers after 20 ms; each worker records the longest prefix of every
prompt it had already seen, ``harness.reuse``) behind, in turn, our router
(``cache_aware``; the stand-ins are ``kind = "openai"`` workers, so our index is in
approximate mode: what it routed, no KV events), sglang-router cache_aware and
vllm-router cache_aware (``bench.peers``; skipped, and said so, when not installed).
Every router gets fresh stand-ins and the same trace in the same order: ``rag_chat``
from ``bench.workloads`` with letters for tokens (40 Zipf(1.0) documents of about
4,000 characters, one per question, and ten-turn conversations), sent as text
completions by ``--clients`` closed-loop clients taking the next request in trace
order; a conversation's turn waits for its previous turn's answer.

Reuse = tokens of each prompt its worker had already seen / prompt tokens (sums over
the run), with unlimited memory and with an LRU tree of ``--cache-share`` of the
working set per worker (working set: the distinct prefix tokens of the whole trace).
The single-worker bound is the unlimited reuse of one worker that sees every prompt.
Load balance is max/mean requests per worker.

Run: ``python -m bench reference [--requests N] [--clients C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import aiohttp

from bench import peers
from bench.e2e import prompt_text
from bench.workloads import TraceRequest, WorkloadConfig, generate
from harness.procs import (
    ManagedProcess,
    http_json,
    start_process,
    start_router,
    wait_routable,
)
from harness.reuse import ReuseMeter
from radix.tokenizer import PromptTokenizer
from router.front.auth import hash_key
from router.up.launcher import stop_all

KEY = "reference-key"
NUM_WORKERS = 4
DELAY_MS = 20.0
MAX_TOKENS = 4
# 40 Zipf(1.0) documents of about 4,000 letters, one per question; a session start is a
# ten-turn conversation with probability 3/73, so 5,000 requests hold about 150 of them.
CONFIG = WorkloadConfig(num_docs=40, doc_tokens=(3600, 4400), zipf_exponent=1.0,
                        docs_per_request=(1, 2), chat_session_share=3 / 73, num_turns=(10, 11),
                        system_tokens=(200, 400), message_tokens=(50, 200),
                        output_tokens=(32, 128), think_time_s=5.0, vocab_size=26)
SESSION_RATE_PER_S = 100.0
OURS = "ours cache_aware"
PEER_SETUPS = ("sglang cache_aware default", "vllm cache_aware")


def trace(num_requests: int, seed: int = 0) -> list[TraceRequest]:
    """The reference trace (module docstring), ``num_requests`` long."""
    return list(generate("rag_chat", num_requests, SESSION_RATE_PER_S, seed, config=CONFIG))


def single_worker(prompts: list[str]) -> tuple[float, int]:
    """Reuse of one worker that sees every prompt in order (unlimited), and the working
    set: distinct prefix tokens of all prompts."""
    tokenizer, meter = PromptTokenizer.demo(), ReuseMeter()
    for prompt in prompts:
        meter.observe(tokenizer.encode(prompt))
    stats = meter.stats()
    return stats.num_seen_tokens / stats.num_prompt_tokens, stats.num_working_set_tokens


def _our_config(urls: list[str], weights: dict[str, str]) -> str:
    lines = ["[models.demo]", 'tokenizer = "demo"', "[policy]", 'name = "cache_aware"',
             "[policy.weights]", *(f"{name} = {value}" for name, value in weights.items()),
             "[auth.tenants.bench]", f'key_digests = ["{hash_key(KEY)}"]']
    for i, url in enumerate(urls):
        lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', 'kind = "openai"', f'url = "{url}"']
    return "\n".join(lines) + "\n"


@contextmanager
def _our_router(urls: list[str], log_dir: Path, weights: dict[str, str]) -> Iterator[str]:
    path = log_dir / "router.toml"
    path.write_text(_our_config(urls, weights))
    router = start_router(path)
    try:
        wait_routable(router, len(urls), 60.0)
        yield router.url
    finally:
        router.stop()


@contextmanager
def _peer_router(setup: str, urls: list[str], log_dir: Path) -> Iterator[str]:
    peer = peers.start_peer(peers.PEER_SETUPS[setup], urls, KEY, "demo",
                            log_dir / f"{setup.replace(' ', '_')}.log")
    try:
        yield peer.url
    finally:
        peer.stop()


def _router(setup: str, urls: list[str], log_dir: Path) -> AbstractContextManager[str]:
    """``setup`` is a peer setup's name, or ours: ``OURS`` then optional ``name=value``
    policy weights."""
    if setup.startswith(OURS):
        weights = dict(item.split("=") for item in setup[len(OURS):].split())
        return _our_router(urls, log_dir, weights)
    return _peer_router(setup, urls, log_dir)


async def drive(url: str, requests: list[TraceRequest], prompts: list[str], num_clients: int) -> int:
    """Send every request through the router at ``url`` (module docstring); returns how
    many failed."""
    pending = iter(zip(requests, prompts, strict=True))
    last_turn: dict[str, asyncio.Event] = {}
    failures = [0]
    headers = {"Authorization": f"Bearer {KEY}"}

    async def client(session: aiohttp.ClientSession) -> None:
        for request, prompt in pending:
            before = last_turn.get(request.session)
            done = last_turn[request.session] = asyncio.Event()
            if before is not None:
                await before.wait()
            body = {"model": "demo", "prompt": prompt, "max_tokens": MAX_TOKENS}
            try:
                async with session.post(f"{url}/v1/completions", json=body, headers=headers) as response:
                    await response.read()
                    failures[0] += response.status != 200
            except aiohttp.ClientError:
                failures[0] += 1
            done.set()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(client(session) for _ in range(num_clients)))
    return failures[0]


def _start_workers(lru_tokens: int) -> list[ManagedProcess]:
    args = [sys.executable, "-m", "harness.instant_upstream", "--delay-ms", str(DELAY_MS),
            "--lru-tokens", str(lru_tokens)]
    started = [start_process(args, wait=False) for _ in range(NUM_WORKERS)]
    for worker in started:
        worker.wait_ready(60.0)
    return started


def run_setup(setup: str, requests: list[TraceRequest], prompts: list[str], lru_tokens: int,
              num_clients: int) -> dict[str, object]:
    """One router on fresh stand-ins: drive the trace, read each worker's reuse."""
    workers = _start_workers(lru_tokens)
    try:
        urls = [str(w.url) for w in workers]
        with tempfile.TemporaryDirectory(prefix="reference-") as tmp, _router(setup, urls, Path(tmp)) as url:
            for worker_url in urls:  # the peers' start-up completion is not the trace's
                http_json("POST", f"{worker_url}/reuse/reset")
            start = time.perf_counter()
            num_failed = asyncio.run(drive(url, requests, prompts, num_clients))
            wall_s = time.perf_counter() - start
            stats = [http_json("GET", f"{worker_url}/reuse")[1] for worker_url in urls]
    finally:
        stop_all(workers)
    return summarize(stats, num_failed, wall_s)


def summarize(stats: list, num_failed: int, wall_s: float) -> dict[str, object]:
    """Reuse (unlimited and LRU) and load balance from the workers' ``/reuse`` counts."""
    def total(name: str) -> int:
        return sum(s[name] for s in stats)

    per_worker = [s["num_requests"] for s in stats]
    mean = max(sum(per_worker) / len(per_worker), 1e-9)
    return {"reuse_unlimited": total("num_seen_tokens") / max(total("num_prompt_tokens"), 1),
            "reuse_lru": total("num_seen_lru_tokens") / max(total("num_prompt_tokens"), 1),
            "max_over_mean_requests": max(per_worker) / mean, "requests_per_worker": per_worker,
            "num_failed": num_failed, "wall_s": wall_s}


def main(argv: list[str] | None = None) -> dict:
    """Ours and the installed peers on the reference trace; prints a table and returns
    the numbers by router."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--cache-share", type=float, default=0.10,
                        help="each worker's LRU tree, as a share of the working set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--our-weights", nargs="*", default=[], metavar="NAME=VALUE",
                        help="also run ours with these policy weights (to check a change)")
    parser.add_argument("--without-peers", action="store_true", help="our router only")
    args = parser.parse_args(argv)
    requests = trace(args.requests, args.seed)
    prompts = [prompt_text(r) for r in requests]
    bound, working_set = single_worker(prompts)
    lru_tokens = int(args.cache_share * working_set)
    found = {m: False for m in ("sglang_router", "vllm_router")} if args.without_peers else peers.available()
    setups = [OURS] + ([" ".join([OURS, *args.our_weights])] if args.our_weights else [])
    setups += [name for name in PEER_SETUPS if found[peers.PEER_SETUPS[name].module]]
    missing = [module for module, ok in found.items() if not ok]
    if missing:
        print(f"peer routers not installed ({', '.join(missing)}): run `make bench-peers`; going on without them")
    print(f"{len(requests)} requests, {args.clients} clients, {NUM_WORKERS} workers; working set "
          f"{working_set} tokens, LRU {lru_tokens} per worker; single-worker bound {bound:.4f}")
    results: dict[str, object] = {"num_requests": len(requests), "single_worker_bound": bound,
                                  "working_set_tokens": working_set, "lru_tokens": lru_tokens,
                                  "missing_peers": missing}
    print(f"{'router':<30}{'reuse unlimited':>16}{'reuse LRU':>10}{'max/mean':>9}{'failed':>7}"
          f"{'wall s':>7}  requests per worker")
    for setup in setups:
        r = results[setup] = run_setup(setup, requests, prompts, lru_tokens, args.clients)
        print(f"{setup:<30}{r['reuse_unlimited']:>16.4f}{r['reuse_lru']:>10.3f}"
              f"{r['max_over_mean_requests']:>9.2f}{r['num_failed']:>7}{r['wall_s']:>7.0f}  "
              f"{'/'.join(map(str, r['requests_per_worker']))}", flush=True)
    return results


if __name__ == "__main__":
    main()
