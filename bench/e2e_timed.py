"""End to end at cluster scale: timed workers behind our router and the peers.

``python -m bench e2e --backend timed --workers 8 16 [--workloads rag chat ...]``.
K timed workers (``--model timed:<profile>``: the real engine, KV cache, events and
HTTP; the forward pass a wait from ``radix.cost_model``) are started once per size
and every router setup runs in front of the same processes: ours (``cache_aware``,
exact KV events, load pushed on the event stream), ours with ``round_robin``, ours
with its load polled (a setup ending in ``polled``: ``"ours cache_aware polled"``,
``registry.pushed_load = false``), and, when ``bench/.peers`` has them,
sglang-router (default and tuned thresholds) and vllm-router (cache_aware,
consistent_hash). Every run prefixes its prompts with a run tag, so no run finds
another's blocks in a cache (earlier runs' blocks stay until LRU evicts them).

Load: open loop, the trace's arrivals rescaled to ``load`` x the cluster's capacity
(``capacity_rps``), each request sent at its arrival whatever is in flight; and
closed loop, ``--clients-per-worker`` x K clients taking requests in trace order.
Waits run ``--time-scale`` times slower than the profile (so the engines' CPU time
on this machine stays small beside them); every time reported here is divided back.

Time scale and the router's periodic work, in **profile time**: every interval of our
router and workers that does not come from a request is multiplied by the time scale
too (``timed_settings``), so it happens as often per request as in front of real
GPUs: the load poll (``POLL_INTERVAL_S``, 1 profile s), the identity probe of a
worker that pushes its load (``PROBE_INTERVAL_S``, 10), the event stream's deadline
(``READ_TIMEOUT_S``, 15), and on the workers the load push interval
(``PUSH_INTERVAL_S``, 5 ms) and the idle heartbeat (``HEARTBEAT_S``, 5 s). So the
router's CPU over a run is what it would spend in front of real GPUs over the run's
profile time, and nothing is subtracted from it. With ``--idle-s`` the router is
also watched idle in **real time** (``idle_cores``): our router with its default
intervals in front of the same workers, no traffic, for that many seconds (the
workers' heartbeats stay in profile time: a twentieth of their real rate, a few
frames a second at 32 workers in real time).

Phases (``--phases``): each setup sends its tagged trace twice through one router
process, "cold" (no cache holds the tag) and "warm" (the same requests again, right
after); each is reported on its own, as workload ``rag cold`` and ``rag warm``. So
every router meets the same cache state in each phase: none runs on caches another
router's run or a capacity probe warmed (the capacity is computed from the trace).

Per run: TTFT p50/p99 (client side, first streamed text), cached fraction (usage
``cached_tokens`` / ``prompt_tokens``), requests per worker (each worker's metrics)
and max/mean, goodput: requests per second whose TTFT met ``--slo-s``, the mean CPU
of a worker over the run (cores, at this time scale), how late the client sent its
requests (p99, profile seconds: a loaded machine's CPU queueing, which reads as GPU
time in every TTFT), and the router's CPU, from ``/proc`` of its process, the whole
of it: per request and in cores at the profile's real time (``router_cpu``: what it
would need in front of real GPUs at this request rate); for ours, how exactly its index predicted
what each worker served from its cache (``bench.exactness``: exact, over, under and
in_flight counts and the exact fraction, from the router's ``/metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from openai import AsyncOpenAI

from bench import mooncake, peers
from bench.e2e import (
    PHASES,
    WORKER_KEY,
    drive,
    figures,
    requests_served,
    router,
    stream_completion,
    workers,
)
from bench.exactness import describe, exactness, prediction_counts
from bench.workloads import TraceRequest, WorkloadConfig, generate
from harness.procs import http_json, process_cpu_s
from radix.cost_model import Profile, get_profile
from radix.keys import to_key
from radix.tree import PUBLIC, RadixTree

# GPU-sized prompts within an 8k context, letters for tokens (the peers route text).
CONFIG = WorkloadConfig(num_docs=60, doc_tokens=(400, 1600), docs_per_request=(1, 3),
                        system_tokens=(200, 400), message_tokens=(40, 160),
                        output_tokens=(16, 48), num_turns=(2, 6), tool_result_tokens=(80, 400),
                        vocab_size=26)
OUR_SETUPS = ("ours cache_aware", "ours round_robin")
# Our router's and workers' periodic work, in profile seconds (their defaults in real
# time), multiplied by the time scale in a run (module docstring).
POLL_INTERVAL_S = 1.0
PROBE_INTERVAL_S = 10.0
READ_TIMEOUT_S = 15.0
PUSH_INTERVAL_S = 0.005
HEARTBEAT_S = 5.0
POLLED = "polled"
# Seconds an idle router is left to connect its streams and probe before it is watched.
IDLE_SETTLE_S = 5.0
DECODE_BATCH = 16
TAG_TOKENS = 4
Outcome = tuple[int, int, float | None, int, str | None]


def capacity_rps(requests: list[TraceRequest], profile: Profile) -> float:
    """Requests per second one worker sustains on this trace: the inverse of the mean
    service time, a request's prefill of what a single worker that had seen the whole
    trace before would not hold, plus its output tokens at a share of a decode step of
    ``DECODE_BATCH`` sequences."""
    tree: RadixTree[None] = RadixTree()
    service_s = []
    for r in requests:
        cached = min(tree.match(r.prompt, PUBLIC).num_matched_tokens, r.num_prompt_tokens - 1)
        tree.insert(r.prompt + r.output, PUBLIC)
        context = r.num_prompt_tokens + r.num_output_tokens // 2
        step_s = profile.cost.decode_step_s(DECODE_BATCH, DECODE_BATCH * context)
        service_s.append(profile.cost.prefill_chunk_s(r.num_prompt_tokens - cached, r.num_prompt_tokens)
                         + r.num_output_tokens * step_s / DECODE_BATCH)
    return 1.0 / float(np.mean(service_s))


def at_load(requests: list[TraceRequest], rps: float) -> list[float]:
    """Arrival times (profile seconds) of the trace rescaled to ``rps`` on average."""
    arrivals = np.array([r.arrival_s for r in requests]) - requests[0].arrival_s
    return (arrivals * (len(requests) / max(arrivals[-1], 1e-9)) / rps).tolist()


async def drive_open(url: str, key: str, requests: list[TraceRequest], arrivals_s: list[float],
                     models: Sequence[str] | None = None,
                     late_s: list[float] | None = None) -> list[Outcome]:
    """Send each request at its arrival (wall seconds from now), all concurrently, to
    the model ``models`` names for it (``demo`` for all without); appends to ``late_s``
    (when given) how late each was sent (the client's own CPU queueing)."""
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=600)
    start = time.perf_counter()

    async def one(request: TraceRequest, arrival_s: float, model: str) -> Outcome:
        await asyncio.sleep(max(0.0, start + arrival_s - time.perf_counter()))
        if late_s is not None:
            late_s.append(time.perf_counter() - start - arrival_s)
        return await stream_completion(client, request, model)

    try:
        return await asyncio.gather(*(one(r, a, m) for r, a, m in zip(
            requests, arrivals_s, models or ["demo"] * len(requests), strict=True)))
    finally:
        await client.close()


