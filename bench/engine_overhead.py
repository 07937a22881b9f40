"""Engine Python overhead per decode token, and the cost of chunked-prefill commits.

Builds the real ``Engine`` (KV manager with the radix prefix cache, ``ModelRunner``,
scheduler) over the demo model on the CPU, one torch thread.

Decode: ``B`` requests (B = 1, 16, 64) with fixed distinct 64-token prompts, greedy,
EOS ignored, are prefilled untimed; then ``--steps`` decode steps are timed. Per
step, the overhead is the time of ``Engine.step`` minus the time spent inside
``LlamaForCausalLM.forward`` and ``LlamaForCausalLM.compute_logits`` (the model's
layers, attention included, and the LM head). What remains, divided by ``B``, is the
engine's Python per decode token: scheduling, KV slot bookkeeping, building the step
inputs and ``AttentionMetadata``, sampling, stop checks, detokenizing and outputs.
Times are the engine thread's CPU time (``time.thread_time``), so other jobs on a
shared machine do not inflate them; the median step is reported, with its wall time.

Chunked prefill: one ``--prefill-tokens`` prompt (default 4,000) prefilled in chunks
of ``--chunk-tokens`` (default 64); the time inside ``KVCacheManager.commit`` per
chunk is reported as the median over the first and over the last quarter of the
chunks, and in total. A
commit whose cost grows with the prefix already committed makes the last quarter
dearer than the first.

Run: ``python -m bench engine_overhead`` or ``python -m bench.engine_overhead
[--steps N] [--prefill-tokens N] [--chunk-tokens N]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from workers.build import kv_spec
from workers.config import EngineConfig
from workers.engine.engine import Engine
from workers.engine.metrics import EngineMetrics
from workers.engine.request import GenerationParams, GenerationRequest
from workers.kv.build import build_kv_cache_manager
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model
from workers.model.runner import ModelRunner
from workers.model.sampler import SamplingParams

BLOCK_SIZE = 16
BATCHES = (1, 16, 64)
PROMPT_TOKENS = 64


class _Stopwatch:
    """Accumulates the thread CPU time spent inside the functions it wraps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, timed into ``seconds``."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return timed


def _engine(num_blocks: int, max_batched_tokens: int) -> tuple[Engine, _Stopwatch, _Stopwatch]:
    """An engine over a fresh cache, with stopwatches on the model and on commits."""
    loaded, model_time = _load()
    spec = kv_spec(loaded.config, BLOCK_SIZE)
    manager = build_kv_cache_manager(spec, num_blocks, namespace_digest=b"bench",
                                     worker_id="bench")
    commit_time = _Stopwatch()
    manager.commit = commit_time.wrap(manager.commit)  # type: ignore[method-assign]
    runner = ModelRunner(loaded.model, manager.tensors.key_caches,
                         manager.tensors.value_caches, BLOCK_SIZE)
    config = EngineConfig(max_batched_tokens=max_batched_tokens, max_num_seqs=64)
    engine = Engine(manager, runner, loaded.tokenizer, config, num_blocks * BLOCK_SIZE,
                    EngineMetrics(CollectorRegistry()))
    return engine, model_time, commit_time


def _request(prompt: tuple[int, ...], max_tokens: int) -> GenerationRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return GenerationRequest(prompt, GenerationParams(sampling))


def _prompt(length: int, salt: int) -> tuple[int, ...]:
    return tuple((31 * i + 7 * salt + 11) % 251 for i in range(length))


