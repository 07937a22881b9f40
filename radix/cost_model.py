"""The timing model of a GPU serving engine, per named profile, shared by the timed
worker backend (``workers.model.timed``) and the cluster simulator (``bench.sim``).

A profile names a model shape (what its KV cache costs per token), the memory left
for KV on its GPUs, and a ``CostModel`` of one engine step:

- a prefill chunk of ``n`` new tokens attending over ``context`` tokens (the cached
  prefix plus the chunk itself) costs ``a + b*n + c*n*context`` seconds;
- a decode step of ``batch`` sequences whose contexts sum to ``sum_context`` costs
  ``d + e*batch + f*sum_context`` seconds;
- a step holding both costs the sum of its parts (``step_s``).

An entry of one new token is decode-shaped whatever its origin (a prompt cached but
for its last token computes exactly what a decode does). Where the constants come
from, and how far to trust them, is written in docs/bench.md ("Timed profiles").
Pure: no I/O, no clock; the caller waits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

GIB = 2**30
# Host-to-device copy rate of a LoRA load: PCIe 5.0 x16 moves 64 GB/s per direction
# (the H100 datasheet's "128 GB/s" counts both); pinned-memory copies reach about
# 50 GB/s of it. The fixed part of a load (reading the adapter's header, slot
# bookkeeping, one small copy per projection) is an assumption; docs/adapters.md.
PCIE5_H2D_BYTES_PER_S = 50e9
LORA_LOAD_OVERHEAD_S = 2e-3
# The prefill-to-decode KV link of a disaggregated fleet: one 400 Gb/s RDMA NIC per GPU
# (ConnectX-7, what NIXL moves blocks over), 50 GB/s, taken at its line rate.
RDMA_400G_BYTES_PER_S = 50e9


@dataclass(frozen=True)
class CostModel:
    """Seconds per engine step (module docstring): prefill ``a, b, c``; decode ``d, e, f``."""

    a: float
    b: float
    c: float
    d: float
    e: float
    f: float

    def prefill_chunk_s(self, num_new_tokens: int, num_context_tokens: int) -> float:
        """One prefill chunk of ``num_new_tokens`` attending over ``num_context_tokens``."""
        return self.a + self.b * num_new_tokens + self.c * num_new_tokens * num_context_tokens

    def decode_step_s(self, batch: int, sum_context_tokens: int) -> float:
        """One decode step of ``batch`` sequences (0 for an empty batch)."""
        if batch == 0:
            return 0.0
        return self.d + self.e * batch + self.f * sum_context_tokens

    def step_s(self, entries: Iterable[tuple[int, int]]) -> float:
        """One engine step over ``(num_new_tokens, num_context_tokens)`` entries: the
        prefill chunks' costs plus one decode step over the one-token entries."""
        total_s, batch, sum_context = 0.0, 0, 0
        for num_new, num_context in entries:
            if num_new == 1:
                batch += 1
                sum_context += num_context
            else:
                total_s += self.prefill_chunk_s(num_new, num_context)
        return total_s + self.decode_step_s(batch, sum_context)


@dataclass(frozen=True)
class Profile:
    """A model on its GPUs: its KV shape (the worker's KV plan turns it into bytes per
    token and blocks), the bytes left for KV after the weights (``kv_cache_bytes``,
    over all the GPUs of a tensor-parallel group), the model's context limit, and the
    step costs. ``hidden_size``, ``intermediate_size`` and ``num_attention_heads``
    give the projections' shapes a LoRA adapter must fit (None: adapters are refused);
    a load costs ``lora_bytes / h2d_bytes_per_s + lora_load_overhead_s``. KV blocks move
    between a prefill and a decode worker at ``link_bytes_per_s``."""

    name: str
    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str
    kv_cache_bytes: int
    max_model_len: int
    rope_theta: float
    cost: CostModel
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    h2d_bytes_per_s: float = PCIE5_H2D_BYTES_PER_S
    lora_load_overhead_s: float = LORA_LOAD_OVERHEAD_S
    link_bytes_per_s: float = RDMA_400G_BYTES_PER_S

    def lora_load_s(self, lora_bytes: int) -> float:
        """Seconds to load an adapter of ``lora_bytes`` into a slot."""
        return lora_bytes / self.h2d_bytes_per_s + self.lora_load_overhead_s


# Derivations in docs/bench.md ("Timed profiles"). H100 SXM 80 GB: 989 TFLOP/s dense
# bf16, 3.35 TB/s HBM3; vLLM's gpu_memory_utilization 0.9.
PROFILES: dict[str, Profile] = {
    "llama3-8b-h100": Profile(
        name="llama3-8b-h100", model="meta-llama/Meta-Llama-3-8B-Instruct",
        num_layers=32, num_kv_heads=8, head_dim=128, kv_dtype="bfloat16",
        kv_cache_bytes=54 * GIB, max_model_len=8192, rope_theta=500000.0,
        cost=CostModel(a=4.0e-3, b=3.2e-5, c=1.1e-9, d=7.0e-3, e=2.0e-5, f=5.0e-8),
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32),
    "llama3-70b-h100x4": Profile(
        name="llama3-70b-h100x4", model="meta-llama/Meta-Llama-3-70B-Instruct",
        num_layers=80, num_kv_heads=8, head_dim=128, kv_dtype="bfloat16",
        kv_cache_bytes=4 * 33 * GIB, max_model_len=8192, rope_theta=500000.0,
        cost=CostModel(a=1.0e-2, b=9.0e-5, c=1.7e-9, d=1.8e-2, e=5.0e-5, f=3.1e-8),
        hidden_size=8192, intermediate_size=28672, num_attention_heads=64),
}


# Llama 3.1 8B: Llama 3 8B's shape and costs with a 128k context (long agent contexts:
# python -m bench agents).
PROFILES["llama31-8b-h100"] = replace(
    PROFILES["llama3-8b-h100"], name="llama31-8b-h100", model="meta-llama/Llama-3.1-8B-Instruct",
    max_model_len=131072)


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ValueError listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown timed profile {name!r}; known: {', '.join(PROFILES)}") from None
