"""Chooses the attention implementation by device: Triton on CUDA, torch reference elsewhere.

The model calls only these two functions, so a layer never knows which path runs.
Triton is imported on first CUDA use: CPU-only installs (and platforms without
Triton) never load it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from workers.attention import reference
from workers.attention.metadata import AttentionMetadata


class LayerKVCache(NamedTuple):
    """One layer's paged K and V caches ``[num_blocks, block_size, kv_heads, head_dim]``
    and, for an FP8 cache, the scales and K offsets their values are stored with
    (``[kv_heads, head_dim]`` float32 on the cache's device; None: scale 1, offset 0)."""

    key: torch.Tensor
    value: torch.Tensor
    k_scale: torch.Tensor | None = None
    k_offset: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


def backend_name(device: torch.device) -> str:
    """The attention implementation ``device`` runs (``/ready`` reports it)."""
    return "triton" if device.type == "cuda" else "torch-reference"


def write_kv(
    cache: LayerKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store the new tokens' ``key``/``value`` [T, kv_heads, head_dim] into their slots
    (quantized with the layer's scales and K offsets when the cache is FP8)."""
    if cache.key.is_cuda:
        from workers.attention import triton_kernels

        triton_kernels.store_kv(cache.key, cache.value, key, value, slot_mapping, *cache[2:])
    else:
        reference.write_kv(cache.key, cache.value, key, value, slot_mapping, *cache[2:])


def paged_attention(
    query: torch.Tensor, cache: LayerKVCache, metadata: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Attention of the new tokens' ``query`` [T, H, D] over their sequences' paged K/V.

    The new tokens' K/V must already be written. A batch of single-token queries uses
    the decode path; any batch with a longer query uses the prefill path for all
    sequences (it handles one-token queries too).
    """
    impl = reference
    if query.is_cuda:
        from workers.attention import triton_kernels as impl
    scales = (cache.k_scale, cache.v_scale)
    if metadata.max_query_len == 1:
        return impl.paged_decode(
            query, cache.key, cache.value, metadata.seq_lens, metadata.block_tables, scale,
            *scales,
        )
    return impl.paged_prefill(
        query,
        cache.key,
        cache.value,
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_tables,
        metadata.max_query_len,
        scale,
        *scales,
    )
