"""The timed end-to-end run's load arithmetic, worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench.e2e_timed import DECODE_BATCH, at_load, capacity_rps, tagged
from bench.workloads import TraceRequest
from radix.cost_model import CostModel, Profile
from radix.keys import TOKEN_BYTES

COST = CostModel(a=0.01, b=0.001, c=0.0, d=0.016, e=0.0, f=0.0)
PROFILE = Profile("hand", "hand", 1, 1, 1, "bfloat16", 2**30, 8192, 1e4, COST)


def tokens(start: int, n: int) -> bytes:
    return np.arange(start, start + n, dtype=np.uint32).tobytes()


def test_capacity_counts_what_one_worker_that_saw_the_trace_would_prefill():
    first = TraceRequest(0.0, "t", "s", tokens(0, 100), tokens(1000, 32))
    second = TraceRequest(1.0, "t", "s", tokens(0, 60) + tokens(500, 40), tokens(2000, 32))
    # first: 0.01 + 100 * 0.001 prefill; second: 60 tokens seen, 0.01 + 40 * 0.001; each
    # 32 outputs at 0.016 / 16 = 1 ms.
    service_s = [0.11 + 0.032, 0.05 + 0.032]
    assert DECODE_BATCH == 16
    assert capacity_rps([first, second], PROFILE) == pytest.approx(1 / np.mean(service_s))


def test_arrivals_keep_their_shape_at_the_asked_rate():
    requests = [TraceRequest(t, "t", "s", tokens(0, 4), tokens(9, 1)) for t in (5.0, 6.0, 9.0)]
    # 3 requests over 4 s span, rescaled so that 3 requests arrive over 3 / 2 = 1.5 s.
    assert at_load(requests, 2.0) == pytest.approx([0.0, 0.375, 1.5])


def test_each_run_tags_its_prompts_differently():
    request = TraceRequest(0.0, "t", "s", tokens(0, 4), tokens(9, 1))
    one, two = tagged([request], 1)[0], tagged([request], 2)[0]
    assert one.prompt.endswith(request.prompt) and one.num_prompt_tokens == 8
    assert one.prompt[: 4 * TOKEN_BYTES] != two.prompt[: 4 * TOKEN_BYTES]
