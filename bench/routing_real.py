"""Routing quality on real processes: demo workers behind a router, driven by the openai client.

For each worker count and policy, a fresh cluster (empty caches): ``--workers`` demo
workers (one torch thread, ``--kv-cache-bytes`` each, small so eviction matters) and a
router with that ``[policy] name``. The workload is ``bench.workloads``' ``rag_chat``
(a public system prompt and a Zipf-popular document, registered as public prefixes,
plus a private question; multi-turn conversations on the public system prompts;
eight tenants), shrunk to a few hundred tokens per document and sent as token-id
completions prompts. Every run gets
the same requests in the same order from ``--clients`` concurrent streaming clients
(closed loop: a client sends its next request when the previous one ends; a
conversation's turns go in order from one client). A conversation resends the
workload's synthetic answer, not the model's, so a turn shares its previous turn's
prompt with the worker's cache, not that turn's generated tokens.

Per run: the fraction of prompt tokens the workers served from cache (``cached``: sum
of ``usage.prompt_tokens_details.cached_tokens`` over sum of ``prompt_tokens``), the
router's own prediction of it (``predicted``: matched / prompt tokens, from
``GET /admin/index``), max/mean requests per worker, requests/s and TTFT percentiles
(first streamed text). All processes share this machine's cores, so requests/s and
TTFT include the client's and router's CPU time.

Run from the repository root: ``python -m bench.routing_real [--workers 2 4]
[--policies ...] [--requests N]``. Processes start through ``harness.procs``
(plain Python, shared with the integration tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from openai import AsyncOpenAI

from bench.workloads import TraceRequest, WorkloadConfig, generate
from harness.procs import (
    ManagedProcess,
    http_json,
    router_args,
    start_process,
    start_worker,
    wait_routable,
)
from radix.keys import TOKEN_BYTES
from router.front.auth import hash_key
from router.routing.policy import POLICIES
from router.up.launcher import stop_all

ADMIN_KEY = "bench-admin"
READY_TIMEOUT_S = 60.0
# Documents and conversations short enough for a CPU demo worker; 24 documents of
# ~300 tokens exceed two 16 MiB workers' 4,000-token caches, fit in four. 30% of
# session starts are conversations.
CONFIG = WorkloadConfig(
    num_docs=24, doc_tokens=(128, 512), message_tokens=(16, 64), output_tokens=(16, 48),
    system_tokens=(128, 129), num_turns=(2, 6), docs_per_request=(1, 2),
    chat_session_share=0.3, vocab_size=256,
)
TENANTS = [f"tenant-{i}" for i in range(CONFIG.num_tenants)]


def tenant_key(tenant: str) -> str:
    """The API key of a workload tenant."""
    return f"bench-{tenant}"


def token_ids(key: bytes) -> list[int]:
    """A workload key (uint32 token ids as bytes) as a list of ints."""
    return np.frombuffer(key, dtype=np.uint32).tolist()


def build_jobs(num_requests: int, seed: int = 0) -> tuple[list[bytes], list[list[TraceRequest]]]:
    """The workload's public prefixes (each request's public part, distinct) and exactly
    ``num_requests`` requests grouped into jobs: a session's requests in order (a
    document question alone, or a conversation's turns; the last may be cut)."""
    requests = list(generate("rag_chat", num_requests, 1.0, seed, config=CONFIG))
    sessions: dict[str, list[TraceRequest]] = {}
    for request in requests:
        sessions.setdefault(request.session, []).append(request)
    prefixes = {r.prompt[: r.num_public_tokens * TOKEN_BYTES] for r in requests}
    return sorted(prefixes), list(sessions.values())


def router_config(public_prefixes: list[bytes], worker_urls: list[str], policy: str) -> str:
    """Router TOML: the demo model with ``public_prefixes`` registered, the workload's
    tenants, an admin key, ``policy``."""
    prefixes = ", ".join(f"{{ token_ids = {token_ids(p)} }}" for p in public_prefixes)
    lines = ["[models.demo]", 'tokenizer = "demo"', f"public_prefixes = [{prefixes}]",
             "[policy]", f'name = "{policy}"',
             "[auth]", f'admin_key_digest = "{hash_key(ADMIN_KEY)}"']
    for tenant in TENANTS:
        lines += [f"[auth.tenants.{tenant}]", f'key_digests = ["{hash_key(tenant_key(tenant))}"]']
    for i, url in enumerate(worker_urls):
        lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'url = "{url}"']
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def cluster(num_workers: int, policy: str, public_prefixes: list[bytes], kv_cache_bytes: str
            ) -> Iterator[ManagedProcess]:
    """Fresh workers and a router serving all of them; yields the router. Every process
    started is stopped on leaving, whatever ends the block (errors, Ctrl-C)."""
    started: list[ManagedProcess] = []
    try:
        for _ in range(num_workers):
            started.append(start_worker(kv_cache_bytes=kv_cache_bytes, wait=False))
        urls = [worker.wait_ready(READY_TIMEOUT_S) for worker in started]
        with tempfile.TemporaryDirectory(prefix="routing-real-") as tmp:
            path = Path(tmp) / "router.toml"
            path.write_text(router_config(public_prefixes, urls, policy))
            started.append(router := start_process(router_args(path), wait=False))
            router.wait_ready(READY_TIMEOUT_S)
        wait_routable(router, num_workers, READY_TIMEOUT_S)
        yield router
    finally:
        stop_all(started)



