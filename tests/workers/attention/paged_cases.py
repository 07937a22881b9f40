"""Random paged-attention problems shared by the reference, interpreter and GPU tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from workers.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class PagedCase:
    """Caches, a batch layout over them, and queries for its new tokens."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    metadata: AttentionMetadata
    query: torch.Tensor
    block_tables: list[list[int]]
    num_computed: list[int]
    query_lens: list[int]

    @property
    def scale(self) -> float:
        return self.query.shape[-1] ** -0.5


def make_case(
    query_lens: list[int],
    num_computed: list[int],
    block_size: int,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> PagedCase:
    """Sequences with scrambled block tables; sequence 1 shares sequence 0's first
    block when both have one, and the last block of every table is a copy of a
    random other block (so copied and shared content both appear)."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(num_computed, query_lens, strict=True)]
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 4
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(n)] for n in needed]
    if len(tables) > 1 and needed[0] > 1 and needed[1] > 1 and num_computed[1] >= block_size:
        tables[1][0] = tables[0][0]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=generator).to(dtype)
    value_cache = torch.randn(shape, generator=generator).to(dtype)
    for table in tables:
        source = rng.randrange(num_blocks)
        key_cache[table[-1]] = key_cache[source]
        value_cache[table[-1]] = value_cache[source]
    metadata = AttentionMetadata.build(
        query_lens, num_computed, tables, block_size, num_blocks, device
    )
    query = torch.randn((sum(query_lens), num_heads, head_dim), generator=generator).to(dtype)
    return PagedCase(
        key_cache.to(device),
        value_cache.to(device),
        metadata,
        query.to(device),
        tables,
        num_computed,
        query_lens,
    )


def dense_attention(case: PagedCase) -> torch.Tensor:
    """Float64 attention computed token by token from contiguous K/V (no paging tricks)."""
    block_size, num_kv_heads, head_dim = case.key_cache.shape[1:]
    num_heads = case.query.shape[1]
    group = num_heads // num_kv_heads
    outputs = []
    start = 0
    for table, computed, length in zip(
        case.block_tables, case.num_computed, case.query_lens, strict=True
    ):
        blocks = torch.tensor(table)
        keys = case.key_cache.cpu()[blocks].reshape(-1, num_kv_heads, head_dim).double()
        values = case.value_cache.cpu()[blocks].reshape(-1, num_kv_heads, head_dim).double()
        for j in range(length):
            visible = computed + j + 1
            rows = []
            for head in range(num_heads):
                query = case.query.cpu()[start + j, head].double()
                scores = keys[:visible, head // group] @ query * case.scale
                rows.append(torch.softmax(scores, 0) @ values[:visible, head // group])
            outputs.append(torch.stack(rows))
        start += length
    return torch.stack(outputs)


def channel_scales(num_kv_heads: int, head_dim: int, seed: int = 0, device: str = "cpu"
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random FP8 ``(k_scale, k_offset, v_scale)``, each float32 [num_kv_heads, head_dim]:
    scales spread over a factor of 10 (some channels small, some large), K offsets of
    about the size of the values (as a K channel's mean can be)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, head_dim)
    k_scale = torch.empty(shape).uniform_(0.003, 0.03, generator=generator)
    k_offset = torch.randn(shape, generator=generator) * 1.5
    v_scale = torch.empty(shape).uniform_(0.002, 0.02, generator=generator)
    return k_scale.to(device), k_offset.to(device), v_scale.to(device)
