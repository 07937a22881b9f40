"""LoRA adapters at cluster scale: how often each router makes workers load an adapter.

``python -m bench lora [--workers 8] [--adapters 64] [--max-loras 8] [--requests 400]``.
K timed workers (``bench.e2e_timed``'s: the real engine, KV cache, events and HTTP,
the forward pass and each adapter load a modelled wait) each register every one of
``--adapters`` config-only adapters and hold ``--max-loras`` of them at once. Every
request names an adapter drawn with Zipf popularity (exponent ``--zipf``); its prompt
is that adapter's system prompt and a message of its own, so prefixes are shared
within an adapter and never across adapters (each adapter is its own namespace).

Router setups, in front of the same workers: ours (``cache_aware``: residency and
cached prefixes in one cost; ``adapter_load_cost_per_ms`` divided by the time scale,
since the workers measure their loads in slowed-down milliseconds), ours
adapter-blind (the same policy with ``adapter_load_cost_per_ms`` and
``adapter_swap_cost`` 0), and, when ``bench/.peers`` has them, sglang-router
and vllm-router (cache_aware; both adapter-blind, sending the adapter name through).
Load: open loop at ``--load`` x the cluster's capacity (``e2e_timed.capacity_rps``),
times ``--time-scale`` slower than the profile; every time reported is divided back.
Each setup first routes ``--warm-up`` of the requests unmeasured, plus one short
request for each adapter first named later, so it is measured from the residency its
own routing settles on (not the previous setup's), and no adapter's first load, which
any router pays, counts.

Per setup: adapter loads per 1,000 requests (the workers' ``worker_lora_loads_total``
over the measured requests), cached fraction, TTFT p50/p99, errors, wall seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench import peers
from bench.e2e import router, worker_counter, workers
from bench.e2e_timed import (
    POLL_INTERVAL_S,
    at_load,
    capacity_rps,
    drive_open,
    summarize,
    tagged,
    warm_up,
)
from bench.workloads import TraceRequest
from harness.lora_adapters import lora_module_flags, write_config_adapters
from harness.procs import ManagedProcess
from radix.cost_model import get_profile
from radix.keys import TOKEN_BYTES, to_key
from router.routing.load_cost import PolicyWeights

OURS, BLIND = "ours", "ours adapter-blind"
PEER_SETUPS = ("sglang cache_aware default", "vllm cache_aware")
LOADS_METRIC = "worker_lora_loads_total"
TOUCH_TOKENS = 200  # the shortest system prompt


def lora_trace(num_requests: int, num_adapters: int, zipf: float, seed: int
               ) -> tuple[list[TraceRequest], list[str]]:
    """Requests and the adapter each names: Poisson arrivals (rescaled later), an
    adapter by Zipf popularity, its system prompt (200-500 tokens) then a message of
    40-160 tokens; 16-48 output tokens; letters for tokens."""
    rng = np.random.default_rng(seed)
    names = [adapter_name(i) for i in range(num_adapters)]
    popularity = 1.0 / np.arange(1, num_adapters + 1) ** zipf
    systems = [rng.integers(0, 26, rng.integers(200, 500)).tolist() for _ in names]
    chosen = rng.choice(num_adapters, size=num_requests, p=popularity / popularity.sum())
    arrivals = np.cumsum(rng.exponential(1.0, num_requests))
    requests = [
        TraceRequest(float(arrival), "bench", f"s{i}",
                     to_key(systems[a] + rng.integers(0, 26, rng.integers(40, 160)).tolist()),
                     to_key(rng.integers(0, 26, rng.integers(16, 48)).tolist()))
        for i, (a, arrival) in enumerate(zip(chosen, arrivals, strict=True))
    ]
    return requests, [names[a] for a in chosen]


def warm_up_part(requests: list[TraceRequest], models: list[str], num_warm: int
                 ) -> tuple[list[TraceRequest], list[str]]:
    """The unmeasured start of a run: the first ``num_warm`` requests, then one short
    request (the first ``TOUCH_TOKENS`` of its prompt: system prompt only, and
    ``TOUCH_TOKENS`` output tokens) for each adapter the measured part names first, so
    the measured loads are the ones routing causes, not each adapter's first load."""
    warm, warm_models = list(requests[:num_warm]), list(models[:num_warm])
    gap_s = (warm[-1].arrival_s - warm[0].arrival_s) / max(len(warm) - 1, 1)
    for request, model in zip(requests[num_warm:], models[num_warm:], strict=True):
        if model not in warm_models:
            warm.append(replace(request, arrival_s=warm[-1].arrival_s + gap_s,
                                prompt=request.prompt[:TOUCH_TOKENS * TOKEN_BYTES],
                                output=request.output[:TOUCH_TOKENS * TOKEN_BYTES]))
            warm_models.append(model)
    return warm, warm_models


def adapter_name(i: int) -> str:
    """The ``i``-th adapter's name (most popular first), as ``write_config_adapters``
    names it."""
    return f"lora-{i}"


def adapter_loads(started: list[ManagedProcess]) -> float:
    """Adapter loads over all workers so far."""
    return sum(worker_counter(w, LOADS_METRIC) for w in started)


