"""The real-process routing benchmark runs end to end on a tiny workload."""

import pytest

from bench import routing_real

pytestmark = pytest.mark.slow


def test_routing_real_tiny_run_reports_every_policy_and_cache_hits():
    results = routing_real.main(["--workers", "2", "--policies", "cache_aware", "round_robin",
                                 "--requests", "20"])
    assert set(results) == {"cache_aware/2", "round_robin/2", "wall_s"}
    for name in ("cache_aware/2", "round_robin/2"):
        run = results[name]
        assert run["num_requests"] == 20 and run["num_errors"] == 0, run["first_error"]
        assert sum(run["requests_per_worker"]) == 20 and len(run["requests_per_worker"]) == 2
        assert run["max_over_mean_requests"] >= 1.0
        assert run["requests_per_s"] > 0 and run["ttft_p50_ms"] > 0
    assert results["cache_aware/2"]["cached_fraction"] > 0
