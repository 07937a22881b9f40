"""Prefill/decode disaggregation against the same workers aggregated (docs/pd.md).

``python -m bench pd [--profile llama3-8b-h100] [--workloads rag agent] [--load 0.8]``.
Two fleets of timed workers (``--model timed:<profile>``: the real engine, KV cache,
events, HTTP and KV transfer; the forward pass a wait from ``radix.cost_model``, and
a pulled block the wait of the profile's real block on its 400 Gb/s link), each
behind our router (``cache_aware``): 4 aggregated workers, and 2 prefill + 2 decode
workers (``[pd] min_uncached_tokens`` 256); ``--fleets`` adds 3 prefill + 1 decode. Each run sends a fresh tagged trace
(nothing cached) in open loop at ``--load`` x the aggregated fleet's capacity
(``bench.e2e_timed.capacity_rps``), streamed, and reports in profile seconds: TTFT
and TPOT (time per output token after the first) p50/p99, goodput (requests per
second that met both ``--ttft-slo-s`` and ``--tpot-slo-s``), the cached fraction,
the blocks the decode workers pulled and how the router ran the requests.

vllm-router runs too, when ``bench/.peers`` has it, in its PD mode in front of the same
kind of 2 + 2 workers: it speaks vLLM's ``kv_transfer_params`` protocol, which our
workers take on ``/v1/completions``. sglang-router's PD mode speaks SGLang's
bootstrap protocol, which our workers do not (docs/pd.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from openai import AsyncOpenAI

from bench.e2e import TENANT_KEY, WORKER_KEY, prompt_text, worker_counter
from bench.e2e_timed import CONFIG, at_load, capacity_rps, tagged, warm_up
from bench.peers import PEERS_PYTHON, PeerSetup, available, launch
from bench.workloads import TraceRequest, generate
from harness.procs import (
    ManagedProcess,
    http_json,
    router_args,
    start_process,
    start_worker,
    wait_routable,
)
from radix.cost_model import get_profile
from router.front.auth import hash_key
from router.up.launcher import free_port

PD_ROLES = ("prefill", "prefill", "decode", "decode")
FLEETS = {"ours aggregated 4": ("both",) * 4, "ours pd 2+2": PD_ROLES,
          "vllm-router pd 2+2": PD_ROLES, "ours pd 3+1": ("prefill",) * 3 + ("decode",)}
DEFAULT_FLEETS = ("ours aggregated 4", "ours pd 2+2", "vllm-router pd 2+2")
ROLE_FLAGS = {"both": (), "prefill": ("--kv-transfer-config", '{"kv_role": "kv_producer"}'),
              "decode": ("--kv-transfer-config", '{"kv_role": "kv_consumer"}')}
MIN_UNCACHED_TOKENS = 256
POLL_INTERVAL_S = 1.0  # profile seconds, as bench.e2e_timed
READY_TIMEOUT_S = 120.0


@contextlib.contextmanager
def fleet(name: str, roles: tuple[str, ...], flags: tuple[str, ...], poll_interval_s: float,
          log_dir: Path) -> Iterator[tuple[str, ManagedProcess | None, list[ManagedProcess]]]:
    """Timed workers in ``roles`` behind the router ``name`` says (ours, or vllm-router
    in its PD mode); (router URL, our router process or None, workers)."""
    peer = name.startswith("vllm-router")
    started = [start_worker(*flags, *ROLE_FLAGS[role], kv_cache_bytes="1GiB", wait=False,
                            api_key=None if peer else WORKER_KEY) for role in roles]
    router = None
    try:
        for worker in started:
            worker.wait_ready(READY_TIMEOUT_S)
        if peer:
            with vllm_router_pd(started, roles, log_dir) as url:
                yield url, None, started
            return
        lines = ["[models.demo]", 'tokenizer = "demo"', "[registry]",
                 f"poll_interval_s = {poll_interval_s}", "[pd]",
                 f"min_uncached_tokens = {MIN_UNCACHED_TOKENS}", "[auth.tenants.bench]",
                 f'key_digests = ["{hash_key(TENANT_KEY)}"]']
        for i, (worker, role) in enumerate(zip(started, roles, strict=True)):
            lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'url = "{worker.url}"',
                      'api_key_env = "RADIX_WORKER_KEY_E2E"', f'role = "{role}"']
        path = log_dir / "router.toml"
        path.write_text("\n".join(lines) + "\n")
        router = start_process(router_args(path), {"RADIX_WORKER_KEY_E2E": WORKER_KEY})
        wait_routable(router, len(started), READY_TIMEOUT_S)
        yield router.url, router, started
    finally:
        if router is not None:
            router.stop()
        for worker in started:
            worker.stop()


@contextlib.contextmanager
def vllm_router_pd(started: list[ManagedProcess], roles: tuple[str, ...],
                   log_dir: Path) -> Iterator[str]:
    """vllm-router in its PD mode (``--vllm-pd-disaggregation``, vLLM's
    ``kv_transfer_params`` protocol, cache_aware for both pools) in front of the
    workers; its URL. The workers run keyless: in PD mode vllm-router sends no key."""
    setup = PeerSetup("vllm_router", "cache_aware")
    args = [str(PEERS_PYTHON), "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port := free_port()), "--vllm-pd-disaggregation",
            "--policy", setup.policy, "--prometheus-port", str(free_port()),
            "--prometheus-host", "127.0.0.1", "--log-level", "warning"]
    for worker, role in zip(started, roles, strict=True):
        args += ["--prefill" if role == "prefill" else "--decode", worker.url]
    peer = launch(args, port, TENANT_KEY, "demo", log_dir / "vllm-router-pd.log",
                  READY_TIMEOUT_S, "vllm-router PD mode")
    try:
        yield peer.url
    finally:
        peer.stop()


async def timed_stream(client: AsyncOpenAI, request: TraceRequest, start: float,
                       arrival_s: float) -> tuple[float | None, float | None, int, int, str | None]:
    """One streamed request sent at ``arrival_s``: (TTFT, TPOT, prompt tokens, cached
    tokens, error)."""
    await asyncio.sleep(max(0.0, start + arrival_s - time.perf_counter()))
    sent = time.perf_counter()
    first = last = None
    usage = None
    try:
        stream = await client.completions.create(
            model="demo", prompt=prompt_text(request), max_tokens=request.num_output_tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices:
                last = time.perf_counter()
                first = first or last
            usage = chunk.usage or usage
    except Exception as exc:  # counted and reported; the run goes on
        return None, None, request.num_prompt_tokens, 0, f"{type(exc).__name__}: {exc}"
    if first is None or usage is None:
        return None, None, request.num_prompt_tokens, 0, "no tokens or no usage"
    num_out = usage.completion_tokens
    tpot = (last - first) / (num_out - 1) if num_out > 1 else None
    cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
    return first - sent, tpot, usage.prompt_tokens, cached, None


def router_modes(router: ManagedProcess | None) -> dict[str, int]:
    """``router_pd_requests_total`` by mode, from our router's metrics listener (empty
    for a peer)."""
    if router is None:
        return {}
    _, text = http_json("GET", f"{router.metrics_url}/metrics")
    modes = {}
    for line in str(text).splitlines():
        if line.startswith("router_pd_requests_total{"):
            mode = line.split('mode="', 1)[1].split('"', 1)[0]
            modes[mode] = int(float(line.rsplit(" ", 1)[1]))
    return modes


def run(name: str, roles: tuple[str, ...], requests: list[TraceRequest], rps: float,
        args: argparse.Namespace, flags: tuple[str, ...], log_dir: Path) -> dict[str, object]:
    """One fleet, one workload: the figures in profile seconds."""
    scale = args.time_scale
    with fleet(name, roles, flags, POLL_INTERVAL_S / scale, log_dir) as (url, router, started):
        warm_up(started)
        received_before = sum(worker_counter(w, "kv_transfer_blocks_received_total")
                              for w, r in zip(started, roles, strict=True) if r == "decode")
        arrivals = [a * scale for a in at_load(requests, rps)]

        async def drive() -> list:
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TENANT_KEY, max_retries=0,
                                 timeout=600)
            start = time.perf_counter()
            try:
                return await asyncio.gather(*(timed_stream(client, r, start, a)
                                              for r, a in zip(requests, arrivals, strict=True)))
            finally:
                await client.close()

        started_at = time.perf_counter()
        outcomes = asyncio.run(drive())
        wall_s = time.perf_counter() - started_at
        received = sum(worker_counter(w, "kv_transfer_blocks_received_total")
                       for w, r in zip(started, roles, strict=True) if r == "decode")
        modes = router_modes(router)
    ok = [o for o in outcomes if o[4] is None]
    ttft = np.array([o[0] / scale for o in ok]) if ok else np.array([np.nan])
    tpot = np.array([o[1] / scale for o in ok if o[1] is not None]) if ok else np.array([np.nan])
    good = sum(1 for o in ok if o[0] / scale <= args.ttft_slo_s
               and (o[1] is None or o[1] / scale <= args.tpot_slo_s))
    return {"num_requests": len(outcomes), "num_errors": len(outcomes) - len(ok),
            "first_error": next((o[4] for o in outcomes if o[4]), None),
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "tpot_p50_s": float(np.percentile(tpot, 50)), "tpot_p99_s": float(np.percentile(tpot, 99)),
            "goodput_rps": good / (wall_s / scale),
            "cached_fraction": sum(o[3] for o in ok) / max(sum(o[2] for o in ok), 1),
            "blocks_pulled": int(received - received_before), "modes": modes}


def main(argv: list[str] | None = None) -> dict:
    """Both fleets on each workload; prints a table and returns the numbers by
    ``workload/fleet``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--workloads", nargs="+", default=["rag", "agent"])
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--requests", type=int, default=150, help="per run")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--ttft-slo-s", type=float, default=1.0, help="profile seconds")
    parser.add_argument("--tpot-slo-s", type=float, default=0.05, help="profile seconds")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fleets", nargs="+", choices=list(FLEETS), default=list(DEFAULT_FLEETS))
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    fleets = [n for n in args.fleets if not n.startswith("vllm-router")
              or available()["vllm_router"]]
    flags = ("--model", f"timed:{profile.name}", "--served-model-name", "demo", "--time-scale",
             str(args.time_scale), "--max-batched-tokens", str(args.max_batched_tokens))
    results: dict[str, object] = {"profile": profile.name, "load": args.load,
                                  "time_scale": args.time_scale, "runs": {}}
    print(f"{'workload/fleet':<30}{'errs':>5}{'TTFT p50':>9}{'p99':>7}{'TPOT p50':>9}{'p99':>6}"
          f"{'goodput':>8}{'cached':>8}{'pulled':>8}  modes")
    run_id = 0
    with tempfile.TemporaryDirectory(prefix="pd-bench-") as tmp:
        for workload in args.workloads:
            trace = list(generate(workload, args.requests, 1.0, args.seed, config=CONFIG))
            rps = args.load * capacity_rps(trace, profile) * len(FLEETS["ours aggregated 4"])
            for name in fleets:
                run_id += 1
                r = run(name, FLEETS[name], tagged(trace, 1000 + run_id), rps, args, flags,
                        Path(tmp))
                results["runs"][f"{workload}/{name}"] = r  # type: ignore[index]
                print(f"{workload + '/' + name:<30}{r['num_errors']:>5}"
                      f"{1e3 * r['ttft_p50_s']:>9.0f}{1e3 * r['ttft_p99_s']:>7.0f}"
                      f"{1e3 * r['tpot_p50_s']:>9.1f}{1e3 * r['tpot_p99_s']:>6.1f}"
                      f"{r['goodput_rps']:>8.2f}{r['cached_fraction']:>8.1%}"
                      f"{r['blocks_pulled']:>8}  {r['modes']}", flush=True)
    return results
