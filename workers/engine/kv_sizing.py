"""How big the KV cache is: the configured bytes, or what GPU memory leaves.

On CUDA with ``kv.cache_bytes`` unset, the budget follows vLLM's
``gpu_memory_utilization``: F x total GPU memory, less what torch holds after the
weights are loaded, less the peak activation of one profile forward. The profile
runs the worst step the engine can schedule, ``engine.max_batched_tokens`` new
tokens of one sequence (the prefill's attention scores grow with the square of a
sequence's new tokens), over a KV cache just large enough for it; what it
allocated beyond that cache is the peak activation. Everywhere else the budget is
``kv.cache_bytes`` (default ``workers.config.DEFAULT_CACHE_BYTES``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from workers.config import DEFAULT_CACHE_BYTES, WorkerConfig
from workers.kv.plan import format_bytes
from workers.kv.scales import KVScales
from workers.kv.spec import KVCacheSpec
from workers.kv.tensors import KVCacheTensors, free_memory_budget
from workers.model.llama import LlamaForCausalLM
from workers.model.runner import ModelRunner, StepInput


class KVBudget(NamedTuple):
    """Bytes for the KV cache and the rule that chose them (for the log and ``/info``)."""

    num_bytes: int
    rule: str


def kv_budget(config: WorkerConfig, device: torch.device, model: LlamaForCausalLM,
              spec: KVCacheSpec, max_positions: int) -> KVBudget:
    """The KV budget for ``config`` on ``device`` (see the module docstring)."""
    if config.kv.cache_bytes is not None or device.type != "cuda":
        return KVBudget(config.kv.cache_bytes or DEFAULT_CACHE_BYTES, "kv_cache_bytes")
    fraction = config.kv.gpu_memory_utilization
    num_tokens = min(config.engine.max_batched_tokens, max_positions)
    peak = profile_peak_activation(model, spec, num_tokens, device)
    budget = free_memory_budget(fraction, device, peak)
    return KVBudget(budget, f"gpu_memory_utilization {fraction} (peak activation "
                            f"{format_bytes(peak)} at {num_tokens} tokens)")


def profile_peak_activation(model: LlamaForCausalLM, spec: KVCacheSpec, num_tokens: int,
                            device: torch.device) -> int:
    """Bytes one forward of ``num_tokens`` new tokens allocates on CUDA ``device`` at
    its peak, beyond the weights and a KV cache that holds those tokens."""
    num_blocks = math.ceil(num_tokens / spec.block_size)
    tensors = KVCacheTensors(spec, num_blocks, device)
    runner = ModelRunner(model, tensors.key_caches, tensors.value_caches, spec.block_size,
                         KVScales.unit(spec.num_layers))
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    runner.execute([StepInput([0] * num_tokens, 0, list(range(num_blocks)))])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del runner, tensors
    torch.cuda.empty_cache()
    return peak
