"""The Triton LoRA delta on a real GPU, through ``lora_delta``'s CUDA dispatch."""

from __future__ import annotations

import pytest
import torch

from tests.support.gpu import ON_GPU
from tests.workers.lora.lora_cases import error_in_ulps, make_problem
from workers.lora.delta import lora_delta

pytestmark = ON_GPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("row_counts", "row_slots"),
    [([1] * 16, [0, 1, None, 2, 3, 3, 0, None, 1, 1, 2, 0, None, 3, 2, 1]),
     ([700, 3, 500, 845], [2, None, 0, 2])],
)
def test_lora_delta_on_cuda_matches_reference(dtype, row_counts, row_slots):
    problem = make_problem(row_counts, row_slots, [16, 8, 4, 16], 16, 1024, 1536, dtype, "cuda")
    got = lora_delta(*problem)
    assert got.is_cuda
    assert error_in_ulps(got, problem) <= 4.0