def summarize(outcomes: list[Outcome], per_worker: list[int], wall_s: float, scale: float,
              slo_s: float) -> dict[str, object]:
    """One run's figures, in profile seconds."""
    ok = [o for o in outcomes if o[4] is None and o[2] is not None]
    ttft = np.array([o[2] / scale for o in ok]) if ok else np.array([np.nan])
    goodput_rps = float((ttft <= slo_s).sum()) / (wall_s / scale)
    return figures(outcomes, ok, ttft, ("goodput_rps", goodput_rps), per_worker, wall_s)


def run_cell(setup: str, started: list, requests: list[TraceRequest], load: str, rps: float,
             args: argparse.Namespace, log_dir: Path, phases: Sequence[str] = ("cold",)
             ) -> dict[str, dict[str, object]]:
    """One router setup on the started workers, at one load ("closed" or a fraction),
    for each of ``phases`` in one router process: "cold" sends the trace, "warm"
    the same trace again (the workers then hold what the first pass left, and the
    router knows what it learned or routed then), each phase measured on its own."""
    urls = [w.url for w in started]
    by_phase: dict[str, dict[str, object]] = {}
    base, settings = timed_settings(setup, args.time_scale)
    with router(base, urls, log_dir, settings=settings) as running:
        url, key, pid, metrics_url = running
        for phase in phases:
            before = [requests_served(w) for w in started]
            cpu_before = [w.cpu_s() for w in started]
            checked_before = prediction_counts(metrics_url) if metrics_url else {}
            router_cpu_before = process_cpu_s(pid)
            start, late_s = time.perf_counter(), [0.0]
            if load == "closed":
                outcomes = asyncio.run(drive(url, key, requests,
                                             args.clients_per_worker * len(urls), setup))
            else:
                arrivals = [a * args.time_scale for a in at_load(requests, float(load) * rps)]
                outcomes = asyncio.run(drive_open(url, key, requests, arrivals, late_s=late_s))
            wall_s = time.perf_counter() - start
            per_worker = [requests_served(w) - b for w, b in zip(started, before, strict=True)]
            cpu_s = [w.cpu_s() - b for w, b in zip(started, cpu_before, strict=True)]
            router_cpu_s = process_cpu_s(pid) - router_cpu_before
            by_phase[phase] = {
                **summarize(outcomes, per_worker, wall_s, args.time_scale, args.slo_s),
                "worker_cpu_cores": float(np.mean(cpu_s)) / wall_s,
                "send_late_p99_s": float(np.percentile(late_s, 99)) / args.time_scale,
                **router_cpu(router_cpu_s, len(outcomes), wall_s, args.time_scale)}
            if metrics_url:
                by_phase[phase].update(exactness(checked_before, prediction_counts(metrics_url)))
    return by_phase


