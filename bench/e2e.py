"""End to end: the same demo workers behind our router and behind the peer routers.

For each router setup, K fresh demo workers (one torch thread, ``--kv-cache-bytes``
each, keyed) on loopback and one router in front of them: ours (``[policy] name =
"cache_aware"``, KV events) and, when ``bench/.peers`` has them, sglang-router
cache_aware at its default and at tuned thresholds and vllm-router cache_aware and
consistent_hash (``bench.peers``). Every setup gets the same requests in the same
order: a ``bench.workloads`` trace with letters for tokens, sent as text
completions (the peers route on text; ours tokenizes), one tenant (the peers have no
tenancy), by a bounded load generator: ``--clients`` concurrent streams taking the
next request in trace order when their last one ends, with a progress bar.

Each setup sends the trace twice through one router process (``--phases``): "cold",
on its fresh workers, and "warm", the same requests again right after, so every router
meets the same cache state in each phase and each phase is reported on its own.

Per setup and phase: TTFT p50/p99 (first streamed text), output tokens/s, the cached fraction
(sum of ``usage.prompt_tokens_details.cached_tokens`` / sum of ``prompt_tokens``),
requests per worker (each worker's own ``request_prompt_tokens`` count from its
``/metrics``) and their max/mean. All processes share this machine's cores.

Run: ``python -m bench e2e [--workers K] [--requests N] [--clients C]``;
``python -m bench e2e --backend timed ...`` runs ``bench.e2e_timed`` instead (timed
workers at cluster scale, open and closed loop; ``bench.__main__`` picks it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
from openai import AsyncOpenAI
from tqdm import tqdm

from bench import peers
from bench.workloads import TraceRequest, WorkloadConfig, generate
from harness.procs import ManagedProcess, http_json, router_args, start_process, start_worker
from router.front.auth import hash_key

WORKER_KEY = "e2e-worker-key"
TENANT_KEY = "e2e-tenant-key"
READY_TIMEOUT_S = 90.0
# Sizes a CPU demo worker serves in a few hundred milliseconds.
CONFIG = WorkloadConfig(num_docs=24, doc_tokens=(128, 384), system_tokens=(64, 96),
                        message_tokens=(16, 48), output_tokens=(8, 16), num_turns=(2, 6),
                        tool_result_tokens=(32, 96), vocab_size=26)
OURS = "ours cache_aware"
# Each setup sends its trace twice through one router process: on fresh workers, then
# again on what the first pass left (docs/bench.md, "Cold and warm").
PHASES = ("cold", "warm")


def results_key(setup: str, phase: str) -> str:
    """How a setup's phase is named in results and tables: ``ours cache_aware, cold``."""
    return f"{setup}, {phase}"


def prompt_text(request: TraceRequest) -> str:
    """The prompt as letters, one per workload token."""
    return (np.frombuffer(request.prompt, dtype=np.uint32).astype(np.uint8) + ord("a")).tobytes().decode()


