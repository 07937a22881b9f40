"""Timing and error helpers shared by the one-call GPU script's kernel sections."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], iters: int) -> float:
    """Median milliseconds of ``fn`` after warm-up: CUDA events on a GPU, wall clock else."""
    for _ in range(3):
        fn()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if not cuda:
            start_s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_s) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute elementwise difference, computed in fp32."""
    return (a.float() - b.float()).abs().max().item()
