"""Decode headroom: preemptions per 1,000 requests against the admission watermark.

The real ``Engine`` (scheduler, KV manager with the radix prefix cache) runs a trace
that keeps the pool full: ``--requests`` requests queued at once, each a random
prompt of 64 to 512 tokens and 64 to 512 output tokens (EOS never ends them), over
``--num-blocks`` blocks of 16 tokens, up to 64 running at once, preemption by
recompute. The forward pass is the timed backend's (``workers.model.timed``) with
the ``llama3-8b-h100`` cost model, its waits added up instead of slept, so a run
takes seconds and reports the GPU time the trace would have cost. For each
``--watermarks`` value it reports preemptions per 1,000 requests, recomputed
tokens (tokens computed beyond each request's prompt and output once: what
preemptions recompute, less what their own cached prefix saved), the mean
running batch, and the modelled time.

Run: ``python -m bench headroom`` or ``python -m bench.headroom [--requests N]
[--num-blocks N] [--watermarks 0,0.01,0.05] [--seed N]``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from radix.cost_model import get_profile
from radix.tokenizer import PromptTokenizer
from workers.config import EngineConfig
from workers.engine.engine import Engine
from workers.engine.metrics import EngineMetrics
from workers.engine.request import GenerationParams, GenerationRequest
from workers.kv.build import build_kv_cache_manager
from workers.model.demo import demo_config
from workers.model.sampler import SamplingParams
from workers.model.step_input import StepInput
from workers.model.timed import TimedRunner, timed_tensor_spec

BLOCK_SIZE = 16
PROFILE = "llama3-8b-h100"


class _CountingRunner(TimedRunner):
    """The timed runner, adding up its waits instead of sleeping and counting the
    tokens it computes."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(get_profile(PROFILE).cost, vocab_size, range(97, 123), sleep=self._wait)
        self.seconds = 0.0
        self.num_computed_tokens = 0

    def _wait(self, seconds: float) -> None:
        self.seconds += seconds

    def execute(self, batch: Sequence[StepInput]) -> torch.Tensor:
        """``TimedRunner.execute``, counted."""
        self.num_computed_tokens += sum(len(step.token_ids) for step in batch)
        return super().execute(batch)


def trace(num_requests: int, seed: int) -> list[GenerationRequest]:
    """The requests: random byte-token prompts and lengths (see the module docstring)."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt = tuple(rng.randrange(3, 256) for _ in range(rng.randint(64, 512)))
        sampling = SamplingParams(temperature=0.0, max_tokens=rng.randint(64, 512),
                                  ignore_eos=True)
        requests.append(GenerationRequest(prompt, GenerationParams(sampling)))
    return requests


def run_trace(requests: list[GenerationRequest], num_blocks: int, watermark: float
              ) -> dict[str, float]:
    """Run every request to completion at ``watermark``; the counts of the run."""
    manager = build_kv_cache_manager(timed_tensor_spec(BLOCK_SIZE), num_blocks,
                                     namespace_digest=b"headroom", worker_id="headroom",
                                     watermark=watermark)
    runner = _CountingRunner(demo_config()["vocab_size"])
    config = EngineConfig(max_batched_tokens=2048, max_num_seqs=64,
                          max_waiting_requests=len(requests))
    engine = Engine(manager, runner, PromptTokenizer.demo(), config, num_blocks * BLOCK_SIZE,
                    EngineMetrics(CollectorRegistry()))
    for request_id, request in enumerate(requests):
        engine.add_request(request_id, request)
    num_steps = num_running = 0
    while engine.has_work():
        engine.step()
        num_steps += 1
        num_running += len(engine.scheduler.running)
    stats = engine.stats()
    needed = sum(len(r.prompt_token_ids) + r.params.sampling.max_tokens - 1 for r in requests)
    return {
        "watermark": watermark,
        "num_watermark_blocks": manager.num_watermark_blocks,
        "preemptions_per_1000_requests": 1000 * stats.preemptions_total / len(requests),
        "recomputed_tokens": runner.num_computed_tokens - needed,
        "mean_running": num_running / num_steps,
        "modelled_seconds": runner.seconds,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the trace at each watermark; print a table; return the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--num-blocks", type=int, default=1024)
    parser.add_argument("--watermarks", default="0,0.01,0.02,0.05")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    requests = trace(args.requests, args.seed)
    rows = [run_trace(requests, args.num_blocks, float(w)) for w in args.watermarks.split(",")]
    print(f"{args.requests} requests, {args.num_blocks} blocks of {BLOCK_SIZE}, {PROFILE} costs")
    print(f"{'watermark':>10}{'blocks':>8}{'preempt/1k':>12}{'recomputed':>12}"
          f"{'running':>9}{'modelled s':>12}")
    for row in rows:
        print(f"{row['watermark']:>10}{row['num_watermark_blocks']:>8}"
              f"{row['preemptions_per_1000_requests']:>12.1f}{row['recomputed_tokens']:>12,}"
              f"{row['mean_running']:>9.1f}{row['modelled_seconds']:>12.2f}")
    return {"requests": args.requests, "num_blocks": args.num_blocks, "rows": rows}


if __name__ == "__main__":
    main()
