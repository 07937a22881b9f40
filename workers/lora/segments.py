"""Which rows of a flattened batch run which adapter slot.

A batch is flattened sequence by sequence (``[num_tokens, hidden]``), and every
sequence runs one adapter or none, so the rows of one adapter come in contiguous
runs. ``LoraSegments`` lists those runs once per forward pass; every LoRA-wrapped
projection of every layer reads the same value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraSegments:
    """Rows ``starts[i]:ends[i]`` use adapter slot ``slots[i]``.

    Only runs with an adapter are listed: rows outside every run are base-model rows
    and get no delta. Runs are in row order and do not overlap.
    """

    starts: torch.Tensor  # int64 [num_segments]
    ends: torch.Tensor  # int64 [num_segments]
    slots: torch.Tensor  # int64 [num_segments]

    @property
    def num_segments(self) -> int:
        """How many adapter runs the batch has (0: a base-model-only batch)."""
        return int(self.slots.numel())


def segments_from_rows(
    row_counts: Sequence[int], row_slots: Sequence[int | None], device: torch.device | str = "cpu"
) -> LoraSegments:
    """The runs of a batch whose sequence ``i`` has ``row_counts[i]`` rows and runs
    slot ``row_slots[i]`` (``None``: the base model). Adjacent sequences of one slot
    merge into one run."""
    starts: list[int] = []
    ends: list[int] = []
    slots: list[int] = []
    row = 0
    for count, slot in zip(row_counts, row_slots, strict=True):
        if slot is not None and count > 0:
            if slots and slots[-1] == slot and ends[-1] == row:
                ends[-1] = row + count
            else:
                starts.append(row)
                ends.append(row + count)
                slots.append(slot)
        row += count
    return LoraSegments(*(torch.tensor(v, dtype=torch.int64, device=device) for v in (starts, ends, slots)))
