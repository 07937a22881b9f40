"""The cluster simulator on a case small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim import SIM_POLICIES, Cluster, PolicySpec, SimConfig, simulate, summarize
from bench.sim_stepped import SteppedSimWorker
from bench.workloads import TraceRequest, WorkloadConfig
from radix.cost_model import CostModel
from router.routing.policy import RoundRobinPolicy
from router.routing.views import WorkerView

# 1 ms per prompt token, 10 ms per decode step, nothing else.
CONFIG = SimConfig(kv_capacity_tokens=1_000_000, cost=CostModel(a=0.0, b=0.001, c=0.0, d=0.01, e=0.0, f=0.0),
                   max_batched_tokens=10**6, max_num_seqs=4)


def tokens(start: int, n: int) -> bytes:
    return np.arange(start, start + n, dtype=np.uint32).tobytes()


def two_requests() -> list[TraceRequest]:
    first = TraceRequest(0.0, "t", "s", tokens(0, 100), tokens(1000, 10))
    # Arrives after the first one's prefill (0.1 s): its first 64 tokens are cached there.
    second = TraceRequest(0.15, "t", "s", tokens(0, 64) + tokens(500, 36), tokens(2000, 10))
    return [first, second]


@pytest.mark.parametrize(("policy", "workers", "cached", "ttft"), [
    # cache_aware: w0 costs 36 uncached + 16 (one running request) + KV pressure < 100 on w1;
    # its prefill step also carries the first request's decode (10 ms).
    ("cache_aware", [2, 0], [0, 64], [0.100, 0.046]),
    ("round_robin", [1, 1], [0, 0], [0.100, 0.100]),
])
def test_two_requests_by_hand(policy, workers, cached, ttft):
    cluster = Cluster(SIM_POLICIES[policy], 2, CONFIG)
    results = cluster.run(iter(two_requests()))
    assert [w.num_requests for w in cluster.workers] == workers
    assert results.num_cached_tokens == cached
    assert results.ttft_s == pytest.approx(ttft)
    # Ends: first at 0.1 + 9 * 0.01 (its first token came with the prefill); second at
    # its first token + 0.09.
    assert results.end_s == pytest.approx(0.15 + ttft[1] + 0.09)
    summary = summarize(cluster, wall_s=0.0)
    assert summary["cached_fraction"] == pytest.approx(sum(cached) / 200)
    assert summary["max_over_mean_load"] == pytest.approx(max(workers) / 1.0)


def test_batch_limit_holds_prefill_until_a_decode_ends():
    one = SimConfig(**{**CONFIG.__dict__, "max_num_seqs": 1})
    cluster = Cluster(SIM_POLICIES["round_robin"], 1, one)
    results = cluster.run(iter(two_requests()))
    # The second request waits for the first to end at 0.19 s, then prefills 36 tokens.
    assert results.ttft_s == pytest.approx([0.100, 0.19 + 0.036 - 0.15])


def test_every_policy_runs_a_small_workload_to_completion():
    small = WorkloadConfig(num_docs=10, doc_tokens=(64, 256), system_tokens=(32, 64),
                           message_tokens=(8, 32), output_tokens=(4, 16))
    for name in SIM_POLICIES:
        r = simulate(name, 3, "chat", 60, rate_per_worker=1.0, workload_config=small)
        assert r["num_requests"] == 60 and sum(r["requests_per_worker"]) == 60
        assert 0.0 <= r["cached_fraction"] < 1.0 and r["ttft_p99_s"] >= r["ttft_p50_s"] > 0


class RecordingPolicy(RoundRobinPolicy):
    """Round robin that keeps the views it was given and, once given its ``cluster``,
    the load the workers reported at each choice."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[WorkerView]] = []
        self.reported: list[list[tuple]] = []
        self.cluster: Cluster | None = None

    def choose(self, request, workers):
        self.seen.append(list(workers))
        if self.cluster is not None:
            self.reported.append(list(self.cluster.polled))
        return super().choose(request, workers)


def test_the_policy_sees_the_polled_load_in_its_fields():
    policy = RecordingPolicy()
    polling = SimConfig(**{**CONFIG.__dict__, "poll_interval_s": 0.0, "kv_capacity_tokens": 1000})
    cluster = Cluster(PolicySpec(lambda seed: policy), 1, polling)
    requests = [TraceRequest(0.01 * i, "t", "s", tokens(1000 * i, 100), tokens(9000 + i, 4)) for i in range(4)]
    cluster.run(iter(requests))
    # At 0.03 s: the first request prefills (until 0.1 s), two wait with 100 tokens each;
    # nothing is cached yet. All three are this router's, counted in flight (300 tokens
    # before their first), so none of the 200 waiting tokens is another router's.
    view = policy.seen[3][0]
    assert (view.num_requests_running, view.num_requests_waiting, view.num_waiting_tokens,
            view.kv_cache_usage_ratio, view.num_in_flight_requests,
            view.num_in_flight_prompt_tokens) == (1, 2, 0, 0.0, 3, 300)


