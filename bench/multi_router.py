"""One router against two on shared Redis state: cache hits, decision time, convergence.

The workload is ``bench.routing_real``'s (Zipf-popular public documents with private
questions, multi-turn conversations, eight tenants), sent by ``--clients`` closed-loop
streaming clients. Each run starts fresh demo workers (empty caches), then either one
router, or a ``redis-server`` and two routers on it with the clients split between
them (client ``i`` talks to router ``i % 2``). Both setups get the same requests in
the same order of issue.

Per run: the fraction of prompt tokens the workers served from cache (``cached``,
from ``usage.prompt_tokens_details.cached_tokens``), the routers' own prediction
(``predicted``), the mean time to match and choose a worker (``router_decision_seconds``
over every router), requests/s and TTFT. With two routers, after the workload: the
convergence delay of the second router's index, measured ``--probes`` times as the
time from a fresh request's answer through router A until router B's exact index
holds the same blocks as A's (``GET /admin/index`` fingerprints equal, polled every
``POLL_S``). Both routers follow every worker's KV events themselves, so the delay
is that of the event streams, not of Redis.

Run from the repository root: ``python -m bench.multi_router [--workers 3]
[--requests N] [--clients C] [--probes P]`` (or ``python -m bench multi_router``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.routing_real import (
    ADMIN_KEY,
    TENANTS,
    add_run_flags,
    build_jobs,
    drive,
    outcome_figures,
    quantile,
    router_config,
    tenant_key,
)
from harness.procs import (
    ManagedProcess,
    http_json,
    router_args,
    start_process,
    start_worker,
    wait_routable,
)
from router.up.launcher import RedisServer, stop_all

READY_TIMEOUT_S = 60.0
POLL_S = 0.005
_REDIS = """
[redis]
url = "{url}"
key_prefix = "bench"
"""


@contextlib.contextmanager
def cluster(num_routers: int, num_workers: int, public_prefixes: list[bytes], kv_cache_bytes: str
            ) -> Iterator[list[ManagedProcess]]:
    """Fresh workers and ``num_routers`` routers over all of them (on a fresh Redis when
    more than one); yields the routers. Everything started is stopped on leaving."""
    started: list[ManagedProcess] = []
    redis = RedisServer() if num_routers > 1 else None
    try:
        started += [start_worker(kv_cache_bytes=kv_cache_bytes, wait=False)
                    for _ in range(num_workers)]
        urls = [worker.wait_ready(READY_TIMEOUT_S) for worker in started]
        text = router_config(public_prefixes, urls, "cache_aware")
        if redis is not None:
            text += _REDIS.format(url=redis.url)
        with tempfile.TemporaryDirectory(prefix="multi-router-") as tmp:
            path = Path(tmp) / "router.toml"
            path.write_text(text)
            routers = [start_process(router_args(path), wait=False) for _ in range(num_routers)]
            started += routers
            for router in routers:
                router.wait_ready(READY_TIMEOUT_S)
        for router in routers:
            wait_routable(router, num_workers, READY_TIMEOUT_S)
        yield routers
    finally:
        stop_all(started)
        if redis is not None:
            redis.stop()



def _admin(router: ManagedProcess, path: str) -> dict:
    status, body = http_json("GET", f"{router.url}{path}",
                             headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    if status != 200:
        raise RuntimeError(f"GET {path} answered {status}: {body}")
    return body


def decision_seconds(router: ManagedProcess) -> tuple[float, int]:
    """(sum, count) of the router's ``router_decision_seconds`` histogram."""
    status, text = http_json("GET", f"{router.metrics_url}/metrics")
    values = {}
    for line in str(text).splitlines():
        name, _, value = line.partition(" ")
        if name in ("router_decision_seconds_sum", "router_decision_seconds_count"):
            values[name] = float(value)
    return values["router_decision_seconds_sum"], int(values["router_decision_seconds_count"])


