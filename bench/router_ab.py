"""Our router against itself from another checkout, interleaved: a change's CPU cost
on a noisy machine.

``python -m bench.router_ab OTHER_CHECKOUT [--rounds R] [--requests N]
[--tokenizer NAME]`` starts four instant stand-in upstreams and two routers in front
of them, one run from this checkout and one from ``OTHER_CHECKOUT`` (a ``git
worktree`` of the commit to compare with, its own code on its ``PYTHONPATH``), and
drives the ``router_overhead`` workloads (unique, repeated document, chat; 64
clients, and one client on the repeated document) at each router in turn, ``N``
requests a round, ``R`` rounds, alternating which goes first. Both routers see the
same machine at nearly the same moment, so their ratio holds where absolute figures
drift with the load. Prints, per workload, each router's CPU µs per request (its
whole CPU over all rounds, from /proc) and p50 latency (median over rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.overhead_load import drive, prompts
from harness.procs import REPO_ROOT, ManagedProcess, child_env, process_cpu_s, start_process
from radix.model_source import DEMO_MODEL
from router.front.auth import hash_key
from router.up.launcher import ChildProcess

KEY = "bench-ab-key"
MAX_TOKENS = 16
NUM_UPSTREAMS = 4

# name -> (clients, prompts workload)
WORKLOADS = {"64c_text": (64, "unique"), "64c_repeat": (64, "repeat"),
             "64c_chat": (64, "chat"), "1c_repeat": (1, "repeat")}


def _config(urls: list[str], tokenizer: str) -> str:
    """Model ``demo`` on ``urls`` (instant upstreams), one tenant with ``KEY``."""
    workers = "".join(f'[[workers]]\nid = "u{i}"\nmodel = "demo"\nurl = "{url}"\n'
                      for i, url in enumerate(urls))
    return (f'[models.demo]\ntokenizer = "{tokenizer}"\n[auth.tenants.ab]\n'
            f'key_digests = ["{hash_key(KEY)}"]\n{workers}')


def _start_router(checkout: Path, config: Path) -> ChildProcess:
    """A router process running ``checkout``'s code (its directory first on the path)."""
    args = [sys.executable, "-m", "router", "--config", str(config), "--port", "0",
            "--log-level", "WARNING"]
    process = ChildProcess(args, child_env({"PYTHONPATH": str(checkout)}), cwd=checkout)
    process.wait_ready(60.0)
    return process


async def _round(routers: dict[str, ChildProcess], order: list[str], name: str,
                 num_requests: int) -> dict[str, tuple[float, int, float]]:
    """One round of workload ``name``: per router (CPU seconds, requests, p50 ms)."""
    clients, workload = WORKLOADS[name]
    chat = workload == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    bodies = [{"model": "demo", "messages" if chat else "prompt": p, "max_tokens": MAX_TOKENS}
              for p in prompts(num_requests, workload)]
    headers = {"Authorization": f"Bearer {KEY}"}
    results = {}
    for side in order:
        router = routers[side]
        before = process_cpu_s(router.proc.pid)
        run = await drive(f"{router.url}{path}", bodies, headers, clients, False)
        results[side] = (process_cpu_s(router.proc.pid) - before, len(bodies),
                         run.percentile_ms(0.5))
    return results


async def _rounds(other: Path, rounds: int, num_requests: int, tokenizer: str
                  ) -> dict[str, dict[str, list[tuple[float, int, float]]]]:
    """Every round's samples, by workload and router (``this``, ``other``)."""
    upstreams: list[ManagedProcess] = [
        await asyncio.to_thread(start_process, [sys.executable, "-m", "harness.instant_upstream",
                                                "--tokenizer", tokenizer])
        for _ in range(NUM_UPSTREAMS)]
    routers: dict[str, ChildProcess] = {}
    samples: dict[str, dict[str, list[tuple[float, int, float]]]] = {
        name: {"this": [], "other": []} for name in WORKLOADS}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "router.toml"
            config.write_text(_config([u.url for u in upstreams], tokenizer))
            for side, checkout in (("this", REPO_ROOT), ("other", other)):
                routers[side] = await asyncio.to_thread(_start_router, checkout, config)
            await asyncio.sleep(1.5)  # the first probes pass
            for i in range(rounds):
                order = ["this", "other"] if i % 2 == 0 else ["other", "this"]
                for name, (clients, _) in WORKLOADS.items():
                    n = num_requests if clients > 1 else max(num_requests // 4, 50)
                    for side, sample in (await _round(routers, order, name, n)).items():
                        samples[name][side].append(sample)
    finally:
        for process in [*routers.values(), *upstreams]:
            process.stop()
    return samples


def summary(runs: list[tuple[float, int, float]]) -> dict[str, float]:
    """CPU µs per request over all rounds, and the median round's p50 (ms)."""
    return {"cpu_us": 1e6 * sum(c for c, _, _ in runs) / sum(n for _, n, _ in runs),
            "p50_ms": statistics.median(p for _, _, p in runs)}


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Compare, print and return CPU µs per request and p50 per workload and router."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout (a git worktree)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300, help="per 64-client round")
    parser.add_argument("--tokenizer", default=DEMO_MODEL)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    samples = asyncio.run(_rounds(args.other.resolve(), args.rounds, args.requests,
                                  args.tokenizer))
    results = {name: {side: summary(runs) for side, runs in by_side.items()}
               for name, by_side in samples.items()}
    print(f"{'workload':<12} {'this CPU us':>11} {'other CPU us':>12} {'ratio':>6} "
          f"{'this p50 ms':>11} {'other p50 ms':>12}")
    for name, r in results.items():
        this, other = r["this"], r["other"]
        print(f"{name:<12} {this['cpu_us']:>11.0f} {other['cpu_us']:>12.0f} "
              f"{this['cpu_us'] / other['cpu_us']:>6.2f} {this['p50_ms']:>11.2f} "
              f"{other['p50_ms']:>12.2f}")
    return results


if __name__ == "__main__":
    main()
