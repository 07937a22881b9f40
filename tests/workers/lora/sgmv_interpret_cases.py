"""The Triton LoRA delta vs the torch reference on CPU tensors, under TRITON_INTERPRET=1.

Run as a module (``python -m``, from the repository root) in a subprocess by
test_sgmv_interpret.py, so the interpreter mode (fixed when a ``@triton.jit`` function
is defined) never leaks into the rest of the suite. Runs one hypothesis property per dtype
and prints one JSON object: dtype name -> "ok", or the falsifying example's error text.
"""

from __future__ import annotations

import os

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.triton_interpreter import Cases
from tests.workers.lora.lora_cases import error_in_ulps, make_problem
from workers.lora.sgmv import lora_delta_triton

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_ULPS = 4.0
MAX_SLOTS = 3


@st.composite
def problems(draw: st.DrawFn) -> dict:
    """Ragged batches of base and adapter sequences (a slot may come back after
    other rows), odd feature sizes, ranks below the padded maximum, and tilings."""
    max_rank = draw(st.integers(1, 20))
    num_sequences = draw(st.integers(0, 5))
    return {
        "row_counts": draw(st.lists(st.integers(0, 20), min_size=num_sequences, max_size=num_sequences)),
        "row_slots": draw(st.lists(st.none() | st.integers(0, MAX_SLOTS - 1),
                                   min_size=num_sequences, max_size=num_sequences)),
        "ranks": draw(st.lists(st.integers(1, max_rank), min_size=MAX_SLOTS, max_size=MAX_SLOTS)),
        "max_rank": max_rank,
        "in_features": draw(st.integers(1, 40)),
        "out_features": draw(st.integers(1, 40)),
        "seed": draw(st.integers(0, 2**16)),
        "tiles": {"block_m": draw(st.sampled_from([None, 16, 32])),
                  "block_n": draw(st.sampled_from([16, 32])),
                  "block_k": draw(st.sampled_from([16, 32])),
                  "num_splits": draw(st.sampled_from([None, 1, 2]))},
    }


EXAMPLES = [
    # Slot 0 twice around base rows and another slot; ranks under a padded maximum.
    {"row_counts": [3, 2, 18, 4, 5], "row_slots": [0, None, 2, None, 0], "ranks": [5, 1, 12],
     "max_rank": 16, "in_features": 37, "out_features": 21, "seed": 1,
     "tiles": {"block_m": 16, "block_n": 16, "block_k": 16, "num_splits": 2}},
    # An empty batch, then a batch of base rows only.
    {"row_counts": [], "row_slots": [], "ranks": [2, 2, 2], "max_rank": 2, "in_features": 8,
     "out_features": 8, "seed": 2, "tiles": {}},
    {"row_counts": [4, 3], "row_slots": [None, None], "ranks": [2, 2, 2], "max_rank": 2,
     "in_features": 8, "out_features": 8, "seed": 3, "tiles": {}},
    # A long run over several row tiles, with the default tiling.
    {"row_counts": [1, 70, 2], "row_slots": [None, 1, 1], "ranks": [3, 20, 7], "max_rank": 20,
     "in_features": 33, "out_features": 17, "seed": 4, "tiles": {}},
]


def check(dtype: torch.dtype, case: dict) -> None:
    """Raise AssertionError when the kernel strays past ``MAX_ULPS`` on ``case``."""
    problem = make_problem(
        case["row_counts"], case["row_slots"], case["ranks"], case["max_rank"],
        case["in_features"], case["out_features"], dtype, seed=case["seed"],
    )
    error = error_in_ulps(lora_delta_triton(*problem, **case["tiles"]), problem)
    assert error <= MAX_ULPS, f"{error} ulps"


def run_property(dtype: torch.dtype) -> None:
    """Every example below, then a few random problems (deterministic seed)."""
    prop = given(problems())(lambda case: check(dtype, case))
    for case in EXAMPLES:
        prop = example(case)(prop)
    settings(max_examples=6, deadline=None, derandomize=True, database=None)(prop)()


if __name__ == "__main__":
    CASES = Cases({name: (lambda dtype=dtype: run_property(dtype) or "ok")
                   for name, dtype in DTYPES.items()})
    CASES.report()
