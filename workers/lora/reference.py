"""The grouped LoRA delta in torch: the oracle for the Triton kernel (``sgmv.py``).

Adapter weights live in slots preallocated at ``max_lora_rank``: ``lora_a``
``[num_slots, max_rank, in_features]`` and ``lora_b`` ``[num_slots, out_features,
max_rank]``. An adapter of a smaller rank fills the first ``r`` rows of A and
columns of B and leaves the rest zero, so the padding adds nothing. ``scales``
``[num_slots]`` holds each slot's ``lora_alpha / r`` (or ``/ sqrt(r)`` with rsLoRA).
"""

from __future__ import annotations

import torch

from workers.lora.segments import LoraSegments


def lora_delta_reference(
    x: torch.Tensor,
    segments: LoraSegments,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """``[num_tokens, out_features]``: for each run, ``x·Aᵀ·Bᵀ·scale`` of its slot
    (shrink then expand, as PEFT computes it); zero on base-model rows."""
    delta = x.new_zeros(x.shape[0], lora_b.shape[1])
    for start, end, slot in zip(
        segments.starts.tolist(), segments.ends.tolist(), segments.slots.tolist(), strict=True
    ):
        shrunk = x[start:end] @ lora_a[slot].T
        delta[start:end] = (shrunk @ lora_b[slot].T) * scales[slot]
    return delta