def router_cpu(cpu_s: float, num_requests: int, wall_s: float, time_scale: float
               ) -> dict[str, float]:
    """The router's whole CPU over a run of ``num_requests`` in ``wall_s``, its polls,
    probes and pushes included (in profile time, as often per request as in real
    time): CPU per request, and the cores it would need in real time, where the run
    takes ``wall_s / time_scale``."""
    return {"router_cpu_ms_per_request": 1e3 * cpu_s / max(num_requests, 1),
            "router_cpu_cores_real_time": cpu_s * time_scale / wall_s}


def timed_settings(setup: str, time_scale: float, real_time: bool = False
                   ) -> tuple[str, dict[str, dict[str, float | bool]]]:
    """``setup`` without a trailing ``polled``, and our router's settings for it: load
    pushed (or polled for a ``polled`` setup), the poll and probe intervals in profile
    time (``real_time``: at their defaults), the event stream's deadline in profile
    time either way (the workers' heartbeat is)."""
    words = setup.split()
    pushed = words[-1] != POLLED
    scale = 1.0 if real_time else time_scale
    return " ".join(words if pushed else words[:-1]), {
        "registry": {"poll_interval_s": POLL_INTERVAL_S * scale,
                     "probe_interval_s": PROBE_INTERVAL_S * scale, "pushed_load": pushed},
        "kv_events": {"read_timeout_s": READ_TIMEOUT_S * time_scale}}


def idle_cores(setup: str, started: list, log_dir: Path, time_scale: float,
               idle_s: float) -> float:
    """Cores our router of ``setup`` burns in front of ``started`` with no traffic, in
    real time (its intervals at their defaults), watched for ``idle_s`` after
    ``IDLE_SETTLE_S``."""
    base, settings = timed_settings(setup, time_scale, real_time=True)
    with router(base, [w.url for w in started], log_dir, settings=settings) as running:
        time.sleep(IDLE_SETTLE_S)
        before = process_cpu_s(running.pid)
        time.sleep(idle_s)
        return (process_cpu_s(running.pid) - before) / idle_s


def worker_flags(profile: Profile, args: argparse.Namespace, tmp: Path) -> tuple[str, ...]:
    """The timed workers' flags: the profile at the time scale, and their load push
    interval and heartbeat in profile time (a config file in ``tmp``)."""
    config = tmp / "worker.toml"
    config.write_text(f"[server]\nkv_events_heartbeat_s = {HEARTBEAT_S * args.time_scale}\n")
    return ("--model", f"timed:{profile.name}", "--served-model-name", "demo", "--time-scale",
            str(args.time_scale), "--max-batched-tokens", str(args.max_batched_tokens),
            "--load-push-interval-s", str(PUSH_INTERVAL_S * args.time_scale),
            "--config", str(config))