def test_the_stepped_worker_runs_the_engines_step_loop_by_hand():
    cluster = Cluster(SIM_POLICIES["round_robin"], 1, CONFIG, worker_class=SteppedSimWorker)
    results = cluster.run(iter(two_requests()))
    # The first prefills alone (0.1 s) and decodes a step per 10 ms from 0.1 s. The
    # second arrives at 0.15 s, as a step ends: the next step carries the first's decode
    # and the second's 36 uncached tokens (0.01 + 0.036 s).
    assert results.num_cached_tokens == [0, 64]
    assert results.ttft_s == pytest.approx([0.100, 0.046])
    # The first's last of 9 decode steps ends at 0.196 + 3 * 0.01; the second's 9
    # decode steps after its first token end at 0.196 + 0.09.
    assert results.end_s == pytest.approx(0.286)


def test_closed_loop_sends_each_client_its_next_request_when_its_last_ends():
    cluster = Cluster(SIM_POLICIES["round_robin"], 1, CONFIG)
    requests = [TraceRequest(5.0 * i, "t", "s", tokens(1000 * i, 100), tokens(9000 + i, 10)) for i in range(3)]
    results = cluster.run_closed(iter(requests), num_clients=1)
    # One client: each request is sent when the last ends (prefill 0.1 s, 9 decode
    # steps of 10 ms), whatever its trace arrival; TTFT counts from the send.
    assert results.arrival_s == pytest.approx([0.0, 0.19, 0.38])
    assert results.ttft_s == pytest.approx([0.1, 0.1, 0.1])
    assert results.end_s == pytest.approx(0.57)


def test_a_waiting_prompt_counts_whole_as_the_engine_counts_it():
    policy = RecordingPolicy()
    polling = SimConfig(**{**CONFIG.__dict__, "poll_interval_s": 0.0})
    cluster = policy.cluster = Cluster(PolicySpec(lambda seed: policy), 1, polling)
    first = tokens(0, 100)
    requests = [TraceRequest(0.0, "t", "s", first, tokens(9000, 4)),
                TraceRequest(0.15, "t", "s", first + tokens(500, 100), tokens(9100, 4)),
                TraceRequest(0.16, "t", "s", first + tokens(700, 50), tokens(9200, 4)),
                TraceRequest(0.17, "t", "s", tokens(800, 10), tokens(9300, 4))]
    cluster.run(iter(requests))
    # At 0.17 s the second prefills (0.15-0.25 s) and the third waits: 150 prompt
    # tokens, 100 of them cached (the engine matches only at admission). Both are this
    # router's in flight: the policy sees none of it as another router's queue.
    assert policy.reported[3][0][2] == 150
    assert policy.seen[3][0].num_waiting_tokens == 0
    assert cluster.results.num_cached_tokens[:3] == [0, 100, 100]


@pytest.mark.parametrize("num_background", [0, 2])
def test_a_burst_for_a_cold_document_within_its_first_prefill_lands_on_its_owner(num_background):
    """16 workers; a 3,200-token document first seen at 0 s (its prefill takes 3.2 s)
    and asked for again five times in the next 160 ms, alone or after two 500-token
    requests per worker: one full prefill, then five hits on the same worker (each
    waits for that prefill, then computes only its 64-token question)."""
    roomy = SimConfig(**{**CONFIG.__dict__, "max_num_seqs": 64})
    cluster = Cluster(SIM_POLICIES["cache_aware"], 16, roomy)
    background = [TraceRequest(0.0, "t", f"b{i}", tokens(100_000 + 1000 * i, 500), tokens(9000, 4))
                  for i in range(16 * num_background)]
    burst = [TraceRequest(at, "t", f"d{i}", tokens(0, 3200) + tokens(50_000 + 100 * i, 64),
                          tokens(9000, 4))
             for i, at in enumerate([0.001, 0.004, 0.01, 0.05, 0.1, 0.161])]
    results = cluster.run(iter(background + burst))
    cached = dict(zip(results.arrival_s, results.num_cached_tokens, strict=True))
    assert [cached[r.arrival_s] for r in burst] == [0] + [3200] * 5
