"""Random LoRA delta problems and the error bound the Triton kernel is held to.

Adapters of smaller ranks fill the first ``r`` rows of A and columns of B of their
slot and leave the padding zero, as the slot buffers hold them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from workers.lora.reference import lora_delta_reference
from workers.lora.segments import LoraSegments, segments_from_rows


class LoraProblem(NamedTuple):
    """The arguments of ``lora_delta`` in order."""

    x: torch.Tensor
    segments: LoraSegments
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scales: torch.Tensor


def make_problem(
    row_counts: Sequence[int],
    row_slots: Sequence[int | None],
    ranks: Sequence[int],
    max_rank: int,
    in_features: int,
    out_features: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> LoraProblem:
    """Sequence ``i`` has ``row_counts[i]`` rows of slot ``row_slots[i]`` (None: base);
    slot ``s`` holds an adapter of rank ``ranks[s]`` zero-padded to ``max_rank``."""
    generator = torch.Generator().manual_seed(seed)
    num_slots = len(ranks)
    x = torch.randn(sum(row_counts), in_features, generator=generator)
    lora_a = torch.randn(num_slots, max_rank, in_features, generator=generator) / in_features**0.5
    lora_b = torch.randn(num_slots, out_features, max_rank, generator=generator) / max_rank**0.5
    for slot, rank in enumerate(ranks):
        lora_a[slot, rank:] = 0
        lora_b[slot, :, rank:] = 0
    scales = torch.randn(num_slots, generator=generator)
    return LoraProblem(
        x.to(dtype=dtype, device=device),
        segments_from_rows(row_counts, row_slots, device),
        lora_a.to(dtype=dtype, device=device),
        lora_b.to(dtype=dtype, device=device),
        scales.to(device),
    )


def error_in_ulps(got: torch.Tensor, problem: LoraProblem) -> float:
    """Largest ``|got - exact|`` in units of ``eps(dtype) * (|x|·|A|ᵀ·|B|ᵀ·|scale|)``,
    the size of one rounding of every product; the exact value is the reference in
    fp32 on the same inputs. A nonzero base row (bound zero) gives infinity."""
    assert got.dtype == problem.x.dtype and got.shape == (
        problem.x.shape[0],
        problem.lora_b.shape[1],
    )
    x, segments, lora_a, lora_b, scales = problem
    exact = lora_delta_reference(x.float(), segments, lora_a.float(), lora_b.float(), scales)
    bound = lora_delta_reference(
        x.float().abs(), segments, lora_a.float().abs(), lora_b.float().abs(), scales.abs()
    )
    error = (got.float() - exact).abs()
    if error.numel() == 0:
        return 0.0
    units = error / (torch.finfo(got.dtype).eps * bound)
    return torch.where(error == 0, 0.0, units).max().item()
