"""Policies in the cluster simulator: cache_aware must beat cache-blind routing."""

from __future__ import annotations

from bench.routing_quality import simulate


def test_cache_aware_serves_more_from_cache_and_answers_sooner_than_round_robin():
    aware = simulate("cache_aware", num_workers=2, num_requests=200)
    blind = simulate("round_robin", num_workers=2, num_requests=200)
    assert aware["num_requests"] == blind["num_requests"] > 200
    assert aware["cached_fraction"] > blind["cached_fraction"] + 0.05
    assert aware["mean_ttft_s"] < blind["mean_ttft_s"]
    assert aware["max_over_mean_load"] < 1.5
