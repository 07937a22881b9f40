"""GPU sizing check: a worker sized by ``gpu_memory_utilization`` stays within it.

Builds the worker's engine as ``python -m workers --device cuda`` would
(``workers.build.build_worker``, the KV cache sized by ``--gpu-memory-utilization
F`` with ``kv.cache_bytes`` unset), then serves one request whose prompt is the
largest step (``engine.max_batched_tokens`` tokens) and reads torch's CUDA memory
counters: total GPU memory, what torch held before the build, after it (weights and
KV cache), and the peak while serving. The check passes when the KV cache holds
exactly the plan's bytes and the peak stays at or below F x total; with ``lora`` the
worker also holds ``max_loras`` adapter slots at ``max_lora_rank``, which the budget
must leave room for (they are allocated before it is computed). Part of the
one-call GPU script (``bench.gpu_attention``); needs CUDA.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from radix.namespace import load_secret
from workers.build import build_worker
from workers.config import EngineConfig, KVSettings, LoraSettings, ModelSettings, WorkerConfig
from workers.engine.request import GenerationParams, GenerationRequest
from workers.model.sampler import SamplingParams


def check_sizing(fraction: float = 0.5, model: str = "demo", max_batched_tokens: int = 2048,
                 lora: LoraSettings | None = None) -> dict[str, Any]:
    """Build a ``model`` worker on CUDA at ``fraction`` (with ``lora``'s adapter slots),
    serve its largest step and compare torch's CUDA memory with the plan; SystemExit
    when it does not fit."""
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info(device)[1]
    before = torch.cuda.memory_allocated(device)
    config = WorkerConfig(model=ModelSettings(name=model, device="cuda"),
                          kv=KVSettings(gpu_memory_utilization=fraction),
                          engine=EngineConfig(max_batched_tokens=max_batched_tokens),
                          lora=lora or LoraSettings())
    built = build_worker(config, "gpu-sizing", load_secret("gpu-sizing"))
    plan = built.identity.kv_plan
    after_build = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    num_tokens = min(max_batched_tokens, built.identity.max_model_len - 1)
    asyncio.run(_serve_one(built.engine, num_tokens))
    peak = torch.cuda.max_memory_allocated(device)
    result = {
        "gpu_memory_utilization": fraction, "total_bytes": total,
        "sizing_rule": plan.sizing_rule, "kv_cache_bytes": plan.kv_cache_bytes,
        "kv_cache_bytes_used": plan.kv_cache_bytes_used, "num_blocks": plan.num_blocks,
        "allocated_before": before, "allocated_after_build": after_build,
        "peak_serving": peak, "limit_bytes": int(fraction * total),
        "headroom_bytes": int(fraction * total) - peak,
    }
    if not plan.sizing_rule.startswith("gpu_memory_utilization"):
        raise SystemExit(f"the worker was not sized by gpu_memory_utilization: {plan.sizing_rule}")
    if peak > fraction * total:
        raise SystemExit(f"peak {peak} B exceeds {fraction} x {total} B: {result}")
    return result


async def _serve_one(engine: Any, num_tokens: int) -> None:
    engine.start(asyncio.get_running_loop())
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        prompt = tuple((7 * i + 3) % 251 for i in range(num_tokens))
        await engine.submit(GenerationRequest(prompt, GenerationParams(sampling))).token_ids()
    finally:
        engine.stop()


def describe(result: dict[str, Any]) -> str:
    """One line for the GPU script's report."""
    gib = 2**30
    return (f"KV sizing at {result['gpu_memory_utilization']}: {result['num_blocks']:,} blocks "
            f"({result['kv_cache_bytes_used'] / gib:.2f} GiB); peak {result['peak_serving'] / gib:.2f}"
            f" GiB of a {result['limit_bytes'] / gib:.2f} GiB limit ({result['sizing_rule']})")
