"""Chooses the attention implementation by device: Triton on CUDA, torch reference elsewhere.

The model calls only these two functions, so a layer never knows which path runs.
Triton is imported on first CUDA use: CPU-only installs (and platforms without
Triton) never load it.
"""

from __future__ import annotations

import torch

from workers.attention import reference
from workers.attention.metadata import AttentionMetadata


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store the new tokens' ``key``/``value`` [T, kv_heads, head_dim] into their slots."""
    if key_cache.is_cuda:
        from workers.attention import triton_kernels

        triton_kernels.store_kv(key_cache, value_cache, key, value, slot_mapping)
    else:
        reference.write_kv(key_cache, value_cache, key, value, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention of the new tokens' ``query`` [T, H, D] over their sequences' paged K/V.

    The new tokens' K/V must already be written. A batch of single-token queries uses
    the decode path; any batch with a longer query uses the prefill path for all
    sequences (it handles one-token queries too).
    """
    impl = reference
    if query.is_cuda:
        from workers.attention import triton_kernels as impl
    if metadata.max_query_len == 1:
        return impl.paged_decode(
            query, key_cache, value_cache, metadata.seq_lens, metadata.block_tables, scale
        )
    return impl.paged_prefill(
        query,
        key_cache,
        value_cache,
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_tables,
        metadata.max_query_len,
        scale,
    )
