"""Chooses the grouped LoRA delta's implementation by device, as the attention
backend does: the model calls only ``lora_delta`` and never knows which path runs.

Triton (``sgmv.py``) on CUDA, the torch reference elsewhere. Triton is imported on
first CUDA use: CPU-only installs (and platforms without Triton) never load it.
"""

from __future__ import annotations

import torch

from workers.lora.reference import lora_delta_reference
from workers.lora.segments import LoraSegments


def lora_delta(
    x: torch.Tensor,
    segments: LoraSegments,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
) -> torch.Tensor:
    """``[num_tokens, out_features]``: each run's ``x·Aᵀ·Bᵀ·scale`` under its slot,
    zero on base-model rows (contract and shapes: ``workers.lora.reference``)."""
    if x.is_cuda:
        from workers.lora.sgmv import lora_delta_triton

        return lora_delta_triton(x, segments, lora_a, lora_b, scales)
    return lora_delta_reference(x, segments, lora_a, lora_b, scales)
