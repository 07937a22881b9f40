"""The multi-router benchmark runs end to end on a tiny workload."""

import pytest

from bench import multi_router

pytestmark = pytest.mark.slow


def test_multi_router_tiny_run_reports_both_setups_and_convergence():
    results = multi_router.main(["--workers", "2", "--requests", "16", "--clients", "4",
                                 "--probes", "2"])
    for name in ("routers_1", "routers_2"):
        run = results[name]
        assert run["num_requests"] == 16 and run["num_errors"] == 0, run["first_error"]
        assert run["cached_fraction"] > 0 and run["decision_us_mean"] > 0
    assert 0 < results["routers_2"]["convergence_ms_max"] < 10_000
    assert results["routers_1"]["convergence_ms_median"] is None
