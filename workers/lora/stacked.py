"""The grouped LoRA delta on the CPU as three dense ops over all slots at once.

The reference (``workers.lora.reference``) loops over the batch's runs, a few small
ops per run per projection; at decode, with several adapters in a batch, those ops
cost more than the base model's own matmuls. Here every row is shrunk by every
slot's A at once (``x · A_allᵀ``, ``[num_tokens, num_slots * max_rank]``), a mask
built once per forward pass keeps each row's own slot (times its scale) and zeroes
the rest (base-model rows keep nothing), and one matmul expands by every slot's B.
The extra work grows with ``num_slots * max_rank``, small beside a projection's
``in * out``; the result equals the reference's up to float rounding (tested).
"""

from __future__ import annotations

import torch

from workers.lora.segments import LoraSegments


def row_mask(segments: LoraSegments, scales: torch.Tensor, num_rows: int,
             max_rank: int) -> torch.Tensor:
    """``[num_rows, num_slots * max_rank]``: a run's rows hold its slot's scale in that
    slot's ``max_rank`` columns, zero elsewhere; base-model rows are all zero."""
    num_slots = scales.shape[0]
    mask = scales.new_zeros(num_rows, num_slots)
    for start, end, slot in zip(
        segments.starts.tolist(), segments.ends.tolist(), segments.slots.tolist(), strict=True
    ):
        mask[start:end, slot] = scales[slot]
    return mask.repeat_interleave(max_rank, dim=1)


def add_lora_stacked(out: torch.Tensor, x: torch.Tensor, mask: torch.Tensor,
                     lora_a: torch.Tensor, lora_b_stacked: torch.Tensor) -> torch.Tensor:
    """``out`` plus the reference's delta of ``x`` (``[num_tokens, out_features]``),
    from ``lora_a`` ``[num_slots, max_rank, in]`` and ``lora_b_stacked``
    ``[num_slots * max_rank, out]`` (each slot's B transposed, stacked) under
    ``row_mask``'s ``mask``; the add is fused into the expand."""
    shrunk = x @ lora_a.view(-1, lora_a.shape[-1]).T
    return torch.addmm(out, shrunk.mul_(mask), lora_b_stacked)
