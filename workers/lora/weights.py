"""A real model's adapter slots, and what one forward pass reads from them.

Slots are preallocated once, at ``max_lora_rank``, for every projection the model
wraps in every layer (``lora_a`` ``[max_loras, max_rank, in]``, ``lora_b``
``[max_loras, out, max_rank]``, as ``workers.lora.reference`` lays them out), beside
the KV pool and never resized: loading an adapter copies its tensors into a slot,
zero-padding its rank; projections it does not target stay zero in that slot.

On the CPU each projection also keeps its slots' B transposed and stacked
(``[max_loras * max_rank, out]``), and a forward pass adds the delta by
``workers.lora.stacked`` (three dense ops); elsewhere it calls ``lora_delta``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.lora.delta import lora_delta
from workers.lora.peft_files import AdapterSpec, BaseShapes, load_tensors, weight_key
from workers.lora.segments import LoraSegments
from workers.lora.stacked import add_lora_stacked, row_mask


class LoraWeights:
    """Every slot's weights on the model's device (a ``SlotLoader``)."""

    def __init__(self, shapes: BaseShapes, max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.shapes = shapes
        self.max_rank = max_rank
        self.lora_a: dict[tuple[int, str], torch.Tensor] = {}
        self.lora_b: dict[tuple[int, str], torch.Tensor] = {}
        self.lora_b_stacked: dict[tuple[int, str], torch.Tensor] | None = (
            {} if torch.device(device).type == "cpu" else None)
        for layer in range(shapes.num_layers):
            for module, (in_features, out_features) in shapes.projections.items():
                self.lora_a[layer, module] = torch.zeros(
                    max_loras, max_rank, in_features, dtype=dtype, device=device)
                self.lora_b[layer, module] = torch.zeros(
                    max_loras, out_features, max_rank, dtype=dtype, device=device)
                if self.lora_b_stacked is not None:
                    self.lora_b_stacked[layer, module] = torch.zeros(
                        max_loras * max_rank, out_features, dtype=dtype, device=device)
        self.scales = torch.zeros(max_loras, dtype=dtype, device=device)

    def load(self, slot: int, spec: AdapterSpec) -> None:
        """Copy ``spec``'s tensors (read from its file now) into ``slot``."""
        tensors = load_tensors(spec)
        self.clear(slot)
        rank = spec.rank
        for layer in range(self.shapes.num_layers):
            for module in spec.target_modules:
                a = tensors[weight_key(layer, module, "lora_A")]
                b = tensors[weight_key(layer, module, "lora_B")]
                self.lora_a[layer, module][slot, :rank].copy_(a)
                self.lora_b[layer, module][slot, :, :rank].copy_(b)
                if self.lora_b_stacked is not None:
                    first = slot * self.max_rank
                    self.lora_b_stacked[layer, module][first : first + rank].copy_(b.T)
        self.scales[slot] = spec.scale

    def clear(self, slot: int) -> None:
        """Zero ``slot`` everywhere."""
        for tensor in (*self.lora_a.values(), *self.lora_b.values()):
            tensor[slot].zero_()
        for tensor in (self.lora_b_stacked or {}).values():
            tensor[slot * self.max_rank : (slot + 1) * self.max_rank].zero_()
        self.scales[slot] = 0

    def batch(self, segments: LoraSegments, num_rows: int) -> LoraBatch:
        """What one forward pass over ``num_rows`` rows in ``segments`` reads."""
        mask = None
        if self.lora_b_stacked is not None:
            mask = row_mask(segments, self.scales, num_rows, self.max_rank)
        return LoraBatch(segments, self, mask)


@dataclass(frozen=True)
class LoraBatch:
    """One forward pass's adapter runs over the slots: every wrapped projection adds
    ``lora_delta`` of its layer's slot weights."""

    segments: LoraSegments
    weights: LoraWeights
    mask: torch.Tensor | None = None

    def add(self, layer: int, module: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the base projection of ``x``) plus the adapters' deltas."""
        weights = self.weights
        if self.mask is not None and weights.lora_b_stacked is not None:
            return add_lora_stacked(out, x, self.mask, weights.lora_a[layer, module],
                                    weights.lora_b_stacked[layer, module])
        return out + lora_delta(x, self.segments, weights.lora_a[layer, module],
                                weights.lora_b[layer, module], weights.scales)
