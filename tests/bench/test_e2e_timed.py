"""The timed end-to-end run's load arithmetic, worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench.e2e_timed import (
    DECODE_BATCH,
    at_load,
    capacity_rps,
    router_cpu,
    tagged,
    timed_settings,
)
from bench.report_timed import readme_tables, slo_crossings
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


def test_router_cpu_counts_all_of_it_over_the_runs_profile_time():
    # 2 CPU s over a 10 s run of 100 requests at time scale 20: 20 ms a request, polls
    # and pushes included (they run in profile time); in real time the run takes 0.5 s,
    # so 4 cores.
    cpu = router_cpu(2.0, 100, 10.0, 20.0)
    assert cpu["router_cpu_ms_per_request"] == pytest.approx(20.0)
    assert cpu["router_cpu_cores_real_time"] == pytest.approx(4.0)


def test_timed_settings_run_the_routers_intervals_in_profile_time():
    base, pushed = timed_settings("ours cache_aware owner_wait_share=1", 20.0)
    assert base == "ours cache_aware owner_wait_share=1"
    assert pushed == {"registry": {"poll_interval_s": 20.0, "probe_interval_s": 200.0,
                                   "pushed_load": True},
                      "kv_events": {"read_timeout_s": 300.0}}
    base, polled = timed_settings("ours cache_aware polled", 20.0, real_time=True)
    assert base == "ours cache_aware"
    assert polled["registry"] == {"poll_interval_s": 1.0, "probe_interval_s": 10.0,
                                  "pushed_load": False}
    assert polled["kv_events"] == {"read_timeout_s": 300.0}  # above the workers' heartbeat


def _run(p50_ms: float, p99_ms: float, cached: float, cores: float = 0.0) -> dict:
    return {"ttft_p50_s": p50_ms / 1e3, "ttft_p99_s": p99_ms / 1e3, "cached_fraction": cached,
            "goodput_rps": 100.0, "router_cpu_cores_real_time": cores, "router_cpu_ms_per_request": 2.0}


def test_readme_tables_put_a_router_per_column_and_mark_the_lowest_p99():
    results = {"slo_s": 0.25, "setups": ["ours", "peer"], "runs": {
        "rag/8/0.8/ours": _run(80, 200, 0.41), "rag/8/0.8/peer": _run(90, 300, 0.43),
        "rag/16/0.8/ours": _run(70, 400, 0.40, 0.5), "rag/16/0.8/peer": _run(60, 150, 0.42),
        "rag/16/0.5/ours": _run(50, 100, 0.40, 0.75)}}
    lines = readme_tables(results)
    assert lines[0] == "Load 0.5: TTFT p50 / p99 ms, cached fraction, goodput req/s under 250 ms"
    assert "| rag | 16 | 50 / **100**, 0.40, 100 |  |" in lines
    assert "| rag | 8 | 80 / **200**, 0.41, 100 | 90 / 300, 0.43, 100 |" in lines
    assert "| rag | 16 | 70 / 400, 0.40, 100 | 60 / **150**, 0.42, 100 |" in lines
    assert lines[-1].startswith("Router CPU at 16 workers") and "ours 0.75 cores, 2.00 ms" in lines[-1]
    assert slo_crossings(results) == ["rag, 16 workers: p99 over the SLO from load ours 0.8."]
