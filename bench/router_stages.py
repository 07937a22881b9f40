"""Our router's CPU per request, by stage, at 64 clients (``bench.router_overhead``).

Runs the router under ``bench.stage_profile`` (a sampler charging the main thread's
CPU to the stage on its stack) for the unique, repeated-document and chat scenarios,
and reports each stage's CPU per request in microseconds: its share of the ticks,
times the process's whole CPU per request (``total``, from ``/proc``; the profiling
handler's own small cost is spread over the stages).

``python -m bench.router_stages [--requests N] [--repetitions R] [--tokenizer NAME]``
runs the stage breakdown alone, ``R`` times on one set of instant upstreams (a fresh
router each time), and prints each stage's median: the way to compare a change to
one stage on a noisy machine. It adds ``64c_chat_turn10``: turn 10 alone of as many
conversations as ``64c_chat`` has, other ones, their turns 1-9 sent first and not
measured (``bench.overhead_load.chat_turn10``; the ``64c_chat`` column averages
turns 1-10).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.overhead_load import chat_turn10, drive, prompts
from bench.stage_profile import read_totals
from harness.procs import ManagedProcess, start_process
from radix.model_source import DEMO_MODEL
from router.front.auth import hash_key

STAGE_ORDER = ("parse", "auth", "tokenize", "limits", "match", "choose", "forward", "relay",
               "learn", "metrics", "access log", "http+loop")
WORKLOADS = {"64c_text": "unique", "64c_repeat": "repeat", "64c_chat": "chat"}
TURN10 = {"64c_chat_turn10": "chat_turn10"}
NUM_CLIENTS = 64
MAX_TOKENS = 16
KEY = "bench-key"
UPSTREAM_ARGS = [sys.executable, "-m", "harness.instant_upstream"]
NUM_UPSTREAMS = 4


def router_config(urls: list[str], tokenizer: str) -> str:
    """A router config serving model ``demo`` with ``tokenizer`` from ``urls``, one
    tenant whose key is ``KEY``."""
    lines = ["[models.demo]", f'tokenizer = "{tokenizer}"', "[auth.tenants.bench]",
             f'key_digests = ["{hash_key(KEY)}"]', "[registry]", "poll_interval_s = 1.0"]
    for i, url in enumerate(urls):
        lines += ["[[workers]]", f'id = "u{i}"', 'model = "demo"', f'url = "{url}"']
    return "\n".join(lines) + "\n"


async def start_upstreams(tokenizer: str) -> list[ManagedProcess]:
    """``NUM_UPSTREAMS`` instant stand-in upstreams reporting ``tokenizer``'s digest."""
    return [await asyncio.to_thread(start_process, [*UPSTREAM_ARGS, "--tokenizer", tokenizer])
            for _ in range(NUM_UPSTREAMS)]


def _bodies(workload: str, n: int) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(path, warm-up bodies, measured bodies); ``chat_turn10``: see
    ``bench.overhead_load.chat_turn10``."""
    chat = workload.startswith("chat")
    field = "messages" if chat else "prompt"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if workload == "chat_turn10":
        warmup, measured = chat_turn10(n)
    else:
        measured = prompts(n, workload)
        warmup = measured[:20]
    return path, *([{"model": "demo", field: p, "max_tokens": MAX_TOKENS} for p in ps]
                   for ps in (warmup, measured))


async def stage_breakdown(config: Path, num_requests: int, headers: dict[str, str],
                          totals_path: Path, workloads: dict[str, str] = WORKLOADS
                          ) -> dict[str, dict[str, float]]:
    """Per scenario of ``workloads`` (name -> ``prompts`` workload, or
    ``chat_turn10``), CPU us per request by stage (``STAGE_ORDER``) and ``total``."""
    args = [sys.executable, "-m", "bench.stage_profile", str(totals_path), "router",
            "--config", str(config), "--port", "0", "--log-level", "WARNING"]
    router = await asyncio.to_thread(start_process, args)
    results: dict[str, dict[str, float]] = {}
    try:
        await asyncio.sleep(1.5)  # the first probes pass
        for name, workload in workloads.items():
            path, warmup, bodies = _bodies(workload, num_requests)
            await drive(router.url + path, warmup, headers, min(len(warmup) // 5 + 1, NUM_CLIENTS),
                        False)
            await asyncio.sleep(2 * 0.2)  # a fresh totals file
            before, cpu_before = read_totals(totals_path), router.cpu_s()
            await drive(router.url + path, bodies, headers, NUM_CLIENTS, False)
            cpu = router.cpu_s() - cpu_before
            time.sleep(2 * 0.2)
            after = read_totals(totals_path)
            spent = {s: after.get(s, 0.0) - before.get(s, 0.0) for s in STAGE_ORDER}
            scale = cpu / max(sum(spent.values()), 1e-9)
            results[name] = {s: 1e6 * v * scale / len(bodies) for s, v in spent.items()}
            results[name]["total"] = 1e6 * cpu / len(bodies)
    finally:
        router.stop()
    return results


def stage_table(results: dict[str, dict[str, float]]) -> str:
    """One row per stage, one column per scenario (CPU us per request)."""
    widths = {n: max(12, len(n) + 2) for n in results}
    rows = [f"{'stage':<12}" + "".join(f"{n:>{w}}" for n, w in widths.items())]
    for stage in (*STAGE_ORDER, "total"):
        rows.append(f"{stage:<12}" + "".join(f"{results[n][stage]:>{w}.0f}"
                                             for n, w in widths.items()))
    return "\n".join(rows)


def median_stages(runs: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per scenario and stage, the median over ``runs``."""
    return {name: {stage: statistics.median(run[name][stage] for run in runs)
                   for stage in runs[0][name]} for name in runs[0]}


async def _repeated(num_requests: int, repetitions: int, tokenizer: str
                    ) -> list[dict[str, dict[str, float]]]:
    upstreams = await start_upstreams(tokenizer)
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "router.toml"
            config.write_text(router_config([u.url for u in upstreams], tokenizer))
            for _ in range(repetitions):
                runs.append(await stage_breakdown(
                    config, num_requests, {"Authorization": f"Bearer {KEY}"},
                    Path(tmp) / "stages.json", {**WORKLOADS, **TURN10}))
    finally:
        for process in upstreams:
            process.stop()
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the stage breakdown ``--repetitions`` times; print and return the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per scenario")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tokenizer", default=DEMO_MODEL)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the router runs it
    runs = asyncio.run(_repeated(args.requests, args.repetitions, args.tokenizer))
    medians = median_stages(runs)
    print(f"CPU us per request by stage, median of {args.repetitions} runs, {NUM_CLIENTS} "
          f"clients, tokenizer {args.tokenizer}:")
    print(stage_table(medians))
    print("tokenize per run: " + "; ".join(
        f"{name} " + " ".join(f"{run[name]['tokenize']:.0f}" for run in runs)
        for name in medians))
    return {"tokenizer": args.tokenizer, "repetitions": args.repetitions,
            "median": medians, "runs": runs}


if __name__ == "__main__":
    main()
