"""``make bench`` / ``make bench-quick``: the routing report in bench/results/<date>/.

Runs, in one process and one sitting so every ratio compares runs of the same
machine state: the simulator (``bench.sim``) for every policy on every workload at
each worker count, its scaling with workers and requests, the cached fraction
against the KV capacity; the end-to-end run (``bench.e2e``) of our router and the
installed peer routers in front of the same workers (each setup's trace twice, cold
then warm, reported apart; the request counts below are per phase); the same at cluster scale on timed
workers (``bench.e2e_timed``: 8 and 16 workers, rag, chat and agent at 80% load, rag
at 16 also at 95% and closed loop; the cache-aware routers) and the simulator checked
against it (``bench.sim_check``); and the radix core (``bench.radix_bench``); the
routers in front of two real vLLM servers (``bench.vllm_bench``); LoRA adapters on
timed workers (``bench.lora_bench``); and the chaos soak (``bench.chaos``, 2 minutes;
one with ``--quick``; the 30-minute soak is ``make soak``). The sizes keep the whole
report under 30 minutes (docs/bench.md, "The report's 30 minutes"); it prints and
records the time of each part. Writes ``results.json``, ``summary.md`` (the tables, with
the command that made them) and PNG plots (matplotlib; without it the plots are
skipped and the summary says so). The other micro-benchmarks run with
``python -m bench NAME``.

Run: ``python -m bench.report [--quick] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench import chaos, e2e, e2e_timed, lora_bench, radix_bench, reference, sim_check, vllm_bench
from bench.report_write import write_plots, write_summary
from bench.sim import RATES, SIM_POLICIES, TABLE_HEADER, SimConfig, simulate, table_row


@dataclass(frozen=True)
class Plan:
    """Sizes of one report."""

    workers: tuple[int, ...]
    workloads: tuple[str, ...]
    requests_per_worker: int
    min_requests: int
    max_requests: int
    scaling_workers: tuple[int, ...]
    scaling_requests: tuple[int, ...]
    cache_sizes: tuple[int, ...]
    e2e_args: tuple[str, ...]
    timed_args: tuple[tuple[str, ...], ...]
    sim_check_args: tuple[str, ...]
    reference_args: tuple[str, ...]
    radix_requests: int
    vllm_args: tuple[str, ...]
    chaos_duration_s: float
    lora_args: tuple[str, ...]


# The cache-aware routers of the timed runs (the cache-blind baselines, ours
# round_robin and vllm consistent_hash, run with ``python -m bench e2e --backend timed``).
TIMED_ROUTERS = ("ours cache_aware", "sglang cache_aware default", "sglang cache_aware tuned",
                 "vllm cache_aware")
FULL = Plan(workers=(8, 32), workloads=("rag", "chat", "agent", "multitenant"),
            requests_per_worker=100, min_requests=3000, max_requests=4000,
            scaling_workers=(8, 32, 128), scaling_requests=(2000, 4000, 8000),
            cache_sizes=(50_000, 100_000, 200_000),
            e2e_args=("--workers", "4", "--requests", "100", "--clients", "16"),
            timed_args=(("--workers", "8", "16", "--workloads", "rag", "chat", "agent", "--loads", "0.8",
                         "--requests", "40", "--routers", *TIMED_ROUTERS),
                        ("--workers", "16", "--workloads", "rag", "--loads", "0.95", "closed",
                         "--requests", "40", "--routers", *TIMED_ROUTERS)),
            sim_check_args=("--workers", "8", "--workloads", "rag", "chat", "--requests", "100"),
            reference_args=("--requests", "5000", "--clients", "64"), radix_requests=20_000,
            vllm_args=("--requests", "60"), chaos_duration_s=120.0,
            lora_args=("--requests", "160"))
QUICK = Plan(workers=(8,), workloads=("rag", "chat"), requests_per_worker=60,
             min_requests=500, max_requests=500, scaling_workers=(4, 8, 16),
             scaling_requests=(250, 500), cache_sizes=(50_000, 200_000),
             e2e_args=("--workers", "2", "--requests", "12", "--clients", "4"),
             timed_args=(("--workers", "8", "--workloads", "rag", "--loads", "0.5", "0.8",
                          "--requests", "30", "--routers", "ours cache_aware", "sglang cache_aware default"),),
             sim_check_args=("--workers", "8", "--workloads", "rag", "--requests", "100"),
             reference_args=("--requests", "500", "--clients", "16"), radix_requests=2000,
             vllm_args=("--requests", "20"), chaos_duration_s=60.0,
             lora_args=("--requests", "240", "--routers", "ours", "ours adapter-blind"))
CACHE_POLICIES = ("cache_aware", "threshold_default", "threshold_tuned", "consistent_hash", "round_robin")


def _requests(plan: Plan, num_workers: int) -> int:
    return max(plan.min_requests, min(plan.max_requests, plan.requests_per_worker * num_workers))


def run_sim(plan: Plan) -> dict[str, dict]:
    """Every policy on every workload at every worker count."""
    results: dict[str, dict] = {}
    print(TABLE_HEADER)
    for num_workers in plan.workers:
        for workload in plan.workloads:
            for policy in SIM_POLICIES:
                r = simulate(policy, num_workers, workload, _requests(plan, num_workers),
                             RATES[workload])
                results[f"{workload}/{num_workers}/{policy}"] = r
                print(table_row(workload, num_workers, policy, r), flush=True)
    return results


def run_scaling(plan: Plan) -> dict[str, list]:
    """Simulator wall time for ours on rag: against workers (``requests_per_worker``
    each), and against requests at the largest worker count of ``plan.workers``."""
    by_workers = []
    for num_workers in plan.scaling_workers:
        n = plan.requests_per_worker * num_workers // 4
        r = simulate("cache_aware", num_workers, "rag", n, RATES["rag"])
        by_workers.append({"num_workers": num_workers, "num_requests": n, "wall_s": r["wall_s"]})
        print(f"scaling: {num_workers} workers, {n} requests: {r['wall_s']:.1f} s", flush=True)
    by_requests = []
    num_workers = plan.scaling_workers[len(plan.scaling_workers) // 2]
    for n in plan.scaling_requests:
        r = simulate("cache_aware", num_workers, "rag", n, RATES["rag"])
        by_requests.append({"num_workers": num_workers, "num_requests": n, "wall_s": r["wall_s"]})
        print(f"scaling: {num_workers} workers, {n} requests: {r['wall_s']:.1f} s", flush=True)
    return {"by_workers": by_workers, "by_requests": by_requests}


def run_cache_sizes(plan: Plan) -> dict[str, list]:
    """Cached fraction and TTFT p99 against the per-worker KV capacity, 8 workers, rag."""
    results: dict[str, list] = {}
    for policy in CACHE_POLICIES:
        rows = []
        for capacity in plan.cache_sizes:
            r = simulate(policy, 8, "rag", plan.min_requests, RATES["rag"],
                         config=replace(SimConfig(), kv_capacity_tokens=capacity))
            rows.append({"kv_capacity_tokens": capacity, **{k: r[k] for k in (
                "cached_fraction", "ttft_p99_s", "max_over_mean_load")}})
        results[policy] = rows
        print(f"cache sizes, {policy}: " + ", ".join(f"{row['kv_capacity_tokens'] // 1000}k "
              f"{row['cached_fraction']:.3f}" for row in rows), flush=True)
    return results


def run_timed(plan: Plan) -> dict:
    """Every timed e2e invocation of ``plan``, their runs in one result."""
    merged: dict = {"runs": {}}
    for args in plan.timed_args:
        result = e2e_timed.main(list(args))
        merged.update({k: v for k, v in result.items() if k != "runs"})
        merged["runs"].update(result["runs"])
    return merged


def main(argv: list[str] | None = None) -> Path:
    """Run the plan and write the report; returns its directory."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small plan (about 5 minutes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    out = args.out or Path(__file__).parent / "results" / time.strftime("%Y-%m-%d")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report: dict[str, object] = {"machine": platform.platform(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "command": " ".join(["python -m bench.report", *(argv or sys.argv[1:])]),
                                 "plan": plan.__dict__, "rates": RATES}
    parts: list[tuple[str, Callable[[], object]]] = [
        ("sim", lambda: run_sim(plan)),
        ("scaling", lambda: run_scaling(plan)),
        ("cache_sizes", lambda: run_cache_sizes(plan)),
        ("e2e", lambda: e2e.main(list(plan.e2e_args))),
        ("e2e_timed", lambda: run_timed(plan)),
        ("sim_check", lambda: sim_check.main(list(plan.sim_check_args))),
        ("reference", lambda: reference.main(list(plan.reference_args))),
        ("radix", lambda: radix_bench.main(["--requests", str(plan.radix_requests)])),
        ("vllm", lambda: vllm_bench.main(list(plan.vllm_args))),
        ("lora", lambda: lora_bench.main(list(plan.lora_args))),
        ("chaos", lambda: chaos.main(["--duration-s", str(plan.chaos_duration_s)])),
    ]
    part_s: dict[str, float] = {}
    report["part_s"] = part_s
    for name, run in parts:
        print(f"=== {name} ===", flush=True)
        part_start = time.perf_counter()
        report[name] = run()
        part_s[name] = time.perf_counter() - part_start
        print(f"=== {name}: {part_s[name]:.0f} s ===", flush=True)
        # After every part, so a part that fails later loses none of what was measured.
        (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    report["sglang_radix"] = report["radix"]["sglang_radix"]
    report["wall_s"] = time.perf_counter() - start
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    plots = write_plots(report, out)
    write_summary(report, plots, out)
    print("time per part: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in part_s.items()))
    print(f"report written to {out} in {report['wall_s']:.0f} s")
    return out


if __name__ == "__main__":
    main()
