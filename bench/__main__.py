"""``python -m bench [name ...] [--flag ...]``: run the benchmarks (all by default), print
each table, and write the numbers to bench/results/latest.json. Flags after one name
go to that benchmark (``python -m bench sim --workers 8``). ``make bench`` writes the routing
report instead (``bench.report``)."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    agents,
    canary_bench,
    chaos,
    crossover,
    e2e,
    e2e_timed,
    e2e_worker_bench,
    engine_overhead,
    fairness,
    fuzz,
    headroom,
    host_tier_bench,
    index_bench,
    kv_bench,
    lora_bench,
    lora_decode_bench,
    model_bench,
    multi_router,
    pd_bench,
    radix_bench,
    reference,
    router_overhead,
    routing_real,
    sim,
    sim_check,
    smollm2_bench,
    token_cache_bench,
    vllm_bench,
)


def run_e2e(argv: list[str]) -> dict:
    """``e2e`` on demo workers, or ``--backend timed``: the timed cluster
    (``bench.e2e_timed``, built on ``bench.e2e``)."""
    if "--backend" in argv:
        at = argv.index("--backend")
        backend = argv[at + 1] if at + 1 < len(argv) else ""
        if backend not in ("demo", "timed"):
            raise SystemExit(f"--backend: choose demo or timed, not {backend!r}")
        rest = argv[:at] + argv[at + 2:]
        return e2e_timed.main(rest) if backend == "timed" else e2e.main(rest)
    return e2e.main(argv)


BENCHMARKS: dict[str, Callable[[list[str]], dict]] = {
    "radix": radix_bench.main,
    "kv": kv_bench.main,
    "model": model_bench.main,
    "lora_decode": lora_decode_bench.main,
    "smollm2": smollm2_bench.main,
    "e2e_worker": e2e_worker_bench.main,
    "engine_overhead": engine_overhead.main,
    "host_tier": host_tier_bench.main,
    "headroom": headroom.main,
    "index": index_bench.main,
    "routing_real": routing_real.main,
    "token_cache": token_cache_bench.main,
    "router_overhead": router_overhead.main,
    "multi_router": multi_router.main,
    "sim": sim.main,
    "sim_check": sim_check.main,
    "e2e": run_e2e,
    "reference": reference.main,
    "vllm": vllm_bench.main,
    "chaos": chaos.main,
    "lora": lora_bench.main,
    "canary": canary_bench.main,
    "pd": pd_bench.main,
    "crossover": crossover.main,
    "agents": agents.main,
    "fairness": fairness.main,
}


# Not a benchmark: run by name only (`python -m bench fuzz --examples N`).
ON_REQUEST: dict[str, Callable[[list[str]], dict]] = {"fuzz": fuzz.main}


def main() -> None:
    """Run the selected benchmarks in order and save their results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*",
                        help=f"any of {', '.join(BENCHMARKS)}, or {', '.join(ON_REQUEST)}")
    args, flags = parser.parse_known_args()
    runnable = {**BENCHMARKS, **ON_REQUEST}
    unknown = set(args.names) - set(runnable)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    if flags and len(args.names) != 1:
        parser.error("flags go to one benchmark: name exactly one")
    results = {"machine": platform.platform(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name in args.names or BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        results[name] = runnable[name](flags)
    out = Path(__file__).parent / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nresults written to {out}")


if __name__ == "__main__":
    main()
