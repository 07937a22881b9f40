"""The marks of a test that needs a CUDA device: marked ``gpu``, run one at a time
(one device), skipped where torch sees no CUDA device."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

Test = TypeVar("Test", bound=Callable[..., object])

ON_GPU = [
    pytest.mark.gpu,
    pytest.mark.xdist_group("gpu"),  # one device: one test on it at a time
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def on_gpu(test: Test) -> Test:
    """``test`` with the ``ON_GPU`` marks: for one test in a module of CPU tests."""
    for mark in ON_GPU:
        test = mark(test)
    return test