@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it; ``error`` is None when it succeeded."""

    num_prompt_tokens: int
    num_cached_tokens: int
    ttft_s: float | None
    error: str | None = None


async def _send(client: AsyncOpenAI, request: TraceRequest, max_tokens: int) -> Outcome:
    start = time.perf_counter()
    ttft_s: float | None = None
    usage = None
    try:
        stream = await client.completions.create(
            model="demo", prompt=token_ids(request.prompt), max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and ttft_s is None:
                ttft_s = time.perf_counter() - start
            usage = chunk.usage or usage
    except Exception as exc:  # counted and reported; the run goes on
        return Outcome(request.num_prompt_tokens, 0, ttft_s, f"{type(exc).__name__}: {exc}")
    if usage is None or usage.prompt_tokens_details is None:
        return Outcome(request.num_prompt_tokens, 0, ttft_s, "stream ended without usage")
    return Outcome(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, ttft_s)


async def drive(router_urls: Sequence[str], jobs: list[list[TraceRequest]], num_clients: int,
                max_tokens: int) -> list[Outcome]:
    """Send every job from ``num_clients`` concurrent loops, each taking the next job
    when its last one ends; loop ``i`` sends to ``router_urls[i % len(router_urls)]``
    (several routers: the clients split between them). The outcomes in completion
    order."""
    clients = [{t: AsyncOpenAI(base_url=f"{url}/v1", api_key=tenant_key(t), max_retries=0)
                for t in TENANTS} for url in router_urls]
    pending = iter(jobs)
    outcomes: list[Outcome] = []

    async def loop(index: int) -> None:
        mine = clients[index % len(clients)]
        for job in pending:
            for request in job:
                outcomes.append(await _send(mine[request.tenant], request, max_tokens))

    try:
        await asyncio.gather(*(loop(i) for i in range(num_clients)))
    finally:
        for per_router in clients:
            for client in per_router.values():
                await client.close()
    return outcomes


def run_one(policy: str, num_workers: int, args: argparse.Namespace) -> dict[str, object]:
    """One policy on fresh workers: drive the workload, read the router's per-worker
    stats, and summarize."""
    public_prefixes, jobs = build_jobs(args.requests, args.seed)
    with cluster(num_workers, policy, public_prefixes, args.kv_cache_bytes) as router:
        start = time.perf_counter()
        outcomes = asyncio.run(drive([router.url], jobs, args.clients, args.max_tokens))
        drive_s = time.perf_counter() - start
        status, index = http_json("GET", f"{router.url}/admin/index",
                                  headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    if status != 200:
        raise RuntimeError(f"GET /admin/index answered {status}: {index}")
    workers = index["workers"]
    per_worker = [workers[w]["num_requests"] for w in sorted(workers)]
    ttft_ms = sorted(1e3 * o.ttft_s for o in outcomes if o.error is None and o.ttft_s is not None)
    return {
        **outcome_figures(outcomes),
        "predicted_fraction": sum(w["num_matched_tokens"] for w in workers.values())
        / max(sum(w["num_prompt_tokens"] for w in workers.values()), 1),
        "requests_per_worker": per_worker,
        "max_over_mean_requests": max(per_worker) / max(statistics.mean(per_worker), 1e-9),
        "requests_per_s": len(outcomes) / drive_s,
        "ttft_p50_ms": quantile(ttft_ms, 0.5),
        "ttft_p90_ms": quantile(ttft_ms, 0.9),
    }


def outcome_figures(outcomes: list[Outcome]) -> dict[str, object]:
    """What the clients saw, in the order reported: the request and error counts, the
    first error and the cached fraction of the answered requests' prompts."""
    ok = [o for o in outcomes if o.error is None]
    num_prompt = sum(o.num_prompt_tokens for o in ok)
    return {
        "num_requests": len(outcomes),
        "num_errors": len(outcomes) - len(ok),
        "first_error": next((o.error for o in outcomes if o.error), None),
        "cached_fraction": sum(o.num_cached_tokens for o in ok) / max(num_prompt, 1),
    }


def quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of the sorted ``ordered`` (NaN when empty)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _row(policy: str, num_workers: int, r: dict) -> str:
    return (f"{policy:<17}{num_workers:>3}{r['num_requests']:>6}{r['num_errors']:>5}"
            f"{r['cached_fraction']:>8.1%}{r['predicted_fraction']:>8.1%}"
            f"{r['max_over_mean_requests']:>9.2f}{r['requests_per_s']:>7.1f}"
            f"{r['ttft_p50_ms']:>8.0f}{r['ttft_p90_ms']:>8.0f}  "
            f"{'/'.join(map(str, r['requests_per_worker']))}")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the flags of one run of the workload: ``--requests``, ``--clients``,
    ``--max-tokens``, ``--kv-cache-bytes`` (per worker) and ``--seed``."""
    parser.add_argument("--requests", type=int, default=160, help="requests per run")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--kv-cache-bytes", default="16MiB", help="per worker")
    parser.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> dict:
    """Every selected policy on each worker count; prints a table and the wall time and
    returns the numbers by ``policy/workers``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    add_run_flags(parser)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results: dict[str, object] = {}
    print(f"{'policy':<17}{'w':>3}{'reqs':>6}{'errs':>5}{'cached':>8}{'predict':>8}"
          f"{'max/mean':>9}{'req/s':>7}{'ttft50':>8}{'ttft90':>8}  requests per worker")
    for num_workers in args.workers:
        for policy in args.policies:
            r = results[f"{policy}/{num_workers}"] = run_one(policy, num_workers, args)
            print(_row(policy, num_workers, r), flush=True)
            if r["first_error"]:
                print(f"  first error: {r['first_error']}", flush=True)
    results["wall_s"] = time.perf_counter() - start
    print(f"wall time {results['wall_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()