def run_setup(setup: str, started: list[ManagedProcess], requests: list[TraceRequest],
              models: list[str], rps: float, args: argparse.Namespace, log_dir: Path) -> dict:
    """One router setup: the warm-up part (``warm_up_part``) unmeasured, then the rest
    measured, each at ``--load``."""
    num_warm = int(len(requests) * args.warm_up)
    warm, warm_models = warm_up_part(requests, models, num_warm)

    def arrivals(part: list[TraceRequest]) -> list[float]:
        return [a * args.time_scale for a in at_load(part, args.load * rps)]

    with router(setup, [w.url for w in started], log_dir,
                POLL_INTERVAL_S / args.time_scale) as (url, key, _, _):
        asyncio.run(drive_open(url, key, warm, arrivals(warm), warm_models))
        loads_before = adapter_loads(started)
        served_before = [worker_counter(w, "request_prompt_tokens_count") for w in started]
        start = time.perf_counter()
        outcomes = asyncio.run(drive_open(url, key, requests[num_warm:], arrivals(requests[num_warm:]),
                                          models[num_warm:]))
        wall_s = time.perf_counter() - start
        loads = adapter_loads(started) - loads_before
        per_worker = [int(worker_counter(w, "request_prompt_tokens_count") - b)
                      for w, b in zip(started, served_before, strict=True)]
    summary = summarize(outcomes, per_worker, wall_s, args.time_scale, args.slo_s)
    return {**summary, "adapter_loads": loads, "loads_per_1k": 1000.0 * loads / len(outcomes)}


def row(label: str, r: dict) -> str:
    """One table row."""
    return (f"{label:<28}{r['num_errors']:>5}{r['loads_per_1k']:>10.0f}{r['cached_fraction']:>8.1%}"
            f"{1e3 * r['ttft_p50_s']:>8.0f}{1e3 * r['ttft_p99_s']:>8.0f}{r['max_over_mean_load']:>9.2f}"
            f"{r['wall_s']:>7.0f}")


def markdown_table(results: dict) -> list[str]:
    """The run's table in Markdown, with its setup, for reports and docs."""
    lines = [f"{results['workers']} timed workers ({results['profile']}), {results['adapters']} adapters "
             f"(Zipf {results['zipf']}), --max-loras {results['max_loras']}, load {results['load']}.", "",
             "| router | errors | adapter loads / 1k | cached | TTFT p50 ms | TTFT p99 ms | max/mean |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {label} | {r['num_errors']} | {r['loads_per_1k']:.0f} | {r['cached_fraction']:.1%} | "
              f"{1e3 * r['ttft_p50_s']:.0f} | {1e3 * r['ttft_p99_s']:.0f} | {r['max_over_mean_load']:.2f} |"
              for label, r in results["runs"].items()]
    return lines


HEADER = (f"{'router':<28}{'errs':>5}{'loads/1k':>10}{'cached':>8}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'max/mean':>9}{'wall s':>7}")


def setups(routers: list[str], time_scale: float) -> dict[str, str]:
    """``bench.e2e.router`` setups by label: ours and ours adapter-blind as asked, any
    other ``ours <policy> [weight=value ...]`` as written, and the asked peers that
    are installed."""
    per_ms = PolicyWeights().adapter_load_cost_per_ms / time_scale
    ours = {OURS: f"ours cache_aware adapter_load_cost_per_ms={per_ms}",
            BLIND: "ours cache_aware adapter_load_cost_per_ms=0 adapter_swap_cost=0"}
    found = peers.available()
    return {label: ours.get(label, label) for label in routers
            if label in ours or label.startswith("ours ") or found[peers.PEER_SETUPS[label].module]}


def main(argv: list[str] | None = None) -> dict:
    """Every setup on the same timed workers; prints the table and returns the numbers
    by setup label."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=64)
    parser.add_argument("--max-loras", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    parser.add_argument("--requests", type=int, default=400, help="per setup, warm-up included")
    parser.add_argument("--warm-up", type=float, default=0.25, help="share of the requests not measured")
    parser.add_argument("--load", type=float, default=0.7, help="fraction of the cluster's capacity")
    parser.add_argument("--routers", nargs="+", default=[OURS, BLIND, *PEER_SETUPS])
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--slo-s", type=float, default=0.25, help="TTFT SLO (profile seconds)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    requests, models = lora_trace(args.requests, args.adapters, args.zipf, args.seed)
    rps = capacity_rps(requests, profile) * args.workers
    results: dict = {"profile": profile.name, "time_scale": args.time_scale, "capacity_rps": rps,
                     "workers": args.workers, "adapters": args.adapters, "max_loras": args.max_loras,
                     "zipf": args.zipf, "load": args.load, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        flags = ("--model", f"timed:{profile.name}", "--served-model-name", "demo",
                 "--time-scale", str(args.time_scale),
                 *lora_module_flags(write_config_adapters(Path(tmp) / "adapters", args.adapters)),
                 "--max-loras", str(args.max_loras))
        with workers(args.workers, "1GiB", *flags, ready_timeout_s=60 + 10 * args.workers) as started:
            warm_up(started)
            print(HEADER)
            for run, (label, setup) in enumerate(setups(args.routers, args.time_scale).items(), 1):
                r = results["runs"][label] = run_setup(setup, started, tagged(requests, run), models,
                                                       rps, args, Path(tmp))
                print(row(label, r), flush=True)
    return results


if __name__ == "__main__":
    main()
