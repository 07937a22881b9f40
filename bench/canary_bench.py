"""The canary's cost on the router's hot path: ``Canary.route`` per request.

A model without pools pays one dict lookup; a model with pools pays the keyed hash
of (tenant, first block), one draw per pool and the split of the routable workers
(cached while the registry's list stays the same). Workers: 8 of one model, 6 in the
baseline pool and 2 in the candidate; prompts of 2,000 tokens, a new conversation
each request.

Run: ``python -m bench canary [--requests N]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from prometheus_client import CollectorRegistry

from radix.keys import to_key
from router.canary.controller import Canary
from router.config import ModelSpec, PoolConfig, WorkerSpec
from router.fleet.registry import WorkerState

NUM_WORKERS = 8
NUM_PROMPT_TOKENS = 2000


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time ``Canary.route`` for a model without pools and one with two; print and
    return microseconds per request."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args(argv)
    ids = [f"w{i}" for i in range(NUM_WORKERS)]
    workers = [WorkerState(WorkerSpec(worker_id=i, model="demo", url="http://127.0.0.1:1"),
                           "http://127.0.0.1:1", {}) for i in ids]
    pools = {"baseline": PoolConfig(workers=tuple(ids[:6]), weight=95),
             "candidate": PoolConfig(workers=tuple(ids[6:]), weight=5)}
    models = {"pooled": ModelSpec(name="pooled", tokenizer="demo", pools=pools),
              "plain": ModelSpec(name="plain", tokenizer="demo")}
    canary = Canary(models, b"bench-secret", lambda model, text: [1], CollectorRegistry())
    keys = [to_key([i % 50_000, *range(NUM_PROMPT_TOKENS - 1)]) for i in range(1000)]
    results = {}
    for model in models:
        started = time.perf_counter()
        for i in range(args.requests):
            canary.route(model, workers, "tenant", keys[i % len(keys)])
        results[model] = (time.perf_counter() - started) / args.requests * 1e6
    print(f"{'model':<8} {'us per request':>15}")
    for model, us in results.items():
        print(f"{model:<8} {us:>15.2f}")
    return {"us_per_request": results, "num_requests": args.requests}


if __name__ == "__main__":
    main()
