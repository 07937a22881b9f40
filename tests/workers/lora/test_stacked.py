"""The CPU's stacked LoRA delta against the torch reference: random batches of runs
over random slots (base-model rows between them), ranks padded in the slots."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.lora.reference import lora_delta_reference
from workers.lora.segments import segments_from_rows
from workers.lora.stacked import add_lora_stacked, row_mask

NUM_SLOTS, MAX_RANK, IN, OUT = 3, 4, 12, 10


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.none() | st.integers(0, NUM_SLOTS - 1)),
                     min_size=1, max_size=8),
       ranks=st.lists(st.integers(1, MAX_RANK), min_size=NUM_SLOTS, max_size=NUM_SLOTS),
       seed=st.integers(0, 2**16))
def test_stacked_delta_equals_the_reference(rows, ranks, seed):
    generator = torch.Generator().manual_seed(seed)
    lora_a = torch.zeros(NUM_SLOTS, MAX_RANK, IN, dtype=torch.float64)
    lora_b = torch.zeros(NUM_SLOTS, OUT, MAX_RANK, dtype=torch.float64)
    for slot, rank in enumerate(ranks):
        lora_a[slot, :rank] = torch.randn(rank, IN, generator=generator, dtype=torch.float64)
        lora_b[slot, :, :rank] = torch.randn(OUT, rank, generator=generator, dtype=torch.float64)
    scales = torch.rand(NUM_SLOTS, generator=generator, dtype=torch.float64) + 0.5
    counts, slots = [count for count, _ in rows], [slot for _, slot in rows]
    x = torch.randn(sum(counts), IN, generator=generator, dtype=torch.float64)
    segments = segments_from_rows(counts, slots)
    expected = lora_delta_reference(x, segments, lora_a, lora_b, scales)
    stacked_b = lora_b.permute(0, 2, 1).reshape(NUM_SLOTS * MAX_RANK, OUT)
    mask = row_mask(segments, scales, x.shape[0], MAX_RANK)
    out = torch.randn(x.shape[0], OUT, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(add_lora_stacked(out, x, mask, lora_a, stacked_b), out + expected)
