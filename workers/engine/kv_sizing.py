"""How big the KV cache is: the configured bytes, or what GPU memory leaves.

On CUDA with ``kv.cache_bytes`` unset, the budget follows vLLM's
``gpu_memory_utilization``: F x total GPU memory, less what torch holds after the
weights are loaded, less the peak activation of one profile forward. The profile
runs the worst step the engine can schedule, ``engine.max_batched_tokens`` new
tokens of one sequence (the prefill's attention scores grow with the square of a
sequence's new tokens), over a KV cache just large enough for it; what it
allocated beyond that cache is the peak activation. With decode CUDA graphs
(``workers.model.decode_graphs``) the graphs' memory pool is kept for the process's
life beside that peak, so the budget also leaves the peak of a second profile
forward: the largest graph bucket's decode step, with block tables as wide as the
model's longest sequence (the split-K partials grow with them). Everywhere else the
budget is ``kv.cache_bytes`` (default ``workers.config.DEFAULT_CACHE_BYTES``).
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
from workers.model.decode_graphs import capture_sizes
from workers.model.llama import LlamaForCausalLM
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput


class KVBudget(NamedTuple):
    """Bytes for the KV cache and the rule that chose them (for the log and ``/info``)."""

    num_bytes: int
    rule: str


def kv_budget(config: WorkerConfig, device: torch.device, model: LlamaForCausalLM,
              spec: KVCacheSpec, max_positions: int, decode_graphs: bool = False) -> KVBudget:
    """The KV budget for ``config`` on ``device`` (see the module docstring);
    ``decode_graphs``: decode steps will be captured in CUDA graphs."""
    if config.kv.cache_bytes is not None or device.type != "cuda":
        return KVBudget(config.kv.cache_bytes or DEFAULT_CACHE_BYTES, "kv_cache_bytes")
    fraction = config.kv.gpu_memory_utilization
    num_tokens = min(config.engine.max_batched_tokens, max_positions)
    blocks = math.ceil(num_tokens / spec.block_size)
    peak = profile_peak_activation(model, spec, [StepInput([0] * num_tokens, 0,
                                                           list(range(blocks)))], device)
    rule = (f"gpu_memory_utilization {fraction} (peak activation {format_bytes(peak)} at "
            f"{num_tokens} tokens")
    if decode_graphs:
        width = math.ceil(max_positions / spec.block_size)
        largest = capture_sizes(config.engine.max_num_seqs)[-1]
        graph_peak = profile_peak_activation(
            model, spec, [StepInput([0], 0, [row] * width) for row in range(largest)], device)
        peak += graph_peak
        rule += f", decode graphs {format_bytes(graph_peak)} at batch {largest}"
    return KVBudget(free_memory_budget(fraction, device, peak), rule + ")")


def profile_peak_activation(model: LlamaForCausalLM, spec: KVCacheSpec,
                            batch: list[StepInput], device: torch.device) -> int:
    """Bytes one eager forward of ``batch`` allocates on CUDA ``device`` at its peak,
    beyond the weights and a KV cache as large as the most blocks ``batch`` names."""
    num_blocks = 1 + max(max(step.block_table) for step in batch)
    tensors = KVCacheTensors(spec, num_blocks, device)
    runner = ModelRunner(model, tensors.key_caches, tensors.value_caches, spec.block_size,
                         KVScales.unit(spec.num_layers))
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    runner.execute(batch)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del runner, tensors
    torch.cuda.empty_cache()
    return peak
