"""lora_delta_triton before launch: it refuses bad arguments, naming the argument, and
answers the problems that need no launch (nothing to multiply) with zeros."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from tests.workers.lora.lora_cases import LoraProblem, make_problem
from workers.lora.reference import lora_delta_reference

pytest.importorskip("triton")


def problem() -> LoraProblem:
    return make_problem([3, 2, 4], [0, None, 1], [2, 4], 4, 24, 40)


def with_segments(field: str, value: torch.Tensor) -> Callable[[LoraProblem], LoraProblem]:
    return lambda p: p._replace(segments=replace(p.segments, **{field: value}))


BAD: dict[str, tuple[Callable[[LoraProblem], LoraProblem], str]] = {
    "x-1d": (lambda p: p._replace(x=p.x[0]), "x must be"),
    "x-int": (lambda p: p._replace(x=p.x.int()), "x dtype"),
    "x-strided": (lambda p: p._replace(x=p.x.t().contiguous().t()), "x must have a unit stride"),
    "a-in-features": (lambda p: p._replace(lora_a=p.lora_a[:, :, 1:]), "lora_a must be"),
    "a-rank-0": (lambda p: p._replace(lora_a=p.lora_a[:, :0], lora_b=p.lora_b[:, :, :0]),
                 "lora_a must be"),
    "a-dtype": (lambda p: p._replace(lora_a=p.lora_a.half()), "lora_a dtype"),
    "a-strided": (lambda p: p._replace(lora_a=p.lora_a.transpose(0, 1).contiguous().transpose(0, 1)),
                  "lora_a must be contiguous"),
    "b-rank": (lambda p: p._replace(lora_b=p.lora_b[:, :, 1:]), "lora_b must be"),
    "b-slots": (lambda p: p._replace(lora_b=p.lora_b[:1]), "lora_b must be"),
    "b-strided": (lambda p: p._replace(lora_b=p.lora_b.transpose(1, 2).contiguous().transpose(1, 2)),
                  "lora_b must be contiguous"),
    "scales-shape": (lambda p: p._replace(scales=p.scales[:1]), "scales must be"),
    "scales-int": (lambda p: p._replace(scales=p.scales.int()), "scales dtype"),
    "slots-int32": (with_segments("slots", torch.tensor([0, 1], dtype=torch.int32)),
                    "segments.slots"),
    "starts-length": (with_segments("starts", torch.tensor([0])), "segments.starts"),
    "b-device": (lambda p: p._replace(lora_b=p.lora_b.to("meta")), "lora_b is on meta"),
    "ends-device": (with_segments("ends", torch.tensor([3, 9], device="meta")), "segments.ends is on"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_are_refused(name):
    from workers.lora.sgmv import lora_delta_triton

    change, message = BAD[name]
    with pytest.raises(ValueError, match=f"lora_delta_triton: {message}"):
        lora_delta_triton(*change(problem()))


@pytest.mark.parametrize(
    ("option", "message"),
    [({"block_n": 24}, "block_n"), ({"block_m": 8}, "block_m"), ({"num_splits": 0}, "num_splits")],
)
def test_bad_tilings_are_refused(option, message):
    from workers.lora.sgmv import lora_delta_triton

    with pytest.raises(ValueError, match=f"lora_delta_triton: {message}"):
        lora_delta_triton(*problem(), **option)


@pytest.mark.parametrize(
    ("row_counts", "row_slots", "in_features", "out_features"),
    [([], [], 8, 8), ([3, 2], [None, None], 8, 8), ([3, 2], [0, 1], 0, 8), ([3, 2], [0, 1], 8, 0)],
)
def test_nothing_to_multiply_gives_zeros_without_a_launch(
    row_counts, row_slots, in_features, out_features
):
    from workers.lora.sgmv import lora_delta_triton

    p = make_problem(row_counts, row_slots, [2, 2], 2, in_features, out_features)
    got = lora_delta_triton(*p)  # CPU tensors outside the interpreter: a launch would fail
    assert torch.equal(got, lora_delta_reference(*p))
    assert got.shape == (sum(row_counts), out_features)