def convergence_delays(a: ManagedProcess, b: ManagedProcess, num_probes: int) -> list[float]:
    """Seconds from each probe's answer through ``a`` until ``b``'s index fingerprint
    equals ``a``'s (a fresh prompt each time, so both indexes must learn its blocks)."""
    delays = []
    for i in range(num_probes):
        prompt = [(7 * i + j) % 250 + 1 for j in range(160)]
        before = _admin(a, "/admin/index")["fingerprint"]
        status, body = http_json("POST", f"{a.url}/v1/completions",
                                 {"model": "demo", "prompt": prompt, "max_tokens": 2},
                                 {"Authorization": f"Bearer {tenant_key(TENANTS[0])}"})
        if status != 200:
            raise RuntimeError(f"probe answered {status}: {body}")
        answered = time.perf_counter()
        while _admin(a, "/admin/index")["fingerprint"] == before:
            if time.perf_counter() - answered > 10:
                raise RuntimeError("router A never learnt the probe's blocks")
            time.sleep(POLL_S)
        while _admin(b, "/admin/index")["fingerprint"] != _admin(a, "/admin/index")["fingerprint"]:
            if time.perf_counter() - answered > 10:
                raise RuntimeError("router indexes did not converge within 10 s")
            time.sleep(POLL_S)
        delays.append(time.perf_counter() - answered)
    return delays


def run_one(num_routers: int, args: argparse.Namespace) -> dict[str, object]:
    """The workload through ``num_routers`` routers on fresh workers, summarized."""
    public_prefixes, jobs = build_jobs(args.requests, args.seed)
    with cluster(num_routers, args.workers, public_prefixes, args.kv_cache_bytes) as routers:
        start = time.perf_counter()
        outcomes = asyncio.run(drive([r.url for r in routers], jobs, args.clients,
                                     args.max_tokens))
        drive_s = time.perf_counter() - start
        indexes = [_admin(r, "/admin/index")["workers"] for r in routers]
        decisions = [decision_seconds(r) for r in routers]
        delays = convergence_delays(routers[0], routers[1], args.probes) if num_routers > 1 else []
    matched = sum(w["num_matched_tokens"] for index in indexes for w in index.values())
    routed = sum(w["num_prompt_tokens"] for index in indexes for w in index.values())
    ttft_ms = sorted(1e3 * o.ttft_s for o in outcomes if o.error is None and o.ttft_s is not None)
    return {
        "num_routers": num_routers,
        **outcome_figures(outcomes),
        "predicted_fraction": matched / max(routed, 1),
        "decision_us_mean": 1e6 * sum(s for s, _ in decisions) / max(sum(c for _, c in decisions), 1),
        "requests_per_s": len(outcomes) / drive_s,
        "ttft_p50_ms": quantile(ttft_ms, 0.5),
        "convergence_ms_median": 1e3 * statistics.median(delays) if delays else None,
        "convergence_ms_max": 1e3 * max(delays) if delays else None,
    }


def main(argv: list[str] | None = None) -> dict:
    """One router, then two on Redis; prints a table, the convergence delay and the wall
    time, and returns the numbers by router count."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    add_run_flags(parser)
    parser.add_argument("--probes", type=int, default=10, help="convergence probes")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results: dict[str, object] = {}
    print(f"{'routers':>7}{'reqs':>6}{'errs':>5}{'cached':>8}{'predict':>8}{'decide_us':>10}"
          f"{'req/s':>7}{'ttft50':>8}")
    for num_routers in (1, 2):
        r = results[f"routers_{num_routers}"] = run_one(num_routers, args)
        print(f"{num_routers:>7}{r['num_requests']:>6}{r['num_errors']:>5}"
              f"{r['cached_fraction']:>8.1%}{r['predicted_fraction']:>8.1%}"
              f"{r['decision_us_mean']:>10.1f}{r['requests_per_s']:>7.1f}"
              f"{r['ttft_p50_ms']:>8.0f}", flush=True)
        if r["first_error"]:
            print(f"  first error: {r['first_error']}", flush=True)
    two = results["routers_2"]
    gap = 100 * (results["routers_1"]["cached_fraction"] - two["cached_fraction"])
    print(f"cached fraction, 1 router minus 2 routers: {gap:+.1f} points")
    print(f"convergence delay of router B's index ({args.probes} probes): median "
          f"{two['convergence_ms_median']:.0f} ms, max {two['convergence_ms_max']:.0f} ms")
    results["cached_gap_points"] = gap
    results["wall_s"] = time.perf_counter() - start
    print(f"wall time {results['wall_s']:.0f} s")
    return results


if __name__ == "__main__":
    main()
