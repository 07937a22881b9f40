"""Policies in the cluster simulator (``bench.sim``): cache_aware must beat cache-blind routing."""

from __future__ import annotations

from bench.sim import RATES, simulate
from bench.workloads import WorkloadConfig

# 20 documents and 30% conversations: enough reuse in 300 requests to tell policies apart.
CONFIG = WorkloadConfig(num_docs=20, chat_session_share=0.3)


def test_cache_aware_serves_more_from_cache_and_answers_sooner_than_round_robin():
    aware, blind = (simulate(policy, num_workers=2, workload="rag_chat", num_requests=300,
                             rate_per_worker=RATES["rag"], workload_config=CONFIG)
                    for policy in ("cache_aware", "round_robin"))
    assert aware["num_requests"] == blind["num_requests"] == 300
    assert aware["cached_fraction"] > blind["cached_fraction"] + 0.05
    assert aware["ttft_mean_s"] < blind["ttft_mean_s"]
    assert aware["max_over_mean_load"] < 1.5
