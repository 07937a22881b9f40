"""``python -m bench [name ...]``: run the benchmarks (all by default), print each table,
and write the numbers to bench/results/latest.json. ``make bench`` writes the routing
report instead (``bench.report``)."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    e2e,
    e2e_worker_bench,
    engine_overhead,
    host_tier_bench,
    kv_bench,
    model_bench,
    multi_router,
    radix_bench,
    router_overhead,
    routing_quality,
    routing_real,
    sim,
    smollm2_bench,
    token_cache_bench,
)

BENCHMARKS: dict[str, Callable[[list[str]], dict]] = {
    "radix": radix_bench.main,
    "kv": kv_bench.main,
    "model": model_bench.main,
    "smollm2": smollm2_bench.main,
    "e2e_worker": e2e_worker_bench.main,
    "engine_overhead": engine_overhead.main,
    "host_tier": host_tier_bench.main,
    "routing": routing_quality.main,
    "routing_real": routing_real.main,
    "token_cache": token_cache_bench.main,
    "router_overhead": router_overhead.main,
    "multi_router": multi_router.main,
    "sim": sim.main,
    "e2e": e2e.main,
}


def main() -> None:
    """Run the selected benchmarks in order and save their results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)}")
    args = parser.parse_args()
    unknown = set(args.names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    results = {"machine": platform.platform(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name in args.names or BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        results[name] = BENCHMARKS[name]([])
    out = Path(__file__).parent / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nresults written to {out}")


if __name__ == "__main__":
    main()
