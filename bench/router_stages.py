"""Our router's CPU per request, by stage, at 64 clients (``bench.router_overhead``).

Runs the router under ``bench.stage_profile`` (a sampler charging the main thread's
CPU to the stage on its stack) for the unique, repeated-document and chat scenarios,
and reports each stage's CPU per request in microseconds: its share of the ticks,
times the process's whole CPU per request (``total``, from ``/proc``; the profiling
handler's own small cost is spread over the stages).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench.overhead_load import drive, prompts
from bench.stage_profile import read_totals
from harness.procs import start_process

STAGE_ORDER = ("parse", "auth", "tokenize", "limits", "match", "choose", "forward", "relay",
               "learn", "metrics", "access log", "http+loop")
WORKLOADS = {"64c_text": "unique", "64c_repeat": "repeat", "64c_chat": "chat"}
NUM_CLIENTS = 64
MAX_TOKENS = 16


def _bodies(workload: str, n: int) -> tuple[str, list[dict[str, Any]]]:
    field = "messages" if workload == "chat" else "prompt"
    path = "/v1/chat/completions" if workload == "chat" else "/v1/completions"
    return path, [{"model": "demo", field: p, "max_tokens": MAX_TOKENS}
                  for p in prompts(n, workload)]


async def stage_breakdown(config: Path, num_requests: int, headers: dict[str, str],
                          totals_path: Path) -> dict[str, dict[str, float]]:
    """Per scenario, CPU us per request by stage (``STAGE_ORDER``) and ``total``."""
    args = [sys.executable, "-m", "bench.stage_profile", str(totals_path), "router",
            "--config", str(config), "--port", "0", "--log-level", "WARNING"]
    router = await asyncio.to_thread(start_process, args)
    results: dict[str, dict[str, float]] = {}
    try:
        await asyncio.sleep(1.5)  # the first probes pass
        for name, workload in WORKLOADS.items():
            path, bodies = _bodies(workload, num_requests)
            await drive(router.url + path, bodies[:20], headers, 4, False)
            await asyncio.sleep(2 * 0.2)  # a fresh totals file
            before, cpu_before = read_totals(totals_path), router.cpu_s()
            await drive(router.url + path, bodies, headers, NUM_CLIENTS, False)
            cpu = router.cpu_s() - cpu_before
            time.sleep(2 * 0.2)
            after = read_totals(totals_path)
            spent = {s: after.get(s, 0.0) - before.get(s, 0.0) for s in STAGE_ORDER}
            scale = cpu / max(sum(spent.values()), 1e-9)
            results[name] = {s: 1e6 * v * scale / num_requests for s, v in spent.items()}
            results[name]["total"] = 1e6 * cpu / num_requests
    finally:
        router.stop()
    return results


def stage_table(results: dict[str, dict[str, float]]) -> str:
    """One row per stage, one column per scenario (CPU us per request)."""
    names = list(results)
    rows = [f"{'stage':<12}" + "".join(f"{n:>12}" for n in names)]
    for stage in (*STAGE_ORDER, "total"):
        rows.append(f"{stage:<12}" + "".join(f"{results[n][stage]:>12.0f}" for n in names))
    return "\n".join(rows)