def decode_overhead(batch: int, num_steps: int) -> dict[str, float]:
    """Median per-step wall time, model time and overhead per decode token (µs)."""
    num_tokens = PROMPT_TOKENS + num_steps + 2
    num_blocks = batch * -(-num_tokens // BLOCK_SIZE) + 8
    engine, model_time, _ = _engine(num_blocks, max_batched_tokens=8192)
    for i in range(batch):
        engine.add_request(i, _request(_prompt(PROMPT_TOKENS, i), num_steps + 2))
    engine.step()  # every prompt in one prefill step, untimed
    steps, models, walls = [], [], []
    for _ in range(num_steps):
        model_time.seconds = 0.0
        start, wall_start = time.thread_time(), time.perf_counter()
        outputs = engine.step()
        steps.append(time.thread_time() - start)
        walls.append(time.perf_counter() - wall_start)
        models.append(model_time.seconds)
        assert len(outputs) == batch
    overheads = [step - model for step, model in zip(steps, models, strict=True)]
    return {
        "wall_step_us": statistics.median(walls) * 1e6,
        "step_us": statistics.median(steps) * 1e6,
        "model_us": statistics.median(models) * 1e6,
        "overhead_us_per_token": statistics.median(overheads) * 1e6 / batch,
    }


def chunked_prefill(num_tokens: int, chunk_tokens: int) -> dict[str, float]:
    """Time inside ``commit`` per chunk while one prompt is prefilled in chunks."""
    num_blocks = -(-num_tokens // BLOCK_SIZE) + 8
    engine, _, commit_time = _engine(num_blocks, max_batched_tokens=chunk_tokens)
    engine.add_request(0, _request(_prompt(num_tokens - 1, 0), 1))
    commits = []
    start = time.thread_time()
    while engine.has_work():
        commit_time.seconds = 0.0
        engine.step()
        commits.append(commit_time.seconds)
    total = time.thread_time() - start
    chunks = commits[:-1] if len(commits) > 1 else commits  # the last step also finishes
    quarter = max(1, len(chunks) // 4)
    return {
        "num_chunks": len(chunks),
        "commit_first_quarter_us": statistics.median(chunks[:quarter]) * 1e6,
        "commit_last_quarter_us": statistics.median(chunks[-quarter:]) * 1e6,
        "commit_total_ms": sum(commits) * 1e3,
        "prefill_total_ms": total * 1e3,
    }


@functools.cache
def _load() -> tuple[LoadedModel, _Stopwatch]:
    """The demo model, loaded once, its forward and LM head timed by the stopwatch."""
    torch.set_num_threads(1)
    loaded = load_model(ensure_demo_checkpoint())
    model, model_time = loaded.model, _Stopwatch()
    model.forward = model_time.wrap(model.forward)  # type: ignore[method-assign]
    model.compute_logits = model_time.wrap(model.compute_logits)  # type: ignore[method-assign]
    return loaded, model_time


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print its tables, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--prefill-tokens", type=int, default=4000)
    parser.add_argument("--chunk-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"decode": {}}
    decode_overhead(1, 8)  # warm-up: first calls into torch and the allocator, untimed
    print(f"decode, demo model, CPU, 1 thread, {args.steps} steps, median step (thread CPU time)")
    print(f"{'batch':>6}{'wall µs':>10}{'step µs':>10}{'model µs':>10}{'overhead µs/token':>20}")
    for batch in BATCHES:
        row = decode_overhead(batch, args.steps)
        results["decode"][batch] = row
        print(f"{batch:>6}{row['wall_step_us']:>10,.0f}{row['step_us']:>10,.0f}"
              f"{row['model_us']:>10,.0f}{row['overhead_us_per_token']:>20,.1f}")
    prefill = chunked_prefill(args.prefill_tokens, args.chunk_tokens)
    results["chunked_prefill"] = prefill
    print(f"chunked prefill of {args.prefill_tokens:,} tokens in {prefill['num_chunks']} chunks "
          f"of {args.chunk_tokens}: commit per chunk {prefill['commit_first_quarter_us']:,.0f} µs "
          f"(first quarter) -> {prefill['commit_last_quarter_us']:,.0f} µs (last quarter); "
          f"commits {prefill['commit_total_ms']:,.1f} ms of {prefill['prefill_total_ms']:,.0f} ms")
    return results


if __name__ == "__main__":
    main()