def tagged(requests: list[TraceRequest], run: int) -> list[TraceRequest]:
    """``requests`` with run ``run``'s tag (four letters) before every prompt."""
    tag = to_key([run // 26**i % 26 for i in range(TAG_TOKENS)])
    return [replace(r, prompt=tag + r.prompt) for r in requests]


def warm_up(started: list) -> None:
    """One short completion on each worker, so no router meets a cold process (its
    first request pays lazy imports and first-time allocations)."""
    for worker in started:
        status, body = http_json("POST", f"{worker.url}/v1/completions",
                                 {"model": "demo", "prompt": "warm up", "max_tokens": 2},
                                 {"Authorization": f"Bearer {WORKER_KEY}"})
        if status != 200:
            raise RuntimeError(f"warm-up on {worker.url} answered {status}: {body}")


def _workload(name: str, args: argparse.Namespace, profile: Profile) -> list[TraceRequest]:
    """The requests of workload ``name``, or of ``--trace`` (its first ``--requests``)."""
    if name != "trace":
        return list(generate(name, args.requests, 1.0, args.seed, config=CONFIG))
    max_output = CONFIG.output_tokens[1]
    room = profile.max_model_len - max_output - TAG_TOKENS - 1  # and the tokenizer's BOS
    return mooncake.as_requests(mooncake.read(args.trace)[: args.requests], CONFIG.vocab_size,
                                room, max_output, args.seed)


def _setups(args: argparse.Namespace) -> list[str]:
    found = peers.available()
    return [s for s in args.routers if s.startswith("ours ") or found[peers.PEER_SETUPS[s].module]]


def _row(key: str, r: dict) -> str:
    return (f"{key:<44}{r['num_errors']:>5}{r['cached_fraction']:>8.1%}{1e3 * r['ttft_p50_s']:>8.0f}"
            f"{1e3 * r['ttft_p99_s']:>8.0f}{r['goodput_rps']:>9.1f}{r['max_over_mean_load']:>9.2f}"
            f"{r['wall_s']:>7.0f}{r['worker_cpu_cores']:>7.3f}{r['router_cpu_cores_real_time']:>7.2f}"
            f"{r['router_cpu_ms_per_request']:>7.2f}{1e3 * r['send_late_p99_s']:>8.1f}  {describe(r)}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="timed", choices=["timed"])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--workloads", nargs="+", default=["rag", "chat", "agent", "multitenant"])
    parser.add_argument("--trace", type=Path,
                        help="a Mooncake-format trace to replay instead (its timestamps as "
                             "arrivals; prompts cut to fit the profile's context)")
    parser.add_argument("--loads", nargs="+", default=["0.5", "0.8", "0.95", "closed"])
    parser.add_argument("--routers", nargs="+", default=[*OUR_SETUPS, *peers.PEER_SETUPS],
                        help='setups: the peers\' names, or "ours POLICY [WEIGHT=VALUE ...] '
                             '[polled]"')
    parser.add_argument("--requests", type=int, default=300, help="per run")
    parser.add_argument("--clients-per-worker", type=int, default=4, help="closed loop")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--slo-s", type=float, default=0.25, help="TTFT SLO (profile seconds)")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES),
                        help="cold: the trace on caches that never saw it; warm: the same "
                             "trace again, right after, in the same router process")
    parser.add_argument("--idle-s", type=float, default=0.0,
                        help="also watch each of our setups idle this long, in real time")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Every router setup at every load on every workload and size; prints a table and
    returns the numbers by ``workload/workers/load/router`` (and ``idle/WORKERS/SETUP``)."""
    args = _parser().parse_args(argv)
    profile = get_profile(args.profile)
    setups = _setups(args)
    results: dict[str, object] = {"profile": profile.name, "time_scale": args.time_scale,
                                  "slo_s": args.slo_s, "setups": setups, "runs": {}}
    print(f"{'workload/workers/load/router':<44}{'errs':>5}{'cached':>8}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'goodput':>9}{'max/mean':>9}{'wall s':>7}{'w cpu':>7}{'r cpu':>7}{'r ms':>7}{'late ms':>8}"
          "  predicted exact/over/under/in_flight")
    run = 0
    for num_workers in args.workers:
        with tempfile.TemporaryDirectory(prefix="e2e-timed-") as tmp, \
                workers(num_workers, "1GiB", *worker_flags(profile, args, Path(tmp)),
                        ready_timeout_s=60 + 10 * num_workers) as started:
            warm_up(started)
            _watch_idle(started, setups, args, Path(tmp), results)
            for workload in (["trace"] if args.trace else args.workloads):
                trace = _workload(workload, args, profile)
                rps = capacity_rps(trace, profile) * num_workers
                results[f"{workload}/{num_workers}/capacity_rps"] = rps
                for load in args.loads:
                    for setup in setups:
                        run += 1
                        by_phase = run_cell(setup, started, tagged(trace, run), load, rps,
                                            args, Path(tmp), args.phases)
                        for phase, r in by_phase.items():
                            key = f"{workload} {phase}/{num_workers}/{load}/{setup}"
                            results["runs"][key] = r  # type: ignore[index]
                            print(_row(key, r), flush=True)
    return results


def _watch_idle(started: list, setups: Sequence[str], args: argparse.Namespace, tmp: Path,
                results: dict[str, object]) -> None:
    """With ``--idle-s``, each of our setups idle in front of ``started`` (``idle_cores``),
    printed and recorded as ``idle/WORKERS/SETUP``."""
    if args.idle_s <= 0:
        return
    for setup in (s for s in setups if s.startswith("ours ")):
        cores = idle_cores(setup, started, tmp, args.time_scale, args.idle_s)
        results[f"idle/{len(started)}/{setup}"] = cores
        print(f"idle/{len(started)}/{setup}: {cores:.4f} cores in real time over "
              f"{args.idle_s:g} s", flush=True)


if __name__ == "__main__":
    main()