def _our_router_config(worker_urls: list[str], policy: str, weights: dict[str, float],
                       poll_interval_s: float,
                       settings: Mapping[str, Mapping[str, float | bool]]) -> str:
    sections = {**settings, "registry": {"poll_interval_s": poll_interval_s,
                                         **settings.get("registry", {})}}
    lines = ["[models.demo]", 'tokenizer = "demo"', "[policy]", f'name = "{policy}"',
             "[policy.weights]", *(f"{name} = {value}" for name, value in weights.items()),
             "[auth.tenants.bench]", f'key_digests = ["{hash_key(TENANT_KEY)}"]']
    for section, values in sections.items():
        lines += [f"[{section}]", *(f"{name} = {str(value).lower() if isinstance(value, bool) else value}"
                                    for name, value in values.items())]
    for i, url in enumerate(worker_urls):
        lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'url = "{url}"',
                  'api_key_env = "RADIX_WORKER_KEY_E2E"']
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def workers(num_workers: int, kv_cache_bytes: str, *flags: str,
            ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[list[ManagedProcess]]:
    """``num_workers`` keyed workers (demo model unless ``flags`` say otherwise), started
    at once; each has until ``ready_timeout_s`` after the start to be ready."""
    started = [start_worker(*flags, kv_cache_bytes=kv_cache_bytes, wait=False, api_key=WORKER_KEY)
               for _ in range(num_workers)]
    try:
        deadline = time.monotonic() + ready_timeout_s
        for worker in started:
            worker.wait_ready(max(1.0, deadline - time.monotonic()))
        yield started
    finally:
        for worker in started:
            worker.stop()


class RunningRouter(NamedTuple):
    """A router under test: its URL, the key a client sends it, its process id and,
    for ours, the URL of its ``/metrics`` (None for a peer)."""

    url: str
    key: str
    pid: int
    metrics_url: str | None


@contextlib.contextmanager
def router(setup: str, urls: list[str], log_dir: Path, poll_interval_s: float = 1.0,
           settings: Mapping[str, Mapping[str, float | bool]] | None = None
           ) -> Iterator[RunningRouter]:
    """The router of ``setup`` in front of ``urls``: a peer setup's name, or ours:
    ``ours <policy>`` optionally followed by ``name=value`` weights, polling its
    workers' load every ``poll_interval_s`` (the peers poll none), with the config
    sections ``settings`` (ours only: ``{"registry": {"pushed_load": False}}``)."""
    if setup.startswith("ours "):
        _, policy, *items = setup.split()
        weights = {k: float(v) for k, v in (item.split("=") for item in items)}
        path = log_dir / "router.toml"
        path.write_text(_our_router_config(urls, policy, weights, poll_interval_s,
                                           settings or {}))
        router = start_process(router_args(path), {"RADIX_WORKER_KEY_E2E": WORKER_KEY})
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while router.get_json("/health")[1]["num_ready_workers"] < len(urls):
                if time.monotonic() > deadline:
                    raise RuntimeError("our router: workers not ready")
                time.sleep(0.1)
            yield RunningRouter(router.url, TENANT_KEY, router.proc.pid, router.metrics_url)
        finally:
            router.stop()
        return
    peer = peers.start_peer(peers.PEER_SETUPS[setup], urls, WORKER_KEY, "demo",
                            log_dir / f"{setup.replace(' ', '_')}.log", READY_TIMEOUT_S)
    try:
        yield RunningRouter(peer.url, WORKER_KEY, peer.process.pid, None)
    finally:
        peer.stop()


async def stream_completion(client: AsyncOpenAI, request: TraceRequest, model: str = "demo"
                            ) -> tuple[int, int, float | None, int, str | None]:
    """Stream one trace request to ``model`` (a LoRA adapter's name runs that adapter):
    (prompt tokens, cached tokens, TTFT from now, output tokens, error). A failure is
    returned, never raised: the run goes on."""
    start, ttft, usage = time.perf_counter(), None, None
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt_text(request), max_tokens=request.num_output_tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and ttft is None:
                ttft = time.perf_counter() - start
            usage = chunk.usage or usage
    except Exception as exc:  # counted and reported; the run goes on
        return request.num_prompt_tokens, 0, ttft, 0, f"{type(exc).__name__}: {exc}"
    if usage is None or usage.prompt_tokens_details is None:
        return request.num_prompt_tokens, 0, ttft, 0, "stream ended without usage"
    return (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0, ttft,
            usage.completion_tokens, None)


async def drive(url: str, key: str, requests: list[TraceRequest], num_clients: int,
                 label: str) -> list[tuple[int, int, float | None, int, str | None]]:
    """(prompt tokens, cached tokens, TTFT, output tokens, error) per request."""
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    pending = iter(requests)
    outcomes: list[tuple[int, int, float | None, int, str | None]] = []
    bar = tqdm(total=len(requests), desc=label, leave=False)

    async def loop() -> None:
        for request in pending:
            outcomes.append(await stream_completion(client, request))
            bar.update()

    try:
        await asyncio.gather(*(loop() for _ in range(num_clients)))
    finally:
        bar.close()
        await client.close()
    return outcomes


def requests_served(worker: ManagedProcess) -> int:
    """Requests the worker has served (its ``request_prompt_tokens`` count)."""
    return int(worker_counter(worker, "request_prompt_tokens_count"))


def worker_counter(worker: ManagedProcess, name: str) -> float:
    """The worker's Prometheus sample ``name`` (summed over its label sets; 0 without)."""
    status, text = http_json("GET", f"{worker.url}/metrics",
                             headers={"Authorization": f"Bearer {WORKER_KEY}"})
    if status != 200:
        raise RuntimeError(f"worker /metrics answered {status}")
    pattern = rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$"
    return sum(float(value) for value in re.findall(pattern, str(text), re.M))


def run_setup(setup: str, requests: list[TraceRequest], args: argparse.Namespace
              ) -> dict[str, dict[str, object]]:
    """One router setup on fresh workers: drive the trace once per phase of
    ``args.phases`` in one router process ("cold": caches that never saw it; "warm":
    the same trace again right after) and summarize each."""
    by_phase: dict[str, dict[str, object]] = {}
    with workers(args.workers, args.kv_cache_bytes) as started, \
            tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        urls = [w.url for w in started]
        with router(setup, urls, Path(tmp)) as (url, key, _, _):
            for phase in args.phases:
                before = [requests_served(w) for w in started]
                start = time.perf_counter()
                outcomes = asyncio.run(drive(url, key, requests, args.clients, setup))
                wall_s = time.perf_counter() - start
                per_worker = [requests_served(w) - b for w, b in zip(started, before, strict=True)]
                by_phase[phase] = summarize(outcomes, per_worker, wall_s)
    return by_phase


def summarize(outcomes: list, per_worker: list[int], wall_s: float) -> dict[str, object]:
    """One phase's figures (module docstring)."""
    ok = [o for o in outcomes if o[4] is None]
    ttft = np.array([o[2] for o in ok if o[2] is not None]) if ok else np.array([np.nan])
    return figures(outcomes, ok, ttft, ("output_tokens_per_s", sum(o[3] for o in ok) / wall_s),
                   per_worker, wall_s)


def figures(outcomes: list, ok: list, ttft_s: np.ndarray, rate: tuple[str, float],
            per_worker: list[int], wall_s: float) -> dict[str, object]:
    """The figures of one run, in the order reported: request and error counts and the
    first error (of ``outcomes``), the cached fraction (of ``ok``), TTFT p50/p99 (of
    ``ttft_s``), the ``rate`` (name, value), the requests per worker and their max/mean,
    and ``wall_s``."""
    return {
        "num_requests": len(outcomes),
        "num_errors": len(outcomes) - len(ok),
        "first_error": next((o[4] for o in outcomes if o[4]), None),
        "cached_fraction": sum(o[1] for o in ok) / max(sum(o[0] for o in ok), 1),
        "ttft_p50_s": float(np.percentile(ttft_s, 50)),
        "ttft_p99_s": float(np.percentile(ttft_s, 99)),
        rate[0]: rate[1],
        "requests_per_worker": per_worker,
        "max_over_mean_load": max(per_worker) / max(float(np.mean(per_worker)), 1e-9),
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> dict:
    """Ours and every installed peer setup on the same trace; prints a table."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--kv-cache-bytes", default="16MiB", help="per worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--our-weights", nargs="*", default=[], metavar="NAME=VALUE",
                        help="also run ours with these policy weights (to check a change)")
    parser.add_argument("--without-peers", action="store_true", help="our router only")
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES),
                        help="cold: the trace on fresh workers; warm: the same trace again, "
                             "right after, through the same router process")
    args = parser.parse_args(argv)
    requests = list(generate(args.workload, args.requests, 1.0, args.seed, config=CONFIG))
    found = {m: False for m in ("sglang_router", "vllm_router")} if args.without_peers else peers.available()
    setups = [OURS] + ([" ".join([OURS, *args.our_weights])] if args.our_weights else [])
    setups += [name for name, s in peers.PEER_SETUPS.items() if found[s.module]]
    missing = [module for module, ok in found.items() if not ok]
    if missing:
        print(f"peer routers not installed ({', '.join(missing)}): run `make bench-peers`; "
              "going on without them")
    results: dict[str, object] = {"workload": args.workload, "num_workers": args.workers,
                                  "missing_peers": missing}
    print(f"{'router, phase':<34}{'reqs':>5}{'errs':>5}{'cached':>8}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'tok/s':>7}{'max/mean':>9}  requests per worker")
    for setup in setups:
        for phase, r in run_setup(setup, requests, args).items():
            name = results_key(setup, phase)
            results[name] = r
            print(f"{name:<34}{r['num_requests']:>5}{r['num_errors']:>5}{r['cached_fraction']:>8.1%}"
                  f"{1e3 * r['ttft_p50_s']:>8.0f}{1e3 * r['ttft_p99_s']:>8.0f}"
                  f"{r['output_tokens_per_s']:>7.0f}{r['max_over_mean_load']:>9.2f}  "
                  f"{'/'.join(map(str, r['requests_per_worker']))}", flush=True)
            if r["first_error"]:
                print(f"  first error: {r['first_error']}")
    return results


if __name__ == "__main__":
    main()
