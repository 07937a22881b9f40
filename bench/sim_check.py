"""The simulator checked against the timed cluster: one trace, one profile, both ways.

For each workload, the trace of ``bench.e2e_timed`` (its run tag included) runs open
loop at ``--load`` of the profile's capacity through K timed workers behind our
router (``cache_aware``), and through ``bench.sim`` with the same arrivals, the same
cost model, the worker's KV capacity (the profile's plan), the worker's batching
limits and the router's poll interval in profile seconds. As the e2e run sends
them, every prompt starts with the tokenizer's BOS and belongs to one tenant, with no
public prefix. Prints TTFT p50/p99 and the cached fraction of each and their ratio
(sim / timed).

Run: ``python -m bench sim_check [--workers 8] [--workloads rag chat] [--load 0.8]``.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.e2e import workers
from bench.e2e_timed import (
    CONFIG,
    POLL_INTERVAL_S,
    at_load,
    capacity_rps,
    run_cell,
    tagged,
    warm_up,
)
from bench.sim import SIM_POLICIES, Cluster, SimConfig, SimWorker, summarize
from bench.sim_stepped import SteppedSimWorker
from bench.workloads import TraceRequest, generate
from radix.cost_model import Profile, get_profile
from radix.keys import to_key
from workers.config import EngineConfig
from workers.kv.plan import plan_kv_cache
from workers.model.timed import timed_kv_spec

BOS = CONFIG.vocab_size  # any id the workload never draws
FIGURES = ("ttft_p50_s", "ttft_p99_s", "cached_fraction")


def simulate_trace(requests: list[TraceRequest], arrivals_s: list[float], profile: Profile,
                   num_workers: int, args: argparse.Namespace) -> dict[str, object]:
    """``requests`` at ``arrivals_s`` through the simulator, as the timed run sends them."""
    engine = EngineConfig()
    config = SimConfig(
        kv_capacity_tokens=plan_kv_cache(timed_kv_spec(profile, 16), profile.kv_cache_bytes).num_tokens,
        cost=profile.cost, max_batched_tokens=args.max_batched_tokens,
        max_num_seqs=engine.max_num_seqs, poll_interval_s=POLL_INTERVAL_S)
    bos = to_key([BOS])
    sent = [replace(r, arrival_s=a, tenant="bench", num_public_tokens=0, prompt=bos + r.prompt)
            for r, a in zip(requests, arrivals_s, strict=True)]
    cluster = Cluster(SIM_POLICIES["cache_aware"], num_workers, config,
                      worker_class=SteppedSimWorker if args.stepped else SimWorker)
    cluster.run(iter(sent))
    return summarize(cluster, 0.0)


def main(argv: list[str] | None = None) -> dict:
    """Both ways on every workload; prints the comparison and returns it by workload."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--workloads", nargs="+", default=["rag", "chat", "agent", "multitenant"])
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--time-scale", type=float, default=40.0)
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--slo-s", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-request", dest="stepped", action="store_false",
                        help="the simulator's per-request engine (SimWorker) instead of its step loop")
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    flags = ("--model", f"timed:{profile.name}", "--served-model-name", "demo", "--time-scale",
             str(args.time_scale), "--max-batched-tokens", str(args.max_batched_tokens))
    results: dict[str, dict] = {}
    print(f"{'workload':<12}" + "".join(f"{f:>30}" for f in FIGURES))
    with workers(args.workers, "1GiB", *flags, ready_timeout_s=60 + 10 * args.workers) as started, \
            tempfile.TemporaryDirectory(prefix="sim-check-") as tmp:
        warm_up(started)
        for run, workload in enumerate(args.workloads):
            trace = tagged(list(generate(workload, args.requests, 1.0, args.seed, config=CONFIG)),
                           10_000 + run)
            rps = capacity_rps(trace, profile) * args.workers
            timed = run_cell("ours cache_aware", started, trace, str(args.load), rps, args,
                             Path(tmp))["cold"]
            sim = simulate_trace(trace, at_load(trace, args.load * rps), profile, args.workers, args)
            results[workload] = {"timed": timed, "sim": sim}
            print(f"{workload:<12}" + "".join(
                f"{timed[f]:>10.3f} {sim[f]:>8.3f} {sim[f] / max(timed[f], 1e-9):>8.2f}x"
                for f in FIGURES) + f"   sent late p99 {1e3 * timed['send_late_p99_s']:.1f} ms", flush=True)
    return results


if __name__ == "__main__":
    main()
